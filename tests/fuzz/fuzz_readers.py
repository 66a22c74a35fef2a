"""atheris (libFuzzer for Python) harnesses for the file readers a user feeds unchecked data to.

    python tests/fuzz/fuzz_readers.py idx   CORPUS_DIR -max_total_time=20
    python tests/fuzz/fuzz_readers.py model CORPUS_DIR -max_total_time=20

Whatever the bytes, `read_idx` returns an array or raises DatasetError, and `load_model` returns a
model or raises UsageError: no other exception, no crash, no hang.
"""
from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import numpy as np  # noqa: F401
    from micrograd_c import cli
    from micrograd_c.datasets import DatasetError, read_idx

TMP = tempfile.mkdtemp(prefix="mg-fuzz-")


def _write(name: str, data: bytes) -> str:
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def fuzz_idx(data: bytes) -> None:
    for name in ("x-idx", "x-idx.gz"):
        try:
            arr = read_idx(_write(name, data))
        except DatasetError:
            continue
        assert arr.dtype == np.uint8


def fuzz_model(data: bytes) -> None:
    try:
        model, meta = cli.load_model(_write("m.npz", data))
    except cli.UsageError:
        return
    assert model.sizes[0] >= 1


def main() -> None:
    which = sys.argv.pop(1) if len(sys.argv) > 1 else "idx"
    atheris.Setup(sys.argv, {"idx": fuzz_idx, "model": fuzz_model}[which])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
