"""The sizes that library calls decide at call time: the OH, OW of a conv2d, and the shape of an
output that forward computes on named dims of its own (a conv2d result, per-channel statistics).

The rules come from the forward graph; `bind` applies them after the inputs' sizes are known."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from ..dsl.graph import build_graphs
from ..dsl.ir import Node
from ..dsl.library import LIBRARY, derive_sizes
from ..spec.model import LAYOUT_DIMS, LAYOUT_PHYSICAL, OpSpec
from ..kinds import Op


@dataclass(frozen=True)
class ShapeRules:
    calls: Tuple[Node, ...]                  # library calls that create dims, in order
    attrs: Tuple[str, ...]                   # the attrs their sizes depend on
    outputs: Tuple[Tuple[str, Tuple[str, ...]], ...]   # output -> its dims (no `like`)
    spatial: Tuple[Tuple[str, ...], ...]     # dims laid out as a 4-d layout's (a conv2d result)

    def key(self, attrs: Dict[str, object]) -> tuple:
        return tuple(attrs[a] for a in self.attrs)

    def derive(self, sizes: Dict[str, int], attrs: Dict[str, object]) -> Dict[str, int]:
        """`sizes` plus the dims the calls create; ValueError for an impossible call."""
        if not self.calls:
            return sizes

        def value_of(n: Node):
            return attrs[n.name] if n.op == Op.ATTR else n.value
        return derive_sizes(self.calls, sizes, value_of)

    def physical(self, dims: Tuple[str, ...], layout: str) -> Tuple[str, ...]:
        """The memory order of an output on `dims` under `layout`: a conv2d result is stored
        as its input is (N, OH, OW, O under NHWC)."""
        if dims in self.spatial and layout in LAYOUT_PHYSICAL:
            logical = LAYOUT_DIMS[layout]
            return tuple(dims[logical.index(d)] for d in LAYOUT_PHYSICAL[layout])
        return dims


_RULES: Dict[int, Tuple[OpSpec, ShapeRules]] = {}


def shape_rules(spec: OpSpec) -> ShapeRules:
    """The shape rules of a declaration, remembered per spec object (every call asks: hashing
    a whole spec by value would cost more than a small call's kernel)."""
    found = _RULES.get(id(spec))
    if found is None or found[0] is not spec:
        if len(_RULES) >= 512:
            _RULES.clear()
        found = _RULES[id(spec)] = (spec, _shape_rules(spec))
    return found[1]


def _shape_rules(spec: OpSpec) -> ShapeRules:
    graph = build_graphs(spec).forward
    nodes = graph.nodes()
    calls = tuple(n for n in nodes if n.op in LIBRARY and LIBRARY[n.op].sizes is not None)
    attrs = tuple(dict.fromkeys(a.name for n in calls for a in n.args if a.op == Op.ATTR))
    created = {d for n in calls for d in n.dims}
    input_dims = {d for n in graph.input_nodes if n.dims for d in n.dims}
    outputs = []
    for o in spec.outputs:
        node = dict(graph.outputs)[o.name]
        # outputs on dims of their own: the dims a call created, or fewer than the inputs have
        # because a reduction removed some (a per-channel mean). An elementwise result of a
        # smaller input (`c * 2` for a per-channel c) has the broadcast shape of all inputs.
        if o.like is None and node.dims and (set(node.dims) & created or
                                             set(node.dims) < input_dims and _reduced(node)):
            outputs.append((o.name, node.dims))
    return ShapeRules(calls, attrs, tuple(outputs), tuple(n.dims for n in calls))


def _reduced(node: Node) -> bool:
    """Whether a library call on the way to `node` drops dims of its argument (sum, mean)."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in LIBRARY and n.dims is not None and any(
                a.dims and not set(a.dims) <= set(n.dims) for a in n.args):
            return True
        stack.extend(n.args)
    return False
