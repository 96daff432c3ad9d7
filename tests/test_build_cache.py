"""The build cache: hits, misses, invalidation, forced rebuilds, interrupted and concurrent builds,
and compiler errors traced back to the declaration."""
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import opkit
from opkit.builder import build, clean, toolchain
from opkit.errors import BuildError
from opkit.registry import make_op

from conftest import write_op

TWICE = textwrap.dedent("""\
    name: twice
    summary: y = 2 x
    inputs:
      x: {dtypes: [float64]}
    outputs:
      y: {like: x}
    forward:
      y: x * 2
    """)


def entries(cache: Path):
    return sorted(p.name for p in cache.iterdir() if (p / "meta.json").is_file()) if cache.is_dir() else []


def leftovers(cache: Path):
    return sorted(p.name for p in cache.iterdir() if p.name.startswith((".tmp-", "failed-"))) \
        if cache.is_dir() else []


def test_miss_then_hit(own_cache, tmp_path):
    op = make_op(write_op(tmp_path / "ops", TWICE))
    first = op.build()
    assert not first.cached and first.seconds > 0
    second = op.build()
    assert second.cached and second.key == first.key and second.entry == first.entry
    assert entries(own_cache) == [first.entry.name] and leftovers(own_cache) == []
    files = {p.name for p in first.entry.iterdir()}
    assert {"meta.json", "build.log", first.meta["so"], first.meta["pyx"]} <= files
    assert not any(name.endswith(".c") for name in files)
    np.testing.assert_array_equal(op(np.arange(4.0)), [0, 2, 4, 6])
    # a fresh Op for the same declaration (a new process, in effect) hits the cache too
    again = make_op(write_op(tmp_path / "ops", TWICE))
    assert again.build().cached


@pytest.mark.slow
def test_key_follows_what_changes_the_module(own_cache, tmp_path, monkeypatch):
    base = make_op(write_op(tmp_path / "a", TWICE)).build(isa="portable")
    # spacing and comments that leave every line where it was: the same module
    same = make_op(write_op(tmp_path / "a", TWICE.replace("y: x * 2", "y: x*2  # same") + "# end\n"))
    assert same.build(isa="portable").key == base.key
    # the generated source names declaration lines (for error messages): moving them rebuilds
    moved = make_op(write_op(tmp_path / "a", "# a comment\n" + TWICE))
    assert moved.build(isa="portable").key != base.key
    changed = make_op(write_op(tmp_path / "c", TWICE.replace("x * 2", "x * 3")))
    assert changed.build(isa="portable").key != base.key
    monkeypatch.setenv("OPKIT_CFLAGS", "-DOPKIT_TEST_FLAG=1")
    assert toolchain("portable").key_material() != {}
    flagged = make_op(write_op(tmp_path / "d", TWICE)).build(isa="portable")
    assert flagged.key != base.key and not flagged.cached
    monkeypatch.delenv("OPKIT_CFLAGS")
    import opkit.builder.compile as compile_mod
    monkeypatch.setattr(compile_mod, "template_digest", lambda: "0" * 64)
    assert make_op(write_op(tmp_path / "e", TWICE)).build(isa="portable").key != base.key


def test_forced_rebuild_replaces_the_entry(own_cache, tmp_path):
    op = make_op(write_op(tmp_path / "ops", TWICE))
    first = op.build()
    np.testing.assert_array_equal(op(np.ones(3)), [2, 2, 2])
    forced = op.build(force=True)
    assert not forced.cached and forced.key == first.key
    assert entries(own_cache) == [first.entry.name] and leftovers(own_cache) == []
    np.testing.assert_array_equal(op(np.ones(3)), [2, 2, 2])


def _slow_cc(tmp_path: Path) -> Path:
    """A compiler wrapper that records each compile and stalls while a flag file exists."""
    cc = tmp_path / "slowcc"
    real = shutil.which("gcc") or shutil.which("cc")
    cc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in *" -shared "*)
            echo compile >> "$OPKIT_TEST_LOG"
            while [ -e "$OPKIT_TEST_FLAG" ]; do sleep 0.1; done ;;
        esac
        exec {real} "$@"
        """))
    cc.chmod(0o755)
    return cc


def _build_script(op_file: Path) -> str:
    return textwrap.dedent(f"""\
        import numpy as np
        from opkit.registry import make_op
        op = make_op({str(op_file)!r})
        r = op.build()
        print("cached" if r.cached else "compiled", float(op(np.arange(5.0)).sum()))
        """)


def _env(tmp_path, cache, cc):
    env = dict(os.environ, OPKIT_CACHE_DIR=str(cache), CC=str(cc),
               OPKIT_TEST_LOG=str(tmp_path / "cc.log"), OPKIT_TEST_FLAG=str(tmp_path / "stall"))
    return env


def _start_build(op_file: Path, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _build_script(op_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_interrupted_build_leaves_no_entry_and_reruns(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cc = _slow_cc(tmp_path)
    op_file = write_op(tmp_path / "ops", TWICE)
    env = _env(tmp_path, cache, cc)
    (tmp_path / "stall").touch()
    proc = _start_build(op_file, env)
    deadline = time.time() + 120
    while not (tmp_path / "cc.log").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the build never reached the compiler"
        time.sleep(0.05)
    proc.kill()  # SIGKILL in the middle of compiling
    proc.wait()
    assert entries(cache) == []
    assert any(n.startswith(".tmp-twice-") for n in leftovers(cache))
    (tmp_path / "stall").unlink()
    rerun = subprocess.run([sys.executable, "-c", _build_script(op_file)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.split() == ["compiled", "20.0"]
    assert len(entries(cache)) == 1
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(cache))
    assert clean(stale_only=True) >= 1
    assert leftovers(cache) == [] and len(entries(cache)) == 1


def _has_lock_open(pid: int) -> bool:
    """Whether process `pid` has a build lock file (.<op>-<key>.lock) open."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd).endswith(".lock") for fd in fds.iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see open files")
def test_two_processes_building_at_once_both_work_one_compiles(tmp_path):
    cache = tmp_path / "cache"
    cc = _slow_cc(tmp_path)
    op_file = write_op(tmp_path / "ops", TWICE)
    env = _env(tmp_path, cache, cc)
    (tmp_path / "stall").touch()
    procs = [_start_build(op_file, env) for _ in range(2)]
    # release the compiler only once one process compiles and the other holds the entry's lock
    # file open, waiting for it: the lock, not luck, keeps the second from compiling
    deadline = time.time() + 120
    while not ((tmp_path / "cc.log").exists() and all(_has_lock_open(p.pid) for p in procs)):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.time() < deadline, "the two builds never met at the lock"
        time.sleep(0.05)
    (tmp_path / "stall").unlink()
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    results = sorted(o[0].split()[0] for o in outs)
    assert results == ["cached", "compiled"]
    assert all(o[0].split()[1] == "20.0" for o in outs)
    assert (tmp_path / "cc.log").read_text().count("compile") == 1
    assert len(entries(cache)) == 1 and leftovers(cache) == []


def test_cython_error_points_at_generated_and_declaration_lines(own_cache):
    source = "# cython: language_level=3\ncdef int v = 'text'  # bad.yaml:7\n"
    with pytest.raises(BuildError) as info:
        build("bad", source, {}, toolchain("portable"))
    msg = str(info.value)
    assert "Cython failed to compile" in msg
    assert "generated line 2: cdef int v = 'text'" in msg
    assert "which comes from bad.yaml:7" in msg
    assert entries(own_cache) == []
    failed = [p for p in own_cache.iterdir() if p.name.startswith("failed-bad-")]
    assert failed and (failed[0] / "build.log").is_file()


def test_c_compiler_error_is_reported(own_cache):
    source = textwrap.dedent('''\
        # cython: language_level=3
        cdef extern from *:
            """
            static int opk_broken(void) { return missing_symbol_xyz; }
            """
            int opk_broken()
        value = opk_broken()  # bad.yaml:9
        ''')
    with pytest.raises(BuildError, match=r"failed to compile the generated kernel module: .*missing_symbol_xyz"):
        build("bad", source, {}, toolchain("portable"))
    assert entries(own_cache) == []


def test_clean_touches_only_opkit_names(own_cache, tmp_path):
    op = make_op(write_op(tmp_path / "ops", TWICE))
    op.build(isa="portable")
    keep = own_cache / "notes.txt"
    keep.write_text("mine")
    (own_cache / "other-dir").mkdir()
    assert clean() >= 1
    assert keep.read_text() == "mine" and (own_cache / "other-dir").is_dir()
    assert entries(own_cache) == []


def test_first_use_builds(own_cache, tmp_path):
    opkit.load(write_op(tmp_path / "ops", TWICE.replace("name: twice", "name: twice_first_use")))
    assert entries(own_cache) == []
    np.testing.assert_array_equal(opkit.ops.twice_first_use(np.arange(3.0)), [0, 2, 4])
    assert len(entries(own_cache)) == 1


def _runtimes(cache: Path):
    return sorted(p.name for p in cache.iterdir() if p.name.startswith("opk_runtime-"))


@pytest.mark.slow
def test_the_runtime_is_compiled_once_and_linked_into_each_module(empty_cache, tmp_path):
    """The header's walk is compiled once per toolchain into the cache and linked into every
    module: two operators, one runtime object; the modules keep its symbols to themselves and
    still run after the object is gone; `opkit clean` removes it."""
    twice = make_op(write_op(tmp_path / "a", TWICE))
    thrice = make_op(write_op(tmp_path / "b", TWICE.replace("twice", "thrice").replace("x * 2", "x * 3")))
    first = twice.build(isa="portable")
    runtimes = _runtimes(empty_cache)
    assert len(runtimes) == 1 and (empty_cache / runtimes[0] / "opk_runtime.o").is_file()
    obj = empty_cache / runtimes[0] / "opk_runtime.o"
    stamp = obj.stat().st_mtime_ns
    thrice.build(isa="portable")
    assert _runtimes(empty_cache) == runtimes and obj.stat().st_mtime_ns == stamp
    # the GEMM micro-kernels are an object of their own, built for modules that call them only
    assert not [p for p in empty_cache.iterdir() if p.name.startswith("opk_gemm-")]
    nm = shutil.which("nm")
    if nm:
        exported = subprocess.run([nm, "-D", "--defined-only", str(first.so_path)],
                                  capture_output=True, text=True).stdout
        assert "opk_walk" not in exported and "opk_run" not in exported
    shutil.rmtree(empty_cache / runtimes[0])
    x = np.linspace(-3, 3, 1001)
    np.testing.assert_array_equal(twice(x), x * 2)          # walked by the linked runtime
    np.testing.assert_array_equal(thrice(x[::3]), x[::3] * 3)
    assert clean() >= 1 and _runtimes(empty_cache) == []


def test_a_runtime_that_does_not_compile_is_reported(empty_cache, tmp_path, monkeypatch):
    from opkit.builder import runtime
    monkeypatch.setattr(runtime, "runtime_source", lambda vector_bytes: "#error the runtime is broken\n")
    with pytest.raises(BuildError, match="kernel runtime") as err:
        make_op(write_op(tmp_path / "a", TWICE)).build(isa="portable")
    assert "the runtime is broken" in str(err.value)
    assert _runtimes(empty_cache) == [] and entries(empty_cache) == []
    assert not [p for p in empty_cache.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.slow
def test_a_damaged_runtime_object_is_compiled_again(empty_cache, tmp_path):
    """The runtime object is checked against the size and sha256 recorded when it was built,
    as a module is: a damaged one is never linked, it is compiled again."""
    make_op(write_op(tmp_path / "a", TWICE)).build(isa="portable")
    runtime, = _runtimes(empty_cache)
    obj = empty_cache / runtime / "opk_runtime.o"
    good = obj.read_bytes()
    obj.write_bytes(good[: len(good) // 2])
    thrice = make_op(write_op(tmp_path / "b", TWICE.replace("twice", "thrice").replace("x * 2", "x * 3")))
    thrice.build(isa="portable")
    assert obj.read_bytes() == good
    np.testing.assert_array_equal(thrice(np.arange(5.0)), np.arange(5.0) * 3)
