"""The compiled-library cache: content-addressed keys, per-key locks, atomic writes, loading.

In the spirit of TorchInductor's code cache: a library is stored under a hash of its source, the
compiler (path, command, version), the flags, what machine-dependent flags resolve to on this
machine (``-march=native``) and the emitter version; writes go to a temporary file renamed into
place under a per-key ``flock``, so concurrent builds of one program both succeed and a loaded
library is never rewritten. Each entry's digest is recorded beside it, and an entry whose bytes no
longer match (damaged in place) is rebuilt rather than loaded.

Loading a shared library runs its constructors before anything can be checked, so the cache
trusts only what this user alone can have written: the cache directory (created 0700) and each
entry must be owned by the current user and not writable by group or others. A directory that
fails is replaced by a private one for this process (removed at exit), an entry that fails is
rebuilt, each with a warning. A library is loaded from a private copy of the bytes that were
checked, under a name no earlier load in this process used, so a rebuilt entry is really loaded
again (``dlopen`` returns the library already loaded under the same name).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import itertools
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .. import _core
from .._fs import user_cache_dir
from .toolchain import CompileError, Toolchain, resolved_target, run_command, run_commands


class LibraryLoadError(OSError):
    """A compiled library was refused or does not fit the program.

    Raised by :func:`load_library` and :func:`load_verified` when the file cannot be trusted
    (owner, permissions, not a regular file), cannot be loaded, lacks a symbol the program uses,
    or was built for another layout or emitter version. It is an :class:`OSError`, so a caller
    that treats every ``OSError`` from loading as a bad cache entry (remove it, rebuild once, then
    raise :class:`CompileError`, which ``backend="auto"`` turns into the tape) handles it.
    """


def cache_dir() -> str:
    """The compiled-library cache: ``$MICROGRAD_C_CACHE_DIR``, else ``micrograd_c`` in the user's
    cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    return user_cache_dir("MICROGRAD_C_CACHE_DIR", "micrograd_c")


# ---- trust ----------------------------------------------------------------------------------


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with status ``st`` may hold another user's code, or None."""
    if os.name != "posix":  # no owners or modes to check: the user's own cache is assumed
        return None
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_root(root: str) -> str | None:
    """Creates ``root`` (0700) if needed; why it cannot be trusted, or None. Raises OSError when
    it is not usable at all (not a directory, not writable)."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    why = _untrusted(os.stat(root), f"the directory {root}")
    probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-", delete=True)
    probe.close()
    return why


_fallback: dict[int, str] = {}  # process id -> its private cache directory, once one was needed


def _fallback_root() -> str:
    """A private directory for this process, removed when the process exits."""
    pid = os.getpid()  # a forked child makes its own, and never removes its parent's
    d = _fallback.get(pid)
    if d is None or not os.path.isdir(d):
        if not _fallback:
            atexit.register(_remove_fallback)
        d = _fallback[pid] = tempfile.mkdtemp(prefix="micrograd_c-cache-")  # mode 0700
    return d


def _remove_fallback() -> None:
    d = _fallback.pop(os.getpid(), None)
    if d:
        shutil.rmtree(d, ignore_errors=True)  # loaded libraries are private copies: safe


# ---- cache ----------------------------------------------------------------------------------


@contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock on `path` (a lock file per cache key), across processes. A lock file
    that cannot be opened (a directory or a dangling link in its place) is a :class:`CompileError`
    (which ``backend="auto"`` turns into the tape), not a bare ``OSError``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as e:
        raise CompileError(f"could not lock the cache entry {path}: {e.strerror or e}") from None
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
    for part in (
        source,
        tc.path,
        " ".join(tc.command),
        tc.version,
        "\0".join(flags),
        resolved_target(tc, flags),
        str(_core.EMITTER_VERSION),
        platform.machine(),
        sys.platform,
    ):
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def build_library(
    source: str,
    tc: Toolchain,
    flags: Sequence[str],
    *,
    cache: str | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Compile `source` into a shared library in the cache, unless it is there already.

    Returns ``{"path", "cached", "compile_seconds", "command"}``. Writes go to a temporary file
    that is renamed into place, under a per-key lock, so concurrent builds of the same source
    both succeed. A cache directory that is not usable, or not private (owned by this user, not
    writable by group or others), is replaced by a private directory for this process, with a
    warning; an entry that is not private is rebuilt, with a warning. Raises
    :class:`CompileError` on failure or timeout (the compiler's whole process group is killed).
    """
    root = cache or cache_dir()
    try:
        why = _private_root(root)
    except OSError as e:
        # a read-only, full or bogus cache directory must not stop a compile: build privately
        fallback = _fallback_root()
        warnings.warn(
            f"the cache directory {root} is not usable ({e.strerror or e}); "
            f"compiling into {fallback} instead",
            RuntimeWarning,
            stacklevel=3,
        )
        root = fallback
    else:
        if why:
            fallback = _fallback_root()
            warnings.warn(
                f"the cache directory {root} is not private: {why}; its libraries are not "
                f"loaded (that would run code others can plant there); compiling into "
                f"{fallback} instead (fix: chmod go-w, or set MICROGRAD_C_CACHE_DIR)",
                RuntimeWarning,
                stacklevel=3,
            )
            root = fallback
    key = _cache_key(source, tc, flags)
    lib = os.path.join(root, f"mg_{key}.so")
    with _locked(lib + ".lock"):
        try:
            st: os.stat_result | None = os.lstat(lib)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > 0:
            why = _untrusted(st, f"the cache entry {lib}")
            if why is None:
                # checked here, so that a damaged entry is rebuilt, and again by load_verified on
                # the bytes it loads; no digest (built before digests, or its build cut off):
                # rebuilt, quietly
                recorded = _recorded_digest(lib)
                if recorded is not None and recorded == _file_digest(lib):
                    return {"path": lib, "cached": True, "compile_seconds": 0.0, "command": []}
                if recorded is not None:
                    warnings.warn(
                        f"the cache entry {lib} is not what was built there (its bytes do not "
                        f"match the digest recorded with it): not loaded; rebuilding it",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            else:
                warnings.warn(f"{why}: not loaded; rebuilding it", RuntimeWarning, stacklevel=3)
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
            nparts = _parts(source, tc)
            r = (
                run_command(cmd, timeout)
                if nparts == 1
                else _build_in_parts(tc, flags, tmp_src, tmp_lib, nparts, timeout)
            )
            cmd = list(r.args)
        except subprocess.TimeoutExpired as e:
            _remove(tmp_lib)
            out = "".join(
                part for part in (e.output, e.stderr) if isinstance(part, str)
            )  # text mode
            raise CompileError(f"the C compiler timed out after {timeout:g} s", cmd, out) from None
        except OSError as e:
            raise CompileError(f"could not run the C compiler: {e}", cmd) from None
        finally:
            if os.path.exists(tmp_src):
                os.replace(tmp_src, os.path.join(root, f"mg_{key}.c"))
        seconds = time.perf_counter() - t0
        if r.returncode != 0 or not os.path.exists(tmp_lib):
            _remove(tmp_lib)
            raise CompileError(
                f"the C compiler failed (exit status {r.returncode})", cmd, r.stdout + r.stderr
            )
        try:
            # whatever the umask: nobody else may write what this user will load
            os.chmod(tmp_lib, stat.S_IMODE(os.stat(tmp_lib).st_mode) & ~0o022)
            _record_digest(tmp_lib, lib)
            os.replace(tmp_lib, lib)
        except OSError as e:
            _remove(tmp_lib)
            raise CompileError(
                f"could not store the compiled library in {root}: {e}", cmd
            ) from None
        return {"path": lib, "cached": False, "compile_seconds": seconds, "command": cmd}


# A library's digest is recorded beside it (``<entry>.sha256``) when it is built. A cached entry
# whose bytes no longer match is rebuilt (``build_library``), and a library with a recorded
# digest is loaded only when the very bytes read to be loaded match it (``load_verified``): a
# file damaged in place (zeros where a power loss left unwritten blocks, which no header check
# sees) would crash the process in ``dlopen``, and every later run with it. Both files reach the
# disk (fsync) before the library is renamed into place, so an entry is either whole and
# matching or rebuilt.


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _recorded_digest(lib: str) -> str | None:
    """The digest recorded beside ``lib``, or None: none, or not a regular file (a FIFO there
    must not block the compile, nor a directory break it)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(lib + ".sha256", flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 100).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _record_digest(tmp_lib: str, lib: str) -> None:
    """Flushes the built library ``tmp_lib`` to disk and records its digest for ``lib``."""
    with open(tmp_lib, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
        os.fsync(f.fileno())
    tmp, dst = tmp_lib + ".sha256", lib + ".sha256"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(digest + "\n")
            f.flush()
            os.fsync(f.fileno())
        if os.path.isdir(dst) and not os.path.islink(dst):
            os.rmdir(dst)  # not ours to write over; an empty one is removed, else the error says
        os.replace(tmp, dst)
    except OSError:
        _remove(tmp)
        raise


def _parts(source: str, tc: Toolchain) -> int:
    """How many files to compile ``source`` as, in parallel: generated training code can be
    split (``MG_PART``, see emit.c) and gcc and clang link the parts; one part per core, at
    least two nest functions each, at most four parts."""
    if "#ifdef MG_PART" not in source or tc.name.startswith("tcc") or "tcc" in tc.version.lower():
        return 1
    kernels = source.count("\nMG_KFN void mg_k") // 2  # each has a definition and a prototype
    return max(1, min(os.cpu_count() or 1, 4, kernels // 2))


def _build_in_parts(
    tc: Toolchain, flags: Sequence[str], src: str, lib: str, nparts: int, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Compile ``src`` as ``nparts`` objects at once, then link them into ``lib``; returns the
    first failing command's result, or the link's (whose ``args`` list every command run)."""
    objs = [f"{lib}.{p}.o" for p in range(nparts)]
    cmds = [
        tc.command
        + list(flags)
        + ["-fPIC", f"-DMG_PART={p}", f"-DMG_NPARTS={nparts}", "-c", "-o", o, src]
        for p, o in enumerate(objs)
    ]
    deadline = time.monotonic() + timeout
    try:
        results = run_commands(cmds, timeout)  # Ctrl-C or a timeout kills every part's compiler
        for r in results:
            if r.returncode != 0:
                return r
        link = tc.command + list(flags) + ["-fPIC", "-shared", "-o", lib, *objs, "-lm"]
        r = run_command(link, max(1.0, deadline - time.monotonic()))
        every = [" ".join(c) for c in cmds] + [" ".join(link)]
        return subprocess.CompletedProcess(every, r.returncode, r.stdout, r.stderr)
    finally:
        for o in objs:
            _remove(o)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# ---- loading --------------------------------------------------------------------------------

_loaded: dict[str, ctypes.CDLL] = {}  # sha256 of a library's bytes -> that library, loaded
_loads = itertools.count()


def _read_trusted(path: str) -> bytes:
    """The bytes of the library at ``path``, read through descriptors of the directory and the
    file that were checked (so nothing can be swapped between check and read)."""
    d, name = os.path.split(os.path.abspath(path))
    try:
        dfd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise LibraryLoadError(f"{path}: cannot open its directory: {e.strerror or e}") from None
    try:
        why = _untrusted(os.fstat(dfd), f"the directory {d}")
        if why:
            raise LibraryLoadError(f"{path}: not loaded: {why}")
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        try:
            if os.open in os.supports_dir_fd:
                fd = os.open(name, flags, dir_fd=dfd)
            else:
                fd = os.open(path, flags)
        except OSError as e:
            raise LibraryLoadError(f"{path}: cannot open: {e.strerror or e}") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LibraryLoadError(f"{path}: not a regular file")
        why = _untrusted(st, f"the library {path}")
        if why:
            raise LibraryLoadError(f"{path}: not loaded: {why}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _cut_short(data: bytes) -> str | None:
    """Why the ELF file ``data`` is cut short, or None (whole, or not ELF: the loader judges it).

    A library whose headers or loaded segments reach past its end (a copy interrupted, a disk
    that filled) maps without complaint and then kills the process with ``SIGBUS`` when the
    missing pages are touched, so it is refused before ``dlopen``."""
    if data[:4] != b"\x7fELF":
        return None
    size = len(data)
    if size < 52 or data[4] not in (1, 2) or data[5] not in (1, 2):
        return "an ELF header cut short"
    e = "<" if data[5] == 1 else ">"
    wide = data[4] == 2  # 64-bit
    if wide and size < 64:
        return "an ELF header cut short"
    if wide:
        phoff, shoff = struct.unpack_from(e + "QQ", data, 0x20)
        phsize, phnum, shsize, shnum = struct.unpack_from(e + "HHHH", data, 0x36)
    else:
        phoff, shoff = struct.unpack_from(e + "II", data, 0x1C)
        phsize, phnum, shsize, shnum = struct.unpack_from(e + "HHHH", data, 0x2A)
    if phnum and phsize < (56 if wide else 32):
        return "its ELF program headers are too small"
    if phoff + phnum * phsize > size or (shoff and shoff + shnum * shsize > size):
        return f"its ELF headers reach past its {size} bytes"
    for i in range(phnum):
        at = phoff + i * phsize
        if wide:
            kind, _, offset, _, _, filesz = struct.unpack_from(e + "IIQQQQ", data, at)
        else:
            kind, offset, _, _, filesz = struct.unpack_from(e + "IIIII", data, at)
        if kind == 1 and offset + filesz > size:  # PT_LOAD
            return f"a segment of it reaches past its {size} bytes"
    return None


def _dlopen_copy(data: bytes, path: str, digest: str) -> ctypes.CDLL:
    """Loads ``data`` from a private copy under a name never used before in this process."""
    errors = []
    for where in (os.path.dirname(os.path.abspath(path)), tempfile.gettempdir()):
        try:
            d = tempfile.mkdtemp(prefix=".mg-load-", dir=where)  # 0700, ours
        except OSError as e:
            errors.append(f"{where}: {e.strerror or e}")
            continue
        copy = os.path.join(d, f"mg_{digest[:16]}_{os.getpid()}_{next(_loads)}.so")
        try:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return ctypes.CDLL(copy)  # the mapping outlives the file, removed below
        except OSError as e:
            errors.append(str(e))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    raise LibraryLoadError(f"{path}: does not load: {'; '.join(errors)}")


def load_verified(path: str) -> ctypes.CDLL:
    """Load the shared library at ``path`` if this user alone can have written it.

    The directory and the file must be owned by the current user and not writable by group or
    others, and the file must be a regular file (not a symbolic link) and not cut short (its ELF
    headers and segments within it); otherwise, or when the library does not load, raises
    :class:`LibraryLoadError` and runs none of its code. The bytes checked are loaded from a
    private copy under a name no earlier load in this process used, so a library rebuilt at the
    same path is loaded anew (``dlopen`` would return the old one); a library identical to one
    already loaded is that one. Where a digest is recorded beside the file (``<path>.sha256``:
    a cache entry), those bytes must also have it: an entry must be what was built there.
    """
    data = _read_trusted(path)
    digest = _recorded_digest(path)
    why = _cut_short(data)
    if why:
        raise LibraryLoadError(f"{path}: not loaded: {why} (a truncated file)")
    actual = hashlib.sha256(data).hexdigest()
    if digest is not None and actual != digest:
        raise LibraryLoadError(
            f"{path}: not loaded: it is not what was built there (its bytes do not match the "
            f"digest recorded with it)"
        )
    lib = _loaded.get(actual)
    if lib is None:
        lib = _loaded[actual] = _dlopen_copy(data, path, actual)
    return lib


class CompiledProgram(ctypes.Structure):
    """libmg's ``mg_compiled``: what generated training code exports as ``<prefix>program``."""

    _fields_ = [
        ("abi", ctypes.c_uint),
        ("real_bytes", ctypes.c_uint),
        ("fingerprint", ctypes.c_ulonglong),
        ("nnests", ctypes.c_size_t),
        ("kernels", ctypes.c_void_p),
        ("step_probe", ctypes.c_void_p),
    ]


#: What a compiled training program exports (after the prefix). A library lacking one is refused.
SYMBOLS = ("program", "emitter_version")


def load_library(path: str, tape: Any, prefix: str, *, float32: bool | None = None) -> ctypes.CDLL:
    """Load a compiled library (see :func:`load_verified`) and check that it is the tape's.

    Every symbol of :data:`SYMBOLS` must exist, the program must have been emitted for ``tape``
    (its fingerprint) by this emitter version, and, when ``float32`` is given, for that storage
    type. Raises :class:`LibraryLoadError` (an :class:`OSError`) otherwise, never a bare
    ``ValueError`` or ``AttributeError``; libmg checks the fingerprint again when it attaches.
    """
    lib = load_verified(path)
    try:
        version = ctypes.c_int.in_dll(lib, prefix + "emitter_version").value
        program = CompiledProgram.in_dll(lib, prefix + "program")
    except ValueError as e:  # a missing symbol
        raise LibraryLoadError(
            f"{path}: lacks {prefix}program or {prefix}emitter_version: not a library "
            f"generated by this micrograd_c ({e})"
        ) from None
    if version != _core.EMITTER_VERSION:
        raise LibraryLoadError(
            f"{path}: built by emitter version {version}, this is {_core.EMITTER_VERSION}"
        )
    if program.fingerprint != tape.fingerprint:
        raise LibraryLoadError(f"{path}: generated for another program")
    if float32 is not None and program.real_bytes != (4 if float32 else 8):
        raise LibraryLoadError(f"{path}: built for another storage type")
    return lib
