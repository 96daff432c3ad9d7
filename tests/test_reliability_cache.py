"""The kernel cache when things go wrong: damaged modules, `clean --stale` next to a running
build, unwritable and read-only cache folders."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from opkit.builder import cache as cache_mod
from opkit.errors import BuildError
from opkit.registry import make_op

from conftest import write_op
from test_build_cache import TWICE, entries

OTHER = TWICE.replace("name: twice", "name: thrice").replace("x * 2", "x * 3")


def _opkit(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "opkit", *args], capture_output=True, text=True,
                          env=env or dict(os.environ), timeout=timeout)


def _call_twice(op_file: Path) -> str:
    """A fresh process that builds (or finds) `twice` and calls it."""
    return textwrap.dedent(f"""\
        import numpy as np
        from opkit.registry import make_op
        op = make_op({str(op_file)!r})
        r = op.build()
        print("cached" if r.cached else "compiled", float(op(np.arange(5.0)).sum()))
        """)


def _flip_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(bytes(b ^ 0x5A for b in data[:4096]) + data[4096:])


DAMAGE = {
    "truncated": lambda p: os.truncate(p, 1000),   # dlopen maps past the end: SIGBUS
    "empty": lambda p: os.truncate(p, 0),
    "garbage": _flip_header,                        # same size, other bytes
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_module_is_rebuilt_not_loaded(own_cache, tmp_path, damage):
    op_file = write_op(tmp_path / "ops", TWICE)
    first = make_op(op_file).build()
    so = first.so_path
    DAMAGE[damage](so)
    r = subprocess.run([sys.executable, "-c", _call_twice(op_file)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["compiled", "20.0"]
    record = json.loads((first.entry / "meta.json").read_text())["files"][so.name]
    assert so.stat().st_size == record["size"]
    assert hashlib.sha256(so.read_bytes()).hexdigest() == record["sha256"]


def test_each_module_is_hashed_once_per_process(own_cache, tmp_path, monkeypatch):
    op_file = write_op(tmp_path / "ops", TWICE)
    r = subprocess.run([sys.executable, "-c", _call_twice(op_file)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    hashed = []
    real = cache_mod.file_sha256
    monkeypatch.setattr(cache_mod, "file_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    op = make_op(op_file)
    for _ in range(3):
        result = op.build()
        np.testing.assert_array_equal(op(np.arange(3.0)), [0, 2, 4])
        make_op(op_file).build()
    assert result.cached and hashed.count(result.so_path.name) == 1


# ------------------------------------------------------------------ clean --stale

def _waiting_cc(tmp_path: Path) -> Path:
    """A compiler that announces each module compile and waits for a release file first."""
    cc = tmp_path / "waitcc"
    real = shutil.which("gcc") or shutil.which("cc")
    cc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in *" -shared "*)
            touch "$OPKIT_TEST_STARTED"
            while [ ! -e "$OPKIT_TEST_RELEASE" ]; do sleep 0.05; done ;;
        esac
        exec {real} "$@"
        """))
    cc.chmod(0o755)
    return cc


def _wait_for(path: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 300
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, what
        time.sleep(0.05)


def test_clean_stale_keeps_the_folder_of_a_running_build(tmp_path):
    cache = tmp_path / "cache"
    ops = tmp_path / "ops"
    write_op(ops, TWICE)
    env = dict(os.environ, OPKIT_CACHE_DIR=str(cache), CC=str(_waiting_cc(tmp_path)),
               OPKIT_TEST_STARTED=str(tmp_path / "started"), OPKIT_TEST_RELEASE=str(tmp_path / "go"))
    proc = subprocess.Popen([sys.executable, "-m", "opkit", "build", "-q", "--no-validate", str(ops)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "started", proc, "the build never reached the compiler")
        working = [p.name for p in cache.iterdir() if p.name.startswith(".tmp-twice-")]
        assert len(working) == 1
        # a leftover of a build that is gone (no lock held, no such process) goes
        dead = cache / f".tmp-twice-{'0' * 16}-999999999-1"
        dead.mkdir()
        r = _opkit("clean", "--stale", env=env)
        assert r.returncode == 0, r.stderr
        assert not dead.exists()
        assert (cache / working[0]).is_dir()      # the running build's folder stays
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    finally:
        (tmp_path / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(entries(cache)) == 1 and not (cache / working[0]).exists()


# ------------------------------------------------------------------ unwritable / read-only cache

UNWRITABLE = {
    "under-a-file": lambda tmp: tmp / "a-file" / "cache",
    "proc": lambda tmp: Path("/proc/opkit-cache"),
}


@pytest.mark.parametrize("where", sorted(UNWRITABLE))
def test_unwritable_cache_is_one_clear_error(tmp_path, monkeypatch, where):
    (tmp_path / "a-file").write_text("not a folder")
    cache = UNWRITABLE[where](tmp_path)
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(cache))
    op = make_op(write_op(tmp_path / "ops", TWICE))
    with pytest.raises(BuildError) as info:
        op(np.ones(2))
    msg = str(info.value)
    assert len(msg.splitlines()) == 1, msg
    assert str(cache) in msg and "OPKIT_CACHE_DIR" in msg
    r = _opkit("build", "-q", str(tmp_path / "ops"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"opkit build: error: twice: {msg}"], r.stderr


def _read_only(cache: Path):
    """A command prefix that runs its command with `cache` read-only (even for root), or None."""
    if os.geteuid() != 0:
        for p in [cache, *cache.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        return []
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1"'
              ' && shift && exec "$@"', "sh", str(cache)]
    probe = subprocess.run(prefix + ["sh", "-c", 'touch "$0/probe"', str(cache)], capture_output=True)
    return prefix if probe.returncode != 0 and not (cache / "probe").exists() else None


def test_read_only_cache_serves_calls(tmp_path):
    cache = tmp_path / "cache"
    ops, other = tmp_path / "ops", tmp_path / "other"
    write_op(ops, TWICE)
    write_op(other, OTHER)
    env = dict(os.environ, OPKIT_CACHE_DIR=str(cache))
    r = _opkit("build", "-q", str(ops), env=env)
    assert r.returncode == 0, r.stderr
    prefix = _read_only(cache)
    if prefix is None:
        pytest.skip("cannot make a folder read-only for root here (no unshare + bind mount)")
    try:
        script = textwrap.dedent(f"""\
            import errno, os, numpy as np, opkit
            try:
                open(os.path.join({str(cache)!r}, "probe"), "w")
                print("writable")
            except OSError as exc:
                print("read-only", errno.errorcode[exc.errno])
            opkit.load({str(ops)!r})
            print(float(opkit.ops.twice(np.arange(5.0)).sum()))
            opkit.load({str(other)!r})
            try:
                opkit.ops.thrice(np.ones(2))
            except opkit.BuildError as exc:
                print("BuildError", exc)
            """)
        r = subprocess.run(prefix + [sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split()[0] == "read-only" and lines[1] == "20.0", lines
        assert lines[2].startswith("BuildError") and str(cache) in lines[2] \
            and "OPKIT_CACHE_DIR" in lines[2] and len(lines) == 3, lines
        r = subprocess.run(prefix + [sys.executable, "-m", "opkit", "build", "-q", str(ops)],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0 and " hit " in r.stdout, r.stderr
        r = subprocess.run(prefix + [sys.executable, "-m", "opkit", "clean"], capture_output=True,
                           text=True, env=env, timeout=600)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("opkit clean: error: ") and str(cache) in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        for p in [cache, *cache.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert len(entries(cache)) == 1
