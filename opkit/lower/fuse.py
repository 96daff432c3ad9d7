"""Split a graph into fused elementwise kernels and library calls.

Elementwise nodes fuse into one kernel per iteration space; a value crosses a kernel boundary
(is materialized) only when a library call needs it as an array, when it is an output, or when
it lives on fewer dims than its consumer (it is computed once on its own small space rather
than once per element of the large one, e.g. a per-channel slope).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from ..dsl.graph import Graph
from ..dsl.ir import Node
from ..dsl.library import LIBRARY
from ..dsl.primitives import PRIMITIVES
from ..errors import SpecError
from .plan import Instr, Kernel, LibCall, Plan, Schedule

MAX_OPERANDS = 32


def _computes(n: Node) -> bool:
    return n.op in PRIMITIVES


def _smaller(inner, outer) -> bool:
    if inner is None or inner == ():
        return False  # scalars (attr arithmetic) stay inside the consumer: loop-invariant code
    if outer is None:
        return True
    return set(inner) < set(outer)


def value_id(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def display(value: str) -> str:
    """How a value is shown to people: x, y, dx, tmp0."""
    kind, name = value.split(":", 1)
    return "tmp" + name if kind == "tmp" else name


def fuse(graph: Graph, schedule: Schedule, prefix: str) -> Plan:
    nodes = graph.nodes()
    mat: Set[int] = set()
    for n in nodes:
        scalars = LIBRARY[n.op].scalar_args if n.op in LIBRARY else ()
        for i, a in enumerate(n.args):
            if i in scalars:
                continue  # an attr or constant passed as a number (a resampling factor)
            if n.op in LIBRARY and a.op != "input" and a.op not in LIBRARY:
                mat.add(id(a))  # a library call reads arrays: a constant becomes a filled one
            elif _computes(a) and _computes(n) and _smaller(a.dims, n.dims):
                mat.add(id(a))

    # the value id that holds each materialized node, input and library result
    holder: Dict[int, str] = {id(n): value_id("in", n.name) for n in graph.input_nodes}
    out_pairs: List[Tuple[str, str]] = []
    copies: List[Tuple[Node, str]] = []  # outputs that need a kernel of their own
    claimed: Set[int] = set()
    for name, node in graph.outputs:
        vid = value_id("out", "d" + name if graph.kind == "backward" else name)
        out_pairs.append((display(vid), vid))
        if id(node) in claimed or node.op in ("input", "attr", "const"):
            copies.append((node, vid))
            continue
        claimed.add(id(node))
        holder[id(node)] = vid
        if _computes(node):
            mat.add(id(node))
    temp_count = 0
    for n in nodes:
        if (id(n) in mat or n.op in LIBRARY) and id(n) not in holder:
            holder[id(n)] = f"tmp:{temp_count}"
            temp_count += 1

    steps = _schedule_steps(nodes, mat, copies)
    ordered = []
    k = 0
    for order, what in steps:
        outs = [holder[id(r)] for r in what] if order == 0 else None
        if order == 2:
            what, outs = [what[0]], [what[1]]
        if order == 1:
            ordered.append(LibCall(f"{prefix}lib{len(ordered)}", what.op,
                                   tuple(_scalar_ref(a) if i in LIBRARY[what.op].scalar_args
                                         else holder[id(a)] for i, a in enumerate(what.args)),
                                   what.params, holder[id(what)]))
        elif order == 2 and id(what[0]) in holder and what[0].op != "input":
            # a second output with the value of an earlier one: copy it, do not recompute
            src = holder[id(what[0])]
            ordered.append(Kernel(f"{prefix}{k}", (src,), tuple(outs), (),
                                  (Instr("v0", "load", ("0",), "float"),), ("v0",), schedule))
            k += 1
        else:
            ordered.append(_kernel(f"{prefix}{k}", what, outs, holder, mat, schedule))
            k += 1
    temps = tuple(sorted({v for v in holder.values() if v.startswith("tmp:")},
                         key=lambda v: int(v.split(":")[1])))
    return Plan(graph.kind, graph.inputs, graph.attrs, tuple(out_pairs), tuple(ordered), temps)


def _reads(n: Node, mat: Set[int]) -> List[Node]:
    """The values a step computing `n` reads: inputs, materialized values, library results."""
    found, seen, stack = [], set(), list(n.args)
    while stack:
        a = stack.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        if a.op == "input" or id(a) in mat or a.op in LIBRARY:
            found.append(a)
        elif a.args:
            stack.extend(a.args)
    return found


def _schedule_steps(nodes: List[Node], mat: Set[int], copies) -> List[tuple]:
    """Group materialized values into as few kernels as possible, in dependency order.

    Values on the same dims share a kernel (one pass over memory) unless one needs the other,
    directly or through a library call, or sharing would make two kernels wait on each other.
    Returns (0, [roots]) kernels, (1, node) library calls and (2, (node, output)) copies."""
    producers = [n for n in nodes if id(n) in mat or n.op in LIBRARY]
    deps = {id(n): {id(r) for r in _reads(n, mat) if r.op != "input"} for n in producers}
    group_of: Dict[int, int] = {}
    groups: List[List[Node]] = []

    def acyclic() -> bool:
        edges = {g: set() for g in range(len(groups))}
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
    steps: List[tuple] = []
    while len(done) < len(groups):
        ready = [gi for gi in range(len(groups)) if gi not in done and need[gi] <= done]
        gi = ready[0]
        done.add(gi)
        members = groups[gi]
        steps.append((1, members[0]) if members[0].op in LIBRARY else (0, members))
    steps.extend((2, c) for c in copies)
    return steps


def _scalar_ref(n: Node) -> str:
    """How a LibCall names a number argument: @attr or #constant."""
    return "@" + n.name if n.op == "attr" else "#" + repr(n.value)


def _kernel(name: str, roots: List[Node], outputs: List[str], holder: Dict[int, str],
            mat: Set[int], schedule: Schedule) -> Kernel:
    root_ids = {id(r) for r in roots}

    def boundary(n: Node) -> bool:
        return id(n) not in root_ids and (n.op == "input" or id(n) in mat or n.op in LIBRARY)

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

    ssa: Dict[int, str] = {}
    body: List[Instr] = []
    inputs: List[str] = []
    attrs: List[str] = []
    locs = []
    for n in order:
        if n.op == "attr":
            ssa[id(n)] = "@" + n.name
            if n.name not in attrs:
                attrs.append(n.name)
        elif n.op == "const":
            ssa[id(n)] = "#" + repr(n.value)
        elif boundary(n) or n.op == "input":
            vid = holder[id(n)]
            if vid not in inputs:
                inputs.append(vid)
            dst = f"v{len(body)}"
            body.append(Instr(dst, "load", (str(inputs.index(vid)),), "float"))
            ssa[id(n)] = dst
        else:
            dst = f"v{len(body)}"
            body.append(Instr(dst, n.op, tuple(ssa[id(a)] for a in n.args), n.kind, None, n.loc))
            ssa[id(n)] = dst
            if n.loc is not None and n.loc not in locs:
                locs.append(n.loc)
    if len(inputs) + len(outputs) > MAX_OPERANDS:
        raise SpecError(f"a fused kernel would read and write {len(inputs) + len(outputs)} arrays; "
                        f"at most {MAX_OPERANDS} are supported: split the operator",
                        next((r.loc for r in roots if r.loc is not None), None))
    return Kernel(name, tuple(inputs), tuple(outputs), tuple(attrs), tuple(body),
                  tuple(ssa[id(r)] for r in roots), schedule, tuple(sorted(locs, key=lambda l: l.line)))
