"""Split a graph into fused elementwise kernels and library calls.

Elementwise nodes fuse into one kernel per iteration space; a value crosses a kernel boundary
(is materialized) only when a library call needs it as an array, when it is an output, or when
it lives on fewer dims than its consumer (it is computed once on its own small space rather
than once per element of the large one, e.g. a per-channel slope).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple, Union

from ..dsl.graph import Graph
from ..dsl.ir import Node
from ..dsl.library import LIBRARY
from ..dsl.primitives import PRIMITIVES, _dims
from ..errors import Loc, SpecError
from .plan import LOAD, Attr, Const, Instr, Kernel, LibCall, Operand, Plan, Reg, Value
from ..kinds import Op, Pass, ValueKind

MAX_OPERANDS = 32


def _computes(n: Node) -> bool:
    return n.op in PRIMITIVES


def _smaller(inner, outer) -> bool:
    if inner is None or inner == ():
        return False  # scalars (attr arithmetic) stay inside the consumer: loop-invariant code
    if outer is None:
        return True
    return set(inner) < set(outer)


def fuse(graph: Graph, prefix: str) -> Plan:
    nodes = graph.nodes()
    mat: Set[int] = set()
    for n in nodes:
        scalars = LIBRARY[n.op].scalar_args if n.op in LIBRARY else ()
        for i, a in enumerate(n.args):
            if i in scalars:
                continue  # an attr or constant passed as a number (a resampling factor)
            if n.op in LIBRARY and a.op != Op.INPUT and a.op not in LIBRARY:
                mat.add(id(a))  # a library call reads arrays: a constant becomes a filled one
            elif _computes(a) and _computes(n) and _smaller(a.dims, n.dims):
                mat.add(id(a))

    # the value that holds each materialized node, input and library result
    holder: Dict[int, Value] = {id(n): Value.input(n.name) for n in graph.input_nodes}
    out_pairs: List[Tuple[str, Value]] = []
    copies: List[Tuple[Node, Value]] = []  # outputs that need a kernel of their own
    claimed: Set[int] = set()
    for name, node in graph.outputs:
        value = Value.output("d" + name if graph.kind == Pass.BACKWARD else name)
        out_pairs.append((str(value), value))
        if id(node) in claimed or node.op in (Op.INPUT, Op.ATTR, Op.CONST):
            copies.append((node, value))
            continue
        claimed.add(id(node))
        holder[id(node)] = value
        if _computes(node):
            mat.add(id(node))
    temps: List[Value] = []
    for n in nodes:
        if (id(n) in mat or n.op in LIBRARY) and id(n) not in holder:
            holder[id(n)] = Value.temp(len(temps))
            temps.append(holder[id(n)])

    ordered: List[Union[Kernel, LibCall]] = []
    k = 0
    for step in _schedule_steps(nodes, mat, copies):
        if isinstance(step, _Call):
            node = step.node
            ordered.append(LibCall(f"{prefix}lib{len(ordered)}", node.op,
                                   tuple(_scalar_ref(a) if i in LIBRARY[node.op].scalar_args
                                         else holder[id(a)] for i, a in enumerate(node.args)),
                                   node.params, holder[id(node)], node.dims, node.loc,
                                   tuple(a.dims for a in node.args)))
            continue
        if isinstance(step, _Copy) and id(step.node) in holder and step.node.op != Op.INPUT:
            # a second output with the value of an earlier one: copy it, do not recompute
            load = Instr(Reg(0), LOAD, (), ValueKind.FLOAT, slot=0)
            ordered.append(Kernel(f"{prefix}{k}", (holder[id(step.node)],), (step.output,), (),
                                  (load,), (load.dst,), (), step.node.dims, (step.node.dims,)))
        elif isinstance(step, _Copy):
            ordered.append(_kernel(f"{prefix}{k}", [step.node], [step.output], holder, mat))
        else:
            ordered.append(_kernel(f"{prefix}{k}", step.roots, [holder[id(r)] for r in step.roots],
                                   holder, mat))
        k += 1
    return Plan(graph.kind, graph.inputs, graph.attrs, tuple(out_pairs), tuple(ordered),
                tuple(temps))


def _reads(n: Node, mat: Set[int]) -> List[Node]:
    """The values a step computing `n` reads: inputs, materialized values, library results."""
    found, seen, stack = [], set(), list(n.args)
    while stack:
        a = stack.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        if a.op == Op.INPUT or id(a) in mat or a.op in LIBRARY:
            found.append(a)
        elif a.args:
            stack.extend(a.args)
    return found


@dataclass(frozen=True)
class _Fused:
    roots: List[Node]        # materialized values computed in one kernel


@dataclass(frozen=True)
class _Call:
    node: Node               # a library call


@dataclass(frozen=True)
class _Copy:
    node: Node               # an output whose value another step already computes (or an
    output: Value            # input, attr or constant): a kernel of its own writes it


def _schedule_steps(nodes: List[Node], mat: Set[int],
                    copies: List[Tuple[Node, Value]]) -> List[Union[_Fused, _Call, _Copy]]:
    """Group materialized values into as few kernels as possible, in dependency order.

    Values on the same dims share a kernel (one pass over memory) unless one needs the other,
    directly or through a library call, or sharing would make two kernels wait on each other."""
    producers = [n for n in nodes if id(n) in mat or n.op in LIBRARY]
    deps = {id(n): {id(r) for r in _reads(n, mat) if r.op != Op.INPUT} for n in producers}
    group_of: Dict[int, int] = {}
    groups: List[List[Node]] = []

    def acyclic() -> bool:
        edges: Dict[int, Set[int]] = {g: set() for g in range(len(groups))}
        for gi, members in enumerate(groups):
            for m in members:
                edges[gi] |= {group_of[d] for d in deps[id(m)]} - {gi}
        state: Dict[int, int] = {}

        def visit(g: int) -> bool:
            state[g] = 1
            for h in edges[g]:
                if state.get(h) == 1 or (h not in state and not visit(h)):
                    return False
            state[g] = 2
            return True
        return all(state.get(g) == 2 or visit(g) for g in edges)

    for n in producers:
        groups.append([n])
        group_of[id(n)] = len(groups) - 1
        if n.op in LIBRARY:
            continue
        for gi, members in enumerate(groups[:-1]):
            if members[0].op in LIBRARY or members[0].dims != n.dims:
                continue
            groups[gi].append(n)
            group_of[id(n)] = gi
            groups.pop()
            if acyclic():
                break
            groups[gi].pop()
            groups.append([n])
            group_of[id(n)] = len(groups) - 1
    # topological order of the groups (Kahn), earliest-declared first among the ready ones
    need = {gi: {group_of[d] for m in members for d in deps[id(m)]} - {gi}
            for gi, members in enumerate(groups)}
    done: Set[int] = set()
    steps: List[Union[_Fused, _Call, _Copy]] = []
    while len(done) < len(groups):
        ready = [gi for gi in range(len(groups)) if gi not in done and need[gi] <= done]
        gi = ready[0]
        done.add(gi)
        members = groups[gi]
        steps.append(_Call(members[0]) if members[0].op in LIBRARY else _Fused(members))
    steps.extend(_Copy(node, value) for node, value in copies)
    return steps


def _scalar_ref(n: Node) -> Union[Attr, Const]:
    """A number argument of a LibCall: an attr or a constant."""
    return Attr(n.name) if n.op == Op.ATTR else Const(n.value)


def _kernel(name: str, roots: List[Node], outputs: List[Value], holder: Dict[int, Value],
            mat: Set[int]) -> Kernel:
    root_ids = {id(r) for r in roots}

    def boundary(n: Node) -> bool:
        return id(n) not in root_ids and (n.op == Op.INPUT or id(n) in mat or n.op in LIBRARY)

    order: List[Node] = []
    seen: Set[int] = set()

    def visit(n: Node) -> None:  # topological, stopping at values other steps provide
        stack = [(n, False)]
        while stack:
            m, done = stack.pop()
            if id(m) in seen:
                continue
            if done or boundary(m) or not m.args:
                seen.add(id(m))
                order.append(m)
                continue
            stack.append((m, True))
            stack.extend((a, False) for a in reversed(m.args) if id(a) not in seen)

    for r in roots:
        visit(r)

    ssa: Dict[int, Operand] = {}
    body: List[Instr] = []
    inputs: List[Value] = []
    in_dims: List[Optional[Tuple[str, ...]]] = []
    attrs: List[str] = []
    locs: List[Loc] = []
    for n in order:
        if n.op == Op.ATTR:
            ssa[id(n)] = Attr(n.name)
            if n.name not in attrs:
                attrs.append(n.name)
        elif n.op == Op.CONST:
            ssa[id(n)] = Const(n.value)
        elif boundary(n) or n.op == Op.INPUT:
            value = holder[id(n)]
            if value not in inputs:
                inputs.append(value)
                in_dims.append(n.dims)
            ins = Instr(Reg(len(body)), LOAD, (), ValueKind.FLOAT, slot=inputs.index(value))
            body.append(ins)
            if n.kind == ValueKind.BOOL:
                # a condition crosses a boundary stored as 1 or 0 in the array: read it back
                # as a condition, so `&`, `|` and `~` take it as they take a comparison
                ins = Instr(Reg(len(body)), Op.NE, (ins.dst, Const(0.0)), ValueKind.BOOL, n.loc)
                body.append(ins)
            ssa[id(n)] = ins.dst
        else:
            ins = Instr(Reg(len(body)), n.op, tuple(ssa[id(a)] for a in n.args), n.kind, n.loc)
            body.append(ins)
            ssa[id(n)] = ins.dst
            if n.loc is not None and n.loc not in locs:
                locs.append(n.loc)
    if len(inputs) + len(outputs) > MAX_OPERANDS:
        raise SpecError(f"a fused kernel would read and write {len(inputs) + len(outputs)} arrays; "
                        f"at most {MAX_OPERANDS} are supported: split the operator",
                        next((r.loc for r in roots if r.loc is not None), None))
    return Kernel(name, tuple(inputs), tuple(outputs), tuple(attrs), tuple(body),
                  tuple(ssa[id(r)] for r in roots), tuple(sorted(locs, key=lambda l: l.line)),
                  _dims(roots), tuple(in_dims))
