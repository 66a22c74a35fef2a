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
