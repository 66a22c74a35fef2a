"""Frozen programs: freeze a graph once, then train it in C with no Python in the loop."""

from __future__ import annotations

import ctypes
import numbers
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _core
from ..engine import Value
from .codecache import CompiledProgram, _remove, build_library, load_library
from .toolchain import CompileError, Probes, default_flags, find_compiler

_SIZE_MAX = 2**64 - 1  # the largest count libmg takes (size_t, uint64_t)


def kernel_isa() -> str:
    """Which build of the tape interpreter's loop-nest kernels this process runs.

    ``"avx512"``, ``"avx2"`` or ``"baseline"``: libmg carries one build per vector extension on
    x86-64 and picks the widest the CPU supports the first time a program runs (or this is
    called); the environment variable ``MG_ISA`` (``baseline``, ``avx2`` or ``avx512``), read at
    that moment, caps the pick. Every build computes the same bits, so this changes only speed;
    benchmarks print it next to their figures. Compiled programs (``backend="c"``) run their own
    code, built for the flags they were compiled with.
    """
    return str(_core.kernel_isa())


def _count(name: str, value: Any, least: int, most: int = _SIZE_MAX) -> int:
    """An integer argument in ``[least, most]``, or a one-line ``TypeError``/``ValueError``."""
    if type(value) is int and least <= value <= most:  # the common case, without the checks below
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} ({value!r})")
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}")
    if value > most:
        raise ValueError(f"{name} must be at most {most}, got {value}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    """A bool argument (numpy's included), or a one-line ``TypeError``: ``"no"`` is not False."""
    if value is True or value is False:
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} ({value!r})")
    return bool(value)


def _real(name: str, value: Any) -> float:
    """A real-number argument (int, float, numpy scalars; not bool or str) as a float."""
    if type(value) is float:  # the common case: the ABC check below costs a microsecond
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not {type(value).__name__} ({value!r})")
    return float(value)


def _values(name: str, value: Any) -> list[Any]:
    """A sequence argument of Values (``inputs``, ``targets``, ``params``, ``outputs``) as a list,
    or a one-line ``TypeError`` naming it: None, a lone Value or a number is not a sequence."""
    message = (
        f"{name} must be a sequence of Values (an empty list for none), not {type(value).__name__}"
    )
    if value is None or isinstance(value, (Value, str, bytes, numbers.Number)):
        raise TypeError(message)
    try:
        return list(value)
    except TypeError:
        raise TypeError(message) from None


def inputs(n: int, value: float = 0.0) -> list[Value]:
    """Return ``n`` placeholder Values (leaves) to build a graph over, for :func:`compile`."""
    if n < 0:
        raise ValueError("n must be non-negative")
    return [Value(value) for _ in range(n)]


# ---- programs -------------------------------------------------------------------------------


@dataclass
class Program:
    """A frozen, possibly compiled, training program. See :func:`compile`."""

    tape: Any
    backend: str
    info: dict[str, Any] = field(default_factory=dict)
    _lib: Any = None
    #: Epochs :meth:`fit` has trained (``first_epoch=prog.epochs_trained`` goes on from them).
    epochs_trained: int = 0

    @property
    def parameters(self) -> np.ndarray:
        """The parameters as a writable numpy view (in the order given to :func:`compile`)."""
        return self.tape.data()[: self.tape.nparams]

    @property
    def grad(self) -> np.ndarray:
        """The parameters' accumulated gradients (a numpy view)."""
        return self.tape.grad()[: self.tape.nparams]

    @property
    def loss(self) -> float:
        """The loss computed by the last :meth:`forward` (NaN without a loss)."""
        return self.tape.loss

    def forward(self, x: Any, y: Any = None) -> np.ndarray:
        """Run one sample; returns the outputs. ``y`` sets the targets (for :attr:`loss`)."""
        return self.tape.forward(x, y)

    def backward(self) -> None:
        """Backward after :meth:`forward`: parameter gradients accumulate until :meth:`step`."""
        self.tape.backward()

    def step(self, lr: float, count: int = 1) -> None:
        """SGD: ``param -= lr / count * grad``, then parameter gradients restart at zero."""
        self.tape.step(_real("lr", lr), _count("count", count, 1))

    def fit(
        self,
        X: Any,
        Y: Any = None,
        epochs: int = 1,
        lr: float = 0.1,
        batch_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = False,
        threads: int = 1,
        first_epoch: int = 0,
    ) -> list[float]:
        """Train for ``epochs`` epochs, one C call per epoch; returns each epoch's mean loss.

        With ``shuffle``, each epoch's order depends on ``seed`` and on the epoch's number,
        ``first_epoch``, ``first_epoch + 1``, ...: a call is a function of its arguments and the
        parameters, so calls with the same ``seed`` and ``first_epoch`` repeat the same orders.
        To go on shuffling anew across calls (``fit(epochs=1)`` in a loop), pass
        ``first_epoch=prog.epochs_trained`` (the epochs fit has trained): three such calls train
        as one ``fit(epochs=3)``.

        ``X`` has shape (n, ninputs) and ``Y`` (n, ntargets) (or (n,) for one target);
        C-contiguous float64 arrays are used without copies, and so is a C-contiguous float32
        ``X`` (half the memory of float64, and the same results as its values in float64: a
        float32 program reads it at half the memory traffic). The GIL is released while C runs.
        Each epoch starts from zero gradients for every parameter (gradients left by
        :meth:`backward` are discarded). ``batch_size`` larger than the data means one batch;
        ``threads`` spreads each batch's samples over threads, and the result does not depend on
        it (bitwise), since batches are cut into the same chunks, summed in the same order.
        Cross-entropy targets must be class indices and hinge labels in ``Y`` -1 or +1; a bad row
        raises ``ValueError`` naming it and its column (targets a graph computes are not checked:
        a bad one gives a NaN loss, as IEEE arithmetic does). The step is ``p -= lr * grad`` in
        IEEE arithmetic, as in PyTorch: ``lr=0`` leaves every parameter unchanged unless its
        gradient is NaN or infinite (a NaN or infinity in ``X``), since ``0 * inf`` is NaN.
        """
        epochs = _count("epochs", epochs, 0)
        batch_size = _count("batch_size", batch_size, 1)
        threads = _count("threads", threads, 1)
        seed = _count("seed", seed, 0)
        first = _count("first_epoch", first_epoch, 0, _SIZE_MAX - epochs)
        lr = _real("lr", lr)
        shuffle = _flag("shuffle", shuffle)
        progress = _flag("progress", progress)
        X = np.asarray(X)
        X = np.ascontiguousarray(X, dtype=np.float32 if X.dtype == np.float32 else np.float64)
        Y = None if Y is None else np.ascontiguousarray(Y, dtype=np.float64)
        if Y is not None and not self.tape.ntargets:
            raise ValueError("fit: this program has no targets: pass Y=None")
        if X.ndim >= 1 and X.shape[0] == 0:
            raise ValueError("fit: X has no rows (a mean loss over no samples is undefined)")
        bar: Any = range(epochs)
        if progress:
            try:
                from tqdm.auto import tqdm

                bar = tqdm(bar, desc="epochs", unit="epoch")
            except ImportError:
                warnings.warn(
                    "progress=True needs tqdm (pip install 'micrograd-c[progress]')", stacklevel=2
                )
        losses: list[float] = []
        for epoch in bar:
            losses.append(
                self.tape.fit_epoch(
                    X, Y, batch_size, lr, bool(shuffle), seed, first + epoch, threads
                )
            )
            self.epochs_trained += 1
            if progress and hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{losses[-1]:.4g}")
        return losses

    def predict(self, X: Any) -> np.ndarray:
        """Outputs for each row of ``X`` (shape (n, ninputs)) as an (n, noutputs) array.

        Rows run through the loop nests many at a time, as a batched :meth:`fit` runs them (an
        MLP's rows 1.9x faster than one at a time), with bitwise the outputs of :meth:`forward`
        row by row. It takes no targets: a program with an output computed from a target (a loss
        among its outputs) raises ``ValueError``; :meth:`forward` takes them."""
        return self.tape.predict(X)

    def trim(self) -> int:
        """Free the working memory that batched :meth:`fit` and :meth:`predict` calls keep for
        the next call (the samples in flight and each chunk's gradients, about twice the size of
        the parameters' gradients), so that a loop calling ``fit`` once per batch does not allocate
        it every time; returns the bytes freed. The next such call allocates it again."""
        return self.tape.trim()

    def write_back(self) -> int:
        """Copy the trained parameters into the Values they were frozen from; returns how many."""
        return self.tape.write_back()

    def describe(self) -> str:
        """A readable listing of what the compiler made of the graph: the forward and backward
        loop nests (sizes, what each computes, each operand's affine index), the sequential
        loops recovered from repeated steps, the losses, and which nests run compiled."""
        return self.tape.describe()

    def c_source(self, prefix: str = "mgc_", inference_only: bool = False) -> str:
        """The program as self-contained C (inference-only: parameters inlined as constants).
        For a float32 program, the training code is the float32 code it runs (every nest)."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string, not {type(prefix).__name__}")
        if "\0" in prefix:
            raise ValueError("prefix must be a C identifier: it contains a NUL character")
        inference_only = _flag("inference_only", inference_only)
        if self.info.get("float32") and not inference_only:
            return self.tape.emit_c(prefix, False, True, _every_nest(self.info))
        return self.tape.emit_c(prefix, inference_only)


def _every_nest(info: dict[str, Any]) -> int:
    """A ``max_kernels`` that compiles every loop nest of the program ``info`` describes (what
    float32 storage needs: libmg interprets double slots only)."""
    return max(int(info["forward_nests"]) + int(info["backward_nests"]), 1)


def compile(
    loss: Value | None,
    inputs: Sequence[Value],
    targets: Sequence[Value] = (),
    params: Sequence[Value] = (),
    outputs: Sequence[Value] = (),
    backend: str = "auto",
    *,
    cc: str | None = None,
    flags: Sequence[str] | None = None,
    cache: str | None = None,
    timeout: float = 600.0,
    raise_loops: bool = True,
    fast_math: bool = False,
    float32: bool = False,
    max_kernels: int = 0,
) -> Program:
    """Freeze the graph of ``loss`` (and ``outputs``) into a program; see the module docstring.

    ``inputs`` and ``targets`` are placeholder leaves (:func:`inputs`) loaded from each sample;
    ``params`` are the leaves training updates; every other leaf is frozen as a constant.
    ``backend`` is ``"tape"``, ``"c"`` or ``"auto"``; ``cc`` and ``flags`` override the compiler
    (default ``$CC`` or the first working of cc, gcc, clang, tcc) and :data:`DEFAULT_FLAGS`.
    ``raise_loops`` (default on) recovers the loops the graph was written with: reductions, loop
    nests over independent nodes of one shape (weights shared across positions included), and
    sequential loops over repeated steps. Forward values equal the scalar program's bit for bit;
    gradients agree within 1e-12 (sums over shared weights run in a fixed order of their own).
    ``max_kernels`` bounds how many loop nests are compiled (hottest first; 0: libmg's default);
    the others run libmg's interpreter kernels. ``fast_math`` adds ``-ffast-math`` (off by
    default: it lets the compiler reassociate sums, so results change). ``float32=True`` (compiled
    code only) keeps every slot, value, gradient and parameter, in float32: half the memory traffic,
    and results that agree with float64 to float32's precision, not to 1e-12. libmg's one driver
    runs it (every method, threads and batches; bitwise the same for any thread count); every
    loop nest is compiled (libmg's interpreter runs double slots only), so ``max_kernels`` must be
    0 or at least the program's nest count. Parameters read back (``params``, :meth:`write_back`)
    are float32 values.
    Raises :class:`CompileError` when ``backend="c"`` cannot compile.
    """
    if backend not in ("auto", "tape", "c"):
        raise ValueError(f"backend must be 'auto', 'tape' or 'c', not {backend!r}")
    max_kernels = _count("max_kernels", max_kernels, 0)
    timeout = _real("timeout", timeout)
    if not timeout > 0:  # NaN included
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    raise_loops = _flag("raise_loops", raise_loops)
    fast_math = _flag("fast_math", fast_math)
    float32 = _flag("float32", float32)
    if cc is not None and not isinstance(cc, str):
        raise TypeError(f"cc must be a command string such as 'gcc', not {type(cc).__name__}")
    if flags is not None and (isinstance(flags, str) or not all(isinstance(f, str) for f in flags)):
        raise TypeError("flags must be a list of strings such as ['-O2'], not a string")
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"cache must be a directory path, not {type(cache).__name__}")
    if float32 and backend != "c":
        raise ValueError("float32 storage is a property of compiled code: use backend='c'")
    seqs = [
        _values(name, value)
        for name, value in (
            ("inputs", inputs),
            ("targets", targets),
            ("params", params),
            ("outputs", outputs),
        )
    ]
    probes = Probes()  # the compiler's, run while the graph freezes
    try:
        if backend != "tape":
            probes.start(cc, flags is None)
        t0 = time.perf_counter()
        tape = _core.Tape(loss, seqs[0], seqs[1], seqs[2], seqs[3], raise_loops)
        freeze_s = time.perf_counter() - t0
    except BaseException:
        probes.finish(cancel=True)
        raise
    probes.finish()
    info: dict[str, Any] = {
        "freeze_seconds": freeze_s,
        "nslots": tape.nslots,
        "ninstr": tape.ninstr,
        **tape.stats(),
    }
    if backend == "tape":
        return Program(tape, "tape", info)
    try:
        if float32:
            nests = _every_nest(info)
            if max_kernels and max_kernels < nests:
                raise ValueError(
                    f"float32 storage compiles every loop nest: max_kernels={max_kernels} is "
                    f"below this program's {nests} nests (pass 0)"
                )
            max_kernels = nests
        return _compile_c(tape, info, cc, flags, cache, timeout, fast_math, max_kernels, float32)
    except CompileError as e:
        if backend == "c":
            raise
        warnings.warn(
            f"compiling failed, falling back to the tape interpreter: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
        return Program(tape, "tape", info)


def _compile_c(
    tape: Any,
    info: dict[str, Any],
    cc: str | None,
    flags: Sequence[str] | None,
    cache: str | None,
    timeout: float,
    fast_math: bool = False,
    max_kernels: int = 0,
    float32: bool = False,
) -> Program:
    tc = find_compiler(cc)
    fl = list(default_flags(tc) if flags is None else flags)
    if fast_math:
        fl.append("-ffast-math")
    prefix = "mgc_"
    t0 = time.perf_counter()
    source = tape.emit_c(prefix, False, float32, max_kernels)
    info["emit_seconds"] = time.perf_counter() - t0
    info["source_bytes"] = len(source.encode())
    for attempt in range(2):
        built = build_library(source, tc, fl, cache=cache, timeout=timeout)
        try:
            t1 = time.perf_counter()
            lib = load_library(built["path"], tape, prefix, float32=float32)
            info["load_seconds"] = time.perf_counter() - t1
            break
        except OSError as err:
            if attempt or not built["cached"]:  # one we just built does not load: report it
                raise CompileError(
                    f"the compiled library {built['path']} does not load", built["command"]
                ) from err
            warnings.warn(f"{err}; rebuilding it", RuntimeWarning, stacklevel=3)
            _remove(built["path"])  # a corrupt or foreign cache entry: rebuild it once
    info.update(
        compiler=tc.name,
        compiler_version=tc.version,
        flags=fl,
        cached=built["cached"],
        compile_seconds=built["compile_seconds"],
        library=built["path"],
        float32=float32,
    )
    program = CompiledProgram.in_dll(lib, prefix + "program")
    tape.attach(ctypes.addressof(program), lib)
    return Program(tape, "c", info, lib)
