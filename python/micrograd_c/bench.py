"""``micrograd-c bench``: one table comparing micrograd, micrograd_c (eager, tape, compiled) and
PyTorch (when installed) on per-sample SGD, each figure a median of several runs, with the ratio
against micrograd measured in the same run.

Workloads: micrograd's moons model MLP(2,[16,16,1]) with the hinge loss, and the MNIST-shaped
MLP(784,[50,10]) with a squared error against a one-hot target (micrograd has no exp/log for a
cross-entropy); one SGD step per sample, float64, one thread.
"""
from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

Workload = Tuple[str, int, List[int], int]  # name, nin, nouts, samples for fast engines


def _data(nin: int, nout: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    X = rng.rand(n, nin) * (0.1 if nin > 2 else 1.0)  # keep the MNIST-shaped MSE from diverging
    y = (rng.randint(0, 2, n) * 2 - 1.0) if nout == 1 else rng.randint(0, nout, n).astype(np.float64)
    return X, y


def _values_engine(Value: Any, MLP: Any, nin: int, nouts: List[int]) -> Callable[[np.ndarray, np.ndarray], None]:
    """micrograd-style training written against a given Value/MLP pair."""
    random.seed(0)
    model = MLP(nin, nouts)
    params = model.parameters()
    nout = nouts[-1]

    def train(X: np.ndarray, y: np.ndarray) -> None:
        for xrow, t in zip(X, y):
            out = model([Value(float(v)) for v in xrow])
            if nout == 1:
                loss = (1 + -float(t) * out).relu()
            else:
                loss = sum(((o - (1.0 if i == int(t) else 0.0)) ** 2 for i, o in enumerate(out)), Value(0.0))
            model.zero_grad()
            loss.backward()
            for p in params:
                p.data -= 1e-3 * p.grad
    return train


def _program_engine(backend: str, nin: int, nouts: List[int]) -> Callable[[np.ndarray, np.ndarray], None]:
    import micrograd_c as mc
    from micrograd_c.nn import MLP

    random.seed(0)
    model = MLP(nin, nouts)
    x, y = mc.inputs(nin), mc.inputs(1)
    out = model(x)
    out = out if isinstance(out, list) else [out]
    if nouts[-1] == 1:
        loss = mc.hinge(out, y)
    else:
        onehot = mc.inputs(nouts[-1])
        loss = mc.vsum([(o - t) ** 2 for o, t in zip(out, onehot)])
        y = onehot
    prog = mc.compile(loss, inputs=x, targets=y, params=model.parameters(), outputs=out, backend=backend)
    nout = nouts[-1]

    def train(X: np.ndarray, t: np.ndarray) -> None:
        Y = t.reshape(-1, 1) if nout == 1 else np.eye(nout)[t.astype(int)]
        prog.fit(X, Y, epochs=1, lr=1e-3, batch_size=1, shuffle=False)
    return train


def _torch_engine(nin: int, nouts: List[int]) -> Optional[Callable[[np.ndarray, np.ndarray], None]]:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    layers: List[Any] = []
    sizes = [nin] + nouts
    for i in range(len(nouts)):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(nouts) - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers).double()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    nout = nouts[-1]

    def train(X: np.ndarray, y: np.ndarray) -> None:
        Xt = torch.from_numpy(X)
        for i in range(len(X)):
            out = net(Xt[i])
            if nout == 1:
                loss = torch.relu(1 - float(y[i]) * out).sum()
            else:
                target = torch.zeros(nout, dtype=torch.float64)
                target[int(y[i])] = 1.0
                loss = ((out - target) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return train


def _measure(train: Callable[[np.ndarray, np.ndarray], None], X: np.ndarray, y: np.ndarray, repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        t = time.perf_counter()
        train(X, y)
        rates.append(len(X) / (time.perf_counter() - t))
    return statistics.median(rates)


def run(repeat: int = 5, quick: bool = False) -> int:
    """Print the benchmark table; returns 0."""
    import micrograd_c as mc
    from micrograd_c.engine import Value as CValue
    from micrograd_c.nn import MLP as CMLP

    try:
        import micrograd.engine as ref_engine
        import micrograd.nn as ref_nn
    except ImportError:
        ref_engine = ref_nn = None  # type: ignore[assignment]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))

    workloads: List[Workload] = [("moons MLP(2,[16,16,1])", 2, [16, 16, 1], 100 if quick else 2000),
                                 ("MLP(784,[50,10])", 784, [50, 10], 20 if quick else 1000)]
    ref_samples = {"moons MLP(2,[16,16,1])": 20 if quick else 100, "MLP(784,[50,10])": 1 if quick else 2}
    eager_samples = {"moons MLP(2,[16,16,1])": 100 if quick else 500, "MLP(784,[50,10])": 5 if quick else 20}
    engines: List[Tuple[str, Callable[[int, List[int]], Any], Callable[[str, int], int]]] = []
    if ref_engine is not None:
        engines.append(("micrograd 0.1.0", lambda i, o: _values_engine(ref_engine.Value, ref_nn.MLP, i, o),
                        lambda w, n: ref_samples[w]))
    engines.append(("micrograd_c eager", lambda i, o: _values_engine(CValue, CMLP, i, o), lambda w, n: eager_samples[w]))
    engines.append(("micrograd_c tape", lambda i, o: _program_engine("tape", i, o), lambda w, n: n))
    try:
        mc.compiler.find_compiler()
        engines.append(("micrograd_c compiled", lambda i, o: _program_engine("c", i, o), lambda w, n: n))
    except mc.CompileError:
        print("(no C compiler: the compiled row is skipped)")
    if _torch_engine(2, [1]) is not None:
        engines.append(("PyTorch (float64, 1 thread)", lambda i, o: _torch_engine(i, o), lambda w, n: min(n, 1000)))

    results: Dict[Tuple[str, str], float] = {}
    for ename, make, count in engines:
        for wname, nin, nouts, n in workloads:
            X, y = _data(nin, nouts[-1], count(wname, n))
            train = make(nin, nouts)
            reps = max(1, repeat if not ename.startswith("micrograd 0") else min(repeat, 3))
            results[(ename, wname)] = _measure(train, X, y, reps)
            print(f"  {ename:30s} {wname:24s} {results[(ename, wname)]:12,.1f} samples/s", file=sys.stderr)

    print(f"\n{'engine':30s}" + "".join(f" {w[0]:>24s} {'ratio':>8s}" for w in workloads))
    for ename, _, _ in engines:
        row = f"{ename:30s}"
        for wname, *_ in workloads:
            r = results[(ename, wname)]
            ref = results.get(("micrograd 0.1.0", wname))
            ratio = f"{r / ref:7.0f}x" if ref else "       -"
            row += f" {r:20,.1f}/s  {ratio}"
        print(row)
    print(f"samples/s of per-sample SGD training; medians of {repeat} runs (micrograd: up to 3); "
          "ratios against micrograd in this run")
    return 0
