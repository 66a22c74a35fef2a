"""Every line of the README runs as written.

The README's fenced blocks are run in order, as a newcomer pastes them, in a scratch copy of the
working tree (with ``../shared`` beside it when this checkout has one) and a scratch ``$HOME``:

- ``python`` blocks: each in a fresh interpreter (this environment's, where the package is
  installed), from the copy's root;
- ``c`` blocks: saved under the file name the text just before them gives (``prog.c``);
- ``sh`` blocks: one bash script per block (``set -euo pipefail``), from the copy's root, with
  ``./dev`` using this virtual environment. A line matching :data:`SKIP` is not run, nor are the
  lines after it in its block (they may depend on it); the test prints what it skipped and why.

The C quick start therefore builds libmg, installs it under the scratch ``$HOME/.local``,
compiles ``prog.c`` through pkg-config and runs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import MNIST_DIR, ROOT

README = os.path.join(ROOT, "README.md")

#: Lines the test does not run, with the reason: network, root, the suite itself, or minutes.
SKIP: list[tuple[str, str]] = [
    (r"^\./dev test\b", "the test suite itself"),
    (
        r"^pip install\b",
        "network: installs from PyPI (the tests run against the installed package)",
    ),
    (r"--download\b", "network: downloads MNIST"),
    (r"^sudo\b", "needs root"),
    (r"^micrograd-c bench(?!.*--quick)", "takes minutes"),
]

pytestmark = pytest.mark.skipif(
    not os.path.exists(README) or sys.prefix == sys.base_prefix,
    reason="needs the source tree and a virtual environment",
)


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, code, the text before the block) for every fenced block."""
    out, pos = [], 0
    for m in re.finditer(r"^```([\w+-]*)\n(.*?)^```\s*$", text, flags=re.S | re.M):
        out.append((m.group(1), m.group(2), text[pos : m.start()]))
        pos = m.end()
    return out


def skip_reason(line: str) -> str | None:
    for pattern, reason in SKIP:
        if re.search(pattern, line):
            return reason
    if "../shared/data/mnist" in line and not os.path.isdir(MNIST_DIR):
        return "the MNIST test set is not in ../shared/data/mnist"
    return None


def logical_lines(code: str) -> list[str]:
    lines, cur = [], ""
    for raw in code.splitlines():
        cur += raw
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip():
            lines.append(cur)
        cur = ""
    return lines


def scratch_copy(dest: str) -> str:
    """The working tree as a clone sees it (tracked and new files, without ignored ones)."""
    repo = os.path.join(dest, "repo")
    try:
        names = (
            subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(
            ROOT, repo, ignore=shutil.ignore_patterns("build*", ".venv", "__pycache__", ".git")
        )
    else:
        for name in filter(None, names):
            src = os.path.join(ROOT, name)
            if not os.path.isfile(src):
                continue  # deleted but not yet committed
            os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(repo, name))
    if os.path.isdir(os.path.join(os.path.dirname(ROOT), "shared")):
        os.symlink(os.path.join(os.path.dirname(ROOT), "shared"), os.path.join(dest, "shared"))
    return repo


def test_readme_parses_into_runnable_blocks():
    langs = [lang for lang, _, _ in blocks(open(README).read())]
    assert {"python", "c", "sh"} <= set(langs)
    assert all(lang in ("python", "c", "sh", "text", "") for lang in langs), langs


def test_every_readme_block_runs_as_written(tmp_path):
    repo = scratch_copy(str(tmp_path))
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PKG_CONFIG_PATH",
            "XDG_CACHE_HOME",
            "MICROGRAD_C_DATA_DIR",
            "CI",
            "LD_LIBRARY_PATH",
        )
    }
    env.update(
        HOME=str(home),
        MICROGRAD_C_VENV=sys.prefix,
        MICROGRAD_C_CACHE_DIR=str(tmp_path / "cache"),
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        MPLBACKEND="Agg",
        MICROGRAD_C_MNIST_MIRRORS="http://127.0.0.1:9/",
    )  # were a download line run, it fails fast
    ran, skipped = 0, []
    for i, (lang, code, before) in enumerate(blocks(open(README).read())):
        where = f"README block {i + 1} ({lang})"
        if lang == "python":
            path = tmp_path / f"snippet_{i}.py"
            path.write_text(code)
            r = subprocess.run(
                [sys.executable, str(path)],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert r.returncode == 0, f"{where} failed:\n{code}\n{r.stdout}\n{r.stderr}"
            ran += 1
        elif lang == "c":
            names = re.findall(r"`([\w.-]+\.c)`", before[-400:])
            assert names, f"{where}: the text before a C block names the file to save it as"
            (tmp_path / "repo" / names[-1]).write_text(code)
        elif lang == "sh":
            script = ["set -euo pipefail"]
            lines = logical_lines(code)
            for k, line in enumerate(lines):
                reason = skip_reason(line.strip())
                if reason:
                    skipped += [(line.strip(), reason)] + [
                        (rest.strip(), "follows a skipped line") for rest in lines[k + 1 :]
                    ]
                    break
                script.append(line)
            if len(script) == 1:
                continue
            r = subprocess.run(
                ["bash", "-c", "\n".join(script)],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert r.returncode == 0, (
                f"{where} failed:\n"
                + "\n".join(script[1:])
                + f"\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
            ran += len(script) - 1
            if "./prog" in script[-1]:
                assert "y = 4, dy/da = -3" in r.stdout
    # the C quick start installed the C library and nothing else (no _core, no site-packages)
    local = home / ".local"
    if local.exists():
        installed = [str(p.relative_to(local)) for p in local.rglob("*")]
        assert any(p.endswith("libmg.pc") for p in installed), installed
        assert not [
            p for p in installed if "site-packages" in p or "_core" in p or p.endswith(".py")
        ], installed
    print(f"ran {ran} README lines and snippets; skipped:")
    for line, reason in skipped:
        print(f"  {line}  [{reason}]")
    assert ran >= 10
    assert {reason for _, reason in skipped} <= {r for _, r in SKIP} | {
        "follows a skipped line",
        "the MNIST test set is not in ../shared/data/mnist",
    }


def test_the_api_reference_lists_every_header_group():
    """docs/mainpage.md, the Doxygen index, links every @defgroup of the public headers."""
    inc = os.path.join(ROOT, "libmg", "include", "mg")
    groups = set()
    for name in os.listdir(inc):
        groups |= set(re.findall(r"@defgroup\s+(\w+)", open(os.path.join(inc, name)).read()))
    page = open(os.path.join(ROOT, "docs", "mainpage.md")).read()
    assert groups and {g for g in groups if f"@ref {g} " not in page} == set()
