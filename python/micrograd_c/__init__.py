"""micrograd_c: a fast drop-in replacement for micrograd, on a scalar autograd engine in C.

Change ``from micrograd.engine import Value`` to ``from micrograd_c.engine import Value`` (and
``micrograd.nn`` to ``micrograd_c.nn``): the same program computes the same forward values, and
gradients equal to micrograd's or to rounding (docs/ARCHITECTURE.md states the exact contract),
faster and without micrograd's recursion and memory limits.

Importing the package (or ``micrograd_c.engine``) loads the C core and the engine only. The
modules with heavier dependencies load when first used: ``micrograd_c.nn`` (numpy),
``micrograd_c.viz``, and the compiler (``micrograd_c.compile`` and the rest of
:mod:`micrograd_c.compiler`: subprocess, ctypes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _core, functional
from .engine import Op, StaleValueError, Value, checkpoint, graph_bytes, graph_len, op_of
from .functional import affine, cross_entropy, dot, hinge, mse, vsum

if TYPE_CHECKING:
    from . import compiler as compiler
    from . import datasets as datasets
    from . import modelfile as modelfile
    from . import nn as nn
    from . import viz as viz
    from .compiler import CompileError, Program, compile, inputs
    from .nn import MLP, Layer, Module, Neuron
    from .viz import draw_dot

#: The version, libmg's (``MG_VERSION``): both come from meson.build's project version.
__version__: str = _core.LIBMG_VERSION

#: Names imported from their module on first use (PEP 562), so that importing the engine never
#: imports the compiler: name -> module.
_LAZY = {
    "compile": "compiler",
    "inputs": "compiler",
    "Program": "compiler",
    "CompileError": "compiler",
    "Module": "nn",
    "Neuron": "nn",
    "Layer": "nn",
    "MLP": "nn",
    "draw_dot": "viz",
}
#: Submodules reachable as attributes (``micrograd_c.compiler.cache_dir()``), imported on first use.
_SUBMODULES = ("compiler", "datasets", "modelfile", "nn", "viz")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (not the helpers this module imports: ``Any``, ``importlib``...)."""
    return sorted({*__all__, *_SUBMODULES, "__version__"})


__all__ = [
    "Value",
    "Module",
    "Neuron",
    "Layer",
    "MLP",
    "Op",
    "op_of",
    "StaleValueError",
    "checkpoint",
    "graph_len",
    "graph_bytes",
    "draw_dot",
    "functional",
    "vsum",
    "dot",
    "affine",
    "mse",
    "hinge",
    "cross_entropy",
    "compile",
    "inputs",
    "Program",
    "CompileError",
    "__version__",
]
