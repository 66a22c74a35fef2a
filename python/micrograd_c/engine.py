"""Scalar autograd values: ``from micrograd_c.engine import Value`` replaces micrograd's.

``Value`` is implemented in C (a node of libmg's process-wide graph) and behaves as micrograd's
``Value``: arithmetic with Values and real numbers on either side, ``relu()``, ``backward()``,
readable and writable ``data`` and ``grad``, ``_prev`` and ``_op`` for drawing. Beyond micrograd:
``tanh()``, ``exp()``, ``log()``, ``sigmoid()``, ``square()``, ``max(other)``, a Value as exponent.

Values nothing refers to are freed at once by reference counting (no reference cycles exist
between Python objects and nodes), so a training loop that builds a new graph every step runs in
flat memory. ``checkpoint()`` releases everything created inside a ``with`` block in one sweep.

Threads: all Values live in one process-wide graph, and every operation holds the GIL, so Values
may be created and used from any thread. ``checkpoint()`` is per thread: its restore releases only
the Values the *entering* thread created inside the block (each thread has its own checkpoint
domain), and keeps those that Values of other threads still use. Two threads can therefore each
train their own model with the pattern below and get the results they get alone. What is not
supported: two threads updating the *same* parameters without a lock (a data race on ``data``, as
with any Python object), and sharing a Value that one thread created inside its checkpoint with
another thread beyond the block (it is released when the block exits; using it raises
:class:`StaleValueError`). Up to 255 threads at a time get their own domain; threads beyond share
one, and then behave as a single thread would.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import _core

Value = _core.Value
StaleValueError = _core.StaleValueError

if TYPE_CHECKING:
    # The members are the rows of libmg's op table, known only once _core is loaded: to a type
    # checker, Op is an IntEnum whose members it cannot list.
    class Op(enum.IntEnum):
        """The ops of libmg's op table."""

else:
    #: The ops of libmg's op table, in table order (``Op.MUL``, ``Op.RELU``, ...).
    Op = enum.IntEnum("Op", {name.upper(): i for i, name in enumerate(_core.OP_NAMES)})


def op_of(v: Value) -> Op:
    """Return the op that produced ``v`` (``Op.LEAF`` for leaves)."""
    return Op(_core.op_of(v))


@contextlib.contextmanager
def checkpoint() -> Iterator[None]:
    """Release every Value the calling thread creates inside the ``with`` block when it exits.

    Handles to released Values raise :class:`StaleValueError` when used; Values created before
    the block (a model's parameters) are kept, with their data and gradients::

        with checkpoint():
            loss = model_loss()
            loss.backward()
        for p in model.parameters():
            p.data -= 0.1 * p.grad

    Create models before the block: a model created inside it loses its parameters when the block
    exits, and every later use (a call, ``parameters()``' Values, ``state_dict()``) raises
    :class:`StaleValueError`. Values other threads create meanwhile are not released, nor are
    this thread's Values that another thread's Values use (see the module docstring).
    """
    token = _core.checkpoint_save()
    try:
        yield
    finally:
        _core.checkpoint_restore(token)


def graph_len() -> int:
    """Return the number of live values in the process graph."""
    return _core.graph_len()


def graph_bytes() -> int:
    """Return the bytes the process graph uses (value blocks, operand arrays, working memory)."""
    return _core.graph_bytes()


__all__ = ["Value", "StaleValueError", "Op", "op_of", "checkpoint", "graph_len", "graph_bytes"]
