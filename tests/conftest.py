"""Shared fixtures. Kernels are compiled into one cache for the whole run: OPKIT_CACHE_DIR when
the environment sets it (CI points it at a temporary folder), otherwise a fresh temporary folder.
Tests that exercise the cache itself use folders of their own."""
import os
import tempfile
from pathlib import Path

import pytest

if not os.environ.get("OPKIT_CACHE_DIR"):
    os.environ["OPKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="opkit-test-cache-")

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "user_ops"


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty build cache for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(cache))
    return cache


def write_op(folder: Path, text: str, name: str = "op.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path
