"""Where opkit's shipped data lives, installed or in a source checkout."""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    # An installed opkit carries opkit/templates and opkit/operators; a source checkout (or an
    # editable install) keeps them at the top of the repository, one level up.
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir() and any(p.suffix in (".j2", ".yaml", ".h") for p in candidate.iterdir()):
            return candidate
    raise FileNotFoundError(
        f"opkit cannot find its {name}/ folder (looked in {_PKG / name} and {_PKG.parent / name}); "
        "reinstall opkit with `pip install .`"
    )


def templates_dir() -> Path:
    return _find("templates")


def operators_dir() -> Path:
    return _find("operators")


def prebuilt_dir():
    """The modules an installed opkit carries, built ahead of time (None in a source checkout
    or an install without them)."""
    path = _PKG / "prebuilt"
    return path if path.is_dir() else None
