"""Datasets: micrograd's moons and XOR generated in code, and MNIST from IDX files.

Every loader returns ``(X, y)`` as float64 numpy arrays, X of shape (n, features).
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import Optional, Tuple

import numpy as np

Arrays = Tuple[np.ndarray, np.ndarray]


class DatasetError(ValueError):
    """A data file is missing, truncated or not what it claims to be."""


def make_moons(n: int = 100, noise: float = 0.1, seed: Optional[int] = 1337) -> Arrays:
    """Two interleaving half circles, labels -1 and +1 (micrograd's demo data).

    The algorithm of scikit-learn's ``make_moons``: n//2 points on the outer arc, the rest on
    the inner one, then Gaussian noise of standard deviation ``noise``.
    """
    if n < 2:
        raise ValueError("make_moons needs n >= 2")
    rng = np.random.RandomState(seed)
    n_out, n_in = n // 2, n - n // 2
    t_out, t_in = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n_in)
    X = np.vstack([np.append(np.cos(t_out), 1 - np.cos(t_in)),
                   np.append(np.sin(t_out), 1 - np.sin(t_in) - 0.5)]).T
    y = np.hstack([np.zeros(n_out), np.ones(n_in)])
    X = X + rng.normal(scale=noise, size=X.shape)
    return X.astype(np.float64), (y * 2 - 1).astype(np.float64)


def make_xor(n: int = 200, noise: float = 0.1, seed: Optional[int] = 0) -> Arrays:
    """Points around the four corners of the unit square, labels -1/+1 by XOR of the corner."""
    if n < 1:
        raise ValueError("make_xor needs n >= 1")
    rng = np.random.RandomState(seed)
    corners = rng.randint(0, 2, size=(n, 2))
    X = corners + rng.normal(scale=noise, size=(n, 2))
    y = np.where(corners[:, 0] ^ corners[:, 1], 1.0, -1.0)
    return X.astype(np.float64), y


def _open(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:  # type: ignore[operator]
            return f.read()
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except (OSError, EOFError) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (raw or gzip) as a numpy array, validating magic, dims and size.

    Only unsigned-byte data (type 0x08), as MNIST uses, is accepted.
    """
    data = _open(path)
    if len(data) < 4:
        raise DatasetError(f"{path}: too short for an IDX header")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08 or not 1 <= ndim <= 4:
        raise DatasetError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    if len(data) < 4 + 4 * ndim:
        raise DatasetError(f"{path}: truncated header")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    expected = int(np.prod(dims, dtype=np.int64))
    body = data[4 + 4 * ndim:]
    if len(body) != expected:
        raise DatasetError(f"{path}: header says {expected} bytes of data for shape {dims}, file has {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(data_dir: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise DatasetError(f"{data_dir}: neither {stem}.gz nor {stem} found")


def load_mnist(data_dir: str, split: str = "test") -> Arrays:
    """MNIST from IDX files in ``data_dir``: X of shape (n, 784) scaled to [0, 1], y the digits.

    ``split`` is ``"train"`` or ``"test"``; files may be gzipped or raw. Image and label counts
    must agree, images must be 28x28, labels 0-9.
    """
    if split not in MNIST_FILES:
        raise ValueError("split must be 'train' or 'test'")
    images = read_idx(_find(data_dir, MNIST_FILES[split][0]))
    labels = read_idx(_find(data_dir, MNIST_FILES[split][1]))
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetError(f"{data_dir}: images have shape {images.shape}, expected (n, 28, 28)")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise DatasetError(f"{data_dir}: {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise DatasetError(f"{data_dir}: labels outside 0-9")
    X = images.reshape(images.shape[0], 784).astype(np.float64) / 255.0
    return X, labels.astype(np.float64)


__all__ = ["make_moons", "make_xor", "read_idx", "load_mnist", "DatasetError"]
