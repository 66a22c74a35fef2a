"""micrograd_c: a fast drop-in replacement for micrograd, on a scalar autograd engine in C.

Change ``from micrograd.engine import Value`` to ``from micrograd_c.engine import Value`` (and
``micrograd.nn`` to ``micrograd_c.nn``): the same program computes the same numbers, faster and
without micrograd's recursion and memory limits.
"""
from __future__ import annotations

from . import functional
from .compiler import CompileError, Program, compile, inputs
from .engine import Op, StaleValueError, Value, checkpoint, graph_bytes, graph_len, op_of
from .functional import affine, cross_entropy, dot, hinge, mse, vsum
from .nn import MLP, Layer, Module, Neuron
from .viz import draw_dot

__version__ = "0.1.0"

__all__ = [
    "Value", "Module", "Neuron", "Layer", "MLP", "Op", "op_of", "StaleValueError", "checkpoint",
    "graph_len", "graph_bytes", "draw_dot", "functional", "vsum", "dot", "affine", "mse", "hinge",
    "cross_entropy", "compile", "inputs", "Program", "CompileError", "__version__",
]
