"""Installed operator packages: the entry point group `opkit.operators`.

Each entry point names a module (or any object) with `OPERATORS`, the folder of its YAML
declarations, and optionally `PREBUILT`, the folder of its modules built ahead of time (what
`opkit package` writes). `import opkit` registers every package's operators after the bundled
ones and before OPKIT_PATH. An operator name that two packages declare (or that a package
declares and opkit bundles) is registered by neither: the error names both, and `opkit list`
shows it and exits non-zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

GROUP = "opkit.operators"


@dataclass(frozen=True)
class Package:
    name: str                  # the distribution's name and version, as `opkit list` shows it
    operators: Path
    prebuilt: Optional[Path]


def _entry_points():
    from importlib.metadata import entry_points
    found = entry_points()
    if hasattr(found, "select"):
        return list(found.select(group=GROUP))
    return list(found.get(GROUP, ()))  # Python 3.9


def discover() -> "tuple[List[Package], List[str]]":
    """The installed packages, and a message for each entry point that cannot be used."""
    packages, problems = [], []
    seen = set()
    for ep in sorted(_entry_points(), key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else ep.name
        if (label, ep.value) in seen:  # the same distribution on sys.path twice
            continue
        seen.add((label, ep.value))
        try:
            obj = ep.load()
            operators = Path(getattr(obj, "OPERATORS"))
        except Exception as exc:  # noqa: BLE001  (a broken package must not break import opkit)
            problems.append(f"operator package {label}: entry point {ep.name} = {ep.value} "
                            f"cannot be loaded ({type(exc).__name__}: {exc}); reinstall or "
                            "uninstall it")
            continue
        prebuilt = getattr(obj, "PREBUILT", None)
        packages.append(Package(label, operators, Path(prebuilt) if prebuilt else None))
    return packages, problems
