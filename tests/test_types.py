"""The stages type-check: mypy, with pyproject.toml's [tool.mypy] (the packages below the
command line), finds no error. Its cache is the repository's .mypy_cache: a second run takes
a fraction of a second."""
import subprocess
import sys

import pytest

from conftest import REPO


def test_mypy_finds_no_errors():
    pytest.importorskip("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.fail(f"mypy found errors:\n{res.stdout}{res.stderr}", pytrace=False)
