"""One version: meson.build's project version is the package's, the module's and libmg's."""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

import micrograd_c
from micrograd_c import _core

from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    from pip._vendor import tomli as tomllib


def meson_version() -> str:
    with open(os.path.join(ROOT, "meson.build"), encoding="utf-8") as f:
        m = re.search(r"project\([^)]*?version:\s*'([^']+)'", f.read(), re.S)
    assert m, "no version in meson.build's project()"
    return m.group(1)


def test_the_version_is_written_once_in_meson_build():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    for path in ("libmg/include/mg/mg.h", "python/micrograd_c/__init__.py"):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert meson_version() not in f.read(), f"{path} repeats the version"


def test_module_package_and_library_agree_with_meson():
    v = meson_version()
    assert micrograd_c.__version__ == v
    assert _core.LIBMG_VERSION == v  # MG_VERSION from the generated mg/version.h
    assert metadata.version("micrograd-c") == v
