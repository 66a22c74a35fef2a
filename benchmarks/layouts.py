"""Graphs whose loops the compiler finds only through its layouts: tape and compiled throughput.

    python benchmarks/layouts.py [--families perm_mlp,birnn,...] [--samples 2000] [--repeat 3]

Model families a micrograd user writes op by op, each of which once read its operands through
index tables, failed to roll or rolled where it should not (issue #12's "any scalar graph"), now
recovered by the layouts of reroll.c, freeze.c and split.c, by roll.c's choice of blocks and by
freeze.c's common subexpressions (docs/ARCHITECTURE.md):

  perm_mlp    MLP 784-50-10 over a fixed random permutation of the pixels (inputs stored in the
              order the program reads them)
  perm_conv   a 1-D convolution (6 channels, width 5, stride 2) over permuted pixels, mean, dense
  birnn       a bidirectional Elman RNN, 16 units, over the 28 rows (rerolled again with the
              rows interleaved, so its steps roll)
  stacked     two Elman layers of 16 units stacked over the 28 rows (the steps roll after the
              first, whose levels hold no step of the lower layer beside the upper one's)
  branches    dense branches of 16, 16 and 2 units side by side over one image (one group per
              branch instead of one read through index tables)
  moe         a mixture of two experts (24 and 40 hidden units) under a softmax gate
  norm        inputs standardised, RMS norm, GELU, a batch-norm-like layer, each normalising
              factor written inside its comprehension (computed once: common subexpressions)
  l2_nn       nn.MLP(784,[32,10]) with micrograd's L2 term, 1e-4 * sum(p*p for p in params)
              (the term's run cut at the layers' blocks, so the weights are packed)
  deep        nn.MLP(784,[64,64,64,10]), hidden layers of one shape (a nest per layer, not a
              loop over the layers, whose weights no packed copy would describe)
  maxout      16 maxout units over 12 linear pieces of the pixels each, dense 10 (its pieces
              stored piece by piece, as its maxes read them; its weight gradient steps SGD in a
              loop without the masked loads that cost it 14x at batch 1)

For each it prints the program (loop nests forward + backward), the freeze + emit + compile time,
and images/s of the tape interpreter and the compiled program at batch 1 and 32 (one thread, SGD,
no shuffling, medians of --repeat epochs over --samples random images, the CPU model in the
caption). The README's table compares these figures with an earlier version's, measured by
running this script against each build in turn.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

import micrograd_c as mc
from micrograd_c.app.bench import cpu_model
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo import Params, _b, _matrix, _w
from zoo import _dense as _layer


def _dense(x: list[Any], n: int, params: Params, act: str | None = None) -> list[Any]:
    """A dense layer as a user writes it: its weight rows, then its biases, then the sums."""
    out = _layer(x, _matrix(n, len(x), len(x), params), [_b(params) for _ in range(n)])
    return [getattr(v, act)() for v in out] if act else out


def perm_mlp(x: list[Value], params: Params) -> list[Any]:
    perm = random.Random(7).sample(range(784), 784)
    return _dense(_dense([x[i] for i in perm], 50, params, "relu"), 10, params)


def perm_conv(x: list[Value], params: Params) -> list[Any]:
    seq = [x[i] for i in random.Random(7).sample(range(784), 784)]
    k = [[_w(5, params) for _ in range(5)] for _ in range(6)]
    b = [_b(params) for _ in range(6)]
    feats = [
        sum(sum((k[c][q] * seq[p + q] for q in range(5)), b[c]).relu() for p in range(0, 780, 2))
        / 390
        for c in range(6)
    ]
    return _dense(feats, 10, params)


def birnn(x: list[Value], params: Params, steps: int = 28, hidden: int = 16) -> list[Any]:
    """Both directions over the rows of x (steps rows), their last states into a dense layer."""
    width = len(x) // steps
    last: list[Any] = []
    for forwards in (True, False):
        Wx = _matrix(hidden, width, width, params)
        Wh = _matrix(hidden, hidden, hidden, params)
        b = [_b(params) for _ in range(hidden)]
        h: list[Any] = [Value(0.0)] * hidden
        for t in range(steps) if forwards else reversed(range(steps)):
            row = x[width * t : width * (t + 1)]
            h = [
                (
                    sum((w * a for w, a in zip(Wx[j], row)), b[j])
                    + sum(w * a for w, a in zip(Wh[j], h))
                ).tanh()
                for j in range(hidden)
            ]
        last += h
    return _dense(last, 10, params)


def stacked(
    x: list[Value], params: Params, layers: int = 2, steps: int = 28, hidden: int = 16
) -> list[Any]:
    """Elman layers stacked over the rows of x: layer l at step t reads layer l-1's state at
    step t and its own at t-1; the top layer's last state into a dense layer."""
    width = len(x) // steps
    cells = [
        (
            _matrix(
                hidden, width if layer == 0 else hidden, width if layer == 0 else hidden, params
            ),
            _matrix(hidden, hidden, hidden, params),
            [_b(params) for _ in range(hidden)],
        )
        for layer in range(layers)
    ]
    hs: list[list[Any]] = [[Value(0.0)] * hidden for _ in range(layers)]
    for t in range(steps):
        below: list[Any] = x[width * t : width * (t + 1)]
        for layer, (Wx, Wh, b) in enumerate(cells):
            hs[layer] = [
                (
                    sum((w * a for w, a in zip(Wx[j], below)), b[j])
                    + sum(w * a for w, a in zip(Wh[j], hs[layer]))
                ).tanh()
                for j in range(hidden)
            ]
            below = hs[layer]
    return _dense(hs[-1], 10, params)


def branches(x: list[Value], params: Params) -> list[Any]:
    h: list[Any] = []
    for n in (16, 16, 2):
        h += _dense(x, n, params, "relu")
    return _dense(h, 10, params)


def moe(x: list[Value], params: Params) -> list[Any]:
    gate = [v.exp() for v in _dense(x, 2, params)]
    z = gate[0] + gate[1]
    g = [v / z for v in gate]
    e1 = _dense(_dense(x, 24, params, "relu"), 10, params)
    e2 = _dense(_dense(x, 40, params, "relu"), 10, params)
    return [g[0] * a + g[1] * b for a, b in zip(e1, e2)]


def norm(x: list[Value], params: Params) -> list[Any]:
    """Inputs standardised, dense 32, RMS norm with a gain, tanh-GELU, a batch-norm-like
    normalisation with gamma and beta, dense 10: each shared factor written inside its
    comprehension, so computed again for every element (the common subexpressions)."""
    n = len(x)
    mu = sum(x) / n
    var = sum((v - mu) ** 2 for v in x) / n
    h = _dense([(v - mu) / (var + 1e-5) ** 0.5 for v in x], 32, params)
    gain = [_b(params) + 1.0 for _ in h]
    rms = (sum(v * v for v in h) / len(h) + 1e-6) ** -0.5
    h = [v * rms * g for v, g in zip(h, gain)]
    c = math.sqrt(2 / math.pi)
    h = _dense([0.5 * v * (1 + (c * (v + 0.044715 * v**3)).tanh()) for v in h], 32, params)
    mu2 = sum(h) / len(h)
    var2 = sum((v - mu2) ** 2 for v in h) / len(h)
    gamma = [_b(params) + 1.0 for _ in h]
    beta = [_b(params) for _ in h]
    h = [(v - mu2) / (var2 + 1e-5) ** 0.5 * g + b for v, g, b in zip(h, gamma, beta)]
    return _dense(h, 10, params)


def maxout(x: list[Value], params: Params, units: int = 16, pieces: int = 12) -> list[Any]:
    """A maxout layer: each unit the max (a chain of Value.max) over its own linear pieces of
    the pixels, then a dense layer."""
    h = []
    for _ in range(units):
        piece = _dense(x, pieces, params)
        m = piece[0]
        for v in piece[1:]:
            m = m.max(v)
        h.append(m)
    return _dense(h, 10, params)


def deep(x: list[Value], params: Params) -> list[Any]:
    """nn.MLP(784, [64, 64, 64, 10]): hidden layers of one shape, each with its own weights."""
    model = MLP(784, [64, 64, 64, 10])
    params.extend(model.parameters())
    return list(model(x))


def l2_nn(x: list[Value], params: Params) -> list[Any]:
    """micrograd's classes (each neuron's weights, then its bias); measure() adds the L2 term."""
    model = MLP(784, [32, 10])
    params.extend(model.parameters())
    return list(model(x))


FAMILIES: dict[str, Callable[[list[Value], Params], list[Any]]] = {
    "perm_mlp": perm_mlp,
    "perm_conv": perm_conv,
    "birnn": birnn,
    "stacked": stacked,
    "branches": branches,
    "moe": moe,
    "norm": norm,
    "l2_nn": l2_nn,
    "deep": deep,
    "maxout": maxout,
}
L2 = {"l2_nn"}  # families whose loss adds 1e-4 * sum(p*p for p in params)


def measure(name: str, n: int, repeat: int) -> dict[str, Any]:
    """One family compiled both ways and trained: its row's figures."""
    random.seed(0)
    x, y = mc.inputs(784), mc.inputs(1)
    params: Params = []
    logits = FAMILIES[name](x, params)
    loss = mc.cross_entropy(logits, y[0])
    if name in L2:
        loss = loss + 1e-4 * sum(p * p for p in params)
    rng = np.random.default_rng(0)
    X = rng.random((n, 784))
    Y = rng.integers(0, 10, (n, 1)).astype(np.float64)
    row: dict[str, Any] = {"family": name}
    for backend in ("tape", "c"):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as cache:
            prog = mc.compile(loss, x, y, params, backend=backend, cache=cache)
            if backend == "c":
                row["compile"] = time.perf_counter() - t0
                m = re.search(r"-> (\d+) forward and (\d+) backward", prog.describe())
                row["nests"] = f"{m.group(1)}+{m.group(2)}" if m else "?"
            p0 = np.array(prog.parameters)
            for batch in (1, 32):
                rates = []
                for _ in range(repeat):
                    prog.parameters[:] = p0
                    t = time.perf_counter()
                    prog.fit(X, Y, batch_size=batch, lr=1e-3, shuffle=False)
                    rates.append(n / (time.perf_counter() - t))
                row[f"{backend} b{batch}"] = statistics.median(rates)
    return row


def main(argv: list[str] | None = None) -> int:
    """Prints the table; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated names")
    ap.add_argument("--samples", type=int, default=2000, help="random images per epoch")
    ap.add_argument("--repeat", type=int, default=3, help="epochs per figure (median)")
    args = ap.parse_args(argv)
    names = [f for f in args.families.split(",") if f]
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or args.samples < 1 or args.repeat < 1:
        ap.error(
            f"unknown families {unknown} (known: {', '.join(FAMILIES)})"
            if unknown
            else "--samples and --repeat must be at least 1"
        )
    print(
        f"CPU: {cpu_model()}; images/s, one thread, medians of {args.repeat} epochs of "
        f"{args.samples} random images"
    )
    cols = ["tape b1", "c b1", "tape b32", "c b32"]
    print("| family | nests | compile | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for name in names:
        r = measure(name, args.samples, args.repeat)
        cells = " | ".join(f"{r[c]:,.0f}" for c in cols)
        print(f"| {name} | {r['nests']} | {r['compile']:.2f} s | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
