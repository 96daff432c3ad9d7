"""The checked operator declaration: frozen dataclasses that keep their source locations."""
from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from ..errors import Loc
from ..kinds import AttrType, Layout

# bfloat16 arrays need ml_dtypes (the NumPy dtype package of JAX and TensorFlow)
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")
INT_DTYPES = ("int8", "int16", "int32")
DTYPES = FLOAT_DTYPES + INT_DTYPES
LAYOUTS = tuple(Layout)
# The logical dims that a 4-d layout names, and their physical order in memory. Keyed by Layout
# members, which hash and compare as their names: a layout a call names as text finds its entry.
LAYOUT_DIMS: Dict[str, Tuple[str, ...]] = {
    Layout.NCHW: ("N", "C", "H", "W"), Layout.NHWC: ("N", "C", "H", "W")}
LAYOUT_PHYSICAL: Dict[str, Tuple[str, ...]] = {
    Layout.NCHW: ("N", "C", "H", "W"), Layout.NHWC: ("N", "H", "W", "C")}
ATTR_TYPES = tuple(AttrType)
# the limits of a float dtype that declarations may name (`finfo.max` ...), as NumPy's finfo
FINFO = ("max", "min", "eps", "tiny")
# Keywords every operator call accepts; no input, attr or output may take these names.
RESERVED_NAMES = ("out", "layout", "precision_mode", "clip", "self", "name", "spec", "backward")

Scalar = Union[float, int, bool, str, None]


@dataclass(frozen=True)
class DtypeLimit:
    """`finfo.max` and its kin: a number that depends on the call's dtype (the storage dtype of
    its float data: 65504 for float16), as NumPy's `np.finfo(dtype).<which>`."""

    which: str

    def value(self, dtype) -> float:
        import numpy as np
        return float(getattr(np.finfo(dtype), self.which))

    def __repr__(self) -> str:
        return f"finfo.{self.which}"


class _Text(str):
    """A piece of `_expr_form`'s output, told apart from the string values of the tree."""


def _expr_form(text: str) -> str:
    """An expression's syntax tree as text: spacing and parentheses that change nothing vanish.
    Walked with a stack, not recursively as `ast.dump` is: an expression may nest as deep as
    the parser's operator limit allows, past Python's recursion limit."""
    try:
        tree = ast.parse(text.strip().replace("\n", " "), mode="eval")
    except SyntaxError:
        return text
    out: List[str] = []
    todo: List[object] = [tree]
    while todo:
        item = todo.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, ast.AST):
            fields = [value for _, value in ast.iter_fields(item)]
            todo += [_Text(")"), *fields[::-1], _Text(type(item).__name__ + "(")]
        elif isinstance(item, list):
            todo += [_Text("]"), *item[::-1], _Text("[")]
        else:
            out.append(repr(item))
    return " ".join(out)


@dataclass(frozen=True)
class Interval:
    """A closed, open or half-open interval of allowed attribute values."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integral: bool = False  # the bounds of an int attr print as integers

    def __contains__(self, v: float) -> bool:
        if v != v:  # NaN is in no interval
            return False
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def __str__(self) -> str:
        def num(x: float) -> str:
            if x in (math.inf, -math.inf):
                return "inf" if x > 0 else "-inf"
            return repr(int(x)) if self.integral and x == int(x) else repr(x)
        return f"{'(' if self.low_open else '['}{num(self.low)}, {num(self.high)}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtypes: Tuple[str, ...]
    layouts: Tuple[Layout, ...]       # the layouts this input accepts; ("ND",) when not declared
    layouts_declared: bool            # False: the input is layout-agnostic (broadcast by position)
    shape: Optional[Tuple[str, ...]]  # named dims, e.g. ("N", "K"); None: any rank
    differentiable: bool
    domain: Tuple[float, float]       # where validation samples values
    loc: Loc
    optional: bool = False            # may be None at call time (is_given(name) tells)


@dataclass(frozen=True)
class AttrSpec:
    name: str
    type: AttrType
    default: Union[Scalar, DtypeLimit]  # a DtypeLimit takes its value from the call's dtype
    required: bool
    range: Optional[Interval]
    null_means: Optional[float]       # value a None (null) attr takes inside expressions
    quantize: Optional[int]           # fixed-point bits: the attr is m / 2**bits (integer kernels)
    loc: Loc
    choices: Tuple[str, ...] = ()     # the values of a str attr; each compiles to its own kernels

    @property
    def nullable(self) -> bool:
        return self.null_means is not None

    def conditions(self) -> Tuple[Tuple[str, Optional[float]], ...]:
        """What a call's number must satisfy beyond its type, as comparisons `value OP bound`;
        a bound of None compares the value with itself (it is not NaN). The checked call
        (runtime/bind.py) and the generated direct call both test exactly these."""
        out: List[Tuple[str, Optional[float]]] = []
        r = self.range
        if r is not None:
            if r.low != -math.inf or r.low_open:
                out.append((">" if r.low_open else ">=", r.low))
            if r.high != math.inf or r.high_open:
                out.append(("<" if r.high_open else "<=", r.high))
        if self.type == AttrType.FLOAT:
            out.append(("==", None))  # last: NaN fails a range first, and is named there
        return tuple(out)


@dataclass(frozen=True)
class OutputSpec:
    name: str
    like: Optional[str]               # the input whose shape, dtype and memory order it takes
    loc: Loc


@dataclass(frozen=True)
class Binding:
    """One `name: expression` line of forward: or backward:."""

    name: str
    expr: str
    loc: Loc          # where the expression text starts
    name_loc: Loc     # where the name is written
    pieces: tuple = ()  # (text offset, line, col) of each source line of the expression


@dataclass(frozen=True)
class ScheduleSpec:
    inplace: Tuple[Tuple[str, str], ...] = ()     # (output, input) pairs that may share memory
    tile: Optional[int] = None                     # elements per tile of the strided path
    parallel_threshold: Optional[int] = None       # elements below which one thread runs
    threads: Optional[int] = None                  # upper bound on threads; None: all cores
    loc: Optional[Loc] = None
    fuse: str = "auto"                             # required: unfused epilogues are errors


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    inputs: Tuple[InputSpec, ...]
    attrs: Tuple[AttrSpec, ...]
    outputs: Tuple[OutputSpec, ...]
    forward: Tuple[Binding, ...]
    backward: Optional[Tuple[Binding, ...]]
    schedule: ScheduleSpec
    precision_reduce: bool            # allow_mix_precision may run float32 calls in float16
    file: str
    loc: Loc
    source: str = field(repr=False, compare=False, default="")  # the file's text, for `opkit show`

    def input(self, name: str) -> InputSpec:
        return next(i for i in self.inputs if i.name == name)

    def attr(self, name: str) -> AttrSpec:
        return next(a for a in self.attrs if a.name == name)

    def attr_type(self, name: str) -> AttrType:
        """The type of an attr a kernel reads: a declared one's, or float for the dtype limits
        (`finfo.max` ...) the runtime passes like attrs."""
        return AttrType.FLOAT if name.startswith("finfo.") else self.attr(name).type

    @functools.cached_property
    def input_names(self) -> Tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @functools.cached_property
    def attr_names(self) -> Tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @functools.cached_property
    def output_names(self) -> Tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    @functools.cached_property
    def dtypes(self) -> Tuple[str, ...]:
        """The dtypes kernels are compiled for: those every array input accepts."""
        common = [d for d in DTYPES if all(d in i.dtypes for i in self.inputs)]
        return tuple(common)

    @functools.cached_property
    def float_dtypes(self) -> Tuple[str, ...]:
        return tuple(d for d in self.dtypes if d in FLOAT_DTYPES)

    @functools.cached_property
    def int_dtypes(self) -> Tuple[str, ...]:
        return tuple(d for d in self.dtypes if d in INT_DTYPES)

    @functools.cached_property
    def layouts(self) -> Tuple[Layout, ...]:
        """The layouts a call may name; the first is the default."""
        seen: List[Layout] = []
        for i in self.inputs:
            if i.layouts_declared:
                for layout in i.layouts:
                    if layout not in seen:
                        seen.append(layout)
        return tuple(seen) or (Layout.ND,)

    def canonical(self) -> dict:
        """A location-free description of everything that affects generated code."""
        return {
            "name": self.name,
            "inputs": [[i.name, list(i.dtypes), list(i.layouts), i.layouts_declared,
                        list(i.shape) if i.shape else None, i.differentiable, list(i.domain),
                        i.optional] for i in self.inputs],
            "attrs": [[a.name, a.type, repr(a.default) if isinstance(a.default, DtypeLimit)
                       else a.default, a.required, str(a.range) if a.range else None,
                       a.null_means, a.quantize, list(a.choices)] for a in self.attrs],
            "outputs": [[o.name, o.like] for o in self.outputs],
            "forward": [[b.name, _expr_form(b.expr)] for b in self.forward],
            "backward": [[b.name, _expr_form(b.expr)] for b in self.backward] if self.backward else None,
            "schedule": [list(map(list, self.schedule.inplace)), self.schedule.tile,
                         self.schedule.parallel_threshold, self.schedule.threads]
            + ([self.schedule.fuse] if self.schedule.fuse != "auto" else []),
            "precision_reduce": self.precision_reduce,
        }
