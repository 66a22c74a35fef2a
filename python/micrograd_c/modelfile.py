"""Model files: an :class:`~micrograd_c.nn.MLP` saved to disk and read back (``MLP.save`` and
``MLP.load`` call this module).

The format (version 1) is a numpy ``.npz`` archive, so numpy alone reads it, without pickle:

- ``__meta__``: a 0-d unicode array holding a JSON object: ``"format": "micrograd-c-model"``,
  ``"version": 1``, ``"sizes": [nin, nout_0, ..., nout_last]``, ``"activation"`` (the hidden
  layers'; the last layer is linear), and any metadata the writer added (``micrograd-c train``
  adds ``"dataset"``, ``"loss"``, ``"seed"``, ``"limit"`` when given, and for MNIST
  ``"mnist_training"`` (``"train"`` or ``"test"``): what ``eval`` needs to hold out the same
  samples);
- ``layers.{i}.weight``, shape ``(sizes[i+1], sizes[i])``, and ``layers.{i}.bias``, shape
  ``(sizes[i+1],)``, float64: :meth:`MLP.state_dict`'s arrays, shaped as PyTorch's ``nn.Linear``.

A reader refuses a version above its own; the version goes up only when an older reader would
misread a newer file (new optional metadata keeps version 1).

Files are untrusted input. :func:`read` checks the metadata first, then every array's ``.npy``
header and its size in the archive against the shapes the metadata declares, and refuses a
compressed member that claims more than deflate can expand, all before reading any array; so
whatever the bytes, reading costs no more memory than the file's size allows, and at most
:data:`MAX_PARAMS` parameters (see ``docs/SECURITY.md``).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Union

import numpy as np

from ._fs import atomic_write

if TYPE_CHECKING:
    from .nn import MLP

PathLike = Union[str, "os.PathLike[str]"]

#: The ``format`` entry of every model file's metadata.
FORMAT = "micrograd-c-model"
#: The format version this module writes, and the highest it reads.
VERSION = 1
#: Limits of what :func:`read` accepts: neurons in one layer, parameters in one model (800 MB of
#: float64), layers.
MAX_WIDTH = 1_000_000
MAX_PARAMS = 100_000_000
MAX_LAYERS = 64

_META = "__meta__"
#: Metadata keys the format itself uses: a writer's metadata may not set them.
RESERVED = ("format", "version", "sizes", "activation")


class ModelFileError(ValueError):
    """A file is not a model file this version can read; the message says why, in one line."""


def save(path: PathLike, model: MLP, metadata: Mapping[str, Any] | None = None) -> None:
    """Write ``model`` to ``path`` (see the module docstring for the format).

    ``metadata`` (JSON-serialisable, none of the keys in :data:`RESERVED`) is stored alongside
    and returned by :func:`load`. The file is written to a temporary file in the same directory
    and renamed into place, so ``path`` is either the old file or the complete new one. Raises
    ``ValueError`` for a model the format cannot hold (hidden neurons with different activations,
    a nonlinear output layer) or bad metadata, :class:`OSError` when the file cannot be written.
    """
    path = os.fspath(path)
    meta = dict(metadata or {})
    clash = sorted(k for k in meta if k in RESERVED)
    if clash:
        raise ValueError(f"metadata may not set {clash}: the format writes them")
    meta.update(format=FORMAT, version=VERSION, sizes=model.sizes, activation=_activation(model))
    text = json.dumps(meta)  # TypeError for metadata JSON cannot hold: before any file is made
    arrays = {_META: np.array(text), **model.state_dict()}
    # what np.savez writes (stored .npy members), without its pickling of object arrays
    with atomic_write(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, arr, allow_pickle=False)


def _activation(model: MLP) -> str:
    """The hidden layers' one activation ("relu" without hidden layers); ``ValueError`` when the
    model has several or a nonlinear output layer."""
    hidden = {n.activation for layer in model.layers[:-1] for n in layer.neurons}
    output = {n.activation for n in model.layers[-1].neurons}
    if len(hidden) > 1 or output != {"linear"}:
        raise ValueError(
            f"a model file holds one activation for the hidden layers and a linear output "
            f"layer; this model has hidden {sorted(hidden)}, output {sorted(output)}"
        )
    return hidden.pop() if hidden else "relu"


def load(path: PathLike) -> tuple[MLP, dict[str, Any]]:
    """Read a model file: the model and the file's metadata (the format's keys included).

    Raises :class:`ModelFileError` for anything that is not a readable model file and
    :class:`OSError` (``FileNotFoundError``, ``IsADirectoryError``, ...) when ``path`` cannot be
    opened. Everything is checked before the model is built (see :func:`read`).
    """
    from .nn import MLP

    meta, arrays = read(path)
    sizes = meta["sizes"]
    model = MLP(sizes[0], sizes[1:], activation=meta["activation"])
    model.load_state_dict(arrays)
    return model, meta


def read(path: PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and arrays of a model file, checked against each other before anything large
    is read; arrays are float64. Raises as :func:`load` does."""
    path = os.fspath(path)
    with open(path, "rb") as f:  # OSError: missing, a directory, not readable
        try:
            return _read(path, f)
        except ModelFileError:
            raise
        except Exception as e:
            # and json raise many types on malformed input (BadZipFile, ValueError, EOFError,
            # zlib.error, OSError on a seek; found by fuzzing)
            raise ModelFileError(
                f"{path}: not a micrograd-c model file ({e.__class__.__name__}: {str(e)[:200]})"
            ) from None


def _npy_header(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], np.dtype[Any], bool, int]:
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


def _read(path: str, fh: IO[bytes]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    def bad(why: str) -> ModelFileError:
        return ModelFileError(f"{path}: {why}")

    file_size = os.fstat(fh.fileno()).st_size
    if not zipfile.is_zipfile(fh):
        raise bad("not a micrograd-c model file (not a .npz archive)")
    fh.seek(0)
    with zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        if len(infos) > 2 * MAX_LAYERS + 1:
            raise bad(f"not a micrograd-c model file ({len(infos)} entries)")
        members = {}
        for info in infos:
            if not info.filename.endswith(".npy") or info.filename[:-4] in members:
                raise bad(f"not a micrograd-c model file (entry {info.filename[:60]!r})")
            if info.compress_type == zipfile.ZIP_STORED:
                plausible = info.file_size == info.compress_size <= file_size
            elif info.compress_type == zipfile.ZIP_DEFLATED:  # deflate expands at most 1032:1
                plausible = (
                    info.compress_size <= file_size
                    and info.file_size <= 1032 * info.compress_size + 1024
                )
            else:
                plausible = False
            if not plausible:
                raise bad(
                    f"not a micrograd-c model file (entry {info.filename[:60]!r} "
                    f"claims {info.file_size:,} bytes)"
                )
            members[info.filename[:-4]] = info
        meta = _read_meta(zf, members.get(_META), bad)
        sizes = meta["sizes"]
        expected: dict[str, tuple[int, ...]] = {}
        for i in range(len(sizes) - 1):
            expected[f"layers.{i}.weight"] = (sizes[i + 1], sizes[i])
            expected[f"layers.{i}.bias"] = (sizes[i + 1],)
        names = set(members) - {_META}
        if names != set(expected):
            missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
            raise bad(
                f"the arrays do not match the layer sizes {sizes} "
                f"(missing {missing[:4]}, unexpected {[n[:40] for n in extra[:4]]})"
            )
        for name, want in expected.items():
            shape, dtype, _, offset = _npy_header(zf, members[name])  # either order reads
            if shape != want:
                raise bad(f"{name}: expected shape {want}, got {shape}")
            if dtype.kind != "f" or dtype.itemsize not in (4, 8):
                raise bad(f"{name}: expected float64 or float32 data, got {dtype}")
            if members[name].file_size != offset + int(np.prod(want)) * dtype.itemsize:
                raise bad(f"{name}: the archive's size for it does not match its shape {want}")
        arrays = {}
        for name in expected:
            with zf.open(members[name]) as f:
                arrays[name] = np.ascontiguousarray(
                    np.lib.format.read_array(f, allow_pickle=False), dtype=np.float64
                )
    return meta, arrays


def _read_meta(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo | None, bad: Callable[[str], ModelFileError]
) -> dict[str, Any]:
    """The metadata member, checked: format, version, sizes within the limits, activation."""
    from .nn import ACTIVATIONS

    if info is None:
        raise bad("not a micrograd-c model file (no metadata)")
    shape, dtype, _, _ = _npy_header(zf, info)
    if shape != () or dtype.kind != "U" or info.file_size > 1 << 20:
        raise bad(f"not a micrograd-c model file (metadata of shape {shape}, type {dtype})")
    with zf.open(info) as f:
        meta = json.loads(str(np.lib.format.read_array(f, allow_pickle=False)))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise bad("not a micrograd-c model file")
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"the model file's format version {str(version)[:20]!r} is not a version")
    if version > VERSION:
        raise bad(
            f"written by a newer micrograd-c (model file format version {version}; "
            f"this one reads up to {VERSION})"
        )
    sizes = meta.get("sizes")
    if (
        not isinstance(sizes, list)
        or not 2 <= len(sizes) <= MAX_LAYERS + 1
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WIDTH for n in sizes
        )
    ):
        raise bad("the model's layer sizes are missing or invalid")
    activation = meta.setdefault("activation", "relu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise bad(f"unknown activation {str(activation)[:40]!r}")
    nparams = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    if nparams > MAX_PARAMS:
        raise bad(f"the model's sizes declare {nparams:,} parameters, more than {MAX_PARAMS:,}")
    return meta


__all__ = [
    "save",
    "load",
    "read",
    "ModelFileError",
    "FORMAT",
    "VERSION",
    "RESERVED",
    "MAX_PARAMS",
    "MAX_WIDTH",
    "MAX_LAYERS",
]
