"""Reverse-mode derivation of a backward graph from the primitives' derivative rules."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .ir import Node, const, topo_order
from .library import LIBRARY, reduce_to, sum_to
from .primitives import PRIMITIVES, add, deriving


def vjp(outputs: Sequence[Tuple[Node, Node]], wrt: Sequence[Node]) -> List[Node]:
    """Cotangents of `wrt` given (output node, cotangent node) pairs.

    Each result is reduced to its input's shape (`sum_to`), so the gradient of a broadcast input
    comes back in the input's own shape; an input nothing depends on gets zeros.
    """
    with deriving():
        return _vjp(outputs, wrt)


def _vjp(outputs, wrt) -> List[Node]:
    ct: Dict[int, Node] = {}
    for out, g in outputs:
        ct[id(out)] = add(ct[id(out)], g) if id(out) in ct else g
    for node in reversed(topo_order([o for o, _ in outputs])):
        g = ct.get(id(node))
        if g is None or node.op in ("input", "attr", "const"):
            continue
        if node.op in PRIMITIVES:
            rule = PRIMITIVES[node.op].vjp
        else:
            rule = LIBRARY[node.op].vjp
        if rule is None:
            continue  # a true/false value: no gradient flows through comparisons
        for arg, g_arg in zip(node.args, rule(g, node, *node.args)):
            if g_arg is None or arg.kind != "float" or arg.op in ("attr", "const"):
                continue
            if arg.dims is not None and (g_arg.dims is None or set(g_arg.dims) - set(arg.dims)):
                # the argument was broadcast here: sum its cotangent back to its own dims now,
                # so everything upstream of it works on its small shape
                g_arg = reduce_to(g_arg, arg.dims)
            ct[id(arg)] = add(ct[id(arg)], g_arg) if id(arg) in ct else g_arg
    return [sum_to(ct.get(id(x), const(0.0)), x) for x in wrt]
