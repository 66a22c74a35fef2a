"""The C toolchain: finding a working compiler, its version, and the default flags."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

#: Flags used when none are given: optimised, and no floating-point contraction, so compiled
#: results equal the interpreter's and the eager graph's. Code compiled on the machine that runs
#: it also gets ``-march=native`` when the compiler accepts it (see :func:`default_flags`).
DEFAULT_FLAGS: List[str] = ["-O2", "-ffp-contract=off"]
CANDIDATES = ("cc", "gcc", "clang", "tcc")


class CompileError(RuntimeError):
    """The C compiler failed, timed out or is missing. ``command`` and ``output`` say how."""

    def __init__(self, message: str, command: Optional[Sequence[str]] = None, output: str = "") -> None:
        self.command = list(command) if command else []
        self.output = output
        detail = f"\ncommand: {shlex.join(self.command)}" if self.command else ""
        if output:
            tail = output if len(output) < 4000 else "...\n" + output[-4000:]
            detail += f"\ncompiler output:\n{tail}"
        super().__init__(message + detail)


# ---- toolchain ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    """A working C compiler: its command (``$CC`` may carry arguments), path and version."""

    command: List[str]
    path: str
    version: str

    @property
    def name(self) -> str:
        """Short name of the compiler as invoked (``cc``, ``gcc``, ``clang``, ``tcc``, ...)."""
        return os.path.basename(self.command[0])


_toolchains: Dict[str, Optional[Toolchain]] = {}


def _version_of(cmd: List[str]) -> str:
    for flag in ("--version", "-v"):
        try:
            r = subprocess.run(cmd + [flag], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (r.stdout + r.stderr).strip()
        if text:
            return text.splitlines()[0]
    return "unknown"


def _probe(cmd: List[str]) -> Optional[Toolchain]:
    """The toolchain if `cmd` builds and links a shared library, else None."""
    key = "\0".join(cmd)
    if key in _toolchains:
        return _toolchains[key]
    path = shutil.which(cmd[0]) if cmd else None
    tc = None
    if path:
        with tempfile.TemporaryDirectory(prefix="micrograd_c-probe-") as d:
            src, out = os.path.join(d, "probe.c"), os.path.join(d, "probe.so")
            with open(src, "w") as f:
                f.write("#include <math.h>\ndouble mg_probe(double x) { return sqrt(x); }\n")
            try:
                r = subprocess.run(cmd + ["-shared", "-fPIC", "-o", out, src, "-lm"],
                                   capture_output=True, text=True, timeout=60)
                if r.returncode == 0 and os.path.exists(out):
                    tc = Toolchain(cmd, os.path.realpath(path), _version_of(cmd))
            except (OSError, subprocess.TimeoutExpired):
                tc = None
    _toolchains[key] = tc
    return tc


def find_compiler(cc: Optional[str] = None) -> Toolchain:
    """The C compiler to use: ``cc`` if given, else ``$CC``, else the first of cc, gcc, clang, tcc
    that builds a shared library. Raises :class:`CompileError` when none works."""
    explicit = cc or os.environ.get("CC")
    if explicit:
        cmd = shlex.split(explicit)
        tc = _probe(cmd)
        if tc is None:
            raise CompileError(f"the C compiler {explicit!r} (from {'cc=' if cc else '$CC'}) does not work: "
                               "it is missing or cannot build a shared library")
        return tc
    for name in CANDIDATES:
        tc = _probe([name])
        if tc is not None:
            return tc
    raise CompileError("no working C compiler found (tried cc, gcc, clang, tcc; set $CC); "
                       "use backend='tape' to run without one")


_native: Dict[str, bool] = {}


def default_flags(tc: "Toolchain") -> List[str]:
    """:data:`DEFAULT_FLAGS` plus ``-march=native`` when ``tc`` accepts it.

    Contraction stays off, so vectorised code computes the same values as the scalar program.
    """
    if tc.path not in _native:
        ok = False
        with tempfile.TemporaryDirectory(prefix="micrograd_c-probe-") as d:
            src = os.path.join(d, "n.c")
            with open(src, "w") as f:
                f.write("int mg_native(void) { return 1; }\n")
            try:
                r = subprocess.run(tc.command + ["-march=native", "-c", "-o", os.path.join(d, "n.o"), src],
                                   capture_output=True, text=True, timeout=60)
                ok = r.returncode == 0 and not r.stderr.strip()
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _native[tc.path] = ok
    return DEFAULT_FLAGS + (["-march=native"] if _native[tc.path] else [])


