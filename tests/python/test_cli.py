"""The micrograd-c command end to end, in subprocesses, as a person runs it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from micrograd_c import cli, compiler

HAVE_MPL = True
try:
    import matplotlib  # noqa: F401
except ImportError:
    HAVE_MPL = False


def run(*args, env=None, cwd=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "micrograd_c", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=600)


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
    r = run("train", "--dataset", "xor", "--epochs", "5", "--backend", backend, "--no-plot", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"({backend})" in r.stdout and r.stderr == ""


def test_backends_train_to_the_same_model(tmp_path):
    outs = {}
    for backend in ["tape"] + (["c"] if _have_cc() else []):
        path = tmp_path / f"{backend}.npz"
        r = run("train", "--dataset", "xor", "--epochs", "3", "--backend", backend, "--no-plot", "--quiet",
                "--save", str(path), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        with np.load(path) as z:
            outs[backend] = {k: z[k] for k in z.files if k != "__meta__"}
    if "c" in outs:
        for k in outs["tape"]:
            assert np.array_equal(outs["tape"][k], outs["c"][k])


def _have_cc():
    try:
        compiler.find_compiler()
        return True
    except Exception:
        return False


def test_digits_or_a_clear_message(tmp_path):
    r = run("train", "--dataset", "digits", "--epochs", "2", "--no-plot", "--quiet", cwd=tmp_path)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        assert r.returncode == 2
        assert r.stderr.strip() == "micrograd-c: error: the digits dataset needs scikit-learn: pip install 'micrograd-c[data]'"
        return
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split("accuracy ")[1].split()[0]) > 0.8


def test_mnist_train_eval_export(tmp_path, mnist_dir):
    model = tmp_path / "mnist.npz"
    plot = tmp_path / "curve.png"
    r = run("train", "--dataset", "mnist", "--data-dir", mnist_dir, "--limit", "2000", "--epochs", "2",
            "--save", str(model), "--plot", str(plot), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no training files" in r.stderr  # ../shared has only the test set
    acc = float(r.stdout.split("accuracy ")[1].split()[0])
    assert acc > 0.6  # chance is 0.1; 2 epochs on 2,000 images
    if HAVE_MPL:
        assert plot.exists()
    r = run("eval", str(model), "--dataset", "mnist", "--data-dir", mnist_dir, "--limit", "2000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "confusion matrix" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines()[3:13]]
    assert sum(int(v) for row in rows for v in row[1:]) == 500


def test_export_c_matches_python_predictions(tmp_path):
    if not _have_cc():
        pytest.skip("no C compiler")
    model = tmp_path / "m.npz"
    r = run("train", "--dataset", "moons", "--epochs", "20", "--no-plot", "--quiet", "--save", str(model), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("export-c", str(model), "-o", str(tmp_path / "model.c"), "--prefix", "moons_")
    assert r.returncode == 0, r.stderr
    (tmp_path / "main.c").write_text(textwrap.dedent("""
        #include <stdio.h>
        void moons_infer(const double *x, double *y, double *work);
        int main(void) {
            double x[2], y[1];
            while (scanf("%lf %lf", &x[0], &x[1]) == 2) { moons_infer(x, y, NULL); printf("%.17g\\n", y[0]); }
            return 0;
        }
    """))
    tc = compiler.find_compiler()
    exe = tmp_path / "infer"
    subprocess.run(tc.command + ["-std=c11", "-O2", "-o", str(exe), str(tmp_path / "main.c"),
                                 str(tmp_path / "model.c"), "-lm"], check=True)
    pts = np.random.RandomState(0).uniform(-2, 2, size=(50, 2))
    out = subprocess.run([str(exe)], input="\n".join(f"{float(a)!r} {float(b)!r}" for a, b in pts), capture_output=True,
                         text=True, check=True).stdout.split()
    m, _ = cli.load_model(str(model))
    expect = [m(list(p)).data for p in pts]
    assert [float(v) for v in out] == expect


@pytest.mark.parametrize("args, message", [
    (["train", "--bogus"], "unrecognized arguments: --bogus"),
    (["train", "--dataset", "cifar"], "invalid choice: 'cifar'"),
    (["train", "--dataset", "mnist", "--data-dir", "/nonexistent"], "/nonexistent: no such directory"),
    (["train", "--hidden", "a,b"], "--hidden 'a,b': expected widths such as 16,16"),
    (["train", "--dataset", "moons", "--loss", "xent"], "--loss xent needs a classification dataset"),
    (["eval", "/nonexistent.npz"], "/nonexistent.npz: no such model file"),
    ([], "a command is needed"),
])
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
    assert run("train", "--epochs", "1", "--no-plot", "--quiet", "--save", str(good), cwd=tmp_path).returncode == 0
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:300])  # a truncated zip (found by fuzzing)
    r = run("eval", str(tmp_path / "cut.npz"))
    assert r.returncode == 2 and "not a micrograd-c model file" in r.stderr and "Traceback" not in r.stderr
    model = tmp_path / "m.npz"
    assert run("train", "--epochs", "1", "--no-plot", "--quiet", "--save", str(model), cwd=tmp_path).returncode == 0
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
    assert "does not work" in r.stderr and "--backend tape" in r.stderr and "Traceback" not in r.stderr


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
    p = subprocess.Popen([sys.executable, "-m", "micrograd_c", "train", "--dataset", "xor", "--epochs", "100000000",
                          "--backend", "tape", "--save", str(model), "--no-plot"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    line = ""
    while "ready in" not in line:  # the line printed once the program is ready to train
        line = p.stderr.readline()
        assert line, "the command ended before training"
    time.sleep(2)  # some epochs in
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted after" in err and "Traceback" not in err
    m, meta = cli.load_model(str(model))  # a complete, loadable model
    assert m.sizes == [2, 8, 1]


def test_nan_loss_is_warned_about(tmp_path):
    r = run("train", "--dataset", "xor", "--epochs", "3", "--lr", "1e300", "--loss", "mse", "--no-plot", "--quiet",
            cwd=tmp_path)
    assert r.returncode == 0
    assert "warning: the loss became NaN" in r.stderr
