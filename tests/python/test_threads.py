"""Threads: each thread's ``checkpoint()`` releases only what that thread created inside it.

Two threads that each train their own model with the documented pattern (build the loss and
call backward inside ``with checkpoint():``, update the parameters after it) must get exactly
the parameters they get when run one after the other.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

from conftest import settled_graph_len


def initial_state(seed: int, sizes: list[int]) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    out = {}
    for i in range(len(sizes) - 1):
        out[f"layers.{i}.weight"] = rs.uniform(-1, 1, (sizes[i + 1], sizes[i]))
        out[f"layers.{i}.bias"] = np.zeros(sizes[i + 1])
    return out


def train(seed: int, steps: int, start: threading.Barrier | None = None) -> dict[str, np.ndarray]:
    """The documented pattern; the model and the data are created by the training thread."""
    if start is not None:
        start.wait()
    sizes = [2, 8, 8, 1]
    model = MLP(sizes[0], sizes[1:])
    model.load_state_dict(initial_state(seed, sizes))
    rs = np.random.RandomState(100 + seed)
    X, Y = rs.uniform(-1, 1, (8, 2)), rs.choice([-1.0, 1.0], 8)
    for _ in range(steps):
        with mc.checkpoint():
            scores = [model([Value(float(a)), Value(float(b))]) for a, b in X]
            loss = mc.hinge(scores, list(Y)) + 1e-4 * sum(p * p for p in model.parameters())
            model.zero_grad()
            loss.backward()
        for p in model.parameters():
            p.data -= 0.05 * p.grad
    return model.state_dict()


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible: maximal interleaving
    yield
    sys.setswitchinterval(old)


def run_threads(seeds: list[int], steps: int) -> list[dict[str, np.ndarray]]:
    results: list = [None] * len(seeds)
    errors: list[BaseException] = []
    start = threading.Barrier(len(seeds))

    def worker(i: int) -> None:
        try:
            results[i] = train(seeds[i], steps, start)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(seeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_two_threads_train_their_own_models_as_if_alone(fast_switching):
    base = settled_graph_len()
    alone = [train(1, 15), train(2, 15)]
    together = run_threads([1, 2], 15)
    for a, b in zip(alone, together):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k
    assert mc.graph_len() == base  # every step's graph was released, in both threads


def test_a_thread_does_not_release_values_created_meanwhile_by_another(fast_switching):
    inside, outside = threading.Event(), threading.Event()
    made: list[Value] = []
    seen: list[float] = []

    def holder() -> None:
        with mc.checkpoint():
            tmp = Value(1.0) * 2
            inside.set()
            outside.wait()  # the main thread creates values while this checkpoint is open
            seen.append(tmp.data)
        seen.append(tmp._alive)

    t = threading.Thread(target=holder)
    t.start()
    inside.wait()
    made.extend(Value(float(i)) for i in range(10))
    w = made[0] + made[1]
    outside.set()
    t.join()
    assert seen == [2.0, False]  # the holder's own value was released
    assert all(v._alive for v in made) and w._alive and w.data == 1.0
    w.backward()
    assert made[0].grad == 1.0


def test_many_short_lived_threads_reuse_domains():
    # more threads than there are checkpoint domains, one after the other
    def step(out: list[float]) -> None:
        x = Value(3.0)
        with mc.checkpoint():
            y = x * x
            y.backward()
        out.append(x.grad)

    out: list[float] = []
    for _ in range(300):
        t = threading.Thread(target=step, args=(out,))
        t.start()
        t.join()
    assert out == [6.0] * 300


def test_compile_while_another_thread_computes_with_values(tmp_path):
    """Freezing walks and marks the process's one graph, which another thread's Values build and
    differentiate under the GIL: compile holds the GIL while it freezes. (It released it, and a
    thread doing arithmetic and backward meanwhile crashed the process in the first compiles;
    found by review.) In a child process, so that a regression cannot take pytest down."""
    script = tmp_path / "race.py"
    script.write_text(
        "import sys, threading, time\n"
        "import micrograd_c as mc\n"
        "from micrograd_c.engine import Value\n"
        "sys.setswitchinterval(1e-6)\n"
        "x = mc.inputs(1); w = Value(0.5); v = x[0]\n"
        "for i in range(50000): v = v * w + x[0]\n"
        "stop = False; steps = [0]\n"
        "def worker():\n"
        "    while not stop:\n"
        "        with mc.checkpoint():\n"
        "            a = Value(1.0)\n"
        "            for _ in range(300): a = a * 1.0001 + 1.0\n"
        "            a.backward()\n"
        "        steps[0] += 1\n"
        "t = threading.Thread(target=worker); t.start()\n"
        "while steps[0] == 0: time.sleep(0.001)  # the worker is computing\n"
        "outs = []\n"
        "for it in range(6):\n"
        "    p = mc.compile(v, inputs=x, params=[w], outputs=[v], backend='tape')\n"
        "    outs.append(float(p.predict([[1.0]])[0, 0]))\n"
        "stop = True; t.join()\n"
        "print(len(set(outs)), steps[0] > 0)\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["1", "True"]


def test_write_back_during_a_fit_copies_the_parameters_of_whole_epochs():
    """write_back, describe and c_source wait for the tape's run lock (without the GIL): called
    while another thread's fit runs, write_back copies the parameters as they stand between two
    epochs, never a mixture of before and after a step (it did not take the lock: found by
    review)."""
    rs = np.random.RandomState(0)
    X, Y = rs.uniform(-1, 1, (3000, 20)), rs.randint(0, 4, 3000).astype(float)

    def program() -> tuple[MLP, mc.Program]:
        model = MLP(20, [32, 4])
        model.load_state_dict(initial_state(5, [20, 32, 4]))
        x, y = mc.inputs(20), mc.inputs(1)
        loss = mc.cross_entropy(model(x), y[0])
        return model, mc.compile(loss, x, y, model.parameters(), backend="tape")

    _, ref = program()
    states = [ref.parameters.copy()]
    for _ in range(3):
        ref.fit(X, Y, epochs=1, lr=0.05, shuffle=False)
        states.append(ref.parameters.copy())
    model, prog = program()
    t = threading.Thread(target=lambda: prog.fit(X, Y, epochs=3, lr=0.05, shuffle=False))
    t.start()
    while t.is_alive():  # (a fit that raised ends the loop too: the last check then fails)
        assert prog.write_back() == len(states[0])
        now = np.array([p.data for p in model.parameters()])
        match = [k for k, s in enumerate(states) if np.array_equal(now, s)]
        assert match, "write_back copied parameters from the middle of an epoch"
        assert prog.describe() and prog.c_source(inference_only=True)
    t.join()
    prog.write_back()
    assert np.array_equal([p.data for p in model.parameters()], states[3])
