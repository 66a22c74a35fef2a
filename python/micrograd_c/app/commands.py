"""The ``micrograd-c`` command: train, eval, export-c, bench.

    micrograd-c train                      # micrograd's moons demo, compiled, with a plot
    micrograd-c train --dataset mnist --data-dir DIR --hidden 50 --epochs 1
    micrograd-c eval model.npz --dataset moons
    micrograd-c export-c model.npz -o model.c
    micrograd-c bench

Errors a person can meet (a bad option, a missing or corrupt data file, a model of the wrong
shape, no C compiler) end with one line on stderr and exit status 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import modelfile
from .._fs import atomic_write
from ..nn import MLP
from .data import DATASETS, DEFAULTS, Data, held_out_leak, load_data
from .parser import PROG, UsageError, check_param_count, make_parser, parse_hidden
from .plots import plot
from .trainer import TrainConfig, Trainer, accuracy, check_loss

# ---- output that survives a closed pipe ---------------------------------------------------------


def say(msg: str) -> None:
    """Print a result line on stdout; a reader that went away (``| head``) is not an error.

    After a broken pipe, stdout is pointed at /dev/null so that the command still finishes its
    work (a model is still saved) and exits without a traceback at interpreter shutdown.
    """
    try:
        print(msg, flush=True)
    except BrokenPipeError:
        _silence_stdout()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _logger(quiet: bool) -> Callable[[str], None]:
    if quiet:
        return lambda msg: None
    return lambda msg: print(msg, file=sys.stderr)


# ---- model files ---------------------------------------------------------------------------------


def check_save_path(path: str, option: str = "--save") -> None:
    """Refuse an output path (``--save``, ``--plot``) that cannot be written, before any training
    happens."""
    if not path:
        raise UsageError(f"{option}: the path is empty")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory")
    d = os.path.dirname(os.path.abspath(path))
    if os.path.exists(d) and not os.path.isdir(d):
        raise UsageError(f"{option} {path}: {d} is not a directory")
    if not os.path.isdir(d):
        raise UsageError(f"{option} {path}: the directory {d} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=".micrograd-c-", suffix=".tmp")
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot write in {d} ({e.strerror})") from None
    os.close(fd)
    os.remove(probe)


def check_plot_format(path: str) -> None:
    """Refuse a ``--plot`` path whose format matplotlib cannot write (or no matplotlib), before
    any training happens. A path without an extension gets ``.png``."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'micrograd-c[plot]'") from None
    ext = os.path.splitext(path)[1][1:].lower()
    formats = Figure().canvas.get_supported_filetypes()
    if ext and ext not in formats:
        raise UsageError(
            f"--plot {path}: matplotlib cannot write .{ext} files (it writes "
            f"{', '.join('.' + f for f in sorted(formats))})"
        )


def save_model(path: str, model: MLP, meta: dict[str, Any]) -> None:
    """``model.save(path, meta)``; a write that fails is a :class:`UsageError`."""
    try:
        model.save(path, meta)
    except OSError as e:
        raise UsageError(f"{path}: cannot write the model ({e.strerror or e})") from None


def load_model(path: str) -> tuple[MLP, dict[str, Any]]:
    """The model in ``path`` and its metadata; anything but a readable model file is a
    :class:`UsageError` (see :func:`micrograd_c.modelfile.load`)."""
    try:
        return modelfile.load(path)
    except modelfile.ModelFileError as e:
        raise UsageError(str(e)) from None
    except FileNotFoundError:
        raise UsageError(f"{path}: no such model file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a model file") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the model ({e.strerror or e})") from None


# ---- train ---------------------------------------------------------------------------------------


class _Progress:
    """Per epoch: a tqdm bar on a terminal; in a log, about ten plain lines; a warning, once, when
    the loss becomes NaN."""

    def __init__(self, args: argparse.Namespace, epochs: int, l2: float) -> None:
        self.args, self.epochs, self.l2 = args, epochs, l2
        self.every = 1 if epochs <= 20 else -(-epochs // 10)
        self.nan_warned = False
        self.bar: Any = None
        if not args.quiet and sys.stderr.isatty():
            try:
                from tqdm.auto import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(
                    total=epochs,
                    desc="train",
                    unit="epoch",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    mininterval=0.25,
                )

    def __call__(self, epoch: int, loss: float, acc: float) -> None:
        if math.isnan(loss) and not self.nan_warned:
            print(
                f"{PROG}: warning: the loss became NaN in epoch {epoch + 1}: lower --lr"
                + (" or --l2" if self.l2 else ""),
                file=sys.stderr,
            )
            self.nan_warned = True
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}")
        elif not self.args.quiet and ((epoch + 1) % self.every == 0 or epoch + 1 == self.epochs):
            print(
                f"epoch {epoch + 1}/{self.epochs}  loss {loss:.5f}  accuracy {acc:.4f}",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_train(args: argparse.Namespace) -> int:
    log = _logger(args.quiet)
    if args.save is not None:
        check_save_path(args.save)  # before training: a bad path must not cost the trained model
    plot_path = None if args.no_plot else args.plot
    if plot_path is not None:
        check_save_path(plot_path, "--plot")
        check_plot_format(plot_path)
    d = DEFAULTS[args.dataset]
    hidden = parse_hidden(args.hidden) if args.hidden is not None else d.hidden
    cfg = TrainConfig(
        loss=args.loss or d.loss,
        l2=args.l2 if args.l2 is not None else d.l2,
        epochs=args.epochs if args.epochs is not None else d.epochs,
        lr=args.lr if args.lr is not None else d.lr,
        batch_size=args.batch_size if args.batch_size is not None else d.batch_size,
        threads=args.threads,
        seed=args.seed,
        backend=args.backend,
        float32=args.float32,
    )
    if args.float32 and args.backend not in ("c", "auto"):
        raise UsageError(f"--float32 is compiled code: --backend c or auto, not {args.backend}")
    data = load_data(
        args.dataset,
        args.seed,
        args.data_dir,
        args.download,
        args.limit,
        log,
        dtype=np.float32 if args.float32 else np.float64,
    )
    if args.save and not args.no_plot:
        plot_to = plot_path or f"{data.name}.png"
        if os.path.abspath(plot_to) == os.path.abspath(args.save):
            raise UsageError(
                f"--save {args.save}: the plot would be written over the model "
                f"({'--plot' if plot_path else 'the default plot'} is the same file)"
            )
    try:
        check_loss(cfg.loss, data.classes)
    except ValueError as e:
        raise UsageError(f"--loss {e}") from None
    nout = data.classes or 1
    check_param_count([data.nin] + hidden + [nout])

    random.seed(args.seed)
    model = MLP(data.nin, hidden + [nout], activation=args.activation)
    trainer = Trainer(model, data, cfg)
    log(
        f"{data.name}: {len(data.Xtr)} training samples, {data.nin} features; "
        f"MLP({data.nin}, {hidden + [nout]}), "
        f"{len(trainer.params)} parameters; {cfg.loss} loss"
        + (f" + {cfg.l2:g} L2" if cfg.l2 else "")
        + f"; backend {trainer.backend} (ready in {trainer.build_seconds:.2f} s)"
    )

    # what eval needs to hold out the same samples: the seed, the limit, MNIST's training file
    meta: dict[str, Any] = {"dataset": data.name, "loss": cfg.loss, "seed": args.seed}
    if args.limit is not None:
        meta["limit"] = args.limit
    if data.trained_from:
        meta["mnist_training"] = data.trained_from
    progress = _Progress(args, cfg.epochs, cfg.l2)
    try:
        result = trainer.fit(progress)
    finally:
        progress.close()
    if result.interrupted:
        # the model holds the parameters of the last completed step (see app.trainer): keep them
        print(f"{PROG}: interrupted after {len(result.history)} complete epoch(s)", file=sys.stderr)
        if args.save:
            save_model(args.save, model, meta)
            print(f"{PROG}: model saved to {args.save}", file=sys.stderr)
        return 130
    if args.save:  # first: whatever happens to stdout, the model is kept
        save_model(args.save, model, meta)
    n = len(data.Xtr)
    rate = n * cfg.epochs / result.seconds if result.seconds > 0 else float("inf")
    final_loss, final_acc = result.history[-1]
    split = "training set" if data.classes == 0 else "held-out set"
    say(
        f"final loss {final_loss:.5f}, accuracy {final_acc:.4f} on the {split} "
        f"({len(data.yte)} samples)"
    )
    say(
        f"trained {cfg.epochs} epoch(s) in {result.seconds:.2f} s: {rate:,.0f} samples/s "
        f"({trainer.backend})"
    )
    if args.save:
        say(f"model saved to {args.save}")
    if not args.no_plot:
        path = plot_path or f"{data.name}.png"
        try:
            written = plot(path, data, trainer.predict, result.history, result.curve)
        except ImportError:
            if args.plot:
                raise UsageError(
                    "--plot needs matplotlib: pip install 'micrograd-c[plot]'"
                ) from None
            log("no plot: matplotlib is not installed (pip install 'micrograd-c[plot]')")
        else:
            say(f"plot written to {written}")
    return 0


# ---- eval, export-c, bench -----------------------------------------------------------------------


def _inference_program(model: MLP) -> Any:
    """The model as an inference-only frozen program (interpreted)."""
    from .. import compiler

    x = compiler.inputs(model.sizes[0])
    out = model(x)
    return compiler.compile(
        None, inputs=x, outputs=out if isinstance(out, list) else [out], backend="tape"
    )


def _recorded(
    path: str, meta: dict[str, Any], key: str, lo: int, hi: int, opt: str, given: bool
) -> int | None:
    """The integer ``meta[key]`` that train recorded (None where the file has none). Model files
    are untrusted input: anything but an integer in [lo, hi] is a :class:`UsageError` that says
    to pass ``opt`` instead, or, where that option is ``given`` (it wins, and the recorded value
    would only check the split for a leak), None."""
    v = meta.get(key)
    if v is None or (type(v) is int and lo <= v <= hi):
        return v
    if given:
        return None
    raise UsageError(
        f"{path}: the model file's {key!r} is {repr(v)[:40]}, not an integer in [{lo}, {hi}]: {opt}"
    )


#: The datasets whose samples depend on the seed (generated, or shuffled before the split).
SEEDED = ("moons", "xor", "digits")


def cmd_eval(args: argparse.Namespace) -> int:
    model, meta = load_model(args.model)
    dataset = args.dataset or meta.get("dataset")
    if dataset not in DATASETS:
        raise UsageError(
            f"{args.model}: the model file does not name a known dataset: pass --dataset"
        )
    # the split train measured on: its seed, limit (and MNIST's training file) unless given; a
    # file of an older version records none of them (seed 0 and no limit, as before)
    same = dataset == meta.get("dataset")
    seed_t = limit_t = None
    if same:
        seed_t = _recorded(
            args.model, meta, "seed", 0, 2**31 - 1, "pass --seed", args.seed is not None
        )
        limit_t = _recorded(
            args.model, meta, "limit", 1, 10**9, "pass --limit", args.limit is not None
        )
    from_t = meta.get("mnist_training") if same and dataset == "mnist" else None
    if from_t not in (None, "train", "test"):
        raise UsageError(
            f"{args.model}: the model file's 'mnist_training' is {repr(from_t)[:40]}, not "
            "'train' or 'test': pass --dataset"
        )
    seed = args.seed if args.seed is not None else seed_t if seed_t is not None else 0
    limit = args.limit if args.limit is not None else limit_t
    log = _logger(args.quiet)
    data: Data = load_data(
        dataset,
        seed,
        args.data_dir,
        args.download,
        limit,
        log,
        purpose="eval",
        mnist_from=from_t or "",
    )
    if data.split is not None and seed_t is not None:
        trained = (seed_t, limit_t)
        leaked, held, trn = held_out_leak(data, trained)
        if leaked:
            opts = [f"--seed {seed}"] if seed != seed_t else []
            opts += [f"--limit {limit}"] if limit != trained[1] else []
            raise UsageError(
                f"{' '.join(opts)}: {leaked} of the {held} samples this split holds out are "
                f"among the {trn} the model trained on (digits is shuffled with the seed, then "
                "cut 80/20), so the accuracy would not be a held-out one; without "
                f"{'these options' if len(opts) > 1 else 'it'} eval uses the model's own split"
            )
    elif dataset == "digits" and args.seed is None and seed_t is None:
        print(
            f"{PROG}: warning: {args.model} does not record the seed it was trained with: "
            "evaluating seed 0's held-out samples, which include training samples if it was "
            "trained with another (pass --seed)",
            file=sys.stderr,
        )
    kept = (
        [f"seed {seed_t}"] if seed_t is not None and args.seed is None and dataset in SEEDED else []
    )
    kept += [f"limit {limit_t}"] if limit_t is not None and args.limit is None else []
    kept += ["the test set's split"] if from_t == "test" else []
    if kept:
        log(f"{args.model}: {' and '.join(kept)}, as in training")
    if data.nin != model.sizes[0]:
        raise UsageError(
            f"{args.model}: the model takes {model.sizes[0]} inputs, "
            f"{dataset} has {data.nin} features"
        )
    nout = data.classes or 1
    if model.sizes[-1] != nout:
        raise UsageError(
            f"{args.model}: the model has {model.sizes[-1]} outputs, {dataset} needs {nout}"
        )
    scores = _inference_program(model).predict(data.Xte)
    acc = accuracy(scores, data.yte, data.classes)
    n = len(data.yte)
    say(
        f"{dataset}: accuracy {acc:.4f} on {n} held-out samples"
        if data.classes
        else f"{dataset}: accuracy {acc:.4f} on its {n} training samples (as train measures it)"
    )
    if data.classes:
        labels = list(range(data.classes))
        pred = np.argmax(scores, axis=1)
    else:
        labels = [-1, 1]
        pred = np.where(scores[:, 0] > 0, 1, -1)
    cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for t, p in zip(data.yte.astype(int), pred.astype(int)):
        cm[labels.index(t), labels.index(p)] += 1
    width = max(5, len(str(cm.max())) + 1)
    say("confusion matrix (rows: true, columns: predicted)")
    say(" " * 6 + "".join(f"{lab:>{width}}" for lab in labels))
    for lab, row in zip(labels, cm):
        say(f"{lab:>6}" + "".join(f"{v:>{width}}" for v in row))
    return 0


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def cmd_export_c(args: argparse.Namespace) -> int:
    if not _IDENT.match(args.prefix):
        raise UsageError(
            f"--prefix {args.prefix[:40]!r}: must be a C identifier (letters, digits, _), "
            f"at most 64 characters"
        )
    if os.path.exists(args.output) and os.path.samefile(args.output, args.model):
        raise UsageError(f"-o {args.output}: is the model file itself (it would be overwritten)")
    model, meta = load_model(args.model)
    src = _inference_program(model).c_source(prefix=args.prefix, inference_only=True)
    # Nothing read from the model file or a path reaches the source except numbers and names
    # checked here: a file's metadata is untrusted (a dataset of "*/ code /*" would plant code).
    dataset = meta.get("dataset")
    trained = f", trained on {dataset}" if dataset in DATASETS else ""
    sizes = ", ".join(str(int(n)) for n in model.sizes)
    header = (
        f"/* Exported by micrograd-c: an MLP({sizes}){trained}.\n"
        f" * Call {args.prefix}infer(x, y, NULL): x has {int(model.sizes[0])} inputs, y receives "
        f"{int(model.sizes[-1])} outputs. Link with -lm. */\n"
    )
    try:
        with atomic_write(args.output, "w") as f:
            f.write(header + src)
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write ({e.strerror or e})") from None
    say(
        f"wrote {args.output} ({len(src) // 1024} KB): "
        f"{args.prefix}infer(const double *x, double *y, double *work); "
        f"compile with: cc -std=c11 -O2 -c {args.output}, link with -lm"
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    if any(os.environ.get(k) != v for k, v in bench.PIN_ENV.items()):
        # references run on one thread (numpy's, PyTorch's and XLA's pools would otherwise spin on
        # the cores being measured); pools read these variables when they load, so restart
        env = dict(os.environ, **bench.PIN_ENV)
        cmd = [sys.executable, "-m", "micrograd_c", "bench", "--repeat", str(args.repeat)]
        return subprocess.call(cmd + (["--quick"] if args.quick else []), env=env)
    return bench.run(repeat=args.repeat, quick=args.quick, out=say)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": cmd_train,
    "eval": cmd_eval,
    "export-c": cmd_export_c,
    "bench": cmd_bench,
}


# ---- entry point ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = make_parser().parse_args(argv)
        if not args.command:
            raise UsageError("a command is needed: train, eval, export-c or bench")
        status = int(COMMANDS[args.command](args) or 0)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away: not worth a message
        _silence_stdout()
        return 0
    except Exception as e:
        if debug:
            raise
        from ..compiler import CompileError
        from ..datasets import DatasetError

        if isinstance(e, CompileError):
            msg = str(e).splitlines()[0] + " (use --backend tape to run without a compiler)"
        elif isinstance(e, (UsageError, DatasetError)):
            msg = str(e)
        else:
            msg = f"{e.__class__.__name__}: {e} (run with --debug for the traceback)"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2


__all__ = [
    "main",
    "cmd_train",
    "cmd_eval",
    "cmd_export_c",
    "cmd_bench",
    "load_model",
    "save_model",
    "check_save_path",
    "say",
    "COMMANDS",
]
