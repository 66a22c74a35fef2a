"""Writes a C file defining `const char NAME[]` with the bytes of a text file.

Used by the build to paste libmg/src/kernels.h and nest_kernels.h into generated C (see emit.c),
verbatim but for the blanks that align a macro's line continuations (clang-format pads them to
column 100; the C compiler ignores them, and they were a tenth of the generated source).
Usage: embed_text.py NAME INPUT OUTPUT
"""

import re
import sys


def main() -> None:
    name, src, dst = sys.argv[1:4]
    with open(src, encoding="utf-8") as f:
        text = re.sub(r"[ \t]+\\\n", " \\\n", f.read())
    data = text.encode("utf-8") + b"\0"
    # an array of bytes, not a string literal: ISO C caps string literals at 4095 characters
    rows = [", ".join(str(c) for c in data[i : i + 24]) for i in range(0, len(data), 24)]
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f"/* Generated from {src.rsplit('/', 1)[-1]} by tools/embed_text.py. */\n")
        f.write(f"extern const char {name}[];\nconst char {name}[] = {{\n")
        f.write(",\n".join("    " + r for r in rows) + "\n};\n")


if __name__ == "__main__":
    main()
