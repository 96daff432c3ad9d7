"""The closed set of primitives, each with everything the pipeline needs to know about it.

One record per primitive, in the manner of JAX's lax: its argument kinds, its NumPy meaning (the
reference), its derivative rule (reverse mode), its Cython expression and its TBE vector
instruction with a cost. Adding a primitive is one entry here.

Derivative rules take the output cotangent `g`, the node itself (for rules that reuse the output)
and the argument nodes, and return one cotangent per argument: a node, `Masked(cond, node)` (the
gradient flows only where `cond` holds) or None (no gradient flows). Rules are linear in `g`.

A primitive whose derivative jumps (a kink: where, min, max, abs) names the conditions that pick
its smooth piece in `branch`; the derivative rule selects with them, and the finite-difference
check treats a change of any of them as a kink.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from .ir import Dims, Node, const

F, B = "float", "bool"


@dataclass(frozen=True)
class Primitive:
    name: str
    arg_kinds: Tuple[str, ...]          # "float" or "bool" per argument
    out_kind: str
    numpy: Callable                      # reference meaning on float64 / bool arrays
    cython: str                          # expression; {0}.. are arguments, {f} the libm suffix;
                                         # or statements assigning {d} (using a temporary {t})
    tbe: str                             # TBE instruction (vector-vector form)
    tbe_scalar: Optional[str]            # the vector-scalar form, when TBE has one (vmuls ...)
    cost: float                          # vector instructions per element (static estimate)
    vjp: Optional[Callable] = None
    elementwise: bool = True
    doc: str = ""
    vectorizes: bool = True              # False: a libm call the C compiler keeps scalar
    # (argument nodes) -> nodes whose values name the smooth piece the primitive is in: the
    # conditions of a select, which argument min picks ... Where one changes, the derivative
    # jumps (a kink). None: no kinks
    branch: Optional[Callable] = None


@dataclass(frozen=True)
class Masked:
    """A cotangent that flows only where `cond` holds: elsewhere no gradient, not even 0 * inf."""

    cond: Node
    value: Node


PRIMITIVES: Dict[str, Primitive] = {}


def _register(p: Primitive) -> Primitive:
    PRIMITIVES[p.name] = p
    return p


# ---------------------------------------------------------------- node construction + rewrites

def _dims(args: Sequence[Node]) -> Dims:
    named = [a.dims for a in args if a.dims is not None]
    if len(named) < len(args):
        return None  # something positional: the full elementwise space
    out = []
    for d in sorted(named, key=len, reverse=True):
        out.extend(n for n in d if n not in out)
    return tuple(out)


ZERO, ONE = const(0.0), const(1.0)


def apply(name: str, *args: Node, loc=None) -> Node:
    """Build `name(args)`, folding constants and applying exact algebraic rewrites."""
    p = PRIMITIVES[name]
    if all(a.is_const for a in args):
        with np.errstate(all="ignore"):
            v = p.numpy(*[np.float64(a.value) if a.kind == F else np.bool_(a.value) for a in args])
        return const(bool(v), B) if p.out_kind == B else const(float(v))
    simplified = _simplify(name, args)
    if simplified is not None:
        return simplified
    return Node(name, tuple(args), (), p.out_kind, _dims(args), loc)


def _is(node: Node, value: float) -> bool:
    return node.is_const and node.kind == F and node.value == value


# comparisons of the same two operands that cannot both hold (NaN makes every one false but ne)
_EXCLUSIVE = {"gt": ("lt", "le", "eq"), "lt": ("gt", "ge", "eq"), "ge": ("lt",), "le": ("gt",),
              "eq": ("gt", "lt", "ne"), "ne": ("eq",)}


def _excludes(c: Node, d: Node) -> bool:
    """Where c holds, d does not."""
    return c.args == d.args and d.op in _EXCLUSIVE.get(c.op, ())


def _simplify(name: str, a: Tuple[Node, ...]) -> Optional[Node]:
    # Rewrites that never change a result; they keep derived gradients small.
    if name == "add":
        if _is(a[1], 0.0):
            return a[0]
        if _is(a[0], 0.0):
            return a[1]
    if name == "sub":
        if _is(a[1], 0.0):
            return a[0]
        if _is(a[0], 0.0):
            return apply("neg", a[1])
    if name == "mul":
        if _is(a[1], 1.0):
            return a[0]
        if _is(a[0], 1.0):
            return a[1]
        if _is(a[1], -1.0):
            return apply("neg", a[0])
        if _is(a[0], -1.0):
            return apply("neg", a[1])
    if name == "div" and _is(a[1], 1.0):
        return a[0]
    if name == "pow":
        if _is(a[1], 0.0):
            return ONE
        if _is(a[1], 1.0):
            return a[0]
        if _is(a[1], 2.0):
            return apply("mul", a[0], a[0])
    if name == "neg" and a[0].op == "neg":
        return a[0].args[0]
    if name == "not" and a[0].op == "not":
        return a[0].args[0]
    if name in ("and", "or"):
        for c, d in ((a[0], a[1]), (a[1], a[0])):
            if c.is_const:  # True & d, False | d -> d; False & d -> False, True | d -> True
                return d if c.value == (name == "and") else c
        if a[0] is a[1]:
            return a[0]
    if name == "where":
        return _simplify_where(*a)
    return None


def _simplify_where(c: Node, x: Node, y: Node) -> Optional[Node]:
    if x is y:
        return x
    if c.is_const:
        return x if c.value else y
    # inside a branch, a select on the same condition (or on one it excludes) is decided
    if x.op == "where" and (x.args[0] is c or (c.args and _excludes(c, x.args[0]))):
        return apply("where", c, x.args[1] if x.args[0] is c else x.args[2], y)
    if y.op == "where" and y.args[0] is c:
        return apply("where", c, x, y.args[2])
    # where(c, where(d, p, 0), where(d, q, 0)) -> where(d, where(c, p, q), 0)
    if x.op == y.op == "where" and x.args[0] is y.args[0] and x.args[2] is y.args[2] \
            and _is(x.args[2], 0.0):
        return apply("where", x.args[0], apply("where", c, x.args[1], y.args[1]), x.args[2])
    # where(c, where(d, p, 0), 0) -> where(c & d, p, 0)
    if x.op == "where" and _is(y, 0.0) and _is(x.args[2], 0.0):
        return apply("where", apply("and", c, x.args[0]), x.args[1], y)
    return None


def negate(c: Node) -> Node:
    """The condition that holds exactly where c does not."""
    return apply("not", c)


def select(c: Node, x: Node, y: Node, depth: int = 8) -> Node:
    """where(c, x, y) with `|` and `~` in c turned into plain selects, which GCC vectorizes in
    long chains (it gives up on chains of selects on `(x <= y) | (x != x)`); `depth` bounds
    the expansion of deeply nested conditions."""
    if depth and c.op == "or":
        return select(c.args[0], x, select(c.args[1], x, y, depth - 1), depth - 1)
    if depth and c.op == "not":
        return select(c.args[0], y, x, depth - 1)
    return apply("where", c, x, y)


def add(x, y): return apply("add", x, y)
def sub(x, y): return apply("sub", x, y)
def mul(x, y): return apply("mul", x, y)
def div(x, y): return apply("div", x, y)
def neg(x): return apply("neg", x)
def where(c, x, y): return apply("where", c, x, y)


# ------------------------------------------------------------------------------ arithmetic

def _np_min(a, b):
    return np.where((a <= b) | np.isnan(a), a, b)


def _np_max(a, b):
    return np.where((a >= b) | np.isnan(a), a, b)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_register(Primitive("add", (F, F), F, np.add, "({0} + {1})", "vadd", "vadds", 1,
                    lambda g, out, x, y: (g, g), doc="x + y"))
_register(Primitive("sub", (F, F), F, np.subtract, "({0} - {1})", "vsub", "vadds", 1,
                    lambda g, out, x, y: (g, neg(g)), doc="x - y"))
_register(Primitive("mul", (F, F), F, np.multiply, "({0} * {1})", "vmul", "vmuls", 1,
                    lambda g, out, x, y: (mul(g, y), mul(g, x)), doc="x * y"))
_register(Primitive("div", (F, F), F, np.divide, "({0} / {1})", "vdiv", "vdivs", 4,
                    lambda g, out, x, y: (div(g, y), neg(div(mul(g, out), y))), doc="x / y"))
_register(Primitive("neg", (F,), F, np.negative, "(-{0})", "vmuls", None, 1,
                    lambda g, out, x: (neg(g),), doc="-x"))


def _pow_vjp(g, out, x, e):
    return (mul(g, mul(e, apply("pow", x, apply("sub", e, ONE)))), None)


_register(Primitive("pow", (F, F), F, np.power, "pow{f}({0}, {1})", "vpow", "vpows", 12,
                    _pow_vjp, doc="x ** c, c a constant", vectorizes=False))

# ------------------------------------------------------------------------------ comparisons

for _name, _fn, _sym in (("gt", np.greater, ">"), ("ge", np.greater_equal, ">="),
                         ("lt", np.less, "<"), ("le", np.less_equal, "<="),
                         ("eq", np.equal, "=="), ("ne", np.not_equal, "!=")):
    _register(Primitive(_name, (F, F), B, _fn, "({0} %s {1})" % _sym, "vcmp" + _name, "vcmp" + _name,
                        1, None, doc=f"x {_sym} y (true/false)"))

_register(Primitive("and", (B, B), B, np.logical_and, "({0} & {1})", "vand", None, 1, None,
                    doc="c & d"))
_register(Primitive("or", (B, B), B, np.logical_or, "({0} | {1})", "vor", None, 1, None,
                    doc="c | d"))
_register(Primitive("not", (B,), B, np.logical_not, "(not {0})", "vnot", None, 1, None, doc="~c"))

# ------------------------------------------------------------------------------ selection

_register(Primitive("where", (B, F, F), F, np.where, "({1} if {0} else {2})", "vsel", None, 1,
                    lambda g, out, c, x, y: (None, Masked(c, g), Masked(negate(c), g)),
                    doc="where(c, x, y): x where c holds, else y",
                    branch=lambda c, x, y: (c,)))


def _picks_first(cmp):
    # the forward picks x where x is NaN or wins the comparison (ties included)
    return lambda x, y: (apply("or", apply("ne", x, x), apply(cmp, x, y)),)


def _minmax_vjp(branch):
    def rule(g, out, x, y):
        first, = branch(x, y)
        return Masked(first, g), Masked(negate(first), g)
    return rule


# Ties and NaN pick the first argument (NaN propagates), and so does the gradient. Two plain
# selects in a row ({t} is a temporary): GCC vectorizes chains of these, while it gives up on
# chains of selects on `(x <= y) | (x != x)`.
_register(Primitive("min", (F, F), F, _np_min,
                    "{t} = ({0} if {0} <= {1} else {1})\n{d} = ({0} if {0} != {0} else {t})",
                    "vmin", "vmins", 1, _minmax_vjp(_picks_first("le")),
                    doc="min(x, y); NaN propagates", branch=_picks_first("le")))
_register(Primitive("max", (F, F), F, _np_max,
                    "{t} = ({0} if {0} >= {1} else {1})\n{d} = ({0} if {0} != {0} else {t})",
                    "vmax", "vmaxs", 1, _minmax_vjp(_picks_first("ge")),
                    doc="max(x, y); NaN propagates", branch=_picks_first("ge")))


def _abs_branch(x):
    return apply("gt", x, ZERO), apply("lt", x, ZERO)


def _abs_vjp(g, out, x):
    pos, neg_ = _abs_branch(x)  # no gradient at 0 (nor at NaN)
    return (Masked(apply("or", neg_, pos), select(neg_, neg(g), g)),)


# ------------------------------------------------------------------------------ transcendental

_register(Primitive("exp", (F,), F, np.exp, "exp{f}({0})", "vexp", None, 10,
                    lambda g, out, x: (mul(g, out),), doc="e ** x", vectorizes=False))
_register(Primitive("expm1", (F,), F, np.expm1, "expm1{f}({0})", "vexpm1", None, 10,
                    lambda g, out, x: (mul(g, add(out, ONE)),), doc="e ** x - 1, exact near 0", vectorizes=False))
_register(Primitive("log1p", (F,), F, np.log1p, "log1p{f}({0})", "vln1p", None, 10,
                    lambda g, out, x: (div(g, add(x, ONE)),), doc="log(1 + x), exact near 0", vectorizes=False))
_register(Primitive("log", (F,), F, np.log, "log{f}({0})", "vln", None, 10,
                    lambda g, out, x: (div(g, x),), doc="natural logarithm", vectorizes=False))
_register(Primitive("sqrt", (F,), F, np.sqrt, "sqrt{f}({0})", "vsqrt", None, 4,
                    lambda g, out, x: (div(mul(g, const(0.5)), out),), doc="square root"))
_register(Primitive("abs", (F,), F, np.abs, "fabs{f}({0})", "vabs", None, 1, _abs_vjp,
                    doc="|x|; gradient 0 at 0", branch=_abs_branch))
_register(Primitive("sigmoid", (F,), F, _sigmoid, "(1 / (1 + exp{f}(-{0})))", "vsigmoid", None, 13,
                    lambda g, out, x: (mul(g, mul(out, sub(ONE, out))),),
                    doc="1 / (1 + e ** -x)", vectorizes=False))
_register(Primitive("tanh", (F,), F, np.tanh, "tanh{f}({0})", "vtanh", None, 15,
                    lambda g, out, x: (mul(g, sub(ONE, mul(out, out))),), doc="hyperbolic tangent", vectorizes=False))

# TBE has no single instruction for these; the listing shows the sequence a TBE kernel would use.
TBE_EXPANSIONS = {
    "vsigmoid": ["vmuls {d}, {0}, #-1", "vexp {d}, {d}", "vadds {d}, {d}, #1", "vrec {d}, {d}"],
    "vexpm1": ["vexp {d}, {0}", "vadds {d}, {d}, #-1"],
    "vln1p": ["vadds {d}, {0}, #1", "vln {d}, {d}"],
    "vtanh": ["vmuls {d}, {0}, #-2", "vexp {d}, {d}", "vadds {d}, {d}, #1", "vrec {d}, {d}",
              "vmuls {d}, {d}, #-2", "vadds {d}, {d}, #1"],
}
