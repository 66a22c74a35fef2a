"""Variadic ops and losses of libmg, each one graph node however many operands it has."""

from __future__ import annotations

from collections.abc import Sequence

from . import _core
from .engine import Value

Scalar = Value | float | int


def vsum(values: Sequence[Scalar]) -> Value:
    """Sum of ``values`` added left to right, as one node (``sum()`` builds a chain instead)."""
    return _core.sum(values)


def dot(a: Sequence[Scalar], b: Sequence[Scalar]) -> Value:
    """Dot product ``a[0]*b[0] + ... + a[n-1]*b[n-1]``, added left to right, as one node."""
    return _core.dot(a, b)


def affine(w: Sequence[Scalar], x: Sequence[Scalar], b: Scalar) -> Value:
    """``b + w[0]*x[0] + ...`` in exactly micrograd's order, as one node."""
    return _core.affine(w, x, b)


def mse(pred: Sequence[Scalar], target: Sequence[Scalar]) -> Value:
    """Mean squared error ``sum((p - t)**2) / n``."""
    return _core.mse(pred, target)


def hinge(scores: Sequence[Scalar], labels: Sequence[Scalar]) -> Value:
    """Mean max-margin loss of micrograd's moons demo: ``sum(relu(1 - y*s)) * (1/n)``.

    Labels are -1 or +1. Computed in the same order as the demo's Python, so results agree. The
    op itself takes any real label (the margin loss of real-valued labels, differentiable in the
    labels too); a compiled program's ``fit``/``forward`` refuse labels in ``Y`` other than -1
    and +1, where a 0/1 dataset would otherwise train silently to nothing.
    """
    return _core.hinge(scores, labels)


def cross_entropy(logits: Sequence[Scalar], target: Scalar | int) -> Value:
    """Softmax cross-entropy of ``logits`` against the class index ``target`` (stable).

    Raises ``ValueError`` when ``target`` is not an integer in ``[0, len(logits))``.
    """
    return _core.cross_entropy(logits, target)


__all__ = ["vsum", "dot", "affine", "mse", "hinge", "cross_entropy"]
