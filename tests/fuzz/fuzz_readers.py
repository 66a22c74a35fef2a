"""atheris (libFuzzer for Python) harnesses for what a user feeds the command unchecked.

    python tests/fuzz/fuzz_readers.py idx    CORPUS_DIR... [libFuzzer flags]
    python tests/fuzz/fuzz_readers.py model  CORPUS_DIR... [libFuzzer flags]
    python tests/fuzz/fuzz_readers.py export CORPUS_DIR... [libFuzzer flags]

- idx: whatever the bytes, `read_idx` returns a uint8 array of the header's shape or raises
  DatasetError (a gzip bomb or an absurd shape included: libFuzzer's -rss_limit_mb watches memory).
- model: `MLP.load` (micrograd_c.modelfile) returns a model or raises ModelFileError, and never
  allocates more than the file can hold.
- export: `micrograd-c export-c` on a model file whose metadata, file names and prefix are
  hostile: it either refuses with UsageError or writes exactly the C it writes for the same
  numbers with clean metadata and names (nothing from the file or a path reaches the source but
  validated numbers and identifiers), and the prefix it used is a C identifier.

`./dev test` replays the committed corpora (tests/fuzz/corpus/TARGET) and runs a bounded,
seeded exploration; `./dev fuzz [SECONDS]` explores open-ended, and a crash it finds is written
into the corpus, where it stays as a seed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile

import atheris

# numpy is imported before the instrumented block, so that its own code is not instrumented: that
# took over half of a run (one input: 27 s with it, 12 s without, on a busy Zen 1), and numpy's
# branches are not what the fuzzer should be led by
import numpy as np

with atheris.instrument_imports():
    from micrograd_c import modelfile
    from micrograd_c.app import commands
    from micrograd_c.datasets import DatasetError, read_idx
    from micrograd_c.nn import MLP

TMP = tempfile.mkdtemp(prefix="mg-fuzz-")


def _write(name: str, data: bytes) -> str:
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def fuzz_idx(data: bytes) -> None:
    path = _write("x-idx", data)
    for limit in (1 << 16, 1 << 30):
        try:
            arr = read_idx(path, max_bytes=limit)
        except DatasetError:
            continue
        assert arr.dtype == np.uint8 and 0 < arr.size <= limit


def fuzz_model(data: bytes) -> None:
    try:
        model = MLP.load(_write("m.npz", data))
    except modelfile.ModelFileError:
        return
    nparams = sum(a * b + b for a, b in zip(model.sizes, model.sizes[1:]))
    assert model.sizes[0] >= 1 and nparams <= modelfile.MAX_PARAMS


_HOSTILE = [
    "*/",
    "/*",
    "\n#include </etc/passwd>\n",
    "\\",
    '"',
    "??/",
    "\x00",
    "\u2028",
    '*/ int x = system("id"); /*',
]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _text(fdp: atheris.FuzzedDataProvider) -> str:
    if fdp.ConsumeBool():
        return _HOSTILE[
            fdp.ConsumeIntInRange(0, len(_HOSTILE) - 1)
        ] + fdp.ConsumeUnicodeNoSurrogates(16)
    return fdp.ConsumeUnicodeNoSurrogates(24)


def _file_name(fdp: atheris.FuzzedDataProvider, suffix: str) -> str:
    name = _text(fdp).replace("/", "_").replace("\x00", "_")[:100]
    name = name if name not in ("", ".", "..") else "x"
    try:
        name.encode(sys.getfilesystemencoding())
    except UnicodeEncodeError:
        name = name.encode("ascii", "backslashreplace").decode()
    return name + suffix


def _model_file(
    path: str, sizes: list, meta: dict, rng: np.random.RandomState, special: list
) -> None:
    arrays = {}
    for i in range(len(sizes) - 1):
        arrays[f"layers.{i}.weight"] = rng.uniform(-1, 1, (sizes[i + 1], sizes[i]))
        arrays[f"layers.{i}.bias"] = rng.uniform(-1, 1, sizes[i + 1])
    if special:
        arrays["layers.0.bias"][0] = special[0]
    with open(path, "wb") as f:
        np.savez(f, __meta__=np.array(json.dumps(meta)), **arrays)


def _export(model: str, out: str, prefix: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            status = commands.main(["export-c", model, "-o", out, "--prefix", prefix, "--debug"])
        except commands.UsageError:
            return 2, ""
    assert status == 0, status
    with open(out, encoding="utf-8") as f:
        return 0, f.read()


def fuzz_export(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    sizes = [fdp.ConsumeIntInRange(1, 4) for _ in range(fdp.ConsumeIntInRange(2, 3))]
    activation = (
        "relu"
        if fdp.ConsumeBool()
        else ["tanh", "sigmoid", "linear", _text(fdp)][fdp.ConsumeIntInRange(0, 3)]
    )
    dataset = ["moons", "mnist", _text(fdp)][fdp.ConsumeIntInRange(0, 2)]
    prefix = "model_" if fdp.ConsumeBool() else _text(fdp)
    meta = {
        "format": modelfile.FORMAT,
        "version": 1,
        "sizes": sizes,
        "activation": activation,
        "dataset": dataset,
        "loss": _text(fdp),
    }
    if fdp.ConsumeBool():
        meta[_text(fdp)] = _text(fdp)
    special = (
        [
            [float("nan"), float("inf"), -float("inf"), 1e308, 5e-324, -0.0][
                fdp.ConsumeIntInRange(0, 5)
            ]
        ]
        if fdp.ConsumeBool()
        else []
    )
    seed = fdp.ConsumeIntInRange(0, 1000)
    hostile_dir = os.path.join(TMP, "h")
    os.makedirs(hostile_dir, exist_ok=True)
    model = os.path.join(hostile_dir, _file_name(fdp, ".npz"))
    out = os.path.join(hostile_dir, _file_name(fdp, ".c"))
    _model_file(model, sizes, meta, np.random.RandomState(seed), special)
    status, src = _export(model, out, prefix)
    if status:
        return
    assert _IDENT.match(prefix), prefix
    # the same numbers with clean metadata and names give the same C, byte for byte
    clean = {"format": modelfile.FORMAT, "version": 1, "sizes": sizes, "activation": activation}
    if dataset in commands.DATASETS:
        clean["dataset"] = dataset
    _model_file(os.path.join(TMP, "clean.npz"), sizes, clean, np.random.RandomState(seed), special)
    status, ref = _export(os.path.join(TMP, "clean.npz"), os.path.join(TMP, "clean.c"), prefix)
    assert status == 0 and src == ref
    for name in os.listdir(hostile_dir):
        os.remove(os.path.join(hostile_dir, name))


TARGETS = {"idx": fuzz_idx, "model": fuzz_model, "export": fuzz_export}

#: For testing ./dev's failure report: an input equal to this (bytes) fails on purpose.
CANARY = os.environ.get("MICROGRAD_C_FUZZ_CANARY", "").encode()


def main() -> None:
    which = sys.argv.pop(1) if len(sys.argv) > 1 else "idx"
    real = TARGETS[which]

    def target(data: bytes) -> None:
        if CANARY and data == CANARY:
            raise AssertionError("the canary input (MICROGRAD_C_FUZZ_CANARY)")
        real(data)

    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
