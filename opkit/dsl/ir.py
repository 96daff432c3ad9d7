"""Expression graph nodes: immutable, hash-consed, content-hashed.

A node is a primitive applied to argument nodes with static parameters. Two structurally equal
nodes are the same object, so common subexpressions are shared for free and a graph's content
hash is stable across runs (it feeds the build cache key).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import weakref
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ..errors import Loc
from ..kinds import Op, ValueKind

# dims: None means "the full elementwise space" (positional, any rank, NumPy broadcasting);
# a tuple names the dims of a value whose axes are known, e.g. ("N", "C"); () is a scalar.
Dims = Optional[Tuple[str, ...]]


# Nodes are interned per scope: one declaration's graphs share nodes (and so each node keeps the
# source location where it was first written), while two declarations never do.
_TABLE: contextvars.ContextVar = contextvars.ContextVar("opkit_nodes")


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """A fresh interning table for building one operator's graphs."""
    token = _TABLE.set(weakref.WeakValueDictionary())
    try:
        yield
    finally:
        _TABLE.reset(token)


def _table() -> "weakref.WeakValueDictionary":
    table = _TABLE.get(None)
    if table is None:
        table = weakref.WeakValueDictionary()
        _TABLE.set(table)
    return table


class Node:
    __slots__ = ("op", "args", "params", "kind", "dims", "loc", "_digest", "__weakref__")
    op: Op
    args: Tuple["Node", ...]
    params: tuple
    kind: ValueKind
    dims: Dims
    loc: Optional[Loc]
    _digest: Optional[str]

    def __new__(cls, op: Op, args: Tuple["Node", ...], params: tuple, kind: ValueKind, dims: Dims,
                loc: Optional[Loc] = None):
        # a closed vocabulary: an unknown primitive or kind fails here, where it is made
        op, kind = Op(op), ValueKind(kind)
        table = _table()
        key = (op, tuple(id(a) for a in args), params, kind, dims)
        node = table.get(key)
        if node is not None and node.args == args:
            return node
        node = object.__new__(cls)
        node.op, node.args, node.params, node.kind, node.dims = op, args, params, kind, dims
        node.loc = loc
        node._digest = None
        table[key] = node
        return node

    # Interned: identity is equality. Keep Python's default __eq__/__hash__.

    @property
    def digest(self) -> str:
        """sha256 over the node's structure (not its source location)."""
        if self._digest is None:
            # arguments first, in order, so no digest recurses (a graph may be 10,000 deep)
            for n in topo_order([self]):
                if n._digest is None:
                    h = hashlib.sha256()
                    h.update(repr((n.op.value, n.params, n.kind.value, n.dims)).encode())
                    for a in n.args:
                        h.update(str(a._digest).encode())
                    n._digest = h.hexdigest()
        return str(self._digest)

    @property
    def is_const(self) -> bool:
        return self.op == Op.CONST

    @property
    def value(self):
        """The number of a const node."""
        assert self.op == Op.CONST
        return self.params[0]

    @property
    def name(self) -> str:
        """The name of an input or attr node."""
        assert self.op in (Op.INPUT, Op.ATTR)
        return self.params[0]

    def __repr__(self) -> str:
        return f"Node({format_expr(self)})"


def const(value, kind: ValueKind = ValueKind.FLOAT) -> Node:
    if kind == ValueKind.FLOAT:
        value = float(value)
        value = 0.0 if value == 0 else value  # one zero: -0.0 and 0.0 fold to the same constant
    return Node(Op.CONST, (), (value,), kind, ())


def topo_order(roots: Iterable[Node]) -> List[Node]:
    """All nodes reachable from roots, every node after its arguments."""
    order: List[Node] = []
    seen = set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in seen:
                continue
            if expanded:
                seen.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            for a in reversed(node.args):
                if id(a) not in seen:
                    stack.append((a, False))
    return order


# Python's binding strengths: comparisons < | < & < + - < * / < unary < **
_INFIX = {Op.GT: (">", 1), Op.GE: (">=", 1), Op.LT: ("<", 1), Op.LE: ("<=", 1),
          Op.EQ: ("==", 1), Op.NE: ("!=", 1), Op.OR: ("|", 2), Op.AND: ("&", 3),
          Op.ADD: ("+", 4), Op.SUB: ("-", 4), Op.MUL: ("*", 5), Op.DIV: ("/", 5)}


def format_expr(node: Node, names: Optional[Dict[int, str]] = None, prec: int = -10) -> str:
    """Render a node as DSL text; `names` maps node ids to names to print instead."""
    # an explicit stack of (node, binding strength its context needs, arguments done?) and the
    # texts of finished arguments: a chain of 10,000 operators prints without recursion
    texts: List[str] = []
    stack = [(node, prec, False)]
    while stack:
        n, p, ready = stack.pop()
        if ready:
            k = len(n.args)
            args = texts[len(texts) - k:]
            del texts[len(texts) - k:]
            texts.append(_compose(n, args, p))
            continue
        leaf = _leaf_text(n, names)
        if leaf is not None:
            texts.append(leaf)
            continue
        stack.append((n, p, True))
        stack.extend((a, ap, False) for a, ap in reversed(list(zip(n.args, _arg_precs(n)))))
    return texts[0]


def _leaf_text(node: Node, names: Optional[Dict[int, str]]) -> Optional[str]:
    if names and id(node) in names:
        return names[id(node)]
    if node.op in (Op.INPUT, Op.ATTR):
        return node.params[0]
    if node.op == Op.CONST:
        v = node.params[0]
        if isinstance(v, bool):
            return "True" if v else "False"
        return repr(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)
    return None


def _arg_precs(node: Node) -> Tuple[int, ...]:
    """The binding strength each argument's text must have."""
    if node.op in _INFIX:
        p = _INFIX[node.op][1]
        # comparisons do not chain in meaning here: parenthesize a comparison inside another
        return (p + (p == 1), p + 1)
    if node.op in (Op.NEG, Op.NOT):
        return (6,)
    if node.op == Op.POW:
        return (8, 8)
    return (-10,) * len(node.args)


def _compose(node: Node, args: List[str], prec: int) -> str:
    op = node.op
    if op in _INFIX:
        sym, p = _INFIX[op]
        text = f"{args[0]} {sym} {args[1]}"
        return f"({text})" if p < prec else text
    if op in (Op.NEG, Op.NOT):
        text = ("-" if op == Op.NEG else "~") + args[0]
        return f"({text})" if prec > 6 else text
    if op == Op.POW:
        text = f"{args[0]} ** {args[1]}"
        return f"({text})" if prec > 7 else text
    if op in FORMATTERS:
        return FORMATTERS[op](args, node.params)
    return f"{op}({', '.join(args + [_param_text(p) for p in node.params])})"


# how library primitives print: op -> (argument texts, params) -> text
FORMATTERS: Dict[Op, Callable[[List[str], tuple], str]] = {}


def _param_text(p) -> str:
    if isinstance(p, tuple):
        return "[" + ", ".join(map(str, p)) + "]"
    return str(p)
