"""The micrograd-c command end to end, in subprocesses, as a person runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from micrograd_c import compiler, modelfile
from micrograd_c.app import commands
from micrograd_c.app.data import Data, digits_split, held_out_leak
from micrograd_c.nn import MLP

from conftest import HAVE_CC

HAVE_MPL = True
try:
    import matplotlib  # noqa: F401
except ImportError:
    HAVE_MPL = False


def run(*args, env=None, cwd=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "micrograd_c", *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROGRAD_C_CACHE_DIR", str(tmp_path / "cache"))


def test_default_train_is_the_moons_demo_with_a_plot(tmp_path):
    r = run("train", "--epochs", "60", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MLP(2, [16, 16, 1]), 337 parameters; hinge loss + 0.0001 L2" in r.stderr
    acc = float(r.stdout.split("accuracy ")[1].split()[0])
    assert acc >= 0.95
    assert "samples/s" in r.stdout
    if HAVE_MPL:
        png = tmp_path / "moons.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(png) in r.stdout


@pytest.mark.parametrize("backend", ["tape", "eager"])
def test_xor_on_other_backends(tmp_path, backend):
    r = run(
        "train",
        "--dataset",
        "xor",
        "--epochs",
        "5",
        "--backend",
        backend,
        "--no-plot",
        "--quiet",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert f"({backend})" in r.stdout and r.stderr == ""


def test_backends_train_to_the_same_model(tmp_path):
    outs = {}
    for backend in ["tape"] + (["c"] if HAVE_CC else []):
        path = tmp_path / f"{backend}.npz"
        r = run(
            "train",
            "--dataset",
            "xor",
            "--epochs",
            "3",
            "--backend",
            backend,
            "--no-plot",
            "--quiet",
            "--save",
            str(path),
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        with np.load(path) as z:
            outs[backend] = {k: z[k] for k in z.files if k != "__meta__"}
    if "c" in outs:
        for k in outs["tape"]:
            assert np.array_equal(outs["tape"][k], outs["c"][k])


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_float32_storage_trains_close_to_float64(tmp_path):
    """--float32 trains on float32 storage (compiled), to a model that float64's agrees with to
    float32's precision; it refuses backends that are not compiled code."""
    params = {}
    for extra in ([], ["--float32"]):
        path = tmp_path / f"m{len(extra)}.npz"
        r = run(
            "train", "--dataset", "xor", "--epochs", "3", "--batch-size", "4", "--backend", "c",
            "--no-plot", "--quiet", "--save", str(path), *extra, cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert ("float32)" in r.stdout) == bool(extra), r.stdout
        with np.load(path) as z:
            params[bool(extra)] = np.concatenate([z[k].ravel() for k in z.files if k != "__meta__"])
    f32, f64 = params[True], params[False]
    assert np.array_equal(f32, f32.astype(np.float32)) and not np.array_equal(f32, f64)
    assert np.allclose(f32, f64, rtol=1e-4, atol=1e-5)
    r = run(
        "train", "--dataset", "xor", "--float32", "--backend", "tape", "--no-plot", cwd=tmp_path
    )
    assert r.returncode == 2 and "--float32 is compiled code: --backend c or auto" in r.stderr


def test_digits_or_a_clear_message(tmp_path):
    r = run("train", "--dataset", "digits", "--epochs", "2", "--no-plot", "--quiet", cwd=tmp_path)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        assert r.returncode == 2
        assert (
            r.stderr.strip() == "micrograd-c: error: the digits dataset needs scikit-learn: "
            "pip install 'micrograd-c[data]'"
        )
        return
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split("accuracy ")[1].split()[0]) > 0.8


def _accuracy(stdout: str) -> float:
    return float(stdout.split("accuracy ")[1].split()[0])


def test_eval_uses_the_seed_and_limit_the_model_was_trained_with(tmp_path):
    """train records its seed and limit in the model file; eval without --seed / --limit
    evaluates on the same samples (the moons of seed 3: train's own figure), and says so."""
    path = tmp_path / "m.npz"
    r = run(
        "train", "--seed", "3", "--limit", "80", "--epochs", "20", "--no-plot", "--quiet",
        "--save", str(path), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    _, meta = modelfile.load(path)
    assert (meta["seed"], meta["limit"]) == (3, 80)
    e = run("eval", str(path), cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    assert f"{path}: seed 3 and limit 80, as in training" in e.stderr
    assert _accuracy(e.stdout) == _accuracy(r.stdout)
    assert "on its 80 training samples (as train measures it)" in e.stdout
    # moons' split does not depend on the seed: another seed is other data, not a leak
    e = run("eval", str(path), "--seed", "4", "--limit", "100", "--quiet", cwd=tmp_path)
    assert e.returncode == 0 and "on its 100 training" in e.stdout and not e.stderr, e.stderr


def _digits_sets(seed: int, limit: int | None, n: int = 1797) -> tuple[set[int], set[int]]:
    """digits' training and held-out samples, as load_data's digits split was written before
    digits_split (the oracle): shuffle with the seed, keep the first limit, cut at 80%."""
    idx = list(np.random.RandomState(seed).permutation(n))[: limit or n]
    cut = max(1, int(len(idx) * 0.8))
    return set(idx[:cut]), set(idx[cut:])


@pytest.mark.parametrize(
    "trained, asked",
    [
        ((7, None), (7, None)),  # the model's own split
        ((7, 501), (7, 500)),  # a smaller limit with the same cut (400): nothing overlaps
        ((7, 500), (7, 499)),  # one fewer: held out from 399 on
        ((7, 500), (7, 10_000)),  # a larger limit holds out after the cut
        ((7, None), (0, None)),  # another seed: most of it
        ((7, 500), (0, 500)),
        ((7, 5), (8, 5)),  # another seed whose one held-out sample the model did not see
        ((7, 5), (0, 5)),
    ],
)
def test_held_out_leak_counts_the_samples_the_model_trained_on(trained, asked):
    """digits is shuffled with the seed, then cut 80/20: held_out_leak counts the held-out
    samples of the asked split that the trained split trained on, which eval refuses when not
    zero (before: a model trained with --seed 7 and evaluated with the default seed 0 scored
    0.958 instead of its held-out 0.936)."""
    x = np.zeros((2, 64))
    y = np.zeros(2)
    tr, _ = _digits_sets(*trained)
    _, ho = _digits_sets(*asked)
    data = Data("digits", x, y, x, y, 10, (*asked, 1797))
    assert held_out_leak(data, trained) == (len(tr & ho), len(ho), len(tr))
    assert held_out_leak(Data("moons", x, y, x, y, 0), trained) == (0, 0, 0)
    assert [set(a.tolist()) for a in digits_split(1797, *asked)] == list(_digits_sets(*asked))


def test_eval_refuses_bad_recorded_values_unless_overridden(tmp_path):
    """Model files are untrusted: a recorded seed, limit or MNIST training file that is not what
    train writes is a one-line error naming the file, the key, the value (cut short) and the
    option that overrides it; given that option, eval does not read the key."""
    model = MLP(2, [4, 1])
    path = tmp_path / "bad.npz"
    for key, value, opt in (
        ("seed", "7", "--seed"),
        ("seed", -1, "--seed"),
        ("seed", True, "--seed"),
        ("seed", 10**4000, "--seed"),
        ("limit", 0, "--limit"),
    ):
        model.save(path, {"dataset": "moons", key: value})
        r = run("eval", str(path), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        line = r.stderr.strip()
        assert line.startswith(f"micrograd-c: error: {path}: the model file's {key!r} is ")
        assert line.endswith(
            f"not an integer in [{0 if key == 'seed' else 1}, "
            f"{2**31 - 1 if key == 'seed' else 10**9}]: pass {opt}"
        )
        assert len(line) < 200 + len(str(path)), line
        r = run("eval", str(path), opt, "1", "--quiet", cwd=tmp_path)  # the option wins
        assert r.returncode == 0 and not r.stderr, r.stderr
    # an unsound recorded seed under a given one checks nothing (numpy takes no seed -1)
    MLP(64, [4, 10]).save(path, {"dataset": "digits", "seed": -1})
    r = run("eval", str(path), "--seed", "3", "--quiet", cwd=tmp_path)
    assert "Traceback" not in r.stderr and r.returncode in (0, 2), r.stderr
    model = MLP(784, [4, 10])
    model.save(path, {"dataset": "mnist", "mnist_training": "both"})
    r = run("eval", str(path), cwd=tmp_path)
    assert r.returncode == 2 and "'mnist_training' is 'both', not 'train' or 'test'" in r.stderr


def test_eval_refuses_a_digits_split_that_leaks(tmp_path):
    pytest.importorskip("sklearn")
    path = tmp_path / "d.npz"
    r = run(
        "train", "--dataset", "digits", "--seed", "7", "--limit", "500", "--epochs", "3",
        "--no-plot", "--quiet", "--save", str(path), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    e = run("eval", str(path), "--quiet", cwd=tmp_path)
    assert e.returncode == 0 and _accuracy(e.stdout) == _accuracy(r.stdout), e.stderr
    assert "on 100 held-out samples" in e.stdout
    for opts, msg in (
        (["--seed", "0"], "--seed 0: 18 of the 100 samples this split holds out are among the 400"),
        (["--seed", "7", "--limit", "499"], "--limit 499: 1 of the 100 samples"),
    ):
        e = run("eval", str(path), *opts, cwd=tmp_path)
        assert e.returncode == 2 and msg in e.stderr, e.stderr
        assert "so the accuracy would not be a held-out one; without it eval uses" in e.stderr
    for opts in (["--limit", "501"], ["--limit", "10000"]):  # held out after the cut
        assert run("eval", str(path), *opts, "--quiet", cwd=tmp_path).returncode == 0
    model, meta = modelfile.load(path)
    # a file of an older version records no seed: a warning, seed 0's split
    model.save(tmp_path / "old.npz", {"dataset": "digits"})
    e = run("eval", str(tmp_path / "old.npz"), "--quiet", cwd=tmp_path)
    assert e.returncode == 0 and "does not record the seed it was trained with" in e.stderr


def test_eval_of_a_model_trained_on_mnists_training_files_holds_out_the_whole_test_set(tmp_path):
    """A model that trained on MNIST's training files has held out the whole test set: eval scores
    all of it (or a quarter of the recorded limit, as train did) where only the test files are,
    instead of the test-only split's last 20%, and reads no training file."""
    d = write_small_mnist(tmp_path / "m", n=40)
    path = tmp_path / "m.npz"
    MLP(784, [4, 10]).save(path, {"dataset": "mnist", "seed": 0, "mnist_training": "train"})
    r = run("eval", str(path), "--data-dir", str(d), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the model trained on MNIST's training files; evaluating on 40 test images" in r.stderr
    assert "on 40 held-out samples" in r.stdout
    MLP(784, [4, 10]).save(path, {"dataset": "mnist", "limit": 40, "mnist_training": "train"})
    r = run("eval", str(path), "--data-dir", str(d), "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and "on 10 held-out samples" in r.stdout, r.stderr


def test_eval_of_a_model_trained_on_mnists_test_set_keeps_that_split(tmp_path, mnist_dir):
    """A model trained where only MNIST's test set was (its first 80%) is evaluated on that
    split's held-out images even where training files have appeared since (before: on the test
    set's first images, which it trained on)."""
    path = tmp_path / "m.npz"
    r = run(
        "train", "--dataset", "mnist", "--data-dir", mnist_dir, "--limit", "400", "--epochs",
        "1", "--no-plot", "--quiet", "--save", str(path), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert modelfile.load(path)[1]["mnist_training"] == "test"
    full = tmp_path / "full"
    full.mkdir()
    for name in os.listdir(mnist_dir):  # the test files, and the same files as training files
        os.symlink(os.path.join(mnist_dir, name), full / name)
        os.symlink(os.path.join(mnist_dir, name), full / name.replace("t10k", "train"))
    e = run("eval", str(path), "--data-dir", str(full), cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    assert _accuracy(e.stdout) == _accuracy(r.stdout) and "on 100 held-out samples" in e.stdout
    assert "the model trained on the test set; evaluating on the first 100 of the last" in e.stderr


def test_mnist_train_eval_export(tmp_path, mnist_dir):
    model = tmp_path / "mnist.npz"
    plot = tmp_path / "curve.png"
    r = run(
        "train",
        "--dataset",
        "mnist",
        "--data-dir",
        mnist_dir,
        "--limit",
        "2000",
        "--epochs",
        "2",
        "--save",
        str(model),
        "--plot",
        str(plot),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "no training files" in r.stderr  # ../shared has only the test set
    acc = float(r.stdout.split("accuracy ")[1].split()[0])
    assert acc > 0.6  # chance is 0.1; 2 epochs on 2,000 images
    if HAVE_MPL:
        assert plot.exists()
    r = run(
        "eval",
        str(model),
        "--dataset",
        "mnist",
        "--data-dir",
        mnist_dir,
        "--limit",
        "2000",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "confusion matrix" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines()[3:13]]
    assert sum(int(v) for row in rows for v in row[1:]) == 500


def test_export_c_matches_python_predictions(tmp_path):
    if not HAVE_CC:
        pytest.skip("no C compiler")
    model = tmp_path / "m.npz"
    r = run(
        "train",
        "--dataset",
        "moons",
        "--epochs",
        "20",
        "--no-plot",
        "--quiet",
        "--save",
        str(model),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    r = run("export-c", str(model), "-o", str(tmp_path / "model.c"), "--prefix", "moons_")
    assert r.returncode == 0, r.stderr
    (tmp_path / "main.c").write_text(
        textwrap.dedent("""
        #include <stdio.h>
        void moons_infer(const double *x, double *y, double *work);
        int main(void) {
            double x[2], y[1];
            while (scanf("%lf %lf", &x[0], &x[1]) == 2) {
                moons_infer(x, y, NULL);
                printf("%.17g\\n", y[0]);
            }
            return 0;
        }
    """)
    )
    tc = compiler.find_compiler()
    exe = tmp_path / "infer"
    subprocess.run(
        tc.command
        + [
            "-std=c11",
            "-O2",
            "-o",
            str(exe),
            str(tmp_path / "main.c"),
            str(tmp_path / "model.c"),
            "-lm",
        ],
        check=True,
    )
    pts = np.random.RandomState(0).uniform(-2, 2, size=(50, 2))
    out = subprocess.run(
        [str(exe)],
        input="\n".join(f"{float(a)!r} {float(b)!r}" for a, b in pts),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    m = MLP.load(model)
    expect = [m(list(p)).data for p in pts]
    assert [float(v) for v in out] == expect


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "--dataset", "cifar"], "invalid choice: 'cifar'"),
        (
            ["train", "--dataset", "mnist", "--data-dir", "/nonexistent"],
            "/nonexistent: no such directory",
        ),
        (["train", "--hidden", "a,b"], "--hidden 'a,b': expected widths such as 16,16"),
        (
            ["train", "--dataset", "moons", "--loss", "xent"],
            "--loss xent needs a classification dataset",
        ),
        (["eval", "/nonexistent.npz"], "/nonexistent.npz: no such model file"),
        ([], "a command is needed"),
    ],
)
def test_errors_are_one_line_with_exit_status_2(args, message):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("micrograd-c: error: ")
    assert "Traceback" not in r.stderr


def test_corrupt_data_and_wrong_model_files(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 5)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x00")
    r = run("train", "--dataset", "mnist", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "truncated header" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    r = run("eval", str(tmp_path / "junk.npz"))
    assert r.returncode == 2 and "not a micrograd-c model file" in r.stderr
    good = tmp_path / "good.npz"
    assert (
        run(
            "train", "--epochs", "1", "--no-plot", "--quiet", "--save", str(good), cwd=tmp_path
        ).returncode
        == 0
    )
    (tmp_path / "cut.npz").write_bytes(
        good.read_bytes()[:300]
    )  # a truncated zip (found by fuzzing)
    r = run("eval", str(tmp_path / "cut.npz"))
    assert (
        r.returncode == 2
        and "not a micrograd-c model file" in r.stderr
        and "Traceback" not in r.stderr
    )
    model = tmp_path / "m.npz"
    assert (
        run(
            "train", "--epochs", "1", "--no-plot", "--quiet", "--save", str(model), cwd=tmp_path
        ).returncode
        == 0
    )
    with np.load(model) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["layers.0.weight"] = np.zeros((16, 3))
    np.savez(tmp_path / "bad.npz", **arrays)
    r = run("eval", str(tmp_path / "bad.npz"))
    assert r.returncode == 2 and "expected shape (16, 2)" in r.stderr
    r = run("eval", str(model), "--dataset", "xor", "--debug")
    assert r.returncode == 0  # a moons model on xor data: valid shapes, just a poor fit


def test_no_compiler_is_one_line(tmp_path):
    r = run("train", "--backend", "c", "--no-plot", env={"CC": "/nonexistent"}, cwd=tmp_path)
    assert r.returncode == 2
    assert (
        "does not work" in r.stderr and "--backend tape" in r.stderr and "Traceback" not in r.stderr
    )


def test_debug_shows_the_traceback():
    r = run("train", "--dataset", "mnist", "--data-dir", "/nonexistent", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_bench_quick_prints_one_table():
    r = run("bench", "--quick", "--repeat", "1")
    assert r.returncode == 0, r.stderr
    assert "micrograd_c tape" in r.stdout and "ratio" in r.stdout
    if "micrograd 0.1.0" in r.stdout:
        assert "x" in r.stdout.split("micrograd_c tape")[1].splitlines()[0]


def test_ctrl_c_keeps_the_last_completed_step_and_exits_cleanly(tmp_path):
    import signal
    import time

    model = tmp_path / "m.npz"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "micrograd_c",
            "train",
            "--dataset",
            "xor",
            "--epochs",
            "100000000",
            "--backend",
            "tape",
            "--save",
            str(model),
            "--no-plot",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    line = ""
    while "ready in" not in line:  # the line printed once the program is ready to train
        line = p.stderr.readline()
        assert line, "the command ended before training"
    time.sleep(2)  # some epochs in
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted after" in err and "Traceback" not in err
    m = MLP.load(model)  # a complete, loadable model
    assert m.sizes == [2, 8, 1]


def test_nan_loss_is_warned_about(tmp_path):
    r = run(
        "train",
        "--dataset",
        "xor",
        "--epochs",
        "3",
        "--lr",
        "1e300",
        "--loss",
        "mse",
        "--no-plot",
        "--quiet",
        cwd=tmp_path,
    )
    assert r.returncode == 0
    assert "warning: the loss became NaN" in r.stderr


# ---- issue #11: the newcomer's path --------------------------------------------------------------


def write_small_mnist(d, n=40):
    """A small MNIST-shaped test set (IDX, gzip) in d, as ../shared holds: no training files."""
    import gzip
    import struct

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    for name, arr in (
        ("t10k-images-idx3-ubyte", rng.randint(0, 256, size=(n, 28, 28))),
        ("t10k-labels-idx1-ubyte", rng.randint(0, 10, size=n)),
    ):
        head = struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
        (d / (name + ".gz")).write_bytes(gzip.compress(head + arr.astype(np.uint8).tobytes()))
    return d


def test_version():
    import micrograd_c

    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"micrograd-c {micrograd_c.__version__} ")


def test_help_shows_the_defaults():
    r = run("train", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for expected in [
        "--epochs N default: 100 for moons, 50 for xor, 20 for digits, 1 for mnist",
        "--lr X learning rate; default: 0.1 for moons",
        "--hidden W,W hidden layer widths; default: 16,16 for moons",
        "--batch-size N default: 10 for moons",
        "--seed SEED default: 0",
        "--threads N threads per batch",
        "--backend {eager,tape,c,auto}",
        "else tape (default)",
        "default: DATASET.png",
    ]:
        assert expected in text, expected


def test_eval_finds_mnist_where_train_does_and_says_what_it_does(tmp_path):
    cache = write_small_mnist(tmp_path / "cache" / "mnist")
    env = {"MICROGRAD_C_DATA_DIR": str(cache)}
    r = run(
        "train",
        "--dataset",
        "mnist",
        "--epochs",
        "1",
        "--no-plot",
        "--save",
        "m.npz",
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    # 40 images: 32 train, the last 8 held out (the two never overlap)
    assert "training on the first 32 test images, evaluating on the last 8" in r.stderr
    r = run("eval", "m.npz", env=env, cwd=tmp_path)  # the dataset comes from the model file
    assert r.returncode == 0, r.stderr
    assert "training on" not in r.stderr and "evaluating on the last 8 test images" in r.stderr
    assert r.stdout.startswith("mnist: accuracy ")
    r = run(
        "eval", "m.npz", "--dataset", "mnist", "--data-dir", str(cache), cwd=tmp_path
    )  # the same data, named
    assert r.returncode == 0, r.stderr
    # no data anywhere: the error names both ways to get it
    r = run(
        "eval",
        "m.npz",
        "--dataset",
        "mnist",
        env={"MICROGRAD_C_DATA_DIR": str(tmp_path / "empty")},
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert "--data-dir" in r.stderr and "--download" in r.stderr and "Traceback" not in r.stderr
    r = run(
        "train", "--dataset", "mnist", "--data-dir", str(tmp_path), cwd=tmp_path
    )  # a directory without the files
    assert r.returncode == 2 and "no MNIST test files" in r.stderr and "--download" in r.stderr


def test_relative_data_dir_is_relative_to_the_current_directory(tmp_path):
    write_small_mnist(tmp_path / "work" / "data")
    r = run(
        "train",
        "--dataset",
        "mnist",
        "--data-dir",
        "data",
        "--epochs",
        "1",
        "--no-plot",
        "--quiet",
        cwd=tmp_path / "work",
    )
    assert r.returncode == 0, r.stderr


def test_download_without_network_fails_once_clearly_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache" / "micrograd_c" / "mnist"
    env = {
        "MICROGRAD_C_DATA_DIR": str(cache),
        "MICROGRAD_C_MNIST_MIRRORS": "http://127.0.0.1:9/a/ http://127.0.0.1:9/b/",
    }
    r = run("train", "--dataset", "mnist", "--download", "--quiet", env=env, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert (
        lines[0].count("http://127.0.0.1:9/a/") == 1
        and lines[0].count("http://127.0.0.1:9/b/") == 1
    )
    assert "(3 attempts)" in lines[0] and "pass --data-dir DIR" in lines[0]
    assert not (tmp_path / "cache").exists()  # no empty directories left behind


def test_a_log_gets_plain_progress_lines_not_a_frozen_bar(tmp_path):
    r = run(
        "train", "--epochs", "100", "--no-plot", cwd=tmp_path
    )  # stderr is a pipe here, not a terminal
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("epoch ")]
    import re

    assert not re.search(r"(?<![0-9])0/100", r.stderr) and "\r" not in r.stderr
    assert [line.split()[1] for line in lines] == [f"{k}/100" for k in range(10, 101, 10)]


@pytest.mark.parametrize("backend", ["tape", "eager"])
def test_one_epoch_still_draws_a_curve(tmp_path, monkeypatch, backend):
    seen = {}

    def fake_plot(path, data, predict, history, curve=()):
        seen.update(history=list(history), curve=list(curve))
        return path

    monkeypatch.setattr(commands, "plot", fake_plot)
    monkeypatch.chdir(tmp_path)
    assert (
        commands.main(
            [
                "train",
                "--dataset",
                "xor",
                "--epochs",
                "1",
                "--batch-size",
                "1",
                "--backend",
                backend,
                "--quiet",
                "--plot",
                "x.png",
            ]
        )
        == 0
    )
    assert len(seen["history"]) == 1
    xs = [t for t, _ in seen["curve"]]
    assert len(xs) == 100 and xs == sorted(xs) and xs[-1] == 1.0  # 200 samples: a point per 2
    losses = [v for _, v in seen["curve"]]
    assert len(set(losses)) > 50
    # the per-part losses, weighted, are the epoch's mean loss
    assert abs(np.mean(losses) - seen["history"][0][0]) < 1e-9


def test_chunked_epochs_train_the_same_model_on_every_backend(tmp_path):
    outs = {}
    for backend in ["tape", "eager"] + (["c"] if HAVE_CC else []):
        path = tmp_path / f"{backend}.npz"
        r = run(
            "train",
            "--dataset",
            "xor",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--backend",
            backend,
            "--no-plot",
            "--quiet",
            "--save",
            str(path),
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        outs[backend] = MLP.load(path).state_dict()
    for backend, sd in outs.items():
        for k in sd:
            assert np.allclose(sd[k], outs["tape"][k], rtol=1e-12, atol=1e-12), (backend, k)


def test_bench_says_which_references_it_skipped_and_how_to_get_them(tmp_path):
    block = tmp_path / "block"
    for mod in ("micrograd", "torch", "jax"):
        (block / mod).mkdir(parents=True)
        (block / mod / "__init__.py").write_text(f"raise ImportError('{mod} hidden by the test')\n")
    r = run("bench", "--quick", "--repeat", "1", env={"PYTHONPATH": str(block)}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "micrograd 0.1.0" not in out and "PyTorch" not in out.split("skipped")[0]
    skipped = next(line for line in out.splitlines() if line.startswith("skipped references"))
    assert "micrograd (pip install micrograd==0.1.0)" in skipped
    assert (
        "PyTorch (pip install torch==2.13.0)" in skipped
        and "JAX (pip install jax jaxlib)" in skipped
    )
    assert "pip install 'micrograd-c[bench]'" in out
    assert (
        "ratios against micrograd_c eager in this run" in out and "against micrograd in" not in out
    )
    assert "CPU: " in out


def _bench_states(names, nin, nouts, n):
    from micrograd_c.app import bench

    X, y = bench._data(nin, nouts[-1], n)
    states = {}
    for name, make in names.items():
        eng = make(nin, nouts)
        eng.prepare(X, y)
        eng.train(X, y)
        states[name] = eng.state()
    return states


@pytest.mark.parametrize("nin, nouts, n", [(2, [16, 16, 1], 40), (784, [50, 10], 3)])
def test_bench_references_train_the_same_model(nin, nouts, n):
    """Each reference row runs the same SGD from the same start: equal parameters afterwards."""
    from micrograd_c.app import bench

    names = {"tape": lambda i, o: bench._program_engine("tape", i, o)}
    try:
        import micrograd.engine as me
        import micrograd.nn as mn

        names["micrograd"] = lambda i, o: bench._values_engine(me.Value, mn.MLP, i, o)
    except ImportError:
        pass
    try:
        import torch  # noqa: F401

        names["torch"] = bench._torch_engine
    except ImportError:
        pass
    try:
        import jax  # noqa: F401

        names["jax step"] = lambda i, o: bench._jax_engine(i, o, scan=False)
        names["jax scan"] = lambda i, o: bench._jax_engine(i, o, scan=True)
    except ImportError:
        pass
    if len(names) == 1:
        pytest.skip("no reference installed (pip install 'micrograd-c[bench]')")
    states = _bench_states(names, nin, nouts, n)
    start = bench.initial_state(nin, nouts)
    for name, sd in states.items():
        moved = sum(float(np.abs(sd[k] - start[k]).sum()) for k in sd)
        assert moved > 0, name
        for k in sd:
            assert np.allclose(sd[k], states["tape"][k], rtol=1e-10, atol=1e-12), (name, k)


# ---- issue #10: files, arguments, output ---------------------------------------------------------


def _moons_model(tmp_path):
    model = tmp_path / "m.npz"
    if not model.exists():
        r = run(
            "train", "--epochs", "5", "--no-plot", "--quiet", "--save", str(model), cwd=tmp_path
        )
        assert r.returncode == 0, r.stderr
    return model


def _rewrite_meta(src, dst, **changes):
    import json

    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    meta.update(changes)
    with open(dst, "wb") as f:
        np.savez(f, __meta__=np.array(json.dumps(meta)), **arrays)


HOSTILE = [
    "x */ int planted_by_the_dataset = 1; /*",
    "a\n#define model_infer evil\n",
    "\\",
    "*/",
    "??/",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_export_c_writes_nothing_from_the_file_but_numbers(tmp_path, hostile):
    model = _moons_model(tmp_path)
    r = run("export-c", str(model), "-o", str(tmp_path / "clean.c"))
    assert r.returncode == 0, r.stderr
    clean = (tmp_path / "clean.c").read_text()
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = bad_dir / ("m " + hostile.replace("/", "_") + " planted_by_the_name.npz")
    _rewrite_meta(model, bad, dataset=hostile, loss=hostile, extra=hostile)
    r = run("export-c", str(bad), "-o", str(tmp_path / "bad.c"))
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "bad.c").read_text()
    assert "planted" not in out and "evil" not in out
    assert out == clean.replace(", trained on moons", "")


def test_export_c_refuses_a_prefix_that_is_not_an_identifier(tmp_path):
    model = _moons_model(tmp_path)
    r = run("export-c", str(model), "-o", str(tmp_path / "x.c"), "--prefix", "a*/b")
    assert r.returncode == 2 and "must be a C identifier" in r.stderr
    assert not (tmp_path / "x.c").exists()


def test_exported_c_compiles_without_warnings(tmp_path):
    model = _moons_model(tmp_path)
    assert run("export-c", str(model), "-o", str(tmp_path / "m.c")).returncode == 0
    import shutil

    compilers = [c for c in ("gcc", "clang") if shutil.which(c)]
    if not compilers:
        pytest.skip("no gcc or clang")
    for c in compilers:
        r = subprocess.run(
            [
                c,
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Wpedantic",
                "-Werror",
                "-c",
                str(tmp_path / "m.c"),
                "-o",
                str(tmp_path / "m.o"),
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, f"{c}: {r.stderr}"


def test_eval_of_a_file_that_is_not_a_model_says_so(tmp_path):
    r = run("eval", "/etc/passwd")
    assert r.returncode == 2 and "pickle" not in r.stderr
    assert (
        r.stderr.strip()
        == "micrograd-c: error: /etc/passwd: not a micrograd-c model file (not a .npz archive)"
    )
    r = run("eval", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-size", "0"], "argument --batch-size: must be between 1"),
        (["--limit", "0"], "argument --limit: must be between 1"),
        (["--limit", "-5"], "argument --limit: must be between 1"),
        (["--epochs", str(10**30)], "argument --epochs: must be between 1 and 1,000,000,000"),
        (["--epochs", "0"], "argument --epochs: must be between 1"),
        (["--l2", "nan"], "argument --l2: must be a finite number at least 0"),
        (["--l2", "-1"], "argument --l2: must be a finite number at least 0"),
        (["--lr", "inf"], "argument --lr: must be a finite number greater than 0"),
        (["--lr", "0"], "argument --lr: must be a finite number greater than 0"),
        (["--threads", "0"], "argument --threads: must be between 1"),
        (["--seed", "-1"], "argument --seed: must be between 0"),
        (["--hidden", "16,0"], "every width must be between 1"),
        (["--hidden", "100000,100000"], "more than 100,000,000"),
    ],
)
def test_bad_numbers_are_refused_before_training(tmp_path, args, message):
    r = run("train", "--no-plot", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


@pytest.mark.parametrize("option", ["--save", "--plot"])
@pytest.mark.parametrize("where", ["missing-dir/m.npz", "."])
def test_output_paths_are_checked_before_training(tmp_path, where, option):
    extra = ["--no-plot"] if option == "--save" else []
    r = run("train", "--epochs", "5", *extra, option, where, cwd=tmp_path)
    assert r.returncode == 2
    assert "ready in" not in r.stderr and "final loss" not in r.stdout  # refused before training
    assert r.stderr.strip().splitlines()[-1].startswith(f"micrograd-c: error: {option} {where}: ")


def test_limit_on_mnist_says_how_many_images_it_uses(tmp_path):
    cache = write_small_mnist(tmp_path / "mnist", n=200)
    r = run(
        "train", "--dataset", "mnist", "--data-dir", str(cache), "--limit", "100",
        "--epochs", "1", "--no-plot", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    msg = "training on the first 100 test images, evaluating on the first 25 of the last 40"
    assert msg in r.stderr and "100 training samples" in r.stderr


def test_mnist_test_set_alone_is_split_without_overlap(tmp_path):
    from micrograd_c.app.data import load_data

    d = load_data("mnist", data_dir=str(write_small_mnist(tmp_path / "m", n=100)))
    assert (len(d.Xtr), len(d.Xte)) == (80, 20)
    rows = {r.tobytes() for r in d.Xtr}
    assert not any(r.tobytes() in rows for r in d.Xte)
    with pytest.raises(Exception, match="too few to hold some out"):
        load_data("mnist", data_dir=str(write_small_mnist(tmp_path / "one", n=1)))


def test_save_and_plot_to_one_file_is_refused_before_training(tmp_path):
    for args in (["--save", "same.png", "--plot", "same.png"], ["--save", "moons.png"]):
        r = run("train", "--epochs", "1", *args, cwd=tmp_path)
        assert r.returncode == 2 and "would be written over the model" in r.stderr, r.stderr
        assert "ready in" not in r.stderr
    r = run("train", "--epochs", "1", "--save", "", "--no-plot", cwd=tmp_path)
    assert r.returncode == 2 and "--save: the path is empty" in r.stderr
    (tmp_path / "file").write_text("x")
    r = run("train", "--epochs", "1", "--save", "file/m.npz", "--no-plot", cwd=tmp_path)
    assert r.returncode == 2 and "file is not a directory" in r.stderr
    assert os.listdir(tmp_path) == ["file"]


def test_plot_format_is_checked_before_training_and_png_is_the_default(tmp_path):
    pytest.importorskip("matplotlib")
    r = run("train", "--epochs", "1", "--plot", "p.txt", cwd=tmp_path)
    assert r.returncode == 2 and "matplotlib cannot write .txt files" in r.stderr
    assert "ready in" not in r.stderr
    r = run("train", "--epochs", "1", "--plot", "p", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.png").exists() and f"plot written to {tmp_path / 'p.png'}" in r.stdout


def test_export_c_refuses_to_overwrite_its_model(tmp_path):
    MLP(2, [2, 1]).save(tmp_path / "m")
    model = next(p for p in tmp_path.iterdir())
    before = model.read_bytes()
    r = run("export-c", str(model), "-o", str(model))
    assert r.returncode == 2 and "is the model file itself" in r.stderr
    assert model.read_bytes() == before


def test_a_failed_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    model = MLP(2, [2, 1])

    def failing_write(f, *a, **kw):
        f.write(b"partial")
        f.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", failing_write)
    with pytest.raises(OSError, match="No space left on device"):
        model.save(tmp_path / "m.npz")
    assert os.listdir(tmp_path) == []
    with pytest.raises(
        commands.UsageError, match="m.npz: cannot write the model .No space left on device"
    ):
        commands.save_model(str(tmp_path / "m.npz"), model, {})
    assert os.listdir(tmp_path) == []


def test_eval_into_a_closed_pipe_is_quiet(tmp_path):
    model = _moons_model(tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-m", "micrograd_c", "eval", str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    p.stdout.close()  # `| head -0`: the reader is gone before anything is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert (
        "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err
    )


def test_a_saved_model_has_the_usual_permissions(tmp_path):
    model = _moons_model(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    assert model.stat().st_mode & 0o777 == 0o666 & ~umask
