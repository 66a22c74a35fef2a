"""Writes a C file defining `const char NAME[]` with the bytes of a text file.

Used by the build to paste libmg/src/kernels.h and nest_kernels.h into generated C (see emit.c),
as the C compiler reads them but without what it ignores: the blanks that align a macro's line
continuations (clang-format pads them to column 100: a tenth of the generated source), the
comments (each becomes a space, as in C; they were half of nest_kernels.h, whose text is most of a
generated file: the 100 KB a model's source may take, and they are read in the header itself),
blanks at the ends of lines, and empty lines outside macros.
Usage: embed_text.py NAME INPUT OUTPUT
"""

import re
import sys


def strip(text: str) -> str:
    """The text without comments (no string or character literal in these headers holds one),
    trailing blanks, and empty lines (but one that ends a macro: after a continued line)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out: list[str] = []
    for line in text.split("\n"):
        line = line.rstrip(" \t")
        if line.endswith("\\") and not line[:-1].strip():
            line = "\\"  # a continued line left empty
        if not line and not (out and out[-1].endswith("\\")):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def main() -> None:
    name, src, dst = sys.argv[1:4]
    with open(src, encoding="utf-8") as f:
        text = re.sub(r"[ \t]+\\\n", " \\\n", f.read())
    text = strip(text)
    data = text.encode("utf-8") + b"\0"
    # an array of bytes, not a string literal: ISO C caps string literals at 4095 characters
    rows = [", ".join(str(c) for c in data[i : i + 24]) for i in range(0, len(data), 24)]
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f"/* Generated from {src.rsplit('/', 1)[-1]} by tools/embed_text.py. */\n")
        f.write(f"extern const char {name}[];\nconst char {name}[] = {{\n")
        f.write(",\n".join("    " + r for r in rows) + "\n};\n")


if __name__ == "__main__":
    main()
