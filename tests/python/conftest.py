"""Shared helpers for the Python tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

import pytest

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))  # micrograd's recursive backward

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MNIST_DIR = os.path.join(os.path.dirname(ROOT), "shared", "data", "mnist")

#: The marker of tests that reinstall the package into the running virtual environment (./dev's
#: rebuild of a stale install): beside other tests they would replace modules under a test that is
#: importing them, so they run alone. ./dev test runs them after the others (``-m alone``);
#: among several pytest-xdist workers they skip.
ALONE = "alone"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ALONE}: reinstalls the package into this venv; never beside other tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return
    skip = pytest.mark.skip(
        reason="reinstalls the package: runs alone, not among pytest-xdist workers "
        "(./dev test runs it after the others: pytest -m alone)"
    )
    for item in items:
        if ALONE in item.keywords:
            item.add_marker(skip)


def settled_graph_len() -> int:
    """The graph's live values once what earlier tests left in reference cycles (tracebacks
    holding Values) is collected: a count taken without it drops when the collector runs in the
    middle of a test (36 Values once, in test_threads.py). Take a test's base with this and its
    final count with ``mc.graph_len()``, so a cycle of the test's own still shows."""
    import gc

    import micrograd_c as mc

    gc.collect()
    return mc.graph_len()


def close(a: float, b: float, rel: float = 1e-12, scale: float = 1.0) -> bool:
    """|a - b| <= rel * max(|a|, |b|, scale): relative, with a floor for values near 0."""
    return abs(a - b) <= rel * max(abs(a), abs(b), scale)


def fd_matches(
    f: Callable[[Sequence[float]], float],
    x: Sequence[float],
    i: int,
    analytic: float,
    tol: float = 1e-6,
) -> bool:
    """Whether ``analytic`` matches d f / d x_i by central differences.

    Two step sizes are tried (an absolute one, and one relative to x_i for points near a pole);
    the check passes when either difference agrees to ``tol``, relative.
    """
    for h in (1e-6 * max(1.0, abs(x[i])), 1e-5 * abs(x[i])):
        if h == 0.0:
            continue
        xp, xm = list(x), list(x)
        xp[i] += h
        xm[i] -= h
        d = (f(xp) - f(xm)) / (xp[i] - xm[i])
        if abs(d - analytic) <= tol * max(1.0, abs(d), abs(analytic)):
            return True
    return False


def _find_cc() -> object | None:
    """The C compiler compiled programs would use, or None (tests that need one skip)."""
    from micrograd_c import compiler

    try:
        return compiler.find_compiler()
    except compiler.CompileError:
        return None


CC = _find_cc()
HAVE_CC = CC is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
# the backends a frozen program runs on here: the tape interpreter, and compiled C when there is
# a compiler
BACKENDS = ["tape", pytest.param("c", marks=needs_cc)]


@pytest.fixture
def mnist_dir() -> str:
    """The real MNIST test set from ../shared/data/mnist, or skip."""
    if not os.path.exists(os.path.join(MNIST_DIR, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("MNIST not present in ../shared/data/mnist")
    return MNIST_DIR


# Hypothesis profiles of the rerolling tests (test_reroll.py picks one with MG_REROLL_PROFILE):
# CI never fails at random (derandomized, bounded, no deadline); hunting draws fresh examples,
# many of them (vary them with --hypothesis-seed).
try:
    from hypothesis import Phase as _Phase
    from hypothesis import settings as _settings

    # no shrinking in CI: a failing example is reported as drawn (the same one every run), at once
    _settings.register_profile(
        "reroll-ci",
        derandomize=True,
        deadline=None,
        max_examples=40,
        database=None,
        print_blob=True,
        phases=[_Phase.explicit, _Phase.generate],
    )
    _settings.register_profile(
        "reroll-hunt", derandomize=False, deadline=None, max_examples=2000, print_blob=True
    )
except ImportError:  # hypothesis is a test dependency; without it those tests are not collected
    pass
