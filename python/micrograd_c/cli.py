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
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

PROG = "micrograd-c"
DATASETS = ("moons", "xor", "digits", "mnist")


class UsageError(Exception):
    """A problem the user can fix: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ---- output that survives a closed pipe ------------------------------------------------------------

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


# ---- argument types: every number is checked when the command line is read ----------------------

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


MAX_EPOCHS = 1_000_000_000
MAX_WIDTH = 1_000_000           # neurons in one layer
MAX_PARAMS = 100_000_000        # parameters in one model (800 MB of float64)
MAX_LAYERS = 64


# ---- data ---------------------------------------------------------------------------------------

@dataclass
class Data:
    """A dataset split for training: features, labels, classes (0 for ±1 binary)."""

    name: str
    Xtr: np.ndarray
    ytr: np.ndarray
    Xte: np.ndarray
    yte: np.ndarray
    classes: int

    @property
    def nin(self) -> int:
        return int(self.Xtr.shape[1])


def _has_mnist(d: str, split: str) -> bool:
    from . import datasets as ds

    return all(os.path.exists(os.path.join(d, stem)) or os.path.exists(os.path.join(d, stem + ".gz"))
               for stem in ds.MNIST_FILES[split])


def locate_mnist(data_dir: Optional[str], download: bool, log: Callable[[str], None]) -> str:
    """The directory MNIST is read from, the same way for ``train`` and ``eval``.

    ``--data-dir`` (relative to the current directory) wins; otherwise the download cache
    (``$MICROGRAD_C_DATA_DIR`` or ``~/.cache/micrograd_c/mnist``). ``--download`` fetches what
    is missing there first. Errors say which of the two options to use.
    """
    from . import datasets as ds

    cache = ds.default_data_dir()
    d = os.path.abspath(os.path.expanduser(data_dir)) if data_dir is not None else cache
    shown = data_dir if data_dir is not None else cache
    if download:
        if data_dir is not None and os.path.exists(d) and not os.path.isdir(d):
            raise ds.DatasetError(f"--data-dir {data_dir}: not a directory")
        try:
            return ds.download_mnist(d, log=log)
        except ds.DatasetError as e:
            raise ds.DatasetError(f"{e}. Without network access, pass --data-dir DIR, a directory holding "
                                  f"the MNIST IDX files ({ds.MNIST_FILES['test'][0]}.gz, ...)") from None
    if data_dir is not None and not os.path.isdir(d):
        raise ds.DatasetError(f"--data-dir {data_dir}: no such directory (give the directory that holds the "
                              f"MNIST IDX files, or add --download to fetch them there)")
    if not _has_mnist(d, "test"):
        if data_dir is None:
            raise ds.DatasetError(f"MNIST is not in {cache}: pass --data-dir DIR (a directory with the IDX files, "
                                  f"gzip or raw) or --download to fetch it there")
        raise ds.DatasetError(f"{shown}: no MNIST test files ({ds.MNIST_FILES['test'][0]}[.gz], "
                              f"{ds.MNIST_FILES['test'][1]}[.gz]); add --download to fetch them there")
    return d


def load_data(name: str, seed: int, data_dir: Optional[str], download: bool, limit: Optional[int],
              log: Callable[[str], None], purpose: str = "train") -> Data:
    """The dataset ``name`` split as ``train`` trains and evaluates it; ``purpose`` ("train" or
    "eval") only changes what is logged."""
    from . import datasets as ds

    if name in ("moons", "xor"):
        X, y = ds.make_moons(100, 0.1, seed=1337 + seed) if name == "moons" else ds.make_xor(200, 0.1, seed=seed)
        if limit:
            X, y = X[:limit], y[:limit]
        return Data(name, X, y, X, y, 0)  # micrograd's demo measures on its training set
    if name == "digits":
        X, y = ds.load_digits()
        rng = np.random.RandomState(seed)
        idx = rng.permutation(len(X))
        X, y = X[idx], y[idx]
        if limit:
            X, y = X[:limit], y[:limit]
        cut = max(1, int(len(X) * 0.8))
        return Data(name, X[:cut], y[:cut], X[cut:], y[cut:], 10)
    if name == "mnist":
        d = locate_mnist(data_dir, download, log)
        Xte, yte = ds.load_mnist(d, "test")
        if _has_mnist(d, "train"):
            Xtr, ytr = ds.load_mnist(d, "train")
        else:
            # only the test set is present: train on its first 8,000 images, evaluate on the rest
            if purpose == "train":
                log(f"{d}: no training files; training on the first 8,000 test images, evaluating on the last 2,000")
            else:
                log(f"{d}: no training files; evaluating on the last 2,000 test images (train held them out)")
            Xtr, ytr, Xte, yte = Xte[:8000], yte[:8000], Xte[-2000:], yte[-2000:]
        if limit:
            Xtr, ytr = Xtr[:limit], ytr[:limit]
            Xte, yte = Xte[:max(1, limit // 4)], yte[:max(1, limit // 4)]
        return Data(name, Xtr, ytr, Xte, yte, 10)
    raise UsageError(f"unknown dataset {name!r}")


# ---- models -------------------------------------------------------------------------------------

MODEL_FORMAT = "micrograd-c-model"
_META = "__meta__"


def _publish(tmp: str, path: str) -> None:
    """Rename a finished temporary file into place, with the permissions open() would have given."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def check_save_path(path: str) -> None:
    """Refuse a ``--save`` path that cannot be written, before any training happens."""
    if os.path.isdir(path):
        raise UsageError(f"--save {path}: is a directory")
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise UsageError(f"--save {path}: the directory {d} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=".micrograd-c-", suffix=".tmp")
    except OSError as e:
        raise UsageError(f"--save {path}: cannot write in {d} ({e.strerror})") from None
    os.close(fd)
    os.remove(probe)


def save_model(path: str, model: Any, meta: Dict[str, Any]) -> None:
    """Write a model as .npz: PyTorch-shaped arrays plus a JSON metadata entry.

    Written to a temporary file in the same directory and renamed into place, so ``path`` is
    either the old file or the complete new one; the temporary file never outlives the call.
    """
    arrays = model.state_dict()
    meta = dict(meta, format=MODEL_FORMAT, version=1, sizes=model.sizes)
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    except OSError as e:
        raise UsageError(f"{path}: cannot write the model ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{_META: np.array(json.dumps(meta))}, **arrays)
        _publish(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise UsageError(f"{path}: cannot write the model ({e.strerror or e})") from None
        raise


def _npy_header(zf: Any, info: Any) -> Tuple[Tuple[int, ...], np.dtype, bool, int]:
    """Shape, dtype, Fortran order and data offset of one .npy member, reading only its header."""
    from numpy.lib import format as npf

    with zf.open(info) as f:
        version = npf.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npf.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npf.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        return tuple(shape), dtype, fortran, f.tell()


def _read_model_file(path: str) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """Metadata and arrays of a model file, checked against each other before anything large is read.

    The metadata's layer sizes fix every array's shape; each member's .npy header and its size in
    the archive must agree with that shape before its data is read, and a compressed member may
    not claim more than deflate can expand (1032:1). So memory is bounded by the file's size.
    """
    import zipfile

    from .nn import ACTIVATIONS

    file_size = os.stat(path).st_size
    if os.path.isdir(path):
        raise IsADirectoryError(path)
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a micrograd-c model file (not a .npz archive)")
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > 2 * MAX_LAYERS + 1:
            raise UsageError(f"{path}: not a micrograd-c model file ({len(infos)} entries)")
        members = {}
        for info in infos:
            if not info.filename.endswith(".npy") or info.filename[:-4] in members:
                raise UsageError(f"{path}: not a micrograd-c model file (entry {info.filename[:60]!r})")
            if info.compress_type == zipfile.ZIP_STORED:
                plausible = info.file_size == info.compress_size <= file_size
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                plausible = info.compress_size <= file_size and info.file_size <= 1032 * info.compress_size + 1024
            else:
                plausible = False
            if not plausible:
                raise UsageError(f"{path}: not a micrograd-c model file (entry {info.filename[:60]!r} "
                                 f"claims {info.file_size:,} bytes)")
            members[info.filename[:-4]] = info
        meta_info = members.get(_META)
        if meta_info is None:
            raise UsageError(f"{path}: not a micrograd-c model file (no metadata)")
        shape, dtype, _, _ = _npy_header(zf, meta_info)
        if shape != () or dtype.kind != "U" or meta_info.file_size > 1 << 20:
            raise UsageError(f"{path}: not a micrograd-c model file (metadata of shape {shape}, type {dtype})")
        with zf.open(meta_info) as f:
            meta = json.loads(str(np.lib.format.read_array(f, allow_pickle=False)))
        if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
            raise UsageError(f"{path}: not a micrograd-c model file")
        sizes = meta.get("sizes")
        if (not isinstance(sizes, list) or not 2 <= len(sizes) <= MAX_LAYERS + 1 or
                not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WIDTH for n in sizes)):
            raise UsageError(f"{path}: the model's layer sizes are missing or invalid")
        activation = meta.get("activation", "relu")
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise UsageError(f"{path}: unknown activation {str(activation)[:40]!r}")
        nparams = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        if nparams > MAX_PARAMS:
            raise UsageError(f"{path}: the model's sizes declare {nparams:,} parameters, more than {MAX_PARAMS:,}")
        expected: Dict[str, Tuple[int, ...]] = {}
        for i in range(len(sizes) - 1):
            expected[f"layers.{i}.weight"] = (sizes[i + 1], sizes[i])
            expected[f"layers.{i}.bias"] = (sizes[i + 1],)
        names = set(members) - {_META}
        if names != set(expected):
            missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
            raise UsageError(f"{path}: the arrays do not match the layer sizes {sizes} "
                             f"(missing {missing[:4]}, unexpected {[n[:40] for n in extra[:4]]})")
        for name, want in expected.items():
            shape, dtype, fortran, offset = _npy_header(zf, members[name])
            if shape != want:
                raise UsageError(f"{path}: {name}: expected shape {want}, got {shape}")
            if dtype.kind != "f" or dtype.itemsize not in (4, 8) or fortran:
                raise UsageError(f"{path}: {name}: expected float64 data, got {dtype}")
            if members[name].file_size != offset + int(np.prod(want)) * dtype.itemsize:
                raise UsageError(f"{path}: {name}: the archive's size for it does not match its shape {want}")
        arrays = {}
        for name in expected:
            with zf.open(members[name]) as f:
                arrays[name] = np.lib.format.read_array(f, allow_pickle=False).astype(np.float64)
    return meta, arrays


def load_model(path: str) -> Tuple[Any, Dict[str, Any]]:
    """Read a model written by :func:`save_model`; raises UsageError when it is not one.

    Everything is validated before the model is built: no file, however crafted, makes this
    allocate more than its own size allows (and at most :data:`MAX_PARAMS` parameters).
    """
    from .nn import MLP

    try:
        meta, arrays = _read_model_file(path)
    except UsageError:
        raise
    except FileNotFoundError:
        raise UsageError(f"{path}: no such model file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a model file") from None
    except Exception as e:  # noqa: BLE001 - untrusted bytes: zipfile, numpy's header parser and json
        # raise many types on malformed input (BadZipFile, ValueError, tokenize errors, found by fuzzing)
        raise UsageError(f"{path}: not a micrograd-c model file ({e.__class__.__name__}: {str(e)[:200]})") from None
    sizes = meta["sizes"]
    model = MLP(sizes[0], sizes[1:], activation=meta.get("activation", "relu"))
    model.load_state_dict(arrays)
    return model, meta


# ---- train --------------------------------------------------------------------------------------

DEFAULTS = {  # dataset: (hidden, loss, epochs, lr, batch size, l2)
    "moons": ([16, 16], "hinge", 100, 0.1, 10, 1e-4),
    "xor": ([8], "hinge", 50, 0.1, 10, 1e-4),
    "digits": ([32], "xent", 20, 0.05, 1, 0.0),
    "mnist": ([50], "xent", 1, 0.01, 1, 0.0),
}

#: The training curve gets about this many points whatever the number of epochs (one epoch of
#: MNIST still draws a curve): an epoch is trained in this many C calls when epochs are few.
CURVE_POINTS = 100


def _defaults_text(i: int, fmt: Callable[[Any], str] = str) -> str:
    return ", ".join(f"{fmt(v[i])} for {k}" for k, v in DEFAULTS.items())


def parse_hidden(text: str) -> List[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--hidden {text!r}: expected widths such as 16,16") from None
    if any(not 1 <= s <= MAX_WIDTH for s in sizes):
        raise UsageError(f"--hidden {text!r}: every width must be between 1 and {MAX_WIDTH:,}")
    if len(sizes) >= MAX_LAYERS:
        raise UsageError(f"--hidden {text!r}: at most {MAX_LAYERS - 1} hidden layers")
    return sizes


def _progress(args: argparse.Namespace, epochs: int) -> Tuple[Any, bool]:
    """The epoch iterator: a tqdm bar on a terminal; in a log, plain lines (see _train_epochs)."""
    bar: Any = range(epochs)
    if args.quiet or not sys.stderr.isatty():
        return bar, False
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return bar, False
    return tqdm(bar, desc="train", unit="epoch", file=sys.stderr, dynamic_ncols=True, mininterval=0.25), True


def cmd_train(args: argparse.Namespace) -> int:
    import micrograd_c as mc
    from .nn import MLP

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    if args.save:
        check_save_path(args.save)  # before training: a bad path must not cost the trained model
    hidden0, loss0, epochs0, lr0, bs0, l2_0 = DEFAULTS[args.dataset]
    hidden = parse_hidden(args.hidden) if args.hidden is not None else hidden0
    loss_kind = args.loss or loss0
    epochs = args.epochs if args.epochs is not None else epochs0
    lr = args.lr if args.lr is not None else lr0
    l2 = args.l2 if args.l2 is not None else l2_0
    data = load_data(args.dataset, args.seed, args.data_dir, args.download, args.limit, log)
    batch = min(args.batch_size if args.batch_size is not None else bs0, len(data.Xtr))
    if loss_kind == "hinge" and data.classes:
        raise UsageError("--loss hinge needs a two-class dataset (moons, xor)")
    nout = data.classes or 1
    sizes = [data.nin] + hidden + [nout]
    nparams = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    if nparams > MAX_PARAMS:
        raise UsageError(f"--hidden: MLP{tuple(sizes)} has {nparams:,} parameters, more than {MAX_PARAMS:,}")
    build_loss(loss_kind, [], 0.0, data.classes, check_only=True)

    random.seed(args.seed)
    model = MLP(data.nin, hidden + [nout], activation=args.activation)
    params = model.parameters()
    x, y = mc.inputs(data.nin), mc.inputs(1)
    out = model(x)
    out = out if isinstance(out, list) else [out]
    loss = build_loss(loss_kind, out, y[0], data.classes)
    if l2:
        loss = loss + l2 * mc.vsum([p * p for p in params])
    t0 = time.perf_counter()
    if args.backend == "eager":
        prog = None
        backend_name = "eager"
    else:
        prog = mc.compile(loss, inputs=x, targets=y, params=params, outputs=out, backend=args.backend)
        backend_name = prog.backend + (f" ({prog.info.get('compiler')})" if prog.backend == "c" else "")
    build_s = time.perf_counter() - t0
    log(f"{data.name}: {len(data.Xtr)} training samples, {data.nin} features; MLP({data.nin}, {hidden + [nout]}), "
        f"{len(params)} parameters; {loss_kind} loss" + (f" + {l2:g} L2" if l2 else "")
        + f"; backend {backend_name} (ready in {build_s:.2f} s)")

    meta = {"activation": args.activation, "dataset": data.name, "loss": loss_kind}
    bar, use_bar = _progress(args, epochs)
    history: List[Tuple[float, float]] = []
    curve: List[Tuple[float, float]] = []
    try:
        train_time = _train_epochs(args, bar, use_bar, epochs, prog, model, data, loss_kind, l2, lr, batch,
                                   history, curve)
    except KeyboardInterrupt:
        # a C call trains whole batches (eager steps are applied with SIGINT held), so the
        # parameters are those of the last completed step: keep them
        if prog is not None:
            prog.write_back()
        print(f"{PROG}: interrupted after {len(history)} complete epoch(s)", file=sys.stderr)
        if args.save:
            save_model(args.save, model, meta)
            print(f"{PROG}: model saved to {args.save}", file=sys.stderr)
        return 130
    if prog is not None:
        prog.write_back()
    if args.save:  # first: whatever happens to stdout, the model is kept
        save_model(args.save, model, meta)
    rate = len(data.Xtr) * epochs / train_time if train_time > 0 else float("inf")
    final_acc = history[-1][1]
    split = "training set" if data.classes == 0 else "held-out set"
    say(f"final loss {history[-1][0]:.5f}, accuracy {final_acc:.4f} on the {split} ({len(data.yte)} samples)")
    say(f"trained {epochs} epoch(s) in {train_time:.2f} s: {rate:,.0f} samples/s ({backend_name})")
    if args.save:
        say(f"model saved to {args.save}")
    if not args.no_plot:
        path = args.plot or f"{data.name}.png"
        try:
            written = plot(path, data, prog, model, history, curve)
        except ImportError:
            if args.plot:
                raise UsageError("--plot needs matplotlib: pip install 'micrograd-c[plot]'") from None
            log("no plot: matplotlib is not installed (pip install 'micrograd-c[plot]')")
        else:
            say(f"plot written to {written}")
    return 0


def _train_epochs(args: argparse.Namespace, bar: Any, use_bar: bool, epochs: int, prog: Any, model: Any,
                  data: Data, loss_kind: str, l2: float, lr: float, batch: int,
                  history: List[Tuple[float, float]], curve: List[Tuple[float, float]]) -> float:
    """The epoch loop of ``train``; appends (loss, accuracy) per epoch to ``history`` and
    (epoch as a fraction, mean loss) per part of an epoch to ``curve``; returns the training time.

    With few epochs an epoch is trained in several C calls over consecutive whole batches of
    one shuffled order, so that the curve has about CURVE_POINTS points.
    """
    n = len(data.Xtr)
    parts = max(1, min(-(-CURVE_POINTS // epochs), -(-n // batch)))
    chunk = -(-n // parts)
    chunk = -(-chunk // batch) * batch  # whole batches per call
    every = 1 if epochs <= 20 else -(-epochs // 10)  # plain log lines: about ten of them
    train_time, nan_warned = 0.0, False
    for epoch in bar:
        seed = args.seed * 1_000_003 + epoch
        t = time.perf_counter()
        if chunk >= n:
            if prog is not None:
                lv = prog.fit(data.Xtr, data.ytr, epochs=1, lr=lr, batch_size=batch, shuffle=True,
                              seed=seed, threads=args.threads)[0]
            else:
                lv = eager_epoch(model, data, loss_kind, l2, lr, batch, seed)
            curve.append((epoch + 1.0, lv))
        else:
            order = np.random.RandomState(seed % (2**32)).permutation(n)
            total = 0.0
            for start in range(0, n, chunk):
                idx = order[start:start + chunk]
                if prog is not None:
                    part = prog.fit(data.Xtr[idx], data.ytr[idx], epochs=1, lr=lr, batch_size=batch,
                                    shuffle=False, threads=args.threads)[0]
                else:
                    part = eager_epoch(model, data, loss_kind, l2, lr, batch, seed, order=idx)
                total += part * len(idx)
                curve.append((epoch + (start + len(idx)) / n, part))
            lv = total / n
        train_time += time.perf_counter() - t
        acc = accuracy(predict(prog, model, data.Xte), data.yte, data.classes)
        history.append((lv, acc))
        if math.isnan(lv) and not nan_warned:
            print(f"{PROG}: warning: the loss became NaN in epoch {epoch + 1}: lower --lr"
                  + (" or --l2" if l2 else ""), file=sys.stderr)
            nan_warned = True
        if use_bar:
            bar.set_postfix(loss=f"{lv:.4f}", acc=f"{acc:.3f}")
        elif not args.quiet and ((epoch + 1) % every == 0 or epoch + 1 == epochs):
            print(f"epoch {epoch + 1}/{epochs}  loss {lv:.5f}  accuracy {acc:.4f}", file=sys.stderr)
    return train_time


def build_loss(kind: str, out: List[Any], y: Any, classes: int, check_only: bool = False) -> Any:
    from . import functional as F

    if kind == "xent" and classes < 2:
        raise UsageError("--loss xent needs a classification dataset (digits, mnist)")
    if kind not in ("hinge", "mse", "xent"):
        raise UsageError(f"unknown loss {kind!r}")
    if check_only:
        return None
    if kind == "hinge":
        return F.hinge(out, [y])
    if kind == "mse":
        return F.mse(out, [y])
    return F.cross_entropy(out, y)


def accuracy(scores: np.ndarray, y: np.ndarray, classes: int) -> float:
    if len(y) == 0:
        return float("nan")
    if classes == 0:
        return float(np.mean((scores[:, 0] > 0) == (y > 0)))
    return float(np.mean(np.argmax(scores, axis=1) == y))


def predict(prog: Any, model: Any, X: np.ndarray) -> np.ndarray:
    if prog is not None:
        return prog.predict(X)
    from . import checkpoint
    rows = []
    with checkpoint():
        for row in X:
            o = model(list(row))
            rows.append([v.data for v in (o if isinstance(o, list) else [o])])
    return np.array(rows, dtype=np.float64).reshape(len(X), -1)


def eager_epoch(model: Any, data: Data, loss_kind: str, l2: float, lr: float, batch: int, seed: int,
                order: Optional[np.ndarray] = None) -> float:
    """One epoch (or the samples ``order``) with Values, micrograd style, for --backend eager;
    returns the mean loss."""
    import micrograd_c as mc

    params = model.parameters()
    if order is None:
        order = np.random.RandomState(seed % (2**32)).permutation(len(data.Xtr))
    total = 0.0
    for b in range(0, len(order), batch):
        idx = order[b:b + batch]
        with mc.checkpoint():
            for s in idx:
                out = model(list(data.Xtr[s]))
                out = out if isinstance(out, list) else [out]
                loss = build_loss(loss_kind, out, float(data.ytr[s]), data.classes)
                if l2:
                    loss = loss + l2 * mc.vsum([p * p for p in params])
                loss.backward()
                total += loss.data
        with _sigint_held():  # a step is applied whole or not at all
            for p in params:
                p.data -= lr / len(idx) * p.grad
                p.grad = 0.0
    return total / len(order)


class _sigint_held:
    """Defers Ctrl-C until the block ends (main thread only)."""

    def __enter__(self) -> "_sigint_held":
        import signal
        import threading

        self.pending = False
        self.old = None
        if threading.current_thread() is threading.main_thread():
            def hold(signum: int, frame: Any) -> None:
                self.pending = True
            self.old = signal.signal(signal.SIGINT, hold)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        if self.pending:
            raise KeyboardInterrupt


def plot(path: str, data: Data, prog: Any, model: Any, history: Sequence[Tuple[float, float]],
         curve: Sequence[Tuple[float, float]] = ()) -> str:
    """The decision boundary for 2-D datasets (as micrograd's demo draws it), else the loss curve
    (``curve``: about CURVE_POINTS points, so one epoch is a line, not a dot) and the held-out
    accuracy after each epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    if data.nin == 2 and data.classes == 0:
        X, y = data.Xtr, data.ytr
        h = 0.02
        x_min, x_max = X[:, 0].min() - 1, X[:, 0].max() + 1
        y_min, y_max = X[:, 1].min() - 1, X[:, 1].max() + 1
        xx, yy = np.meshgrid(np.arange(x_min, x_max, h), np.arange(y_min, y_max, h))
        grid = np.c_[xx.ravel(), yy.ravel()]
        Z = (predict(prog, model, grid)[:, 0] > 0).reshape(xx.shape)
        ax.contourf(xx, yy, Z, cmap=plt.cm.Spectral, alpha=0.8)
        ax.scatter(X[:, 0], X[:, 1], c=y, s=40, cmap=plt.cm.Spectral, edgecolors="k")
        ax.set_xlim(xx.min(), xx.max())
        ax.set_ylim(yy.min(), yy.max())
        ax.set_title(f"{data.name}: decision boundary, accuracy {history[-1][1]:.2f}")
    else:
        pts = list(curve) or [(i + 1.0, h_[0]) for i, h_ in enumerate(history)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label="training loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("mean training loss")
        ax2 = ax.twinx()
        accs = [h_[1] for h_ in history]
        ax2.plot(range(1, len(accs) + 1), accs, marker="s", color="tab:green", label="accuracy")
        ax2.set_ylabel("held-out accuracy (after each epoch)")
        ax.set_title(f"{data.name}: training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.path.abspath(path)


# ---- eval, export-c, bench ---------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    model, meta = load_model(args.model)
    dataset = args.dataset or meta.get("dataset")
    if dataset not in DATASETS:
        raise UsageError(f"{args.model}: the model file does not name a known dataset: pass --dataset")
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    data = load_data(dataset, args.seed, args.data_dir, args.download, args.limit, log, purpose="eval")
    if data.nin != model.sizes[0]:
        raise UsageError(f"{args.model}: the model takes {model.sizes[0]} inputs, {dataset} has {data.nin} features")
    nout = data.classes or 1
    if model.sizes[-1] != nout:
        raise UsageError(f"{args.model}: the model has {model.sizes[-1]} outputs, {dataset} needs {nout}")
    import micrograd_c as mc
    x = mc.inputs(data.nin)
    out = model(x)
    out = out if isinstance(out, list) else [out]
    prog = mc.compile(None, inputs=x, outputs=out, backend="tape")
    scores = prog.predict(data.Xte)
    acc = accuracy(scores, data.yte, data.classes)
    say(f"{dataset}: accuracy {acc:.4f} on {len(data.yte)} samples")
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
    import micrograd_c as mc

    if not _IDENT.match(args.prefix):
        raise UsageError(f"--prefix {args.prefix[:40]!r}: must be a C identifier (letters, digits, _), "
                         f"at most 64 characters")
    model, meta = load_model(args.model)
    x = mc.inputs(model.sizes[0])
    out = model(x)
    out = out if isinstance(out, list) else [out]
    prog = mc.compile(None, inputs=x, outputs=out, backend="tape")
    src = prog.c_source(prefix=args.prefix, inference_only=True)
    # Nothing read from the model file or a path reaches the source except numbers and names
    # checked here: a file's metadata is untrusted (a dataset of "*/ code /*" would plant code).
    dataset = meta.get("dataset")
    trained = f", trained on {dataset}" if dataset in DATASETS else ""
    sizes = ", ".join(str(int(n)) for n in model.sizes)
    header = (f"/* Exported by micrograd-c: an MLP({sizes}){trained}.\n"
              f" * Call {args.prefix}infer(x, y, NULL): x has {int(model.sizes[0])} inputs, y receives "
              f"{int(model.sizes[-1])} outputs. Link with -lm. */\n")
    d = os.path.dirname(os.path.abspath(args.output))
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(args.output) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(header + src)
            _publish(tmp, args.output)
        except BaseException:
            os.remove(tmp)
            raise
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write ({e.strerror or e})") from None
    say(f"wrote {args.output} ({len(src) // 1024} KB): {args.prefix}infer(const double *x, double *y, double *work); "
        f"compile with: cc -std=c11 -O2 -c {args.output}, link with -lm")
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


# ---- entry point --------------------------------------------------------------------------------

def _version() -> str:
    from . import __version__

    return f"{PROG} {__version__} (Python {sys.version.split()[0]}, numpy {np.__version__})"


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train, evaluate, export and benchmark micrograd_c models.")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    def data_opts(q: argparse.ArgumentParser, train: bool) -> None:
        q.add_argument("--dataset", choices=DATASETS,
                       help="default: moons" if train else "default: the dataset the model was trained on")
        q.add_argument("--data-dir", metavar="DIR",
                       help="directory of MNIST IDX files (gzip or raw), relative to the current directory; "
                            "default: the download cache ($MICROGRAD_C_DATA_DIR or ~/.cache/micrograd_c/mnist)")
        q.add_argument("--download", action="store_true",
                       help="fetch the MNIST files missing in --data-dir (default: the cache) first, verified "
                            "by SHA-256")
        q.add_argument("--limit", type=_int_in(1, 10**9), metavar="N",
                       help="use at most N training samples (and N/4 held-out ones for mnist); default: all")
        q.add_argument("--seed", type=_int_in(0, 2**31 - 1), default=0, help="default: 0")
        q.add_argument("--quiet", action="store_true", help="only the results")
        q.add_argument("--debug", action="store_true", help="show tracebacks")

    t = sub.add_parser("train", help="train a model (the moons demo by default)",
                       description="Train an MLP; with no options, micrograd's moons demo, compiled to C.")
    data_opts(t, True)
    t.set_defaults(dataset="moons")
    t.add_argument("--hidden", metavar="W,W", help="hidden layer widths; default: "
                   + _defaults_text(0, lambda h: ",".join(map(str, h))))
    from .nn import ACTIVATIONS

    t.add_argument("--activation", choices=[a for a in ACTIVATIONS if a != "linear"], default="relu",
                   help="hidden layers' activation; default: relu")
    t.add_argument("--loss", choices=["hinge", "mse", "xent"], help="default: " + _defaults_text(1))
    t.add_argument("--l2", type=_float_in(0.0, 1e6, False), metavar="X",
                   help="L2 penalty; default: " + _defaults_text(5, lambda v: f"{v:g}"))
    t.add_argument("--epochs", type=_int_in(1, MAX_EPOCHS), metavar="N", help="default: " + _defaults_text(2))
    t.add_argument("--lr", type=_float_in(0.0, 1e300, True), metavar="X",
                   help="learning rate; default: " + _defaults_text(3, lambda v: f"{v:g}"))
    t.add_argument("--batch-size", type=_int_in(1, 10**9), metavar="N",
                   help="default: " + _defaults_text(4))
    t.add_argument("--threads", type=_int_in(1, 256), default=1, metavar="N",
                   help="threads per batch (results do not depend on it); default: 1")
    t.add_argument("--backend", choices=["eager", "tape", "c", "auto"], default="auto",
                   help="eager: Values as in micrograd; tape: the frozen program, interpreted; c: compiled; "
                        "auto: c when a compiler works, else tape (default)")
    t.add_argument("--save", metavar="MODEL.npz", help="write the trained model (checked before training)")
    t.add_argument("--plot", metavar="PATH", help="where to write the PNG; default: DATASET.png")
    t.add_argument("--no-plot", action="store_true", help="no PNG")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="accuracy and confusion matrix of a saved model",
                       description="Accuracy and confusion matrix of a saved model, on the data train held out.")
    e.add_argument("model", help="a model file written by train --save")
    data_opts(e, False)
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export-c", help="write a dependency-free C inference function",
                       description="Write the model as self-contained C (only <math.h>; link with -lm).")
    x.add_argument("model", help="a model file written by train --save")
    x.add_argument("-o", "--output", required=True, metavar="FILE.c")
    x.add_argument("--prefix", default="model_", help="symbol prefix, a C identifier; default: model_")
    x.add_argument("--debug", action="store_true", help="show tracebacks")
    x.set_defaults(func=cmd_export_c)

    b = sub.add_parser("bench", help="benchmark micrograd, eager, tape, compiled, PyTorch and JAX",
                       description="Per-sample SGD across engines; references that are not installed are "
                                   "listed as skipped (pip install 'micrograd-c[bench]').")
    b.add_argument("--repeat", type=_int_in(1, 1000), default=5, metavar="N", help="runs per figure; default: 5")
    b.add_argument("--quick", action="store_true", help="fewer samples, for a smoke test")
    b.add_argument("--debug", action="store_true", help="show tracebacks")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = make_parser().parse_args(argv)
        if not getattr(args, "command", None):
            raise UsageError("a command is needed: train, eval, export-c or bench")
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away: not worth a message
        _silence_stdout()
        return 0
    except Exception as e:  # noqa: BLE001 - the CLI's one place that turns errors into a line
        if debug:
            raise
        from .compiler import CompileError
        from .datasets import DatasetError
        if isinstance(e, CompileError):
            msg = str(e).splitlines()[0] + " (use --backend tape to run without a compiler)"
        elif isinstance(e, (UsageError, DatasetError)):
            msg = str(e)
        else:
            msg = f"{e.__class__.__name__}: {e} (run with --debug for the traceback)"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
