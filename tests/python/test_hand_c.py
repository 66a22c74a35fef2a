"""The hand-written C references of benchmarks/models.py compute what the zoo's models compute.

models.py quotes compiled / hand C ratios; a ratio against a reference that trains another model
(a wrong index, a padding tap added or dropped) would be worthless. Each reference trains one
epoch at batch size 1 from the zoo model's initial parameters, and must end with the same mean
loss and parameters as micrograd_c's tape interpreter on the same images, to rounding (the two
sum a gradient's terms in different orders).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c import compiler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
# models.py pins BLAS and OpenMP to one thread when it is imported (for its own timings): that
# setting must not outlive the import into the other tests of this process (torch reads it)
_PINNED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
_saved = {k: os.environ.get(k) for k in _PINNED}
import models  # noqa: E402  (the benchmark itself: its HAND table and build_hand)
import zoo  # noqa: E402

for _k, _v in _saved.items():
    if _v is None:
        os.environ.pop(_k, None)
    else:
        os.environ[_k] = _v

from conftest import needs_cc  # noqa: E402


@needs_cc
@pytest.mark.parametrize("name", sorted(models.HAND))
def test_hand_written_c_trains_the_zoo_model(name: str) -> None:
    random.seed(0)
    x, y = mc.inputs(784), mc.inputs(1)
    logits, params = zoo.FAMILIES[name].build(x)
    prog = mc.compile(mc.cross_entropy(logits, y[0]), x, y, params, backend="tape")
    init = prog.parameters.copy()
    rng = np.random.default_rng(7)
    n, lr = 12, 0.05
    X = np.ascontiguousarray(rng.random((n, 784)))
    Y = rng.integers(0, 10, (n, 1)).astype(np.float64)

    tc = compiler.find_compiler()
    with tempfile.TemporaryDirectory() as work:
        _lib, fn, nparams = models.build_hand(name, tc, compiler.default_flags(tc), work)
        assert nparams == len(init), f"{name}: the hand-written C's parameters are another model's"
        hand = init.copy()
        order = np.arange(n, dtype=np.uintp)
        hand_loss = fn(hand.ctypes.data, X.ctypes.data, Y.ctypes.data, order.ctypes.data, n, lr)

    (tape_loss,) = prog.fit(X, Y, epochs=1, lr=lr, batch_size=1, shuffle=False)
    assert hand_loss == pytest.approx(tape_loss, rel=1e-12)
    trained = prog.parameters
    assert np.abs(trained - init).max() > 1e-3  # the epoch moved the parameters
    np.testing.assert_allclose(hand, trained, rtol=1e-10, atol=1e-12)
