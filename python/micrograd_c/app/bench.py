"""``micrograd-c bench``: one table comparing micrograd, micrograd_c (eager, tape, compiled),
PyTorch and JAX on per-sample SGD, each figure a median of several runs, with ratios against a
reference measured in the same run (micrograd when it is installed).

Workloads: micrograd's moons model MLP(2,[16,16,1]) with the hinge loss, and the MNIST-shaped
MLP(784,[50,10]) with a squared error against a one-hot target (micrograd has no exp/log for a
cross-entropy); one SGD step per sample, float64, one thread. Every engine starts from the same
parameters (micrograd_c's MLP under ``random.seed(0)``), so they all train the same model.

References that are not installed are listed as skipped with the command that installs them
(all of them: ``pip install 'micrograd-c[bench]'``).
"""

from __future__ import annotations

import importlib
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Workload = tuple[str, int, list[int], int]  # name, nin, nouts, samples for fast engines

#: The environment references are pinned with: one thread each. Thread pools read these when
#: they load, so ``micrograd-c bench`` restarts itself with them (and XLA reads its flags when
#: jax is imported).
PIN_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu",
}

LR = 1e-3

#: How to get each optional reference.
INSTALL = {
    "micrograd": "pip install micrograd==0.1.0",
    "PyTorch": "pip install torch==2.13.0",
    "JAX": "pip install jax jaxlib",
}


class Engine:
    """One engine on one workload: ``train(X, y)`` runs per-sample SGD over the rows; ``prepare``
    does untimed one-off work for the shapes (JIT compilation); ``state()`` returns the
    parameters as PyTorch-shaped arrays (``layers.{i}.weight`` (out, in), ``layers.{i}.bias``)."""

    def __init__(
        self,
        train: Callable[[np.ndarray, np.ndarray], None],
        state: Callable[[], dict[str, np.ndarray]],
        prepare: Callable[[np.ndarray, np.ndarray], None] | None = None,
    ) -> None:
        self.train = train
        self.state = state
        self.prepare = prepare or (lambda X, y: None)


def _data(nin: int, nout: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    X = rng.rand(n, nin) * (0.1 if nin > 2 else 1.0)  # keep the MNIST-shaped MSE from diverging
    y = (
        (rng.randint(0, 2, n) * 2 - 1.0)
        if nout == 1
        else rng.randint(0, nout, n).astype(np.float64)
    )
    return X, y


def initial_state(nin: int, nouts: list[int]) -> dict[str, np.ndarray]:
    """The parameters every engine starts from: micrograd_c's (= micrograd's) init, seed 0."""
    from micrograd_c.nn import MLP

    random.seed(0)
    return MLP(nin, nouts).state_dict()


def _values_engine(Value: Any, MLP: Any, nin: int, nouts: list[int]) -> Engine:
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
                loss = sum(
                    ((o - (1.0 if i == int(t) else 0.0)) ** 2 for i, o in enumerate(out)),
                    Value(0.0),
                )
            model.zero_grad()
            loss.backward()
            for p in params:
                p.data -= LR * p.grad

    def state() -> dict[str, np.ndarray]:
        flat = np.array([p.data for p in params])
        sizes = [nin] + nouts
        out, k = {}, 0
        for i in range(len(nouts)):
            block = flat[k : k + sizes[i + 1] * (sizes[i] + 1)].reshape(sizes[i + 1], sizes[i] + 1)
            out[f"layers.{i}.weight"], out[f"layers.{i}.bias"] = (
                block[:, : sizes[i]],
                block[:, sizes[i]],
            )
            k += block.size
        return out

    return Engine(train, state)


def _program_engine(backend: str, nin: int, nouts: list[int]) -> Engine:
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
    prog = mc.compile(
        loss, inputs=x, targets=y, params=model.parameters(), outputs=out, backend=backend
    )
    nout = nouts[-1]

    def train(X: np.ndarray, t: np.ndarray) -> None:
        Y = t.reshape(-1, 1) if nout == 1 else np.eye(nout)[t.astype(int)]
        prog.fit(X, Y, epochs=1, lr=LR, batch_size=1, shuffle=False)

    def state() -> dict[str, np.ndarray]:
        prog.write_back()
        return model.state_dict()

    return Engine(train, state)


def _torch_engine(nin: int, nouts: list[int]) -> Engine:
    import torch

    torch.set_num_threads(1)
    layers: list[Any] = []
    sizes = [nin] + nouts
    for i in range(len(nouts)):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(nouts) - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers).double()
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    init = initial_state(nin, nouts)
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(torch.from_numpy(init[f"layers.{i}.weight"]))
            lin.bias.copy_(torch.from_numpy(init[f"layers.{i}.bias"]))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
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
            loss_any: Any = loss  # torch's stubs leave backward() untyped when torch is installed
            loss_any.backward()
            opt.step()

    def state() -> dict[str, np.ndarray]:
        return {
            k: v
            for i, lin in enumerate(linears)
            for k, v in (
                (f"layers.{i}.weight", lin.weight.detach().numpy().copy()),
                (f"layers.{i}.bias", lin.bias.detach().numpy().copy()),
            )
        }

    return Engine(train, state)


def _import_jax() -> Any:
    for k in ("XLA_FLAGS", "JAX_PLATFORMS"):  # read once, when jax is first imported
        os.environ.setdefault(k, PIN_ENV[k])
    # through importlib: typed as Any whether or not jax (whose config is untyped) is installed
    jax: Any = importlib.import_module("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def _jax_engine(nin: int, nouts: list[int], scan: bool) -> Engine:
    """JAX, float64, one thread: ``jax.jit`` of one SGD step called per sample, or (``scan``) one
    jitted ``lax.scan`` of that step over the whole epoch."""
    jax = _import_jax()
    import jax.numpy as jnp

    init = initial_state(nin, nouts)
    params: list[Any] = [
        [jnp.asarray(init[f"layers.{i}.weight"]), jnp.asarray(init[f"layers.{i}.bias"])]
        for i in range(len(nouts))
    ]
    nout = nouts[-1]

    def loss_fn(ps: Any, x: Any, t: Any) -> Any:
        h = x
        for i, (w, b) in enumerate(ps):
            h = w @ h + b
            if i < len(ps) - 1:
                h = jax.nn.relu(h)
        if nout == 1:
            return jax.nn.relu(1.0 - t * h[0])
        return jnp.sum((h - jax.nn.one_hot(t.astype(jnp.int32), nout, dtype=h.dtype)) ** 2)

    def sgd(ps: Any, x: Any, t: Any) -> Any:
        g = jax.grad(loss_fn)(ps, x, t)
        return jax.tree_util.tree_map(lambda p, gp: p - LR * gp, ps, g)

    def epoch(ps: Any, X: Any, T: Any) -> Any:
        return jax.lax.scan(lambda p, xt: (sgd(p, xt[0], xt[1]), None), ps, (X, T))[0]

    box = {"params": params}
    compiled: dict[Any, Any] = {}

    def prepare(X: np.ndarray, y: np.ndarray) -> None:  # ahead-of-time compilation, untimed
        if scan:
            compiled[X.shape] = (
                jax.jit(epoch).lower(box["params"], jnp.asarray(X), jnp.asarray(y)).compile()
            )
        else:
            compiled["step"] = (
                jax.jit(sgd).lower(box["params"], jnp.asarray(X[0]), jnp.asarray(y[0])).compile()
            )

    def train(X: np.ndarray, y: np.ndarray) -> None:
        if scan:
            if X.shape not in compiled:
                prepare(X, y)
            box["params"] = jax.block_until_ready(
                compiled[X.shape](box["params"], jnp.asarray(X), jnp.asarray(y))
            )
            return
        if "step" not in compiled:
            prepare(X, y)
        step, ps = compiled["step"], box["params"]
        for xi, yi in zip(X, y):  # numpy rows: slicing a jax array would dispatch an op per row
            ps = step(ps, xi, yi)
        box["params"] = jax.block_until_ready(ps)

    def state() -> dict[str, np.ndarray]:
        return {
            k: np.asarray(v)
            for i, (w, b) in enumerate(box["params"])
            for k, v in ((f"layers.{i}.weight", w), (f"layers.{i}.bias", b))
        }

    return Engine(train, state, prepare)


def _measure(engine: Engine, X: np.ndarray, y: np.ndarray, repeat: int) -> float:
    engine.prepare(X, y)
    rates = []
    for _ in range(repeat):
        t = time.perf_counter()
        engine.train(X, y)
        rates.append(len(X) / (time.perf_counter() - t))
    return statistics.median(rates)


#: AMD's CPU families by core generation (a virtual machine may name only "AMD EPYC").
AMD_FAMILIES = {23: "Zen/Zen+/Zen 2", 25: "Zen 3/Zen 4", 26: "Zen 5"}


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name from /proc/cpuinfo, with its family/model numbers (a virtual machine
    may say only "AMD EPYC"; AMD's family then names the core generation) and clock, and its
    flags; elsewhere the platform's processor name and no flags."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    key, value = (x.strip() for x in line.split(":", 1))
                    fields.setdefault(key, value)
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    if "cpu family" in fields and "model" in fields:
        fam = fields["cpu family"]
        model += f" (family {fam}, model {fields['model']}, stepping {fields.get('stepping', '?')}"
        gen = AMD_FAMILIES.get(int(fam)) if fam.isdigit() and "AMD" in model else None
        if gen == "Zen 3/Zen 4":
            gen = "Zen 4" if "avx512f" in flags else "Zen 3"
        model += f": {gen})" if gen else ")"
    if fields.get("cpu MHz"):
        try:
            model += f", {float(fields['cpu MHz']):.0f} MHz"
        except ValueError:
            pass
    return model, flags


def cpu_model() -> str:
    """The CPU's description (:func:`cpu_info`), for a table's caption."""
    return cpu_info()[0]


EngineSpec = tuple[str, Callable[[int, list[int]], Engine], Callable[[str, int], int]]


def available_engines(quick: bool = False) -> tuple[list[EngineSpec], list[str]]:
    """The engines to run and the references skipped (each with how to install it)."""
    import micrograd_c as mc
    from micrograd_c.engine import Value as CValue
    from micrograd_c.nn import MLP as CMLP

    skipped: list[str] = []
    ref_samples = {
        "moons MLP(2,[16,16,1])": 20 if quick else 100,
        "MLP(784,[50,10])": 1 if quick else 2,
    }
    eager_samples = {
        "moons MLP(2,[16,16,1])": 100 if quick else 500,
        "MLP(784,[50,10])": 5 if quick else 20,
    }
    engines: list[EngineSpec] = []
    try:
        import micrograd.engine as ref_engine
        import micrograd.nn as ref_nn
    except ImportError:
        skipped.append(f"micrograd ({INSTALL['micrograd']})")
    else:
        engines.append(
            (
                "micrograd 0.1.0",
                lambda i, o: _values_engine(ref_engine.Value, ref_nn.MLP, i, o),
                lambda w, n: ref_samples[w],
            )
        )
    engines.append(
        (
            "micrograd_c eager",
            lambda i, o: _values_engine(CValue, CMLP, i, o),
            lambda w, n: eager_samples[w],
        )
    )
    engines.append(("micrograd_c tape", lambda i, o: _program_engine("tape", i, o), lambda w, n: n))
    try:
        mc.compiler.find_compiler()
    except mc.CompileError:
        skipped.append(
            "micrograd_c compiled (no working C compiler: install gcc or clang, or set $CC)"
        )
    else:
        engines.append(
            ("micrograd_c compiled", lambda i, o: _program_engine("c", i, o), lambda w, n: n)
        )
    try:
        import torch
    except ImportError:
        skipped.append(f"PyTorch ({INSTALL['PyTorch']})")
    else:
        engines.append(
            (
                f"PyTorch {torch.__version__.split('+')[0]} float64",
                _torch_engine,
                lambda w, n: min(n, 1000),
            )
        )
    try:
        jax = _import_jax()
    except ImportError:
        skipped.append(f"JAX ({INSTALL['JAX']})")
    else:
        engines.append(
            (
                f"JAX {jax.__version__} jit step",
                lambda i, o: _jax_engine(i, o, scan=False),
                lambda w, n: min(n, 1000),
            )
        )
        engines.append(
            (
                f"JAX {jax.__version__} jit lax.scan epoch",
                lambda i, o: _jax_engine(i, o, scan=True),
                lambda w, n: n,
            )
        )
    return engines, skipped


def _rate(r: float) -> str:
    """A rate with the digits that mean something: thousands separated, no decimals from 100 on
    (a decimal of 150,000 samples/s is noise), three significant figures below."""
    return f"{r:,.0f}" if r >= 100 else f"{r:.3g}"


def _ratio(r: float) -> str:
    """A ratio, to one decimal below 10x."""
    return f"{r:.1f}x" if r < 10 else f"{r:,.0f}x"


def run(repeat: int = 5, quick: bool = False, out: Callable[[str], None] = print) -> int:
    """Print the benchmark table (through ``out``); returns 0."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))
    workloads: list[Workload] = [
        ("moons MLP(2,[16,16,1])", 2, [16, 16, 1], 100 if quick else 2000),
        ("MLP(784,[50,10])", 784, [50, 10], 20 if quick else 1000),
    ]
    engines, skipped = available_engines(quick)

    results: dict[tuple[str, str], float] = {}
    for ename, make, count in engines:
        for wname, nin, nouts, n in workloads:
            X, y = _data(nin, nouts[-1], count(wname, n))
            engine = make(nin, nouts)
            reps = max(1, repeat if not ename.startswith("micrograd 0") else min(repeat, 3))
            results[(ename, wname)] = _measure(engine, X, y, reps)
            print(
                f"  {ename:34s} {wname:24s} {_rate(results[(ename, wname)]):>12s} samples/s",
                file=sys.stderr,
            )

    base = (
        "micrograd 0.1.0"
        if any(e[0] == "micrograd 0.1.0" for e in engines)
        else "micrograd_c eager"
    )
    out(f"\n{'engine':34s}" + "".join(f" {w[0]:>24s} {'ratio':>8s}" for w in workloads))
    for ename, _, _ in engines:
        row = f"{ename:34s}"
        for wname, *_ in workloads:
            r = results[(ename, wname)]
            ref = results.get((base, wname))
            ratio = _ratio(r / ref) if ref else "-"
            row += f" {_rate(r):>22s}/s {ratio:>8s}"
        out(row)
    out(
        f"samples/s of per-sample SGD training, float64, one thread; medians of {repeat} runs "
        "(micrograd: up to 3); "
        f"ratios against {base} in this run; CPU: {cpu_model()}"
    )
    if skipped:
        out("skipped references (not installed): " + "; ".join(skipped))
        out("all references at once: pip install 'micrograd-c[bench]'")
    return 0
