"""What importing costs: the engine alone, the compiler and the application only when used."""

from __future__ import annotations

import json
import subprocess
import sys

import micrograd_c


def _modules_after(code: str) -> list:
    """The modules loaded by ``code`` in a fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_importing_the_engine_imports_neither_the_compiler_nor_its_dependencies():
    loaded = _modules_after("from micrograd_c.engine import Value\nValue(1.0) * 2")
    assert "micrograd_c._core" in loaded and "micrograd_c.engine" in loaded
    assert not [m for m in loaded if m.startswith(("micrograd_c.compiler", "micrograd_c.app"))]
    # the compiler's dependencies: it runs the C compiler and loads what it built
    assert "subprocess" not in loaded and "ctypes" not in loaded
    # nor numpy (which imports ctypes): nn, viz and the compiler load on first use
    assert "numpy" not in loaded and "micrograd_c.nn" not in loaded


def test_lazy_names_load_their_module_on_first_use():
    loaded = _modules_after(
        "import micrograd_c as mc\nassert mc.compile is mc.compiler.compile\n"
        "assert mc.MLP.__module__ == 'micrograd_c.nn'"
    )
    assert "micrograd_c.compiler.program" in loaded and "micrograd_c.nn" in loaded
    assert not [
        m for m in loaded if m.startswith("micrograd_c.app")
    ]  # the library never imports it
    star = _modules_after(
        "from micrograd_c import *\nassert callable(compile) and MLP and draw_dot"
    )
    assert "micrograd_c.compiler" in star
    assert {"compile", "MLP", "CompileError", "nn", "compiler"} <= set(dir(micrograd_c))
    # the helpers the package imports are not listed as its names (found by review)
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib"} & set(dir(micrograd_c))
    try:
        micrograd_c.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def test_no_library_module_imports_the_application():
    loaded = _modules_after(
        "import micrograd_c.compiler, micrograd_c.datasets, micrograd_c.modelfile, "
        "micrograd_c.nn, micrograd_c.viz, micrograd_c.functional"
    )
    assert not [m for m in loaded if m.startswith("micrograd_c.app")]
