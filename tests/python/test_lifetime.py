"""Lifetimes: graphs are reclaimed promptly by reference counting; handles never dangle."""

from __future__ import annotations

import gc
import random
import resource

import pytest

import micrograd_c as mc
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

from conftest import settled_graph_len


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_dropped_graph_is_freed_without_the_cyclic_collector():
    gc.disable()
    try:
        base = mc.graph_len()
        a = Value(1.0)
        y = a
        for _ in range(10_000):
            y = y * 1.0001 + a
        assert mc.graph_len() >= base + 30_000
        del y
        assert mc.graph_len() == base + 1  # only `a` remains, with no gc.collect()
    finally:
        gc.enable()


def test_training_loop_10000_steps_in_flat_memory():
    random.seed(0)
    model = MLP(2, [8, 1])
    X = [[random.uniform(-1, 1), random.uniform(-1, 1)] for _ in range(4)]
    Y = [1, -1, -1, 1]

    def step():
        scores = [model([Value(a), Value(b)]) for a, b in X]
        loss = sum((1 + -y * s).relu() for y, s in zip(Y, scores)) * 0.25
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= 0.01 * p.grad

    for _ in range(200):
        step()
    nodes, graph_bytes, rss = settled_graph_len(), mc.graph_bytes(), rss_mb()
    for _ in range(10_000):
        step()
    assert mc.graph_len() == nodes
    assert mc.graph_bytes() == graph_bytes  # slots are reused: no growth at all
    assert rss_mb() - rss < 5.0


def test_checkpoint_releases_and_stale_handles_raise():
    w = Value(2.0)
    base = settled_graph_len()
    with mc.checkpoint():
        y = w * w + 1
        y.backward()
        assert mc.graph_len() > base
    assert mc.graph_len() == base
    assert w.grad == 4.0 and w.data == 2.0
    assert y._alive is False
    for use in (
        lambda: y.data,
        lambda: y.grad,
        lambda: y + 1,
        lambda: y.backward(),
        lambda: y._prev,
    ):
        with pytest.raises(mc.StaleValueError, match="released"):
            use()
    assert "released" in repr(y)
    # the stale handle's slot may be reused: new values are unaffected by the stale handle
    z = w + 3
    y = None  # drops the handle (the lambdas above share this variable)
    gc.collect()
    assert z.data == 5.0 and z._alive


def test_handles_are_canonical():
    a, b = Value(1.0), Value(2.0)
    c = a * b
    (x, y) = sorted(c._prev, key=lambda v: v.data)
    assert x is a and y is b
    m = MLP(2, [2])
    assert m.parameters()[0] is m.layers[0].neurons[0].w[0]
    out = m([a, b])
    assert isinstance(out, list)


def test_model_outlives_its_python_views():
    random.seed(1)
    m = MLP(2, [3, 1])
    n = m.layers[0].neurons[0]
    w0 = n.w[0]
    del m
    gc.collect()
    assert w0._alive and isinstance(n([1.0, 2.0]), Value)


def test_parameters_survive_graph_release():
    random.seed(2)
    m = MLP(2, [3, 1])
    params = m.parameters()
    base = settled_graph_len()
    for _ in range(10):
        m([1.0, 2.0]).backward()
    assert mc.graph_len() == base
    assert all(p._alive for p in params)
