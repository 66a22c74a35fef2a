"""Issue 13's table: MLP(784,[50,10]) trained by micrograd_c against JAX, PyTorch, hand-written C
and the machine's arithmetic peak, every figure from one run.

    python benchmarks/compile.py            # full: 8,000 images, 11 rounds (2-4 min on 2 cores)
    python benchmarks/compile.py --quick    # 2,000 images, 5 rounds (under a minute)
    python benchmarks/compile.py --batches 1,32 --threads 1,2 --repeat 9 --no-torch

The workload: MLP(784,[50,10]) (ReLU hidden layer, linear output), softmax cross-entropy, plain
SGD (one step of lr times the batch's mean gradient per batch; the last batch may be shorter),
float64, one epoch over the first --train (8,000) images of the real MNIST test set
(../shared/data/mnist or --data-dir; random images when it is absent), visited in order (no
shuffle) by every system. lr is --lr (0.01) at batch 1 and --lr-batched (0.04) above. Every
system starts from micrograd_c's initial parameters (micrograd's init under random.seed(0)),
copied into its own layout.

Systems (rows), each at every batch size of --batches (1, 32, 128, 256):
  micrograd_c compiled   backend="c", micrograd_c's default compiler and flags (strict FP), at 1
                         thread and, above batch 1, at each count of --threads (fit(threads=));
                         batches run through fit(batch_size=) as they are in this build;
  micrograd_c fit() per batch
                         the same program trained by one fit() call per batch from a Python loop
                         over the batches (a training loop over a data loader; what JAX jit step
                         does), 1 thread: what each call costs beyond its samples;
  micrograd_c tape       the interpreter, 1 thread;
  micrograd_c float32    compile(..., float32=True) (batch 1 and 32): float32 slots on libmg's one
                         driver, fed the images as float32 (what it rounds float64 ones to anyway);
  JAX lax.scan           one jax.jit of a whole epoch: lax.scan of the SGD step over the batches
                         (the short last batch inside the same jit), float64, one thread;
  JAX jit step           a jitted SGD step called from a Python loop, float64, one thread;
  PyTorch eager          float64, torch.set_num_threads(1), torch.optim.SGD;
  hand C strict / fast   benchmarks/c/mlp_hand.c, the obvious loops (forward, backward into
                         gradient arrays, SGD; batches accumulate then step), built with
                         micrograd_c's flags (-O2 -ffp-contract=off -march=native) and with
                         -O3 -ffast-math -march=native.
References that are not installed are listed as skipped rows with the pip command that installs
them. JAX runs in a subprocess with XLA_FLAGS=--xla_cpu_multi_thread_eigen=false; every
one-thread row (JAX's subprocess included) is pinned with sched_setaffinity to the same CPU
(--cpu; --no-pin turns it off); rows with more threads get every CPU this process may use.

How the figures are made: first one verification epoch per system (it also warms caches and
JIT-compiles JAX, untimed); their first-epoch mean losses are printed and each float64 system
must agree with micrograd_c compiled at the same batch size to 1e-6 relative, or the script stops
with exit status 1 (a benchmark that compares different computations is worthless). Then --repeat
rounds; each round runs one epoch of every system, in an order rotated from round to round, so
machine noise hits all of them alike. Each epoch starts from the initial parameters.

How to read the tables:
  images/s     median over the rounds of (images / seconds of one epoch); "+-" is half the
               range of the rounds, in percent of the median: a large one means a noisy machine.
  cpu/wall     CPU time the system's process used over wall time: 1.00 is one busy core; well
               below the thread count means it waited for a CPU (a busy machine: take its
               figures with salt).
  img/cpu-s    median of images per CPU-second of the process: for one-thread rows a cross-check
               that other work on the machine disturbs less than images/s (it still shares
               caches); for rows with more threads it measures efficiency, not speed.
  vs JAX scan  per round, this row's images/s over JAX lax.scan's at the same batch size; the
               median of those per-round ratios (not the ratio of the medians). The second table
               gives the same for each micrograd_c row against every reference.
  % peak       useful float64 multiply-adds per image for this model and training step (forward
               39,700 + output-layer input gradient 500 + weight gradients 39,700 + the SGD
               update 39,760 / B) x images/s, over the core's peak measured by
               benchmarks/c/peak.c: "mul+add" is the peak of separate multiplies and adds (what
               strict code can use), "FMA" the fused one. Rows with T threads are measured
               against T cores; float32 rows against twice the float64 peak (twice the lanes).
  loss         the first epoch's mean loss (each sample's loss before its step) and its relative
               difference from micrograd_c compiled at the same batch size.
The targets of issue 13 follow, each the median of per-round ratios, with PASS/FAIL (n/a when a
row is missing; the verdict is on images/s, and one-thread pairs also show the ratio of images per
CPU-second, for a machine where other work competes). The issue's last target, the CNN and RNN
families at batch 32, is benchmarks/models.py's.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import math
import os
import pickle
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PIN_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
    "JAX_PLATFORMS": "cpu",
}
for _k, _v in PIN_ENV.items():  # thread pools read these when they load
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "mnist")
NIN, HIDDEN = 784, [50, 10]
SIZES = [NIN] + HIDDEN
LOSS_RTOL = 1e-6  # float64 systems against micrograd_c compiled
LOSS_RTOL_F32 = 1e-3  # float32 storage: reported, never fatal
TARGETS = {"b32_jax": 1.5, "b32_threads": 1.8, "b1_jax": 5.0, "b1_hand": 2.0, "f32": 1.8}
PIP = {
    "jax": "pip install jax jaxlib",
    "torch": "pip install torch==2.13.0",
    "all": "pip install 'micrograd-c[bench]'",
}
FULL = {"train": 8000, "repeat": 11}
QUICK = {"train": 2000, "repeat": 5}


def madds_per_image(batch: int) -> float:
    """Useful multiply-adds per image of one training step at batch size ``batch``."""
    layers = list(zip(SIZES[:-1], SIZES[1:]))
    forward = sum(i * o for i, o in layers)
    input_grads = sum(i * o for i, o in layers[1:])  # the first layer's inputs need no gradient
    weight_grads = sum(i * o for i, o in layers)
    nparams = sum((i + 1) * o for i, o in layers)
    return forward + input_grads + weight_grads + nparams / batch


# ---- the JAX worker (a subprocess: its own XLA flags, its own CPU) -----------------------------


def _send(f: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)))
    f.write(data)
    f.flush()


def _recv(f: Any) -> Any:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("the JAX worker ended")
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("the JAX worker ended")
    return pickle.loads(data)


def jax_worker() -> None:
    """Serve JAX epochs over stdin/stdout: setup, prepare (jit-compile), run, quit."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything JAX prints goes to stderr, not into the protocol
    inp = sys.stdin.buffer
    setup = _recv(inp)
    if setup.get("cpu") is not None:
        os.sched_setaffinity(0, {setup["cpu"]})  # before jax starts a thread: they inherit it
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        import jaxlib  # type: ignore[import-not-found]
    except Exception as e:  # reported to the parent
        _send(out, ("error", f"{type(e).__name__}: {e}"))
        return
    X = jnp.asarray(setup["X"])
    Y = jnp.asarray(setup["Y"].astype(np.int32))
    init = tuple(jnp.asarray(a) for a in setup["params"])  # W1 (784,50), b1, W2 (50,10), b2
    if X.dtype != jnp.float64 or any(a.dtype != jnp.float64 for a in init):
        _send(out, ("error", f"JAX did not keep float64 (X is {X.dtype})"))
        return
    n = X.shape[0]

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        W1, b1, W2, b2 = p
        h = jax.nn.relu(x @ W1 + b1)
        z = h @ W2 + b2
        picked = jnp.take_along_axis(z, y[:, None], axis=1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(z, axis=1) - picked)

    vg = jax.value_and_grad(loss_fn)

    def sgd(p: Any, tot: Any, x: Any, y: Any, lr: float) -> Any:
        loss, g = vg(p, x, y)
        return tuple(a - lr * b for a, b in zip(p, g)), tot + loss * x.shape[0]

    def make_scan(batch: int, lr: float) -> Callable[[], Any]:
        # The batches are cut outside the jit, once (untimed, as every system gets its data
        # laid out in advance): slicing X inside it copies the whole epoch's images per call,
        # which made the scan 1.8x slower at batch 128 and 256 (8,000 is no multiple of them).
        nb, rem = divmod(n, batch)
        Xb = jax.device_put(X[: nb * batch].reshape(nb, batch, X.shape[1]))
        Yb = jax.device_put(Y[: nb * batch].reshape(nb, batch))
        Xr, Yr = jax.device_put(X[nb * batch :]), jax.device_put(Y[nb * batch :])

        def epoch(p: Any, Xb: Any, Yb: Any, Xr: Any, Yr: Any) -> Any:
            (p, tot), _ = jax.lax.scan(
                lambda c, xy: (sgd(c[0], c[1], xy[0], xy[1], lr), None),
                (p, jnp.zeros((), Xb.dtype)),
                (Xb, Yb),
            )
            if rem:
                p, tot = sgd(p, tot, Xr, Yr, lr)
            return p, tot / n

        f = jax.jit(epoch)
        return lambda: f(init, Xb, Yb, Xr, Yr)

    def make_step(batch: int, lr: float) -> Callable[[], Any]:
        f = jax.jit(lambda p, tot, x, y: sgd(p, tot, x, y, lr))
        chunks = [(X[b : b + batch], Y[b : b + batch]) for b in range(0, n, batch)]
        zero = jnp.zeros((), X.dtype)

        def run() -> Any:
            p, tot = init, zero
            for x, y in chunks:
                p, tot = f(p, tot, x, y)
            return p, tot / n

        return run

    runners: dict[tuple[str, int], Callable[[], Any]] = {}
    _send(
        out,
        (
            "ok",
            {
                "jax": jax.__version__,
                "jaxlib": jaxlib.__version__,
                "devices": [str(d) for d in jax.devices()],
                "affinity": sorted(os.sched_getaffinity(0)),
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
            },
        ),
    )
    while True:
        try:
            msg = _recv(inp)
        except EOFError:
            return
        try:
            if msg[0] == "quit":
                _send(out, ("ok", None))
                return
            if msg[0] == "prepare":  # build and JIT-compile (the first call), untimed
                _, kind, batch, lr = msg
                runners[(kind, batch)] = (make_scan if kind == "scan" else make_step)(batch, lr)
                t0 = time.perf_counter()
                jax.block_until_ready(runners[(kind, batch)]())
                _send(out, ("ok", time.perf_counter() - t0))
            elif msg[0] == "run":
                _, kind, batch = msg
                run = runners[(kind, batch)]
                t0, c0 = time.perf_counter(), time.process_time()
                p, loss = jax.block_until_ready(run())
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                nthreads = len(os.listdir("/proc/self/task"))
                _send(out, ("ok", (wall, cpu, float(loss), nthreads)))
            else:
                _send(out, ("error", f"unknown message {msg[0]!r}"))
        except Exception as e:  # reported to the parent, the worker lives on
            _send(out, ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class JaxClient:
    """The parent's end of the JAX worker."""

    def __init__(
        self, X: np.ndarray, Y: np.ndarray, params: Sequence[np.ndarray], cpu: int | None
    ) -> None:
        env = dict(os.environ, **PIN_ENV)
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--jax-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.threads_seen = 0
        self.info = self.call({"X": X, "Y": Y, "params": list(params), "cpu": cpu})

    def call(self, msg: Any) -> Any:
        assert self.p.stdin is not None and self.p.stdout is not None
        try:
            _send(self.p.stdin, msg)
            status, value = _recv(self.p.stdout)
        except (EOFError, BrokenPipeError) as e:
            raise RuntimeError(f"the JAX worker died ({e}; exit status {self.p.poll()})") from None
        if status != "ok":
            raise RuntimeError(str(value).strip())
        return value

    def close(self) -> None:
        try:
            self.call(("quit",))
        except RuntimeError:
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


# ---- the machine -------------------------------------------------------------------------------


def isa_summary(flags: list[str]) -> str:
    keep = [
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512dq",
        "avx512vl",
        "avx512bw",
        "avx512_fp16",
        "asimd",
        "sve",
        "sve2",
    ]
    have = [f for f in keep if f in flags]
    return " ".join(have) if have else "(no SIMD flags listed)"


def vector_widths(flags: list[str]) -> list[int]:
    """Vector widths (float64 lanes) worth measuring: what the ISA has natively."""
    widths = [1, 2]
    if "avx" in flags:
        widths.append(4)
    if "avx512f" in flags:
        widths.append(8)
    return widths


def march_native(tc: Any, flags: list[str]) -> str:
    """What ``-march=native`` means to this compiler: gcc's resolved -march and its widest
    vector extension (gcc names an unknown CPU after the newest one it knows)."""
    if "-march=native" not in flags:
        return ""
    try:
        r = subprocess.run(
            tc.command + ["-march=native", "-Q", "--help=target"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ", -march=native"
    march, enabled = "?", set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "-march=":
            march = parts[1]
        elif len(parts) >= 2 and parts[-1] == "[enabled]":
            enabled.add(parts[0])
    if march == "?":
        return ", -march=native"
    widest = next(
        (isa for isa in ("avx512f", "avx2", "avx", "sse4.2") if f"-m{isa}" in enabled), ""
    )
    return f", -march=native = {march}" + (f" (+{widest})" if widest else "")


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def build_so(tc: Any, flags: list[str], src: str, out: str) -> float:
    t0 = time.perf_counter()
    cmd = tc.command + list(flags) + ["-fPIC", "-shared", "-o", out, src, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"{' '.join(tc.command + list(flags))} {os.path.basename(src)}: {last}")
    return time.perf_counter() - t0


def measure_peak(
    tc: Any, work: str, flags: list[str], widths: list[int]
) -> dict[str, dict[int, float]]:
    """Multiply-adds per second of one core, per variant (mul+add, FMA) and vector width."""
    src = os.path.join(HERE, "c", "peak.c")
    out: dict[str, dict[int, float]] = {}
    native = ["-march=native"] if "-march=native" in flags else []
    for variant, contract in (("mul+add", "-ffp-contract=off"), ("FMA", "-ffp-contract=fast")):
        so = os.path.join(work, f"peak_{variant.replace('+', '_')}.so")
        build_so(tc, ["-O2", contract] + native, src, so)
        lib = ctypes.CDLL(so)
        lib.peak_madds.restype = ctypes.c_double
        lib.peak_madds.argtypes = [ctypes.c_int, ctypes.c_double]
        out[variant] = {w: lib.peak_madds(w, 0.25) for w in widths}
    return out


# ---- data and the model ------------------------------------------------------------------------


def load_data(data_dir: str, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    from micrograd_c.datasets import DatasetError, load_mnist

    try:
        X, y = load_mnist(data_dir, "test")
        src = f"MNIST test set ({data_dir}), first {min(n, len(X)):,} images"
    except DatasetError as e:
        rng = np.random.RandomState(0)
        X, y = rng.rand(n, NIN), rng.randint(0, 10, n).astype(np.float64)
        src = f"random images (MNIST not usable: {e})"
    X, y = X[:n], y[:n].astype(np.float64)
    return np.ascontiguousarray(X), np.ascontiguousarray(y), src


def split_params(flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """micrograd's parameter order (per layer, per neuron: its weights, then its bias) as
    (W (out, in), b (out,)) per layer."""
    layers, at = [], 0
    for nin, nout in zip(SIZES[:-1], SIZES[1:]):
        block = flat[at : at + nout * (nin + 1)].reshape(nout, nin + 1)
        layers.append((block[:, :nin].copy(), block[:, nin].copy()))
        at += nout * (nin + 1)
    if at != len(flat):
        raise SystemExit(f"parameter mapping: {len(flat)} parameters, the layer sizes give {at}")
    return layers


def check_mapping(model: Any, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The mapping of the flat vector onto (W, b) is the model's own."""
    for li, layer in enumerate(model.layers):
        W, b = layers[li]
        for j, neuron in enumerate(layer.neurons):
            if [w.data for w in neuron.w] != W[j].tolist() or neuron.b.data != b[j]:
                raise SystemExit(f"parameter mapping: layer {li} neuron {j} differs")


# ---- systems -----------------------------------------------------------------------------------

Runner = Callable[[], tuple[float, float, float]]  # () -> (wall s, cpu s, first-epoch loss)


@dataclass
class System:
    label: str
    batch: int
    threads: int = 1
    run: Runner | None = None
    kind: str = ""  # compiled, tape, f32, scan, step, torch, hand, handfast
    float32: bool = False
    skipped: str | None = None  # the text printed instead of figures ("n/a (...)", "skipped: ")
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    check_loss: float | None = None

    @property
    def name(self) -> str:
        return self.label + ("" if self.threads == 1 else f" x{self.threads}")


def timed(reset: Callable[[], None], epoch: Callable[[], float]) -> Runner:
    def run() -> tuple[float, float, float]:
        reset()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = epoch()
        return time.perf_counter() - t0, time.process_time() - c0, float(loss)

    return run


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/compile.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke test: --train {QUICK['train']} --repeat {QUICK['repeat']} "
        "unless given (under a minute); the default is the full run, "
        f"--train {FULL['train']} --repeat {FULL['repeat']}",
    )
    ap.add_argument(
        "--train",
        type=int,
        default=None,
        metavar="N",
        help=f"images in the epoch (default {FULL['train']}, --quick {QUICK['train']})",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="R",
        help=f"timed rounds of one epoch per system (default {FULL['repeat']}, "
        f"--quick {QUICK['repeat']})",
    )
    ap.add_argument(
        "--batches",
        default="1,32,128,256",
        metavar="B,B,...",
        help="batch sizes (default 1,32,128,256)",
    )
    ap.add_argument(
        "--threads",
        default="1,2",
        metavar="T,T,...",
        help="thread counts of micrograd_c compiled above batch 1 (default 1,2)",
    )
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate at batch 1 (0.01)")
    ap.add_argument(
        "--lr-batched", type=float, default=0.04, help="SGD learning rate above batch 1 (0.04)"
    )
    ap.add_argument(
        "--data-dir",
        default=DEFAULT_MNIST,
        metavar="DIR",
        help="MNIST IDX files (default ../shared/data/mnist next to the repository); "
        "random images when absent",
    )
    ap.add_argument(
        "--compilers",
        default=None,
        metavar="CC,CC,...",
        help="C compilers for micrograd_c compiled rows (default: micrograd_c's "
        "choice, $CC or cc); the first also builds the hand-written C and the "
        "peak kernel",
    )
    ap.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="the CPU one-thread rows are pinned to (default: the last allowed)",
    )
    ap.add_argument("--no-pin", action="store_true", help="do not pin one-thread rows to a CPU")
    ap.add_argument("--no-jax", action="store_true", help="leave out the JAX rows")
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch rows")
    ap.add_argument(
        "--no-hand",
        action="store_true",
        help="leave out the hand-written C rows and the peak measurement",
    )
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else FULL
    args.train = preset["train"] if args.train is None else args.train
    args.repeat = preset["repeat"] if args.repeat is None else args.repeat
    try:
        args.batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
        args.threads = sorted({int(t) for t in args.threads.split(",") if t.strip()})
    except ValueError:
        ap.error("--batches and --threads are comma-separated integers")
    if (
        not args.batches
        or min(args.batches) < 1
        or not args.threads
        or min(args.threads) < 1
        or args.repeat < 1
        or args.train < 1
    ):
        ap.error("batches, threads, --repeat and --train must be positive")
    args.error = ap.error
    return args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--jax-worker":
        jax_worker()
        return
    args = parse_args()
    t_start = time.perf_counter()
    batches: list[int] = args.batches
    thread_counts: list[int] = args.threads
    repeat: int = args.repeat
    lr_of = {b: (args.lr if b == 1 else args.lr_batched) for b in batches}

    import micrograd_c as mc
    from micrograd_c import compiler
    from micrograd_c.app.bench import cpu_info
    from micrograd_c.nn import MLP

    allowed = sorted(os.sched_getaffinity(0))
    pin_cpu = None if args.no_pin else (args.cpu if args.cpu is not None else allowed[-1])
    if pin_cpu is not None and pin_cpu not in allowed:
        args.error(f"--cpu {pin_cpu}: this process may run on CPUs {allowed}")

    def pin(threads: int) -> None:
        if pin_cpu is not None:
            os.sched_setaffinity(0, {pin_cpu} if threads == 1 else set(allowed))

    model_name, flags = cpu_info()
    X, Y, data_src = load_data(args.data_dir, args.train)
    n = len(X)
    work = tempfile.mkdtemp(prefix="mg-bench13-")
    jaxc: JaxClient | None = None
    notes: list[str] = []
    try:
        # ---- micrograd_c: the model, its initial parameters, the programs -------------------
        random.seed(0)
        model = MLP(NIN, HIDDEN)
        xin, yin = mc.inputs(NIN), mc.inputs(1)
        logits = model(xin)
        loss = mc.cross_entropy(logits, yin[0])
        params = model.parameters()
        t0 = time.perf_counter()
        tape = mc.compile(
            loss, inputs=xin, targets=yin, params=params, outputs=logits, backend="tape"
        )
        freeze_s = time.perf_counter() - t0
        init = tape.parameters.copy()
        layers = split_params(init)
        check_mapping(model, layers)
        (W1, b1), (W2, b2) = layers

        compilers: list[str | None] = (
            [c.strip() for c in args.compilers.split(",")] if args.compilers else [None]
        )
        toolchains: list[tuple[str | None, Any]] = []
        for c in compilers:
            try:
                toolchains.append((c, compiler.find_compiler(c)))
            except mc.CompileError as e:
                notes.append(
                    f"no C compiler {c or '(default)'}: {first_line(e)}; its rows are skipped"
                )
        tc0 = toolchains[0][1] if toolchains else None
        flags0 = compiler.default_flags(tc0) if tc0 else []

        systems: list[System] = []

        # float32 storage reads its inputs as float32 (fit takes float32 X as it is): the values
        # it would round float64 X to on loading, at half the memory traffic
        X32 = X.astype(np.float32)

        def mg_system(
            label: str, prog: Any, batch: int, threads: int, kind: str, f32: bool = False
        ) -> System:
            """An epoch in one fit call, or (kind "calls") one fit call per batch from a Python
            loop, as a training loop over a data loader does: the JAX jit step row's
            counterpart. The epoch's mean loss either way."""
            data = X32 if f32 else X

            def reset() -> None:
                prog.parameters[:] = init

            def fit_rows(rows: slice) -> float:
                return prog.fit(
                    data[rows],
                    Y[rows],
                    epochs=1,
                    lr=lr_of[batch],
                    batch_size=batch,
                    shuffle=False,
                    threads=threads,
                )[0]

            def epoch() -> float:
                if kind != "calls":
                    return fit_rows(slice(None))
                total = sum(
                    fit_rows(slice(k, k + batch)) * min(batch, n - k) for k in range(0, n, batch)
                )
                return total / n

            return System(label, batch, threads, timed(reset, epoch), kind=kind, float32=f32)

        info = tape.info
        compile_lines: list[str] = [
            f"freeze (tape) {freeze_s * 1e3:.1f} ms: {info['ninstr']} instructions, "
            f"{info['nslots']:,} slots, {info.get('forward_nests', '?')} forward + "
            f"{info.get('backward_nests', '?')} backward loop nests"
        ]
        for ci, (cname, tc) in enumerate(toolchains):
            fl = compiler.default_flags(tc)
            tag = "" if ci == 0 else f" [{tc.name}]"
            cache = tempfile.mkdtemp(dir=work)  # a fresh cache: compile times are real
            try:
                t0 = time.perf_counter()
                prog = mc.compile(
                    loss,
                    inputs=xin,
                    targets=yin,
                    params=params,
                    outputs=logits,
                    backend="c",
                    cc=cname,
                    cache=cache,
                )
                total_s = time.perf_counter() - t0
                compile_lines.append(
                    f"micrograd_c compile{tag} ({tc.version}; {' '.join(fl)}): {total_s:.2f} s "
                    f"(freeze + emit + cc + load; cc alone {prog.info['compile_seconds']:.2f} s),"
                    f" C source {prog.info['source_bytes'] / 1024:.0f} KB"
                )
                for b in batches:
                    for th in [1] if b == 1 else thread_counts:
                        systems.append(
                            mg_system(f"micrograd_c compiled{tag}", prog, b, th, "compiled")
                        )
                    if ci == 0:
                        systems.append(
                            mg_system("micrograd_c fit() per batch", prog, b, 1, "calls")
                        )
            except mc.CompileError as e:
                compile_lines.append(f"micrograd_c compile{tag}: failed: {first_line(e)}")
                for b in batches:
                    systems.append(
                        System(
                            f"micrograd_c compiled{tag}",
                            b,
                            kind="compiled",
                            skipped=f"failed: {first_line(e)}",
                        )
                    )
            if ci == 0:  # float32 storage, with the same compiler
                f32_label = "micrograd_c float32 storage"
                f32_batches = [b for b in (1, 32) if b in batches]
                try:
                    t0 = time.perf_counter()
                    p32 = mc.compile(
                        loss,
                        inputs=xin,
                        targets=yin,
                        params=params,
                        outputs=logits,
                        backend="c",
                        cc=cname,
                        cache=cache,
                        float32=True,
                    )
                    compile_lines.append(
                        f"micrograd_c float32 compile: {time.perf_counter() - t0:.2f} s"
                    )
                    for b in f32_batches:
                        systems.append(mg_system(f32_label, p32, b, 1, "f32", True))
                except Exception as e:  # any failure is a row, never a crash
                    for b in f32_batches:
                        systems.append(
                            System(
                                f32_label,
                                b,
                                kind="f32",
                                float32=True,
                                skipped=f"failed: {type(e).__name__}: {first_line(e)}",
                            )
                        )
        for b in batches:
            systems.append(mg_system("micrograd_c tape interpreter", tape, b, 1, "tape"))

        # ---- hand-written C ------------------------------------------------------------------
        order = np.arange(n, dtype=np.uintp)
        hand_p = np.concatenate([W1.ravel(), b1, W2.ravel(), b2])
        hand_labels = (("hand", "hand C strict"), ("handfast", "hand C fast"))
        if args.no_hand:
            pass
        elif tc0 is None:
            for kind, label in hand_labels:
                for b in batches:
                    systems.append(System(label, b, kind=kind, skipped="skipped: no C compiler"))
        else:
            native = ["-march=native"] if "-march=native" in flags0 else []
            hand_flags = {"hand": flags0, "handfast": ["-O3", "-ffast-math"] + native}
            for kind, label in hand_labels:
                fl = hand_flags[kind]
                so = os.path.join(work, f"mlp_{kind}.so")
                try:
                    bs = build_so(tc0, fl, os.path.join(HERE, "c", "mlp_hand.c"), so)
                except RuntimeError as e:
                    for b in batches:
                        systems.append(
                            System(label, b, kind=kind, skipped=f"failed: build: {first_line(e)}")
                        )
                    continue
                compile_lines.append(f"{label} ({tc0.name} {' '.join(fl)}): built in {bs:.2f} s")
                lib = ctypes.CDLL(so)
                lib.mlp_nparams.restype = ctypes.c_size_t
                if lib.mlp_nparams() != len(init):
                    raise SystemExit(
                        f"mlp_hand.c has {lib.mlp_nparams()} parameters, the model {len(init)}"
                    )
                f1 = lib.mlp_train_epoch
                f1.restype = ctypes.c_double
                f1.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_double]
                fb = lib.mlp_train_epoch_batched
                fb.restype = ctypes.c_double
                fb.argtypes = [ctypes.c_void_p] * 4 + [
                    ctypes.c_size_t,
                    ctypes.c_double,
                    ctypes.c_size_t,
                ]
                buf = np.empty_like(hand_p)
                for b in batches:

                    def reset(buf: np.ndarray = buf) -> None:
                        buf[:] = hand_p

                    def epoch(
                        b: int = b, buf: np.ndarray = buf, f1: Any = f1, fb: Any = fb
                    ) -> float:
                        args_ = (
                            buf.ctypes.data,
                            X.ctypes.data,
                            Y.ctypes.data,
                            order.ctypes.data,
                            n,
                            lr_of[b],
                        )
                        r = f1(*args_) if b == 1 else fb(*args_, b)
                        if r < 0:
                            raise MemoryError("mlp_hand.c could not allocate its gradients")
                        return r

                    systems.append(System(label, b, 1, timed(reset, epoch), kind=kind))

        # ---- PyTorch -------------------------------------------------------------------------
        torch_ver = "not run (--no-torch)"
        if not args.no_torch:
            pin(1)  # torch's threads inherit this thread's CPU
            try:
                import torch
            except ImportError:
                torch_ver = f"not installed ({PIP['torch']}): its rows are skipped"
                for b in batches:
                    systems.append(
                        System(
                            "PyTorch eager",
                            b,
                            kind="torch",
                            skipped=f"skipped: not installed ({PIP['torch']})",
                        )
                    )
            else:
                torch.set_num_threads(1)
                torch_ver = f"{torch.__version__}, {torch.get_num_threads()} thread"
                net = torch.nn.Sequential(
                    torch.nn.Linear(NIN, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10)
                ).double()
                tparams = [net[0].weight, net[0].bias, net[2].weight, net[2].bias]
                tsrc = [torch.from_numpy(a.copy()) for a in (W1, b1, W2, b2)]
                Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y.astype(np.int64))

                def torch_reset() -> None:
                    with torch.no_grad():
                        for p, s in zip(tparams, tsrc):
                            p.copy_(s)

                for b in batches:

                    def torch_epoch(b: int = b) -> float:
                        opt = torch.optim.SGD(net.parameters(), lr=lr_of[b])
                        total = 0.0
                        for s in range(0, n, b):
                            xb, yb = Xt[s : s + b], Yt[s : s + b]
                            lv = torch.nn.functional.cross_entropy(net(xb), yb)
                            opt.zero_grad()
                            lv.backward()
                            opt.step()
                            total += lv.item() * len(xb)
                        return total / n

                    systems.append(
                        System("PyTorch eager", b, 1, timed(torch_reset, torch_epoch), kind="torch")
                    )

        # ---- JAX (its own process) -----------------------------------------------------------
        jax_ver = "not run (--no-jax)"
        jax_compile: list[str] = []
        jax_rows = (("scan", "JAX lax.scan epoch"), ("step", "JAX jit step, Python loop"))
        if not args.no_jax:
            try:
                have_jax = importlib.util.find_spec("jax") is not None
            except (ImportError, ValueError):
                have_jax = False
            why = None
            if not have_jax:
                jax_ver = f"not installed ({PIP['jax']}): its rows are skipped"
                why = f"skipped: not installed ({PIP['jax']})"
            else:
                try:
                    jaxc = JaxClient(X, Y, [W1.T.copy(), b1, W2.T.copy(), b2], pin_cpu)
                    ji = jaxc.info
                    jax_ver = (
                        f"{ji['jax']} (jaxlib {ji['jaxlib']}), {', '.join(ji['devices'])}, "
                        f"float64, CPUs {ji['affinity']}, XLA_FLAGS={ji['xla_flags']}"
                    )
                except RuntimeError as e:
                    jax_ver = f"unusable ({first_line(e)}): its rows are skipped"
                    why = f"failed: {first_line(e)}"
                    jaxc = None
            for kind, label in jax_rows:
                for b in batches:
                    if jaxc is None:
                        systems.append(System(label, b, kind=kind, skipped=why))
                        continue
                    try:
                        cs = jaxc.call(("prepare", kind, b, lr_of[b]))
                        jax_compile.append(f"{kind} b{b} {cs:.2f} s")

                        def jax_run(kind: str = kind, b: int = b) -> tuple[float, float, float]:
                            assert jaxc is not None
                            wall, cpu, lv, nthreads = jaxc.call(("run", kind, b))
                            jaxc.threads_seen = max(jaxc.threads_seen, nthreads)
                            return wall, cpu, lv

                        systems.append(System(label, b, 1, jax_run, kind=kind))
                    except RuntimeError as e:
                        systems.append(
                            System(label, b, kind=kind, skipped=f"failed: {first_line(e)}")
                        )

        # ---- header --------------------------------------------------------------------------
        pinned = f"CPU {pin_cpu}" if pin_cpu is not None else "nothing (--no-pin)"
        print(
            f"CPU: {model_name}; ISA: {isa_summary(flags)}; {os.cpu_count()} logical CPUs, "
            f"this process may use {allowed}; one-thread rows pinned to {pinned}"
        )
        print(f"load average at start: {load_avg()}")
        cc_text = f"{tc0.version} ({tc0.path}){march_native(tc0, flags0)}" if tc0 else "none"
        print(
            f"python {sys.version.split()[0]}, numpy {np.__version__}, "
            f"micrograd_c {mc.__version__} ({os.path.dirname(mc.__file__)}), "
            f"tape interpreter kernels: {compiler.kernel_isa()}"
        )
        print(f"C compiler: {cc_text}")
        print(f"PyTorch: {torch_ver}")
        print(f"JAX: {jax_ver}")
        if jax_compile:
            print(f"JAX jit compile (first call, untimed): {', '.join(jax_compile)}")
        for line in compile_lines:
            print(line)
        print(
            f"data: {data_src}; {n:,} images, no shuffle; lr {args.lr} at batch 1, "
            f"{args.lr_batched} above; float64 unless stated; {repeat} rounds"
            + (" (--quick)" if args.quick else "")
        )
        missing = [s.label for s in systems if s.skipped and s.skipped.startswith("skipped: not")]
        if missing:
            print(
                f"not installed: {', '.join(sorted(set(missing)))}; {PIP['all']} installs "
                "every reference"
            )

        # ---- the arithmetic peak -------------------------------------------------------------
        widths = vector_widths(flags)
        peak: dict[str, dict[int, float]] | None = None
        if tc0 is not None and not args.no_hand:
            pin(1)
            peak = measure_peak(tc0, work, flags0, widths)
            pin(2)

        # ---- verification epoch (also the warm-up) -------------------------------------------
        runnable = [s for s in systems if s.skipped is None and s.run is not None]
        print(
            f"\nverification: one epoch per system ({len(runnable)} systems), first-epoch "
            "mean losses",
            flush=True,
        )
        for s in runnable:
            pin(s.threads)
            try:
                _, _, s.check_loss = s.run()  # type: ignore[misc]
            except Exception as e:  # a failing system is a row
                s.skipped = f"failed: {type(e).__name__}: {first_line(e)}"
        pin(2)
        runnable = [s for s in systems if s.skipped is None and s.run is not None]

        def baseline(b: int) -> System | None:
            """What the systems at batch b are checked against: micrograd_c compiled (the
            first compiler, one thread), else the tape."""
            for s in runnable:
                if (
                    s.kind == "compiled"
                    and s.batch == b
                    and s.threads == 1
                    and s.label == "micrograd_c compiled"
                ):
                    return s
            return next((s for s in runnable if s.kind == "tape" and s.batch == b), None)

        def rel(a: float | None, b: float | None) -> float:
            if a is None or b is None:
                return math.nan
            return abs(a - b) / abs(b) if b else abs(a - b)

        bad: list[str] = []
        for b in batches:
            base = baseline(b)
            if base is None and any(s.batch == b for s in runnable):
                notes.append(
                    f"warning: batch {b}: no micrograd_c row ran, so nothing checked "
                    "the other systems' losses"
                )
            for s in [s for s in runnable if s.batch == b]:
                if base is None or s is base:
                    continue
                assert s.check_loss is not None and base.check_loss is not None
                r = rel(s.check_loss, base.check_loss)
                tol = LOSS_RTOL_F32 if s.float32 else LOSS_RTOL
                if not math.isfinite(s.check_loss) or not r <= tol:
                    msg = (
                        f"batch {b}: {s.name} loss {s.check_loss!r} vs {base.name} "
                        f"{base.check_loss!r}: relative difference {r:.2e} > {tol:g}"
                    )
                    if s.float32:
                        notes.append("warning: " + msg)
                    else:
                        bad.append(msg)
        for b in batches:
            print(f"  batch {b}:")
            for s in [s for s in runnable if s.batch == b]:
                print(f"    {s.name:34s} {s.check_loss!r}")
        if bad:
            print(
                "\nFAIL: the systems do not compute the same thing (first-epoch losses "
                f"disagree beyond {LOSS_RTOL:g} relative):"
            )
            for m in bad:
                print("  " + m)
            sys.exit(1)
        diffs = [
            rel(s.check_loss, base.check_loss)
            for s in runnable
            if not s.float32
            for base in [baseline(s.batch)]
            if base is not None and base is not s
        ]
        print(
            f"  loss agreement: every float64 system is within {LOSS_RTOL:g} (relative) of "
            f"micrograd_c compiled at its batch size: PASS (largest difference "
            f"{max(diffs, default=0.0):.1e})"
        )
        for b in batches:  # micrograd_c promises bitwise the same results for every thread count
            ours = [s for s in runnable if s.batch == b and s.kind in ("compiled", "tape")]
            if len({s.check_loss for s in ours}) > 1:
                notes.append(
                    f"warning: batch {b}: micrograd_c rows differ bitwise: "
                    + ", ".join(f"{s.name} {s.check_loss!r}" for s in ours)
                )
        same = not any(t.startswith("warning: batch") and "bitwise" in t for t in notes)
        print(
            f"  micrograd_c compiled (every thread count) and tape: bitwise the same loss at "
            f"each batch size: {'yes' if same else 'NO (see the warnings at the end)'}",
            flush=True,
        )

        # ---- the timed rounds ----------------------------------------------------------------
        t_all = time.perf_counter()
        for r in range(repeat):
            live = [s for s in runnable if s.skipped is None]
            k = r * len(live) // repeat  # start each round elsewhere in the list
            for s in live[k:] + live[:k]:
                pin(s.threads)
                try:
                    wall, cpu, lv = s.run()  # type: ignore[misc]
                except Exception as e:  # one broken system must not end the run
                    s.skipped = f"failed in round {r + 1}: {type(e).__name__}: {first_line(e)}"
                    continue
                s.walls.append(wall)
                s.cpus.append(cpu)
                s.losses.append(lv)
            pin(2)
            print(
                f"  round {r + 1}/{repeat} done ({time.perf_counter() - t_all:.0f} s; load "
                f"{load_avg()})",
                flush=True,
            )
        if peak is not None:  # once more after the rounds: the best of both
            pin(1)
            again = measure_peak(tc0, work, flags0, widths)
            pin(2)
            for v in peak:
                for w in peak[v]:
                    peak[v][w] = max(peak[v][w], again[v][w])
        runnable = [s for s in runnable if s.skipped is None and s.walls]

        # ---- the table -----------------------------------------------------------------------
        def rates(s: System) -> list[float]:
            return [n / w for w in s.walls]

        def find(kind: str, b: int, threads: int = 1) -> System | None:
            for s in runnable:
                if s.kind == kind and s.batch == b and s.threads == threads and "[" not in s.label:
                    return s
            return None

        def ratio(a: System | None, b: System | None) -> float | None:
            """The median over the rounds of a's images/s over b's in the same round."""
            if a is None or b is None or not a.walls or not b.walls:
                return None
            return statistics.median(x / y for x, y in zip(rates(a), rates(b)))

        def cpu_ratio(a: System | None, b: System | None) -> float | None:
            """The same over images per CPU-second (less disturbed by other work)."""
            if a is None or b is None or not a.cpus or not b.cpus or min(a.cpus) <= 0:
                return None
            return statistics.median(y / x for x, y in zip(a.cpus, b.cpus))

        def fmt_ratio(v: float | None, width: int) -> str:
            return f"{'n/a' if v is None else f'{v:.2f}x':>{width}s}"

        peak_best = {v: max(d.values()) for v, d in peak.items()} if peak else {}
        print(
            "\nthe arithmetic peak of one core, float64 (benchmarks/c/peak.c, best of two "
            "measurements), G multiply-adds/s:"
        )
        if peak:
            for v, d in peak.items():
                print(
                    f"  {v:8s} "
                    + "  ".join(f"{w}-wide {g / 1e9:6.2f}" for w, g in d.items())
                    + f"   -> peak {peak_best[v] / 1e9:.2f}"
                )
        else:
            print("  not measured (no C compiler, or --no-hand)")
        print(
            "useful multiply-adds per image: "
            + ", ".join(f"batch {b}: {madds_per_image(b):,.0f}" for b in batches)
        )

        hdr = (
            f"{'system':34s} {'batch':>5s} {'thr':>3s} {'images/s':>9s} {'+-':>6s} "
            f"{'cpu/wall':>8s} {'img/cpu-s':>9s} {'vs JAX scan':>11s} {'%peak':>6s} "
            f"{'%FMA':>5s} {'first-epoch loss':>18s} {'rel.diff':>8s}"
        )
        print(
            f"\nMLP(784,[50,10]), {n:,} images, one epoch per round; medians of {repeat} "
            "rounds, systems interleaved; %peak: of the mul+add peak, %FMA: of the FMA peak\n"
        )
        print(hdr)
        print("-" * len(hdr))
        for b in batches:
            scan = find("scan", b)
            base = baseline(b)
            for s in [s for s in systems if s.batch == b]:
                name = s.name[:34]
                if s.skipped is not None or not s.walls:
                    text = s.skipped or "failed: no timed round"
                    print(f"{name:34s} {b:5d} {s.threads:3d}  {text}")
                    continue
                rs = rates(s)
                med = statistics.median(rs)
                spread = (max(rs) - min(rs)) / 2 / med * 100
                cpu_wall = statistics.median(c / w for c, w in zip(s.cpus, s.walls))
                per_cpu = statistics.median(n / c for c in s.cpus) if min(s.cpus) > 0 else 0.0
                vs = fmt_ratio(ratio(s, scan) if s is not scan else 1.0, 11)
                if peak_best:
                    scale = s.threads * (2.0 if s.float32 else 1.0)
                    used = madds_per_image(b) * med
                    pk = (
                        f"{used / (peak_best['mul+add'] * scale) * 100:5.1f}% "
                        f"{used / (peak_best['FMA'] * scale) * 100:4.1f}%"
                    )
                else:
                    pk = f"{'-':>6s} {'-':>5s}"
                rd = (
                    "-"
                    if base is None or s is base
                    else f"{rel(s.check_loss, base.check_loss):.1e}"
                )
                print(
                    f"{name:34s} {b:5d} {s.threads:3d} {med:9,.0f} {spread:5.1f}% "
                    f"{cpu_wall:8.2f} {per_cpu:9,.0f} {vs} {pk} {s.check_loss:18.12f} {rd:>8s}"
                )
            print()

        # ---- micrograd_c against every reference ---------------------------------------------
        refs = [
            ("JAX scan", "scan"),
            ("JAX step", "step"),
            ("PyTorch", "torch"),
            ("hand C strict", "hand"),
            ("hand C fast", "handfast"),
        ]
        print(
            "micrograd_c over each reference at the same batch size (median of per-round "
            "ratios; above 1 is faster; references on 1 thread):"
        )
        head = f"{'micrograd_c row':36s} {'batch':>5s}" + "".join(f" {r:>13s}" for r, _ in refs)
        print(head)
        print("-" * len(head))
        for b in batches:
            ours = [
                s
                for s in runnable
                if s.batch == b and s.kind in ("compiled", "calls", "tape", "f32")
            ]
            for s in ours:
                cells = "".join(f" {fmt_ratio(ratio(s, find(k, b)), 13)}" for _, k in refs)
                print(f"{s.name[:36]:36s} {b:5d}{cells}")
        print()

        # ---- the targets ---------------------------------------------------------------------
        def verdict(v: float | None, target: float, strict: bool = False) -> str:
            if v is None:
                return "n/a"
            return "PASS" if (v > target if strict else v >= target) else "FAIL"

        print(
            "targets of issue 13 (medians of per-round ratios of images/s; for one-thread pairs "
            "also of images per CPU-second):"
        )

        def why_missing(kind: str, b: int, threads: int = 1) -> str:
            """Why the row (kind, b, threads) has no figures: its own text, or not measured."""
            for s in systems:
                if s.kind == kind and s.batch == b and s.threads == threads and s.skipped:
                    return s.skipped if s.skipped.startswith("n/a") else f"n/a ({s.skipped})"
            return f"n/a (no {kind} row at batch {b}, {threads} thread(s) in this run)"

        Need = tuple[str, int, int]
        lines: list[tuple[str, Need, Need, float, bool]] = [
            (
                "batch 32, 1 thread: micrograd_c / JAX lax.scan",
                ("compiled", 32, 1),
                ("scan", 32, 1),
                TARGETS["b32_jax"],
                False,
            ),
            (
                "batch 32: micrograd_c 2 threads / 1 thread",
                ("compiled", 32, 2),
                ("compiled", 32, 1),
                TARGETS["b32_threads"],
                False,
            ),
            (
                "batch 1: micrograd_c / JAX lax.scan",
                ("compiled", 1, 1),
                ("scan", 1, 1),
                TARGETS["b1_jax"],
                False,
            ),
            (
                "batch 1: micrograd_c / hand C strict",
                ("compiled", 1, 1),
                ("hand", 1, 1),
                TARGETS["b1_hand"],
                False,
            ),
        ]
        for b, prev_b in ((128, 32), (256, 128)):
            lines.append(
                (
                    f"batch {b}: micrograd_c / batch {prev_b} (keeps scaling)",
                    ("compiled", b, 1),
                    ("compiled", prev_b, 1),
                    1.0,
                    True,
                )
            )
        lines.append(
            (
                "batch 32: float32 storage / float64",
                ("f32", 32, 1),
                ("compiled", 32, 1),
                TARGETS["f32"],
                False,
            )
        )
        for text, num, den, target, strict in lines:
            a, d = find(*num), find(*den)
            v = ratio(a, d)
            if v is None:
                verd = why_missing(*num) if a is None else why_missing(*den)
            else:
                verd = verdict(v, target, strict)
            extra = ""
            vc = cpu_ratio(a, d)
            if vc is not None and a is not None and d is not None and a.threads == d.threads == 1:
                extra = f"; per CPU-second {vc:.2f}x"
            if a is not None and a.threads > 1 and a.walls:
                cw = statistics.median(c / w for c, w in zip(a.cpus, a.walls))
                if cw < 0.85 * a.threads:
                    extra += (
                        f"; its cpu/wall was {cw:.2f}, not ~{a.threads}: other work held "
                        "the cores, so this does not measure scaling"
                    )
            if text.endswith("(keeps scaling)") and a is not None and peak_best:
                used = madds_per_image(a.batch) * statistics.median(rates(a))
                extra += f"; {used / peak_best['mul+add'] * 100:.1f}% of the mul+add peak"
            val = "  -   " if v is None else f"{v:5.2f}x"
            print(
                f"  {text:50s} = {val} (target {'>' if strict else '>='} {target:g}x) {verd}{extra}"
            )
        print("  (CNN and RNN families at batch 32 >= 1.5x PyTorch: benchmarks/models.py)")

        # ---- what else was seen --------------------------------------------------------------
        for s in runnable:
            if s.losses and any(rel(x, s.check_loss) > 1e-12 for x in s.losses):
                notes.append(
                    f"warning: {s.name} batch {s.batch}: the loss changed between "
                    f"rounds ({min(s.losses)!r} .. {max(s.losses)!r})"
                )
            cw = statistics.median(c / w for c, w in zip(s.cpus, s.walls))
            if cw > s.threads * 1.15:
                notes.append(
                    f"warning: {s.name} batch {s.batch}: cpu/wall {cw:.2f} with "
                    f"{s.threads} thread(s) asked"
                )
        waited = [
            s
            for s in runnable
            if statistics.median(c / w for c, w in zip(s.cpus, s.walls)) < 0.85 * s.threads
        ]
        if waited:
            notes.append(
                f"note: {len(waited)} of {len(runnable)} rows had cpu/wall below 0.85 "
                "per thread: they waited for a CPU (other work on the machine); compare "
                "ratios within this run, not absolute images/s"
            )
        if jaxc is not None and jaxc.threads_seen:
            notes.append(
                f"JAX's process had {jaxc.threads_seen} OS threads, all confined to "
                "the pinned CPU (cpu/wall shows how many ran)"
            )
        print(
            f"\nload average at the end: {load_avg()}; wall time of the whole run "
            f"{time.perf_counter() - t_start:.0f} s"
        )
        for note in notes:
            print(note)
    finally:
        if jaxc is not None:
            jaxc.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
