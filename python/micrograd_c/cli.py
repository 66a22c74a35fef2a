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
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

PROG = "micrograd-c"


class UsageError(Exception):
    """A problem the user can fix: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise UsageError(f"{message} (see '{self.prog} --help')")


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


def load_data(name: str, seed: int, data_dir: Optional[str], download: bool, limit: Optional[int],
              log: Any) -> Data:
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
        cut = int(len(X) * 0.8)
        return Data(name, X[:cut], y[:cut], X[cut:], y[cut:], 10)
    if name == "mnist":
        d = data_dir
        if download:
            d = ds.download_mnist(data_dir, log=log)
        if d is None:
            d = ds.default_data_dir()
        if not os.path.isdir(d):
            raise ds.DatasetError(f"{d}: no such directory (pass --data-dir, or --download)")
        Xte, yte = ds.load_mnist(d, "test")
        try:
            Xtr, ytr = ds.load_mnist(d, "train")
        except ds.DatasetError:
            # only the test set is present: train on its first 8,000 images, evaluate on the rest
            log(f"{d}: no training files; training on the first 8,000 test images, evaluating on the last 2,000")
            Xtr, ytr, Xte, yte = Xte[:8000], yte[:8000], Xte[-2000:], yte[-2000:]
        if limit:
            Xtr, ytr = Xtr[:limit], ytr[:limit]
            Xte, yte = Xte[:max(1, limit // 4)], yte[:max(1, limit // 4)]
        return Data(name, Xtr, ytr, Xte, yte, 10)
    raise UsageError(f"unknown dataset {name!r}")


# ---- models -------------------------------------------------------------------------------------

MODEL_FORMAT = "micrograd-c-model"


def save_model(path: str, model: Any, meta: Dict[str, Any]) -> None:
    """Write a model as .npz: PyTorch-shaped arrays plus a JSON metadata entry."""
    arrays = model.state_dict()
    meta = dict(meta, format=MODEL_FORMAT, version=1, sizes=model.sizes)
    tmp = path + ".tmp.npz"
    np.savez(tmp, __meta__=np.array(json.dumps(meta)), **arrays)
    os.replace(tmp, path)


def load_model(path: str) -> Tuple[Any, Dict[str, Any]]:
    """Read a model written by :func:`save_model`; raises UsageError when it is not one."""
    from .nn import MLP

    import zipfile
    import zlib

    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
    except FileNotFoundError:
        raise UsageError(f"{path}: no such model file") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise UsageError(f"{path}: not a micrograd-c model file ({e.__class__.__name__}: {e})") from None
    except Exception as e:  # noqa: BLE001 - untrusted bytes: numpy's header parser raises
        # tokenize.TokenError, SyntaxError and others on malformed headers (found by fuzzing)
        raise UsageError(f"{path}: not a micrograd-c model file ({e.__class__.__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise UsageError(f"{path}: not a micrograd-c model file")
    sizes = meta.get("sizes")
    activation = meta.get("activation", "relu")
    if (not isinstance(sizes, list) or len(sizes) < 2 or
            not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1_000_000 for n in sizes)):
        raise UsageError(f"{path}: the model's layer sizes are missing or invalid")
    from .nn import ACTIVATIONS

    if activation not in ACTIVATIONS:
        raise UsageError(f"{path}: unknown activation {activation!r}")
    if sum(a * b + b for a, b in zip(sizes, sizes[1:])) > 100_000_000:
        raise UsageError(f"{path}: the model is implausibly large")
    model = MLP(sizes[0], sizes[1:], activation=activation)
    try:
        model.load_state_dict(arrays)
    except (KeyError, ValueError) as e:
        raise UsageError(f"{path}: {e}") from None
    return model, meta


def build_loss(kind: str, out: List[Any], y: Any, classes: int) -> Any:
    from . import functional as F

    if kind == "hinge":
        return F.hinge(out, [y])
    if kind == "mse":
        return F.mse(out, [y])
    if kind == "xent":
        if classes < 2:
            raise UsageError("--loss xent needs a classification dataset (digits, mnist)")
        return F.cross_entropy(out, y)
    raise UsageError(f"unknown loss {kind!r}")


def accuracy(scores: np.ndarray, y: np.ndarray, classes: int) -> float:
    if len(y) == 0:
        return float("nan")
    if classes == 0:
        return float(np.mean((scores[:, 0] > 0) == (y > 0)))
    return float(np.mean(np.argmax(scores, axis=1) == y))


# ---- train --------------------------------------------------------------------------------------

DEFAULTS = {  # dataset: (hidden, loss, epochs, lr, batch size, l2)
    "moons": ([16, 16], "hinge", 100, 0.1, 10, 1e-4),
    "xor": ([8], "hinge", 50, 0.1, 10, 1e-4),
    "digits": ([32], "xent", 20, 0.05, 1, 0.0),
    "mnist": ([50], "xent", 1, 0.01, 1, 0.0),
}


def parse_hidden(text: str) -> List[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--hidden {text!r}: expected widths such as 16,16") from None
    if any(s < 1 for s in sizes):
        raise UsageError("--hidden: every width must be at least 1")
    return sizes


def cmd_train(args: argparse.Namespace) -> int:
    import micrograd_c as mc
    from .nn import MLP

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    data = load_data(args.dataset, args.seed, args.data_dir, args.download, args.limit, log)
    hidden0, loss0, epochs0, lr0, bs0, l2_0 = DEFAULTS[args.dataset]
    hidden = parse_hidden(args.hidden) if args.hidden is not None else hidden0
    loss_kind = args.loss or loss0
    epochs = args.epochs if args.epochs is not None else epochs0
    lr = args.lr if args.lr is not None else lr0
    batch = args.batch_size or bs0
    l2 = args.l2 if args.l2 is not None else l2_0
    if loss_kind == "hinge" and data.classes:
        raise UsageError("--loss hinge needs a two-class dataset (moons, xor)")
    if epochs < 1 or batch < 1 or not lr > 0 or args.threads < 1:
        raise UsageError("--epochs, --batch-size and --threads must be at least 1 and --lr positive")
    nout = data.classes or 1

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
        prog = mc.compile(loss, inputs=x, targets=y, params=params, outputs=out,
                          backend="c" if args.backend == "c" else args.backend)
        backend_name = prog.backend + (f" ({prog.info.get('compiler')})" if prog.backend == "c" else "")
    build_s = time.perf_counter() - t0
    log(f"{data.name}: {len(data.Xtr)} training samples, {data.nin} features; MLP({data.nin}, {hidden + [nout]}), "
        f"{len(params)} parameters; {loss_kind} loss" + (f" + {l2:g} L2" if l2 else "")
        + f"; backend {backend_name} (ready in {build_s:.2f} s)")

    bar: Any = range(epochs)
    use_bar = not args.quiet
    if use_bar:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(bar, desc="train", unit="epoch", file=sys.stderr, dynamic_ncols=True, mininterval=0.25)
        except ImportError:
            use_bar = False
    history: List[Tuple[float, float]] = []
    train_time, nan_warned = 0.0, False
    try:
        train_time, nan_warned = _train_epochs(args, bar, use_bar, prog, model, data, loss_kind, l2, lr, batch,
                                               history)
    except KeyboardInterrupt:
        # an epoch runs in one C call (or, eagerly, steps are applied with SIGINT held), so the
        # parameters are those of the last completed step: keep them
        if prog is not None:
            prog.write_back()
        print(f"{PROG}: interrupted after {len(history)} complete epoch(s)", file=sys.stderr)
        if args.save:
            save_model(args.save, model, {"activation": args.activation, "dataset": data.name, "loss": loss_kind})
            print(f"{PROG}: model saved to {args.save}", file=sys.stderr)
        return 130
    if not history:
        raise UsageError("no epoch was trained")
    if prog is not None:
        prog.write_back()
    rate = len(data.Xtr) * epochs / train_time if train_time > 0 else float("inf")
    final_acc = history[-1][1]
    split = "training set" if data.classes == 0 else "held-out set"
    print(f"final loss {history[-1][0]:.5f}, accuracy {final_acc:.4f} on the {split} ({len(data.yte)} samples)")
    print(f"trained {epochs} epoch(s) in {train_time:.2f} s: {rate:,.0f} samples/s ({backend_name})")
    if args.save:
        save_model(args.save, model, {"activation": args.activation, "dataset": data.name, "loss": loss_kind})
        print(f"model saved to {args.save}")
    if not args.no_plot:
        path = args.plot or f"{data.name}.png"
        try:
            written = plot(path, data, prog, model, history)
        except ImportError:
            if args.plot:
                raise UsageError("--plot needs matplotlib: pip install 'micrograd-c[plot]'") from None
            log("no plot: matplotlib is not installed (pip install 'micrograd-c[plot]')")
        else:
            print(f"plot written to {written}")
    return 0


def _train_epochs(args: argparse.Namespace, bar: Any, use_bar: bool, prog: Any, model: Any, data: Data,
                  loss_kind: str, l2: float, lr: float, batch: int,
                  history: List[Tuple[float, float]]) -> Tuple[float, bool]:
    """The epoch loop of ``train``; appends (loss, accuracy) per epoch to ``history``."""
    epochs = len(bar) if hasattr(bar, "__len__") else 0
    train_time, nan_warned = 0.0, False
    for epoch in bar:
        t = time.perf_counter()
        if prog is not None:
            lv = prog.fit(data.Xtr, data.ytr, epochs=1, lr=lr, batch_size=batch, shuffle=True,
                          seed=args.seed * 1_000_003 + epoch, threads=args.threads)[0]
        else:
            lv = eager_epoch(model, data, loss_kind, l2, lr, batch, args.seed * 1_000_003 + epoch)
        train_time += time.perf_counter() - t
        acc = accuracy(predict(prog, model, data.Xte), data.yte, data.classes)
        history.append((lv, acc))
        if math.isnan(lv) and not nan_warned:
            print(f"{PROG}: warning: the loss became NaN in epoch {epoch + 1}: lower --lr", file=sys.stderr)
            nan_warned = True
        if use_bar:
            bar.set_postfix(loss=f"{lv:.4f}", acc=f"{acc:.3f}")
        elif not args.quiet:
            print(f"epoch {epoch + 1}/{epochs}  loss {lv:.5f}  accuracy {acc:.4f}", file=sys.stderr)
    return train_time, nan_warned


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


def eager_epoch(model: Any, data: Data, loss_kind: str, l2: float, lr: float, batch: int, seed: int) -> float:
    """One epoch with Values, micrograd style (for --backend eager)."""
    import micrograd_c as mc

    params = model.parameters()
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


def plot(path: str, data: Data, prog: Any, model: Any, history: Sequence[Tuple[float, float]]) -> str:
    """The decision boundary for 2-D datasets (as micrograd's demo draws it), else the loss curve."""
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
        losses = [h_[0] for h_ in history]
        accs = [h_[1] for h_ in history]
        ax.plot(range(1, len(losses) + 1), losses, marker="o", label="training loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax2 = ax.twinx()
        ax2.plot(range(1, len(accs) + 1), accs, marker="s", color="tab:green", label="accuracy")
        ax2.set_ylabel("held-out accuracy")
        ax.set_title(f"{data.name}: training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.path.abspath(path)


# ---- eval, export-c, bench ---------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    model, meta = load_model(args.model)
    dataset = args.dataset or meta.get("dataset", "moons")
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    data = load_data(dataset, args.seed, args.data_dir, args.download, args.limit, log)
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
    print(f"{dataset}: accuracy {acc:.4f} on {len(data.yte)} samples")
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
    print("confusion matrix (rows: true, columns: predicted)")
    print(" " * 6 + "".join(f"{lab:>{width}}" for lab in labels))
    for lab, row in zip(labels, cm):
        print(f"{lab:>6}" + "".join(f"{v:>{width}}" for v in row))
    return 0


def cmd_export_c(args: argparse.Namespace) -> int:
    import micrograd_c as mc

    model, meta = load_model(args.model)
    x = mc.inputs(model.sizes[0])
    out = model(x)
    out = out if isinstance(out, list) else [out]
    prog = mc.compile(None, inputs=x, outputs=out, backend="tape")
    try:
        src = prog.c_source(prefix=args.prefix, inference_only=True)
    except ValueError as e:
        raise UsageError(f"--prefix {args.prefix!r}: {e}") from None
    header = (f"/* {os.path.basename(args.model)}: MLP{tuple(model.sizes)}, trained on {meta.get('dataset', '?')}.\n"
              f" * Call {args.prefix}infer(x, y, NULL): x has {model.sizes[0]} inputs, y receives "
              f"{model.sizes[-1]} outputs. */\n")
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        f.write(header + src)
    os.replace(tmp, args.output)
    print(f"wrote {args.output} ({len(src) // 1024} KB): {args.prefix}infer(const double *x, double *y, double *work)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1" or os.environ.get("OMP_NUM_THREADS") != "1":
        # references run on one thread (numpy's and PyTorch's pools would otherwise spin on the
        # cores being measured); thread pools read these variables when they load, so restart
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "micrograd_c", "bench", "--repeat", str(args.repeat)]
        return subprocess.call(cmd + (["--quick"] if args.quick else []), env=env)
    from . import bench
    return bench.run(repeat=args.repeat, quick=args.quick)


# ---- entry point --------------------------------------------------------------------------------

def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train, evaluate, export and benchmark micrograd_c models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    def data_opts(q: argparse.ArgumentParser) -> None:
        q.add_argument("--dataset", choices=["moons", "xor", "digits", "mnist"])
        q.add_argument("--data-dir", help="directory of MNIST IDX files (gzip or raw)")
        q.add_argument("--download", action="store_true", help="download MNIST into the user cache first")
        q.add_argument("--limit", type=int, help="use at most this many training samples")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--quiet", action="store_true")
        q.add_argument("--debug", action="store_true", help="show tracebacks")

    t = sub.add_parser("train", help="train a model (the moons demo by default)")
    data_opts(t)
    t.set_defaults(dataset="moons")
    t.add_argument("--hidden", help="hidden layer widths, e.g. 16,16")
    from .nn import ACTIVATIONS

    t.add_argument("--activation", choices=[a for a in ACTIVATIONS if a != "linear"], default="relu")
    t.add_argument("--loss", choices=["hinge", "mse", "xent"])
    t.add_argument("--l2", type=float, help="L2 penalty (moons/xor default 1e-4, as micrograd's demo)")
    t.add_argument("--epochs", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--threads", type=int, default=1, help="threads per batch (results do not depend on it)")
    t.add_argument("--backend", choices=["eager", "tape", "c", "auto"], default="auto")
    t.add_argument("--save", metavar="MODEL.npz")
    t.add_argument("--plot", metavar="PATH", help="where to write the PNG (default DATASET.png)")
    t.add_argument("--no-plot", action="store_true")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="accuracy and confusion matrix of a saved model")
    e.add_argument("model")
    data_opts(e)
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export-c", help="write a dependency-free C inference function")
    x.add_argument("model")
    x.add_argument("-o", "--output", required=True)
    x.add_argument("--prefix", default="model_", help="symbol prefix (default model_)")
    x.add_argument("--debug", action="store_true", help="show tracebacks")
    x.set_defaults(func=cmd_export_c)

    b = sub.add_parser("bench", help="benchmark micrograd, eager, tape, compiled (and PyTorch)")
    b.add_argument("--repeat", type=int, default=5)
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
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
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
