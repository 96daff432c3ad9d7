"""Check a YAML declaration and build the frozen OpSpec; every error names file:line."""
from __future__ import annotations

import dataclasses
import difflib
import keyword
import math
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from ..errors import Loc, SpecError
from ..kinds import AttrType, Layout
from ..quantize import fixed_point
from .model import (ATTR_TYPES, DTYPES, FINFO, FLOAT_DTYPES, LAYOUTS, RESERVED_NAMES, AttrSpec,
                    Binding, DtypeLimit, InputSpec, Interval, OpSpec, OutputSpec, Scalar,
                    ScheduleSpec)
from .yamlnodes import YNode, interval_hint, load_yaml

_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
_OP_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
_INTERVAL = re.compile(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])\s*\Z")
_DEFAULT_DOMAIN = (-3.0, 3.0)
_KIND_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "true or false",
               int: "an integer", float: "a number"}


def _kind(value: object) -> str:
    if value is None:
        return "nothing (null)"
    for t, name in _KIND_NAMES.items():
        if type(value) is t:
            return f"{name} ({value!r})" if t in (str, int, float, bool) else name
    return type(value).__name__


class _Map:
    """Reads the keys of one YAML mapping; keys never read are reported as unknown."""

    def __init__(self, node: YNode, where: str, allowed: Optional[Tuple[str, ...]]):
        if not isinstance(node.value, dict):
            raise SpecError(f"{where}: expected a mapping of keys, got {_kind(node.value)}", node.loc)
        self.node, self.where, self.allowed = node, where, allowed
        self.value: Dict[str, YNode] = node.value
        if allowed is None:  # keys are names, checked by the caller
            return
        for key in self.value:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of: {', '.join(allowed)}"
                loc = node.key_loc(key)
                if key.endswith((")", "]")):  # the far end of an unquoted interval
                    hint += interval_hint(_TEXTS.get(loc.file, ""), loc.line)
                raise SpecError(f"{where}: unknown key {key!r}{hint}", loc)

    def get(self, key: str) -> Optional[YNode]:
        return self.value.get(key)

    def need(self, key: str) -> YNode:
        child = self.get(key)
        if child is None:
            raise SpecError(f"{self.where}: missing required key {key!r}", self.node.loc)
        return child


def _string(node: YNode, where: str) -> str:
    if not isinstance(node.value, str):
        raise SpecError(f"{where}: expected a string, got {_kind(node.value)}", node.loc)
    return node.value


def _ident(node_or_text, loc: Loc, where: str, what: str = "name") -> str:
    text = node_or_text
    if not isinstance(text, str) or not _IDENT.match(text) or keyword.iskeyword(text):
        raise SpecError(
            f"{where}: {what} {text!r} is not allowed; use letters, digits and underscores, "
            "starting with a letter (at most 64 characters, not a Python keyword)", loc)
    return text


def _number(node: YNode, where: str, integer: bool = False) -> float:
    v = node.value
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise SpecError(f"{where}: expected {'an integer' if integer else 'a number'}, got {_kind(v)}",
                        node.loc)
    return v


def _list(node: YNode, where: str) -> List[YNode]:
    if not isinstance(node.value, list):
        raise SpecError(f"{where}: expected a list, got {_kind(node.value)}", node.loc)
    return node.value


def _choices(node: YNode, where: str, allowed: Tuple[str, ...]) -> Tuple[str, ...]:
    items = _list(node, where)
    if not items:
        raise SpecError(f"{where}: the list is empty; give at least one of: {', '.join(allowed)}", node.loc)
    out: List[str] = []
    for item in items:
        value = item.value
        if not isinstance(value, str) or value not in allowed:
            raise SpecError(f"{where}: {value!r} is not one of: {', '.join(allowed)}", item.loc)
        if value in out:
            raise SpecError(f"{where}: {value!r} is listed twice", item.loc)
        out.append(value)
    return tuple(out)


def _bool(node: YNode, where: str) -> bool:
    if not isinstance(node.value, bool):
        raise SpecError(f"{where}: expected true or false, got {_kind(node.value)}", node.loc)
    return node.value


def _interval(node: YNode, where: str) -> Interval:
    """`[low, high]` (closed) or interval notation such as `"(0, inf]"`."""
    if isinstance(node.value, list):
        items = node.value
        if len(items) != 2:
            raise SpecError(f"{where}: expected [low, high], got a list of {len(items)}", node.loc)
        low, high = (_number(i, where) for i in items)
        iv = Interval(float(low), float(high))
    elif isinstance(node.value, str) and (m := _INTERVAL.match(node.value)):
        lb, lo, hi, rb = m.groups()
        try:
            iv = Interval(float(lo), float(hi), lb == "(", rb == ")")
        except ValueError:
            raise SpecError(f"{where}: cannot read the bounds of {node.value!r}", node.loc) from None
    else:
        raise SpecError(f"{where}: expected [low, high] or an interval such as \"(0, inf]\", "
                        f"got {_kind(node.value)}", node.loc)
    if math.isnan(iv.low) or math.isnan(iv.high) or iv.low > iv.high:
        raise SpecError(f"{where}: expected low <= high, got {iv}", node.loc)
    if iv.low == iv.high and (iv.low_open or iv.high_open):
        raise SpecError(f"{where}: the interval {iv} holds no value; close it or widen it", node.loc)
    return iv


def _check_name(name: str, loc: Loc, where: str, taken: Dict[str, str]) -> str:
    _ident(name, loc, where)
    if name in RESERVED_NAMES:
        raise SpecError(f"{where}: {name!r} is reserved for a call keyword; pick another name", loc)
    if name.lower() in taken:
        raise SpecError(f"{where}: {name!r} is already used as {taken[name.lower()]}", loc)
    return name


def _inputs(node: YNode, taken: Dict[str, str]) -> Tuple[InputSpec, ...]:
    m = _Map(node, "inputs", None)  # keys are names, checked one by one below
    specs: List[InputSpec] = []
    for name, child in m.value.items():
        where = f"inputs.{name}"
        _check_name(name, node.key_loc(name), "inputs", taken)
        f = _Map(child, where, ("dtypes", "layouts", "shape", "differentiable", "domain", "optional"))
        dtypes = _choices(f.need("dtypes"), f"{where}.dtypes", DTYPES)
        layouts_node = f.get("layouts")
        layouts = tuple(map(Layout, _choices(layouts_node, f"{where}.layouts", LAYOUTS))) \
            if layouts_node else (Layout.ND,)
        shape: Optional[Tuple[str, ...]] = None
        sn = f.get("shape")
        if sn is not None:
            dims = [_ident(d.value, d.loc, f"{where}.shape", "dim name") for d in _list(sn, f"{where}.shape")]
            if not dims:
                raise SpecError(f"{where}.shape: give at least one dim name", sn.loc)
            if len(set(dims)) != len(dims):
                raise SpecError(f"{where}.shape: a dim name is repeated in {dims}", sn.loc)
            if layouts_node and layouts != (Layout.ND,):
                raise SpecError(f"{where}: give either shape or a 4-d layout list, not both "
                                "(a layout already names the dims N, C, H, W)", sn.loc)
            shape = tuple(dims)
        diff_node = f.get("differentiable")
        differentiable = _bool(diff_node, f"{where}.differentiable") if diff_node else True
        if differentiable and not any(d in FLOAT_DTYPES for d in dtypes):
            differentiable = False
        domain = _DEFAULT_DOMAIN
        dn = f.get("domain")
        if dn is not None:
            iv = _interval(dn, f"{where}.domain")
            if not (math.isfinite(iv.low) and math.isfinite(iv.high)) or iv.low == iv.high:
                raise SpecError(f"{where}.domain: expected finite bounds low < high, got {iv}",
                                dn.loc)
            domain = (iv.low, iv.high)
        optional = False
        on = f.get("optional")
        if on is not None:
            optional = _bool(on, f"{where}.optional")
            if optional and not specs:
                raise SpecError(f"{where}.optional: the first input cannot be optional (it sets "
                                "the call's shape and dtype); put optional inputs after it", on.loc)
        if not optional and specs and specs[-1].optional:
            raise SpecError(f"inputs.{name}: comes after the optional input {specs[-1].name!r}; "
                            "declare the inputs every call gives first, then the optional ones",
                            node.key_loc(name))
        taken[name.lower()] = "an input"
        specs.append(InputSpec(name, dtypes, layouts, layouts_node is not None, shape,
                               differentiable, domain, node.key_loc(name), optional))
    if not specs:
        raise SpecError("inputs: declare at least one input", m.node.loc)
    return tuple(specs)


_FINFO = re.compile(r"finfo\.(\w+)\Z")


def _attr_value(node: YNode, where: str, typ: AttrType,
                choices: Tuple[str, ...] = ()) -> Union[float, int, bool, str, DtypeLimit]:
    v = node.value
    if typ == AttrType.BOOL:
        return _bool(node, where)
    if typ == AttrType.STR:
        if not isinstance(v, str) or v not in choices:
            raise SpecError(f"{where}: expected one of the choices {', '.join(map(repr, choices))}, "
                            f"got {_kind(v)}", node.loc)
        return v
    if typ == AttrType.FLOAT and isinstance(v, str) and (m := _FINFO.match(v)):
        which = m.group(1)
        if which not in FINFO:
            raise SpecError(f"{where}: finfo.{which} is not known; use one of "
                            f"{', '.join('finfo.' + w for w in FINFO)}", node.loc)
        return DtypeLimit(which)
    if typ == AttrType.INT:
        return int(_number(node, where, integer=True))
    number = float(_number(node, where))
    if math.isnan(number):
        raise SpecError(f"{where}: expected a number, got nan", node.loc)
    return number


def _attrs(node: Optional[YNode], taken: Dict[str, str]) -> Tuple[AttrSpec, ...]:
    if node is None:
        return ()
    m = _Map(node, "attrs", None)
    specs: List[AttrSpec] = []
    for name, child in m.value.items():
        where = f"attrs.{name}"
        _check_name(name, node.key_loc(name), "attrs", taken)
        f = _Map(child, where, ("type", "default", "range", "null_means", "quantize", "choices"))
        typ_node = f.need("type")
        if not isinstance(typ_node.value, str) or typ_node.value not in ATTR_TYPES:
            raise SpecError(f"{where}.type: expected one of {', '.join(ATTR_TYPES)}, got {_kind(typ_node.value)}",
                            typ_node.loc)
        typ = AttrType(typ_node.value)
        choices = _str_choices(f, where, typ)
        rng: Optional[Interval] = None
        rn = f.get("range")
        if rn is not None:
            rng = _interval(rn, f"{where}.range")
            if typ == AttrType.INT:
                rng = dataclasses.replace(rng, integral=True)
            if typ in (AttrType.BOOL, AttrType.STR):
                raise SpecError(f"{where}.range: a {typ} attr takes no range", rn.loc)
        null_means = None
        nn = f.get("null_means")
        if nn is not None:
            if typ != AttrType.FLOAT:
                raise SpecError(f"{where}.null_means: only float attrs can be null", nn.loc)
            null_means = float(_number(nn, f"{where}.null_means"))
        quantize = None
        qn = f.get("quantize")
        if qn is not None:
            if typ != AttrType.FLOAT:
                raise SpecError(f"{where}.quantize: only float attrs can be quantized", qn.loc)
            quantize = int(_number(qn, f"{where}.quantize", integer=True))
            if not 1 <= quantize <= 15:
                raise SpecError(f"{where}.quantize: expected a number of bits in 1..15, got {quantize}",
                                qn.loc)
        dn = f.get("default")
        required = dn is None  # no default key (`default: null` is the branch below)
        default: Union[Scalar, DtypeLimit] = None
        if dn is not None and dn.value is None:
            if null_means is None:
                raise SpecError(f"{where}.default: null is only allowed with null_means "
                                "(the value the attr takes in expressions when it is null)", dn.loc)
        elif dn is not None:
            default = _attr_value(dn, f"{where}.default", typ, choices)
            if rng is not None and not isinstance(default, (DtypeLimit, str)) and default not in rng:
                raise SpecError(f"{where}.default: {default!r} is outside the range {rng}", dn.loc)
            if quantize is not None:
                # a quantized attr is a float attr: its default is a number or a dtype limit
                if not isinstance(default, float):
                    raise SpecError(f"{where}.default: a quantized attr needs a number, not "
                                    f"{default!r}", dn.loc)
                try:
                    fixed_point(default, quantize)
                except ValueError as exc:
                    raise SpecError(f"{where}.default: {exc}", dn.loc) from None
        taken[name.lower()] = "an attr"
        specs.append(AttrSpec(name, typ, default, required, rng, null_means, quantize,
                              node.key_loc(name), choices))
    return tuple(specs)


def _str_choices(f: "_Map", where: str, typ: AttrType) -> Tuple[str, ...]:
    """The choices of a str attr: names, each of which compiles to kernels of its own."""
    cn = f.get("choices")
    if typ != AttrType.STR:
        if cn is not None:
            raise SpecError(f"{where}.choices: only str attrs take choices", cn.loc)
        return ()
    if cn is None:
        raise SpecError(f"{where}: a str attr needs `choices: [...]`, the values it may take",
                        f.node.loc)
    items = _list(cn, f"{where}.choices")
    if not items:
        raise SpecError(f"{where}.choices: give at least one choice", cn.loc)
    out: List[str] = []
    for item in items:
        value = item.value
        if not isinstance(value, str) or not _IDENT.match(value) or keyword.iskeyword(value):
            raise SpecError(f"{where}.choices: {value!r} is not allowed; a choice is a name of "
                            "letters, digits and underscores, starting with a letter", item.loc)
        if value in out:
            raise SpecError(f"{where}.choices: {value!r} is listed twice", item.loc)
        out.append(value)
    return tuple(out)


def _outputs(node: YNode, taken: Dict[str, str], inputs: Tuple[InputSpec, ...]) -> Tuple[OutputSpec, ...]:
    m = _Map(node, "outputs", None)
    specs: List[OutputSpec] = []
    for name, child in m.value.items():
        where = f"outputs.{name}"
        _check_name(name, node.key_loc(name), "outputs", taken)
        like: Optional[str] = None
        if child.value is not None:
            f = _Map(child, where, ("like",))
            ln = f.get("like")
            if ln is not None:
                like = _string(ln, f"{where}.like")
                if like not in [i.name for i in inputs]:
                    raise SpecError(f"{where}.like: {like!r} is not an input; expected one of: "
                                    f"{', '.join(i.name for i in inputs)}", ln.loc)
                if next(i for i in inputs if i.name == like).optional:
                    raise SpecError(f"{where}.like: {like!r} is optional, so it cannot give the "
                                    "output its shape; name an input every call has", ln.loc)
        taken[name.lower()] = "an output"
        specs.append(OutputSpec(name, like, node.key_loc(name)))
    if not specs:
        raise SpecError("outputs: declare at least one output", node.loc)
    return tuple(specs)


def _bindings(node: YNode, section: str) -> Tuple[Binding, ...]:
    m = _Map(node, section, None)
    out: List[Binding] = []
    for name, child in m.value.items():
        _ident(name, node.key_loc(name), section)
        if isinstance(child.value, bool) or not isinstance(child.value, (str, int, float)):
            hint = ""
            if child.value is None:
                hint = ("; inside {...} commas separate entries, so quote the expression or give "
                        "each line its own `name: expression` row")
            raise SpecError(f"{section}.{name}: expected an expression, got {_kind(child.value)}{hint}",
                            node.key_loc(name))
        text = child.value if isinstance(child.value, str) else repr(child.value)
        out.append(Binding(name, text, child.loc, node.key_loc(name), child.pieces))
    if not out:
        raise SpecError(f"{section}: give at least one `name: expression` line", node.loc)
    return tuple(out)


def _schedule(node: Optional[YNode], inputs: Tuple[InputSpec, ...],
              outputs: Tuple[OutputSpec, ...]) -> ScheduleSpec:
    if node is None:
        return ScheduleSpec()
    f = _Map(node, "schedule", ("inplace", "tile", "parallel_threshold", "threads", "fuse"))
    inplace: List[Tuple[str, str]] = []
    ip = f.get("inplace")
    if ip is not None:
        for out_name, in_node in _Map(ip, "schedule.inplace", None).value.items():
            if out_name not in [o.name for o in outputs]:
                raise SpecError(f"schedule.inplace: {out_name!r} is not an output", in_node.loc)
            in_name = _string(in_node, f"schedule.inplace.{out_name}")
            if in_name not in [i.name for i in inputs]:
                raise SpecError(f"schedule.inplace.{out_name}: {in_name!r} is not an input", in_node.loc)
            inplace.append((out_name, in_name))

    def positive(key: str, low: int, high: int) -> Optional[int]:
        n = f.get(key)
        if n is None:
            return None
        v = int(_number(n, f"schedule.{key}", integer=True))
        if not low <= v <= high:
            raise SpecError(f"schedule.{key}: expected an integer in {low}..{high}, got {v}", n.loc)
        return v

    tile = positive("tile", 16, 65536)
    if tile is not None and tile % 16:
        raise SpecError(f"schedule.tile: expected a multiple of 16 (a full vector), got {tile}",
                        f.need("tile").loc)
    return ScheduleSpec(tuple(inplace), tile, positive("parallel_threshold", 0, 1 << 40),
                        positive("threads", 1, 1024), node.loc, _fuse_mode(f.get("fuse")))


FUSE_MODES = ("auto", "required")


def _fuse_mode(n: Optional[YNode]) -> str:
    """schedule.fuse: `required` makes every unfused consumer of a conv2d or matmul an error."""
    if n is None:
        return "auto"
    mode = _string(n, "schedule.fuse")
    if mode not in FUSE_MODES:
        raise SpecError(f"schedule.fuse: expected one of {', '.join(FUSE_MODES)}, got {mode!r}", n.loc)
    return mode


_TOP_KEYS = ("name", "summary", "inputs", "attrs", "outputs", "forward", "backward", "schedule",
             "precision_reduce")


_TEXTS: Dict[str, str] = {}  # the text being checked, by file name (for hints on its lines)


def parse_spec(text: str, file: str) -> OpSpec:
    """Check one declaration given as YAML text; `file` names it in error messages."""
    _TEXTS[file] = text
    try:
        return _parse(text, file)
    finally:
        _TEXTS.pop(file, None)


def _parse(text: str, file: str) -> OpSpec:
    root = load_yaml(text, file)
    top = _Map(root, "the declaration", _TOP_KEYS)
    name_node = top.need("name")
    name = _string(name_node, "name")
    if not _OP_NAME.match(name):
        raise SpecError(f"name: {name!r} is not allowed; use lower-case letters, digits and "
                        "underscores, starting with a letter", name_node.loc)
    sn = top.get("summary")
    summary = _string(sn, "summary") if sn is not None else ""
    taken: Dict[str, str] = {}
    inputs = _inputs(top.need("inputs"), taken)
    attrs = _attrs(top.get("attrs"), taken)
    outputs = _outputs(top.need("outputs"), taken, inputs)
    for o in outputs:
        cot = "d" + o.name
        if cot.lower() in taken and taken[cot.lower()] != "an output":
            raise SpecError(f"outputs.{o.name}: its gradient is called {cot!r} in backward "
                            f"expressions, which is already {taken[cot.lower()]}", o.loc)
    forward = _bindings(top.need("forward"), "forward")
    bn = top.get("backward")
    backward = _bindings(bn, "backward") if bn is not None else None
    schedule = _schedule(top.get("schedule"), inputs, outputs)
    pr = top.get("precision_reduce")
    precision_reduce = _bool(pr, "precision_reduce") if pr is not None else False
    spec = OpSpec(name, summary, inputs, attrs, outputs, forward, backward, schedule,
                  precision_reduce, file, root.loc, text)
    if not spec.dtypes:
        raise SpecError("inputs: the inputs share no dtype, so no kernel can be compiled; "
                        "give every input at least one common dtype", root.key_loc("inputs"))
    return spec


def load_spec(path: Union[str, "os.PathLike[str]"]) -> OpSpec:
    """Read and check one declaration file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError("the file is not UTF-8 text", Loc(str(p), 1)) from None
    return parse_spec(text, str(p))
