"""OpSpec → forward and backward graphs, with names resolved and kinds and dims checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Set, Tuple

from ..errors import SpecError
from ..spec.model import LAYOUT_DIMS, OpSpec
from .autodiff import vjp
from .ir import Node, format_expr, scope as ir_scope, topo_order
from .library import LIBRARY, sum_to
from .primitives import PRIMITIVES
from .parse import CONSTANTS, FUNCTION_NAMES, Source, Specialization, parse_expr
from .variants import Variant, variants
from ..kinds import AttrType, Op, Pass, ValueKind


@dataclass(frozen=True)
class Graph:
    """A pass of an operator: named outputs computed from array inputs and attrs."""

    kind: Pass
    inputs: Tuple[str, ...]                   # array arguments, in call order
    attrs: Tuple[str, ...]
    outputs: Tuple[Tuple[str, Node], ...]
    input_nodes: Tuple[Node, ...]
    # the conditions that pick the smooth piece of each non-smooth primitive (Primitive.branch):
    # where one of them changes, the derivative jumps (a kink)
    kinks: Tuple[Node, ...] = ()

    @property
    def output_nodes(self) -> Tuple[Node, ...]:
        return tuple(n for _, n in self.outputs)

    def nodes(self):
        return topo_order(self.output_nodes)

    def format(self) -> str:
        """Readable text: shared subexpressions get names t0, t1 ..."""
        uses: Dict[int, int] = {}
        for n in self.nodes():
            for a in n.args:
                uses[id(a)] = uses.get(id(a), 0) + 1
        names: Dict[int, str] = {}
        lines = []
        for n in self.nodes():
            if uses.get(id(n), 0) > 1 and n.args and n.op not in (Op.INPUT, Op.ATTR, Op.CONST):
                text = format_expr(n, names)
                names[id(n)] = f"t{len(names)}"
                lines.append(f"{names[id(n)]} = {text}")
        prefix = "d" if self.kind == Pass.BACKWARD else ""
        for name, n in self.outputs:
            lines.append(f"{prefix}{name} = {format_expr(n, names)}")
        return "\n".join(lines)

    @property
    def digest(self) -> str:
        import hashlib
        h = hashlib.sha256(repr((self.kind.value, self.inputs, self.attrs)).encode())
        for name, n in self.outputs:
            h.update(name.encode() + n.digest.encode())
        return h.hexdigest()


@dataclass(frozen=True)
class OpGraphs:
    forward: Graph
    backward: Graph               # the declared backward if given, else the derived one
    derived: Graph                # always the derivation from the forward graph
    declared: bool
    differentiable: Tuple[str, ...]   # the inputs that take gradients (and are present)
    variant: Optional[Variant] = None  # what str attrs and optional inputs decided


def input_dims(spec: OpSpec, name: str):
    i = spec.input(name)
    if i.shape is not None:
        return i.shape
    if i.layouts_declared and all(layout in LAYOUT_DIMS for layout in i.layouts):
        return LAYOUT_DIMS[i.layouts[0]]
    return None


def _scope(spec: OpSpec) -> Dict[str, Node]:
    scope: Dict[str, Node] = {}
    for i in spec.inputs:
        scope[i.name] = Node(Op.INPUT, (), (i.name,), ValueKind.FLOAT, input_dims(spec, i.name), i.loc)
    for a in spec.attrs:
        if a.type != AttrType.STR:  # a str attr is no value: comparisons with it fold (Specialization)
            scope[a.name] = Node(Op.ATTR, (), (a.name,), ValueKind.BOOL if a.type == AttrType.BOOL else ValueKind.FLOAT,
                                 (), a.loc)
    return scope


def _specialization(spec: OpSpec, variant: Variant) -> Specialization:
    chosen = dict(variant.choices)
    return Specialization(
        tuple((a.name, chosen[a.name], a.choices) for a in spec.attrs if a.type == AttrType.STR),
        tuple((i.name, i.name in variant.given) for i in spec.inputs if i.optional))


def kinks(roots) -> Tuple[Node, ...]:
    """The branch conditions of every non-smooth primitive the roots depend on."""
    found: Dict[int, Node] = {}
    for n in topo_order(list(roots)):
        branch = PRIMITIVES[n.op].branch if n.op in PRIMITIVES else None
        if branch is not None:
            found.update((id(c), c) for c in branch(*n.args) if not c.is_const)
    return tuple(found.values())


def _check_dims(spec: OpSpec, root: Node, src: Source, checked: Set[int]) -> None:
    """A named value (dims N, K ...) meets a positional one only where a 4-d layout anchors names.
    `checked` holds the nodes already checked (on earlier lines): each is checked once."""
    has_anchor = any(layout in LAYOUT_DIMS for layout in spec.layouts)
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in checked:
            continue
        checked.add(id(n))
        stack.extend(n.args)
        if n.op in LIBRARY or not n.args:
            continue
        dims = [a.dims for a in n.args if a.dims]
        if any(a.dims is None for a in n.args) and dims and not has_anchor:
            raise SpecError(f"{src.what}: combines a value with dims {list(dims[0])} and a value "
                            "of any rank; give the inputs shapes (shape: [...]) or a 4-d layout so "
                            "their axes can be matched", n.loc or src.loc)


def _bind(spec: OpSpec, section: str, bindings, scope: Dict[str, Node], fixed: Dict[str, str],
          checked: Set[int], special: Specialization):
    for b in bindings:
        if b.name in fixed:
            raise SpecError(f"{section}.{b.name}: {b.name!r} is already {fixed[b.name]}", b.name_loc)
        if b.name in CONSTANTS:
            raise SpecError(f"{section}.{b.name}: {b.name!r} is a constant of the expression "
                            f"language ({b.name} = {CONSTANTS[b.name]!r}); pick another name",
                            b.name_loc)
        if b.name in FUNCTION_NAMES:
            raise SpecError(f"{section}.{b.name}: {b.name!r} is the name of a function of the "
                            "expression language; pick another name", b.name_loc)
        src = Source(b.expr, b.loc, f"{section}.{b.name}", b.pieces)
        node = parse_expr(src, scope, special)
        _check_dims(spec, node, src, checked)
        scope[b.name] = node
        fixed[b.name] = f"defined earlier in {section}"
    return scope


_GRAPHS: Dict[Tuple[int, Variant], Tuple[OpSpec, "OpGraphs"]] = {}


def build_graphs(spec: OpSpec, variant: Optional[Variant] = None) -> OpGraphs:
    """Parse forward (and backward) expressions; derive the backward graph; check both. An
    operator with str attrs or optional inputs has several variants (the first by default).
    Remembered per spec object and variant: the registry, the shape rules and the lowering all
    ask for the same graphs (the graphs are immutable)."""
    variant = variant if variant is not None else variants(spec)[0]
    found = _GRAPHS.get((id(spec), variant))
    if found is None or found[0] is not spec:
        if len(_GRAPHS) >= 512:
            _GRAPHS.clear()
        with ir_scope():
            found = _GRAPHS[(id(spec), variant)] = (spec, _build(spec, variant))
    return found[1]


def _absent_used(spec: OpSpec, variant: Variant, roots, section: str, bindings) -> None:
    """An optional input the variant does not give must not reach a result."""
    absent = {i.name for i in spec.inputs if i.optional and i.name not in variant.given}
    used = [n.name for n in topo_order(list(roots)) if n.op == Op.INPUT and n.name in absent]
    if used:
        name = used[0]
        where = next((b for b in bindings if _mentions(b.expr, name)), None)
        raise SpecError(f"{section}: the optional input {name!r} is used where a call may not "
                        f"give it; use it under is_given({name}), as in "
                        f"`{name} if is_given({name}) else ...`",
                        where.loc if where is not None else spec.input(name).loc)


def _mentions(text: str, name: str) -> bool:
    import re
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _build(spec: OpSpec, variant: Variant) -> OpGraphs:
    special = _specialization(spec, variant)
    scope = _scope(spec)
    fixed = {i.name: "an input" for i in spec.inputs}
    fixed.update({a.name: "an attr" for a in spec.attrs})
    checked: Set[int] = set()  # nodes whose dims are checked (nodes live as long as the scope)
    _bind(spec, "forward", spec.forward, scope, dict(fixed), checked, special)
    outputs = []
    for o in spec.outputs:
        if o.name not in scope or o.name in fixed:
            raise SpecError(f"outputs.{o.name}: forward does not compute {o.name!r}; add a line "
                            f"`{o.name}: <expression>` under forward", o.loc)
        node = scope[o.name]
        if node.kind != ValueKind.FLOAT:
            b = next(b for b in spec.forward if b.name == o.name)
            raise SpecError(f"forward.{o.name}: an output must be a number, but this is a true/false "
                            "condition; use where(cond, a, b)", b.loc)
        outputs.append((o.name, node))
    _absent_used(spec, variant, (n for _, n in outputs), "forward", spec.forward)
    present = tuple(i.name for i in spec.inputs if not i.optional or i.name in variant.given)
    attrs = tuple(a.name for a in spec.attrs if a.type != AttrType.STR)
    input_nodes = tuple(scope[n] for n in present)
    forward = Graph(Pass.FORWARD, present, attrs, tuple(outputs), input_nodes,
                    kinks(n for _, n in outputs))

    diff = tuple(i.name for i in spec.inputs if i.differentiable and i.name in present)
    cot_nodes = {}
    for name, node in outputs:
        cot_nodes["d" + name] = Node(Op.INPUT, (), ("d" + name,), ValueKind.FLOAT, node.dims, None)
    grads = vjp([(node, cot_nodes["d" + name]) for name, node in outputs],
                [scope[n] for n in diff])
    bw_inputs = present + tuple(cot_nodes)
    bw_input_nodes = input_nodes + tuple(cot_nodes.values())
    derived = Graph(Pass.BACKWARD, bw_inputs, attrs, tuple(zip(diff, grads)), bw_input_nodes)

    backward = derived
    if spec.backward is not None:
        grads = _declared_grads(spec, scope, fixed, cot_nodes, diff, checked, special)
        _absent_used(spec, variant, (n for _, n in grads), "backward", spec.backward)
        backward = Graph(Pass.BACKWARD, bw_inputs, attrs, grads, bw_input_nodes)
    return OpGraphs(forward, backward, derived, spec.backward is not None, diff, variant)


def _declared_grads(spec: OpSpec, scope, fixed, cot_nodes, diff, checked: Set[int],
                    special: Specialization):
    """The hand-written backward: one gradient per differentiable input, temporaries allowed."""
    bscope = dict(scope)
    bscope.update(cot_nodes)
    bfixed = dict(fixed)
    bfixed.update({c: "the gradient of an output" for c in cot_nodes})
    bfixed.update({b.name: "defined in forward" for b in spec.forward})
    by_name = dict(zip(spec.input_names, (scope[n] for n in spec.input_names)))
    assert spec.backward is not None  # called for a declaration that has a backward
    given = {}
    for b in spec.backward:
        if b.name not in spec.input_names:
            _bind(spec, "backward", [b], bscope, bfixed, checked, special)
            continue
        if spec.input(b.name).optional and b.name not in diff:
            continue  # the gradient of an optional input this variant does not give
        if b.name not in diff:
            raise SpecError(f"backward.{b.name}: input {b.name!r} is declared differentiable: false, "
                            "so it takes no gradient", b.name_loc)
        src = Source(b.expr, b.loc, f"backward.{b.name}", b.pieces)
        node = parse_expr(src, bscope, special)
        _check_dims(spec, node, src, checked)
        if node.kind != ValueKind.FLOAT:
            raise src.error("a gradient must be a number, not a true/false condition")
        given[b.name] = node
    missing = [n for n in diff if n not in given]
    if missing:
        raise SpecError(f"backward: no gradient given for input {missing[0]!r}; write a line "
                        f"`{missing[0]}: <expression>` or mark the input differentiable: false",
                        spec.backward[0].name_loc)
    return tuple((n, sum_to(given[n], by_name[n])) for n in diff)
