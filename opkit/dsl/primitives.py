"""The closed set of primitives, each with everything the pipeline needs to know about it.

One record per primitive, in the manner of JAX's lax: its argument kinds, its NumPy meaning (the
reference), its derivative rule (reverse mode), its kinks, and the function name expressions
call it by (the parser's table and docs/spec.md's function table are made from these records).
How a target writes it is that target's table: codegen/c_ops.py for the C kernels,
lower/tbe.py for the TBE listing (docs/architecture.md, "Adding a primitive").

Derivative rules take the output cotangent `g`, the node itself (for rules that reuse the output)
and the argument nodes, and return one cotangent per argument: a node, `Masked(cond, node)` (the
gradient flows only where `cond` holds) or None (no gradient flows). Rules are linear in `g`.

A primitive whose derivative jumps (a kink: where, min, max, abs) names the conditions that pick
its smooth piece in `branch`; the derivative rule selects with them, and the finite-difference
check treats a change of any of them as a kink.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .ir import Dims, Node, const
from ..errors import Loc
from ..kinds import Op, ValueKind

F, B = ValueKind.FLOAT, ValueKind.BOOL


@dataclass(frozen=True)
class Primitive:
    name: Op
    arg_kinds: Tuple[ValueKind, ...]
    out_kind: ValueKind
    numpy: Callable                      # reference meaning on float64 / bool arrays
    vjp: Optional[Callable] = None
    elementwise: bool = True
    doc: str = ""                        # its meaning, for docs/spec.md's function table
    # (argument nodes) -> nodes whose values name the smooth piece the primitive is in: the
    # conditions of a select, which argument min picks ... Where one changes, the derivative
    # jumps (a kink). None: no kinks
    branch: Optional[Callable] = None
    grad_doc: str = ""                   # its gradient, for the function table
    function: str = ""                   # how expressions call it (""; an operator such as +)

    def __post_init__(self):
        object.__setattr__(self, "name", Op(self.name))  # a primitive opkit's IR names


@dataclass(frozen=True)
class Masked:
    """A cotangent that flows only where `cond` holds: elsewhere no gradient, not even 0 * inf."""

    cond: Node
    value: Node


def masked(cond: Node, value: Node):
    """`Masked(cond, value)`, or just the value where the condition always holds (a constant
    exponent, say): the derived graph stays as small as without the mask."""
    return value if cond.is_const and cond.value else Masked(cond, value)


PRIMITIVES: Dict[Op, Primitive] = {}


def _register(p: Primitive) -> Primitive:
    PRIMITIVES[p.name] = p
    return p


# ---------------------------------------------------------------- node construction + rewrites

def _dims(args: Sequence[Node]) -> Dims:
    named = [a.dims for a in args if a.dims is not None]
    if len(named) < len(args):
        return None  # something positional: the full elementwise space
    out: List[str] = []
    for d in sorted(named, key=len, reverse=True):
        out.extend(n for n in d if n not in out)
    return tuple(out)


ZERO, ONE = const(0.0), const(1.0)


def apply(name: Op, *args: Node, loc: Optional[Loc] = None) -> Node:
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
_EXCLUSIVE: Dict[Op, Tuple[Op, ...]] = {
    Op.GT: (Op.LT, Op.LE, Op.EQ), Op.LT: (Op.GT, Op.GE, Op.EQ), Op.GE: (Op.LT,), Op.LE: (Op.GT,),
    Op.EQ: (Op.GT, Op.LT, Op.NE), Op.NE: (Op.EQ,)}


def _excludes(c: Node, d: Node) -> bool:
    """Where c holds, d does not."""
    return c.args == d.args and d.op in _EXCLUSIVE.get(c.op, ())


def _simplify(name: Op, a: Tuple[Node, ...]) -> Optional[Node]:
    # Rewrites that never change a result; they keep derived gradients small.
    if name == Op.ADD:
        if _is(a[1], 0.0):
            return a[0]
        if _is(a[0], 0.0):
            return a[1]
    if name == Op.SUB:
        if _is(a[1], 0.0):
            return a[0]
        if _is(a[0], 0.0):
            return apply(Op.NEG, a[1])
    if name == Op.MUL:
        if _is(a[1], 1.0):
            return a[0]
        if _is(a[0], 1.0):
            return a[1]
        if _is(a[1], -1.0):
            return apply(Op.NEG, a[0])
        if _is(a[0], -1.0):
            return apply(Op.NEG, a[1])
    if name == Op.DIV and _is(a[1], 1.0):
        return a[0]
    if name == Op.POW:
        if _is(a[1], 0.0):
            return ONE
        if _is(a[1], 1.0):
            return a[0]
        if _is(a[1], 2.0):
            return apply(Op.MUL, a[0], a[0])
        if _is(a[1], 3.0):  # as PyTorch computes x ** 3: no pow call, two multiplies
            return apply(Op.MUL, apply(Op.MUL, a[0], a[0]), a[0])
        if _is(a[1], -1.0):  # 1 / x, correctly rounded as pow's result is
            return apply(Op.DIV, const(1.0), a[0])
    if name == Op.NEG and a[0].op == Op.NEG:
        return a[0].args[0]
    if name == Op.NOT and a[0].op == Op.NOT:
        return a[0].args[0]
    if name in (Op.AND, Op.OR):
        for c, d in ((a[0], a[1]), (a[1], a[0])):
            if c.is_const:  # True & d, False | d -> d; False & d -> False, True | d -> True
                return d if c.value == (name == Op.AND) else c
        if a[0] is a[1]:
            return a[0]
    if name == Op.WHERE:
        return _simplify_where(*a)
    return None


def _simplify_where(c: Node, x: Node, y: Node) -> Optional[Node]:
    if x is y:
        return x
    if c.is_const:
        return x if c.value else y
    # inside a branch, a select on the same condition (or on one it excludes) is decided
    if x.op == Op.WHERE and (x.args[0] is c or (c.args and _excludes(c, x.args[0]))):
        return apply(Op.WHERE, c, x.args[1] if x.args[0] is c else x.args[2], y)
    if y.op == Op.WHERE and y.args[0] is c:
        return apply(Op.WHERE, c, x, y.args[2])
    # where(c, where(d, p, 0), where(d, q, 0)) -> where(d, where(c, p, q), 0)
    if x.op == y.op == Op.WHERE and x.args[0] is y.args[0] and x.args[2] is y.args[2] \
            and _is(x.args[2], 0.0):
        return apply(Op.WHERE, x.args[0], apply(Op.WHERE, c, x.args[1], y.args[1]), x.args[2])
    # where(c, where(d, p, 0), 0) -> where(c & d, p, 0)
    if x.op == Op.WHERE and _is(y, 0.0) and _is(x.args[2], 0.0):
        return apply(Op.WHERE, apply(Op.AND, c, x.args[0]), x.args[1], y)
    return None


def negate(c: Node) -> Node:
    """The condition that holds exactly where c does not."""
    return apply(Op.NOT, c)


def select(c: Node, x: Node, y: Node, depth: int = 8) -> Node:
    """where(c, x, y) with `|` and `~` in c turned into plain selects, which GCC vectorizes in
    long chains (it gives up on chains of selects on `(x <= y) | (x != x)`); `depth` bounds
    the expansion of deeply nested conditions."""
    if depth and c.op == Op.OR:
        return select(c.args[0], x, select(c.args[1], x, y, depth - 1), depth - 1)
    if depth and c.op == Op.AND:
        return select(c.args[0], select(c.args[1], x, y, depth - 1), y, depth - 1)
    if depth and c.op == Op.NOT:
        return select(c.args[0], y, x, depth - 1)
    return apply(Op.WHERE, c, x, y)


def add(x, y): return apply(Op.ADD, x, y)
def sub(x, y): return apply(Op.SUB, x, y)
def mul(x, y): return apply(Op.MUL, x, y)
def div(x, y): return apply(Op.DIV, x, y)
def neg(x): return apply(Op.NEG, x)
def where(c, x, y): return apply(Op.WHERE, c, x, y)


# ------------------------------------------------------------------------------ arithmetic

def _np_min(a, b):
    return np.where((a <= b) | np.isnan(a), a, b)


def _np_max(a, b):
    return np.where((a >= b) | np.isnan(a), a, b)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_register(Primitive(Op.ADD, (F, F), F, np.add, lambda g, out, x, y: (g, g), doc="x + y"))
_register(Primitive(Op.SUB, (F, F), F, np.subtract, lambda g, out, x, y: (g, neg(g)), doc="x - y"))
_register(Primitive(Op.MUL, (F, F), F, np.multiply, lambda g, out, x, y: (mul(g, y), mul(g, x)),
                    doc="x * y"))
_register(Primitive(Op.DIV, (F, F), F, np.divide,
                    lambda g, out, x, y: (div(g, y), neg(div(mul(g, out), y))), doc="x / y"))
_register(Primitive(Op.NEG, (F,), F, np.negative, lambda g, out, x: (neg(g),), doc="-x"))


def _pow_vjp(g, out, x, e):
    # PyTorch's pow: no gradient to the base where the exponent is 0 (0 ** -1 would be inf),
    # none to the exponent where the base is 0 and the exponent >= 0 (log 0 is -inf)
    base = masked(apply(Op.NE, e, ZERO), mul(g, mul(e, apply(Op.POW, x, apply(Op.SUB, e, ONE)))))
    zero_base = apply(Op.AND, apply(Op.EQ, x, ZERO), apply(Op.GE, e, ZERO))
    return base, masked(negate(zero_base), mul(g, mul(out, apply(Op.LOG, x))))


_register(Primitive(Op.POW, (F, F), F, np.power, _pow_vjp, doc="x to the power e (also `x ** e`)",
                    grad_doc="`dy * e * x ** (e - 1)` to x, `dy * x ** e * log(x)` to e (0 where "
                             "x is 0 and e >= 0, as PyTorch)", function="pow"))

# ------------------------------------------------------------------------------ comparisons

for _cmp, _cmp_fn, _sym in ((Op.GT, np.greater, ">"), (Op.GE, np.greater_equal, ">="),
                           (Op.LT, np.less, "<"), (Op.LE, np.less_equal, "<="),
                           (Op.EQ, np.equal, "=="), (Op.NE, np.not_equal, "!=")):
    _register(Primitive(_cmp, (F, F), B, _cmp_fn, None, doc=f"x {_sym} y (true/false)"))

_register(Primitive(Op.AND, (B, B), B, np.logical_and, None, doc="c & d"))
_register(Primitive(Op.OR, (B, B), B, np.logical_or, None, doc="c | d"))
_register(Primitive(Op.NOT, (B,), B, np.logical_not, None, doc="~c"))

# ------------------------------------------------------------------------------ selection

_register(Primitive(Op.WHERE, (B, F, F), F, np.where,
                    lambda g, out, c, x, y: (None, Masked(c, g), Masked(negate(c), g)),
                    doc="`x` where the condition `c` holds, else `y`",
                    branch=lambda c, x, y: (c,), grad_doc="flows to the branch taken",
                    function="where"))


def _ordered(x, y):
    return apply(Op.LT, x, y), apply(Op.GT, x, y)


def _minmax_vjp(larger: bool):
    """PyTorch's maximum/minimum: the gradient goes to the argument picked, split evenly on a
    tie; unordered (a NaN) both get it."""
    def rule(g, out, x, y):
        lt, gt = _ordered(x, y)
        tie = select(apply(Op.EQ, x, y), mul(g, const(0.5)), g)
        x_loses, y_loses = (lt, gt) if larger else (gt, lt)
        return Masked(negate(x_loses), tie), Masked(negate(y_loses), tie)
    return rule


# NaN propagates from either argument (as NumPy's minimum/maximum)
_register(Primitive(Op.MIN, (F, F), F, _np_min, _minmax_vjp(False),
                    doc="the smaller of x and y; NaN propagates", branch=_ordered, function="min",
                    grad_doc="to the argument picked, halved on a tie (PyTorch's minimum)"))
_register(Primitive(Op.MAX, (F, F), F, _np_max, _minmax_vjp(True),
                    doc="the larger of x and y; NaN propagates", branch=_ordered, function="max",
                    grad_doc="to the argument picked, halved on a tie (PyTorch's maximum)"))


def _clamp_branch(x, lo, hi):
    return apply(Op.LT, x, lo), apply(Op.GT, x, hi), apply(Op.LT, lo, hi)


def _clamp_vjp(g, out, x, lo, hi):
    # PyTorch's clamp: x takes the gradient inside [lo, hi] (bounds included); lo where x is
    # below it (while lo < hi), hi where x is above it or lo > hi (then hi is the result)
    inside = apply(Op.AND, apply(Op.GE, x, lo), apply(Op.LE, x, hi))
    below = apply(Op.AND, apply(Op.LT, x, lo), apply(Op.LT, lo, hi))
    above = apply(Op.OR, apply(Op.GT, x, hi), apply(Op.GT, lo, hi))
    return Masked(inside, g), Masked(below, g), Masked(above, g)


_register(Primitive(Op.CLAMP, (F, F, F), F, lambda x, lo, hi: _np_min(_np_max(x, lo), hi),
                    _clamp_vjp, branch=_clamp_branch, function="clamp", doc="min(max(x, lo), hi); NaN propagates",
                    grad_doc="to x inside [lo, hi], bounds included; to lo below it, to hi above "
                             "(PyTorch's clamp)"))


def _abs_branch(x):
    return apply(Op.GT, x, ZERO), apply(Op.LT, x, ZERO)


def _abs_vjp(g, out, x):
    pos, neg_ = _abs_branch(x)  # no gradient at 0 (nor at NaN)
    return (Masked(apply(Op.OR, neg_, pos), select(neg_, neg(g), g)),)


# ------------------------------------------------------------------------------ transcendental

_register(Primitive(Op.EXP, (F,), F, np.exp, lambda g, out, x: (mul(g, out),), doc="e ** x",
                    grad_doc="`dy * exp(x)`", function="exp"))
_register(Primitive(Op.EXPM1, (F,), F, np.expm1, lambda g, out, x: (mul(g, add(out, ONE)),),
                    doc="e ** x - 1, exact near 0", grad_doc="`dy * (expm1(x) + 1)`",
                    function="expm1"))
_register(Primitive(Op.LOG1P, (F,), F, np.log1p, lambda g, out, x: (div(g, add(x, ONE)),),
                    doc="log(1 + x), exact near 0", grad_doc="`dy / (x + 1)`", function="log1p"))
_register(Primitive(Op.LOG, (F,), F, np.log, lambda g, out, x: (div(g, x),),
                    doc="natural logarithm", grad_doc="`dy / x`", function="log"))
_register(Primitive(Op.SQRT, (F,), F, np.sqrt, lambda g, out, x: (div(mul(g, const(0.5)), out),),
                    doc="square root", grad_doc="`dy * 0.5 / sqrt(x)`", function="sqrt"))
_register(Primitive(Op.ABS, (F,), F, np.abs, _abs_vjp,
                    doc="\\|x\\|", branch=_abs_branch, function="abs",
                    grad_doc="`dy` times the sign of x; 0 at x == 0 and at NaN (PyTorch's abs)"))
_register(Primitive(Op.SIGMOID, (F,), F, _sigmoid,
                    lambda g, out, x: (mul(g, mul(out, sub(ONE, out))),),
                    doc="1 / (1 + e ** -x)", function="sigmoid",
                    grad_doc="`dy * s * (1 - s)`, s = sigmoid(x)"))
_register(Primitive(Op.TANH, (F,), F, np.tanh, lambda g, out, x: (mul(g, sub(ONE, mul(out, out))),),
                    doc="hyperbolic tangent", grad_doc="`dy * (1 - t * t)`, t = tanh(x)",
                    function="tanh"))

# ------------------------------------------------------------------------------ breadth: the
# functions of the ONNX and PyTorch activation catalogues, with NumPy's meanings and PyTorch's
# gradients


def _vectorized(fn):
    """A float64 reference from a scalar function of the math module (NaN and infinities as it
    gives them); SciPy's vectorized one where it is installed."""
    vec = np.vectorize(fn, otypes=[np.float64])
    return lambda x: vec(np.asarray(x, dtype=np.float64))


def _reference(name: str):
    """SciPy's `name` (an independent, fast reference) where SciPy is installed, else the math
    module's, vectorized; imported on first use: SciPy takes a quarter second to import."""
    def ref(x):
        try:
            from scipy import special
            return getattr(special, name)(x)
        except ImportError:  # pragma: no cover - SciPy is a test dependency
            import math
            return _vectorized(getattr(math, name))(x)
    return ref


_erf, _erfc = _reference("erf"), _reference("erfc")

_TWO_OVER_SQRT_PI = const(1.1283791670955126)


def _erf_vjp(g, out, x):
    return (mul(g, mul(_TWO_OVER_SQRT_PI, apply(Op.EXP, neg(mul(x, x))))),)


def _erfc_vjp(g, out, x):
    return (neg(_erf_vjp(g, out, x)[0]),)


_register(Primitive(Op.ERF, (F,), F, _erf, _erf_vjp, doc="the error function",
                    grad_doc="`dy * 2 / sqrt(pi) * exp(-x * x)`", function="erf"))
_register(Primitive(Op.ERFC, (F,), F, _erfc, _erfc_vjp, doc="1 - erf(x), exact for large x",
                    grad_doc="`-dy * 2 / sqrt(pi) * exp(-x * x)`", function="erfc"))


def _zero_vjp(g, out, *args):
    return tuple(ZERO for _ in args)  # a step function: 0 almost everywhere (as PyTorch)


def _itself(name: Op) -> Callable:
    return lambda x: (apply(name, x),)  # the integer piece changes at every step


for _step, _step_fn, _doc in ((Op.FLOOR, np.floor, "the largest whole number <= x"),
                              (Op.CEIL, np.ceil, "the smallest whole number >= x"),
                              (Op.ROUND, np.rint, "the nearest whole number, ties to even")):
    _register(Primitive(_step, (F,), F, _step_fn, _zero_vjp, doc=_doc, grad_doc="0",
                        branch=_itself(_step), function=_step.value))

_register(Primitive(Op.SIGN, (F,), F, np.sign, _zero_vjp, doc="-1, 0 or 1 by the sign of x; NaN stays NaN",
                    grad_doc="0", branch=lambda x: (apply(Op.GT, x, ZERO), apply(Op.LT, x, ZERO)),
                    function="sign"))
_register(Primitive(Op.SIN, (F,), F, np.sin, lambda g, out, x: (mul(g, apply(Op.COS, x)),),
                    doc="sine", grad_doc="`dy * cos(x)`", function="sin"))
_register(Primitive(Op.COS, (F,), F, np.cos, lambda g, out, x: (neg(mul(g, apply(Op.SIN, x))),),
                    doc="cosine", grad_doc="`-dy * sin(x)`", function="cos"))
_register(Primitive(Op.SOFTPLUS, (F,), F, lambda x: np.logaddexp(0.0, x),
                    lambda g, out, x: (mul(g, apply(Op.SIGMOID, x)),),
                    doc="log(1 + e ** x), without overflow", grad_doc="`dy * sigmoid(x)`",
                    function="softplus"))
_register(Primitive(Op.ISNAN, (F,), B, np.isnan, None, doc="x is NaN (a condition)",
                    grad_doc="none", function="isnan"))
_register(Primitive(Op.ISINF, (F,), B, np.isinf, None, doc="x is +inf or -inf (a condition)",
                    grad_doc="none", function="isinf"))
