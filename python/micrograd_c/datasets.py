"""Datasets: micrograd's moons and XOR generated in code, and MNIST from IDX files.

Every loader returns ``(X, y)`` as float64 numpy arrays, X of shape (n, features) (MNIST's X
may be float32 instead, half the memory: see :func:`load_mnist`).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ._fs import user_cache_dir

Arrays = tuple[np.ndarray, np.ndarray]


class _Readable(Protocol):
    """A binary stream: a file or a gzip stream over one."""

    def read(self, size: int = ..., /) -> bytes: ...


class DatasetError(ValueError):
    """A data file is missing, truncated or not what it claims to be."""


def make_moons(n: int = 100, noise: float = 0.1, seed: int | None = 1337) -> Arrays:
    """Two interleaving half circles, labels -1 and +1 (micrograd's demo data).

    The algorithm of scikit-learn's ``make_moons``: n//2 points on the outer arc, the rest on
    the inner one, then Gaussian noise of standard deviation ``noise``.
    """
    if n < 2:
        raise ValueError("make_moons needs n >= 2")
    rng = np.random.RandomState(seed)
    n_out, n_in = n // 2, n - n // 2
    t_out, t_in = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n_in)
    X = np.vstack(
        [
            np.append(np.cos(t_out), 1 - np.cos(t_in)),
            np.append(np.sin(t_out), 1 - np.sin(t_in) - 0.5),
        ]
    ).T
    y = np.hstack([np.zeros(n_out), np.ones(n_in)])
    X = X + rng.normal(scale=noise, size=X.shape)
    return X.astype(np.float64), (y * 2 - 1).astype(np.float64)


def make_xor(n: int = 200, noise: float = 0.1, seed: int | None = 0) -> Arrays:
    """Points around the four corners of the unit square, labels -1/+1 by XOR of the corner."""
    if n < 1:
        raise ValueError("make_xor needs n >= 1")
    rng = np.random.RandomState(seed)
    corners = rng.randint(0, 2, size=(n, 2))
    X = corners + rng.normal(scale=noise, size=(n, 2))
    y = np.where(corners[:, 0] ^ corners[:, 1], 1.0, -1.0)
    return X.astype(np.float64), y


#: The largest IDX payload read_idx accepts by default (MNIST's training images are 47 MB).
IDX_MAX_BYTES = 1 << 30


def read_idx(path: str, max_bytes: int = IDX_MAX_BYTES) -> np.ndarray:
    """Read an IDX file (raw or gzip) as a numpy array, validating magic, dims and size.

    Only unsigned-byte data (type 0x08), as MNIST uses, is accepted. The header is read first
    and bounds everything after it: at most the declared number of bytes (plus one, to detect
    trailing data) is ever decompressed, so a gzip bomb costs no more memory than an honest
    file. Shapes with a zero dimension or more than ``max_bytes`` bytes are refused.
    """
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                    return _read_idx_stream(path, f, max_bytes, None)
            return _read_idx_stream(path, raw, max_bytes, os.fstat(raw.fileno()).st_size)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, not an IDX file") from None
    except (
        OSError,
        EOFError,
        zlib.error,
    ) as e:  # zlib.error: a corrupt gzip stream (found by fuzzing)
        raise DatasetError(f"{path}: cannot read ({e})") from None


def _read_exactly(f: _Readable, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        block = f.read(min(left, 1 << 20))
        if not block:
            break
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


def _read_idx_stream(path: str, f: _Readable, max_bytes: int, file_size: int | None) -> np.ndarray:
    magic = _read_exactly(f, 4)
    if len(magic) < 4:
        raise DatasetError(f"{path}: too short for an IDX header")
    zero, dtype, ndim = struct.unpack(">HBB", magic)
    if zero != 0 or dtype != 0x08 or not 1 <= ndim <= 4:
        raise DatasetError(f"{path}: not an unsigned-byte IDX file (magic {magic.hex()})")
    raw_dims = _read_exactly(f, 4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise DatasetError(f"{path}: truncated header")
    dims = struct.unpack(">" + "I" * ndim, raw_dims)
    expected = 1
    for d in dims:  # Python integers: no wrap-around
        expected *= d
    if expected == 0:
        raise DatasetError(f"{path}: the header's shape {dims} holds no data")
    if expected > max_bytes:
        raise DatasetError(
            f"{path}: the header's shape {dims} needs {expected:,} bytes, more than the "
            f"{max_bytes:,} accepted"
        )
    header = 4 + 4 * ndim
    if file_size is not None and file_size - header != expected:  # raw file: check before reading
        raise DatasetError(
            f"{path}: header says {expected} bytes of data for shape {dims}, "
            f"file has {file_size - header}"
        )
    body = _read_exactly(f, expected)
    extra = f.read(1)
    if len(body) != expected or extra:
        have = f"{len(body)}" if not extra else f"more than {expected}"
        raise DatasetError(
            f"{path}: header says {expected} bytes of data for shape {dims}, file has {have}"
        )
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


def load_mnist(data_dir: str, split: str = "test", dtype: Any = np.float64) -> Arrays:
    """MNIST from IDX files in ``data_dir``: X of shape (n, 784) scaled to [0, 1], y the digits.

    ``split`` is ``"train"`` or ``"test"``; files may be gzipped or raw. Image and label counts
    must agree, images must be 28x28, labels 0-9. ``dtype`` is X's: ``np.float64`` (default) or
    ``np.float32`` (any spelling numpy reads as one of them; None is float64, as in numpy).
    float32 takes half the memory (the training set's 60,000 images: 188 MB instead of 376), each
    value the float32 rounding of the float64 one: what a float32 program rounds float64 inputs
    to, and what ``fit`` reads without a copy.
    """
    if split not in MNIST_FILES:
        raise ValueError("split must be 'train' or 'test'")
    try:
        dt = np.dtype(dtype).name
    except TypeError:
        dt = ""
    if dt not in ("float64", "float32"):
        raise ValueError(f"dtype must be np.float64 or np.float32, not {dtype!r}")
    images = read_idx(_find(data_dir, MNIST_FILES[split][0]))
    labels = read_idx(_find(data_dir, MNIST_FILES[split][1]))
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetError(f"{data_dir}: images have shape {images.shape}, expected (n, 28, 28)")
    if labels.ndim != 1:
        raise DatasetError(f"{data_dir}: labels have shape {labels.shape}, expected (n,)")
    if labels.shape[0] != images.shape[0]:
        raise DatasetError(f"{data_dir}: {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise DatasetError(f"{data_dir}: labels outside 0-9")
    flat = images.reshape(images.shape[0], 784)
    if dt == "float64":
        return flat / 255.0, labels.astype(np.float64)
    X = np.empty(flat.shape, dtype=np.float32)
    for r in range(0, flat.shape[0], 4096):  # through float64 a block at a time: the same rounding
        X[r : r + 4096] = flat[r : r + 4096] / 255.0
    return X, labels.astype(np.float64)


def load_digits() -> Arrays:
    """scikit-learn's bundled 8x8 digits (1,797 images, 64 features scaled to [0, 1])."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        raise DatasetError(
            "the digits dataset needs scikit-learn: pip install 'micrograd-c[data]'"
        ) from None
    d = sk_digits()
    return (d.data / 16.0).astype(np.float64), d.target.astype(np.float64)


# ---- download ---------------------------------------------------------------------------------

#: The usual public mirrors of the MNIST files (PyTorch's, then TensorFlow's).
MNIST_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

#: SHA-256 of the four standard files.
MNIST_SHA256: dict[str, str] = {
    "train-images-idx3-ubyte.gz": (
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
    ),
    "train-labels-idx1-ubyte.gz": (
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
    ),
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def default_data_dir() -> str:
    """Where downloads go: ``$MICROGRAD_C_DATA_DIR``, else ``micrograd_c/mnist`` in the user's
    cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    return user_cache_dir("MICROGRAD_C_DATA_DIR", "micrograd_c", "mnist")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch(url: str, part: str, timeout: float) -> None:
    """Download `url` into `part`, resuming from its current size with an HTTP Range request."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    req = urllib.request.Request(url, headers={"User-Agent": "micrograd-c"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        status = getattr(r, "status", 200)
        mode = "ab" if have and status == 206 else "wb"  # a server without ranges sends it all
        with open(part, mode) as f:
            while True:
                block = r.read(1 << 16)
                if not block:
                    break
                f.write(block)
        length = r.headers.get("Content-Length")
        if length is not None and status in (200, 206):
            expected = int(length) + (have if mode == "ab" else 0)
            if os.path.getsize(part) < expected:
                raise urllib.error.URLError("connection closed before the end of the file")


def download(
    name: str,
    dest_dir: str,
    sha256: str,
    mirrors: Sequence[str] = MNIST_MIRRORS,
    retries: int = 3,
    timeout: float = 60.0,
    log: Callable[[str], None] | None = None,
) -> str:
    """Download one file into ``dest_dir`` and verify its SHA-256; returns its path.

    Partial downloads are kept as ``<name>.part`` and resumed (also across runs); the verified
    file is renamed into place, so a reader never sees a partial file. Each mirror is tried up
    to ``retries`` times. Raises :class:`DatasetError` when no mirror gives the right bytes; its
    message names each mirror once, with its last error and the number of attempts.
    """
    os.makedirs(dest_dir, exist_ok=True)
    final = os.path.join(dest_dir, name)
    if os.path.exists(final) and _sha256(final) == sha256:
        return final
    part = final + ".part"
    errors: list[str] = []
    for base in mirrors:
        url = base.rstrip("/") + "/" + name
        last, attempts = "", 0
        for attempt in range(retries):
            attempts += 1
            try:
                if log:
                    log(f"downloading {url}" + (f" (attempt {attempt + 1})" if attempt else ""))
                _fetch(url, part, timeout)
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = str(getattr(e, "reason", e))
                time.sleep(min(0.2 * (attempt + 1), 1.0))
                continue
            got = _sha256(part)
            if got == sha256:
                os.replace(part, final)
                return final
            last = f"SHA-256 {got[:16]}... does not match {sha256[:16]}..."
            os.remove(part)  # wrong bytes: start over rather than resume them
            break
        errors.append(f"{url}: {last}" + (f" ({attempts} attempts)" if attempts > 1 else ""))
    raise DatasetError(f"could not download {name}: " + "; ".join(errors))


def mnist_mirrors() -> tuple[str, ...]:
    """``$MICROGRAD_C_MNIST_MIRRORS`` (URLs separated by spaces), else :data:`MNIST_MIRRORS`."""
    env = os.environ.get("MICROGRAD_C_MNIST_MIRRORS", "").split()
    return tuple(env) or MNIST_MIRRORS


def download_mnist(
    dest_dir: str | None = None,
    mirrors: Sequence[str] | None = None,
    sha256: dict[str, str] | None = None,
    retries: int = 3,
    timeout: float = 60.0,
    log: Callable[[str], None] | None = None,
) -> str:
    """Download and verify the four MNIST files; returns the directory holding them.

    Stops at the first file no mirror provides; directories this call created are removed
    again when they are left empty (resumable ``.part`` files are kept).
    """
    dest = os.path.abspath(dest_dir or default_data_dir())
    created = []
    d = dest
    while not os.path.exists(d):
        created.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    try:
        for name, digest in (sha256 or MNIST_SHA256).items():
            download(name, dest, digest, mirrors or mnist_mirrors(), retries, timeout, log)
    except BaseException:
        for d in created:  # innermost first
            try:
                os.rmdir(d)
            except OSError:
                break  # not empty (a partial download to resume) or not ours to remove
        raise
    return dest


__all__ = [
    "make_moons",
    "make_xor",
    "read_idx",
    "load_mnist",
    "load_digits",
    "download",
    "download_mnist",
    "mnist_mirrors",
    "default_data_dir",
    "DatasetError",
    "MNIST_MIRRORS",
    "MNIST_SHA256",
]
