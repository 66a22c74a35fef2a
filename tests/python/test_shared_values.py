"""Shared values: what a program computes from its parameters alone, for the loss alone
(micrograd's L2 term, ``alpha * sum(p*p for p in params)``), is the same for every sample of a
batch. The compiler keeps such values among the shared slots and a batched fit computes them
once per batch, before its samples, and propagates their gradients once, after them, from the
sum of the samples' (libmg/src/drive.h, shared_item). These tests hold that to the definition
of a batch (per-sample gradients in sample order, one step of their mean) to 1e-12, bitwise
across thread counts and between the tape and compiled code, and to micrograd's own eager
arithmetic."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import micrograd_c as mc
from micrograd_c import functional as F
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

from conftest import HAVE_CC

BACKENDS = ["tape"] + (["c"] if HAVE_CC else [])


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROGRAD_C_CACHE_DIR", str(tmp_path / "cache"))


def shared_range(prog) -> tuple[int, int] | None:
    """The shared values' slots, as describe() prints them, or None."""
    m = re.search(r"shared values \[(\d+), (\d+)\)", prog.describe())
    return (int(m.group(1)), int(m.group(2))) if m else None


def once_per_batch(prog) -> bool:
    return "once per batch: the first forward" in prog.describe()


def l2_mlp(backend: str, seed: int = 0, alpha: float = 1e-3):
    """micrograd's demo: nn.MLP, a hinge loss per sample plus alpha * sum(p*p)."""
    random.seed(seed)
    model = MLP(2, [8, 8, 1])
    x, y = mc.inputs(2), mc.inputs(1)
    out = model(x)
    loss = (1 + -y[0] * out).relu() + alpha * F.vsum([p * p for p in model.parameters()])
    prog = mc.compile(
        loss, inputs=x, targets=y, params=model.parameters(), outputs=[out], backend=backend
    )
    return model, prog


def moons_like(n: int, seed: int = 0):
    r = np.random.default_rng(seed)
    X = r.uniform(-1.5, 1.5, size=(n, 2))
    Y = np.where(X[:, 0] * X[:, 1] > 0, 1.0, -1.0).reshape(n, 1)
    return X, Y


def definition(prog, p0, X, Y, batch: int, lr: float):
    """One epoch as the definition of a batch: each sample's forward and backward in order (its
    gradients accumulate), then one step of the mean."""
    prog.parameters[:] = p0
    for b in range(0, len(X), batch):
        rows = range(b, min(b + batch, len(X)))
        for s in rows:
            prog.forward(X[s], Y[s])
            prog.backward()
        prog.step(lr, len(rows))
    return prog.parameters.copy()


@pytest.mark.parametrize("batch", [1, 2, 10, 32, 37])
def test_l2_term_is_computed_once_per_batch_and_trains_as_the_definition(batch):
    X, Y = moons_like(75, seed=batch)
    got = {}
    progs = {be: l2_mlp(be)[1] for be in BACKENDS}
    for be, prog in progs.items():
        rng = shared_range(prog)
        # the L2's sum (its squares are the sum's terms, not values of their own)
        assert rng is not None and rng[1] - rng[0] >= 1, prog.describe()[:400]
        assert once_per_batch(prog)
        p0 = prog.parameters.copy()
        for threads in (1, 2, 3):
            prog.parameters[:] = p0
            prog.fit(X, Y, batch_size=batch, lr=0.05, shuffle=False, threads=threads)
            got[be, threads] = prog.parameters.copy()
    ref = progs["tape"]
    want = definition(ref, p0, X, Y, batch, 0.05)
    assert not np.array_equal(want, p0)
    for key, params in got.items():
        assert np.allclose(params, want, rtol=1e-12, atol=1e-15), key
        assert np.array_equal(params, got["tape", 1]), key


def test_l2_term_matches_micrograd_eager_arithmetic():
    """The compiled program's loss and gradients are micrograd's (the `micrograd` package, the
    reference: its own MLP from the same seed, its Value.backward over the demo's loss) and
    micrograd_c's eager ones, to 1e-12, the L2 term's values shared or not."""
    from micrograd.nn import MLP as RefMLP

    model, prog = l2_mlp("tape", seed=4, alpha=0.01)
    xs, ys = [0.3, -0.8], [1.0]
    prog.forward(xs, ys)
    prog.backward()
    random.seed(4)  # micrograd's initialisation, in micrograd's order: the same parameters
    ref = RefMLP(2, [8, 8, 1])
    assert [p.data for p in ref.parameters()] == [p.data for p in model.parameters()]
    for m, V in ((model, Value), (ref, type(ref.parameters()[0]))):
        out = m([V(v) for v in xs])
        loss = (1 + -ys[0] * out).relu() + 0.01 * sum((p * p for p in m.parameters()), V(0.0))
        m.zero_grad()
        loss.backward()
        assert abs(prog.loss - loss.data) <= 1e-12 * max(1.0, abs(loss.data))
        grads = np.array([p.grad for p in m.parameters()])
        assert np.allclose(prog.grad, grads, rtol=1e-12, atol=1e-15)


def test_backward_twice_adds_the_parameters_gradients_twice():
    """The shared values' gradients are fresh in every backward, as every computed value's: two
    backward calls after one forward give each parameter twice its gradient."""
    _, prog = l2_mlp("tape", seed=2)
    prog.forward([0.5, 0.25], [-1.0])
    prog.backward()
    once = np.array(prog.grad)
    prog.backward()
    assert np.allclose(np.array(prog.grad), 2 * once, rtol=1e-15, atol=0)


def test_values_an_output_reads_stay_per_sample():
    """A value of the parameters alone that an output reads (a weight's scale, used by the model)
    is not shared: predict computes the outputs row by row, without a batch around it. The L2
    term beside it still is."""
    random.seed(3)
    x, y = mc.inputs(3), mc.inputs(1)
    w = [Value(random.uniform(-1, 1)) for _ in range(3)]
    s = Value(0.7)
    scale = s.exp()  # parameters alone, read by the output
    out = scale * sum((wi * xi for wi, xi in zip(w, x)), Value(0.0))
    params = w + [s]
    loss = (out - y[0]) ** 2 + 1e-2 * F.vsum([p * p for p in params])
    prog = mc.compile(loss, inputs=x, targets=y, params=params, outputs=[out], backend="tape")
    rng = shared_range(prog)
    assert rng is not None and rng[1] - rng[0] < 4 + 2  # the L2's sum (and terms), not exp(s)
    X = np.random.default_rng(1).uniform(-1, 1, size=(20, 3))
    Y = X.sum(axis=1, keepdims=True)
    p0 = prog.parameters.copy()
    for threads in (1, 2):
        prog.parameters[:] = p0
        prog.fit(X, Y, batch_size=8, lr=0.05, shuffle=False, threads=threads)
        if threads == 1:
            one = prog.parameters.copy()
    assert np.array_equal(prog.parameters, one)
    assert np.allclose(one, definition(prog, p0, X, Y, 8, 0.05), rtol=1e-12, atol=1e-15)
    pred = prog.predict(X[:3])
    eager_scale = np.exp(prog.parameters[3])
    assert np.allclose(pred[:, 0], eager_scale * (X[:3] @ prog.parameters[:3]), rtol=1e-12)


def test_shared_values_inside_nonlinear_terms():
    """Shared values read by per-sample terms (exp(p0) times the sample's error), a shared value
    read twice, and a shared chain under tanh and a square: every gradient path, batched, equals
    the definition."""
    random.seed(8)
    x, y = mc.inputs(4), mc.inputs(1)
    w = [Value(random.uniform(-1, 1)) for _ in range(4)]
    a, c = Value(0.3), Value(-0.2)
    out = sum((wi * xi for wi, xi in zip(w, x)), Value(0.0))
    err = out - y[0]
    gate = a.exp()  # shared, read by a per-sample product
    ring = (F.vsum([p * p for p in w]) - 1.0) ** 2  # shared chain
    loss = gate * err * err + 0.1 * ring + 0.05 * (a * c).tanh() + 0.01 * gate
    params = w + [a, c]
    progs = {
        be: mc.compile(loss, inputs=x, targets=y, params=params, backend=be) for be in BACKENDS
    }
    X = np.random.default_rng(2).uniform(-1, 1, size=(23, 4))
    Y = np.random.default_rng(3).uniform(-1, 1, size=(23, 1))
    got = {}
    for be, prog in progs.items():
        assert once_per_batch(prog), prog.describe()[:400]
        p0 = prog.parameters.copy()
        for threads in (1, 2, 3):
            prog.parameters[:] = p0
            prog.fit(X, Y, batch_size=6, lr=0.02, shuffle=True, seed=5, threads=threads)
            got[be, threads] = prog.parameters.copy()
    for key, params_after in got.items():
        assert np.array_equal(params_after, got["tape", 1]), key
    ref = progs["tape"]
    ref.parameters[:] = p0
    ref.fit(X, Y, batch_size=6, lr=0.02, shuffle=False)
    unshuffled = ref.parameters.copy()
    want = definition(ref, p0, X, Y, 6, 0.02)
    assert not np.array_equal(want, p0)
    assert np.allclose(unshuffled, want, rtol=1e-12, atol=1e-15)


def test_a_loss_of_the_parameters_alone_besides_a_per_sample_one():
    """Every operand of the loss but one sample's error is a shared value: the batch's steps
    still equal the definition, and the loss a fit reports is the mean of the samples'."""
    random.seed(1)
    x, y = mc.inputs(1), mc.inputs(1)
    p = [Value(random.uniform(-1, 1)) for _ in range(5)]
    pen = F.vsum([(q - 0.5) ** 2 for q in p])
    loss = (p[0] * x[0] - y[0]) ** 2 + pen
    prog = mc.compile(loss, inputs=x, targets=y, params=p, backend="tape")
    X = np.linspace(-1, 1, 12).reshape(12, 1)
    Y = 2 * X
    p0 = prog.parameters.copy()
    mean_loss = prog.fit(X, Y, batch_size=4, lr=0.1, shuffle=False)
    got = prog.parameters.copy()
    prog.parameters[:] = p0
    losses = []
    for b in range(0, 12, 4):
        for s in range(b, b + 4):
            prog.forward(X[s], Y[s])
            losses.append(prog.loss)
            prog.backward()
        prog.step(0.1, 4)
    assert np.allclose(got, prog.parameters, rtol=1e-12, atol=1e-15)
    assert abs(np.mean(losses) - np.ravel(mean_loss)[0]) <= 1e-12


@pytest.mark.skipif(not HAVE_CC, reason="float32 storage is compiled code")
def test_float32_storage_with_shared_values():
    """float32 storage runs the same programs (drive.h over float slots): its batched fit with
    the L2 term stays within float32's rounding of float64's."""
    X, Y = moons_like(64, seed=9)
    _, p64 = l2_mlp("c", seed=6)
    random.seed(6)
    model = MLP(2, [8, 8, 1])
    x, y = mc.inputs(2), mc.inputs(1)
    out = model(x)
    loss = (1 + -y[0] * out).relu() + 1e-3 * F.vsum([p * p for p in model.parameters()])
    p32 = mc.compile(
        loss, inputs=x, targets=y, params=model.parameters(), backend="c", float32=True
    )
    assert once_per_batch(p32)
    p32.parameters[:] = p64.parameters
    p0 = p64.parameters.copy()
    p64.fit(X, Y, batch_size=16, lr=0.05, shuffle=False)
    p32.fit(X, Y, batch_size=16, lr=0.05, shuffle=False)
    assert not np.array_equal(p64.parameters, p0)
    assert np.allclose(p32.parameters, p64.parameters, rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batch=st.sampled_from([2, 3, 7, 16]),
    n_shared=st.integers(1, 4),
)
def test_random_shared_terms_train_as_the_definition(seed, batch, n_shared):
    """Random models with random terms of the parameters alone added to the loss (sums of
    squares, products under exp, tanh and max, a parameter's own power): batched fits on the tape
    equal the definition to 1e-12 and are bitwise the same on 1 and 2 threads."""
    rnd = random.Random(seed)
    x, y = mc.inputs(3), mc.inputs(1)
    w = [Value(rnd.uniform(-1, 1)) for _ in range(9)]
    h = [sum((w[3 * j + i] * x[i] for i in range(3)), Value(0.0)).tanh() for j in range(3)]
    loss = (sum(h, Value(0.0)) - y[0]) ** 2
    for _ in range(n_shared):
        ps = rnd.sample(w, rnd.randint(1, 5))
        kind = rnd.randrange(5)
        if kind == 0:
            term = F.vsum([p * p for p in ps])
        elif kind == 1:
            term = (ps[0] * ps[-1]).exp()
        elif kind == 2:
            term = (ps[0] + ps[-1]).tanh() * 0.5
        elif kind == 3:
            term = ps[0].max(ps[-1])
        else:
            term = ps[0] ** 2 + ps[-1]
        loss = loss + rnd.choice([1e-3, 0.1, 1.0]) * term
    prog = mc.compile(loss, inputs=x, targets=y, params=w, backend="tape")
    assert shared_range(prog) is not None
    r = np.random.default_rng(seed)
    X, Y = r.uniform(-1, 1, size=(2 * batch + 1, 3)), r.uniform(-1, 1, size=(2 * batch + 1, 1))
    p0 = prog.parameters.copy()
    got = []
    for threads in (1, 2):
        prog.parameters[:] = p0
        prog.fit(X, Y, batch_size=batch, lr=0.01, shuffle=False, threads=threads)
        got.append(prog.parameters.copy())
    assert np.array_equal(got[0], got[1])
    want = definition(prog, p0, X, Y, batch, 0.01)
    assert np.allclose(got[0], want, rtol=1e-12, atol=1e-14)
