"""The ./dev script as a person runs it: from another directory; ./dev test's closing lines."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

DEV = os.path.join(ROOT, "dev")

pytestmark = pytest.mark.skipif(
    sys.prefix == sys.base_prefix or not os.path.exists(DEV),
    reason="needs the repository's ./dev and a virtual environment to hand it",
)


def dev(*args, cwd, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if k != "CI"}
    e.update(MICROGRAD_C_VENV=sys.prefix, **(env or {}))
    return subprocess.run(
        [DEV, *args], capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout
    )


def test_dev_train_from_another_directory_keeps_paths_relative_to_it(tmp_path):
    from test_cli import write_small_mnist

    work = tmp_path / "work"
    write_small_mnist(work / "data")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {"TMPDIR": str(tmpdir), "MICROGRAD_C_CACHE_DIR": str(tmp_path / "cache")}
    before = set(os.listdir(ROOT))
    r = dev(
        "train",
        "--dataset",
        "mnist",
        "--data-dir",
        "data",
        "--epochs",
        "1",
        "--save",
        "here.npz",
        "--plot",
        "curve.png",
        cwd=work,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (
        (work / "here.npz").exists() and (work / "curve.png").exists() or "matplotlib" in r.stderr
    )
    assert set(os.listdir(ROOT)) == before  # nothing written into the repository
    assert os.listdir(tmpdir) == []  # and no temporary file left behind


def test_dev_test_names_the_stages_it_skipped(tmp_path):
    r = dev("test", "docs", cwd=tmp_path, env={"DOXYGEN": str(tmp_path / "no-doxygen")})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert (
        lines[-2] == "== all tests that ran passed; skipped stages: "
        "docs (doxygen not found: apt-get install doxygen)"
    )
    assert lines[-1] == "tests: 0 passed, 0 failed"
    # in CI every stage must run
    r = dev(
        "test", "docs", cwd=tmp_path, env={"DOXYGEN": str(tmp_path / "no-doxygen"), "CI": "true"}
    )
    assert r.returncode != 0 and "tests FAILED" in r.stdout


def test_dev_test_refuses_an_unknown_stage(tmp_path):
    r = dev("test", "nonsense", cwd=tmp_path)
    assert r.returncode == 2 and "unknown stage nonsense" in r.stderr


def test_dev_test_does_not_recurse(tmp_path):
    r = dev("test", "python", cwd=tmp_path, env={"MICROGRAD_C_DEV_TEST": "1"})
    assert r.returncode == 2 and "nested run refused" in r.stderr


def test_a_fuzzer_failure_names_the_input_shows_the_traceback_and_the_tally(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus" / "idx"
    corpus.mkdir(parents=True)
    (corpus / "ok").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x02ab")
    (corpus / "canary").write_bytes(b"CANARY!")
    env = {
        "MG_FUZZ_TARGETS": "idx",
        "MG_FUZZ_CORPUS": str(tmp_path / "corpus"),
        "FUZZ_RUNS": "50",
        "MICROGRAD_C_FUZZ_CANARY": "CANARY!",
        # the fuzz stage installs the package unless the ./dev run around it did: not here, where
        # the package under test is installed already and other tests may be importing it
        "MICROGRAD_C_INSTALLED_BY": f"{ROOT}:{sys.prefix}",
    }
    r = dev("test", "fuzz", cwd=tmp_path, env=env)
    assert r.returncode != 0
    assert f"input: {corpus / 'canary'}" in r.stderr  # the replayed seed that failed
    assert "AssertionError: the canary input" in r.stderr and "Traceback" in r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("tests: ") and " failed" in r.stdout
    assert (
        "tests: 0 failed" not in r.stdout and ", 0 failed" not in r.stdout.strip().splitlines()[-1]
    )
    # without the canary the same corpus replays and explores cleanly, the same way each time
    env.pop("MICROGRAD_C_FUZZ_CANARY")
    outs = []
    for _ in range(2):
        r = dev("test", "fuzz", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append([line for line in r.stdout.splitlines() if line.startswith("fuzz idx")])
    assert (
        outs[0]
        == outs[1]
        == ["fuzz idx (replay): 2 inputs, no failure", "fuzz idx (explore): 50 runs, no failure"]
    )


BUILD_LINE = "building and installing the micrograd_c package"  # or "== rebuilding and ..."
STALE_SOURCES = (
    "libmg",
    "bindings",
    "python",
    "tools",
    "meson.build",
    "meson.options",
    "pyproject.toml",
)


def newest_source() -> float:
    """The newest modification time among the files ./dev's package_stale compares with."""
    newest = 0.0
    for top in STALE_SOURCES:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            newest = max(newest, os.path.getmtime(path))
        for dirpath, _, files in os.walk(path):
            for f in files:
                newest = max(newest, os.path.getmtime(os.path.join(dirpath, f)))
    return newest


@pytest.mark.alone
def test_dev_train_rebuilds_a_stale_install_only(tmp_path):
    """./dev train rebuilds the package when a source is newer than its last install by ./dev (the
    stamp in the venv), not when every source is older, and leaves alone a package that ./dev did
    not install (no stamp). The rebuild is incremental: the same tree, so the same package."""
    stamp = os.path.join(sys.prefix, ".micrograd_c-installed")
    if not os.path.exists(stamp):
        pytest.skip("the package in this venv was not installed by ./dev")
    env = {"MICROGRAD_C_CACHE_DIR": str(tmp_path / "cache")}

    def train():
        r = dev(
            "train",
            "--dataset",
            "xor",
            "--epochs",
            "1",
            "--no-plot",
            "--quiet",
            cwd=tmp_path,
            env=env,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    newest = newest_source()
    away = stamp + ".away"
    try:
        os.utime(stamp, (newest + 60, newest + 60))  # installed after every source
        assert BUILD_LINE not in train()
        os.utime(stamp, (newest - 60, newest - 60))  # a source changed since
        out = train()
        assert BUILD_LINE in out and "(incremental)" in out  # ./dev's build directory is kept
        assert os.path.getmtime(stamp) > newest - 60  # the rebuild renewed the stamp
        os.replace(stamp, away)  # installed by hand, not by ./dev
        assert BUILD_LINE not in train()
    finally:
        if os.path.exists(away):
            os.replace(away, stamp)
