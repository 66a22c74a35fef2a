"""Model families written op by op, compiled by micrograd_c, against PyTorch and hand-written C.

    python benchmarks/models.py [--families mlp,cnn,...] [--samples 2000] [--repeat 5]
                                [--batch 1,32]

For every family of ``zoo.py`` (MLP, CNNs, Elman RNN, GRU, self-attention), written as a
micrograd user writes them (lists of Values, Python loops), it prints in one run:

- the graph: values, statements after folding chains, loop nests forward/backward, sequential
  loops; the time to build it in Python;
- freeze + reroll + emit + C compile time (gcc by default, a fresh cache), and the C source size;
- training throughput at each batch size (images/s, one SGD step per batch, one thread, medians
  of --repeat one-epoch runs, the systems interleaved within each repeat): the tape interpreter,
  the compiled program, PyTorch eager float64 (pinned to one thread) and, for `cnn`, `cnn48`
  and `elman`, the obvious hand-written C (benchmarks/c/, built with micrograd_c's own compiler
  flags);
- ratios measured in the same run, and the first epoch's mean loss of every system (they start
  from the same parameters where the layouts agree, so the losses agree).

Data: the first --samples images of the MNIST test set (../shared/data/mnist or --data-dir),
random images when it is absent.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo  # noqa: E402

import micrograd_c as mc  # noqa: E402
from micrograd_c import compiler  # noqa: E402
from micrograd_c.app.bench import cpu_model  # noqa: E402
from micrograd_c.datasets import DatasetError, load_mnist  # noqa: E402

DEFAULT_MNIST = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "mnist")
# family -> the hand-written C (benchmarks/c/), its function stem and the defines that shape it
HAND = {
    "cnn": ("cnn_hand.c", "cnn", []),
    "cnn48": ("cnn_hand.c", "cnn", ["-DCH=48", "-DPAD=1"]),
    "elman": ("elman_hand.c", "elman", []),
}


def load_data(data_dir: str, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    try:
        X, y = load_mnist(data_dir, "test")
        return (
            np.ascontiguousarray(X[:n]),
            np.ascontiguousarray(y[:n].astype(np.float64)),
            "MNIST test set",
        )
    except DatasetError:
        rng = np.random.RandomState(0)
        return (
            rng.rand(n, 784),
            rng.randint(0, 10, n).astype(np.float64),
            "random images (MNIST not found)",
        )


# ---- PyTorch references ------------------------------------------------------------------------


def torch_model(name: str, params: np.ndarray) -> Any:
    """The family in idiomatic PyTorch, float64, starting from micrograd_c's parameters where the
    layouts agree (mlp, cnn, elman: copied; others: PyTorch's own init)."""
    import torch
    from torch import nn

    spec = zoo.FAMILIES[name].torch_spec
    kind = spec["kind"]
    if kind == "mlp":
        net = nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))
        prep: Callable[[Any], Any] = lambda x: x  # noqa: E731
    elif kind == "cnn":
        layers: list[Any] = []
        cin, size = 1, 28
        for c, k, s, p in spec["convs"]:
            layers += [nn.Conv2d(cin, c, k, stride=s, padding=p), nn.ReLU()]
            cin, size = c, (size + 2 * p - k) // s + 1
        if spec["pool"] == "max":
            layers.append(nn.MaxPool2d(2))
        elif spec["pool"] == "avg":
            layers.append(nn.AvgPool2d(2))
        size //= 2
        layers += [nn.Flatten(), nn.Linear(cin * size * size, 10)]
        net = nn.Sequential(*layers)
        prep = lambda x: x.view(-1, 1, 28, 28)  # noqa: E731
    elif kind in ("elman", "gru"):

        class Rec(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = (nn.RNN if kind == "elman" else nn.GRU)(
                    28, spec["hidden"], batch_first=True
                )
                self.out = nn.Linear(spec["hidden"], 10)

            def forward(self, x: Any) -> Any:
                return self.out(self.rnn(x)[0][:, -1])

        net = Rec()
        prep = lambda x: x.view(-1, 28, 28)  # noqa: E731
    else:
        tokens, dim = spec["tokens"], spec["dim"]

        class Attention(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Linear(784 // tokens, dim)
                self.q = nn.Linear(dim, dim, bias=False)
                self.k = nn.Linear(dim, dim, bias=False)
                self.v = nn.Linear(dim, dim, bias=False)
                self.out = nn.Linear(dim, 10)

            def forward(self, x: Any) -> Any:
                e = self.embed(x.view(-1, tokens, 784 // tokens))
                a = torch.softmax(self.q(e) @ self.k(e).transpose(1, 2) / math.sqrt(dim), dim=-1)
                return self.out((a @ self.v(e) + e).mean(1))

        net = Attention()
        prep = lambda x: x  # noqa: E731
    net = net.double()
    with torch.no_grad():
        flat = torch.from_numpy(params.copy())
        if kind == "mlp":
            order = [net[0].weight, net[0].bias, net[2].weight, net[2].bias]
        elif kind == "cnn" and len(spec["convs"]) == 1:
            order = [net[0].weight, net[0].bias, net[-1].weight, net[-1].bias]
        elif kind == "elman":
            net.rnn.bias_hh_l0.zero_()
            order = [
                net.rnn.weight_ih_l0,
                net.rnn.weight_hh_l0,
                net.rnn.bias_ih_l0,
                net.out.weight,
                net.out.bias,
            ]
        else:
            order = []
        if order and sum(p.numel() for p in order) == flat.numel():
            at = 0
            for p in order:
                p.copy_(flat[at : at + p.numel()].view_as(p))
                at += p.numel()
    return net, prep


def torch_epoch(net: Any, prep: Any, X: Any, Y: Any, lr: float, batch: int) -> float:
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=lr)
    total = 0.0
    for b in range(0, len(X), batch):
        out = net(prep(X[b : b + batch]))
        loss = torch.nn.functional.cross_entropy(out, Y[b : b + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(out)
    return total / len(X)


# ---- hand-written C ----------------------------------------------------------------------------


def build_hand(name: str, tc: Any, flags: list[str], work: str) -> Any:
    src, stem, defines = HAND[name]
    out = os.path.join(work, f"{name}_hand.so")
    subprocess.run(
        tc.command
        + list(flags)
        + defines
        + ["-fPIC", "-shared", "-o", out, os.path.join(HERE, "c", src), "-lm"],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(out)
    fn = getattr(lib, f"{stem}_train_epoch")
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_double]
    getattr(lib, f"{stem}_nparams").restype = ctypes.c_size_t
    return lib, fn, getattr(lib, f"{stem}_nparams")()


# ---- the systems: one epoch at a given batch size, from the same starting parameters ----------


def fit_runner(
    prog: Any, init: np.ndarray, X: np.ndarray, Y: np.ndarray, lr: float
) -> Callable[[int], float]:
    """A micrograd_c program (tape or compiled): reset to ``init``, one epoch of ``fit``."""

    def run(batch: int) -> float:
        prog.parameters[:] = init
        return prog.fit(X, Y, epochs=1, lr=lr, batch_size=batch, shuffle=False)[0]

    return run


def torch_runner(
    net: Any, prep: Any, state: dict[str, Any], Xt: Any, Yt: Any, lr: float
) -> Callable[[int], float]:
    """The PyTorch model: reset to ``state``, one epoch of SGD."""

    def run(batch: int) -> float:
        net.load_state_dict(state)
        return torch_epoch(net, prep, Xt, Yt, lr, batch)

    return run


def hand_runner(
    fn: Any, init: np.ndarray, X: np.ndarray, Y: np.ndarray, lr: float
) -> Callable[[int], float]:
    """The hand-written C (batch 1 only, NaN otherwise): reset to ``init``, one epoch."""
    hp = np.empty_like(init)
    order = np.arange(len(X), dtype=np.uintp)

    def run(batch: int) -> float:
        if batch != 1:
            return float("nan")
        hp[:] = init
        return fn(
            hp.ctypes.data,
            X.ctypes.data,
            Y.ctypes.data,
            order.ctypes.data,
            len(X),
            lr,
        )

    return run


# ---- the benchmark -----------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--families", default=",".join(zoo.FAMILIES), help="comma-separated (default: all)"
    )
    ap.add_argument("--samples", type=int, default=2000, help="MNIST images (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds, medians (default 5)")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes (default 1)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD step (default 0.01)")
    ap.add_argument(
        "--data-dir", default=DEFAULT_MNIST, help=f"MNIST IDX files (default {DEFAULT_MNIST})"
    )
    ap.add_argument("--cc", default="gcc", help="the C compiler (default gcc)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    X, Y, src = load_data(args.data_dir, args.samples)
    batches = [int(b) for b in args.batch.split(",")]
    tc = compiler.find_compiler(args.cc)
    flags = compiler.default_flags(tc)
    try:
        import torch

        torch.set_num_threads(1)
        tver = torch.__version__.split("+")[0]
    except ImportError:
        torch, tver = None, None
    if args.no_torch:
        torch = None
    print(
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; python {sys.version.split()[0]}, "
        f"{tc.version}; flags {' '.join(flags)}; PyTorch {tver or 'not installed'}; tape "
        f"interpreter kernels: {compiler.kernel_isa()}"
    )
    print(
        f"data: {src}, {len(X)} samples; images/s: medians of {args.repeat} epochs, one thread, "
        f"systems interleaved\n"
    )
    work = tempfile.mkdtemp(prefix="mg-models-")
    summary: list[dict[str, Any]] = []
    try:
        for name in args.families.split(","):
            fam = zoo.FAMILIES[name]
            random.seed(0)
            t0 = time.perf_counter()
            x, y = mc.inputs(784), mc.inputs(1)
            logits, params = fam.build(x)
            loss = mc.cross_entropy(logits, y[0])
            build_s = time.perf_counter() - t0
            values = mc.graph_len()
            t0 = time.perf_counter()
            tape = mc.compile(
                loss, inputs=x, targets=y, params=params, outputs=logits, backend="tape"
            )
            freeze_s = time.perf_counter() - t0
            cache = tempfile.mkdtemp(dir=work)
            t0 = time.perf_counter()
            comp = mc.compile(
                loss,
                inputs=x,
                targets=y,
                params=params,
                outputs=logits,
                backend="c",
                cc=args.cc,
                cache=cache,
            )
            total_s = time.perf_counter() - t0
            info = comp.info
            init = tape.parameters.copy()
            systems: dict[str, Callable[[int], float]] = {}
            systems["tape"] = fit_runner(tape, init, X, Y, args.lr)
            systems["compiled"] = fit_runner(comp, init, X, Y, args.lr)
            if torch is not None:
                net, prep = torch_model(name, init)
                state = {k: v.clone() for k, v in net.state_dict().items()}
                Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y).long()
                systems["PyTorch"] = torch_runner(net, prep, state, Xt, Yt, args.lr)
            if name in HAND:
                lib, fn, nph = build_hand(name, tc, flags, work)
                if nph != len(init):
                    raise SystemExit(
                        f"{name}: the hand-written C has {nph} parameters, the model {len(init)}"
                    )
                systems["hand C"] = hand_runner(fn, init, X, Y, args.lr)
            print(f"{name}: {fam.description}")
            print(
                f"  {values:,} values (built in {build_s:.2f} s) -> "
                f"{info['statements']:,} statements -> "
                f"{info['forward_nests']} forward + {info['backward_nests']} backward loop nests, "
                f"{info['loops']} sequential loop(s), {info['packed']:,} packed parameters"
            )
            print(
                f"  freeze {freeze_s * 1e3:.0f} ms; "
                f"freeze + emit + {tc.name} compile {total_s:.2f} s "
                f"(compile {info['compile_seconds']:.2f} s); "
                f"C source {info['source_bytes'] / 1024:.1f} KB"
            )
            for batch in batches:
                rates: dict[str, list[float]] = {k: [] for k in systems}
                losses: dict[str, float] = {}
                for _ in range(args.repeat):
                    for k, system in systems.items():
                        t1 = time.perf_counter()
                        lv = system(batch)
                        dt = time.perf_counter() - t1
                        if not math.isnan(lv):
                            rates[k].append(len(X) / dt)
                            losses[k] = lv
                med = {k: statistics.median(v) for k, v in rates.items() if v}
                row = "  ".join(f"{k} {v:,.0f}" for k, v in med.items())
                print(f"  batch {batch:3d}: images/s  {row}")
                ratios = []
                if "PyTorch" in med:
                    ratios.append(f"compiled/PyTorch {med['compiled'] / med['PyTorch']:.1f}x")
                    ratios.append(f"tape/PyTorch {med['tape'] / med['PyTorch']:.1f}x")
                if "hand C" in med:
                    ratios.append(f"compiled/hand C {med['compiled'] / med['hand C']:.2f}x")
                print(
                    f"             {'  '.join(ratios)};  first-epoch loss "
                    + " ".join(f"{k} {v:.4f}" for k, v in losses.items())
                )
                summary.append(
                    {
                        "family": name,
                        "batch": batch,
                        "values": values,
                        "source_kb": info["source_bytes"] / 1024,
                        "total_s": total_s,
                        **{k: med.get(k) for k in systems},
                    }
                )
            print()
            del tape, comp, loss, logits, params, x, y
        print("summary (images/s; compile = freeze + emit + cc):")
        print(
            f"{'family':10s} {'batch':>5s} {'values':>9s} {'C KB':>6s} {'compile':>8s} "
            f"{'tape':>9s} {'compiled':>9s} {'PyTorch':>9s} {'hand C':>8s} "
            f"{'c/torch':>8s} {'c/hand':>7s}"
        )

        def cell(value: float | None, width: int, spec: str, unit: str = "") -> str:
            """``value`` formatted, or a dash where the system was not run."""
            return f"{format(value, spec)}{unit}".rjust(width) if value else "-".rjust(width)

        for r in summary:
            pt, hc = r.get("PyTorch"), r.get("hand C")
            print(
                f"{r['family']:10s} {r['batch']:5d} {r['values']:9,d} {r['source_kb']:6.1f} "
                f"{r['total_s']:7.2f}s {r['tape']:9,.0f} {r['compiled']:9,.0f} "
                f"{cell(pt, 9, ',.0f')} {cell(hc, 8, ',.0f')} "
                f"{cell(r['compiled'] / pt if pt else None, 8, '.1f', 'x')} "
                f"{cell(r['compiled'] / hc if hc else None, 7, '.2f', 'x')}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
