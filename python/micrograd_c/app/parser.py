"""The ``micrograd-c`` command line: every option, with every number checked as it is read."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ..modelfile import MAX_LAYERS, MAX_PARAMS, MAX_WIDTH
from .data import DATASETS, DEFAULTS
from .trainer import BACKENDS, LOSSES

PROG = "micrograd-c"
MAX_EPOCHS = 1_000_000_000


class UsageError(Exception):
    """A problem the user can fix: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo:,} and {hi:,}, got {text}")
        return v

    return parse


def _float_in(lo: float, hi: float, lo_open: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi
        if not ok:
            bound = "greater than" if lo_open else "at least"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound} {lo:g}, got {text}")
        return v

    return parse


def parse_hidden(text: str) -> list[int]:
    """``--hidden 16,16`` as widths; a :class:`UsageError` for anything a model file cannot hold."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--hidden {text!r}: expected widths such as 16,16") from None
    if any(not 1 <= s <= MAX_WIDTH for s in sizes):
        raise UsageError(f"--hidden {text!r}: every width must be between 1 and {MAX_WIDTH:,}")
    if len(sizes) >= MAX_LAYERS:
        raise UsageError(f"--hidden {text!r}: at most {MAX_LAYERS - 1} hidden layers")
    return sizes


def check_param_count(sizes: list[int]) -> None:
    """A :class:`UsageError` for a model of more parameters than a model file may hold."""
    nparams = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    if nparams > MAX_PARAMS:
        raise UsageError(
            f"--hidden: MLP{tuple(sizes)} has {nparams:,} parameters, more than {MAX_PARAMS:,}"
        )


def _defaults_text(field: str, fmt: Callable[[Any], str] = str) -> str:
    return ", ".join(f"{fmt(getattr(v, field))} for {k}" for k, v in DEFAULTS.items())


def _version() -> str:
    import numpy as np

    from .. import __version__

    return f"{PROG} {__version__} (Python {sys.version.split()[0]}, numpy {np.__version__})"


def make_parser() -> argparse.ArgumentParser:
    """The parser; a parsed command line has ``command`` (``None`` without one) and the options."""
    from ..nn import ACTIVATIONS

    p = _Parser(prog=PROG, description="Train, evaluate, export and benchmark micrograd_c models.")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    def data_opts(q: argparse.ArgumentParser, train: bool) -> None:
        q.add_argument(
            "--dataset",
            choices=DATASETS,
            help="default: moons" if train else "default: the dataset the model was trained on",
        )
        q.add_argument(
            "--data-dir",
            metavar="DIR",
            help="directory of MNIST IDX files (gzip or raw), relative to the current directory; "
            "default: the download cache ($MICROGRAD_C_DATA_DIR, else micrograd_c/mnist in "
            "$XDG_CACHE_HOME or ~/.cache)",
        )
        q.add_argument(
            "--download",
            action="store_true",
            help="fetch the MNIST files missing in --data-dir (default: the cache) first, verified "
            "by SHA-256",
        )
        q.add_argument(
            "--limit",
            type=_int_in(1, 10**9),
            metavar="N",
            help="use at most N samples (moons, xor: N; digits: N, 80%% of them training; mnist: "
            "N training and N/4 held-out); default: "
            + ("all" if train else "the limit the model was trained with (else all)"),
        )
        q.add_argument(
            "--seed",
            type=_int_in(0, 2**31 - 1),
            default=0 if train else None,
            help="default: 0; it generates moons and xor, shuffles digits before its split, and "
            "orders the training samples"
            if train
            else "default: the seed the model was trained with (0 if its file does not say); it "
            "generates moons and xor and shuffles digits before its split: a seed or limit whose "
            "held-out digits the model trained on is refused",
        )
        q.add_argument("--quiet", action="store_true", help="only the results")
        q.add_argument("--debug", action="store_true", help="show tracebacks")

    t = sub.add_parser(
        "train",
        help="train a model (the moons demo by default)",
        description="Train an MLP; with no options, micrograd's moons demo, compiled to C.",
    )
    data_opts(t, True)
    t.set_defaults(dataset="moons")
    t.add_argument(
        "--hidden",
        metavar="W,W",
        help="hidden layer widths; default: "
        + _defaults_text("hidden", lambda h: ",".join(map(str, h))),
    )
    t.add_argument(
        "--activation",
        choices=[a for a in ACTIVATIONS if a != "linear"],
        default="relu",
        help="hidden layers' activation; default: relu",
    )
    t.add_argument("--loss", choices=LOSSES, help="default: " + _defaults_text("loss"))
    t.add_argument(
        "--l2",
        type=_float_in(0.0, 1e6, False),
        metavar="X",
        help="L2 penalty; default: " + _defaults_text("l2", lambda v: f"{v:g}"),
    )
    t.add_argument(
        "--epochs",
        type=_int_in(1, MAX_EPOCHS),
        metavar="N",
        help="default: " + _defaults_text("epochs"),
    )
    t.add_argument(
        "--lr",
        type=_float_in(0.0, 1e300, True),
        metavar="X",
        help="learning rate; default: " + _defaults_text("lr", lambda v: f"{v:g}"),
    )
    t.add_argument(
        "--batch-size",
        type=_int_in(1, 10**9),
        metavar="N",
        help="default: " + _defaults_text("batch_size"),
    )
    t.add_argument(
        "--threads",
        type=_int_in(1, 256),
        default=1,
        metavar="N",
        help="threads per batch (results do not depend on it); default: 1",
    )
    t.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="eager: Values as in micrograd; tape: the frozen program, interpreted; c: compiled; "
        "auto: c when a compiler works, else tape (default)",
    )
    t.add_argument(
        "--float32",
        action="store_true",
        help="float32 storage (compiled code: --backend c or auto): half the memory traffic, "
        "float32 precision; default: float64",
    )
    t.add_argument(
        "--save", metavar="MODEL.npz", help="write the trained model (checked before training)"
    )
    t.add_argument("--plot", metavar="PATH", help="where to write the PNG; default: DATASET.png")
    t.add_argument("--no-plot", action="store_true", help="no PNG")

    e = sub.add_parser(
        "eval",
        help="accuracy and confusion matrix of a saved model",
        description="Accuracy and confusion matrix of a saved model, on the samples train "
        "evaluated on: MNIST's and digits' held-out part; moons' and xor's training set, as "
        "micrograd's demo does. The model file records the dataset, seed and limit train used "
        "(and for MNIST whether it trained on the test set's first 80%%); eval uses them unless "
        "--dataset, --seed or --limit say otherwise.",
    )
    e.add_argument("model", help="a model file written by train --save")
    data_opts(e, False)

    x = sub.add_parser(
        "export-c",
        help="write a dependency-free C inference function",
        description="Write the model as self-contained C (only <math.h>; link with -lm).",
    )
    x.add_argument("model", help="a model file written by train --save")
    x.add_argument("-o", "--output", required=True, metavar="FILE.c")
    x.add_argument(
        "--prefix", default="model_", help="symbol prefix, a C identifier; default: model_"
    )
    x.add_argument("--debug", action="store_true", help="show tracebacks")

    b = sub.add_parser(
        "bench",
        help="benchmark micrograd, eager, tape, compiled, PyTorch and JAX",
        description="Per-sample SGD across engines; references that are not installed are "
        "listed as skipped (pip install 'micrograd-c[bench]').",
    )
    b.add_argument(
        "--repeat",
        type=_int_in(1, 1000),
        default=5,
        metavar="N",
        help="runs per figure; default: 5",
    )
    b.add_argument("--quick", action="store_true", help="fewer samples, for a smoke test")
    b.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


__all__ = ["make_parser", "parse_hidden", "check_param_count", "UsageError", "PROG", "MAX_EPOCHS"]
