"""A failing tape call raises with the message libmg recorded on the tape (mg_tape_last_error):
the bindings check only what C cannot see (array shapes, row counts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c import _core


def _classifier():
    """Two inputs, a class target, a softmax over two affine logits."""
    x = mc.inputs(2)
    y = mc.inputs(1)
    w = [mc.Value(0.1 * (i + 1) - 0.3) for i in range(6)]
    logits = [mc.affine(w[3 * k : 3 * k + 2], x, w[3 * k + 2]) for k in range(2)]
    loss = mc.cross_entropy(logits, y[0])
    return _core.Tape(loss, x, y, w, logits, True)


X = np.array([[0.1, 0.2], [0.3, -0.4]])
Y = np.array([0.0, 1.0])


@pytest.mark.parametrize("lr", [math.nan, math.inf])
def test_fit_says_what_libmg_says(lr):
    tape = _classifier()
    with pytest.raises(ValueError, match=r"^fit: the learning rate (nan|inf) is not finite$"):
        tape.fit_epoch(X, Y, 1, lr, False, 0, 0)


def test_fit_without_targets_is_refused_by_libmg():
    tape = _classifier()
    with pytest.raises(ValueError, match=r"^fit: this program has targets: pass Y$"):
        tape.fit_epoch(X, None, 1, 0.1, False, 0, 0)


def test_a_target_that_is_not_a_class_index_names_its_row():
    tape = _classifier()
    before = tape.data().copy()
    with pytest.raises(ValueError, match=r"^fit: the target of row 1 is 2, not a class index"):
        tape.fit_epoch(X, np.array([0.0, 2.0]), 1, 0.1, False, 0, 0)
    assert np.array_equal(tape.data(), before)  # nothing trained
    with pytest.raises(ValueError, match=r"^forward: the target of row 0 is -1"):
        tape.forward(X[0], np.array([-1.0]))


def test_step_and_emit_say_what_libmg_says():
    tape = _classifier()
    with pytest.raises(ValueError, match=r"^step: the learning rate inf is not finite$"):
        tape.step(math.inf)
    with pytest.raises(ValueError, match=r"^emit: the prefix must be a C identifier"):
        tape.emit_c("not an identifier")
    # a call that succeeds afterwards is not affected by the failures before it
    assert tape.emit_c("ok_").count("ok_program") == 1
    assert math.isfinite(tape.fit_epoch(X, Y, 1, 0.1, False, 0, 0))


def test_shapes_are_checked_by_the_bindings():
    tape = _classifier()
    with pytest.raises(ValueError, match=r"expected shape \(n, 2\)"):
        tape.fit_epoch(np.zeros((2, 3)), Y, 1, 0.1, False, 0, 0)
    with pytest.raises(ValueError, match="X has 2 rows but Y has 3"):
        tape.fit_epoch(X, np.zeros(3), 1, 0.1, False, 0, 0)
