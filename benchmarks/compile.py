"""Issue 13's table: MLP(784,[50,10]) trained by micrograd_c against JAX, PyTorch, hand-written C
and the machine's arithmetic peak, every figure from one run.

    python benchmarks/compile.py                      # the full run (about a minute on a quiet 2-core machine)
    python benchmarks/compile.py --quick              # 1,000 images, 2 repeats: a smoke test
    python benchmarks/compile.py --batches 1,32 --threads 1,2 --repeat 7 --no-torch

The workload: MLP(784,[50,10]) (ReLU hidden layer, linear output), softmax cross-entropy, plain
SGD (one step of lr / B per batch of B samples; the last batch may be shorter), float64, one epoch
over the first --train (8,000) images of the real MNIST test set (../shared/data/mnist or
--data-dir; random images when it is absent), visited in order (no shuffle) by every system. lr
is --lr (0.01) at batch 1 and --lr-batched (0.04) above. Every system starts from micrograd_c's
initial parameters (micrograd's init under random.seed(0)), copied into its own layout.

Systems (rows), each at the batch sizes of --batches (1, 32, 128, 256):
  micrograd_c compiled   backend="c", micrograd_c's default compiler and flags (strict FP), at 1
                         thread and, above batch 1, at each count of --threads;
  micrograd_c tape       the interpreter (batch 1 and 32);
  micrograd_c float32    compile(..., float32=True) (batch 1 and 32), or "skipped: reason";
  JAX lax.scan           one jax.jit of a whole epoch: lax.scan of the SGD step over the batches
                         (the short last batch inside the same jit), float64, one thread;
  JAX jit step           a jitted SGD step called from a Python loop (batch 1 and 32);
  PyTorch eager          float64, torch.set_num_threads(1), torch.optim.SGD;
  hand C strict / fast   benchmarks/c/mlp_hand.c, the obvious loops (forward, backward into
                         gradient arrays, SGD; batches accumulate then step), built with
                         micrograd_c's flags (-O2 -ffp-contract=off -march=native) and with
                         -O3 -ffast-math -march=native.
JAX runs in a subprocess with XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1"; every one-thread row (JAX's subprocess included) is pinned with
sched_setaffinity to the same CPU (--cpu; --no-pin to turn it off), rows with more threads get
every CPU.

How the figures are made: first one verification epoch per system (it also warms caches and
JIT-compiles JAX, untimed); their first-epoch mean losses are printed and each float64 reference
must agree with micrograd_c compiled at the same batch size to 1e-6 relative, or the script stops
with exit status 1 (a benchmark that compares different computations is worthless). Then --repeat
rounds; each round runs one epoch of every system, in an order rotated from round to round, so
machine noise hits all of them alike. Each epoch starts from the initial parameters.

How to read the table:
  images/s     median over the rounds of (images / seconds of one epoch); "+-" is half the
               range of the rounds, in percent of the median: a large one means a noisy machine.
  cpu/wall     CPU time the system's process used over wall time: 1.00 is one busy core; above 1
               means more threads than asked; well below 1 means it waited for a CPU (a busy
               machine: take its figures with salt).
  vs JAX scan  per round, this row's images/s over JAX lax.scan's at the same batch size; the
               median of those ratios (not the ratio of the medians).
  peak         useful float64 multiply-adds per image for this model and training step (forward
               39,700 + output-layer input gradient 500 + weight gradients 39,700 + the SGD
               update 39,760 / B) x images/s, over the core's peak measured by
               benchmarks/c/peak.c: "mul+add" is the peak of separate multiplies and adds (what
               strict code can use), "FMA" the fused one. Rows with T threads are measured
               against T cores; float32 rows against twice the float64 peak (twice the lanes).
  loss         the first epoch's mean loss (each sample's loss before its step) and its relative
               difference from micrograd_c compiled at the same batch size.
The targets of issue 13 follow the table, each the median of per-round ratios, with PASS/FAIL.
(The issue's last target, the CNN and RNN families at batch 32, is benchmarks/models.py's.)
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import math
import os
import pickle
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

PIN_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu",
}
for _k, _v in PIN_ENV.items():  # thread pools read these when they load
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "mnist")
NIN, HIDDEN = 784, [50, 10]
SIZES = [NIN] + HIDDEN
LOSS_RTOL = 1e-6        # float64 references against micrograd_c compiled
LOSS_RTOL_F32 = 1e-3    # float32 storage: reported, never fatal
TARGETS = {"b32_jax": 1.5, "b32_threads": 1.8, "b1_jax": 5.0, "b1_hand": 2.0, "f32": 1.8}


def madds_per_image(batch: int) -> float:
    """Useful multiply-adds per image of one training step at batch size ``batch``."""
    layers = list(zip(SIZES[:-1], SIZES[1:]))
    forward = sum(i * o for i, o in layers)
    input_grads = sum(i * o for i, o in layers[1:])  # the first layer's inputs need no gradient
    weight_grads = sum(i * o for i, o in layers)
    nparams = sum((i + 1) * o for i, o in layers)
    return forward + input_grads + weight_grads + nparams / batch


# ---- the JAX worker (a subprocess: its own XLA flags, its own CPU) ---------------------------------

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
    except Exception as e:  # noqa: BLE001
        _send(out, ("error", f"{type(e).__name__}: {e}"))
        return
    X = jnp.asarray(setup["X"])
    Y = jnp.asarray(setup["Y"].astype(np.int32))
    init = tuple(jnp.asarray(a) for a in setup["params"])  # W1 (784,50), b1, W2 (50,10), b2
    n = X.shape[0]

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        W1, b1, W2, b2 = p
        h = jax.nn.relu(x @ W1 + b1)
        z = h @ W2 + b2
        return jnp.mean(jax.nn.logsumexp(z, axis=1) - jnp.take_along_axis(z, y[:, None], axis=1)[:, 0])

    vg = jax.value_and_grad(loss_fn)

    def sgd(p: Any, tot: Any, x: Any, y: Any, lr: float) -> Any:
        loss, g = vg(p, x, y)
        return tuple(a - lr * b for a, b in zip(p, g)), tot + loss * x.shape[0]

    def make_scan(batch: int, lr: float) -> Callable[[], Any]:
        nb, rem = divmod(n, batch)

        def epoch(p: Any, X: Any, Y: Any) -> Any:
            Xb = X[:nb * batch].reshape(nb, batch, X.shape[1])
            Yb = Y[:nb * batch].reshape(nb, batch)
            (p, tot), _ = jax.lax.scan(lambda c, xy: (sgd(c[0], c[1], xy[0], xy[1], lr), None),
                                       (p, jnp.zeros((), X.dtype)), (Xb, Yb))
            if rem:
                p, tot = sgd(p, tot, X[nb * batch:], Y[nb * batch:], lr)
            return p, tot / n
        f = jax.jit(epoch)
        return lambda: f(init, X, Y)

    def make_step(batch: int, lr: float) -> Callable[[], Any]:
        f = jax.jit(lambda p, tot, x, y: sgd(p, tot, x, y, lr))
        chunks = [(X[b:b + batch], Y[b:b + batch]) for b in range(0, n, batch)]
        zero = jnp.zeros((), X.dtype)

        def run() -> Any:
            p, tot = init, zero
            for x, y in chunks:
                p, tot = f(p, tot, x, y)
            return p, tot / n
        return run

    runners: Dict[Tuple[str, int], Callable[[], Any]] = {}
    _send(out, ("ok", {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                       "devices": [str(d) for d in jax.devices()],
                       "affinity": sorted(os.sched_getaffinity(0))}))
    while True:
        try:
            msg = _recv(inp)
        except EOFError:
            return
        try:
            if msg[0] == "quit":
                _send(out, ("ok", None))
                return
            if msg[0] == "prepare":  # build and JIT-compile (the first call), untimed elsewhere
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
                _send(out, ("ok", (wall, cpu, float(loss), len(os.listdir("/proc/self/task")))))
            else:
                _send(out, ("error", f"unknown message {msg[0]!r}"))
        except Exception as e:  # noqa: BLE001
            _send(out, ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class JaxClient:
    """The parent's end of the JAX worker."""

    def __init__(self, X: np.ndarray, Y: np.ndarray, params: Sequence[np.ndarray], cpu: Optional[int]) -> None:
        env = dict(os.environ, **PIN_ENV)
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--jax-worker"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.info = self.call({"X": X, "Y": Y, "params": list(params), "cpu": cpu})
        self.threads_seen = 0

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


# ---- the machine ----------------------------------------------------------------------------------

def cpu_info() -> Tuple[str, List[str]]:
    """The CPU's model name (with its family/model numbers: a virtual machine may say only "AMD
    EPYC") and its feature flags, from /proc/cpuinfo."""
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    key, value = (x.strip() for x in line.split(":", 1))
                    fields.setdefault(key, value)
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        model += f" (family {fields['cpu family']}, model {fields['model']}, stepping {fields.get('stepping', '?')})"
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return model, flags


def isa_summary(flags: List[str]) -> str:
    keep = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512vl", "avx512bw", "avx512_fp16",
            "asimd", "sve", "sve2"]
    have = [f for f in keep if f in flags]
    return " ".join(have) if have else "(no SIMD flags listed)"


def vector_widths(flags: List[str]) -> List[int]:
    """Vector widths (float64 lanes) worth measuring: what the ISA has natively."""
    widths = [1, 2]
    if "avx" in flags:
        widths.append(4)
    if "avx512f" in flags:
        widths.append(8)
    return widths


def march_native(tc: Any) -> str:
    try:
        r = subprocess.run(tc.command + ["-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                           timeout=30)
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "-march=":
                return parts[1]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "?"


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def build_so(tc: Any, flags: List[str], src: str, out: str, extra: Sequence[str] = ()) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(tc.command + list(flags) + list(extra) + ["-fPIC", "-shared", "-o", out, src, "-lm"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(tc.command + list(flags))} {os.path.basename(src)}: "
                           f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return time.perf_counter() - t0


def measure_peak(tc: Any, work: str, flags: List[str], widths: List[int]) -> Dict[str, Dict[int, float]]:
    """Multiply-adds per second of one core, per variant (mul+add, FMA) and vector width."""
    src = os.path.join(HERE, "c", "peak.c")
    out: Dict[str, Dict[int, float]] = {}
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

def load_data(data_dir: str, n: int) -> Tuple[np.ndarray, np.ndarray, str]:
    from micrograd_c.datasets import DatasetError, load_mnist
    try:
        X, y = load_mnist(data_dir, "test")
        src = f"MNIST test set ({data_dir}), first {min(n, len(X)):,} images"
    except DatasetError as e:
        rng = np.random.RandomState(0)
        X, y = rng.rand(n, NIN), rng.randint(0, 10, n).astype(np.float64)
        src = f"random images (MNIST not usable: {e})"
    return np.ascontiguousarray(X[:n]), np.ascontiguousarray(y[:n].astype(np.float64)), src


def split_params(flat: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """micrograd's parameter order (per layer, per neuron: its weights, then its bias) as
    (W (out, in), b (out,)) per layer."""
    layers, at = [], 0
    for nin, nout in zip(SIZES[:-1], SIZES[1:]):
        block = flat[at:at + nout * (nin + 1)].reshape(nout, nin + 1)
        layers.append((block[:, :nin].copy(), block[:, nin].copy()))
        at += nout * (nin + 1)
    if at != len(flat):
        raise SystemExit(f"parameter mapping: {len(flat)} parameters, the layer sizes give {at}")
    return layers


def check_mapping(model: Any, layers: List[Tuple[np.ndarray, np.ndarray]]) -> None:
    """The mapping of the flat vector onto (W, b) is the model's own."""
    for li, layer in enumerate(model.layers):
        W, b = layers[li]
        for j, neuron in enumerate(layer.neurons):
            if [w.data for w in neuron.w] != W[j].tolist() or neuron.b.data != b[j]:
                raise SystemExit(f"parameter mapping: layer {li} neuron {j} differs from the flat vector")


# ---- systems -------------------------------------------------------------------------------------

@dataclass
class System:
    label: str
    batch: int
    threads: int = 1
    run: Optional[Callable[[], Tuple[float, float, float]]] = None  # () -> (wall s, cpu s, loss)
    ours: bool = False
    kind: str = ""             # compiled, tape, f32, scan, step, torch, hand, handfast
    float32: bool = False
    skipped: Optional[str] = None
    walls: List[float] = field(default_factory=list)
    cpus: List[float] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    check_loss: Optional[float] = None


def timed(reset: Callable[[], None], epoch: Callable[[], float]) -> Callable[[], Tuple[float, float, float]]:
    def run() -> Tuple[float, float, float]:
        reset()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = epoch()
        return time.perf_counter() - t0, time.process_time() - c0, float(loss)
    return run


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--jax-worker":
        jax_worker()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=DEFAULT_MNIST)
    ap.add_argument("--train", type=int, default=None, help="images in the epoch (default 8000)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds of one epoch per system (default 5)")
    ap.add_argument("--batches", default="1,32,128,256", help="batch sizes (default 1,32,128,256)")
    ap.add_argument("--threads", default="1,2", help="thread counts of micrograd_c compiled above batch 1")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate at batch 1")
    ap.add_argument("--lr-batched", type=float, default=0.04, help="SGD learning rate above batch 1")
    ap.add_argument("--compilers", default=None,
                    help="comma-separated C compilers for micrograd_c compiled rows (default: micrograd_c's "
                         "choice, $CC or cc); the first also builds the hand-written C and the peak kernel")
    ap.add_argument("--cpu", type=int, default=None, help="the CPU one-thread rows are pinned to (default: the last)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin one-thread rows to a CPU")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true", help="--train 1000 --repeat 2 unless given")
    args = ap.parse_args()
    ntrain = args.train if args.train is not None else (1000 if args.quick else 8000)
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    thread_counts = sorted({int(t) for t in args.threads.split(",") if t.strip()})
    if not batches or min(batches) < 1 or not thread_counts or min(thread_counts) < 1 or repeat < 1 or ntrain < 1:
        ap.error("batches, threads, --repeat and --train must be positive")
    lr_of = {b: (args.lr if b == 1 else args.lr_batched) for b in batches}

    import micrograd_c as mc
    from micrograd_c import compiler
    from micrograd_c.nn import MLP

    allowed = sorted(os.sched_getaffinity(0))
    pin_cpu = None if args.no_pin else (args.cpu if args.cpu is not None else allowed[-1])
    if pin_cpu is not None and pin_cpu not in allowed:
        ap.error(f"--cpu {pin_cpu}: this process may run on CPUs {allowed}")

    def pin(threads: int) -> None:
        if pin_cpu is not None:
            os.sched_setaffinity(0, {pin_cpu} if threads == 1 else set(allowed))

    model_name, flags = cpu_info()
    X, Y, data_src = load_data(args.data_dir, ntrain)
    n = len(X)
    work = tempfile.mkdtemp(prefix="mg-bench13-")
    jaxc: Optional[JaxClient] = None
    notes: List[str] = []
    try:
        # ---- micrograd_c: the model, its initial parameters, the programs --------------------
        random.seed(0)
        model = MLP(NIN, HIDDEN)
        xin, yin = mc.inputs(NIN), mc.inputs(1)
        logits = model(xin)
        loss = mc.cross_entropy(logits, yin[0])
        params = model.parameters()
        t0 = time.perf_counter()
        tape = mc.compile(loss, inputs=xin, targets=yin, params=params, outputs=logits, backend="tape")
        freeze_s = time.perf_counter() - t0
        init = tape.parameters.copy()
        layers = split_params(init)
        check_mapping(model, layers)
        (W1, b1), (W2, b2) = layers

        compilers: List[Optional[str]] = [c.strip() for c in args.compilers.split(",")] if args.compilers else [None]
        toolchains: List[Tuple[Optional[str], Any]] = []
        for c in compilers:
            try:
                toolchains.append((c, compiler.find_compiler(c)))
            except mc.CompileError as e:
                notes.append(f"no C compiler {c or '(default)'}: {str(e).splitlines()[0]}; its rows are skipped")
        tc0 = toolchains[0][1] if toolchains else None
        flags0 = compiler.default_flags(tc0) if tc0 else []

        systems: List[System] = []

        def mg_system(label: str, prog: Any, batch: int, threads: int, kind: str, f32: bool = False) -> System:
            def reset() -> None:
                prog.parameters[:] = init

            def epoch() -> float:
                return prog.fit(X, Y, epochs=1, lr=lr_of[batch], batch_size=batch, shuffle=False, threads=threads)[0]
            return System(label, batch, threads, timed(reset, epoch), ours=True, kind=kind, float32=f32)

        compile_lines: List[str] = [f"freeze (tape) {freeze_s * 1e3:.1f} ms: {tape.info['ninstr']} instructions, "
                                    f"{tape.info['nslots']:,} slots, {tape.info.get('forward_nests', '?')} forward + "
                                    f"{tape.info.get('backward_nests', '?')} backward loop nests"]
        for ci, (cname, tc) in enumerate(toolchains):
            fl = compiler.default_flags(tc)
            tag = "" if ci == 0 else f" [{tc.name}]"
            cache = tempfile.mkdtemp(dir=work)
            try:
                t0 = time.perf_counter()
                prog = mc.compile(loss, inputs=xin, targets=yin, params=params, outputs=logits, backend="c",
                                  cc=cname, cache=cache)
                total_s = time.perf_counter() - t0
                compile_lines.append(
                    f"micrograd_c compile{tag} ({tc.version}; {' '.join(fl)}): {total_s:.2f} s "
                    f"(freeze + emit + cc + load; cc alone {prog.info['compile_seconds']:.2f} s), "
                    f"C source {prog.info['source_bytes'] / 1024:.0f} KB")
                for b in batches:
                    for th in ([1] if b == 1 else thread_counts):
                        systems.append(mg_system(f"micrograd_c compiled{tag}", prog, b, th, "compiled"))
            except mc.CompileError as e:
                compile_lines.append(f"micrograd_c compile{tag}: failed: {str(e).splitlines()[0]}")
            if ci == 0:  # float32 storage, with the same compiler
                try:
                    t0 = time.perf_counter()
                    p32 = mc.compile(loss, inputs=xin, targets=yin, params=params, outputs=logits, backend="c",
                                     cc=cname, cache=cache, float32=True)
                    compile_lines.append(f"micrograd_c float32 compile: {time.perf_counter() - t0:.2f} s")
                    for b in (1, 32):
                        if b in batches:
                            systems.append(mg_system("micrograd_c float32 storage", p32, b, 1, "f32", True))
                except Exception as e:  # noqa: BLE001 - any failure is a skipped row, never a crash
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    for b in (1, 32):
                        if b in batches:
                            systems.append(System("micrograd_c float32 storage", b, kind="f32", ours=True,
                                                  float32=True, skipped=reason))
        for b in (1, 32):
            if b in batches:
                systems.append(mg_system("micrograd_c tape interpreter", tape, b, 1, "tape"))

        # ---- hand-written C -------------------------------------------------------------------
        order = np.arange(n, dtype=np.uintp)
        hand_p = np.concatenate([W1.ravel(), b1, W2.ravel(), b2])
        if tc0 is not None:
            native = ["-march=native"] if "-march=native" in flags0 else []
            for kind, label, fl in (("hand", "hand C strict", flags0),
                                    ("handfast", "hand C fast", ["-O3", "-ffast-math"] + native)):
                so = os.path.join(work, f"mlp_{kind}.so")
                try:
                    bs = build_so(tc0, fl, os.path.join(HERE, "c", "mlp_hand.c"), so)
                except RuntimeError as e:
                    notes.append(f"{label}: build failed: {e}")
                    continue
                compile_lines.append(f"{label} ({tc0.name} {' '.join(fl)}): built in {bs:.2f} s")
                lib = ctypes.CDLL(so)
                lib.mlp_nparams.restype = ctypes.c_size_t
                if lib.mlp_nparams() != len(init):
                    raise SystemExit(f"mlp_hand.c has {lib.mlp_nparams()} parameters, the model {len(init)}")
                f1 = lib.mlp_train_epoch
                f1.restype = ctypes.c_double
                f1.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_double]
                fb = lib.mlp_train_epoch_batched
                fb.restype = ctypes.c_double
                fb.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_double, ctypes.c_size_t]
                buf = np.empty_like(hand_p)
                for b in batches:
                    def reset(buf: np.ndarray = buf) -> None:
                        buf[:] = hand_p

                    def epoch(b: int = b, buf: np.ndarray = buf, f1: Any = f1, fb: Any = fb) -> float:
                        args_ = (buf.ctypes.data, X.ctypes.data, Y.ctypes.data, order.ctypes.data, n, lr_of[b])
                        return f1(*args_) if b == 1 else fb(*args_, b)
                    systems.append(System(label, b, 1, timed(reset, epoch), kind=kind))
        else:
            notes.append("no C compiler: no hand-written C rows and no peak")

        # ---- PyTorch --------------------------------------------------------------------------
        torch_ver = "not run (--no-torch)" if args.no_torch else None
        if not args.no_torch:
            pin(1)  # torch's threads inherit this thread's CPU
            try:
                import torch
            except ImportError:
                torch_ver = "not installed (pip install torch==2.13.0): no PyTorch rows"
            else:
                torch.set_num_threads(1)
                torch_ver = f"{torch.__version__}, {torch.get_num_threads()} thread"
                net = torch.nn.Sequential(torch.nn.Linear(NIN, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10)).double()
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
                            xb, yb = Xt[s:s + b], Yt[s:s + b]
                            lv = torch.nn.functional.cross_entropy(net(xb), yb)
                            opt.zero_grad()
                            lv.backward()
                            opt.step()
                            total += lv.item() * len(xb)
                        return total / n
                    systems.append(System("PyTorch eager", b, 1, timed(torch_reset, torch_epoch), kind="torch"))

        # ---- JAX (its own process) ------------------------------------------------------------
        jax_ver = "not run (--no-jax)" if args.no_jax else None
        jax_compile: List[str] = []
        if not args.no_jax:
            try:
                have_jax = importlib.util.find_spec("jax") is not None
            except (ImportError, ValueError):
                have_jax = False
            if not have_jax:
                jax_ver = "not installed (pip install jax jaxlib): no JAX rows"
            else:
                try:
                    jaxc = JaxClient(X, Y, [W1.T.copy(), b1, W2.T.copy(), b2], pin_cpu)
                    jax_ver = (f"{jaxc.info['jax']} (jaxlib {jaxc.info['jaxlib']}), {', '.join(jaxc.info['devices'])}, "
                               f"CPUs {jaxc.info['affinity']}, XLA_FLAGS=\"{PIN_ENV['XLA_FLAGS']}\"")
                except RuntimeError as e:
                    jax_ver = f"unusable ({str(e).splitlines()[0]}): no JAX rows"
                    jaxc = None
            if jaxc is not None:
                for kind, label, bs in (("scan", "JAX lax.scan epoch", batches),
                                        ("step", "JAX jit step, Python loop", [b for b in batches if b in (1, 32)])):
                    for b in bs:
                        try:
                            cs = jaxc.call(("prepare", kind, b, lr_of[b]))
                            jax_compile.append(f"{kind} b{b} {cs:.2f} s")

                            def jax_run(kind: str = kind, b: int = b) -> Tuple[float, float, float]:
                                assert jaxc is not None
                                wall, cpu, lv, nthreads = jaxc.call(("run", kind, b))
                                jaxc.threads_seen = max(jaxc.threads_seen, nthreads)
                                return wall, cpu, lv
                            systems.append(System(label, b, 1, jax_run, kind=kind))
                        except RuntimeError as e:
                            systems.append(System(label, b, kind=kind, skipped=str(e).splitlines()[0]))

        # ---- header --------------------------------------------------------------------------
        import micrograd_c
        print(f"CPU: {model_name}; ISA: {isa_summary(flags)}; {os.cpu_count()} logical CPUs, this process may use "
              f"{allowed}; one-thread rows pinned to {'CPU ' + str(pin_cpu) if pin_cpu is not None else 'nothing'}")
        print(f"load average at start: {load_avg()}")
        print(f"python {sys.version.split()[0]}, numpy {np.__version__}, micrograd_c {micrograd_c.__version__}; "
              f"C compiler: {tc0.version if tc0 else 'none'}"
              + (f", -march=native = {march_native(tc0)}" if tc0 and '-march=native' in flags0 else ""))
        print(f"PyTorch: {torch_ver}")
        print(f"JAX: {jax_ver}")
        if jax_compile:
            print(f"JAX jit compile (first call, untimed): {', '.join(jax_compile)}")
        for line in compile_lines:
            print(line)
        print(f"data: {data_src}; {n:,} images, no shuffle; lr {args.lr} at batch 1, {args.lr_batched} above; "
              f"float64 unless stated")
        for note in notes:
            print(note)

        # ---- the arithmetic peak --------------------------------------------------------------
        widths = vector_widths(flags)
        peak: Optional[Dict[str, Dict[int, float]]] = None
        if tc0 is not None:
            pin(1)
            peak = measure_peak(tc0, work, flags0, widths)

        # ---- verification epoch (also the warm-up) ------------------------------------------
        runnable = [s for s in systems if s.skipped is None and s.run is not None]
        print(f"\nverification: one epoch per system ({len(runnable)} systems), first-epoch mean losses", flush=True)
        for s in runnable:
            pin(s.threads)
            try:
                _, _, s.check_loss = s.run()
            except Exception as e:  # noqa: BLE001
                s.skipped = f"failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        runnable = [s for s in systems if s.skipped is None]

        def baseline(b: int) -> Optional[System]:
            """What the references at batch b are checked against: micrograd_c compiled (the first
            compiler, one thread), else the tape."""
            for s in runnable:
                if s.kind == "compiled" and s.batch == b and s.threads == 1 and s.label == "micrograd_c compiled":
                    return s
            return next((s for s in runnable if s.kind == "tape" and s.batch == b), None)

        def rel(a: float, b: float) -> float:
            return abs(a - b) / abs(b) if b else abs(a - b)

        bad: List[str] = []
        for b in batches:
            base = baseline(b)
            if base is None and any(s.batch == b for s in runnable):
                notes.append(f"warning: batch {b}: no micrograd_c row ran, so nothing checked the references' losses")
            for s in [s for s in runnable if s.batch == b]:
                if base is None or s is base:
                    continue
                assert s.check_loss is not None and base.check_loss is not None
                r = rel(s.check_loss, base.check_loss)
                tol = LOSS_RTOL_F32 if s.float32 else LOSS_RTOL
                if not math.isfinite(s.check_loss) or r > tol:
                    msg = (f"batch {b}: {s.label} ({s.threads} thread(s)) loss {s.check_loss!r} vs {base.label} "
                           f"{base.check_loss!r}: relative difference {r:.2e} > {tol:g}")
                    if s.float32:
                        notes.append("warning: " + msg)
                    else:
                        bad.append(msg)
        for b in batches:
            line = "  ".join(f"{s.label}{'' if s.threads == 1 else f' x{s.threads}'} {s.check_loss:.15g}"
                             for s in runnable if s.batch == b)
            print(f"  batch {b:3d}: {line}")
        if bad:
            print("\nFAIL: the systems do not compute the same thing (first-epoch losses disagree beyond "
                  f"{LOSS_RTOL:g} relative):")
            for m in bad:
                print("  " + m)
            sys.exit(1)
        diffs = [rel(s.check_loss, base.check_loss) for s in runnable if not s.float32  # type: ignore[arg-type]
                 for base in [baseline(s.batch)] if base is not None and base is not s]
        print(f"  every float64 system agrees with micrograd_c (compiled, else the tape) at its batch size to {LOSS_RTOL:g} relative "
              f"(largest difference {max(diffs, default=0.0):.1e})", flush=True)

        # ---- the timed rounds ------------------------------------------------------------------
        t_all = time.perf_counter()
        for r in range(repeat):
            k = r * len(runnable) // repeat  # start each round elsewhere in the list
            for s in runnable[k:] + runnable[:k]:
                pin(s.threads)
                wall, cpu, lv = s.run()  # type: ignore[misc]
                s.walls.append(wall)
                s.cpus.append(cpu)
                s.losses.append(lv)
            print(f"  round {r + 1}/{repeat} done ({time.perf_counter() - t_all:.0f} s; load {load_avg()})", flush=True)
        pin(2)
        if tc0 is not None and peak is not None:  # once more after the rounds: the best of both
            pin(1)
            again = measure_peak(tc0, work, flags0, widths)
            for v in peak:
                for w in peak[v]:
                    peak[v][w] = max(peak[v][w], again[v][w])
            pin(2)

        # ---- the table -----------------------------------------------------------------------
        def rates(s: System) -> List[float]:
            return [n / w for w in s.walls]

        def find(kind: str, b: int, threads: int = 1) -> Optional[System]:
            for s in runnable:
                if s.kind == kind and s.batch == b and s.threads == threads and "[" not in s.label:
                    return s
            return None

        def ratio(a: Optional[System], b: Optional[System]) -> Optional[float]:
            if a is None or b is None or not a.walls or not b.walls:
                return None
            return statistics.median(x / y for x, y in zip(rates(a), rates(b)))

        peak_best = {v: max(d.values()) for v, d in peak.items()} if peak else {}
        print("\nthe arithmetic peak of one core, float64 (benchmarks/c/peak.c, best of two measurements):")
        if peak:
            for v, d in peak.items():
                print(f"  {v:8s} " + "  ".join(f"{w}-wide {g / 1e9:6.2f}" for w, g in d.items())
                      + f"   G multiply-adds/s -> peak {peak_best[v] / 1e9:.2f}")
        else:
            print("  not measured (no C compiler)")
        print("useful multiply-adds per image: " + ", ".join(f"batch {b}: {madds_per_image(b):,.0f}" for b in batches))

        hdr = (f"{'system':30s} {'batch':>5s} {'thr':>3s} {'images/s':>10s} {'+-':>5s} {'cpu/wall':>8s} "
               f"{'vs JAX scan':>11s} {'peak mul+add':>12s} {'peak FMA':>8s}  {'first-epoch loss':>18s} {'rel. diff':>9s}")
        print(f"\nMLP(784,[50,10]), {n:,} images, one epoch per round; medians of {repeat} rounds, systems interleaved\n")
        print(hdr)
        print("-" * len(hdr))
        for b in batches:
            scan = find("scan", b)
            base = baseline(b)
            for s in [s for s in systems if s.batch == b]:
                name = s.label[:30]
                if s.skipped is not None:
                    print(f"{name:30s} {b:5d} {s.threads:3d}  skipped: {s.skipped}")
                    continue
                rs = rates(s)
                med = statistics.median(rs)
                spread = (max(rs) - min(rs)) / 2 / med * 100
                cpu_wall = statistics.median(c / w for c, w in zip(s.cpus, s.walls))
                vs = ratio(s, scan) if scan is not None else None
                vs_t = "-" if vs is None else f"{vs:.2f}x"
                pk = ""
                if peak_best:
                    scale = s.threads * (2.0 if s.float32 else 1.0)
                    used = madds_per_image(b) * med
                    pk = f"{used / (peak_best['mul+add'] * scale) * 100:11.1f}% {used / (peak_best['FMA'] * scale) * 100:7.1f}%"
                else:
                    pk = f"{'-':>12s} {'-':>8s}"
                lv = s.check_loss
                rd = "-" if base is None or s is base else f"{rel(lv, base.check_loss):.1e}"  # type: ignore[arg-type]
                print(f"{name:30s} {b:5d} {s.threads:3d} {med:10,.0f} {spread:4.1f}% {cpu_wall:8.2f} {vs_t:>11s} "
                      f"{pk} {lv:18.12f} {rd:>9s}")
            print()

        # ---- the targets ----------------------------------------------------------------------
        def verdict(v: Optional[float], target: float, strict: bool = False) -> str:
            if v is None:
                return "n/a"
            return "PASS" if (v > target if strict else v >= target) else "FAIL"

        print("targets of issue 13 (medians of per-round ratios):")
        lines: List[Tuple[str, Optional[float], float, bool, str]] = []
        c1, c32, c32t2 = find("compiled", 1), find("compiled", 32), find("compiled", 32, 2)
        lines.append(("batch 32, 1 thread: micrograd_c / JAX lax.scan", ratio(c32, find("scan", 32)), TARGETS["b32_jax"],
                      False, ""))
        lines.append(("batch 32: micrograd_c 2 threads / 1 thread", ratio(c32t2, c32), TARGETS["b32_threads"], False, ""))
        lines.append(("batch 1: micrograd_c / JAX lax.scan", ratio(c1, find("scan", 1)), TARGETS["b1_jax"], False, ""))
        lines.append(("batch 1: micrograd_c / hand C strict", ratio(c1, find("hand", 1)), TARGETS["b1_hand"], False, ""))
        prev = c32
        for b in (128, 256):
            cb = find("compiled", b)
            prev_b = prev.batch if prev is not None else "?"
            extra = ""
            if cb is not None and cb.walls and peak_best:
                extra = f", {madds_per_image(b) * statistics.median(rates(cb)) / peak_best['mul+add'] * 100:.1f}% of the mul+add peak"
            lines.append((f"batch {b}: micrograd_c / batch {prev_b} (keeps scaling)", ratio(cb, prev), 1.0, True, extra))
            prev = cb if cb is not None else prev
        f32 = find("f32", 32)
        f32_skip = next((s.skipped for s in systems if s.kind == "f32" and s.batch == 32 and s.skipped), None)
        lines.append(("batch 32: float32 storage / float64", ratio(f32, c32), TARGETS["f32"], False,
                      f" (float32 skipped: {f32_skip})" if f32_skip else ""))
        for text, v, target, strict, extra in lines:
            val = "   -  " if v is None else f"{v:5.2f}x"
            print(f"  {text:52s} = {val} (target {'>' if strict else '>='} {target:g}x) {verdict(v, target, strict)}{extra}")
        print("  (CNN and RNN families at batch 32 >= 1.5x PyTorch: benchmarks/models.py --batch 32)")

        # ---- what else was seen -------------------------------------------------------------------
        for s in runnable:
            if s.losses and any(rel(x, s.check_loss) > 1e-12 for x in s.losses):  # type: ignore[arg-type]
                notes.append(f"warning: {s.label} batch {s.batch} x{s.threads}: the loss changed between rounds "
                             f"({min(s.losses)!r} .. {max(s.losses)!r})")
            cw = statistics.median(c / w for c, w in zip(s.cpus, s.walls)) if s.walls else 1.0
            if cw > s.threads * 1.15:
                notes.append(f"warning: {s.label} batch {s.batch}: cpu/wall {cw:.2f} with {s.threads} thread(s) asked")
            elif cw < 0.85 * s.threads:
                notes.append(f"note: {s.label} batch {s.batch} x{s.threads}: cpu/wall {cw:.2f}: it waited for a CPU "
                             "(a busy machine)")
        if jaxc is not None and jaxc.threads_seen:
            notes.append(f"JAX's process had {jaxc.threads_seen} OS threads (pool threads; cpu/wall shows how many ran)")
        print(f"\nload average at the end: {load_avg()}")
        for note in notes:
            print(note)
    finally:
        if jaxc is not None:
            jaxc.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
