"""Command-line options shared by `opkit`'s commands (opkit.cli) and `opkit bench` (opkit.bench):
here, so that opkit.bench needs nothing from opkit.cli (which imports it to add the command)."""
from __future__ import annotations

from .kinds import AttrType


def add_path_option(parser) -> None:
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="load the operators of this folder or YAML file first (repeatable)")


def attr_option(op, text: str):
    """`alpha=0.1` -> ("alpha", 0.1), read as the attr's declared type."""
    name, eq, value = text.partition("=")
    attrs = {a.name: a for a in op.spec.attrs}
    if not eq or name not in attrs:
        known = ", ".join(attrs) or "none"
        raise ValueError(f"--attr takes NAME=VALUE with NAME an attr of {op.name} ({known}), "
                         f"got {text!r}")
    typ = attrs[name].type
    if typ == AttrType.STR:
        if attrs[name].choices and value not in attrs[name].choices:
            raise ValueError(f"--attr {name}: expected one of {', '.join(attrs[name].choices)}, "
                             f"got {value!r}")
        return name, value
    try:
        if typ == AttrType.BOOL:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return name, value.lower() in ("true", "1")
        if value.lower() in ("none", "null"):
            return name, None
        return name, int(value) if typ == AttrType.INT else float(value)
    except ValueError:
        raise ValueError(f"--attr {name}: expected {'an integer' if typ == 'int' else 'a number'}"
                         f", got {value!r}") from None
