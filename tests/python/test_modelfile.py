"""Model files: MLP.save / MLP.load round trips, and every malformed or hostile file refused with
one clear error, before anything is allocated (micrograd_c.modelfile)."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from micrograd_c import modelfile
from micrograd_c.modelfile import ModelFileError
from micrograd_c.nn import MLP


def _model(sizes=(3, [5, 4, 2]), activation="tanh", seed=1):
    random.seed(seed)
    return MLP(sizes[0], sizes[1], activation=activation)


def _outputs(m, x):
    out = m(x)
    return [v.data for v in (out if isinstance(out, list) else [out])]


@pytest.mark.parametrize(
    "sizes, activation",
    [
        ((3, [5, 4, 2]), "tanh"),
        ((2, [1]), "relu"),
        ((4, [3, 1]), "sigmoid"),
        ((2, [16, 16, 1]), "relu"),
    ],
)
def test_save_then_load_gives_the_same_model(tmp_path, sizes, activation):
    m = _model(sizes, activation)
    path = tmp_path / "m.npz"
    m.save(path)
    back = MLP.load(path)
    assert back.sizes == m.sizes and repr(back) == repr(m)
    for k, v in m.state_dict().items():
        assert np.array_equal(back.state_dict()[k], v)
    x = [0.3, -1.2, 0.7, 2.0][: sizes[0]]
    assert _outputs(back, x) == _outputs(m, x)  # bit for bit


def test_metadata_is_kept_and_the_format_is_versioned(tmp_path):
    m = _model()
    m.save(str(tmp_path / "m.npz"), {"dataset": "moons", "note": [1, 2]})
    back, meta = modelfile.load(tmp_path / "m.npz")
    assert meta["dataset"] == "moons" and meta["note"] == [1, 2]
    assert meta["format"] == modelfile.FORMAT == "micrograd-c-model"
    assert meta["version"] == modelfile.VERSION == 1
    assert meta["sizes"] == [3, 5, 4, 2] and meta["activation"] == "tanh"
    # numpy alone reads the file, without pickle
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["__meta__"] + [
            f"layers.{i}.{k}" for i in range(3) for k in ("bias", "weight")
        ]
        assert z["layers.0.weight"].shape == (5, 3) and z["layers.0.weight"].dtype == np.float64
        assert json.loads(str(z["__meta__"]))["version"] == 1


def test_what_the_format_cannot_hold_is_refused_before_writing(tmp_path):
    m = _model()
    with pytest.raises(ValueError, match="may not set"):
        m.save(tmp_path / "a.npz", {"version": 2})
    with pytest.raises(TypeError):
        m.save(tmp_path / "b.npz", {"x": object()})
    m.layers[1].neurons[0].activation = "relu"  # two hidden activations
    with pytest.raises(ValueError, match="one activation"):
        m.save(tmp_path / "c.npz")
    assert os.listdir(tmp_path) == []


def test_save_replaces_a_file_atomically_with_the_usual_permissions(tmp_path):
    path = tmp_path / "m.npz"
    path.write_bytes(b"old")
    _model().save(path)
    assert MLP.load(path).sizes == [3, 5, 4, 2]
    assert os.listdir(tmp_path) == ["m.npz"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def _rewrite(src, dst, meta=None, arrays=None, drop=()):
    with np.load(src) as z:
        members = {k: z[k] for k in z.files}
    m = json.loads(str(members.pop("__meta__")))
    m.update(meta or {})
    members.update(arrays or {})
    for k in drop:
        members.pop(k, None)
        m.pop(k, None)
    np.savez(dst, __meta__=np.array(json.dumps(m)), **members)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"meta": {"version": 2}},
            "written by a newer micrograd-c (model file format version 2; this one reads up to 1)",
        ),
        ({"drop": ["version"]}, "format version 'None' is not a version"),
        ({"meta": {"format": "something else"}}, "not a micrograd-c model file"),
        ({"meta": {"sizes": [3, 0, 2]}}, "layer sizes are missing or invalid"),
        ({"meta": {"sizes": [3, 5]}}, "the arrays do not match the layer sizes [3, 5]"),
        ({"meta": {"activation": "gelu"}}, "unknown activation 'gelu'"),
        (
            {"arrays": {"layers.0.weight": np.zeros((5, 4))}},
            "layers.0.weight: expected shape (5, 3), got (5, 4)",
        ),
        (
            {"arrays": {"layers.0.bias": np.zeros(5, dtype=np.int64)}},
            "layers.0.bias: expected float64 or float32 data, got int64",
        ),
        ({"arrays": {"layers.9.bias": np.zeros(5)}}, "unexpected ['layers.9.bias']"),
        ({"drop": ["layers.1.bias"]}, "missing ['layers.1.bias']"),
    ],
)
def test_malformed_files_are_refused_with_one_line(tmp_path, change, message):
    good = tmp_path / "good.npz"
    _model().save(good)
    bad = tmp_path / "bad.npz"
    _rewrite(good, bad, **change)
    with pytest.raises(ModelFileError) as e:
        MLP.load(bad)
    assert (
        str(e.value).startswith(f"{bad}: ") and message in str(e.value) and "\n" not in str(e.value)
    )


def test_weights_in_either_array_order_or_float32_read_the_same(tmp_path):
    """A weight saved in Fortran order (a transposed array, as numpy writes it) or as float32 is
    valid .npz: it loads with the values it holds, not refused (found by review)."""
    good = tmp_path / "good.npz"
    model = _model()
    model.save(good)
    want = MLP.load(good).parameters()
    with np.load(good) as z:
        w0 = z["layers.0.weight"]
    for name, arr in (("f.npz", np.asfortranarray(w0)), ("t.npz", np.ascontiguousarray(w0.T).T)):
        assert arr.flags.f_contiguous and not arr.flags.c_contiguous
        _rewrite(good, tmp_path / name, arrays={"layers.0.weight": arr})
        got = MLP.load(tmp_path / name).parameters()
        assert [p.data for p in got] == [p.data for p in want]
    _rewrite(good, tmp_path / "h.npz", arrays={"layers.0.weight": w0.astype(np.float32)})
    layer = MLP.load(tmp_path / "h.npz").layers[0]
    got32 = [[w.data for w in n.w] for n in layer.neurons]
    assert got32 == w0.astype(np.float32).astype(np.float64).tolist() != w0.tolist()


def test_files_that_are_not_model_files(tmp_path):
    (tmp_path / "text").write_text("hello")
    with pytest.raises(ModelFileError, match="not a .npz archive"):
        MLP.load(tmp_path / "text")
    good = tmp_path / "good.npz"
    _model().save(good)
    (tmp_path / "cut.npz").write_bytes(
        good.read_bytes()[:300]
    )  # a truncated zip (found by fuzzing)
    with pytest.raises(ModelFileError, match="not a micrograd-c model file"):
        MLP.load(tmp_path / "cut.npz")
    np.savez(
        tmp_path / "pickled.npz", __meta__=np.array([{"format": modelfile.FORMAT}], dtype=object)
    )
    with pytest.raises(ModelFileError, match="metadata of shape"):
        MLP.load(tmp_path / "pickled.npz")
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as zf:
        zf.writestr("data.pkl", pickle.dumps([1, 2]))
    with pytest.raises(ModelFileError, match="entry 'data.pkl'"):
        MLP.load(tmp_path / "other.npz")
    with pytest.raises(FileNotFoundError):
        MLP.load(tmp_path / "missing.npz")
    with pytest.raises(IsADirectoryError):
        MLP.load(tmp_path)


def _npz(path, members):
    """A zip of .npy members written by hand: {name: (header dict, data, compress)}; data is bytes,
    or an int n for n zero bytes written in chunks."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name, (header, data, compress) in members.items():
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(buf, header)
            info = zipfile.ZipInfo(name + ".npy")
            info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
            with zf.open(info, "w", force_zip64=True) as f:
                f.write(buf.getvalue())
                if isinstance(data, int):
                    block = bytes(1 << 22)
                    for _ in range(data // len(block)):
                        f.write(block)
                else:
                    f.write(data)


def _meta_member(sizes):
    import json

    arr = np.array(
        json.dumps({"format": modelfile.FORMAT, "version": 1, "sizes": sizes, "activation": "relu"})
    )
    return ({"descr": arr.dtype.str, "fortran_order": False, "shape": ()}, arr.tobytes(), False)


HOSTILE_MODELS = {
    # a tiny file whose metadata claims 20M parameters, arrays shaped to match, no data
    "claims-20M": lambda: {
        "__meta__": _meta_member([2000, 10000, 10]),
        "layers.0.weight": (
            {"descr": "<f8", "fortran_order": False, "shape": (10000, 2000)},
            b"",
            False,
        ),
        "layers.0.bias": ({"descr": "<f8", "fortran_order": False, "shape": (10000,)}, b"", False),
        "layers.1.weight": (
            {"descr": "<f8", "fortran_order": False, "shape": (10, 10000)},
            b"",
            False,
        ),
        "layers.1.bias": ({"descr": "<f8", "fortran_order": False, "shape": (10,)}, b"", False),
    },
    # the same with no arrays at all
    "claims-20M-no-arrays": lambda: {"__meta__": _meta_member([2000, 10000, 10])},
    # a deflate bomb: 1.2 GB of zeros for a 2x2 model's bias, in a file of about 1.2 MB
    "bomb": lambda: {
        "__meta__": _meta_member([2, 2]),
        "layers.0.weight": (
            {"descr": "<f8", "fortran_order": False, "shape": (2, 2)},
            b"\0" * 32,
            False,
        ),
        "layers.0.bias": (
            {"descr": "<f8", "fortran_order": False, "shape": (150 << 20,)},
            1200 << 20,
            True,
        ),
    },
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_MODELS))
def test_hostile_model_files_are_refused_before_allocating(tmp_path, kind):
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("address-space limits and ASan do not mix")
    path = tmp_path / f"{kind}.npz"
    _npz(path, HOSTILE_MODELS[kind]())
    assert path.stat().st_size < 2_000_000
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc/self/status (VmHWM)")
    # VmHWM: this process's own peak RSS (getrusage's ru_maxrss would include the parent's at fork)
    code = textwrap.dedent(f"""
        from micrograd_c.nn import MLP
        from micrograd_c.modelfile import ModelFileError
        try:
            MLP.load({str(path)!r})
        except ModelFileError as e:
            print("refused:", e)
        hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print("peak MB:", int(hwm.split()[1]) // 1024)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("refused: "), r.stdout + r.stderr
    # the file is refused before its claims are believed: the old reader built the 20M-parameter
    # MLP (3.6 GB) or inflated the 1.2 GB array before refusing
    assert int(r.stdout.split("peak MB:")[1]) < 400, r.stdout
