"""Frozen programs: eager, tape and compiled C agree; toolchain and cache failures are handled."""

from __future__ import annotations

import os
import pickle
import random
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import micrograd_c as mc
from micrograd_c import compiler
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

from conftest import BACKENDS, HAVE_CC, close, needs_cc


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROGRAD_C_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def mlp_program(backend, sizes=(3, [5, 4]), loss_kind="xent", seed=0, **kw):
    random.seed(seed)
    model = MLP(sizes[0], list(sizes[1]), activation=kw.pop("activation", "relu"))
    x = mc.inputs(sizes[0])
    y = mc.inputs(1)
    out = model(x)
    out = out if isinstance(out, list) else [out]
    loss = mc.cross_entropy(out, y[0]) if loss_kind == "xent" else mc.mse(out, y)
    prog = mc.compile(
        loss, inputs=x, targets=y, params=model.parameters(), outputs=out, backend=backend, **kw
    )
    return model, prog


def eager_loss_and_grads(model, xs, target, loss_kind="xent"):
    out = model([Value(v) for v in xs])
    out = out if isinstance(out, list) else [out]
    loss = mc.cross_entropy(out, target) if loss_kind == "xent" else mc.mse(out, [target])
    model.zero_grad()
    loss.backward()
    return loss.data, [o.data for o in out], [p.grad for p in model.parameters()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_program_matches_eager(backend):
    model, prog = mlp_program(backend)
    assert prog.backend == backend
    xs, t = [0.3, -1.2, 0.8], 2
    out = prog.forward(xs, [t])
    prog.backward()
    loss, eout, egrads = eager_loss_and_grads(model, xs, t)
    assert prog.loss == loss
    assert list(out) == eout
    assert all(close(a, b) for a, b in zip(prog.grad, egrads))
    assert np.array_equal(prog.parameters, [p.data for p in model.parameters()])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", [(13, [11, 3]), (21, [9, 10, 4])])
def test_packed_weights_follow_every_call(backend, sizes):
    """The nests read wide layers' weights from a packed copy laid out input by input (the
    parameters' transpose, copied 8 rows at a time: 14 or 22 rows are not a multiple of 8),
    while ``parameters`` and ``grad`` stay in the caller's order. Every call copies them across,
    so what is written through the view before a call is what it reads, ``grad`` is the eager
    gradient in the caller's order, and ``step`` moves each parameter by its own gradient."""
    model, prog = mlp_program(backend, sizes=sizes, seed=5, activation="tanh")
    assert prog.info["packed"] > 0
    r = np.random.default_rng(5)
    for _ in range(3):
        p = r.uniform(-0.5, 0.5, len(prog.parameters))
        prog.parameters[:] = p
        for v, pv in zip(model.parameters(), p):
            v.data = float(pv)
        xs, t = list(r.uniform(-1, 1, sizes[0])), int(r.integers(sizes[1][-1]))
        prog.forward(xs, [t])
        prog.backward()
        loss, _, egrads = eager_loss_and_grads(model, xs, t)
        assert close(prog.loss, loss)
        assert all(close(a, b) for a, b in zip(prog.grad, egrads))
        assert len({float(g) for g in egrads}) > len(egrads) // 2  # a transposed copy would show
        prog.step(0.5)
        assert np.allclose(prog.parameters, p - 0.5 * np.array(egrads), rtol=1e-12, atol=1e-15)
        assert not prog.grad.any()


OPS1 = ["relu", "tanh", "exp", "sigmoid", "square", "neg"]


def random_graph(seed, ops):
    """A graph over 3 inputs and 4 parameters that uses `ops` (every op when asked)."""
    rng = random.Random(seed)
    x, y = mc.inputs(3), mc.inputs(1)
    p = [Value(rng.uniform(-1, 1)) for _ in range(4)]
    nodes = x + p
    for op in ops:
        a, b = rng.choice(nodes), rng.choice(nodes)
        if op in OPS1:
            v = getattr(a * 0.5, op)()
        elif op == "log":
            v = (a * a + 1.0).log()
        elif op == "pow":
            v = (a * a + 0.5) ** rng.choice([2, -1, 0.5, 1.5])
        elif op == "powv":
            v = (a * a + 0.5) ** (b * 0.5)
        elif op == "div":
            v = a / (b * b + 1.0)
        elif op == "max":
            v = a.max(b)
        else:
            v = {"add": a + b, "sub": a - b, "mul": a * b}[op]
        nodes.append(v)
    tail = nodes[7:]
    logits = [mc.vsum(tail), mc.dot([tail[0], p[0]], [p[1], x[0]]), mc.affine(p[:3], x, p[3])]
    loss = (
        mc.cross_entropy(logits, 1)
        + mc.mse(logits[:1], y) * 0.1
        + mc.hinge(logits[1:2], [1.0])
        + tail[-1] * 0.01
    )
    return x, y, p, logits, loss


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_graph_matches_eager(backend):
    names = [
        n
        for n in mc.engine._core.OP_NAMES
        if n not in ("leaf", "sum", "dot", "mse", "hinge", "cross_entropy")
    ]
    x, y, p, logits, loss = random_graph(1, names * 2)
    prog = mc.compile(loss, inputs=x, targets=y, params=p, outputs=logits, backend=backend)
    xs, ys = [0.4, -0.7, 1.3], [0.25]
    out = prog.forward(xs, ys)
    prog.backward()
    eager = _eager_random_graph(1, names * 2, xs, ys)
    assert close(prog.loss, eager[0])
    assert all(close(a, b) for a, b in zip(out, eager[1]))
    assert all(close(a, b) for a, b in zip(prog.grad, eager[2]))


def _eager_random_graph(seed, ops, xs, ys):
    """random_graph with the inputs set before building: the eager reference."""
    orig = mc.inputs
    vals = iter([xs, ys])

    def with_data(n, value=0.0):
        v = next(vals)
        return [Value(a) for a in v]

    mc.inputs = with_data
    try:
        x, y, p, logits, loss = random_graph(seed, ops)
    finally:
        mc.inputs = orig
    loss.backward()
    return loss.data, [v.data for v in logits], [q.grad for q in p]


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10_000),
    ops=st.lists(
        st.sampled_from(
            [
                "add",
                "sub",
                "mul",
                "div",
                "relu",
                "tanh",
                "exp",
                "sigmoid",
                "square",
                "neg",
                "log",
                "pow",
                "powv",
                "max",
            ]
        ),
        min_size=3,
        max_size=15,
    ),
)
def test_random_graphs_tape_matches_eager(seed, ops):
    x, y, p, logits, loss = random_graph(seed, ops)
    prog = mc.compile(loss, inputs=x, targets=y, params=p, outputs=logits, backend="tape")
    xs, ys = [0.4, -0.7, 1.3], [0.25]
    out = prog.forward(xs, ys)
    prog.backward()
    eager = _eager_random_graph(seed, ops, xs, ys)
    scale = max([1.0] + [abs(g) for g in eager[2]])
    assert close(prog.loss, eager[0], 1e-12, max(1.0, abs(eager[0])))
    assert all(close(a, b, 1e-12, scale) for a, b in zip(out, eager[1]))
    assert all(close(a, b, 1e-12, scale) for a, b in zip(prog.grad, eager[2]))


def xor_data():
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float64)
    Y = np.array([0, 1, 1, 0], dtype=np.float64)
    return X, Y


@pytest.mark.parametrize("batch_size", [1, 3])
def test_one_epoch_gives_the_same_parameters_on_every_backend(batch_size):
    X, Y = xor_data()
    results = {}
    for backend in ["tape"] + (["c"] if HAVE_CC else []):
        model, prog = mlp_program(
            backend, sizes=(2, [4, 1]), loss_kind="mse", seed=3, activation="tanh"
        )
        prog.fit(X, Y, epochs=1, lr=0.5, batch_size=batch_size, shuffle=True, seed=11)
        results[backend] = prog.parameters.copy()
    # eager, in the same shuffled order, batches averaged
    model, prog = mlp_program("tape", sizes=(2, [4, 1]), loss_kind="mse", seed=3, activation="tanh")
    order = _shuffled_order(prog, X, Y, batch_size)
    params = model.parameters()
    for b in range(0, 4, batch_size):
        for s in order[b : b + batch_size]:
            out = model([Value(v) for v in X[s]])
            mc.mse([out], [Y[s]]).backward()
        n = len(order[b : b + batch_size])
        for q in params:
            q.data -= 0.5 / n * q.grad
            q.grad = 0.0
    eager = np.array([q.data for q in params])
    for backend, got in results.items():
        assert np.allclose(got, eager, rtol=1e-12, atol=1e-15), backend
    if "c" in results:
        assert np.array_equal(results["c"], results["tape"])  # same kernels, same order: bitwise


def test_a_batch_too_large_for_the_cache_is_still_the_mean_of_its_samples():
    """~48k per-sample values: more than the cache budget of the samples a chunk keeps in flight
    (drive.h's MG_FIT_SUB_BYTES), so a batch's samples go through the nests one or two at a time.
    The parameters still equal the definition (the mean of per-sample gradients, in sample order)
    to 1e-12, bitwise for 1, 2 and 3 threads, and bitwise between the tape and compiled code."""
    random.seed(5)
    r = np.random.default_rng(5)
    x, y = mc.inputs(4), mc.inputs(1)
    w = [Value(random.uniform(-0.5, 0.5)) for _ in range(12000)]
    v = [Value(random.uniform(-0.01, 0.01)) for _ in range(12000)]
    b = Value(0.1)
    h = [(x[k % 4] * w[k] + b).tanh() for k in range(12000)]
    out = sum((hk * vk for hk, vk in zip(h, v)), Value(0.0))
    loss = (out - y[0]) ** 2
    params = w + v + [b]
    X, Y = r.uniform(-1, 1, size=(8, 4)), r.uniform(-1, 1, size=(8, 1))
    progs = {
        be: mc.compile(loss, inputs=x, targets=y, params=params, backend=be)
        for be in ["tape"] + (["c"] if HAVE_CC else [])
    }
    ref = progs["tape"]
    p0 = ref.parameters.copy()
    got = {}
    for be, prog in progs.items():
        for threads in (1, 2, 3):
            prog.parameters[:] = p0
            prog.fit(X, Y, epochs=1, lr=0.05, batch_size=8, shuffle=False, threads=threads)
            got[be, threads] = prog.parameters.copy()
    # the definition: per-sample gradients accumulated in sample order, one step of their mean
    ref.parameters[:] = p0
    for s in range(8):
        ref.forward(X[s], Y[s])
        ref.backward()
    ref.step(0.05, 8)
    want = ref.parameters.copy()
    assert not np.array_equal(want, p0)
    for key, params_after in got.items():
        assert np.allclose(params_after, want, rtol=1e-12, atol=1e-15), key
        assert np.array_equal(params_after, got["tape", 1]), key


@pytest.mark.parametrize("batch_size", [5, 10, 12, 20, 24, 32])
def test_batches_that_end_in_part_of_a_register_tile(batch_size):
    """A matrix product runs the samples of a batch in register tiles (MGK_TSS, 8 rows with
    AVX-512 or AVX2, 4 with SSE2). The samples a chunk has past its last full tile run as one
    more tile over the per-sample arrays' padding when they fill at least half of it, else one
    by one. Chunks of 3, 5, 6, 10, 12 and 16 samples take every one of those paths: the
    parameters equal the definition (per-sample gradients in sample order, one step of their
    mean per batch) to 1e-12, bitwise for 1 and 2 threads and between the tape and compiled
    code, so nothing computed in the padding reaches them."""
    r = np.random.default_rng(batch_size)
    X, Y = r.uniform(-1, 1, size=(2 * batch_size, 6)), r.integers(0, 3, size=2 * batch_size)
    Y = Y.astype(np.float64)
    got = {}
    for backend in ["tape"] + (["c"] if HAVE_CC else []):
        _, prog = mlp_program(backend, sizes=(6, [16, 16, 3]), seed=4)
        p0 = prog.parameters.copy()
        for threads in (1, 2):
            prog.parameters[:] = p0
            prog.fit(X, Y, epochs=1, lr=0.1, batch_size=batch_size, shuffle=False, threads=threads)
            got[backend, threads] = prog.parameters.copy()
    _, ref = mlp_program("tape", sizes=(6, [16, 16, 3]), seed=4)
    for b in range(0, 2 * batch_size, batch_size):
        for s in range(b, b + batch_size):
            ref.forward(X[s], Y[s : s + 1])
            ref.backward()
        ref.step(0.1, batch_size)
    want = ref.parameters.copy()
    for key, params_after in got.items():
        assert np.allclose(params_after, want, rtol=1e-12, atol=1e-15), key
        assert np.array_equal(params_after, got["tape", 1]), key


@pytest.mark.parametrize("batch_size", [2, 5, 32])
def test_batched_fits_add_each_sum_in_the_scalar_programs_order(batch_size):
    """A batched fit computes every forward value as forward() does, bit for bit: the sums run in
    the order the scalar program adds its terms, whatever the batch size and thread count (no
    sum is split between threads or added in another grouping). A relu right at its kink shows
    it: its sum is a + ... - a + 1e-17 a in the program's order (1e-17 a, so the relu passes its
    gradient and neuron 0's weights train), but 0 in any grouping that adds the last two terms
    before the first (the relu is then off and those weights stay). The parameters equal the
    definition to 1e-12, bitwise across 1 and 2 threads and between the tape and compiled code."""
    r = np.random.default_rng(11)
    n = 64
    X = np.zeros((n, 40))
    a = r.uniform(0.5, 2.0, size=n)
    X[:, 0], X[:, 24], X[:, 25] = a, -a, 1e-17 * a
    X[:, 30:] = r.uniform(-1, 1, size=(n, 10))  # other neurons see these; neuron 0's weights are 0
    Y = r.integers(0, 3, size=(n, 1)).astype(np.float64)

    def program(backend):
        _, prog = mlp_program(backend, sizes=(40, [16, 3]), seed=2)
        prog.parameters[:41] = 0.0  # neuron 0: weights, then its bias
        prog.parameters[[0, 24, 25]] = 1.0
        return prog

    ref = program("tape")
    p0 = ref.parameters.copy()
    for b in range(0, n, batch_size):
        for s in range(b, min(b + batch_size, n)):
            ref.forward(X[s], Y[s])
            ref.backward()
        ref.step(0.1, min(batch_size, n - b))
    want = ref.parameters.copy()
    assert not np.array_equal(want[:41], p0[:41])  # the relu passed gradients in the definition
    got = {}
    for backend in ["tape"] + (["c"] if HAVE_CC else []):
        prog = program(backend)
        for threads in (1, 2):
            prog.parameters[:] = p0
            prog.fit(X, Y, epochs=1, lr=0.1, batch_size=batch_size, shuffle=False, threads=threads)
            got[backend, threads] = prog.parameters.copy()
    for key, params_after in got.items():
        assert np.allclose(params_after, want, rtol=1e-12, atol=1e-15), key
        assert np.array_equal(params_after, got["tape", 1]), key


@needs_cc
@pytest.mark.parametrize("nparts", [1, 2, 3, 4])
def test_generated_code_built_in_any_number_of_parts(nparts, monkeypatch):
    """Training code compiles as MG_NPARTS files in parallel, one per core (at most four). The
    emitter assigns each nest function to one part for 2, 3 and 4 parts, heaviest first to the
    least loaded part: every function is defined exactly once whatever the machine's core count,
    and the library trains bitwise like the tape interpreter."""
    import re

    from micrograd_c.compiler import codecache

    _, tape = mlp_program("tape", sizes=(6, [16, 16, 3]), seed=2)
    src = tape.c_source()
    has = re.findall(r"#if MG_HAS\((\d+), (\d+), (\d+), (\d+)\)\nMG_KFN void mg_k", src)
    assert len(has) >= 8
    for P, col in ((2, 1), (3, 2), (4, 3)):
        parts = [int(h[col]) for h in has]
        assert set(parts) == set(range(P)), (P, parts)  # each part holds some, none is out of range
    assert [int(h[0]) for h in has] == list(range(len(has)))
    monkeypatch.setattr(codecache, "_parts", lambda source, tc: nparts)
    _, prog = mlp_program("c", sizes=(6, [16, 16, 3]), seed=2)
    r = np.random.default_rng(0)
    X, Y = r.uniform(-1, 1, size=(20, 6)), r.integers(0, 3, size=20).astype(np.float64)
    for p in (tape, prog):
        p.fit(X, Y, epochs=1, lr=0.1, batch_size=1)
        p.fit(X, Y, epochs=1, lr=0.1, batch_size=8)
    assert np.array_equal(prog.parameters, tape.parameters)


def run_benchmark(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """benchmarks/`name` run in a child Python with `args`, its output captured as text."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", name)
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=timeout
    )


@needs_cc
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_threads_benchmark_compares_two_threads_with_two_processes(tmp_path):
    """benchmarks/threads.py runs one thread, two threads and two one-thread processes at once
    round by round, and prints each row's images/s and its ratio to one thread (1.00x for one
    thread itself); the processes' fits run from the same parameters as this process's."""
    import re

    r = run_benchmark(
        "threads.py", "--samples", "256", "--repeat", "2", "--data-dir", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "CPU: " in r.stdout and "256 images (random images)" in r.stdout, r.stdout
    rows = dict(
        re.findall(r"^(1 thread|2 threads|2 processes)\s+[\d,]+\s+(\d+\.\d\d)x", r.stdout, re.M)
    )
    assert set(rows) == {"1 thread", "2 threads", "2 processes"}, r.stdout
    assert rows["1 thread"] == "1.00"


@needs_cc
def test_layouts_benchmark_prints_a_row_per_family():
    """benchmarks/layouts.py compiles each family it is given both ways and prints its nests, its
    compile time and four figures; the permuted-pixel MLP is the MLP's 3 + 6 nests (no table),
    the bidirectional and the stacked RNN roll into a few; an unknown family is a usage error."""
    import re

    r = run_benchmark(
        "layouts.py", "--families", "perm_mlp,birnn,stacked", "--samples", "8", "--repeat", "1"
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "CPU: " in r.stdout, r.stdout
    rows = dict(
        re.findall(r"^\| (\w+) \| (\d+\+\d+) \| [\d.]+ s(?: \| [\d,]+){4} \|$", r.stdout, re.M)
    )
    assert rows.keys() == {"perm_mlp", "birnn", "stacked"}, r.stdout
    assert rows["perm_mlp"] == "3+6", r.stdout
    assert sum(map(int, rows["birnn"].split("+"))) <= 40, r.stdout
    assert sum(map(int, rows["stacked"].split("+"))) <= 70, r.stdout
    bad = run_benchmark("layouts.py", "--families", "nope", timeout=60)
    assert bad.returncode == 2 and "unknown families ['nope']" in bad.stderr, bad.stderr


@needs_cc
def test_formulations_benchmark_finds_no_table_and_no_single_point_nest():
    """benchmarks/formulations.py compiles each group's formulations and prints a row each: the
    pools written as balanced or right-leaning trees, summed pairwise or with vsum, and a
    convolution's outputs as vsums of products read no index table and run no one-point nest
    (each was a cliff: a nest per window, or products stored per sample), and the first epoch's
    loss of a formulation of the same model agrees with the canonical one's (the max pools; the
    vsum, whose sum starts from 0 and adds the bias last: to rounding); an unknown group is a
    usage error."""
    import re

    r = run_benchmark(
        "formulations.py", "--groups", "maxpool,avgpool,conv", "--samples", "6", "--repeat", "1"
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "CPU: " in r.stdout, r.stdout
    rows = re.findall(
        r"^\| ([^|]+) \| [\d.]+ s \| \d+ KB \| (\d+) \| (\d+) \|(?: [\d,]+ \|){2}"
        r"(?: [\d.]+x \|){2} ([\d.]+) \|$",
        r.stdout,
        re.M,
    )
    assert len(rows) == 8, r.stdout
    assert all(tables == "0" and points == "0" for _, tables, points, _ in rows), r.stdout
    loss = {label: float(v) for label, _, _, v in rows}
    same = [
        ("a.max(b).max(c.max(d))", "a.max(b).max(c).max(d)"),
        ("a.max(b.max(c.max(d)))", "a.max(b).max(c).max(d)"),
        ("mc.vsum([w * x ...]) + b", "sum(gen, b)"),
    ]
    for a, b in same:  # the same model (its sums in another order: to rounding)
        assert abs(loss[a] - loss[b]) <= 1e-9 * abs(loss[b]), r.stdout
    bad = run_benchmark("formulations.py", "--groups", "nope", timeout=60)
    assert bad.returncode == 2 and "unknown group(s) nope" in bad.stderr, bad.stderr


@needs_cc
def test_compile_costs_fits_every_nest_function_and_reports_the_split():
    """benchmarks/compile_costs.py, which kernel_cost's weights come from, runs on the MLP: a
    line per nest function (all of them, each in one of the two parts) and the parts' loads."""
    import re

    r = run_benchmark("compile_costs.py", "--families", "mlp", "--rounds", "1")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "mlp: 9 nest functions" in r.stdout, r.stdout
    rows = re.findall(
        r"^\s+(\d+)\s+[0-3]\s+[01]\s+[01]\s+\S*\s+[\d, ]+\s+([01])\s+-?\d", r.stdout, re.M
    )
    assert sorted(int(k) for k, _ in rows) == list(range(9)), r.stdout
    assert {p for _, p in rows} == {"0", "1"}, r.stdout
    assert "parts as emitted" in r.stdout


@needs_cc
def test_constant_powers_round_as_the_c_library_does():
    """`x ** 2`, `x ** 3` and `x ** -1` (micrograd's division): with the exponent a constant of
    the nest, gcc computes pow(x, 2.0) as x * x and pow(x, -1.0) as 1.0 / x, which differ in the
    last bit from the C library's pow (what the tape interpreter and eager call) for about one x
    in a thousand. Generated code calls the library's: values and gradients are the same bits."""
    import math

    r = random.Random(7)
    draws = [r.uniform(0.1, 10.0) for _ in range(100_000)]
    # values where the C library and the folded forms differ (glibc: about 1 in 1000); a library
    # that rounds them alike leaves plain draws, and the test still compares the two backends
    vals = [v for v in draws if math.pow(v, -1.0) != 1.0 / v or math.pow(v, 2.0) != v * v][:12]
    vals += draws[: 12 - len(vals)]
    p = [Value(v) for v in vals]
    outs = [q**-1 for q in p] + [q**2 for q in p] + [q**3 for q in p]
    loss = sum(outs[1:], outs[0])
    got = {}
    for backend in ("tape", "c"):
        prog = mc.compile(loss, inputs=[], params=p, outputs=outs, backend=backend)
        y = prog.forward(np.zeros(0))
        prog.backward()
        got[backend] = (np.array(y).copy(), prog.loss, np.array(prog.grad).copy())
    assert np.array_equal(got["c"][0], got["tape"][0])
    assert got["c"][1] == got["tape"][1]
    assert np.array_equal(got["c"][2], got["tape"][2])
    assert np.array_equal(got["tape"][0], [math.pow(v, k) for k in (-1.0, 2.0, 3.0) for v in vals])


def _shuffled_order(prog, X, Y, batch_size):
    """The visiting order of epoch 0, seed 11: the documented Fisher-Yates over the kernels'
    generator (xoshiro256** seeded by splitmix64), reimplemented here independently."""
    return _fisher_yates(len(X), 11, 0)


def _fisher_yates(n, seed, epoch):
    mask = (1 << 64) - 1

    def splitmix(state):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return state, z ^ (z >> 31)

    st_ = (seed ^ ((0xD1B54A32D192ED03 * (epoch + 1)) & mask)) & mask
    s = []
    for _ in range(4):
        st_, v = splitmix(st_)
        s.append(v)

    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & mask

    def nxt():
        result = (rotl((s[1] * 5) & mask, 7) * 9) & mask
        t = (s[1] << 17) & mask
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(m):
        limit = ((1 << 64) - m) % m
        while True:
            x = nxt()
            if x >= limit:
                return x % m

    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def test_wrong_shapes_and_dtypes():
    model, prog = mlp_program("tape")
    with pytest.raises(ValueError, match=r"expected shape \(n, 3\)"):
        prog.predict(np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"expected shape \(n, 3\)"):
        prog.fit(np.zeros((4, 5)), np.zeros(4))
    with pytest.raises(ValueError, match="rows"):
        prog.fit(np.zeros((4, 3)), np.zeros(5))
    with pytest.raises(ValueError, match="pass Y"):
        prog.fit(np.zeros((4, 3)), None)
    with pytest.raises(TypeError):
        prog.predict([["a", "b", "c"]])
    # other dtypes and layouts are converted
    X = np.asfortranarray(np.random.RandomState(0).rand(5, 3).astype(np.float32))
    out32 = prog.predict(X)
    out64 = prog.predict(np.ascontiguousarray(X, dtype=np.float64))
    assert out32.shape == (5, 4) and np.array_equal(out32, out64)
    assert prog.predict(np.zeros((0, 3))).shape == (0, 4)


def test_parameters_view_and_write_back():
    model, prog = mlp_program("tape")
    view = prog.parameters
    view[0] = 42.0
    assert prog.parameters[0] == 42.0
    assert prog.write_back() == len(model.parameters())
    assert model.parameters()[0].data == 42.0


def test_no_compiler_available(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent")
    with pytest.raises(mc.CompileError, match="/nonexistent"):
        mlp_program("c")
    with pytest.warns(RuntimeWarning, match="falling back"):
        model, prog = mlp_program("auto")
    assert prog.backend == "tape"


def failing_compiler(tmp_path, body):
    path = tmp_path / "badcc"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@needs_cc
def test_compiler_that_fails_reports_command_and_output(tmp_path):
    real = compiler.find_compiler().path
    # works for the probe, fails on programs: it rejects any file containing mgc_program
    cc = failing_compiler(
        tmp_path,
        f"""
        for a in "$@"; do case "$a" in *.c) if grep -q mgc_program "$a"; then
            echo "badcc: internal error on $a" >&2; exit 3; fi;; esac; done
        exec {real} "$@"
    """,
    )
    with pytest.raises(mc.CompileError) as e:
        mlp_program("c", cc=cc)
    assert "exit status 3" in str(e.value) and "internal error" in e.value.output
    assert e.value.command[0] == cc


@needs_cc
def test_compiler_timeout(tmp_path):
    real = compiler.find_compiler().path
    cc = failing_compiler(
        tmp_path,
        f"""
        for a in "$@"; do case "$a" in *.c) if grep -q mgc_program "$a"; then
            sleep 30; fi;; esac; done
        exec {real} "$@"
    """,
    )
    with pytest.raises(mc.CompileError, match="timed out"):
        mlp_program("c", cc=cc, timeout=1.0)


@needs_cc
def test_cache_hit_and_corrupt_entry(private_cache):
    # plant a corrupt entry (a truncated write) where this program's library will be cached;
    # loaded libraries are never modified in place (builds rename a new file into place)
    model, tape_prog = mlp_program("tape")
    tc = compiler.find_compiler()
    key = compiler.codecache._cache_key(tape_prog.c_source(), tc, compiler.default_flags(tc))
    os.makedirs(private_cache, exist_ok=True)
    (private_cache / f"mg_{key}.so").write_bytes(b"\x7fELF truncated")
    model, p1 = mlp_program("c")
    assert p1.info["cached"] is False  # the corrupt entry was rebuilt
    out = p1.forward([0.1, 0.2, 0.3], [1])
    assert np.array_equal(out, [o.data for o in model([0.1, 0.2, 0.3])])
    _, p2 = mlp_program("c")
    assert p2.info["cached"] is True and p2.info["library"] == p1.info["library"]


@needs_cc
def test_two_processes_compile_the_same_model_concurrently(private_cache, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent("""
        import random, sys
        import micrograd_c as mc
        from micrograd_c.nn import MLP
        random.seed(0)
        m = MLP(6, [7, 3])
        x, y = mc.inputs(6), mc.inputs(1)
        out = m(x)
        prog = mc.compile(mc.cross_entropy(out, y[0]), inputs=x, targets=y, params=m.parameters(),
                          outputs=out, backend="c")
        print(prog.info["cached"], prog.forward([0.1] * 6, [1])[0])
    """)
    )
    env = dict(os.environ, MICROGRAD_C_CACHE_DIR=str(private_cache))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [o[0].split() for o in outs]
    assert sorted(r[0] for r in results) == ["False", "True"]  # one built, the other hit the cache
    assert results[0][1] == results[1][1]
    assert len([f for f in os.listdir(private_cache) if f.endswith(".so")]) == 1


@needs_cc
@pytest.mark.parametrize("sizes", [(3, [5, 4]), (3, [17, 16, 4])])
def test_inference_only_source_compiles_and_matches(tmp_path, sizes):
    """Also with layers wide enough that their weights are packed (read from the packed copy,
    which the source must then carry: it was a NULL pointer)."""
    model, prog = mlp_program("tape", sizes=sizes)
    assert (prog.info["packed"] > 0) == (sizes[1][0] > 8)
    src = prog.c_source(prefix="digits_", inference_only=True)
    assert "#include <math.h>" in src and "digits_infer" in src
    main = tmp_path / "main.c"
    main.write_text(
        src
        + textwrap.dedent("""
        #include <stdio.h>
        int main(void) {
            double x[3] = {0.5, -0.25, 1.0}, y[4];
            digits_infer(x, y, NULL);
            for (int i = 0; i < 4; i++) printf("%.17g\\n", y[i]);
            return 0;
        }
    """)
    )
    exe = tmp_path / "main"
    tc = compiler.find_compiler()
    subprocess.run(
        tc.command
        + ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-o", str(exe), str(main), "-lm"],
        check=True,
    )
    got = [
        float(v)
        for v in subprocess.run(
            [str(exe)], capture_output=True, text=True, check=True
        ).stdout.split()
    ]
    assert got == list(prog.predict(np.array([[0.5, -0.25, 1.0]]))[0])


@needs_cc
def test_generated_training_source_is_warning_free(tmp_path):
    model, prog = mlp_program("tape")
    src = tmp_path / "prog.c"
    src.write_text(prog.c_source())
    tc = compiler.find_compiler()
    r = subprocess.run(
        tc.command
        + [
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-c",
            "-o",
            str(tmp_path / "prog.o"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_gil_is_released_during_fit():
    import threading
    import time

    _, prog = mlp_program("tape", sizes=(20, [64, 10]))
    X = np.random.RandomState(0).rand(3000, 20)
    Y = np.random.RandomState(1).randint(0, 10, 3000).astype(float)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    t0 = time.perf_counter()
    prog.fit(X, Y, epochs=2, lr=0.01)
    t1 = time.perf_counter()
    stop.set()
    th.join()
    during = [t for t in ticks if t0 < t < t1]
    assert len(during) >= 3  # the other thread ran while C trained


# ---- raising: loops recovered from scalar graphs ------------------------------------------------


def opbyop_mlp(model, x):
    """micrograd's Neuron.__call__, op by op, over the model's own parameters."""
    for layer in model.layers:
        out = []
        for n in layer.neurons:
            act = sum((wi * xi for wi, xi in zip(n.w, x)), n.b)
            out.append(act.relu() if n.nonlin else act)
        x = out
    return x


def mnist_shaped(op_by_op, backend="tape", raise_loops=True, sizes=(784, [50, 10])):
    random.seed(0)
    model = MLP(sizes[0], list(sizes[1]))
    x, y = mc.inputs(sizes[0]), mc.inputs(1)
    logits = opbyop_mlp(model, x) if op_by_op else model(x)
    loss = mc.cross_entropy(logits, y[0])
    prog = mc.compile(
        loss,
        inputs=x,
        targets=y,
        params=model.parameters(),
        outputs=logits,
        backend=backend,
        raise_loops=raise_loops,
    )
    return model, prog


def test_op_by_op_mlp_rerolls_to_the_same_program_as_the_c_mlp():
    _, c_mlp = mnist_shaped(False)
    _, py_mlp = mnist_shaped(True)
    for p in (c_mlp, py_mlp):
        assert p.info["rerolled"] and p.info["forward_nests"] == 3  # layer, relu, layer
        assert p.tape.ninstr == 4  # and the cross-entropy
    assert py_mlp.info["nodes"] > 2 * c_mlp.info["nodes"]  # 120k scalar values vs 40k (DOT nodes)
    src = c_mlp.c_source()
    assert src == py_mlp.c_source()  # byte for byte: the same loops
    assert len(src.encode()) < 100_000
    _, scalar = mnist_shaped(True, raise_loops=False)
    assert (
        not scalar.info["rerolled"] and scalar.tape.ninstr > 79_000
    )  # 39,200 products + 39,200 sums + ...


@pytest.mark.parametrize("backend", BACKENDS)
def test_raised_and_scalar_programs_agree(backend):
    _, raised = mnist_shaped(True, backend, sizes=(30, [12, 7, 5]))
    _, scalar = mnist_shaped(True, "tape", raise_loops=False, sizes=(30, [12, 7, 5]))
    assert raised.info["forward_nests"] == 5 and raised.info["loops"] == 0  # 3 layers, 2 relus
    rng = np.random.RandomState(0)
    for _ in range(3):
        xs, t = rng.rand(30), rng.randint(5)
        a, b = raised.forward(xs, [t]), scalar.forward(xs, [t])
        assert np.array_equal(a, b) and raised.loss == scalar.loss  # forward: bit for bit
        raised.backward()
        scalar.backward()
    # parameter gradients accumulated over three samples: sums over shared operands reordered
    assert np.allclose(raised.grad, scalar.grad, rtol=1e-12, atol=1e-15 * np.abs(scalar.grad).max())
    X, Y = rng.rand(40, 30), rng.randint(0, 5, 40).astype(float)
    for bs in (1, 4):
        raised.step(0.0)
        scalar.step(0.0)
        p0 = scalar.parameters.copy()
        raised.parameters[:] = p0
        l1 = raised.fit(X, Y, epochs=2, lr=0.1, batch_size=bs, seed=3)
        l2 = scalar.fit(X, Y, epochs=2, lr=0.1, batch_size=bs, seed=3)
        assert np.allclose(raised.parameters, scalar.parameters, rtol=1e-12, atol=1e-15), bs
        assert np.allclose(l1, l2, rtol=1e-12)
        scalar.parameters[:] = p0


def test_rerolling_what_is_not_a_plain_layer_stays_correct():
    """Weights used twice (an L2 term), tanh, a width-1 layer, inputs in another order."""
    random.seed(5)
    model = MLP(6, [4, 1], activation="tanh")
    x, y = mc.inputs(6), mc.inputs(1)
    out = model(list(reversed(x)))  # inputs not in slot order: no matrix-vector product
    params = model.parameters()
    loss = mc.mse([out], y) + 1e-3 * mc.vsum([p * p for p in params])
    progs = [
        mc.compile(
            loss, inputs=x, targets=y, params=params, outputs=[out], backend="tape", raise_loops=r
        )
        for r in (True, False)
    ]
    X, Y = np.random.RandomState(1).rand(10, 6), np.random.RandomState(2).rand(10)
    for p in progs:
        p.fit(X, Y, epochs=2, lr=0.2, batch_size=2, seed=1)
    assert np.allclose(progs[0].parameters, progs[1].parameters, rtol=1e-12, atol=1e-15)
    x2 = mc.inputs(6)
    out2 = model(x2)
    loss2 = mc.mse([out2], y) + 1e-3 * mc.vsum([p * p for p in params])  # weights used twice
    progs2 = [
        mc.compile(
            loss2,
            inputs=x2,
            targets=y,
            params=params,
            outputs=[out2],
            backend="tape",
            raise_loops=r,
        )
        for r in (True, False)
    ]
    assert progs2[0].info["packed"] == 0  # the L2 term reads each weight again: nothing packed
    for p in progs2:
        p.parameters[:] = progs[1].parameters
        p.fit(X, Y, epochs=1, lr=0.2, batch_size=1, seed=2)
    assert np.allclose(progs2[0].parameters, progs2[1].parameters, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_do_not_change_the_result(backend):
    _, prog = mnist_shaped(False, backend, sizes=(40, [16, 4]))
    rng = np.random.RandomState(0)
    X, Y = rng.rand(200, 40), rng.randint(0, 4, 200).astype(float)
    p0 = prog.parameters.copy()
    out = {}
    for threads in (1, 2, 3):
        for bs in (1, 7, 32):
            prog.parameters[:] = p0
            losses = prog.fit(X, Y, epochs=2, lr=0.05, batch_size=bs, seed=9, threads=threads)
            out[(threads, bs)] = (prog.parameters.copy(), losses)
    for bs in (1, 7, 32):
        assert (
            np.array_equal(out[(1, bs)][0], out[(2, bs)][0]) and out[(1, bs)][1] == out[(2, bs)][1]
        )
        assert np.array_equal(out[(1, bs)][0], out[(3, bs)][0])
    with pytest.raises(ValueError, match="threads"):
        prog.fit(X, Y, threads=0)


@needs_cc
@pytest.mark.parametrize("float32", [False, True])
def test_samples_in_vector_lanes_add_in_the_order_of_one_sample(float32):
    """A per-sample sum through a transposed weight (the input gradient of a dense layer,
    x1 = W[i][r]) runs a batch's samples in the lanes of a vector (nest_kernels.h's mgk_lanes),
    each lane adding its sample's terms in the order of the one-sample path: in order, or in a
    split sum's lanes and then their tree. So the same program built without it (-DMGK_NO_LANES,
    with the same target flags) trains to bitwise the same parameters and losses: rows of 5 terms
    (in order), 10 (float64: a split sum of 8 lanes; float32: in order), 20 (both split) and 40
    (more than the lanes take), at batch sizes whose chunks are whole vectors of samples, vectors
    and a rest, and (AVX-512: 8 doubles, 16 floats) less than one."""
    rng = np.random.RandomState(6)
    X, Y = rng.uniform(-1, 1, size=(90, 5)), rng.randint(0, 3, 90).astype(float)
    no_lanes = [*compiler.default_flags(compiler.find_compiler()), "-DMGK_NO_LANES"]
    for nout in (5, 10, 20, 40):
        random.seed(nout)
        model = MLP(5, [12, nout])
        x, y = mc.inputs(5), mc.inputs(1)
        out = model(x)
        loss = mc.cross_entropy(out, y[0])
        kw = dict(inputs=x, targets=y, params=model.parameters(), outputs=out, backend="c")
        progs = [
            mc.compile(loss, float32=float32, **kw),
            mc.compile(loss, float32=float32, flags=no_lanes, **kw),
        ]
        listing = progs[0].describe()
        assert f"(12 | {nout}) sum out[sample_grad" in listing, listing
        p0 = progs[0].parameters.copy()
        for batch in (32, 40, 7):
            got = []
            for prog in progs:
                prog.parameters[:] = p0
                losses = prog.fit(X, Y, epochs=2, lr=0.1, batch_size=batch, shuffle=False)
                got.append((prog.parameters.copy(), losses))
            what = f"{nout} classes, batch {batch}, float32 {float32}"
            assert not np.array_equal(got[0][0], p0), what
            assert np.array_equal(got[0][0], got[1][0]) and got[0][1] == got[1][1], what


@pytest.mark.parametrize("kind", ["tape", "c", "float32"])
def test_fit_reports_the_losses_that_forward_computes(kind):
    """A fit takes a cross-entropy loss's value from its backward, which computes the exps once
    for both (drive.h's xent_last). With lr=0 an epoch's loss is then the mean of what forward
    gives row by row: bitwise at batch 1 (the same sums in the same order), to 1e-15 in batches
    (chunk sums), on 1 and 2 threads, and the parameters stay. A computed target outside the
    classes (twice the label) gives a NaN loss there, as forward does, and a loss that is not
    the cross-entropy itself (it times 1.5, plus 0.25) is computed in the forward as before."""
    if kind != "tape" and not HAVE_CC:
        pytest.skip("no C compiler")
    rng = np.random.RandomState(4)
    X, Y = rng.uniform(-1, 1, size=(40, 6)), rng.randint(0, 4, 40).astype(float)
    for shape in ("xent", "scaled", "doubled"):
        random.seed(2)
        model = MLP(6, [7, 4])
        x, y = mc.inputs(6), mc.inputs(1)
        out = model(x)
        target = y[0] * 2 if shape == "doubled" else y[0]
        loss = mc.cross_entropy(out, target)
        if shape == "scaled":
            loss = loss * 1.5 + 0.25
        prog = mc.compile(
            loss,
            inputs=x,
            targets=y,
            params=model.parameters(),
            outputs=out,
            backend="tape" if kind == "tape" else "c",
            float32=kind == "float32",
        )
        each = []
        for xs, t in zip(X, Y):
            prog.forward(xs, [t])
            each.append(prog.loss)
        p0 = prog.parameters.copy()
        total = 0.0
        for v in each:
            total += v
        want = total / len(each)
        if shape == "doubled":
            assert any(np.isnan(each)) and not all(np.isnan(each))
        for threads in (1, 2):
            for bs in (1, 8, 40):
                prog.parameters[:] = p0
                got = prog.fit(
                    X, Y, epochs=1, lr=0.0, batch_size=bs, shuffle=False, threads=threads
                )
                what = f"{shape} batch {bs} threads {threads}"
                if shape == "doubled":  # NaN gradients: 0 * NaN steps the parameters to NaN
                    assert np.isnan(got[0]), what
                elif bs == 1:
                    assert got[0] == want, (what, got[0], want)
                else:
                    assert abs(got[0] - want) <= 1e-15 * abs(want), (what, got[0], want)
                if shape != "doubled":
                    assert np.array_equal(prog.parameters, p0), what


@pytest.mark.parametrize("kind", ["tape", "c", "float32"])
def test_float32_inputs_train_as_their_float64_values(kind):
    """fit reads a C-contiguous float32 X as it is (libmg's mg_fit_options.X32): the parameters
    and losses are bitwise those of the same values in float64, at batch 1 and in chunks, on 1
    and 2 threads; a float32 X in another layout or at an odd address is copied, with the same
    result."""
    if kind != "tape" and not HAVE_CC:
        pytest.skip("no C compiler")
    kw = {"backend": "c", "float32": True} if kind == "float32" else {"backend": kind}
    _, prog = mlp_program(sizes=(40, [16, 4]), **kw)
    rng = np.random.RandomState(3)
    X32 = (rng.rand(90, 40) * 4 - 2).astype(np.float32)
    X64 = X32.astype(np.float64)
    # at an odd address (C reads float rows: copied), and unpickled (a dtype equal to float32's)
    odd32 = np.frombuffer(bytearray(X32.nbytes + 1), np.float32, X32.size, 1).reshape(X32.shape)
    odd32[...] = X32
    assert not odd32.flags.aligned
    Y = rng.randint(0, 4, 90).astype(float)
    p0 = prog.parameters.copy()
    for bs in (1, 7, 32):
        for threads in (1, 2):
            got = []
            for X in (X64, X32, np.asfortranarray(X32), odd32, pickle.loads(pickle.dumps(X32))):
                prog.parameters[:] = p0
                losses = prog.fit(X, Y, epochs=2, lr=0.05, batch_size=bs, seed=5, threads=threads)
                got.append((prog.parameters.copy(), losses))
            assert not np.array_equal(got[0][0], p0)
            for params, losses in got[1:]:
                assert np.array_equal(params, got[0][0]), (bs, threads)
                assert losses == got[0][1], (bs, threads)


@pytest.mark.parametrize("kind", ["tape", "c", "float32"])
def test_float32_rows_predict_as_their_float64_values(kind):
    """predict widens float32 rows a block of 4,096 at a time: every row's outputs are bitwise
    those of the same values in float64, across block boundaries, in any layout and at odd
    addresses; no rows gives no outputs."""
    if kind != "tape" and not HAVE_CC:
        pytest.skip("no C compiler")
    kw = {"backend": "c", "float32": True} if kind == "float32" else {"backend": kind}
    _, prog = mlp_program(sizes=(5, [6, 3]), **kw)
    rng = np.random.RandomState(4)
    X32 = (rng.rand(4096 * 2 + 3, 5) * 4 - 2).astype(np.float32)
    want = prog.predict(X32.astype(np.float64))
    odd32 = np.frombuffer(bytearray(X32.nbytes + 1), np.float32, X32.size, 1).reshape(X32.shape)
    odd32[...] = X32
    for X in (X32, np.asfortranarray(X32), odd32, pickle.loads(pickle.dumps(X32))):
        got = prog.predict(X)
        assert got.shape == want.shape and got.dtype == np.float64
        assert np.array_equal(got, want)
    assert np.array_equal(prog.predict(X32[4090:4100]), want[4090:4100])
    assert prog.predict(X32[:0]).shape == (0, 3)
    with pytest.raises(ValueError, match=r"predict: X: expected shape \(n, 5\)"):
        prog.predict(X32[:, :4])


@needs_cc
def test_unusable_cache_directory_falls_back(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="not usable"):
        model, prog = mlp_program("c", cache=str(blocker / "cache"))
    assert prog.backend == "c"
    assert np.array_equal(
        prog.forward([0.1, 0.2, 0.3], [1]), [o.data for o in model([0.1, 0.2, 0.3])]
    )


def test_nan_and_inf_in_data_propagate_as_ieee():
    model, prog = mlp_program("tape")
    out = prog.forward([np.nan, 0.0, 1.0], [1])
    assert np.isnan(out).all() and np.isnan(prog.loss)
    X = np.array([[np.inf, 0.0, 0.0], [0.1, 0.2, 0.3]])
    pred = prog.predict(X)
    assert np.isfinite(pred[1]).all()
    losses = prog.fit(X, np.array([1.0, 2.0]), epochs=1, lr=0.1, shuffle=False)
    assert np.isnan(losses[0]) or np.isinf(losses[0])


@needs_cc
def test_full_disk_is_a_compile_error_and_auto_falls_back(monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith(".so"):
            full()
        return real_replace(src, dst)

    monkeypatch.setattr(compiler.codecache.os, "replace", replace)
    with pytest.raises(mc.CompileError, match="No space left on device"):
        mlp_program("c")
    with pytest.warns(RuntimeWarning, match="falling back"):
        _, prog = mlp_program("auto")
    assert prog.backend == "tape"


@needs_cc
def test_float32_storage_runs_on_the_one_driver():
    """float32 storage: libmg's driver over float32 slot arrays, every method, batches and
    threads; results agree with float64 to float32's precision, and are float32 values."""
    X = np.random.RandomState(0).rand(64, 30)
    Y = np.random.RandomState(1).randint(0, 5, 64).astype(float)
    _, p64 = mnist_shaped(True, "c", sizes=(30, [12, 5]))
    model, _ = mnist_shaped(True, "tape", sizes=(30, [12, 5]))  # the same seeded model
    x, y = mc.inputs(30), mc.inputs(1)
    logits = model(x)
    loss = mc.cross_entropy(logits, y[0])
    kw = dict(inputs=x, targets=y, params=model.parameters(), outputs=logits, backend="c")
    prog = mc.compile(loss, float32=True, **kw)
    assert prog.info["float32"] and prog.backend == "c"
    start = prog.parameters.copy()
    assert np.allclose(start, p64.parameters, rtol=1e-6)

    def f32_values(a):
        return np.array_equal(a, a.astype(np.float32).astype(np.float64))

    # single samples: forward, backward, step (the gradients of float32 slots)
    out32, out64 = prog.forward(X[0], [2]), p64.forward(X[0], [2])
    assert out32.shape == (5,) and np.allclose(out32, out64, rtol=1e-5, atol=1e-6)
    assert abs(prog.loss - p64.loss) < 1e-5 * abs(p64.loss) + 1e-6
    assert f32_values(out32) and f32_values(prog.parameters)
    prog.backward()
    p64.backward()
    assert np.allclose(prog.grad, p64.grad, rtol=1e-4, atol=1e-6) and f32_values(prog.grad)
    assert np.abs(prog.grad).max() > 0
    prog.step(0.1)
    p64.step(0.1)
    assert np.allclose(prog.parameters, p64.parameters, rtol=1e-5, atol=1e-6)
    assert f32_values(prog.parameters)
    # epochs at batch 1 and in batches: close to float64, not equal to it
    for bs in (1, 8):
        l64 = p64.fit(X, Y, epochs=2, lr=0.05, batch_size=bs, seed=4)
        l32 = prog.fit(X, Y, epochs=2, lr=0.05, batch_size=bs, seed=4)
        assert np.allclose(l32, l64, rtol=1e-4)
        assert np.allclose(prog.parameters, p64.parameters, rtol=1e-3, atol=1e-4)
        assert not np.array_equal(prog.parameters, p64.parameters)
        assert f32_values(prog.parameters)
    assert np.allclose(prog.predict(X[:5]), p64.predict(X[:5]), rtol=1e-3, atol=1e-4)
    # threads split the work, never the sums: bitwise the same parameters
    after = []
    for threads in (1, 2, 3):
        prog.parameters[:] = start
        prog.fit(X, Y, epochs=1, lr=0.05, batch_size=8, seed=5, threads=threads)
        after.append(prog.parameters.copy())
    assert np.array_equal(after[0], after[1]) and np.array_equal(after[0], after[2])
    with pytest.raises(ValueError, match=r"expected shape \(n, 30\)"):
        prog.predict(np.zeros((2, 3)))
    # a call that fails changes nothing: the parameters are not even rounded
    prog.parameters[0] = 0.1
    with pytest.raises(ValueError):
        prog.fit(X, Y, lr=float("nan"))
    # a learning rate finite as a double but not as a float (inf * 0: NaN parameters)
    with pytest.raises(ValueError, match=r"learning rate 1e\+39 is not finite in float32"):
        prog.fit(X, Y, lr=1e39, batch_size=1)
    with pytest.raises(ValueError, match=r"learning rate -1e\+39 is not finite in float32"):
        prog.step(-1e39)
    assert p64.fit(X[:2], Y[:2], lr=1e39, batch_size=2)  # float64 takes it
    with pytest.raises(ValueError, match="class index"):
        prog.forward(X[0], [7])
    assert prog.parameters[0] == 0.1
    # its C is the float32 code it runs
    assert "#define MGK_REAL float" in prog.c_source()
    assert "#define MGK_REAL float" not in prog.c_source(inference_only=True)
    assert prog.write_back() == len(model.parameters())
    assert model.parameters()[0].data == float(prog.parameters[0])
    with pytest.raises(ValueError, match="every loop nest"):
        mc.compile(loss, float32=True, max_kernels=1, **kw)
    with pytest.raises(ValueError, match="backend='c'"):
        mc.compile(
            mc.cross_entropy(logits, y[0]),
            inputs=x,
            targets=y,
            params=model.parameters(),
            backend="tape",
            float32=True,
        )


@pytest.mark.parametrize(
    "kind", ["tape", pytest.param("c", marks=needs_cc), pytest.param("float32", marks=needs_cc)]
)
def test_batch1_fit_steps_each_layer_as_the_next_sample_reads_it(kind):
    """Issue 13, item 2: at batch 1 a layer's weight update for sample s waits for sample s+1's
    forward through the layer, which applies it to each weight as it reads it (one pass over the
    weights per sample). The same bits as forward, backward and step per sample, in fit's order;
    the last sample's update runs in its own backward."""
    backend = "tape" if kind == "tape" else "c"
    # 20 hidden units: two full vector blocks in one register tile and a partial one
    _, prog = mlp_program(backend, sizes=(30, [20, 10]), seed=4, float32=kind == "float32")
    assert prog.info["deferred_steps"] == 2
    assert prog.describe().count("[steps its weights first]") == 2
    rng = np.random.RandomState(2)
    X, Y = rng.rand(25, 30) - 0.5, rng.randint(0, 10, (25, 1)).astype(float)
    start = prog.parameters.copy()
    for n in (25, 1):  # one sample: nothing waits
        prog.parameters[:] = start
        (mean,) = prog.fit(X[:n], Y[:n], epochs=1, lr=0.3, batch_size=1, shuffle=False)
        fitted = prog.parameters.copy()
        prog.parameters[:] = start
        total = 0.0
        for i in range(n):
            prog.forward(X[i], Y[i])
            total += prog.loss
            prog.backward()
            prog.step(0.3)
        assert np.array_equal(fitted, prog.parameters), n
        assert mean == total / n
        assert not np.array_equal(fitted, start)


@pytest.mark.parametrize("backend", ["tape", pytest.param("c", marks=needs_cc)])
def test_a_loss_that_is_a_packed_parameter_trains(backend):
    """The loss is one of the weights the schedule packs (a 5x5 stride-2 convolution over 8
    channels, read along its channels; the conv is an output): its gradient is 1, at batch 1 and
    in batches, and the mean loss fit reports is the parameter's value before each step."""
    rng = random.Random(0)
    H, K, S, P, CO = 16, 5, 2, 2, 8
    x = mc.inputs(H * H)
    w = [[[Value(rng.uniform(-1, 1)) for _ in range(K)] for _ in range(K)] for _ in range(CO)]
    params = [v for co in w for row in co for v in row]
    outs = []
    Ho = (H + 2 * P - K) // S + 1
    for co in range(CO):
        for i in range(Ho):
            for j in range(Ho):
                s = Value(0.0)
                for a in range(K):
                    for b in range(K):
                        r, q = i * S + a - P, j * S + b - P
                        if 0 <= r < H and 0 <= q < H:
                            s = s + w[co][a][b] * x[r * H + q]
                outs.append(s)
    loss = w[0][1][2]
    k = params.index(loss)
    prog = mc.compile(loss, x, [], params, outs, backend=backend)
    assert prog.info["packed"] >= len(params)  # the weights are read from the packed copy
    prog.forward(np.linspace(-1, 1, H * H))
    prog.backward()
    want = np.zeros(len(params))
    want[k] = 1.0
    assert np.array_equal(prog.grad, want)
    start = loss.data
    for batch in (1, 2):
        prog.parameters[:] = [p.data for p in params]
        losses = prog.fit(np.zeros((4, H * H)), epochs=1, lr=0.5, batch_size=batch, shuffle=False)
        steps = 4 // batch
        assert prog.parameters[k] == pytest.approx(start - 0.5 * steps, abs=1e-12)
        # the mean over the samples of the value each saw: start, start - 0.5, ... per step
        seen = [start - 0.5 * (i // batch) for i in range(4)]
        assert losses[0] == pytest.approx(sum(seen) / 4, abs=1e-12)


@pytest.mark.parametrize("backend", ["tape", pytest.param("c", marks=needs_cc)])
def test_predict_refuses_an_output_computed_from_the_targets(backend):
    """predict takes no targets: an output computed from one (a loss among the outputs) would be
    computed from whatever targets the slots last held, a different answer for the same X after
    each forward or fit (found by review). It is refused; the outputs of the inputs alone are
    predicted, and forward(x, y) computes the rest."""
    w = Value(2.0)
    x, y = mc.inputs(1), mc.inputs(1)
    pred = x[0] * w
    loss = (pred - y[0]) ** 2
    prog = mc.compile(loss, x, y, [w], outputs=[pred, loss], backend=backend)
    assert list(prog.forward([3.0], [10.0])) == [6.0, 16.0]
    with pytest.raises(ValueError, match="output 1 is computed from the targets"):
        prog.predict([[1.0], [2.0]])
    with pytest.raises(ValueError, match="output 1 is computed from the targets"):
        prog.predict(np.zeros((0, 1)))  # whatever the rows
    only = mc.compile(loss, x, y, [w], outputs=[pred], backend=backend)
    only.forward([3.0], [10.0])
    assert only.predict([[1.0], [2.0]]).tolist() == [[2.0], [4.0]]


def test_successive_fits_repeat_or_go_on_as_they_are_told():
    """Each epoch's order depends on the seed and the epoch's number (first_epoch + e): calls
    with the same arguments repeat the same orders (a fit is reproducible), and first_epoch=
    prog.epochs_trained goes on, so three fit(epochs=1) calls train as one fit(epochs=3)
    (repeating the order silently was found by review: the docstring says how to go on)."""

    def fresh() -> mc.Program:
        random.seed(3)
        model = MLP(2, [4, 1])
        x, y = mc.inputs(2), mc.inputs(1)
        return mc.compile(mc.mse([model(x)], y), x, y, model.parameters(), backend="tape")

    rs = np.random.RandomState(0)
    X, Y = rs.uniform(-1, 1, (16, 2)), rs.uniform(-1, 1, (16, 1))
    once = fresh()
    losses = once.fit(X, Y, epochs=3, lr=0.1, seed=5)
    assert once.epochs_trained == 3
    three = fresh()
    each = [
        three.fit(X, Y, epochs=1, lr=0.1, seed=5, first_epoch=three.epochs_trained)[0]
        for _ in range(3)
    ]
    assert each == losses and three.epochs_trained == 3
    assert np.array_equal(three.parameters, once.parameters)
    again = fresh()
    for _ in range(3):
        again.fit(X, Y, epochs=1, lr=0.1, seed=5)  # epoch 0's order each time
    assert not np.array_equal(again.parameters, once.parameters) and again.epochs_trained == 3
    with pytest.raises(ValueError, match="first_epoch must be at least 0"):
        again.fit(X, Y, first_epoch=-1)
