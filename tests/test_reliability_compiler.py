"""The compiler: running without one, honouring CC, and leaving no compiler process behind."""
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from opkit.builder import toolchain
from opkit.builder.tools import run_tool
from opkit.errors import BuildError
from opkit.registry import make_op

from conftest import write_op
from test_build_cache import TWICE, entries
from test_reliability_cache import OTHER

# opkit.builder exports the function toolchain under the name of its module
toolchain_mod = sys.modules["opkit.builder.toolchain"]
LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")


def _no_compiler(env: dict, tmp_path: Path) -> dict:
    """`env` with no C compiler to be found: CC unset, PATH an empty folder."""
    empty = tmp_path / "bin-without-cc"
    empty.mkdir(exist_ok=True)
    conf = (sysconfig.get_config_var("CC") or "").split()
    if conf and shutil.which(conf[0], path=str(empty)):
        pytest.skip(f"sysconfig's CC ({conf[0]}) is found without PATH")
    env = {k: v for k, v in env.items() if k != "CC"}
    env["PATH"] = str(empty)
    return env


def _run(args, env, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


@pytest.mark.slow
def test_no_compiler_serves_what_the_cache_holds(tmp_path):
    cache = tmp_path / "cache"
    ops, other = tmp_path / "ops", tmp_path / "other"
    write_op(ops, TWICE)
    write_op(other, OTHER)
    env = dict(os.environ, OPKIT_CACHE_DIR=str(cache))
    r = _run(["-m", "opkit", "build", "-q", str(ops)], env)
    assert r.returncode == 0, r.stderr
    bare = _no_compiler(env, tmp_path)
    script = textwrap.dedent(f"""\
        import numpy as np, opkit
        from opkit.builder import toolchain
        print("compiler", toolchain().available)
        opkit.load({str(ops)!r})
        print(float(opkit.ops.twice(np.arange(5.0)).sum()))
        opkit.load({str(other)!r})
        try:
            opkit.ops.thrice(np.ones(2))
        except opkit.BuildError as exc:
            print("BuildError", exc)
        """)
    r = _run(["-c", script], bare)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["compiler False", "20.0"], lines
    assert lines[2].startswith("BuildError") and "C compiler" in lines[2] and len(lines) == 3, lines
    for args in (["--help"], ["list"], ["show", "twice", "--path", str(ops)],
                 ["build", "-q", str(ops)], ["validate", "twice", "--path", str(ops)]):
        r = _run(["-m", "opkit", *args], bare)
        assert r.returncode == 0 and not r.stderr, (args, r.stderr)
    r = _run(["-m", "opkit", "show", "twice", "--path", str(ops)], bare)
    assert "## generated source" in r.stdout and str(cache) in r.stdout
    r = _run(["-m", "opkit", "build", "-q", str(other)], bare)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("opkit build: error: ") and \
        "C compiler" in r.stderr.strip().splitlines()[-1], r.stderr


def test_no_compiler_finds_a_module_whose_compiler_chose_another_vector_width(
        own_cache, tmp_path, monkeypatch):
    guess = toolchain().target  # without a compiler the width is not probed ...
    width = 16 if guess.vector_bytes != 16 else 32
    # ... and this compiler (as some do) uses vectors narrower than the CPU has
    monkeypatch.setattr(toolchain_mod, "probe_vector_bytes", lambda *a: width)
    op_file = write_op(tmp_path / "ops", TWICE)
    built = make_op(op_file).build()
    assert f"{width}-byte vectors" in built.source_path.read_text()
    bare = _no_compiler(dict(os.environ), tmp_path)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", bare["PATH"])
    assert not toolchain().available
    op = make_op(op_file)
    np.testing.assert_array_equal(op(np.arange(3.0)), [0, 2, 4])
    assert op.build().entry == built.entry and toolchain().target.vector_bytes == width


def test_damaged_module_without_compiler_says_what_to_run(own_cache, tmp_path):
    op_file = write_op(tmp_path / "ops", TWICE)
    so = make_op(op_file).build().so_path
    os.truncate(so, 1000)
    script = textwrap.dedent(f"""\
        import numpy as np, opkit
        from opkit.registry import make_op
        try:
            make_op({str(op_file)!r})(np.ones(2))
        except opkit.BuildError as exc:
            print(exc)
        """)
    r = _run(["-c", script], _no_compiler(dict(os.environ), tmp_path))
    assert r.returncode == 0, (r.returncode, r.stderr)
    msg = r.stdout.strip()
    assert len(msg.splitlines()) == 1 and str(so) in msg and "C compiler" in msg, msg
    assert "opkit build" in msg


# ------------------------------------------------------------------ CC

def test_cc_naming_a_missing_program_fails_naming_it(own_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "nonexistent-cc-opkit")
    assert not toolchain().available                    # no error until something is built
    op = make_op(write_op(tmp_path / "ops", TWICE))
    with pytest.raises(BuildError, match=r"CC=nonexistent-cc-opkit") as info:
        op.build()
    assert len(str(info.value).splitlines()) == 1
    assert entries(own_cache) == []


def _failing_cc(tmp_path: Path) -> Path:
    cc = tmp_path / "failcc"
    cc.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$1" in --version) echo "failcc 1.0"; exit 0 ;; esac
        echo "failcc: cannot compile today" >&2
        exit 3
        """))
    cc.chmod(0o755)
    return cc


def test_failing_compiler_shows_its_exit_status_and_output(own_cache, tmp_path, monkeypatch):
    op = make_op(write_op(tmp_path / "ops", TWICE))
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(BuildError) as info:
        op.build()
    assert "/bin/false" in str(info.value) and "exit status 1" in str(info.value), str(info.value)
    monkeypatch.setenv("CC", str(_failing_cc(tmp_path)))
    with pytest.raises(BuildError) as info:
        op.build()
    msg = str(info.value)
    assert "exit status 3" in msg and "failcc: cannot compile today" in msg, msg
    assert entries(own_cache) == []


# ------------------------------------------------------------------ compiler processes

def _stat(pid: int):
    """(state, process group) of a live process; None when it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else (fields[0], int(fields[2]))


def _group(pgid: int):
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and (_stat(int(p.name)) or (None, None))[1] == pgid]


def _gone(pids, timeout=60.0) -> bool:
    deadline = time.time() + timeout
    while any(_stat(p) for p in pids):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _spawning_cc(tmp_path: Path) -> Path:
    """A compiler that starts a long-lived child, records both pids and waits."""
    cc = tmp_path / "spawncc"
    real = shutil.which("gcc") or shutil.which("cc")
    cc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in *" -shared "*)
            sleep 1000 &
            echo "$$ $!" > "$OPKIT_TEST_PIDS.tmp" && mv "$OPKIT_TEST_PIDS.tmp" "$OPKIT_TEST_PIDS"
            wait ;;
        esac
        exec {real} "$@"
        """))
    cc.chmod(0o755)
    return cc


def _pids_of(path: Path, proc: subprocess.Popen):
    deadline = time.time() + 300
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the command never started"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


@LINUX_PROC
def test_sigkilled_build_leaves_no_compiler_process(tmp_path):
    op_file = write_op(tmp_path / "ops", TWICE)
    env = dict(os.environ, OPKIT_CACHE_DIR=str(tmp_path / "cache"), CC=str(_spawning_cc(tmp_path)),
               OPKIT_TEST_PIDS=str(tmp_path / "pids"))
    proc = subprocess.Popen([sys.executable, "-c", f"from opkit.registry import make_op; "
                             f"make_op({str(op_file)!r}).build()"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = _pids_of(tmp_path / "pids", proc)
    try:
        pgid = _stat(pids[0])[1]
        proc.kill()
        proc.wait()
        assert _gone(pids), "the compiler or its child outlived the killed build"
        assert pgid == os.getpgid(0) or _gone(_group(pgid))
    finally:
        _kill(pids)


def _background_command(tmp_path: Path):
    pidfile = tmp_path / "bg.pid"
    return ["sh", "-c", f'sleep 1000 & echo $! > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}"; wait'], pidfile


@LINUX_PROC
def test_timeout_kills_the_whole_group(tmp_path):
    cmd, pidfile = _background_command(tmp_path)
    with pytest.raises(BuildError, match="did not finish"):
        run_tool(cmd, tmp_path, timeout=10)
    assert pidfile.exists(), "the command did not start in time; rerun"
    pid = int(pidfile.read_text())
    try:
        assert _gone([pid]), "the command's child outlived the timeout"
    finally:
        _kill([pid])


@LINUX_PROC
def test_keyboard_interrupt_kills_the_whole_group(tmp_path):
    cmd, pidfile = _background_command(tmp_path)
    # the child takes Ctrl-C as an interactive Python does, whatever disposition of SIGINT this
    # process passes on (an ignored signal stays ignored across exec)
    script = textwrap.dedent(f"""\
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from opkit.builder.tools import run_tool
        try:
            run_tool({cmd!r}, Path({str(tmp_path)!r}), 600)
        except KeyboardInterrupt:
            print("interrupted")
        """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid, = _pids_of(pidfile, proc)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert out.strip() == "interrupted", err
        assert _gone([pid]), "the command's child outlived the interrupt"
    finally:
        _kill([pid])
        if proc.poll() is None:
            proc.kill()
