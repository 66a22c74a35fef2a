"""The C toolchain: finding a working compiler, its version, the default flags, what
machine-dependent flags resolve to, and running the compiler under a time limit."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: Flags used when none are given: optimised, and no floating-point contraction, so compiled
#: results equal the interpreter's and the eager graph's. Code compiled on the machine that runs
#: it also gets the :data:`OPTIONAL_FLAGS` the compiler accepts (see :func:`default_flags`).
DEFAULT_FLAGS: list[str] = ["-O2", "-ffp-contract=off"]
#: Added to :data:`DEFAULT_FLAGS` where the compiler accepts them without a word:
#: ``-march=native`` (the machine's vector width), and gcc's ``-fvect-cost-model=cheap``. gcc's
#: -O2 vectorises only loops that need no run-time checks; the lanes of a nest's block that apply
#: an op's formula or derivative (``max``, ``relu``, pooling) with strided operands are not such
#: loops, and the cheaper model vectorises them: 1.2-1.7x on the CNN families. Each lane is still
#: its own IEEE computation in the scalar program's order, so results do not change. And gcc's
#: ``-fno-tree-fre``: full redundancy elimination, run five times at -O2, walks the memory of
#: every load in the unrolled nest bodies; it is 8% of gcc's instructions on the largest
#: generated sources (callgrind, cnn5s2: 5.68 -> 5.21 G), and PRE, which stays on, removes most
#: of the same redundancies later (the nest functions' code changes by under 1% in total; an A/B
#: of 30 interleaved rounds measured the GRU at batch 1 2-4% slower, the others within noise). An
#: optimisation pass never changes a strict-FP value, so results do not change either.
OPTIONAL_FLAGS: tuple[str, ...] = ("-march=native", "-fvect-cost-model=cheap", "-fno-tree-fre")
#: Added, all of them, where gcc reports every setting on the left for the flags above (``-Q
#: --help=target``, in the C locale): its tuning for CPUs that run 256-bit vectors as two 128-bit
#: halves (what ``-march=native`` means on AMD's Zen 1 and Bulldozer cores) splits every unaligned
#: 256-bit store into two 128-bit ones, and vectorises loops 128 bits wide. Generated code stores
#: whole vector blocks at any alignment (an MLP layer's weights as its forward steps them) and
#: vectorises its lanes' op formulas. Measured on a Zen 1 (``benchmarks/models.py``'s families,
#: one process alternating flags, the same bits): unsplit stores ran the MLP at batch 1 1.08x and
#: the GRU 1.05x; 256-bit loops then attention at batch 1 1.05x, the GRU 1.05x more, cnn48
#: 1.02-1.03x, none slower beyond noise. Unsplit loads as well ran the MLP at batch 1 0.89x; they
#: stay as gcc tunes them. A CPU that reports only one of the settings (gcc 12: Sandy Bridge and
#: Ivy Bridge split stores but vectorise 256 bits wide, Jaguar the reverse) runs whole vectors
#: otherwise, unmeasured here, and keeps gcc's tuning; so does every other CPU (Zen 2 and later,
#: Intel since Haswell: gcc reports neither).
TUNING_FLAGS: tuple[tuple[str, str], ...] = (
    ("-mavx256-split-unaligned-store [enabled]", "-mno-avx256-split-unaligned-store"),
    ("-mprefer-vector-width= 128", "-mprefer-vector-width=256"),
)
CANDIDATES = ("cc", "gcc", "clang", "tcc")


class CompileError(RuntimeError):
    """The C compiler failed, timed out or is missing. ``command`` and ``output`` say how."""

    def __init__(
        self, message: str, command: Sequence[str] | None = None, output: str = ""
    ) -> None:
        self.command = list(command) if command else []
        self.output = output
        detail = f"\ncommand: {shlex.join(self.command)}" if self.command else ""
        if output:
            tail = output if len(output) < 4000 else "...\n" + output[-4000:]
            detail += f"\ncompiler output:\n{tail}"
        super().__init__(message + detail)


# ---- running the compiler -------------------------------------------------------------------


def run_command(
    cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with its output captured (text), in a process group of its own (in ``env``,
    default this process's environment).

    A compiler is a tree of processes (driver, cc1, as, ld, or whatever a wrapper starts); when
    ``timeout`` seconds pass, or the caller is interrupted, the whole group is killed, not only
    the driver, and :class:`subprocess.TimeoutExpired` is raised (with the output so far).
    Raises :class:`OSError` when the command cannot be started.
    """
    posix = os.name == "posix"
    kw: dict[str, Any] = {"start_new_session": True} if posix else {}
    with subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        **kw,
    ) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p, posix)
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a child that left the group keeps the pipes open
                p.kill()
                out, err = "", ""
            raise subprocess.TimeoutExpired(list(cmd), timeout, output=out, stderr=err) from None
        except BaseException:
            _kill_group(p, posix)
            raise
    return subprocess.CompletedProcess(list(cmd), p.returncode, out, err)


def run_commands(
    cmds: Sequence[Sequence[str]], timeout: float
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``cmds`` at once, each as :func:`run_command` does (output captured, a process group
    of its own), and wait for all of them. When ``timeout`` seconds pass, or the caller is
    interrupted (Ctrl-C), every group still running is killed; :class:`subprocess.TimeoutExpired`
    is raised on timeout. Raises :class:`OSError` when a command cannot be started."""
    posix = os.name == "posix"
    kw: dict[str, Any] = {"start_new_session": True} if posix else {}
    procs: list[tuple[subprocess.Popen[str], Any]] = []
    deadline = time.monotonic() + timeout
    try:
        with _interrupts_deferred():  # a Ctrl-C between a start and its record would orphan it
            for cmd in cmds:
                out = tempfile.TemporaryFile("w+", errors="replace")  # no pipes: nothing to drain
                try:
                    p = subprocess.Popen(
                        list(cmd), stdout=out, stderr=subprocess.STDOUT, text=True, **kw
                    )
                except BaseException:
                    out.close()
                    raise
                procs.append((p, out))
        for p, _ in procs:
            try:
                _wait_until(p, deadline)
            except subprocess.TimeoutExpired:
                raise subprocess.TimeoutExpired(p.args, timeout) from None
        results = []
        for (p, out), cmd in zip(procs, cmds):
            out.seek(0)
            results.append(subprocess.CompletedProcess(list(cmd), p.returncode, out.read(), ""))
        return results
    finally:
        for p, out in procs:
            if p.poll() is None:
                _kill_group(p, posix)
                p.wait()
            out.close()


def _wait_until(p: subprocess.Popen[str], deadline: float) -> None:
    """Wait for ``p`` to exit, until ``time.monotonic()`` reaches ``deadline`` (then
    :class:`subprocess.TimeoutExpired`). Where the OS has process descriptors (Linux), the wait
    wakes when ``p`` exits: ``Popen.wait`` with a timeout polls, sleeping up to 50 ms between
    looks, which added 25 ms on average to every compile of generated code. Each look still ends
    within 50 ms: a KeyboardInterrupt that Python has pending but no signal woke the wait for
    (``_thread.interrupt_main``, or SIGINT delivered to another thread) is raised that soon."""
    fd = -1
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):  # an old kernel, or already reaped
            fd = os.pidfd_open(p.pid)
    if fd < 0:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
        return
    try:
        poller = select.poll()  # not select.select: a process may hold descriptors past 1023
        poller.register(fd, select.POLLIN)
        while p.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(p.args, 0)
            poller.poll(min(50, max(1, math.ceil(left * 1000))))
    finally:
        os.close(fd)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Within the block, SIGINT (Ctrl-C) is recorded, not raised; on leaving it, the previous
    handler runs for it (KeyboardInterrupt by default). Only the main thread handles signals:
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, Any]] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: pending.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if pending:
        if callable(old):
            old(*pending[0])
        elif old != signal.SIG_IGN:
            raise KeyboardInterrupt


def _kill_group(p: subprocess.Popen[str], posix: bool) -> None:
    """SIGKILL to the group led by ``p`` (not yet waited for, so its id cannot be reused)."""
    try:
        if posix:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            p.kill()
    except OSError:  # already gone
        pass


# ---- toolchain ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    """A working C compiler: its command (``$CC`` may carry arguments), path and version."""

    command: list[str]
    path: str
    version: str

    @property
    def name(self) -> str:
        """Short name of the compiler as invoked (``cc``, ``gcc``, ``clang``, ``tcc``, ...)."""
        return os.path.basename(self.command[0])


_toolchains: dict[str, Toolchain | None] = {}
# Seconds a probe may take (each command; a version query, each of its two forms).
_PROBE_TIMEOUT = 60.0
_VERSION_TIMEOUT = 30.0


def _version_of(cmd: list[str], flags: Sequence[str] = ("--version", "-v")) -> str:
    for flag in flags:
        try:
            r = run_command(cmd + [flag], timeout=_VERSION_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = _first_line(r)
        if text:
            return text
    return "unknown"


def _first_line(r: subprocess.CompletedProcess[str]) -> str:
    text = (r.stdout + r.stderr).strip()
    return text.splitlines()[0] if text else ""


# The probes' commands, each written once: the serial path below and Probes run the same.
def _link_probe(cmd: list[str], d: str) -> tuple[list[str], str]:
    """The command that builds a shared library from a one-line source in directory ``d``, and
    the library it makes."""
    src, out = os.path.join(d, "probe.c"), os.path.join(d, "probe.so")
    with open(src, "w") as f:
        f.write("#include <math.h>\ndouble mg_probe(double x) { return sqrt(x); }\n")
    return cmd + ["-shared", "-fPIC", "-o", out, src, "-lm"], out


def _flag_probe(command: list[str], flag: str, d: str, tag: str = "") -> list[str]:
    """The command that compiles a trivial source in directory ``d`` with ``flag`` (its object
    ``n<tag>.o``, so that several run at once)."""
    src = os.path.join(d, "n.c")
    if not os.path.exists(src):
        with open(src, "w") as f:
            f.write("int mg_native(void) { return 1; }\n")
    return command + [flag, "-c", "-o", os.path.join(d, f"n{tag}.o"), src]


def _flag_ok(r: subprocess.CompletedProcess[str]) -> bool:
    return r.returncode == 0 and not r.stderr.strip()


def _probe(cmd: list[str]) -> Toolchain | None:
    """The toolchain if `cmd` builds and links a shared library, else None."""
    key = "\0".join(cmd)
    if key in _toolchains:
        return _toolchains[key]
    path = shutil.which(cmd[0]) if cmd else None
    tc = None
    if path:
        with tempfile.TemporaryDirectory(prefix="micrograd_c-probe-") as d:
            argv, out = _link_probe(cmd, d)
            try:
                r = run_command(argv, timeout=_PROBE_TIMEOUT)
                if r.returncode == 0 and os.path.exists(out):
                    tc = Toolchain(cmd, os.path.realpath(path), _version_of(cmd))
            except (OSError, subprocess.TimeoutExpired):
                tc = None
    _toolchains[key] = tc
    return tc


def find_compiler(cc: str | None = None) -> Toolchain:
    """The C compiler to use: ``cc`` if given, else ``$CC``, else the first of cc, gcc, clang, tcc
    that builds a shared library. Raises :class:`CompileError` when none works."""
    explicit = cc or os.environ.get("CC")
    if explicit:
        try:
            cmd = shlex.split(explicit)
        except ValueError as e:  # an unbalanced quote
            raise CompileError(
                f"the C compiler {explicit!r} (from {'cc=' if cc else '$CC'}) is not a command "
                f"line: {e}"
            ) from None
        if not cmd:
            raise CompileError(f"the C compiler {'cc=' if cc else '$CC'} is an empty command")
        tc = _probe(cmd)
        if tc is None:
            raise CompileError(
                f"the C compiler {explicit!r} (from {'cc=' if cc else '$CC'}) does not work: "
                "it is missing or cannot build a shared library"
            )
        return tc
    for name in CANDIDATES:
        tc = _probe([name])
        if tc is not None:
            return tc
    raise CompileError(
        "no working C compiler found (tried cc, gcc, clang, tcc; set $CC); "
        "use backend='tape' to run without one"
    )


_accepted: dict[tuple[str, str], bool] = {}


def _accepts(tc: Toolchain, flag: str) -> bool:
    """Whether ``tc`` compiles a trivial file with ``flag`` and prints nothing (cached)."""
    if (tc.path, flag) not in _accepted:
        ok = False
        with tempfile.TemporaryDirectory(prefix="micrograd_c-probe-") as d:
            try:
                ok = _flag_ok(run_command(_flag_probe(tc.command, flag, d), timeout=_PROBE_TIMEOUT))
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _accepted[(tc.path, flag)] = ok
    return _accepted[(tc.path, flag)]


def default_flags(tc: Toolchain) -> list[str]:
    """:data:`DEFAULT_FLAGS` plus the :data:`OPTIONAL_FLAGS` that ``tc`` accepts, plus the
    :data:`TUNING_FLAGS` gcc's settings for this machine call for.

    Contraction stays off, so vectorised code computes the same values as the scalar program.
    """
    flags = DEFAULT_FLAGS + [f for f in OPTIONAL_FLAGS if _accepts(tc, f)]
    target = resolved_target(tc, flags)
    if target.startswith("gcc-target\n"):
        settings = set(target.splitlines())
        if all(setting in settings for setting, _ in TUNING_FLAGS):
            flags += [add for _, add in TUNING_FLAGS]
    return flags


# ---- what machine-dependent flags mean here -------------------------------------------------

_targets: dict[tuple[str, ...], str] = {}


def resolved_target(tc: Toolchain, flags: Sequence[str]) -> str:
    """What the machine-dependent flags among ``flags`` (``-march=native``, ``-mcpu=native``,
    ``-mtune=native``) resolve to on this machine, as text for the cache key; ``""`` when there
    are none.

    The same compiler, flags and source give different code on different CPUs under
    ``-march=native``, so a cache shared between machines (an NFS home, a container image) must
    not hand one machine's library (AVX-512, say) to another. In order of preference: the
    compiler's own answer (gcc: ``-Q --help=target``, the resolved ``-march=`` and every ``-m``
    option; clang: ``-###``, the target CPU and features), else the CPU's feature list
    (``/proc/cpuinfo``), else the processor's name. Computed once per process and toolchain.
    """
    if not any("native" in f for f in flags):
        return ""
    key = (tc.path, *tc.command, "\0", *flags)
    if key not in _targets:
        _targets[key] = _target_from(_gcc_target(tc, flags), tc, flags)
    return _targets[key]


def _target_from(gcc_text: str, tc: Toolchain, flags: Sequence[str]) -> str:
    """The target text given gcc's answer (``""``: none): else clang's, else the CPU's."""
    return gcc_text or _clang_target(tc, flags) or _cpu_features()


def _gcc_target_probe(command: list[str], flags: Sequence[str]) -> list[str]:
    return command + list(flags) + ["-Q", "--help=target"]


def _c_locale() -> dict[str, str]:
    # a translated gcc prints "[enabled]" in its own language
    return {**os.environ, "LC_ALL": "C"}


def _gcc_target_text(r: subprocess.CompletedProcess[str]) -> str:
    if r.returncode != 0 or ("-march=" not in r.stdout and "-mcpu=" not in r.stdout):
        return ""
    lines = (" ".join(line.split()) for line in r.stdout.splitlines())
    return "gcc-target\n" + "\n".join(line for line in lines if line.startswith("-"))


def _gcc_target(tc: Toolchain, flags: Sequence[str]) -> str:
    try:
        r = run_command(
            _gcc_target_probe(tc.command, flags), timeout=_PROBE_TIMEOUT, env=_c_locale()
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return _gcc_target_text(r)


def _clang_target(tc: Toolchain, flags: Sequence[str]) -> str:
    try:
        r = run_command(
            tc.command + list(flags) + ["-###", "-x", "c", "-c", os.devnull, "-o", os.devnull],
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    picked: list[str] = []
    for line in (r.stderr + r.stdout).splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        for i, w in enumerate(words[:-1]):
            if w in ("-target-cpu", "-tune-cpu", "-target-feature", "-triple"):
                picked.append(w + " " + words[i + 1])
    return "clang-target\n" + "\n".join(picked) if picked else ""


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        info = ""
    for field in ("flags", "Features", "isa"):  # x86, ARM, RISC-V
        for line in info.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == field:
                return f"cpu {field}: " + " ".join(sorted(value.split()))
    return "cpu: " + (platform.processor() or platform.machine())


# ---- the probes at once, in the background ----------------------------------------------------


class Probes:
    """The compiler runs that :func:`find_compiler` (and, with ``flags``, :func:`default_flags`
    and its target) make one after another for the compiler they would try first (``cc``, else
    ``$CC``, else the first of :data:`CANDIDATES` on the PATH), started at once without waiting
    (:meth:`start`); :meth:`finish` waits for them and records each result where those functions
    look first, so that they then run none of it; :meth:`finish` with ``cancel`` kills them and
    records nothing. :func:`compile` starts them before it freezes the graph, so that on a machine
    with a second CPU they run while it freezes: the first compile of a process ran 7 compiler
    processes one after another for 0.12 s before gcc could start on the source.

    They are the serial path's commands with its time limits (each from the start), and their
    results, a time limit passed included, are read as it reads them, so what is recorded is what
    it would record: a compiler that does not link (or whose link probe times out) is recorded as
    not working and no flag of it is; a version query that prints nothing or times out is asked
    again with ``-v``; the target, asked for with every optional flag where the compiler's flags
    are not known yet (the common case, gcc taking them all), is recorded only where it took them
    all, and is asked for with the flags it took where they are known. An object made before
    :meth:`start` is called can always be finished: every process is recorded as it starts
    (:meth:`start` kills those it started where it is interrupted), and :meth:`finish` removes the
    probes' directory whatever happened."""

    def __init__(self) -> None:
        self._running: list[tuple[str, Any, list[str], subprocess.Popen[str], Any, Any]] = []
        self._dir = ""
        self._cmd: list[str] = []
        self._key = self._rpath = self._lib = ""
        self._flags: list[str] = []  # the optional flags being probed
        self._target: tuple[str, ...] = ()  # the key the target is recorded under, or ()
        self._target_flags: list[str] = []
        self._t0 = 0.0

    def start(self, cc: str | None = None, flags: bool = True) -> None:
        """Start the probes that are not recorded yet (nothing where none is needed)."""
        explicit = cc or os.environ.get("CC")
        try:
            cmd = shlex.split(explicit) if explicit else []
        except ValueError:  # find_compiler reports it
            return
        if not explicit:
            cmd = next(([n] for n in CANDIDATES if shutil.which(n)), [])
        path = shutil.which(cmd[0]) if cmd else None
        if not path:
            return
        key, rpath = "\0".join(cmd), os.path.realpath(path)
        if key in _toolchains and _toolchains[key] is None:
            return  # not working: find_compiler says so without running anything
        todo = [f for f in OPTIONAL_FLAGS if (rpath, f) not in _accepted] if flags else []
        target_flags: list[str] = []
        tkey: tuple[str, ...] = ()
        want_target = False
        if flags:  # every optional flag where some are not known yet, else those it takes
            known = [] if todo else [f for f in OPTIONAL_FLAGS if _accepted[(rpath, f)]]
            target_flags = DEFAULT_FLAGS + (list(OPTIONAL_FLAGS) if todo else known)
            tkey = (rpath, *cmd, "\0", *target_flags)
            want_target = any("native" in f for f in target_flags) and tkey not in _targets
        if key in _toolchains and not todo and not want_target:
            return
        self._cmd, self._key, self._rpath, self._flags = cmd, key, rpath, todo
        self._target, self._target_flags = (tkey if want_target else ()), target_flags
        posix = os.name == "posix"
        kw: dict[str, Any] = {"start_new_session": True} if posix else {}
        try:
            with _interrupts_deferred():  # a Ctrl-C between a start and its record would orphan it
                self._dir = tempfile.mkdtemp(prefix="micrograd_c-probe-")
                jobs: list[tuple[str, Any, list[str], dict[str, str] | None]] = []
                if key not in _toolchains:
                    argv, self._lib = _link_probe(cmd, self._dir)
                    jobs += [
                        ("link", None, argv, None),
                        ("version", None, cmd + ["--version"], None),
                    ]
                for i, f in enumerate(todo):
                    jobs.append(("flag", f, _flag_probe(cmd, f, self._dir, str(i)), None))
                if want_target:
                    jobs.append(("target", None, _gcc_target_probe(cmd, target_flags), _c_locale()))
                self._t0 = time.monotonic()
                for kind, arg, argv, env in jobs:
                    out = tempfile.TemporaryFile("w+", errors="replace")
                    err = tempfile.TemporaryFile("w+", errors="replace")
                    try:
                        p = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env, **kw)
                    except BaseException:
                        out.close()
                        err.close()
                        raise
                    self._running.append((kind, arg, argv, p, out, err))
        except OSError:  # could not start them all: the serial path probes for itself
            self.finish(cancel=True)
        except BaseException:
            self.finish(cancel=True)
            raise

    def _result(
        self, kind: str, arg: Any, timeout: float
    ) -> subprocess.CompletedProcess[str] | None:
        """The finished run of a probe, or None where it passed its time limit (finish kills it)."""
        for k, a, argv, p, out, err in self._running:
            if (k, a) != (kind, arg):
                continue
            try:
                _wait_until(p, self._t0 + timeout)
            except subprocess.TimeoutExpired:
                return None
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read())
        raise KeyError(kind)

    def finish(self, cancel: bool = False) -> None:
        """Wait for the probes and record their results (``cancel``: kill them, record nothing);
        the probes' directory is removed either way. Raises only what interrupts the wait."""
        try:
            if cancel or not self._running:
                return
            cmd, key, rpath = self._cmd, self._key, self._rpath
            tc = _toolchains.get(key)
            if key not in _toolchains:
                link = self._result("link", None, _PROBE_TIMEOUT)
                tc = None
                if link is not None and link.returncode == 0 and os.path.exists(self._lib):
                    v = self._result("version", None, _VERSION_TIMEOUT)
                    version = (_first_line(v) if v is not None else "") or _version_of(cmd, ["-v"])
                    tc = Toolchain(cmd, rpath, version)
                _toolchains.setdefault(key, tc)
            if tc is None:
                return  # no flags of a compiler that does not work (as find_compiler probes)
            for f in self._flags:
                r = self._result("flag", f, _PROBE_TIMEOUT)
                _accepted.setdefault((rpath, f), r is not None and _flag_ok(r))
            flags = DEFAULT_FLAGS + [f for f in OPTIONAL_FLAGS if _accepted.get((rpath, f))]
            if self._target and flags == self._target_flags:
                r = self._result("target", None, _PROBE_TIMEOUT)
                text = _gcc_target_text(r) if r is not None else ""
                _targets.setdefault(self._target, _target_from(text, tc, flags))
        except OSError:
            pass  # recorded no more: the serial path probes for itself
        finally:
            posix = os.name == "posix"
            for _, _, _, p, out, err in self._running:
                if p.poll() is None:
                    _kill_group(p, posix)
                    p.wait()
                out.close()
                err.close()
            self._running.clear()
            if self._dir:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = ""
