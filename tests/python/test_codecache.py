"""The compiled-library cache against hostile and shared directories (issue #10, items 5-8).

Loading a shared library runs its constructors before any check, so a cache entry is loaded only
from a directory and a file that this user owns and nobody else can write; each build is loaded
under a name no earlier load used (a rebuilt entry is really reloaded); the key says what
``-march=native`` meant; a hanging compiler is killed with all its children.
"""

from __future__ import annotations

import hashlib
import os
import platform
import random
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c import compiler
from micrograd_c.compiler import codecache
from micrograd_c.nn import MLP

from conftest import CC, needs_cc

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and process groups")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROGRAD_C_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def program(backend: str = "c", **kw) -> tuple[MLP, mc.Program]:
    random.seed(0)
    model = MLP(3, [4, 2])
    x, y = mc.inputs(3), mc.inputs(1)
    out = model(x)
    loss = mc.cross_entropy(out, y[0])
    return model, mc.compile(
        loss, inputs=x, targets=y, params=model.parameters(), outputs=out, backend=backend, **kw
    )


def works(model: MLP, prog: mc.Program) -> bool:
    return bool(
        np.array_equal(prog.forward([0.1, 0.2, 0.3], [1]), [o.data for o in model([0.1, 0.2, 0.3])])
    )


def entry_path(cache) -> str:
    """Where this test's program is cached (its key does not depend on the directory)."""
    _, tape_prog = program("tape")
    key = codecache._cache_key(tape_prog.c_source(), CC, compiler.default_flags(CC))
    return os.path.join(str(cache), f"mg_{key}.so")


def build_shared(path: str, source: str) -> None:
    src = path + ".src.c"
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(
        CC.command + ["-shared", "-fPIC", "-o", path, src], check=True, capture_output=True
    )
    os.remove(src)


def planted(path: str, marker: str, extra: str = "") -> None:
    """A library whose constructor creates `marker`: planted code that runs when loaded."""
    build_shared(
        path,
        textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void planted(void) {{
            FILE *f = fopen("{marker}", "w");
            if (f) fclose(f);
        }}
        {extra}
    """),
    )


# ---- item 5: only private, owned entries are loaded -------------------------------------------


@needs_cc
@posix_only
def test_new_cache_directory_is_private(private_cache):
    model, prog = program()
    assert prog.backend == "c" and works(model, prog)
    assert stat.S_IMODE(os.stat(private_cache).st_mode) == 0o700
    lib = os.stat(prog.info["library"])
    assert lib.st_uid == os.geteuid() and not lib.st_mode & 0o022


@needs_cc
@posix_only
def test_shared_writable_cache_directory_is_not_trusted(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone can plant a library here, under a predictable name
    marker = tmp_path / "planted-code-ran"
    planted(entry_path(shared), str(marker))
    with pytest.warns(RuntimeWarning, match="not private"):
        model, prog = program(cache=str(shared))
    assert not marker.exists()
    assert prog.backend == "c" and works(model, prog)
    assert not prog.info["library"].startswith(str(shared))


@needs_cc
@posix_only
def test_cache_entry_writable_by_others_is_refused(private_cache, tmp_path):
    os.makedirs(private_cache, mode=0o700)
    marker = tmp_path / "planted-code-ran"
    path = entry_path(private_cache)
    planted(path, str(marker))
    os.chmod(path, 0o666)
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        model, prog = program()
    assert not marker.exists()
    assert prog.backend == "c" and works(model, prog)
    st = os.stat(prog.info["library"])
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022


@needs_cc
@posix_only
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_cache_entry_of_another_user_is_refused(private_cache, tmp_path):
    os.makedirs(private_cache, mode=0o700)
    marker = tmp_path / "planted-code-ran"
    path = entry_path(private_cache)
    planted(path, str(marker))
    os.chown(path, 65534, 65534)
    with pytest.warns(RuntimeWarning, match="owned by uid 65534"):
        model, prog = program()
    assert not marker.exists()
    assert prog.backend == "c" and works(model, prog)


@needs_cc
@posix_only
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_cache_directory_of_another_user_is_refused(private_cache, tmp_path):
    os.makedirs(private_cache, mode=0o700)
    marker = tmp_path / "planted-code-ran"
    planted(entry_path(private_cache), str(marker))
    os.chown(private_cache, 65534, 65534)
    with pytest.warns(RuntimeWarning, match="not private"):
        model, prog = program()
    assert not marker.exists()
    assert prog.backend == "c" and works(model, prog)
    assert not prog.info["library"].startswith(str(private_cache))


@needs_cc
def test_library_without_the_expected_symbols_is_rebuilt(private_cache):
    os.makedirs(private_cache, mode=0o700, exist_ok=True)
    build_shared(entry_path(private_cache), "int mg_unrelated = 1;\n")
    model, prog = program()
    assert prog.backend == "c" and prog.info["cached"] is False and works(model, prog)


@needs_cc
def test_load_library_raises_a_documented_error(tmp_path):
    os.chmod(tmp_path, 0o700)
    path = str(tmp_path / "lib.so")
    build_shared(path, "int mg_unrelated = 1;\n")
    _, prog = program("tape")
    assert issubclass(codecache.LibraryLoadError, OSError)
    with pytest.raises(codecache.LibraryLoadError, match="lacks"):
        codecache.load_library(path, prog.tape, "mgc_")
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really")
    with pytest.raises(codecache.LibraryLoadError):
        codecache.load_library(path, prog.tape, "mgc_")


@needs_cc
def test_auto_falls_back_when_no_build_loads(monkeypatch):
    def refuse(path):
        raise codecache.LibraryLoadError(f"{path}: refused for the test")

    monkeypatch.setattr(codecache, "load_verified", refuse)
    with warnings.catch_warnings():
        # a cached entry refused first: "...; rebuilding it"
        warnings.filterwarnings("ignore", ".*rebuilding it", RuntimeWarning)
        with pytest.raises(mc.CompileError, match="does not load"):
            program("c")
        with pytest.warns(RuntimeWarning, match="falling back"):
            model, prog = program("auto")
    assert prog.backend == "tape" and works(model, prog)


def compile_in_child(cache, tmp_path, after: str) -> Callable[..., list[str]]:
    """A child process that compiles :func:`program`'s model into ``cache`` (its warnings in
    ``caught``; ``ok``: it computes what the model does), then runs ``after``, which prints; the
    function returned runs it with arguments and returns the words printed. A child, so that a
    crash of the loader cannot take pytest down with it."""
    script = tmp_path / "child.py"
    head = f"""
        import os, random, sys, warnings
        import micrograd_c as mc
        from micrograd_c.nn import MLP
        random.seed(0)
        model = MLP(3, [4, 2])
        x, y = mc.inputs(3), mc.inputs(1)
        out = model(x)
        loss = mc.cross_entropy(out, y[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prog = mc.compile(loss, inputs=x, targets=y, params=model.parameters(),
                              outputs=out, backend="c", cache={str(cache)!r})
        ok = list(prog.forward([0.1, 0.2, 0.3], [1])) == [o.data for o in model([0.1, 0.2, 0.3])]
    """
    script.write_text(textwrap.dedent(head) + textwrap.dedent(after))

    def run(*args: str) -> list[str]:
        r = subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        return r.stdout.split()

    return run


@needs_cc
@posix_only
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_an_entry_cut_short_is_rebuilt_not_mapped(private_cache, tmp_path, keep):
    """A cache entry cut short with its ELF headers intact (an interrupted copy, a full disk)
    loads without complaint and kills the process with SIGBUS when its missing pages are touched:
    it is refused before dlopen (even where no digest was recorded) and rebuilt, in this process
    and every later one (found by review)."""
    run = compile_in_child(
        private_cache,
        tmp_path,
        f"""
        lib = prog.info["library"]
        size = os.path.getsize(lib)
        if sys.argv[1:] == ["cut"]:
            os.truncate(lib, int(size * {keep}))
            os.remove(lib + ".sha256")  # the header check alone
        print(prog.info["cached"], ok, size)
        """,
    )
    first = run("cut")  # built, then cut short behind its back
    assert first[:2] == ["False", "True"]
    lib = next(p for p in private_cache.iterdir() if p.suffix == ".so")
    assert lib.stat().st_size < int(first[2])
    why = codecache._cut_short(lib.read_bytes())
    assert why and "past its" in why
    with pytest.raises(codecache.LibraryLoadError, match="truncated"):
        codecache.load_verified(str(lib))
    second = run()  # refused, rebuilt, loaded
    assert second == ["False", "True", first[2]]
    assert run() == ["True", "True", first[2]]
    assert codecache._cut_short(lib.read_bytes()) is None


@needs_cc
@posix_only
@pytest.mark.parametrize("start", [1000, 4000])
def test_an_entry_damaged_in_place_is_rebuilt_not_loaded(private_cache, tmp_path, start):
    """An entry of full length whose bytes from `start` on are zeros (what a power loss can leave
    of blocks never written) passes every header check and crashed dlopen, in this run and every
    later one (found by review): its bytes no longer match the digest recorded when it was
    built, so it is rebuilt, with a warning. An entry without a digest is rebuilt silently."""
    run = compile_in_child(
        private_cache,
        tmp_path,
        """
        print(prog.info["cached"], ok, len([w for w in caught if "digest" in str(w.message)]))
        """,
    )
    assert run() == ["False", "True", "0"]
    lib = next(p for p in private_cache.iterdir() if p.suffix == ".so")
    data = lib.read_bytes()
    lib.write_bytes(data[:start] + bytes(len(data) - start))
    assert codecache._cut_short(lib.read_bytes()) is None  # no header check sees it
    assert run() == ["False", "True", "1"]
    rebuilt = lib.read_bytes()  # rebuilt (not byte for byte the first: a temporary's name)
    assert any(rebuilt[start:])
    assert codecache._recorded_digest(str(lib)) == hashlib.sha256(rebuilt).hexdigest()
    assert run() == ["True", "True", "0"]
    os.remove(str(lib) + ".sha256")  # an entry without its digest: rebuilt, quietly
    assert run() == ["False", "True", "0"]


@needs_cc
@posix_only
def test_the_public_api_never_loads_an_entry_damaged_in_place(tmp_path):
    """build_library and load_verified are public: a caller who loads a cached entry gets the
    digest recorded beside it checked on the bytes loaded (found by review: the check lived only
    in compile(), and this crashed the process)."""
    code = f"""
        import warnings
        from micrograd_c import compiler
        from micrograd_c.compiler import codecache
        tc = compiler.find_compiler()
        fl = compiler.default_flags(tc)
        src, cache = "int mg_answer(void) {{ return 7; }}\\n", {str(tmp_path / "c")!r}
        p = compiler.build_library(src, tc, fl, cache=cache)["path"]
        d = open(p, "rb").read()
        open(p, "wb").write(d[:1000] + bytes(len(d) - 1000))  # zeros, same length
        try:
            codecache.load_verified(p)
        except codecache.LibraryLoadError as e:
            print("refused", "digest" in str(e))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            b = compiler.build_library(src, tc, fl, cache=cache)
        print(b["cached"], len(caught), codecache.load_verified(b["path"]).mg_answer())
    """
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["refused", "True", "False", "1", "7"]


@needs_cc
@posix_only
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_digest_path_that_is_not_a_file_neither_blocks_nor_breaks_the_entry(tmp_path, kind):
    """A FIFO where the digest belongs blocked compile() forever under the entry's lock, and a
    directory there made every build of the entry fail, each leaving a temporary file (review)."""
    tc = compiler.find_compiler()
    fl = compiler.default_flags(tc)
    cache = tmp_path / "cache"
    src = "int mg_answer(void) { return 7; }\n"
    lib = compiler.build_library(src, tc, fl, cache=str(cache))["path"]
    os.remove(lib + ".sha256")
    if kind == "fifo":
        os.mkfifo(lib + ".sha256")
    else:
        os.mkdir(lib + ".sha256")
    before = set(os.listdir(cache))
    built = compiler.build_library(src, tc, fl, cache=str(cache))  # rebuilt, as without one
    assert not built["cached"] and os.path.isfile(lib + ".sha256")
    assert set(os.listdir(cache)) == before  # the same names: no temporary left behind
    assert codecache.load_verified(built["path"]).mg_answer() == 7
    assert compiler.build_library(src, tc, fl, cache=str(cache))["cached"]


def test_cut_short_reads_only_elf_and_checks_every_extent():
    assert codecache._cut_short(b"not an ELF file at all") is None
    assert codecache._cut_short(b"\x7fELF") == "an ELF header cut short"
    with open(sys.executable, "rb") as f:
        exe = f.read()
    if exe[:4] == b"\x7fELF":
        assert codecache._cut_short(exe) is None
        assert codecache._cut_short(exe[: len(exe) // 2]) is not None
        assert codecache._cut_short(exe[:200]) is not None


@posix_only
def test_a_lock_path_that_cannot_be_opened_is_a_compile_error(tmp_path):
    """Something other than a lock file at an entry's lock path (a directory) is a CompileError,
    which backend="auto" turns into the tape, not a bare OSError (found by review)."""
    (tmp_path / "x.so.lock").mkdir()
    with pytest.raises(mc.CompileError, match="could not lock the cache entry"):
        with codecache._locked(str(tmp_path / "x.so.lock")):
            pass


# ---- item 7: a rebuilt entry is loaded again -------------------------------------------------


@needs_cc
def test_rebuilt_entry_is_reloaded_in_the_same_process(private_cache):
    # a stale entry with the right symbols but another layout: the first load refuses it, the
    # entry is rebuilt at the same path, and the rebuilt library must be what the second load gets
    _, tape_prog = program("tape")
    source = tape_prog.c_source()
    fp = f"0x{tape_prog.tape.fingerprint:016x}ULL"
    assert fp in source
    os.makedirs(private_cache, mode=0o700, exist_ok=True)
    # an entry generated for another program (another fingerprint) where this one's belongs
    build_shared(
        entry_path(private_cache), source.replace(fp, f"0x{tape_prog.tape.fingerprint ^ 1:016x}ULL")
    )
    model, prog = program()
    assert prog.backend == "c" and prog.info["cached"] is False and works(model, prog)
    # and again, after the entry changes under a process that loaded it
    os.remove(prog.info["library"])
    model, prog2 = program()
    assert prog2.info["cached"] is False and works(model, prog2)


@needs_cc
def test_each_build_at_one_path_loads_as_itself(tmp_path):
    os.chmod(tmp_path, 0o700)
    path = str(tmp_path / "lib.so")
    values = []
    for v in (1, 2, 3):
        tmp = str(tmp_path / f"new{v}.so")
        build_shared(tmp, f"int mg_answer(void) {{ return {v}; }}\n")
        os.replace(tmp, path)  # as a rebuild does
        values.append(codecache.load_verified(path).mg_answer())
    assert values == [1, 2, 3]
    assert codecache.load_verified(path).mg_answer() == 3  # unchanged file: the same library


# ---- item 6: the key says what -march=native means -------------------------------------------


def fake_cpu_compiler(tmp_path) -> str:
    """A compiler that reports another CPU for -march=native, as the same compiler on another
    machine would (the real one does the compiling)."""
    path = tmp_path / "fakecc"
    path.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
            case "$a" in
            --help=target)
                printf '  -march=  \\t\\t%s\\n  -mavx512f  \\t\\t[%s]\\n' "$FAKE_CPU" "$FAKE_AVX512"
                exit 0;;
            esac
        done
        exec {CC.path} "$@"
    """)
    )
    path.chmod(0o755)
    return str(path)


@needs_cc
@posix_only
def test_cache_key_depends_on_what_march_native_resolves_to(tmp_path):
    cc = fake_cpu_compiler(tmp_path)
    code = (
        "from micrograd_c import compiler\n"
        "tc = compiler.find_compiler()\n"
        "fl = compiler.default_flags(tc)\n"
        "print('-march=native' in fl, compiler.codecache._cache_key('int x;', tc, fl))\n"
    )
    keys = []
    for cpu, avx in (("znver3", "disabled"), ("sapphirerapids", "enabled"), ("znver3", "disabled")):
        env = dict(os.environ, CC=cc, FAKE_CPU=cpu, FAKE_AVX512=avx)
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert r.returncode == 0, r.stderr
        native, key = r.stdout.split()
        assert native == "True"
        keys.append(key)
    assert keys[0] != keys[1] and keys[0] == keys[2]


@needs_cc
def test_resolved_target_describes_this_machine():
    flags = compiler.default_flags(CC)
    if "-march=native" in flags:
        assert compiler.toolchain.resolved_target(CC, flags).strip()
    assert compiler.toolchain.resolved_target(CC, ["-O2", "-ffp-contract=off"]) == ""


@needs_cc
@posix_only
@pytest.mark.parametrize("answer", ["refuses", "warns", "takes"])
def test_default_flags_add_an_optional_flag_only_where_the_compiler_takes_it(tmp_path, answer):
    """clang refuses gcc's -fvect-cost-model; a compiler that only warns about a flag does not get
    it either; one that takes it silently does."""
    flag = "-fvect-cost-model=cheap"
    cc = tmp_path / f"cc-that-{answer}"
    real = " ".join(CC.command)
    cc.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        f'  if [ "$a" = "{flag}" ]; then\n'
        + {
            "refuses": "    echo 'error: unknown argument' >&2; exit 1\n",
            "warns": "    echo 'warning: argument unused' >&2\n",
            "takes": "    :\n",
        }[answer]
        + "  fi\n"
        "done\n"
        f'exec {real} "$@"\n'
    )
    cc.chmod(0o755)
    flags = compiler.default_flags(compiler.find_compiler(str(cc)))
    assert flags[: len(compiler.DEFAULT_FLAGS)] == compiler.DEFAULT_FLAGS
    tuning = {add for _, add in compiler.TUNING_FLAGS}
    assert set(flags[len(compiler.DEFAULT_FLAGS) :]) <= set(compiler.OPTIONAL_FLAGS) | tuning
    assert (flag in flags) == (answer == "takes")


def probes_at_once(cc: str, flags: bool = True, cancel: bool = False) -> None:
    """What compile() does around the freeze: the probes started, then finished (or cancelled)."""
    probes = compiler.toolchain.Probes()
    probes.start(cc, flags)
    probes.finish(cancel=cancel)


def logging_compiler(path, real: str, log) -> str:
    """A compiler at `path` that appends each command line it gets to `log`, then runs `real`."""
    path.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec {real} "$@"\n')
    path.chmod(0o755)
    return str(path)


@needs_cc
@posix_only
@pytest.mark.parametrize("answer", ["refuses", "warns", "takes"])
def test_probes_started_at_once_record_what_the_serial_probes_find(tmp_path, monkeypatch, answer):
    """compile() starts the compiler's probes (a link, its version, each optional flag, the
    target) at once before it freezes the graph; once they are done, find_compiler and
    default_flags give what their own probes, one after another, give for the same compiler, and
    run nothing more (but the target, where a flag it was asked with is refused). The temporary
    directory is gone."""
    flag = "-fvect-cost-model=cheap"
    answers = {
        "refuses": "    echo 'error: unknown argument' >&2; exit 1\n",
        "warns": "    echo 'warning: argument unused' >&2\n",
        "takes": "    :\n",
    }
    real = tmp_path / "real"
    real.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        f'  if [ "$a" = "{flag}" ]; then\n' + answers[answer] + "  fi\n"
        "done\n"
        f'exec {" ".join(CC.command)} "$@"\n'
    )
    real.chmod(0o755)
    serial_log, early_log = tmp_path / "serial.log", tmp_path / "early.log"
    serial = compiler.find_compiler(logging_compiler(tmp_path / "cc1", str(real), serial_log))
    serial_flags = compiler.default_flags(serial)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the probes' directory
    cc = logging_compiler(tmp_path / "cc2", str(real), early_log)
    probes_at_once(cc)
    assert list((tmp_path / "tmp").iterdir()) == []
    ran = early_log.read_text().splitlines()
    early = compiler.find_compiler(cc)
    early_flags = compiler.default_flags(early)
    more = early_log.read_text().splitlines()[len(ran) :]
    if answer == "takes":
        assert more == []  # nothing more ran
        assert len(ran) == len(serial_log.read_text().splitlines())  # the same probes, at once
    else:  # the target was asked for with every optional flag: again, with those it takes
        assert len(more) == 1 and more[0].endswith("-Q --help=target"), more
    assert (early.version, early_flags) == (serial.version, serial_flags)
    assert (flag in early_flags) == (answer == "takes")
    target = compiler.toolchain.resolved_target
    assert target(early, early_flags) == target(serial, serial_flags)


@needs_cc
@posix_only
def test_probes_cancelled_or_failed_record_nothing(tmp_path):
    """Probes cancelled (the freeze raised) are killed and record nothing, so the serial path
    probes for itself; a compiler that cannot link is reported by find_compiler as before."""
    log = tmp_path / "log"
    cc = logging_compiler(tmp_path / "cc", " ".join(CC.command), log)
    probes_at_once(cc, cancel=True)
    started = len(log.read_text().splitlines()) if log.exists() else 0
    tc = compiler.find_compiler(cc)
    assert tc.path == os.path.realpath(cc) and len(log.read_text().splitlines()) > started
    bad = tmp_path / "badcc"
    bad.write_text("#!/bin/sh\nexit 1\n")
    bad.chmod(0o755)
    probes_at_once(str(bad))
    with pytest.raises(mc.CompileError, match="cannot build a shared library"):
        compiler.find_compiler(str(bad))


@needs_cc
@posix_only
def test_probes_of_a_compiler_that_cannot_link_record_no_flags(tmp_path):
    """A command that does not link (the same compiler with an argument that breaks linking) is
    recorded as not working, and none of its flag probes (which would be keyed by the same
    compiler's path) is: the compiler without that argument then gets its usual flags."""
    cc = tmp_path / "cc"
    cc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--nolink" ]; then shift; for a in "$@"; do\n'
        '  [ "$a" = "-shared" ] && exit 1; done; echo "warning: --nolink" >&2; fi\n'
        f'exec {" ".join(CC.command)} "$@"\n'
    )
    cc.chmod(0o755)
    probes_at_once(f"{cc} --nolink")
    with pytest.raises(mc.CompileError, match="cannot build a shared library"):
        compiler.find_compiler(f"{cc} --nolink")
    assert compiler.default_flags(compiler.find_compiler(str(cc))) == compiler.default_flags(CC)


@needs_cc
@posix_only
def test_probes_pass_their_time_limit_as_the_serial_ones_do(tmp_path, monkeypatch):
    """A link probe that hangs is killed at the serial path's time limit and recorded as not
    working (find_compiler then fails at once, as after its own probe); a version query that
    hangs is asked again with -v. Nothing is left running and the directory is gone."""
    monkeypatch.setattr(compiler.toolchain, "_PROBE_TIMEOUT", 1.0)
    monkeypatch.setattr(compiler.toolchain, "_VERSION_TIMEOUT", 1.0)
    log = tmp_path / "log"
    hang = tmp_path / "hangcc"
    hang.write_text(
        f'#!/bin/sh\necho "$*" >> "{log}"\n'
        'for a in "$@"; do [ "$a" = "-shared" ] && exec sleep 30; done\n'
        f'exec {" ".join(CC.command)} "$@"\n'
    )
    hang.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    t0 = time.monotonic()
    probes_at_once(str(hang))
    assert time.monotonic() - t0 < 25  # not the 30 s the link would hang for
    links = [line for line in log.read_text().splitlines() if "-shared" in line]
    with pytest.raises(mc.CompileError, match="cannot build a shared library"):
        compiler.find_compiler(str(hang))
    assert [line for line in log.read_text().splitlines() if "-shared" in line] == links
    assert list((tmp_path / "tmp").iterdir()) == []
    ver = tmp_path / "vercc"  # --version hangs, -v answers
    ver.write_text(
        '#!/bin/sh\n[ "$1" = "--version" ] && exec sleep 30\n'
        '[ "$1" = "-v" ] && { echo "vercc 1.0"; exit 0; }\n'
        f'exec {" ".join(CC.command)} "$@"\n'
    )
    ver.chmod(0o755)
    probes_at_once(str(ver), flags=False)
    assert compiler.find_compiler(str(ver)).version == "vercc 1.0"


@needs_cc
@posix_only
def test_probes_interrupted_while_starting_leave_nothing_running(tmp_path, monkeypatch):
    """A KeyboardInterrupt while the probes start (here: the third one's start) kills the ones
    already running and removes their directory; probes already recorded are not started again
    (a compiler whose every flag and target is known starts nothing)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    real_popen, started = subprocess.Popen, []

    def popen(*a: object, **kw: object) -> subprocess.Popen[str]:
        if len(started) == 2:
            raise KeyboardInterrupt
        p = real_popen(*a, **kw)  # type: ignore[call-overload]
        started.append(p)
        return p

    monkeypatch.setattr(subprocess, "Popen", popen)
    cc = logging_compiler(tmp_path / "cc", " ".join(CC.command), tmp_path / "log")
    probes = compiler.toolchain.Probes()
    with pytest.raises(KeyboardInterrupt):
        probes.start(cc)
    assert len(started) == 2 and all(p.poll() is not None for p in started)
    assert list((tmp_path / "tmp").iterdir()) == []
    monkeypatch.setattr(subprocess, "Popen", real_popen)
    compiler.default_flags(compiler.find_compiler(cc))
    again = compiler.toolchain.Probes()
    again.start(cc)
    assert again._running == [] and list((tmp_path / "tmp").iterdir()) == []


TUNED_CPUS = {  # what gcc 12 reports for -march=native on them: the store split, the loop width
    "znver1": ("enabled", "128"),
    "sandybridge": ("enabled", "none"),
    "znver3": ("disabled", "none"),
}


@needs_cc
@posix_only
@pytest.mark.parametrize("cpu", list(TUNED_CPUS))
def test_default_flags_undo_the_tuning_for_cpus_that_split_256_bit_vectors(tmp_path, cpu):
    """Where gcc reports that its tuning for -march=native splits unaligned 256-bit stores and
    vectorises loops 128 bits wide (a Zen 1), the defaults ask for whole stores and 256-bit loops;
    where it reports one of the two (a Sandy Bridge) or neither (a Zen 3), they add nothing. The
    cache key follows the flags."""
    store, width = TUNED_CPUS[cpu]
    path = tmp_path / "tunedcc"
    real = " ".join(CC.command)
    path.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
            case "$a" in
            --help=target)
                printf '  -march=  \\t\\t{cpu}\\n'
                printf '  -mavx256-split-unaligned-store \\t[{store}]\\n'
                printf '  -mprefer-vector-width=  \\t\\t{width}\\n'
                exit 0;;
            esac
        done
        exec {real} "$@"
    """)
    )
    path.chmod(0o755)
    tc = compiler.find_compiler(str(path))
    flags = compiler.default_flags(tc)
    if "-march=native" not in flags:
        pytest.skip("the compiler takes no -march=native")
    added = [add for _, add in compiler.TUNING_FLAGS]
    assert [f for f in flags if f in added] == (added if cpu == "znver1" else [])
    untuned = [f for f in flags if f not in added]
    if cpu == "znver1":
        assert codecache._cache_key("int x;", tc, flags) != codecache._cache_key(
            "int x;", tc, untuned
        )
        if platform.machine() in ("x86_64", "AMD64") and "gcc" in os.path.basename(CC.path):
            # gcc takes them on any x86-64 CPU (this one's tuning need not be Zen 1's)
            built = compiler.build_library(
                "int mg_answer(void) { return 7; }\n", tc, flags, cache=str(tmp_path / "cache")
            )
            assert codecache.load_verified(built["path"]).mg_answer() == 7


# ---- item 8: hanging compilers and fallback directories --------------------------------------


def pid_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting for its parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


@needs_cc
@posix_only
def test_compiler_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    cc = tmp_path / "hangcc"
    cc.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do case "$a" in *.c) if grep -q mgc_program "$a"; then
            sleep 1000 &
            echo $! > {pidfile}
            wait
        fi;; esac; done
        exec {CC.path} "$@"
    """)
    )
    cc.chmod(0o755)
    with pytest.raises(mc.CompileError, match="timed out"):
        program("c", cc=str(cc), timeout=5.0)  # room for sh to write its pidfile
    pid = int(pidfile.read_text())
    try:
        deadline = time.monotonic() + 30  # not a time limit on the code: SIGKILL is asynchronous
        while not pid_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_gone(pid), "the compiler's child survived the timeout"
    finally:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


@posix_only
def test_ctrl_c_during_parallel_part_builds_kills_every_part(tmp_path):
    """The parts of a model compile at once (run_commands); Ctrl-C while they run kills every
    part's process group, grandchildren included, and the KeyboardInterrupt reaches the caller."""
    import _thread
    import threading

    from micrograd_c.compiler.toolchain import run_commands

    pidfiles = [tmp_path / f"part{i}.pid" for i in range(3)]
    cmds = [["sh", "-c", f"sleep 1000 & echo $! > {f}; wait"] for f in pidfiles]

    def interrupt_when_started() -> None:
        deadline = time.monotonic() + 30
        while not all(f.exists() and f.read_text().strip() for f in pidfiles):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        _thread.interrupt_main()  # what Ctrl-C does to the main thread

    t = threading.Thread(target=interrupt_when_started)
    started = time.monotonic()
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_commands(cmds, timeout=600)
        waited = time.monotonic()
    finally:
        t.join()
    # interrupt_main() sets Python's pending signal and wakes no system call: a wait that blocked
    # until the parts' deadline raised it only then, 600 s later (a liveness bound, not a timing)
    assert waited < started + 300, "Ctrl-C was raised only at the parts' deadline"
    pids = [int(f.read_text()) for f in pidfiles]
    try:
        deadline = time.monotonic() + 30  # SIGKILL is asynchronous
        while not all(pid_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(pid_gone(p) for p in pids), "a part's compiler survived Ctrl-C"
    finally:
        for p in pids:
            try:
                os.kill(p, 9)
            except OSError:
                pass


@posix_only
def test_parallel_part_builds_time_out_as_one(tmp_path):
    from micrograd_c.compiler.toolchain import run_commands

    pidfile = tmp_path / "slow.pid"
    cmds = [["true"], ["sh", "-c", f"sleep 1000 & echo $! > {pidfile}; wait"]]
    with pytest.raises(subprocess.TimeoutExpired):
        run_commands(cmds, timeout=10.0)  # room for sh to start and write its pidfile
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_gone(pid)
    ok = run_commands([["sh", "-c", "echo one"], ["sh", "-c", "echo two >&2; exit 3"]], 60)
    assert [(r.returncode, r.stdout) for r in ok] == [(0, "one\n"), (3, "two\n")]


@posix_only
def test_parallel_part_builds_wait_in_a_process_with_many_descriptors():
    """The parts' compilers are waited for on process descriptors (Linux): in a process that
    holds more than 1024 open files, whose new descriptors select() cannot watch, the wait still
    ends when they exit, and a timeout still fires."""
    import resource

    from micrograd_c.compiler.toolchain import run_commands

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 1200:
        pytest.skip(f"RLIMIT_NOFILE is {soft}: cannot open 1100 descriptors")
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        ok = run_commands([["sh", "-c", "echo one"], ["sh", "-c", "sleep 0.2; exit 3"]], 60)
        assert [(r.returncode, r.stdout) for r in ok] == [(0, "one\n"), (3, "")]
        with pytest.raises(subprocess.TimeoutExpired):
            run_commands([["sleep", "1000"]], timeout=0.5)
    finally:
        for fd in fds:
            os.close(fd)


@needs_cc
def test_fallback_cache_directory_is_removed_at_exit(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    script = textwrap.dedent(f"""
        import os, random, warnings
        import micrograd_c as mc
        from micrograd_c.nn import MLP
        random.seed(0)
        m = MLP(3, [2])
        x = mc.inputs(3)
        out = m(x)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            p = mc.compile(mc.vsum(out), inputs=x, params=m.parameters(), backend="c",
                           cache={str(blocker / "cache")!r})
        print(os.path.dirname(p.info["library"]))
    """)
    env = dict(os.environ, TMPDIR=str(tmp))
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    used = r.stdout.strip()
    assert used.startswith(str(tmp)) and os.path.basename(used).startswith("micrograd_c-cache-")
    assert not os.path.exists(used)
    assert [p for p in os.listdir(tmp) if p.startswith("micrograd_c-")] == []


@posix_only
def test_ctrl_c_right_after_a_part_starts_still_kills_it(monkeypatch):
    """Ctrl-C landing between a part's start and its record (the window the timing test above can
    hit on a loaded machine): the interrupt is held until every started part is recorded, so
    every part is killed and the KeyboardInterrupt still reaches the caller."""
    import _thread

    from micrograd_c.compiler import toolchain

    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        p = real_popen(*args, **kwargs)
        started.append(p)
        if len(started) == 2:
            _thread.interrupt_main()  # raised at the next bytecode, before Popen's caller runs
        return p

    monkeypatch.setattr(toolchain.subprocess, "Popen", popen)
    try:
        with pytest.raises(KeyboardInterrupt):
            toolchain.run_commands([["sleep", "1000"]] * 3, timeout=600)
        assert len(started) == 3
        assert all(p.returncode is not None for p in started), "a started part was left running"
        assert all(pid_gone(p.pid) for p in started)
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
