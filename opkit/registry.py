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
    def __init__(self) -> None:
        self._ops: Dict[str, Op] = {}
        self._broken: List[SpecError] = []
        self._listeners: List[Callable[[Op], None]] = []
        # operator packages (entry points, opkit/packaging/plugins.py): where each operator
        # came from, and what could not be registered
        self._origins: Dict[str, str] = {}
        self._package_errors: List[str] = []
        self._clashes: Dict[str, str] = {}
        self._lock = threading.RLock()

    def subscribe(self, listener: Callable[[Op], None]) -> None:
        """Call `listener(op)` for every operator registered so far and for each one registered
        later (a file loaded again calls it again with the new Op). Integrations such as
        opkit.torch use this to follow opkit.load and OPKIT_PATH."""
        with self._lock:
            self._listeners.append(listener)
            for op in self.ops():
                listener(op)

    def load(self, path: Union[str, os.PathLike], origin: str = "") -> List[str]:
        """Register every operator declared in a folder (*.yaml) or in one file.

        All files are checked before any is registered, so a bad file changes nothing; the
        SpecError then reports every bad file."""
        ops, errors = _parse(path)
        with self._lock:
            good = self._admit(ops, errors)
            if errors:
                raise SpecError.combine(_in_file_order(errors))
            return self._register(good, origin)

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

    def _register(self, ops: List[Op], origin: str = "") -> List[str]:
        for op in ops:
            self._ops[op.name] = op
            # loading an operator's own file again (opkit build PATH) keeps where it came from
            self._origins[op.name] = origin or self._origins.get(op.name, "")
        for op in ops:
            for listener in self._listeners:
                listener(op)
        return [op.name for op in ops]

    def get(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            if name in self._clashes:
                raise KeyError(self._clashes[name]) from None
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

    # ------------------------------------------------------------ operator packages

    def origin(self, name: str) -> str:
        """Where operator `name` came from: "opkit" (bundled), an operator package's name and
        version, or "" (opkit.load, OPKIT_PATH: its file says where)."""
        return self._origins.get(name, "")

    def package_errors(self) -> List[str]:
        """What installed operator packages could not register (name clashes, bad files)."""
        return list(self._package_errors)

    def load_packages(self, packages) -> List[str]:
        """Register the operators of installed operator packages and search their modules
        built ahead of time. A name two packages declare, or one that is registered already,
        is registered by neither package; the error names both. Returns the errors."""
        from .builder.cache import add_shipped
        errors: List[str] = []
        owners: Dict[str, List[Tuple[str, Op]]] = {}
        for pkg in packages:
            try:
                ops, bad = _parse(pkg.operators)
            except OSError as exc:
                errors.append(f"operator package {pkg.name}: {exc}")
                continue
            errors += [f"operator package {pkg.name}: {e}".splitlines()[0] for e in bad]
            if pkg.prebuilt is not None:
                add_shipped(pkg.prebuilt)
            for op in ops:
                owners.setdefault(op.name, []).append((pkg.name, op))
        with self._lock:
            admitted: Dict[str, List[Op]] = {}  # package -> the operators it registers
            for name, found in sorted(owners.items()):
                old = self._ops.get(name)
                if len(found) == 1 and old is None:
                    admitted.setdefault(found[0][0], []).append(found[0][1])
                    continue
                who = [f"{p} ({op.spec.file})" for p, op in found]
                if old is not None:
                    who.insert(0, f"{self._origins.get(name) or 'opkit.load'} ({old.spec.file})")
                message = (f"operator {name!r} is declared by both {who[0]} and "
                           f"{' and '.join(who[1:])}: neither package's is registered; "
                           "uninstall one of the packages (pip uninstall NAME)")
                if old is None:
                    self._clashes[name] = message
                errors.append(message)
            for package, ops in admitted.items():
                self._register(ops, package)
            self._package_errors += errors
        return errors


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
    """The bundled operators, then those of installed operator packages (entry points), then
    each OPKIT_PATH folder; a bad file there is skipped with a warning (the folder's other
    files still load) and listed by `opkit list`."""
    from .packaging.plugins import discover
    REGISTRY.load(operators_dir(), origin="opkit")
    packages, problems = discover()
    REGISTRY._package_errors += problems
    for problem in problems + REGISTRY.load_packages(packages):
        warnings.warn(f"opkit: {problem}", stacklevel=3)
    for folder in filter(None, os.environ.get("OPKIT_PATH", "").split(os.pathsep)):
        try:
            _, errors = REGISTRY.load_good(folder)
        except OSError as exc:
            warnings.warn(f"opkit: OPKIT_PATH entry {folder} was not loaded: {exc}", stacklevel=3)
            continue
        for error in errors:
            warnings.warn(f"opkit: an OPKIT_PATH file was not loaded: {error}", stacklevel=3)
