"""A failing tape call raises with the message libmg recorded on the tape (mg_tape_last_error):
the bindings check only what C cannot see (array shapes, row counts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c import _core

from conftest import BACKENDS


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
    with pytest.raises(
        ValueError, match=r"^fit: the target in row 1, column 0 of Y is 2, not a class index"
    ):
        tape.fit_epoch(X, np.array([0.0, 2.0]), 1, 0.1, False, 0, 0)
    assert np.array_equal(tape.data(), before)  # nothing trained
    with pytest.raises(ValueError, match=r"^forward: the target in row 0, column 0 of Y is -1"):
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


# ---- the Program layer: arguments are checked in micrograd_c's words, on every backend -------


def _program(backend: str) -> mc.Program:
    x = mc.inputs(2)
    y = mc.inputs(1)
    w = [mc.Value(0.1 * (i + 1) - 0.3) for i in range(6)]
    logits = [mc.affine(w[3 * k : 3 * k + 2], x, w[3 * k + 2]) for k in range(2)]
    return mc.compile(mc.cross_entropy(logits, y[0]), x, y, w, logits, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda p: p.fit(X, Y, seed=-1), ValueError, "seed must be at least 0, got -1"),
        (lambda p: p.fit(X, Y, seed=2**64), ValueError, "seed must be at most"),
        (lambda p: p.fit(X, Y, threads=-1), ValueError, "threads must be at least 1"),
        (lambda p: p.fit(X, Y, threads=2**64), ValueError, "threads must be at most"),
        (lambda p: p.fit(X, Y, threads=1.0), TypeError, "threads must be an integer"),
        (lambda p: p.fit(X, Y, batch_size=2.5), TypeError, "batch_size must be an integer"),
        (lambda p: p.fit(X, Y, batch_size=0), ValueError, "batch_size must be at least 1"),
        (lambda p: p.fit(X, Y, batch_size=2**64), ValueError, "batch_size must be at most"),
        (lambda p: p.fit(X, Y, epochs=-1), ValueError, "epochs must be at least 0"),
        (lambda p: p.fit(X, Y, epochs="2"), TypeError, "epochs must be an integer"),
        (lambda p: p.fit(X, Y, lr=math.nan), ValueError, "learning rate nan is not finite"),
        (lambda p: p.step(0.1, count=-1), ValueError, "count must be at least 1"),
        (lambda p: p.step(0.1, count=2**64), ValueError, "count must be at most"),
        (lambda p: p.step(0.1, count=2.0), TypeError, "count must be an integer"),
        (
            lambda p: p.fit(X, np.array([0.0, 2.0])),
            ValueError,
            "target in row 1, column 0 of Y is 2,",
        ),
        (
            lambda p: p.fit(X, np.array([0.5, 1.0])),
            ValueError,
            "target in row 0, column 0 of Y is 0.5,",
        ),
        (lambda p: p.forward(X[0], [3.0]), ValueError, "target in row 0, column 0 of Y is 3,"),
        (
            lambda p: p.fit(X, np.array([0.0, 1.0000000001])),
            ValueError,
            "target in row 1, column 0 of Y is 1.0000000001,",
        ),
    ],
)
def test_program_arguments_are_one_line_errors(backend, call, exc, words):
    p = _program(backend)
    before = p.parameters.copy()
    with pytest.raises(exc) as e:
        call(p)
    msg = str(e.value)
    assert words in msg, msg
    assert "\n" not in msg and "incompatible function arguments" not in msg
    assert np.array_equal(p.parameters, before)  # nothing trained


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(max_kernels=-1), ValueError, "max_kernels must be at least 0"),
        (dict(max_kernels=2.5), TypeError, "max_kernels must be an integer"),
        (dict(max_kernels=2**64), ValueError, "max_kernels must be at most"),
        (dict(timeout=0), ValueError, "timeout must be a positive number"),
        (dict(timeout=math.nan), ValueError, "timeout must be a positive number"),
        (dict(timeout="1"), TypeError, "timeout must be a number"),
        (dict(backend="gpu"), ValueError, "backend must be 'auto', 'tape' or 'c'"),
        (dict(targets=None), TypeError, "targets must be a sequence of Values (an empty list"),
        (dict(outputs=mc.Value(1.0)), TypeError, "outputs must be a sequence of Values"),
        (dict(params=3), TypeError, "params must be a sequence of Values"),
    ],
)
def test_compile_arguments_are_one_line_errors(kw, exc, words):
    x = mc.inputs(1)
    w = mc.Value(0.5)
    kw = {"params": [w], **kw}
    with pytest.raises(exc) as e:
        mc.compile((w * x[0] - 1.0) ** 2, x, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_larger_than_the_data_trains_as_one_batch(backend):
    """batch_size * record size once wrapped to a tiny allocation (2**61 * 8 bytes = 0)."""
    big, whole = _program(backend), _program(backend)
    Xs = np.array([[0.1, 0.2], [0.3, -0.4], [-0.5, 0.6]])
    Ys = np.array([0.0, 1.0, 1.0])
    for p, bs in ((big, 2**61), (whole, 3)):
        losses = p.fit(Xs, Ys, epochs=2, batch_size=bs, shuffle=False)
        assert all(math.isfinite(v) for v in losses)
    assert np.array_equal(big.parameters, whole.parameters)
    assert not np.array_equal(big.parameters, _program(backend).parameters)  # it trained
    big.fit(Xs, Ys, batch_size=2**64 - 1, threads=2**63)  # clamped too, not an allocation


def _hinge_program(backend: str) -> mc.Program:
    x = mc.inputs(2)
    y = mc.inputs(2)
    w = [mc.Value(0.1 * (i + 1) - 0.3) for i in range(6)]
    scores = [mc.affine(w[3 * k : 3 * k + 2], x, w[3 * k + 2]) for k in range(2)]
    return mc.compile(mc.hinge(scores, y), x, y, w, scores, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hinge_labels_from_data_are_minus_one_or_one(backend):
    p = _hinge_program(backend)
    before = p.parameters.copy()
    good = np.array([[1.0, -1.0], [-1.0, 1.0]])
    for bad, where in (
        ([[1.0, -1.0], [0.0, 1.0]], "row 1, column 0 of Y is 0:"),
        ([[1, 2], [1, 1]], "row 0, column 1 of Y is 2:"),
    ):
        with pytest.raises(ValueError, match="hinge labels are -1 or \\+1") as e:
            p.fit(X, np.array(bad, dtype=float))
        assert where in str(e.value)
    with pytest.raises(ValueError, match="forward: the label in row 0, column 0 of Y is 0.5"):
        p.forward(X[0], [0.5, 1.0])
    assert np.array_equal(p.parameters, before)
    assert math.isfinite(p.fit(X, good)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_without_a_loss_does_not_train(backend):
    x = mc.inputs(2)
    w = [mc.Value(0.5), mc.Value(-0.25)]
    out = mc.dot(w, x)
    p = mc.compile(None, x, params=w, outputs=[out], backend=backend)
    with pytest.raises(ValueError, match="^fit: this program has no loss$"):
        p.fit(X)
    with pytest.raises(ValueError, match="^backward: this program has no loss$"):
        p.forward(X[0])
        p.backward()
    assert math.isnan(p.loss)
    assert p.predict(X)[:, 0] == pytest.approx([0.5 * 0.1 - 0.25 * 0.2, 0.5 * 0.3 + 0.25 * 0.4])


def _mlp_program(backend: str, raise_loops: bool) -> mc.Program:
    """An MLP whose layers raise to loop nests (packed weights) when ``raise_loops``."""
    from micrograd_c.nn import MLP

    net = MLP(8, [16, 16, 1])
    for i, p in enumerate(net.parameters()):
        p.data = math.sin(i + 1.0) * 0.5
    x = mc.inputs(8)
    y = mc.inputs(1)
    out = net(x)
    loss = (out - y[0]) ** 2
    return mc.compile(loss, x, y, net.parameters(), [out], backend=backend, raise_loops=raise_loops)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_left_by_backward_do_not_reach_fit(backend):
    """One rule for every parameter (free ones and the weights packed into loop nests): fit starts
    each epoch from zero gradients, so a backward() before it changes nothing."""
    Xs = np.sin(np.arange(32.0)).reshape(4, 8)
    Ys = np.array([0.5, -0.5, 1.0, 0.0])
    results = {}
    for raise_loops in (True, False):
        clean, dirty = _mlp_program(backend, raise_loops), _mlp_program(backend, raise_loops)
        assert (clean.info["packed"] > 0) == raise_loops  # weights packed into loop nests
        dirty.forward(Xs[0], Ys[:1])
        dirty.backward()
        assert np.any(dirty.grad != 0)
        for p in (clean, dirty):
            p.fit(Xs, Ys, epochs=2, batch_size=2, shuffle=False)
        assert np.array_equal(clean.parameters, dirty.parameters)
        results[raise_loops] = clean.parameters.copy()
    # and the rerolled and scalar programs train to the same parameters (sums in another order)
    assert np.allclose(results[True], results[False], rtol=0, atol=1e-12)


def test_an_input_used_as_the_class_is_checked_as_a_target():
    x = mc.inputs(3)
    w = [mc.Value(0.1 * (i + 1) - 0.3) for i in range(6)]
    logits = [mc.affine(w[3 * k : 3 * k + 2], x[:2], w[3 * k + 2]) for k in range(2)]
    p = mc.compile(mc.cross_entropy(logits, x[2]), x, params=w, backend="tape")
    with pytest.raises(ValueError, match=r"^fit: the target in row 1, column 2 of X is 0.5,"):
        p.fit(np.array([[0.1, 0.2, 1.0], [0.3, 0.4, 0.5]]))
    assert math.isfinite(p.fit(np.array([[0.1, 0.2, 1.0], [0.3, 0.4, 0.0]]))[0])


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda p: p.fit(X, Y, shuffle="no"), TypeError, "shuffle must be True or False"),
        (lambda p: p.fit(X, Y, progress=1), TypeError, "progress must be True or False"),
        (lambda p: p.fit(X, Y, lr=True), TypeError, "lr must be a number"),
        (lambda p: p.fit(X, Y, lr="0.1"), TypeError, "lr must be a number"),
        (lambda p: p.step("0.1"), TypeError, "lr must be a number"),
        (lambda p: p.fit(np.zeros((0, 2)), np.zeros(0)), ValueError, "X has no rows"),
        (lambda p: p.c_source(None), TypeError, "prefix must be a string"),
        (lambda p: p.c_source(5), TypeError, "prefix must be a string"),
        (lambda p: p.c_source("m_", "yes"), TypeError, "inference_only must be True or False"),
        (lambda p: p.c_source("mgc_\x00z"), ValueError, "NUL"),
    ],
)
def test_program_flags_and_numbers_are_checked(call, exc, words):
    p = _program("tape")
    with pytest.raises(exc) as e:
        call(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_y_for_a_program_without_targets_is_refused():
    x = mc.inputs(2)
    w = [mc.Value(0.5), mc.Value(-0.25)]
    p = mc.compile(mc.dot(w, x) ** 2, x, params=w, backend="tape")
    with pytest.raises(ValueError, match="this program has no targets: pass Y=None"):
        p.fit(X, np.zeros(5))
    assert math.isfinite(p.fit(X)[0])


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(raise_loops="no"), TypeError, "raise_loops must be True or False"),
        (dict(fast_math="no"), TypeError, "fast_math must be True or False"),
        (dict(cc=5), TypeError, "cc must be a command string"),
        (dict(cc=["gcc"]), TypeError, "cc must be a command string"),
        (dict(flags="-O2"), TypeError, "flags must be a list of strings"),
        (dict(cc="gcc '", backend="c"), mc.CompileError, "is not a command line"),
    ],
)
def test_compile_flags_and_toolchain_arguments_are_checked(kw, exc, words):
    x = mc.inputs(1)
    w = mc.Value(0.5)
    with pytest.raises(exc) as e:
        mc.compile((w * x[0] - 1.0) ** 2, x, params=[w], **kw)
    assert words in str(e.value).splitlines()[0]


def test_a_cc_that_is_not_a_command_line_falls_back_under_auto(monkeypatch):
    monkeypatch.setenv("CC", "gcc '")
    x = mc.inputs(1)
    w = mc.Value(0.5)
    with pytest.warns(RuntimeWarning, match="is not a command line"):
        p = mc.compile((w * x[0] - 1.0) ** 2, x, params=[w], timeout=np.int64(5))
    assert p.backend == "tape"
