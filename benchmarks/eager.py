"""Eager-mode benchmarks against micrograd 0.1.0, measured in the same run.

    python benchmarks/eager.py [--repeat 5] [--ref-steps 10] [--full]

1. micrograd's moons demo (MLP(2,[16,16,1]), 100 points, hinge loss + 1e-4 L2, full-batch SGD),
   written exactly as the demo notebook writes it; only the import differs.
2. The same demo with micrograd's nn.py classes copied verbatim (every w*x and + is a Value op).
3. MLP(784,[50,10]) forward + backward on one 784-pixel input.

micrograd needs about 2 s per demo step, so by default it runs --ref-steps steps and its time
is scaled to 100 steps (per-step cost is constant: each step builds the same graph); --full runs
all 100. Times are medians of --repeat runs; ratios are micrograd / micrograd_c.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from micrograd_c.datasets import make_moons

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on our cores
import numpy as np

sys.setrecursionlimit(100_000)  # micrograd's recursive topological sort needs it for MNIST


def micrograd_style_nn(Value: Any) -> SimpleNamespace:
    """micrograd 0.1.0's nn.py, verbatim but for the Value class it is given."""

    class Module:
        def zero_grad(self):
            for p in self.parameters():
                p.grad = 0

        def parameters(self):
            return []

    class Neuron(Module):
        def __init__(self, nin, nonlin=True):
            self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
            self.b = Value(0)
            self.nonlin = nonlin

        def __call__(self, x):
            act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
            return act.relu() if self.nonlin else act

        def parameters(self):
            return self.w + [self.b]

    class Layer(Module):
        def __init__(self, nin, nout, **kwargs):
            self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

        def __call__(self, x):
            out = [n(x) for n in self.neurons]
            return out[0] if len(out) == 1 else out

        def parameters(self):
            return [p for n in self.neurons for p in n.parameters()]

    class MLP(Module):
        def __init__(self, nin, nouts):
            sz = [nin] + nouts
            self.layers = [
                Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1) for i in range(len(nouts))
            ]

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

        def parameters(self):
            return [p for layer in self.layers for p in layer.parameters()]

    return SimpleNamespace(MLP=MLP)


def moons_demo(Value: Any, MLP: Any, steps: int) -> tuple[float, float]:
    """The demo notebook's training loop; returns (final loss, final accuracy)."""
    np.random.seed(1337)
    random.seed(1337)
    X, y = make_moons(100, 0.1, seed=1337)  # scikit-learn's algorithm, labels -1/+1
    model = MLP(2, [16, 16, 1])

    def loss(batch_size=None):
        if batch_size is None:
            Xb, yb = X, y
        else:
            ri = np.random.permutation(X.shape[0])[:batch_size]
            Xb, yb = X[ri], y[ri]
        inputs = [list(map(Value, xrow)) for xrow in Xb]
        scores = list(map(model, inputs))
        losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(yb, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        alpha = 1e-4
        reg_loss = alpha * sum(p * p for p in model.parameters())
        total_loss = data_loss + reg_loss
        accuracy = [(yi > 0) == (scorei.data > 0) for yi, scorei in zip(yb, scores)]
        return total_loss, sum(accuracy) / len(accuracy)

    total_loss, acc = None, 0.0
    for k in range(steps):
        total_loss, acc = loss()
        model.zero_grad()
        total_loss.backward()
        learning_rate = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= learning_rate * p.grad
    return float(total_loss.data), float(acc)


def mnist_sample(Value: Any, MLP: Any, samples: int) -> float:
    """MLP(784,[50,10]) forward + backward of a squared error against a one-hot target."""
    random.seed(0)
    rng = np.random.RandomState(0)
    model = MLP(784, [50, 10])
    for _ in range(samples):
        x = [Value(float(v)) for v in rng.rand(784)]
        target = rng.randint(10)
        out = model(x)
        loss = sum(
            ((o - (1.0 if i == target else 0.0)) ** 2 for i, o in enumerate(out)), Value(0.0)
        )
        model.zero_grad()
        loss.backward()
    return float(loss.data)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=5, help="runs per micrograd_c figure (median)")
    ap.add_argument("--ref-repeat", type=int, default=1, help="runs per micrograd figure (median)")
    ap.add_argument(
        "--ref-steps", type=int, default=10, help="demo steps micrograd runs (scaled to 100)"
    )
    ap.add_argument("--full", action="store_true", help="run micrograd for all 100 steps")
    ap.add_argument("--mnist-samples", type=int, default=3)
    args = ap.parse_args()

    import micrograd
    import micrograd.engine
    import micrograd.nn

    import micrograd_c
    from micrograd_c.engine import Value as CValue
    from micrograd_c.nn import MLP as CMLP

    ref_steps = 100 if args.full else args.ref_steps
    rows: list[tuple[str, float, float]] = []
    print(
        f"micrograd {getattr(micrograd, '__version__', '0.1.0')} "
        f"vs micrograd_c {micrograd_c.__version__}; "
        f"python {sys.version.split()[0]}; pid {os.getpid()}"
    )

    # 1. the demo, nn classes as shipped
    ref_t, ref_res = timed(
        lambda: moons_demo(micrograd.engine.Value, micrograd.nn.MLP, ref_steps), args.ref_repeat
    )
    ref_100 = ref_t * 100 / ref_steps
    our_t, our_res = timed(lambda: moons_demo(CValue, CMLP, 100), args.repeat)
    rows.append(("moons demo, 100 steps (nn classes)", ref_100, our_t))
    if args.full:
        print(
            f"  final loss/accuracy: micrograd {ref_res[0]:.12g}/{ref_res[1]:.2f}, "
            f"micrograd_c {our_res[0]:.12g}/{our_res[1]:.2f}"
        )
    else:
        print(f"  micrograd_c final loss {our_res[0]:.6g}, accuracy {our_res[1]:.2f}")

    # 2. the demo with a Neuron written op by op
    ref_nn, our_nn = micrograd_style_nn(micrograd.engine.Value), micrograd_style_nn(CValue)
    ref_t2, _ = timed(
        lambda: moons_demo(micrograd.engine.Value, ref_nn.MLP, ref_steps), args.ref_repeat
    )
    our_t2, our_res2 = timed(lambda: moons_demo(CValue, our_nn.MLP, 100), args.repeat)
    rows.append(("moons demo, 100 steps (op-by-op Neuron)", ref_t2 * 100 / ref_steps, our_t2))

    # 3. MNIST-shaped forward + backward per sample
    n = args.mnist_samples
    ref_t3, _ = timed(
        lambda: mnist_sample(micrograd.engine.Value, micrograd.nn.MLP, n), args.ref_repeat
    )
    our_t3, _ = timed(lambda: mnist_sample(CValue, CMLP, n * 20), args.repeat)
    rows.append(("MLP(784,[50,10]) fwd+bwd, s/sample", ref_t3 / n, our_t3 / (n * 20)))

    print(f"\n{'benchmark':44s} {'micrograd':>12s} {'micrograd_c':>12s} {'ratio':>8s}")
    for name, ref, ours in rows:
        print(f"{name:44s} {ref:11.4f}s {ours:11.4f}s {ref / ours:7.1f}x")
    scale = "" if args.full else f" (micrograd: {ref_steps} steps, scaled to 100)"
    print(f"medians of {args.repeat} micrograd_c runs{scale}")

    # memory per graph value on the eager path, each in a fresh process so that nothing from the
    # runs above (graph blocks on the free list, Python caches) hides the growth
    for label, opbyop in (("op-by-op Neuron", True), ("C nn classes", False)):
        out = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, str(int(opbyop))],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        print(
            f"memory, one MNIST-shaped sample, {label}: {out.stdout.strip() or out.stderr.strip()}"
        )


MEMORY_PROBE = """
import gc, random, resource, sys
import numpy as np
import eager, micrograd_c
from micrograd_c.engine import Value
from micrograd_c.nn import MLP

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

opbyop = sys.argv[1] == "1"
random.seed(0)
model = (eager.micrograd_style_nn(Value).MLP if opbyop else MLP)(784, [50, 10])
x = [Value(float(v)) for v in np.random.RandomState(1).rand(784)]
gc.collect()
n0, b0, r0 = micrograd_c.graph_len(), micrograd_c.graph_bytes(), rss()
out = model(x)
loss = sum(out, Value(0.0))
loss.backward()
n = micrograd_c.graph_len() - n0
print(f"{n} graph values; {(micrograd_c.graph_bytes() - b0) / n:.1f} graph bytes/value "
      f"(64-byte nodes + operand arrays + backward working memory); "
      f"{(rss() - r0) / n:.1f} bytes/value of process RSS (peak)")
"""

if __name__ == "__main__":
    main()
