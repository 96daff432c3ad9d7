"""YAML → a tree of values that remember where they came from.

PyYAML's safe loader would lose line numbers and quietly accept duplicate keys, YAML 1.1 quirks
(`on` is true, `1e-3` is a string) and tags. We compose the node graph with the safe loader (no
object is ever constructed from a tag) and resolve scalars ourselves with small, explicit rules.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Union

import yaml

from ..errors import Loc, SpecError

_ALLOWED_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "timestamp", "seq", "map", "value")
}
_INT = re.compile(r"[-+]?[0-9]+\Z")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
_SPECIAL_FLOATS = {
    ".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, "inf": math.inf,
    "+inf": math.inf, "-inf": -math.inf, ".nan": math.nan, "nan": math.nan,
}


@dataclass(frozen=True)
class YNode:
    """One YAML value with its location. `value` is a dict of YNode, a list of YNode or a scalar."""

    value: Union[Dict[str, "YNode"], List["YNode"], str, int, float, bool, None]
    loc: Loc
    quoted: bool = False  # a quoted scalar is always a string

    def plain(self) -> Any:
        """The value with locations stripped (for canonical hashing and display)."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


def _loc(node: yaml.Node, file: str) -> Loc:
    return Loc(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _scalar(text: str, quoted: bool) -> Any:
    if quoted:
        return text
    low = text.lower()
    if low in ("", "~", "null"):
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if low in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[low]
    return text


def _convert(node: yaml.Node, file: str, depth: int = 0) -> YNode:
    loc = _loc(node, file)
    if depth > 50:
        raise SpecError("the document nests deeper than 50 levels", loc)
    if node.tag not in _ALLOWED_TAGS:
        raise SpecError(
            f"YAML tag {node.tag!r} is not allowed; declarations use plain maps, lists, "
            "strings and numbers", loc)
    if isinstance(node, yaml.MappingNode):
        out: Dict[str, YNode] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError("a mapping key must be a plain name", _loc(key_node, file))
            key = key_node.value
            if key == "<<":
                raise SpecError("YAML merge keys (<<) are not supported; write the keys out",
                                _loc(key_node, file))
            if key in out:
                first = out[key].loc.line
                raise SpecError(f"duplicate key {key!r} (first given on line {first})",
                                _loc(key_node, file))
            out[key] = _convert(value_node, file, depth + 1)
        return YNode(out, loc)
    if isinstance(node, yaml.SequenceNode):
        return YNode([_convert(v, file, depth + 1) for v in node.value], loc)
    quoted = node.style in ("'", '"', "|", ">")
    return YNode(_scalar(node.value, quoted), loc, quoted)


def load_yaml(text: str, file: str) -> YNode:
    """Parse one YAML document into located nodes; every failure is a SpecError naming file:line."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Loc(file, mark.line + 1, mark.column + 1) if mark else Loc(file, 1)
        raise SpecError(f"invalid YAML: {exc.problem or exc.context}", loc) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", Loc(file, 1)) from None
    if root is None:
        raise SpecError("the file is empty; an operator declaration is a YAML mapping", Loc(file, 1))
    return _convert(root, file)
