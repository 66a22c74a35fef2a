"""Files and directories the library and the application share: where the user's cache lives,
and replacing a file atomically."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


def user_cache_dir(env: str, *parts: str) -> str:
    """``$env`` when it is set and not empty, else ``parts`` under the user's cache directory.

    The user's cache directory is ``$XDG_CACHE_HOME`` (the XDG base directory specification),
    or ``~/.cache`` when that is unset or empty: ``user_cache_dir("MICROGRAD_C_CACHE_DIR",
    "micrograd_c")`` is ``~/.cache/micrograd_c`` by default.
    """
    override = os.environ.get(env)
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, *parts)


def publish(tmp: str, path: str) -> None:
    """Rename the finished file ``tmp`` to ``path`` with the permissions ``open()`` gives a new
    file (0666 less the umask; ``mkstemp`` creates 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


@contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file in the same directory, renamed into place when the
    block completes: ``path`` is either the old file or the complete new one, and the temporary
    file never outlives the block. ``mode`` is ``"wb"`` or ``"w"``. Raises :class:`OSError` when
    the file cannot be written."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        publish(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
