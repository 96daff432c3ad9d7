"""Operator names → Op objects; loading declaration files and folders."""
from __future__ import annotations

import difflib
import os
import threading
import warnings
from pathlib import Path
from typing import Dict, List, Union

from ._paths import operators_dir
from .dsl import build_graphs
from .errors import SpecError
from .lower import lower
from .runtime import Op
from .spec import load_spec


def _yaml_files(path: Path) -> List[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


class Registry:
    def __init__(self):
        self._ops: Dict[str, Op] = {}
        self._lock = threading.RLock()

    def load(self, path: Union[str, os.PathLike]) -> List[str]:
        """Register every operator declared in a folder (*.yaml) or in one file.

        All files are checked before any is registered, so a bad file changes nothing."""
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"opkit.load: {p} does not exist")
        ops = [make_op(f) for f in _yaml_files(p)]
        with self._lock:
            seen: Dict[str, str] = {}
            for op in ops:
                if op.name in seen:
                    raise SpecError(f"name: operator {op.name!r} is declared twice, here and in "
                                    f"{seen[op.name]}", op.spec.loc)
                seen[op.name] = op.spec.file
                old = self._ops.get(op.name)
                if old is not None and Path(old.spec.file).resolve() != Path(op.spec.file).resolve():
                    raise SpecError(f"name: operator {op.name!r} is already registered from "
                                    f"{old.spec.file}", op.spec.loc)
            for op in ops:
                self._ops[op.name] = op
        return [op.name for op in ops]

    def get(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), list(self._ops), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"no operator named {name!r}{hint} (opkit.list_ops() lists "
                           f"{len(self._ops)} operators)") from None

    def names(self) -> List[str]:
        return sorted(self._ops)

    def ops(self) -> List[Op]:
        return [self._ops[n] for n in self.names()]


def make_op(path: Path) -> Op:
    """Check one declaration through the DSL stage and the hand-written backward, if any."""
    spec = load_spec(path)
    graphs = build_graphs(spec)
    if graphs.declared:
        from .validate.check import check_declared_backward
        check_declared_backward(spec, graphs)
    return Op(spec, graphs, lower(spec, graphs))  # lowering checks schedule.inplace


REGISTRY = Registry()


def load_defaults() -> None:
    REGISTRY.load(operators_dir())
    for folder in filter(None, os.environ.get("OPKIT_PATH", "").split(os.pathsep)):
        try:
            REGISTRY.load(folder)
        except (SpecError, OSError) as exc:
            warnings.warn(f"opkit: OPKIT_PATH entry {folder} was not loaded: {exc}", stacklevel=3)
