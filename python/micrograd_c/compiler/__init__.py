"""Frozen programs: freeze a graph once, then train it in C with no Python in the loop.

    x = micrograd_c.inputs(784)
    y = micrograd_c.inputs(1)
    logits = model(x)
    loss = micrograd_c.cross_entropy(logits, y[0])
    prog = micrograd_c.compile(loss, inputs=x, targets=y, params=model.parameters(), outputs=logits)
    losses = prog.fit(X, Y, epochs=1, lr=0.01)
    prog.write_back()                      # the trained parameters back into the model's Values

Backends: ``"tape"`` interprets the frozen program in libmg (no compiler needed); ``"c"`` emits C,
compiles it with the system's C compiler and loads it; ``"auto"`` uses the compiler when one
works and otherwise the tape, with a warning. Compiled libraries are cached (see
:func:`cache_dir`), keyed by the source, the compiler and its version, the flags and the
emitter's version; a cache hit loads in milliseconds.
"""

from __future__ import annotations

from .codecache import build_library, cache_dir, load_library
from .program import Program, compile, inputs, kernel_isa
from .toolchain import (
    CANDIDATES,
    DEFAULT_FLAGS,
    OPTIONAL_FLAGS,
    TUNING_FLAGS,
    CompileError,
    Toolchain,
    default_flags,
    find_compiler,
)

__all__ = [
    "compile",
    "inputs",
    "kernel_isa",
    "Program",
    "CompileError",
    "find_compiler",
    "Toolchain",
    "cache_dir",
    "build_library",
    "load_library",
    "DEFAULT_FLAGS",
    "OPTIONAL_FLAGS",
    "TUNING_FLAGS",
    "CANDIDATES",
    "default_flags",
]
