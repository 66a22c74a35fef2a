"""One model, written the different ways micrograd users write it: what each costs compiled.

    python benchmarks/formulations.py [--groups maxpool,avgpool,...] [--samples 500] [--repeat 3]

The compiler recovers loops from the scalar graph, so how a user happens to write a pool, a
neuron or a convolution decides what it recovers: a balanced `a.max(b).max(c.max(d))` next to
the left-leaning chain, a neuron as `mc.vsum([w * x ...]) + b` next to `sum(gen, b)`, a sum
taken pairwise. For every group (one model, several formulations; the first is the canonical
one, as benchmarks/zoo.py writes it) this prints, in one run: compile time (fresh cache), C
source size, the graph's statements and loop nests, how many nests read through index tables
(`@table`) or run a single point, and training throughput at batch size 1 on one thread (the
tape interpreter and the compiled program, medians of --repeat epochs, formulations interleaved
within each repeat), with each formulation's ratio to the canonical one's in the same run. The
first epoch's losses of a group agree where the formulations compute the same sums in the same
order. No figure here is asserted by a test; tests/python/test_reroll.py checks the programs'
shapes and values.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo  # noqa: E402

import micrograd_c as mc  # noqa: E402
from micrograd_c.app.bench import cpu_model  # noqa: E402
from micrograd_c.engine import Value  # noqa: E402

Builder = Callable[[Sequence[Value]], tuple[list[Value], list[Value]]]
Pool = Callable[[list[Value]], Value]


def _image(x: Sequence[Value]) -> list[list[list[Any]]]:
    return [[list(x[i * 28 : (i + 1) * 28]) for i in range(28)]]


def _head(feats: list[Value], params: list[Value]) -> tuple[list[Value], list[Value]]:
    W = zoo._matrix(10, len(feats), len(feats), params)
    b = [zoo._b(params) for _ in range(10)]
    return zoo._dense(feats, W, b), params


def pooled_cnn(pool: Pool, k: int = 2, stride: int = 2) -> Builder:
    """conv 3x3x4 + relu + a k x k pool of `stride` written as `pool(window)` + dense 10."""

    def build(x: Sequence[Value]) -> tuple[list[Value], list[Value]]:
        params: list[Value] = []
        img = zoo._relu3(zoo._conv(_image(x), 4, 3, 1, 0, params))
        feats = []
        for plane in img:
            n = (len(plane) - k) // stride + 1
            for i in range(n):
                for j in range(n):
                    win = [
                        plane[i * stride + a][j * stride + b] for a in range(k) for b in range(k)
                    ]
                    feats.append(pool(win))
        return _head(feats, params)

    return build


def max_chain(w: list[Value]) -> Value:
    m = w[0]
    for v in w[1:]:
        m = m.max(v)
    return m


def pairwise(v: list[Any]) -> Any:
    """Sum pairwise: adjacent pairs, then pairs of those, ... (a tree of additions)."""
    while len(v) > 1:
        v = [v[i] + v[i + 1] if i + 1 < len(v) else v[i] for i in range(0, len(v), 2)]
    return v[0]


def mlp(neuron: Callable[[list[Value], list[Any], Value], Value]) -> Builder:
    """MLP(784, [64, 64, 10]) with ReLU, each neuron `neuron(weights, inputs, bias)`."""

    def build(x: Sequence[Value]) -> tuple[list[Value], list[Value]]:
        params: list[Value] = []
        h: list[Any] = list(x)
        for n in (64, 64, 10):
            W = zoo._matrix(n, len(h), len(h), params)
            b = [zoo._b(params) for _ in range(n)]
            out = [neuron(row, h, bj) for row, bj in zip(W, b)]
            h = [o.relu() for o in out] if n != 10 else out
        return h, params

    return build


def conv(neuron: Callable[[list[Value], list[Any], Value], Value]) -> Builder:
    """conv 3x3x4 + relu + dense 10, each output `neuron(kernel, window, bias)`."""

    def build(x: Sequence[Value]) -> tuple[list[Value], list[Value]]:
        params: list[Value] = []
        img = _image(x)[0]
        w = [[zoo._w(9, params) for _ in range(9)] for _ in range(4)]
        bias = [zoo._b(params) for _ in range(4)]
        feats = []
        for c in range(4):
            for i in range(26):
                for j in range(26):
                    win = [img[i + a][j + b] for a in range(3) for b in range(3)]
                    feats.append(neuron(w[c], win, bias[c]).relu())
        return _head(feats, params)

    return build


def _gen_sum(w: list[Value], x: list[Any], b: Value) -> Value:
    return sum((wi * xi for wi, xi in zip(w, x)), b)


def _vsum(w: list[Value], x: list[Any], b: Value) -> Value:
    return mc.vsum([wi * xi for wi, xi in zip(w, x)]) + b


def _dot(w: list[Value], x: list[Any], b: Value) -> Value:
    return mc.dot(w, x) + b


def _pairwise(w: list[Value], x: list[Any], b: Value) -> Value:
    return pairwise([wi * xi for wi, xi in zip(w, x)]) + b


GROUPS: dict[str, dict[str, Builder]] = {
    "maxpool": {
        "a.max(b).max(c).max(d)": pooled_cnn(max_chain),
        "a.max(b).max(c.max(d))": pooled_cnn(lambda w: w[0].max(w[1]).max(w[2].max(w[3]))),
        "a.max(b.max(c.max(d)))": pooled_cnn(lambda w: w[0].max(w[1].max(w[2].max(w[3])))),
    },
    "avgpool": {
        "(a + b + c + d) * 0.25": pooled_cnn(lambda w: (w[0] + w[1] + w[2] + w[3]) * 0.25),
        "((a + b) + (c + d)) * 0.25": pooled_cnn(lambda w: ((w[0] + w[1]) + (w[2] + w[3])) * 0.25),
        "mc.vsum(window) * 0.25": pooled_cnn(lambda w: mc.vsum(w) * 0.25),
    },
    "pool3x3s2": {  # overlapping windows; the average is the reference, not the same model
        "average, sum(window) / 9": pooled_cnn(lambda w: sum(w) / 9, 3, 2),
        "max, a chain of 9": pooled_cnn(max_chain, 3, 2),
    },
    "pool2x2s1": {
        "average, sum(window) * 0.25": pooled_cnn(lambda w: sum(w) * 0.25, 2, 1),
        "max, a chain of 4": pooled_cnn(max_chain, 2, 1),
    },
    "mlp": {
        "sum(gen, b)": mlp(_gen_sum),
        "mc.vsum([w * x ...]) + b": mlp(_vsum),
        "mc.dot(w, x) + b": mlp(_dot),
        "pairwise sum + b": mlp(_pairwise),
    },
    "conv": {
        "sum(gen, b)": conv(_gen_sum),
        "mc.vsum([w * x ...]) + b": conv(_vsum),
    },
}


def _build(builder: Builder) -> tuple[Any, list[Value], list[Value], list[Value]]:
    random.seed(0)
    x, y = mc.inputs(784), mc.inputs(1)
    logits, params = builder(x)
    return mc.cross_entropy(logits, y[0]), x, y, params


def run_group(
    name: str, forms: dict[str, Builder], X: np.ndarray, Y: np.ndarray, repeat: int
) -> None:
    """Compile every formulation of one group, time them interleaved, print the group's table."""
    rows = []
    for label, builder in forms.items():
        loss, x, y, params = _build(builder)
        cache = tempfile.mkdtemp(prefix="mg-formulations-")
        try:
            t = time.perf_counter()
            prog = mc.compile(loss, x, y, params, backend="c", cache=cache)
            seconds = time.perf_counter() - t
            size = sum(
                os.path.getsize(f)
                for f in glob.glob(os.path.join(cache, "**", "*.c"), recursive=True)
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        text = prog.describe()
        tape = mc.compile(loss, x, y, params, backend="tape")
        rows.append(
            {
                "label": label,
                "compile": seconds,
                "kb": size / 1024,
                "graph": text.splitlines()[0],
                "tables": len(re.findall(r"nest \d+:.*@table", text)),
                "points": len(re.findall(r"nest \d+: \( \|", text)),
                "progs": (tape, prog),
                "p0": (np.array(tape.parameters), np.array(prog.parameters)),
                "rates": ([], []),
                "loss": [None, None],
            }
        )
    n = len(X)
    for _ in range(repeat):
        for r in rows:
            for i, prog in enumerate(r["progs"]):
                prog.parameters[:] = r["p0"][i]
                t = time.perf_counter()
                loss = prog.fit(X, Y, batch_size=1, lr=1e-3, shuffle=False)
                r["rates"][i].append(n / (time.perf_counter() - t))
                r["loss"][i] = loss
    print(f"\n## {name}")
    print(
        "| formulation | compile | C | @table nests | 1-point nests | tape img/s | compiled img/s "
        "| tape / canonical | compiled / canonical | loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for r in rows:
        tape, comp = (statistics.median(v) for v in r["rates"])
        base = base or (tape, comp)
        loss = r["loss"][1]
        shown = f"{float(np.mean(loss)):.6f}" if loss is not None else ""
        cells = [
            r["label"],
            f"{r['compile']:.2f} s",
            f"{r['kb']:.0f} KB",
            str(r["tables"]),
            str(r["points"]),
            f"{tape:,.0f}",
            f"{comp:,.0f}",
            f"{tape / base[0]:.2f}x",
            f"{comp / base[1]:.2f}x",
            shown,
        ]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        print(f"  {r['label']}: {r['graph']}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the groups, print one table per group."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--groups", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS)
    )
    ap.add_argument("--samples", type=int, default=500, help="random images per epoch")
    ap.add_argument("--repeat", type=int, default=3, help="epochs per formulation (median)")
    args = ap.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    if args.samples < 1 or args.repeat < 1:
        ap.error("--samples and --repeat must be at least 1")
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; python {sys.version.split()[0]}")
    rng = np.random.default_rng(0)
    X = rng.random((args.samples, 784))
    Y = rng.integers(0, 10, (args.samples, 1)).astype(np.float64)
    for g in groups:
        run_group(g, GROUPS[g], X, Y, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
