"""Run one build tool (cythonize, the C compiler) for the builder, its failures as BuildError."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List

from ..errors import BuildError
from . import reaper


def run_tool(cmd: List[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`cmd` in `cwd`, stopped (with everything it started) after `timeout` seconds."""
    try:
        return reaper.run(cmd, cwd, timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{cmd[0]} did not finish within {timeout:.0f} s and was stopped") from None
    except OSError as exc:
        raise BuildError(f"cannot run {cmd[0]}: {exc}") from None
