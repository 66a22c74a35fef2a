"""Two threads of one fit against two fits in two processes: what a second core gives.

    python benchmarks/threads.py [--batch 32] [--samples 8000] [--repeat 7] [--data-dir DIR]

Issue 13 asks two threads of one batched fit for 1.8x one thread. On a shared virtual machine a
second CPU does not always run at a second core's speed (two vCPUs may share a core, or a
neighbour may hold one), so a ratio below 1.8x may be the machine's, not the fit's. This prints,
in one run, for micrograd_c compiled training MLP(784,[50,10]) at one batch size (float64, SGD,
no shuffling, from the same initial parameters every epoch), round by round in a rotated order:

  1 thread     one fit on one thread, pinned to the last CPU this process may use;
  2 threads    one fit on two threads (every CPU this process may use);
  2 processes  two independent one-thread fits at once, each in its own process pinned to its
               own CPU (the same program, data and parameters): what the machine gives two
               fits that share nothing but itself, the ceiling of two threads (images/s: both
               fits' images over the time the slower one took).

Then the medians of images/s and of the per-round ratios against one thread. A "2 processes"
ratio well below 2 means the machine did not give two cores' worth in this run. Data: the first
--samples images of the MNIST test set (../shared/data/mnist or --data-dir), random images when
it is absent. Needs a C compiler; the CPU model heads the output.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

import micrograd_c as mc
from micrograd_c.app.bench import cpu_model
from micrograd_c.nn import MLP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from models import DEFAULT_MNIST  # noqa: E402
from models import load_data as load_images  # noqa: E402


def load_data(data_dir: str, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """models.py's data (the first n MNIST test images, or n random ones) with the labels as
    fit's one-column targets, and what they are ("MNIST test set" or "random images")."""
    X, y, src = load_images(data_dir, n)
    return X, y.reshape(-1, 1), src.split(" (")[0]


def build(cache: str) -> tuple[Any, np.ndarray]:
    """The compiled program of MLP(784,[50,10]) with cross-entropy, and its initial parameters
    (the same in every process: the model is drawn from random.seed(0))."""
    random.seed(0)
    model = MLP(784, [50, 10])
    x, y = mc.inputs(784), mc.inputs(1)
    logits = model(x)
    assert isinstance(logits, list)
    loss = mc.cross_entropy(logits, y[0])
    prog = mc.compile(loss, x, y, model.parameters(), backend="c", cache=cache)
    return prog, prog.parameters.copy()


def epoch(prog: Any, init: np.ndarray, X: np.ndarray, Y: np.ndarray, a: Any, threads: int) -> float:
    """Seconds of one epoch from the initial parameters."""
    prog.parameters[:] = init
    t0 = time.perf_counter()
    prog.fit(X, Y, epochs=1, lr=0.01, batch_size=a.batch, shuffle=False, threads=threads)
    return time.perf_counter() - t0


def worker(a: argparse.Namespace) -> None:
    """A process of the pair: pinned to --cpu, one epoch per "go" line on stdin, its seconds out."""
    os.sched_setaffinity(0, {a.cpu})
    prog, init = build(a.cache)
    X, Y, _ = load_data(a.data_dir, a.samples)
    epoch(prog, init, X, Y, a, 1)  # warm
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(repr(epoch(prog, init, X, Y, a, 1)), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--samples", type=int, default=8000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--data-dir", default=DEFAULT_MNIST)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.batch < 1 or a.samples < a.batch or a.repeat < 1:
        p.error("--batch >= 1, --samples >= --batch and --repeat >= 1")
    if a.worker:
        worker(a)
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("threads.py: this process may run on one CPU only: nothing to compare")
    one, other = cpus[-1], cpus[-2]
    a.cache = tempfile.mkdtemp(prefix="mg-threads-")
    prog, init = build(a.cache)  # compiled once: the workers load it from the cache
    X, Y, src = load_data(a.data_dir, a.samples)
    print(f"CPU: {cpu_model()}; CPUs {cpus}; one thread on CPU {one}, the pair on {one}, {other}")
    print(f"MLP(784,[50,10]) compiled, batch {a.batch}, {len(X)} images ({src}), float64, SGD")
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--cpu", str(c)]
            + ["--cache", a.cache, "--batch", str(a.batch), "--samples", str(a.samples)]
            + ["--data-dir", a.data_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in (one, other)
    ]
    try:
        for w in procs:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                sys.exit("threads.py: a worker process failed to start")

        def pair() -> float:
            for w in procs:
                assert w.stdin is not None
                w.stdin.write("go\n")
                w.stdin.flush()
            secs = [float(w.stdout.readline()) for w in procs if w.stdout is not None]
            return 2 * len(X) / max(secs)

        def fit(threads: int) -> float:
            os.sched_setaffinity(0, {one} if threads == 1 else set(cpus))
            return len(X) / epoch(prog, init, X, Y, a, threads)

        kinds = {"1 thread": lambda: fit(1), "2 threads": lambda: fit(2), "2 processes": pair}
        for f in kinds.values():  # warm: caches, pages, the threads' first start
            f()
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        names = list(kinds)
        for r in range(a.repeat):
            for k in names[r % 3 :] + names[: r % 3]:
                rates[k].append(kinds[k]())
    finally:
        for w in procs:
            if w.stdin is not None:
                w.stdin.close()
            w.wait()
    print(f"\n{'':12s} {'images/s':>10s} {'/ 1 thread':>11s}   per round")
    for k in names:
        ratio = statistics.median(x / y for x, y in zip(rates[k], rates["1 thread"]))
        rounds = " ".join(f"{x / 1000:.0f}k" for x in rates[k])
        print(f"{k:12s} {statistics.median(rates[k]):10,.0f} {ratio:10.2f}x   {rounds}")


if __name__ == "__main__":
    main()
