"""The compiled-library cache: content-addressed keys, per-key locks, atomic writes, loading.

In the spirit of TorchInductor's code cache: a library is stored under a hash of its source, the
compiler (path, command, version), the flags and the emitter version; writes go to a temporary
file renamed into place under a per-key ``flock``, so concurrent builds of one program both
succeed and a loaded library is never rewritten.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Sequence

from .. import _core
from .toolchain import CompileError, Toolchain

def cache_dir() -> str:
    """The compiled-library cache: ``$MICROGRAD_C_CACHE_DIR``, else the user cache directory."""
    env = os.environ.get("MICROGRAD_C_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "micrograd_c")


# ---- cache ----------------------------------------------------------------------------------

@contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock on `path` (a lock file per cache key), across processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: rely on the atomic rename alone
            pass
        yield
    finally:
        os.close(fd)


def _cache_key(source: str, tc: Toolchain, flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (source, tc.path, " ".join(tc.command), tc.version, "\0".join(flags),
                 str(_core.EMITTER_VERSION), platform.machine(), sys.platform):
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def build_library(source: str, tc: Toolchain, flags: Sequence[str], *, cache: Optional[str] = None,
                  timeout: float = 600.0) -> Dict[str, Any]:
    """Compile `source` into a shared library in the cache, unless it is there already.

    Returns ``{"path", "cached", "compile_seconds", "command"}``. Writes go to a temporary file
    that is renamed into place, under a per-key lock, so concurrent builds of the same source
    both succeed. Raises :class:`CompileError` on failure or timeout.
    """
    root = cache or cache_dir()
    try:
        os.makedirs(root, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-", delete=True)
        probe.close()
    except OSError as e:
        # a read-only, full or bogus cache directory must not stop a compile: build privately
        fallback = tempfile.mkdtemp(prefix="micrograd_c-cache-")
        warnings.warn(f"the cache directory {root} is not usable ({e.strerror or e}); "
                      f"compiling into {fallback} instead", RuntimeWarning, stacklevel=3)
        root = fallback
    key = _cache_key(source, tc, flags)
    lib = os.path.join(root, f"mg_{key}.so")
    with _locked(lib + ".lock"):
        if os.path.exists(lib) and os.path.getsize(lib) > 0:
            return {"path": lib, "cached": True, "compile_seconds": 0.0, "command": []}
        try:
            fd, tmp_src = tempfile.mkstemp(prefix=f"mg_{key}.", suffix=".c", dir=root)
            with os.fdopen(fd, "w") as f:
                f.write(source)
        except OSError as e:
            raise CompileError(f"could not write the generated source to {root}: {e}") from None
        tmp_lib = tmp_src[:-2] + ".so.tmp"
        cmd = tc.command + list(flags) + ["-fPIC", "-shared", "-o", tmp_lib, tmp_src, "-lm"]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _remove(tmp_lib)
            out = (e.stdout or "") + (e.stderr or "") if isinstance(e.stdout, str) else ""
            raise CompileError(f"the C compiler timed out after {timeout:g} s", cmd, out) from None
        except OSError as e:
            raise CompileError(f"could not run the C compiler: {e}", cmd) from None
        finally:
            if os.path.exists(tmp_src):
                os.replace(tmp_src, os.path.join(root, f"mg_{key}.c"))
        seconds = time.perf_counter() - t0
        if r.returncode != 0 or not os.path.exists(tmp_lib):
            _remove(tmp_lib)
            raise CompileError(f"the C compiler failed (exit status {r.returncode})", cmd, r.stdout + r.stderr)
        try:
            os.replace(tmp_lib, lib)
        except OSError as e:
            _remove(tmp_lib)
            raise CompileError(f"could not store the compiled library in {root}: {e}", cmd) from None
        return {"path": lib, "cached": False, "compile_seconds": seconds, "command": cmd}


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class CompiledProgram(ctypes.Structure):
    """libmg's ``mg_compiled``: what generated training code exports as ``<prefix>program``."""

    _fields_ = [("abi", ctypes.c_uint), ("real_bytes", ctypes.c_uint), ("fingerprint", ctypes.c_ulonglong),
                ("nnests", ctypes.c_size_t), ("kernels", ctypes.c_void_p)]


def load_library(path: str, tape: Any, prefix: str) -> ctypes.CDLL:
    """Load a compiled library and check that it was generated for ``tape``; raises OSError if not."""
    lib = ctypes.CDLL(path)
    try:
        version = ctypes.c_int.in_dll(lib, prefix + "emitter_version").value
        program = CompiledProgram.in_dll(lib, prefix + "program")
    except ValueError as e:  # a missing symbol
        raise OSError(f"{path}: not a library generated by this version of micrograd_c ({e})") from None
    if version != _core.EMITTER_VERSION:
        raise OSError(f"{path}: built by emitter version {version}, this is {_core.EMITTER_VERSION}")
    if program.fingerprint != tape.fingerprint:
        raise OSError(f"{path}: generated for another program")
    return lib


