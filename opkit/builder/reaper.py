"""Run a build command so that nothing it starts outlives the build.

`run()` starts this file as a small process of its own (the reaper), which starts the command as
the leader of a new process group and kills that whole group with SIGKILL

- when the command ends (anything it left running in the background),
- when the building process closes the lifeline pipe: on a timeout, on KeyboardInterrupt, on any
  error, and also when it dies, even by SIGKILL (the kernel closes the pipe then),
- when the reaper itself gets SIGTERM or SIGHUP.

A group kill reaches grandchildren (cc1, as, ld under gcc) that PR_SET_PDEATHSIG would miss. The
reaper imports nothing from opkit: it runs as a script, `python reaper.py FD COMMAND...`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import List, Optional

_SCRIPT = str(Path(__file__).resolve())


def run(cmd: List[str], cwd: Path, timeout: Optional[float]) -> subprocess.CompletedProcess:
    """Run `cmd` in its own process group under a reaper; like subprocess.run(capture_output=True,
    text=True). Raises subprocess.TimeoutExpired after `timeout` seconds, with the group killed."""
    lifeline_r, lifeline_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", _SCRIPT, str(lifeline_r), *cmd], cwd=str(cwd),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                pass_fds=(lifeline_r,))
    except BaseException:
        os.close(lifeline_w)
        raise
    finally:
        os.close(lifeline_r)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        # closing the lifeline makes the reaper kill the group; then collect the reaper
        os.close(lifeline_w)
        lifeline_w = -1
        try:
            proc.communicate(timeout=60)
        except BaseException:
            proc.kill()
            proc.wait()
        raise
    finally:
        if lifeline_w >= 0:
            os.close(lifeline_w)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _reap(lifeline: int, cmd: List[str]) -> int:
    # Ctrl-C reaches the whole foreground group, this process too: the builder decides what an
    # interrupt means (it closes the lifeline), so ignore it here (a handler, not SIG_IGN, so that
    # the command does not inherit the ignoring)
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        child = subprocess.Popen(cmd, start_new_session=True)
    except OSError as exc:
        print(f"cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127

    def kill_group(*_):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:  # the group is already empty
            pass

    def watch():
        try:
            while os.read(lifeline, 4096):
                pass
        except OSError:
            pass
        kill_group()  # the builder gave up or died

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, kill_group)
    threading.Thread(target=watch, daemon=True).start()
    code = child.wait()
    kill_group()
    if code < 0:
        try:
            print(f"{cmd[0]} was killed by signal {-code}", file=sys.stderr)
        except OSError:  # nobody is reading any more
            pass
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(_reap(int(sys.argv[1]), sys.argv[2:]))
