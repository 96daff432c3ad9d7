"""YAML → a tree of values that remember where they came from.

PyYAML's safe loader would lose line numbers and quietly accept duplicate keys, YAML 1.1 quirks
(`on` is true, `1e-3` is a string) and tags. We compose the node graph with the safe loader (no
object is ever constructed from a tag) and resolve scalars ourselves with small, explicit rules.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, Union

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


# (offset in the scalar's text, line, column) where each source line of a scalar begins
Pieces = Tuple[Tuple[int, int, int], ...]


@dataclass(frozen=True)
class YNode:
    """One YAML value with its location. `value` is a dict of YNode, a list of YNode or a scalar."""

    value: Union[Dict[str, "YNode"], List["YNode"], str, int, float, bool, None]
    loc: Loc                                          # where the value's text starts
    quoted: bool = False                              # a quoted scalar is always a string
    keys: Dict[str, Loc] = field(default_factory=dict)  # a mapping's keys and where they are
    pieces: Pieces = ()                               # a scalar's text positions, line by line

    def key_loc(self, key: str) -> Loc:
        return self.keys.get(key, self.loc)

    def position(self, offset: int) -> Loc:
        """Where character `offset` of a scalar's text is in the file."""
        if not self.pieces:
            return Loc(self.loc.file, self.loc.line, self.loc.col + offset)
        start, line, col = max((p for p in self.pieces if p[0] <= offset), default=self.pieces[0])
        return Loc(self.loc.file, line, col + max(offset - start, 0))


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


def _pieces(node: yaml.ScalarNode, lines: List[str]) -> Pieces:
    """Map a scalar's (folded) text back to source lines: each line break of a plain, quoted or
    block scalar is one character of its text (a space or a newline)."""
    first, col = node.start_mark.line, node.start_mark.column
    last = node.end_mark.line
    if node.style in ("|", ">"):
        stop = min(last if node.end_mark.column == 0 else last + 1, len(lines))
        body = [i for i in range(first + 1, stop) if lines[i].strip()]
        if not body:
            return ()
        indent = len(lines[body[0]]) - len(lines[body[0]].lstrip())
        out, offset = [], 0
        for i in range(first + 1, stop):
            if i > body[-1]:
                break
            out.append((offset, i + 1, indent + 1))
            offset += len(lines[i][indent:].rstrip()) + 1
        return tuple(out)
    skip = 1 if node.style in ("'", '"') else 0
    out = [(0, first + 1, col + 1 + skip)]
    offset = len(lines[first][col + skip:].rstrip()) + 1 if first < len(lines) else 0
    for i in range(first + 1, min(last + 1, len(lines))):
        stripped = lines[i].lstrip()
        if not stripped:
            continue
        out.append((offset, i + 1, len(lines[i]) - len(stripped) + 1))
        offset += len(stripped.rstrip()) + 1
    return tuple(out)


class _Converter:
    def __init__(self, text: str, file: str):
        self.text, self.file = text, file
        self.lines = text.splitlines()
        self.seen: set = set()

    def loc(self, node: yaml.Node) -> Loc:
        return _loc(node, self.file)

    def convert(self, node: yaml.Node, depth: int = 0) -> YNode:
        loc = self.loc(node)
        if depth > 50:
            raise SpecError("the document nests deeper than 50 levels", loc)
        if id(node) in self.seen and not isinstance(node, yaml.ScalarNode) or \
                self.text[node.start_mark.index:node.start_mark.index + 1] == "*":
            raise SpecError("YAML aliases (*name) are not supported; write the value out", loc)
        self.seen.add(id(node))
        if self.text[node.start_mark.index:node.start_mark.index + 1] in ("!", "&"):
            what = "tags (!...)" if self.text[node.start_mark.index] == "!" else "anchors (&name)"
            raise SpecError(f"YAML {what} are not supported; declarations use plain maps, lists, "
                            "strings and numbers (quote a value to make it a string)", loc)
        if node.tag not in _ALLOWED_TAGS:
            raise SpecError(f"YAML tag {node.tag!r} is not allowed; declarations use plain maps, "
                            "lists, strings and numbers", loc)
        if isinstance(node, yaml.MappingNode):
            out: Dict[str, YNode] = {}
            keys: Dict[str, Loc] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise SpecError("a mapping key must be a plain name", self.loc(key_node))
                key = key_node.value
                if key == "<<":
                    raise SpecError("YAML merge keys (<<) are not supported; write the keys out",
                                    self.loc(key_node))
                if key in out:
                    raise SpecError(f"duplicate key {key!r} (first given on line {keys[key].line})",
                                    self.loc(key_node))
                keys[key] = self.loc(key_node)
                out[key] = self.convert(value_node, depth + 1)
            return YNode(out, loc, keys=keys)
        if isinstance(node, yaml.SequenceNode):
            return YNode([self.convert(v, depth + 1) for v in node.value], loc)
        quoted = node.style in ("'", '"', "|", ">")
        pieces = _pieces(node, self.lines)
        if pieces:
            loc = Loc(self.file, pieces[0][1], pieces[0][2])
        return YNode(_scalar(node.value, quoted), loc, quoted, pieces=pieces)


_OPEN_INTERVAL = re.compile(r"[\[(]\s*[-+.\w]+\s*,\s*[-+.\w]+\s*[\])]")


def interval_hint(text: str, line: int) -> str:
    """A hint when a line around `line` holds an unquoted interval with an open end: YAML
    reads `[0, 1)` as the start of a list and `(0, 1]` as text up to the comma."""
    lines = text.splitlines()
    for near in lines[max(line - 2, 0):line + 1]:
        for m in _OPEN_INTERVAL.finditer(near):
            if not (m.group()[0] == "[" and m.group()[-1] == "]") and \
                    f'"{m.group()}"' not in near and f"'{m.group()}'" not in near:
                return (f"; an interval with an open end must be quoted, as in "
                        f"range: \"{m.group()}\"")
    return ""


def load_yaml(text: str, file: str) -> YNode:
    """Parse one YAML document into located nodes; every failure is a SpecError naming file:line."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        # "while scanning a quoted scalar" (context, where it began) + "found ..." (problem)
        ctx, cm, pm = exc.context, exc.context_mark, exc.problem_mark
        mark = cm if cm is not None and pm is not None and pm.index >= len(text.rstrip()) else (pm or cm)
        loc = Loc(file, mark.line + 1, mark.column + 1) if mark else Loc(file, 1)
        detail = exc.problem or ""
        if ctx:
            where = f" (line {cm.line + 1})" if cm is not None and mark is not cm else ""
            detail = f"{ctx}{where}: {detail}" if detail else ctx
        raise SpecError(f"invalid YAML: {detail}{interval_hint(text, loc.line)}", loc) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", Loc(file, 1)) from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.value.strip() in ("", "~", "null")):
        raise SpecError("the file is empty; an operator declaration is a YAML mapping", Loc(file, 1))
    return _Converter(text, file).convert(root)
