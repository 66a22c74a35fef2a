"""Training an MLP on a :class:`~micrograd_c.app.data.Data` split, on any backend, as
``micrograd-c train`` does; usable from Python without the command::

    import random
    from micrograd_c.nn import MLP
    from micrograd_c.app.data import load_data
    from micrograd_c.app.trainer import TrainConfig, Trainer

    data = load_data("moons")
    random.seed(0)
    model = MLP(data.nin, [16, 16, 1])
    result = Trainer(model, data, TrainConfig(loss="hinge", l2=1e-4, epochs=100, lr=0.1,
                                              batch_size=10)).fit()
    print(result.history[-1])            # (mean loss, accuracy) of the last epoch

Ctrl-C (``KeyboardInterrupt``) during :meth:`Trainer.fit` ends training with the model holding the
parameters of the last completed step: an epoch of a compiled or interpreted program is C calls
over whole batches, and an eager step is applied with SIGINT held. ``fit`` then returns with
``interrupted`` set instead of raising.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np

from .. import functional as F
from ..engine import Value, checkpoint
from ..nn import MLP
from .data import Data

LOSSES = ("hinge", "mse", "xent")
BACKENDS = ("eager", "tape", "c", "auto")

#: The training curve gets about this many points whatever the number of epochs (one epoch of
#: MNIST still draws a curve): an epoch is trained in this many C calls when epochs are few.
CURVE_POINTS = 100


def check_loss(kind: str, classes: int) -> None:
    """``ValueError`` when the loss ``kind`` does not fit a dataset of ``classes`` classes (0 for
    two classes labelled ±1)."""
    if kind not in LOSSES:
        raise ValueError(f"unknown loss {kind!r} (expected one of {', '.join(LOSSES)})")
    if kind == "xent" and classes < 2:
        raise ValueError("xent needs a classification dataset (digits, mnist)")
    if kind == "hinge" and classes:
        raise ValueError("hinge needs a two-class dataset (moons, xor)")
    if kind == "mse" and classes:
        raise ValueError("mse needs a dataset with one output (moons, xor)")


def build_loss(kind: str, out: Sequence[Value], y: Any, classes: int) -> Value:
    """The loss of outputs ``out`` against the target ``y`` (a Value or a number)."""
    check_loss(kind, classes)
    if kind == "hinge":
        return F.hinge(out, [y])
    if kind == "mse":
        return F.mse(out, [y])
    return F.cross_entropy(out, y)


def accuracy(scores: np.ndarray, y: np.ndarray, classes: int) -> float:
    """The fraction of rows of ``scores`` (n, outputs) that predict ``y``; NaN for no rows."""
    if len(y) == 0:
        return float("nan")
    if classes == 0:
        return float(np.mean((scores[:, 0] > 0) == (y > 0)))
    return float(np.mean(np.argmax(scores, axis=1) == y))


def _outputs(out: Any) -> list[Value]:
    return out if isinstance(out, list) else [out]


@dataclass
class TrainConfig:
    """What :class:`Trainer` does. ``backend``: ``"eager"`` (Values, as micrograd),
    ``"tape"`` (the frozen program, interpreted), ``"c"`` (compiled) or ``"auto"`` (``"c"`` when
    a compiler works, else ``"tape"``). ``float32``: float32 storage, compiled code only
    (``backend`` ``"c"`` or ``"auto"``, which then needs a compiler)."""

    loss: str = "hinge"
    l2: float = 0.0
    epochs: int = 1
    lr: float = 0.1
    batch_size: int = 1
    threads: int = 1
    seed: int = 0
    backend: str = "auto"
    float32: bool = False


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` did."""

    #: ``(mean training loss, held-out accuracy)`` after each completed epoch
    history: list[tuple[float, float]] = field(default_factory=list)
    #: ``(epoch as a fraction, mean loss)`` per part of an epoch (about :data:`CURVE_POINTS`)
    curve: list[tuple[float, float]] = field(default_factory=list)
    #: seconds spent training (accuracy measurements excluded)
    seconds: float = 0.0
    #: whether Ctrl-C ended training early
    interrupted: bool = False


class Trainer:
    """Per-sample SGD with batches, an optional L2 penalty, on one backend.

    The constructor builds the loss graph over placeholders and compiles it (unless the backend
    is ``"eager"``); it raises ``ValueError`` for a loss that does not fit the data and
    :class:`~micrograd_c.CompileError` when ``backend="c"`` has no working compiler.
    """

    def __init__(self, model: MLP, data: Data, config: TrainConfig) -> None:
        if config.backend not in BACKENDS:
            raise ValueError(
                f"unknown backend {config.backend!r} (expected one of {', '.join(BACKENDS)})"
            )
        if config.float32 and config.backend not in ("c", "auto"):
            raise ValueError(
                f"float32 storage is compiled code: backend 'c' or 'auto', not {config.backend!r}"
            )
        check_loss(config.loss, data.classes)
        self.model, self.data, self.config = model, data, config
        self.batch = max(1, min(config.batch_size, len(data.Xtr)))
        self.params = model.parameters()
        t0 = time.perf_counter()
        self.program: Any = None
        if config.backend == "eager":
            self.backend = "eager"
        else:
            from .. import compiler

            x, y = compiler.inputs(data.nin), compiler.inputs(1)
            out = _outputs(model(x))
            loss = build_loss(config.loss, out, y[0], data.classes)
            if config.l2:
                loss = loss + config.l2 * F.vsum([p * p for p in self.params])
            self.program = compiler.compile(
                loss,
                inputs=x,
                targets=y,
                params=self.params,
                outputs=out,
                backend="c" if config.float32 else config.backend,
                float32=config.float32,
            )
            compiler_name = self.program.info.get("compiler")
            self.backend = self.program.backend + (
                f" ({compiler_name}{', float32' if config.float32 else ''})"
                if self.program.backend == "c"
                else ""
            )
        #: seconds the program took to build (0 for eager)
        self.build_seconds = time.perf_counter() - t0

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The model's outputs for the rows of ``X``, shape (n, outputs)."""
        if self.program is not None:
            return np.asarray(self.program.predict(X))
        rows = []
        with checkpoint():
            for row in X:
                rows.append([v.data for v in _outputs(self.model(list(row)))])
        return np.array(rows, dtype=np.float64).reshape(len(X), -1)

    def fit(self, on_epoch: Callable[[int, float, float], None] | None = None) -> TrainResult:
        """Train ``config.epochs`` epochs; after each, ``on_epoch(epoch, mean loss, held-out
        accuracy)`` (epoch from 0). Returns the result; the model holds the trained parameters,
        also after Ctrl-C (see the module docstring)."""
        result = TrainResult()
        try:
            self._epochs(result, on_epoch)
        except KeyboardInterrupt:
            result.interrupted = True
        if self.program is not None:
            self.program.write_back()
        return result

    def _epochs(
        self, result: TrainResult, on_epoch: Callable[[int, float, float], None] | None
    ) -> None:
        """With few epochs an epoch is trained in several calls over consecutive whole batches of
        one shuffled order, so that the curve has about CURVE_POINTS points."""
        cfg, data, batch = self.config, self.data, self.batch
        n = len(data.Xtr)
        parts = max(1, min(-(-CURVE_POINTS // cfg.epochs), -(-n // batch)))
        chunk = -(-n // parts)
        chunk = -(-chunk // batch) * batch  # whole batches per call
        for epoch in range(cfg.epochs):
            seed = cfg.seed * 1_000_003 + epoch
            t = time.perf_counter()
            if chunk >= n:
                lv = self._train(None, seed, shuffle=True)
                result.curve.append((epoch + 1.0, lv))
            else:
                order = np.random.RandomState(seed % (2**32)).permutation(n)
                total = 0.0
                for start in range(0, n, chunk):
                    idx = order[start : start + chunk]
                    part = self._train(idx, seed, shuffle=False)
                    total += part * len(idx)
                    result.curve.append((epoch + (start + len(idx)) / n, part))
                lv = total / n
            result.seconds += time.perf_counter() - t
            acc = accuracy(self.predict(data.Xte), data.yte, data.classes)
            result.history.append((lv, acc))
            if on_epoch is not None:
                on_epoch(epoch, lv, acc)

    def _train(self, idx: np.ndarray | None, seed: int, shuffle: bool) -> float:
        """Trains on the samples ``idx`` (all of them, shuffled with ``seed``, when None); returns
        their mean loss."""
        cfg, data = self.config, self.data
        if self.program is not None:
            X, y = (data.Xtr, data.ytr) if idx is None else (data.Xtr[idx], data.ytr[idx])
            losses = self.program.fit(
                X,
                y,
                epochs=1,
                lr=cfg.lr,
                batch_size=self.batch,
                shuffle=shuffle,
                seed=seed if shuffle else 0,
                threads=cfg.threads,
            )
            return float(losses[0])
        if idx is None:
            idx = np.random.RandomState(seed % (2**32)).permutation(len(data.Xtr))
        return self._eager_epoch(idx)

    def _eager_epoch(self, order: np.ndarray) -> float:
        """The samples ``order`` with Values, micrograd style; returns the mean loss."""
        cfg, data, params = self.config, self.data, self.params
        total = 0.0
        for b in range(0, len(order), self.batch):
            idx = order[b : b + self.batch]
            with checkpoint():
                for s in idx:
                    out = _outputs(self.model(list(data.Xtr[s])))
                    loss = build_loss(cfg.loss, out, float(data.ytr[s]), data.classes)
                    if cfg.l2:
                        loss = loss + cfg.l2 * F.vsum([p * p for p in params])
                    loss.backward()
                    total += loss.data
            with _SigintHeld():  # a step is applied whole or not at all
                for p in params:
                    p.data -= cfg.lr / len(idx) * p.grad
                    p.grad = 0.0
        return total / len(order)


class _SigintHeld:
    """Defers Ctrl-C until the block ends (main thread only)."""

    def __enter__(self) -> _SigintHeld:
        self.pending = False
        self.old: Any = None
        if threading.current_thread() is threading.main_thread():

            def hold(signum: int, frame: FrameType | None) -> None:
                self.pending = True

            self.old = signal.signal(signal.SIGINT, hold)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        if self.pending:
            raise KeyboardInterrupt


__all__ = [
    "Trainer",
    "TrainConfig",
    "TrainResult",
    "check_loss",
    "build_loss",
    "accuracy",
    "LOSSES",
    "BACKENDS",
    "CURVE_POINTS",
]
