"""Frozen-program benchmark: MLP(784,[50,10]), softmax cross-entropy, one SGD step per image.

    python benchmarks/compile.py [--graph nn|opbyop] [--repeat 3] [--data-dir DIR]

Trains one epoch on the first 8,000 images of the real MNIST test set (../shared/data/mnist, or
--data-dir) and evaluates on the last 2,000; on random data of the same shape when MNIST is
absent. Prints graph-build, freeze and emit times, the source size, and for the tape interpreter
and every compiler and flag set found (tcc, gcc -O0/-O1/-O2, clang -O1/-O2): compile time,
training images per second (median of --repeat epochs, each from the same initial parameters)
and the accuracy after one epoch. Each compile uses a fresh cache, so compile times are real.

--graph opbyop builds every neuron op by op, as micrograd's nn.py does (120k scalar nodes);
straight-line C for it is large, so only the tape and fast compilers are measured by default.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, List, Optional, Tuple

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on our cores
import numpy as np

import micrograd_c as mc
from micrograd_c import compiler
from micrograd_c.datasets import DatasetError, load_mnist
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "mnist")

# The published straight-line compiler on this machine (its own driver, one image at a time).
REFERENCE = [("tcc", "0.5 s", 580), ("gcc -O0", "48 s", 530), ("gcc -O1", "300 s", 1450),
             ("clang -O1", ">600 s", None)]


def load(data_dir: str, ntrain: int, ntest: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        X, y = load_mnist(data_dir, "test")
        src = f"MNIST test set from {data_dir}"
    except DatasetError:
        rng = np.random.RandomState(0)
        X, y = rng.rand(ntrain + ntest, 784), rng.randint(0, 10, ntrain + ntest).astype(np.float64)
        src = "random data (MNIST not found)"
    return X[:ntrain], y[:ntrain], X[-ntest:], y[-ntest:], src


def opbyop_forward(layers: List[Tuple[List[List[Value]], List[Value], bool]], x: List[Value]) -> List[Value]:
    """micrograd's Neuron.__call__, op by op, over the given parameters."""
    for W, b, relu in layers:
        out = []
        for w, bias in zip(W, b):
            act = sum((wi * xi for wi, xi in zip(w, x)), bias)
            out.append(act.relu() if relu else act)
        x = out
    return x


def torch_rows(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray, lr: float,
               repeat: int) -> List[Tuple[str, Optional[float], float, float, float]]:
    """PyTorch float64, one thread, the same model and data, when torch is installed."""
    try:
        import torch
    except ImportError:
        print("(PyTorch not installed: no PyTorch rows)")
        return []
    torch.set_num_threads(1)
    out = []
    Xt, Yt = torch.from_numpy(Xtr), torch.from_numpy(ytr).long()
    for bs in (1, 32):
        rates, loss_v = [], 0.0
        for _ in range(repeat):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(784, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10)).double()
            opt = torch.optim.SGD(net.parameters(), lr=lr * (1 if bs == 1 else 4))
            perm = torch.randperm(len(Xt))
            t, total = time.perf_counter(), 0.0
            for b in range(0, len(Xt), bs):
                idx = perm[b:b + bs]
                loss = torch.nn.functional.cross_entropy(net(Xt[idx]), Yt[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss) * len(idx)
            rates.append(len(Xt) / (time.perf_counter() - t))
            loss_v = total / len(Xt)
        with torch.no_grad():
            acc = float((net(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean())
        out.append((f"PyTorch {torch.__version__.split('+')[0]}, batch {bs}, 1 thread", None,
                    statistics.median(rates), acc, loss_v))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", choices=["nn", "opbyop"], default="nn")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", default=DEFAULT_MNIST)
    ap.add_argument("--train", type=int, default=8000)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--compilers", default="tcc,gcc,clang")
    ap.add_argument("--levels", default=None, help="comma-separated -O levels (default: per graph)")
    ap.add_argument("--no-native", dest="native", action="store_false", help="omit -march=native")
    ap.add_argument("--no-raise", dest="raise_loops", action="store_false", help="scalar programs (issue 4's)")
    args = ap.parse_args()

    Xtr, ytr, Xte, yte, src = load(args.data_dir, args.train, 2000)
    print(f"data: {src}; train {len(Xtr)}, evaluate {len(Xte)}; python {sys.version.split()[0]}")

    t0 = time.perf_counter()
    random.seed(0)
    model = MLP(784, [50, 10])
    x, y = mc.inputs(784), mc.inputs(1)
    if args.graph == "nn":
        logits = model(x)
    else:
        layers = [([n.w for n in layer.neurons], [n.b for n in layer.neurons], i == 0)
                  for i, layer in enumerate(model.layers)]
        logits = opbyop_forward(layers, x)
    loss = mc.cross_entropy(logits, y[0])
    build_s = time.perf_counter() - t0
    params = model.parameters()

    t0 = time.perf_counter()
    base = mc.compile(loss, inputs=x, targets=y, params=params, outputs=logits, backend="tape",
                      raise_loops=args.raise_loops)
    freeze_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    source = base.c_source()
    emit_s = time.perf_counter() - t0
    print(f"graph ({args.graph}): {mc.graph_len()} values, build {build_s:.3f} s; freeze {freeze_s * 1e3:.1f} ms "
          f"({base.info['ninstr']} instructions, {base.info['nslots']} slots, {base.info['nraised']} raised layers); emit {emit_s * 1e3:.1f} ms, "
          f"source {len(source.encode()) / 1024:.0f} KB")
    init = base.parameters.copy()

    def run(prog: Any, batch: int = 1, threads: int = 1) -> Tuple[float, float, float]:
        rates, loss_v = [], 0.0
        for _ in range(args.repeat):
            prog.parameters[:] = init
            t = time.perf_counter()
            loss_v = prog.fit(Xtr, ytr, epochs=1, lr=args.lr * (1 if batch == 1 else 4), batch_size=batch,
                              shuffle=True, seed=0, threads=threads)[0]
            rates.append(len(Xtr) / (time.perf_counter() - t))
        acc = float(np.mean(np.argmax(prog.predict(Xte), axis=1) == yte))
        return statistics.median(rates), acc, loss_v

    rows: List[Tuple[str, Optional[float], float, float, float]] = []
    rate, acc, lv = run(base)
    rows.append(("tape (interpreter)", None, rate, acc, lv))
    for bs, th in ((32, 1), (32, 2)):
        rate, acc, lv = run(base, bs, th)
        rows.append((f"tape, batch {bs}, {th} thread(s)", None, rate, acc, lv))

    levels = args.levels.split(",") if args.levels else ["0", "1", "2"]
    for name in args.compilers.split(","):
        if not shutil.which(name):
            continue
        try:
            tc = compiler.find_compiler(name)
        except mc.CompileError:
            continue
        for lvl in (["0"] if name == "tcc" else levels):
            flags = ([f"-O{lvl}", "-ffp-contract=off"] + (["-march=native"] if args.native else [])) if name != "tcc" else []
            cache = tempfile.mkdtemp(prefix="mg-bench-")
            try:
                t0 = time.perf_counter()
                prog = mc.compile(loss, inputs=x, targets=y, params=params, outputs=logits, backend="c",
                                  cc=name, flags=flags, cache=cache, raise_loops=args.raise_loops)
                compile_s = time.perf_counter() - t0
                rate, acc, lv = run(prog)
                rows.append((f"{tc.name} {' '.join(flags)}".strip(), compile_s, rate, acc, lv))
                if name == "gcc" and lvl == "2":  # the default program: batches and threads
                    for bs, th in ((32, 1), (32, 2)):
                        rate, acc, lv = run(prog, bs, th)
                        rows.append((f"  same, batch {bs}, {th} thread(s)", None, rate, acc, lv))
                    if args.raise_loops:  # the float32 storage option, one thread
                        t0 = time.perf_counter()
                        p32 = mc.compile(loss, inputs=x, targets=y, params=params, outputs=logits, backend="c",
                                         cc=name, flags=flags, cache=cache, float32=True)
                        c32 = time.perf_counter() - t0
                        for bs in (1, 32):
                            rate, acc, lv = run(p32, bs, 1)
                            rows.append((f"  float32 storage, batch {bs}", c32 if bs == 1 else None, rate, acc, lv))
            except mc.CompileError as e:
                print(f"{name} -O{lvl}: {str(e).splitlines()[0]}")
            finally:
                shutil.rmtree(cache, ignore_errors=True)

    rows.extend(torch_rows(Xtr, ytr, Xte, yte, args.lr, args.repeat))
    print(f"\n{'backend':34s} {'compile':>9s} {'images/s':>10s} {'accuracy':>9s} {'epoch loss':>11s}")
    for name, cs, rate, acc, lv in rows:
        c = "-" if cs is None else f"{cs:.2f} s"
        print(f"{name:34s} {c:>9s} {rate:10.0f} {acc:9.4f} {lv:11.5f}")
    print(f"(images/s: median of {args.repeat} one-epoch runs, float64; batch size 1 unless stated; "
          f"batch 32 uses lr x4)")
    print("\npublished straight-line compiler on this machine, for reference:")
    for name, cs, rate in REFERENCE:
        print(f"  {name:32s} {cs:>9s} {'did not finish' if rate is None else rate:>10}")


if __name__ == "__main__":
    main()
