"""Operator names → Op objects; loading declaration files and folders."""
from __future__ import annotations

import difflib
import os
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Tuple, Union

from ._paths import operators_dir
from .dsl import build_graphs
from .errors import Loc, SpecError
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
        self._broken: List[SpecError] = []
        self._listeners: List[Callable[[Op], None]] = []
        self._lock = threading.RLock()

    def subscribe(self, listener: Callable[[Op], None]) -> None:
        """Call `listener(op)` for every operator registered so far and for each one registered
        later (a file loaded again calls it again with the new Op). Integrations such as
        opkit.torch use this to follow opkit.load and OPKIT_PATH."""
        with self._lock:
            self._listeners.append(listener)
            for op in self.ops():
                listener(op)

    def load(self, path: Union[str, os.PathLike]) -> List[str]:
        """Register every operator declared in a folder (*.yaml) or in one file.

        All files are checked before any is registered, so a bad file changes nothing; the
        SpecError then reports every bad file."""
        ops, errors = _parse(path)
        with self._lock:
            good = self._admit(ops, errors)
            if errors:
                raise SpecError.combine(_in_file_order(errors))
            return self._register(good)

    def load_good(self, path: Union[str, os.PathLike]) -> Tuple[List[str], List[SpecError]]:
        """Register the good files of a folder and set the bad ones aside (`broken()` lists
        them); returns the names registered and the errors of the bad files."""
        ops, errors = _parse(path)
        with self._lock:
            good = self._admit(ops, errors)
            errors = _in_file_order(errors)
            self._broken += errors
            return self._register(good), errors

    def _admit(self, ops: List[Op], errors: List[SpecError]) -> List[Op]:
        """The operators whose names clash with nothing; an error for each of the others."""
        good: List[Op] = []
        seen: Dict[str, str] = {}
        for op in ops:
            old = self._ops.get(op.name)
            if op.name in seen:
                errors.append(SpecError(f"name: operator {op.name!r} is declared twice, here and "
                                        f"in {seen[op.name]}", op.spec.loc))
            elif old is not None and Path(old.spec.file).resolve() != Path(op.spec.file).resolve():
                errors.append(SpecError(f"name: operator {op.name!r} is already registered from "
                                        f"{old.spec.file}", op.spec.loc))
            else:
                seen[op.name] = op.spec.file
                good.append(op)
        return good

    def _register(self, ops: List[Op]) -> List[str]:
        for op in ops:
            self._ops[op.name] = op
        for op in ops:
            for listener in self._listeners:
                listener(op)
        return [op.name for op in ops]

    def get(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(self.unknown(name, f"opkit.list_ops() lists {len(self._ops)} operators; "
                                              "load yours with opkit.load(PATH) or put their folder "
                                              "in OPKIT_PATH")) from None

    def unknown(self, name: str, how: str) -> str:
        """The error for an unknown name: close matches, then `how` to find or load one."""
        close = difflib.get_close_matches(str(name), list(self._ops), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"no operator named {name!r}{hint} ({how})"

    def names(self) -> List[str]:
        return sorted(self._ops)

    def ops(self) -> List[Op]:
        return [self._ops[n] for n in self.names()]

    def broken(self) -> List[SpecError]:
        """The errors of the OPKIT_PATH files that were set aside at import."""
        return list(self._broken)


def _parse(path) -> Tuple[List[Op], List[SpecError]]:
    """Every declaration in a folder (or one file) checked: the operators and the errors."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"opkit.load: {p} does not exist")
    ops: List[Op] = []
    errors: List[SpecError] = []
    for f in _yaml_files(p):
        try:
            ops.append(make_op(f))
        except SpecError as exc:
            errors.append(exc)
        except OSError as exc:
            errors.append(SpecError(f"cannot read the file: {exc.strerror or exc}", Loc(str(f), 1)))
    return ops, errors


def _in_file_order(errors: List[SpecError]) -> List[SpecError]:
    return sorted(errors, key=lambda e: (e.loc.file, e.loc.line) if e.loc else ("", 0))


def make_op(path: Path) -> Op:
    """Check one declaration through the DSL stage and the hand-written backward, if any."""
    spec = load_spec(path)
    graphs = build_graphs(spec)
    op = Op(spec, graphs, lower(spec, graphs))  # lowering checks schedule.inplace
    for variant in op.variants:  # each choice of the str attrs, optional inputs given or not
        variant_graphs = op.graphs_of(variant)
        op.lowered(variant)
        if variant_graphs.declared:
            from .validate.declared import check_declared_backward
            check_declared_backward(spec, variant_graphs)
    return op


REGISTRY = Registry()


def load_defaults() -> None:
    """The bundled operators, then each OPKIT_PATH folder; a bad file there is skipped with a
    warning (the folder's other files still load) and listed by `opkit list`."""
    REGISTRY.load(operators_dir())
    for folder in filter(None, os.environ.get("OPKIT_PATH", "").split(os.pathsep)):
        try:
            _, errors = REGISTRY.load_good(folder)
        except OSError as exc:
            warnings.warn(f"opkit: OPKIT_PATH entry {folder} was not loaded: {exc}", stacklevel=3)
            continue
        for error in errors:
            warnings.warn(f"opkit: an OPKIT_PATH file was not loaded: {error}", stacklevel=3)
