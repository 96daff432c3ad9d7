"""Reverse-mode derivation of a backward graph from the primitives' derivative rules.

A gradient flows only through the branch a select takes. Each cotangent is carried as a value and
its *flow*: the conditions (from where, min, max, abs) that all hold where it is a gradient at
all. Outside its flow a value may be anything (the derivative of a branch that was not taken:
inf, NaN), because derivative factors multiply the value before the flow is applied, and the
flow is applied as a select, never as a product with 0. So `where(x > 0, sqrt(x), 0)` gets
`where(x > 0, dy * 0.5 / sqrt(x), 0)`, not `where(x > 0, dy, 0) * 0.5 / sqrt(x)` (NaN at x < 0).
The flow is applied where cotangents with different flows meet, before library calls and sums
(a sum is an ordinary number again), and on the final gradients.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .ir import Node, const, topo_order
from .library import LIBRARY, reduce_to, sum_to
from .primitives import PRIMITIVES, ZERO, Masked, _dims, add, apply, neg, negate, select
from ..kinds import Op, ValueKind


class Cotangent(NamedTuple):
    value: Node
    flow: Tuple[Node, ...] = ()  # conditions that all hold where the gradient flows; () everywhere
    exact: bool = True           # the value is already 0 wherever the flow fails (or flow is ())


def vjp(outputs: Sequence[Tuple[Node, Node]], wrt: Sequence[Node]) -> List[Node]:
    """Cotangents of `wrt` given (output node, cotangent node) pairs.

    Each result is reduced to its input's shape (`sum_to`), so the gradient of a broadcast input
    comes back in the input's own shape; an input nothing depends on gets zeros.
    """
    # the contributions to each node's cotangent, combined once all have arrived (a node comes
    # after all its consumers), so the branches of one select meet as one select
    terms: Dict[int, Dict[frozenset, Cotangent]] = {}

    def give(node: Node, c: Cotangent) -> None:
        mine = terms.setdefault(id(node), {})
        key = frozenset(map(id, c.flow))  # gradients on the same flow add
        mine[key] = _accumulate(mine[key], c) if key in mine else c

    for out, g in outputs:
        give(out, Cotangent(g))
    for node in reversed(topo_order([o for o, _ in outputs])):
        if id(node) not in terms or node.op in (Op.INPUT, Op.ATTR, Op.CONST):
            continue
        library = node.op not in PRIMITIVES
        rule = (LIBRARY[node.op] if library else PRIMITIVES[node.op]).vjp
        if rule is None:
            continue  # a true/false value: no gradient flows through comparisons
        c = combine(list(terms.pop(id(node)).values()))
        if library:  # a library call mixes elements: it needs the exact gradient everywhere
            c = Cotangent(applied(c))
        for arg, g_arg in zip(node.args, rule(c.value, node, *node.args)):
            # a step function's gradient is 0 and reaches nothing upstream: round(exp(x)) at
            # x = inf is 0, never 0 * inf
            if g_arg is None or g_arg is ZERO or arg.kind != ValueKind.FLOAT or arg.op in (Op.ATTR, Op.CONST):
                continue
            if isinstance(g_arg, Masked):
                given = Cotangent(g_arg.value, _extend(c.flow, g_arg.cond), False)
            else:  # passed on as it is (a sum, a difference) it stays exact; a product does not
                given = Cotangent(g_arg, c.flow, c.exact and g_arg in (c.value, neg(c.value)))
            if arg.dims is not None and (not given.flow or given.exact or arg.op in LIBRARY
                                         or _sums_linearly(arg)):
                dims = _dims([given.value, *given.flow])
                if dims is None or set(dims) - set(arg.dims):
                    # the argument was broadcast here: sum its cotangent back to its own dims
                    # now, so everything upstream of it works on its small shape
                    given = Cotangent(reduce_to(applied(given), arg.dims))
            give(arg, given)
    return _exp_for_expm1([sum_to(applied(combine(list(terms[id(x)].values()))) if id(x) in terms
                                  else const(0.0), x)
                           for x in wrt])


def _expm1_plus_one(node: Node) -> Optional[Node]:
    """The expm1 node of `expm1(x) + 1` (expm1's derivative rule), else None."""
    if node.op != Op.ADD:
        return None
    for e, one in (node.args, node.args[::-1]):
        if e.op == Op.EXPM1 and one.is_const and one.value == 1.0:
            return e
    return None


def _exp_for_expm1(roots: List[Node]) -> List[Node]:
    """The gradients with `expm1(x) + 1` as `exp(x)` where they read expm1(x) nowhere else: a
    backward computes it again from x, and exp is the cheaper function (elu's and selu's
    backward); where expm1(x) is read anyway (celu's min compares it), the sum reuses it."""
    order = topo_order(roots)
    uses: Dict[int, int] = {}
    for a in [a for n in order for a in n.args] + list(roots):  # a gradient itself is a use
        uses[id(a)] = uses.get(id(a), 0) + 1
    new: Dict[int, Node] = {}
    for n in order:
        e = _expm1_plus_one(n)
        if e is not None and uses[id(e)] == 1:
            new[id(n)] = apply(Op.EXP, new[id(e.args[0])])
            continue
        args = tuple(new[id(a)] for a in n.args)
        new[id(n)] = n if args == n.args else Node(n.op, args, n.params, n.kind, n.dims, n.loc)
    return [new[id(r)] for r in roots]


# primitives whose derivative is bounded wherever their argument is finite or infinite (a
# select, a sum, a saturating curve), and those that only pick or negate
_BOUNDED = frozenset(("add", "sub", "neg", "where", "min", "max", "clamp", "abs", "floor", "ceil",
                      "round", "sign", "sigmoid", "tanh", "erf", "erfc", "sin", "cos"))


def _sums_linearly(node: Node, depth: int = 8) -> bool:
    """Whether every derivative factor between `node` and the inputs is bounded: an input, or
    what _BOUNDED computes from such values, or one scaled by a value of attrs and constants
    alone (a per-call number). Only then (or with no flow pending, or for a library call's
    result, which takes its cotangent in its own dims) may a cotangent whose flow is still
    pending be summed over broadcast dims first: an unbounded factor upstream (1 / c at c == 0)
    must multiply each element before the flow is applied, never a sum of zeros (0 * inf); the
    final sum_to reduces such a cotangent instead."""
    if node.op in (Op.INPUT, Op.ATTR, Op.CONST) or node.op in LIBRARY:
        return True  # (a library call takes its cotangent summed to its own dims anyway)
    if depth <= 0:
        return False
    floats = [a for a in node.args if a.kind == ValueKind.FLOAT]
    if node.op == Op.MUL:
        return any(_per_call(a) for a in floats) and all(_sums_linearly(a, depth - 1) for a in floats)
    return node.op in _BOUNDED and all(_sums_linearly(a, depth - 1) for a in floats)


def _per_call(node: Node, depth: int = 8) -> bool:
    """A value of attrs and constants alone (one number per call)."""
    if node.op in (Op.ATTR, Op.CONST):
        return True
    return depth > 0 and node.op != Op.INPUT and bool(node.args) and \
        all(_per_call(a, depth - 1) for a in node.args)


# A flow keeps at most this many conditions apart (each becomes a select when the flow is
# applied; the last ones decide which cotangents meet as one select). Deeper nesting folds the
# outer ones into one `&` of them, shared by every cotangent below: a chain of n selects
# derives in O(n) nodes.
_FLOW_LIMIT = 4


def _extend(flow: Tuple[Node, ...], cond: Node) -> Tuple[Node, ...]:
    if len(flow) < _FLOW_LIMIT:
        return flow + (cond,)
    return (_all(flow), cond)


def applied(c: Cotangent) -> Node:
    """The cotangent with its flow applied: the value where it flows, exactly 0 elsewhere."""
    return c.value if c.exact else _masked(c, c.flow)[0]


def _masked(c: Cotangent, conds: Tuple[Node, ...]) -> Tuple[Node, bool]:
    """c's value made 0 where one of `conds` (some of its flow) fails; whether that is exact."""
    value = c.value
    for cond in reversed(conds):
        value = select(cond, value, ZERO)
    return value, c.exact or len(conds) == len(c.flow)


def combine(terms: List[Cotangent]) -> Cotangent:
    """The sum of cotangents on different flows, each a gradient only on its own flow."""
    # first the two sides of one condition, which form a select (among a few terms: look for them)
    while 1 < len(terms) <= _SEARCH:
        pair = next(((i, j) for i in range(len(terms)) for j in range(len(terms))
                     if i != j and _split(terms[i], terms[j]) is not None), None)
        if pair is None:
            break
        merged = _accumulate(terms[pair[0]], terms[pair[1]])
        terms = [merged] + [t for k, t in enumerate(terms) if k not in pair]
    out = terms[0]
    for t in terms[1:]:
        out = _accumulate(out, t)
    return out


_SEARCH = 16


def _split(a: Cotangent, b: Cotangent) -> Optional[Node]:
    """A condition that holds on a's flow and fails on b's, if there is one."""
    ids = set(map(id, b.flow))
    return next((c for c in a.flow if id(c) not in ids and id(negate(c)) in ids), None)


def _accumulate(a: Cotangent, b: Cotangent) -> Cotangent:
    """a + b, each a gradient only on its own flow."""
    in_a, in_b = set(map(id, a.flow)), set(map(id, b.flow))
    common = tuple(c for c in a.flow if id(c) in in_b)
    only_a = tuple(c for c in a.flow if id(c) not in in_b)
    only_b = tuple(c for c in b.flow if id(c) not in in_a)
    split = _split(a, b)
    if split is not None:  # a and b flow on the two sides of one condition: a select
        (va, ea), (vb, eb) = _masked(a, tuple(c for c in only_a if c is not split)), \
            _masked(b, tuple(c for c in only_b if c is not negate(split)))
        return Cotangent(select(split, va, vb), common, ea and eb)
    (va, ea), (vb, eb) = _masked(a, only_a), _masked(b, only_b)
    if not only_a or not only_b:  # one flows wherever the other does (or both on one flow)
        return Cotangent(add(va, vb), common, ea and eb)
    return Cotangent(add(va, vb), common + (apply(Op.OR, _all(only_a), _all(only_b)),), ea and eb)


def _all(conds: Tuple[Node, ...]) -> Node:
    out = conds[0]
    for c in conds[1:]:
        out = apply(Op.AND, out, c)
    return out
