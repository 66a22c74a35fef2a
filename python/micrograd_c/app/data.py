"""The datasets ``micrograd-c`` trains on, split as the command splits them, and its defaults."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .. import datasets as ds

DATASETS = ("moons", "xor", "digits", "mnist")


class Defaults(NamedTuple):
    """How ``micrograd-c train`` trains a dataset when no option says otherwise."""

    hidden: list[int]
    loss: str
    epochs: int
    lr: float
    batch_size: int
    l2: float


DEFAULTS: dict[str, Defaults] = {
    "moons": Defaults([16, 16], "hinge", 100, 0.1, 10, 1e-4),
    "xor": Defaults([8], "hinge", 50, 0.1, 10, 1e-4),
    "digits": Defaults([32], "xent", 20, 0.05, 1, 0.0),
    "mnist": Defaults([50], "xent", 1, 0.01, 1, 0.0),
}


@dataclass
class Data:
    """A dataset split for training: features, labels, classes (0 for two classes labelled ±1)."""

    name: str
    Xtr: np.ndarray
    ytr: np.ndarray
    Xte: np.ndarray
    yte: np.ndarray
    classes: int
    #: digits: the options its split follows (seed, limit) and the dataset's size, from which
    #: :func:`digits_split` gives which samples train and which are held out; else None
    split: tuple[int, int | None, int] | None = None
    #: MNIST: the file the training samples come from, "train", or "test" (its first 80%, when
    #: there are no training files); else ""
    trained_from: str = ""

    @property
    def nin(self) -> int:
        """The number of features."""
        return int(self.Xtr.shape[1])


def has_mnist(d: str, split: str) -> bool:
    """Whether ``d`` holds the IDX files of MNIST's ``split`` ("train" or "test"), gzip or raw."""
    return all(
        os.path.exists(os.path.join(d, stem)) or os.path.exists(os.path.join(d, stem + ".gz"))
        for stem in ds.MNIST_FILES[split]
    )


def locate_mnist(data_dir: str | None, download: bool, log: Callable[[str], None]) -> str:
    """The directory MNIST is read from, the same way for ``train`` and ``eval``.

    ``data_dir`` (``--data-dir``, relative to the current directory) wins; otherwise the download
    cache (:func:`micrograd_c.datasets.default_data_dir`). ``download`` fetches
    what is missing there first. Errors (:class:`~micrograd_c.datasets.DatasetError`) say which
    of the two options to use.
    """
    cache = ds.default_data_dir()
    d = os.path.abspath(os.path.expanduser(data_dir)) if data_dir is not None else cache
    shown = data_dir if data_dir is not None else cache
    if download:
        if data_dir is not None and os.path.exists(d) and not os.path.isdir(d):
            raise ds.DatasetError(f"--data-dir {data_dir}: not a directory")
        try:
            return ds.download_mnist(d, log=log)
        except ds.DatasetError as e:
            raise ds.DatasetError(
                f"{e}. Without network access, pass --data-dir DIR, a directory holding "
                f"the MNIST IDX files ({ds.MNIST_FILES['test'][0]}.gz, ...)"
            ) from None
    if data_dir is not None and not os.path.isdir(d):
        raise ds.DatasetError(
            f"--data-dir {data_dir}: no such directory (give the directory that holds the "
            f"MNIST IDX files, or add --download to fetch them there)"
        )
    if not has_mnist(d, "test"):
        if data_dir is None:
            raise ds.DatasetError(
                f"MNIST is not in {cache}: pass --data-dir DIR (a directory with the IDX files, "
                f"gzip or raw) or --download to fetch it there"
            )
        raise ds.DatasetError(
            f"{shown}: no MNIST test files ({ds.MNIST_FILES['test'][0]}[.gz], "
            f"{ds.MNIST_FILES['test'][1]}[.gz]); add --download to fetch them there"
        )
    return d


def digits_split(n: int, seed: int, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The indices of digits' ``n`` samples that train and that are held out with ``seed`` and
    ``limit``: the samples shuffled with the seed, the first ``limit`` of them kept, the first
    80% of those training (at least one, and at least one held out). Raises
    :class:`~micrograd_c.datasets.DatasetError` when fewer than two are kept."""
    idx = np.random.RandomState(seed).permutation(n)
    if limit:
        idx = idx[:limit]
    if len(idx) < 2:
        raise ds.DatasetError(
            f"digits: {len(idx)} sample(s) leave none to hold out: use --limit 2 or more"
        )
    cut = min(max(1, int(len(idx) * 0.8)), len(idx) - 1)
    return idx[:cut], idx[cut:]


def held_out_leak(data: Data, trained: tuple[int, int | None]) -> tuple[int, int, int]:
    """How many of ``data``'s held-out samples a model trained on the split ``trained`` (seed,
    limit) saw: (those, the held-out samples, the training samples); (0, 0, 0) where ``data``'s
    split does not depend on the options (:attr:`Data.split` None)."""
    if data.split is None:
        return 0, 0, 0
    seed, limit, n = data.split
    tr = digits_split(n, *trained)[0]
    ho = digits_split(n, seed, limit)[1]
    return int(np.intersect1d(tr, ho).size), len(ho), len(tr)


def load_data(
    name: str,
    seed: int = 0,
    data_dir: str | None = None,
    download: bool = False,
    limit: int | None = None,
    log: Callable[[str], None] = lambda msg: None,
    purpose: str = "train",
    dtype: Any = np.float64,
    mnist_from: str = "",
) -> Data:
    """The dataset ``name`` (one of :data:`DATASETS`) split as ``train`` trains and evaluates it.

    moons and xor are generated (micrograd's demo measures on its training set); digits is
    shuffled with ``seed`` and cut 80/20 (:func:`digits_split`); MNIST is read from ``data_dir``
    (see :func:`locate_mnist`), and with only the test set present, training uses its first 80%
    (8,000 of 10,000 images) and evaluation the rest; ``mnist_from`` ("train" or "test", what
    a model trained from: :attr:`Data.trained_from`) keeps a model's split whatever files are
    present: "test", that one, and "train", the whole test set held out (no training samples).
    ``limit`` caps the training samples (digits: all its samples, before the cut; and MNIST's
    held-out ones at a quarter of it). ``purpose`` ("train" or "eval") only changes what is
    logged. ``dtype`` is the features' (np.float64, or np.float32 for float32 storage: MNIST then
    takes half the memory). Raises ``ValueError`` for an unknown name and
    :class:`~micrograd_c.datasets.DatasetError` for missing or malformed data.
    """
    if name in ("moons", "xor"):
        X, y = (
            ds.make_moons(100, 0.1, seed=1337 + seed)
            if name == "moons"
            else ds.make_xor(200, 0.1, seed=seed)
        )
        if limit:
            X, y = X[:limit], y[:limit]
        X = np.ascontiguousarray(X, dtype=dtype)
        return Data(name, X, y, X, y, 0)
    if name == "digits":
        X, y = ds.load_digits()
        X = np.asarray(X, dtype=dtype)
        tr, ho = digits_split(len(X), seed, limit)
        return Data(name, X[tr], y[tr], X[ho], y[ho], 10, (seed, limit, len(X)))
    if name == "mnist":
        d = locate_mnist(data_dir, download, log)
        Xte, yte = ds.load_mnist(d, "test", dtype)
        if mnist_from == "train":  # evaluating a model trained on the training files
            if limit:
                Xte, yte = Xte[: max(1, limit // 4)], yte[: max(1, limit // 4)]
            log(
                f"{d}: the model trained on MNIST's training files; evaluating on "
                f"{len(Xte):,} test images"
            )
            return Data(name, Xte[:0], yte[:0], Xte, yte, 10, trained_from="train")
        if has_mnist(d, "train") and mnist_from != "test":
            Xtr, ytr = ds.load_mnist(d, "train", dtype)
        else:
            # only the test set is present: train on its first 80% (8,000 of MNIST's 10,000),
            # evaluate on the rest; the two never overlap, whatever the file holds
            n = len(Xte)
            cut = n * 4 // 5
            if cut == 0 or cut == n:
                raise ds.DatasetError(
                    f"{d}: {n} test image(s) and no training files: too few to hold some out"
                )
            Xtr, ytr, Xte, yte = Xte[:cut], yte[:cut], Xte[cut:], yte[cut:]
            if limit:
                Xtr, ytr = Xtr[:limit], ytr[:limit]
                Xte, yte = Xte[: max(1, limit // 4)], yte[: max(1, limit // 4)]
            held = f"the last {n - cut:,}"
            if len(Xte) < n - cut:
                held = f"the first {len(Xte):,} of {held}"
            why = "the model trained on the test set" if mnist_from else "no training files"
            if purpose == "train":
                log(
                    f"{d}: {why}; training on the first {len(Xtr):,} test images, "
                    f"evaluating on {held}"
                )
            else:
                log(f"{d}: {why}; evaluating on {held} test images (train held them out)")
            return Data(name, Xtr, ytr, Xte, yte, 10, trained_from="test")
        if limit:
            Xtr, ytr = Xtr[:limit], ytr[:limit]
            Xte, yte = Xte[: max(1, limit // 4)], yte[: max(1, limit // 4)]
        return Data(name, Xtr, ytr, Xte, yte, 10, trained_from="train")
    raise ValueError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)})")


__all__ = ["Data", "DATASETS", "DEFAULTS", "Defaults", "load_data", "locate_mnist", "has_mnist"]
