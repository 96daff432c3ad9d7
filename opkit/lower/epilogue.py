"""Epilogue fusion: the elementwise work that consumes a conv2d (or a 2-d matmul) result runs on
each output block of the call while the block is in cache, never as a separate pass.

`fuse_epilogues` rewrites a plan from `fuse.fuse`: a library call whose result is read by exactly
one elementwise kernel on the same dims becomes one `Fused` step with that kernel as its
epilogue. Per-channel means of the result (or of an elementwise function of it: training batch
norm's sum and sum of squares) are accumulated in the same epilogue (`Stat`). Every consumer gets
a `FusionNote`: how it fused, or why it cannot (a shape transform between the ops, a
memory-layout mismatch, the result needed elsewhere, an unsupported pattern).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from ..errors import Loc
from ..spec.model import LAYOUT_DIMS, LAYOUT_PHYSICAL, OpSpec
from .plan import LOAD, Fused, FusionNote, Kernel, Kind, LibCall, Plan, Stat, Step, Value
from ..kinds import Op

# the steps of a plan before its epilogues are fused
Unfused = Union[Kernel, LibCall]


def producer_name(call: LibCall) -> str:
    return "matmul" if call.prim == Op.EINSUM else call.prim


def channel_dim(call: LibCall) -> Optional[str]:
    """The dim an epilogue's per-channel vectors run along, when the call can fuse at all: the
    output channels of a conv2d, the columns of a 2-d matmul [M, K] @ [K, C]."""
    if call.prim == Op.CONV2D:
        return call.params[2][1]
    if call.prim == Op.EINSUM:
        a, b, out = call.params
        if len(a) == 2 and len(b) == 2 and a[1] == b[0] and out == (a[0], b[1]):
            return out[1]
    return None


def physical(dims: Tuple[str, ...], layout: str, spatial: bool) -> Tuple[str, ...]:
    """How a value on `dims` is stored under `layout` (a conv2d result as its input is)."""
    if spatial and layout in LAYOUT_PHYSICAL:
        logical = LAYOUT_DIMS[layout]
        return tuple(dims[logical.index(d)] for d in LAYOUT_PHYSICAL[layout])
    return dims


def _consumer(kernel: Kernel, value: Value) -> Tuple[str, Optional[Loc]]:
    """The primitive that first uses `value` in `kernel`, and where it is written."""
    slot = kernel.inputs.index(value)
    reg = next(i.dst for i in kernel.body if i.op == LOAD and i.slot == slot)
    ins = next((i for i in kernel.body if reg in i.args), None)
    if ins is None:
        return "copy", (kernel.locs[0] if kernel.locs else None)
    return ins.op, ins.loc or (kernel.locs[0] if kernel.locs else None)


class _Analysis:
    def __init__(self, plan: Plan, spec: OpSpec):
        self.plan, self.spec = plan, spec
        self.steps: List[Unfused] = []
        for step in plan.steps:
            if isinstance(step, Fused):
                raise ValueError(f"{step.name}: the plan's epilogues are fused already")
            self.steps.append(step)
        self.readers: Dict[Value, List[int]] = {}
        self.writer: Dict[Value, int] = {}
        for i, s in enumerate(self.steps):
            for v in s.reads:
                self.readers.setdefault(v, []).append(i)
            for v in s.writes:
                self.writer[v] = i
        self.notes: List[FusionNote] = []

    def note(self, call: LibCall, consumer: str, loc: Optional[Loc], fused: bool,
             reason: str) -> None:
        self.notes.append(FusionNote(self.plan.kind, producer_name(call), call.loc, consumer, loc,
                                     fused, reason))

    def depends_on(self, step: int, values: Set[Value]) -> bool:
        """Whether step reads any of `values`, directly or through earlier steps."""
        seen: Set[int] = set()
        stack = [step]
        while stack:
            i = stack.pop()
            for v in self.steps[i].reads:
                if v in values:
                    return True
                w = self.writer.get(v)
                if w is not None and w not in seen:
                    seen.add(w)
                    stack.append(w)
        return False

    def stat_of(self, step: Unfused, result: Value, channel: str) -> Optional[Stat]:
        """`step` as a per-channel statistic of `result`, if it is one."""
        keep = (channel,)
        if isinstance(step, LibCall):
            if step.prim == Op.MEAN and step.params[0] == keep and step.args == (result,):
                return Stat(step)
            return None
        if step.inputs != (result,) or len(step.outputs) != 1 or step.outputs[0].kind is not Kind.TEMP:
            return None
        users = self.readers.get(step.outputs[0], [])
        if len(users) != 1:
            return None
        mean = self.steps[users[0]]
        if isinstance(mean, LibCall) and mean.prim == Op.MEAN and mean.params[0] == keep:
            return Stat(mean, step)
        return None

    def layouts(self, call: LibCall, kernel: Kernel, result: Value) -> Tuple[Tuple[str, ...], List[str]]:
        """The call layouts the kernel can be the call's epilogue in, and why not in the others
        (empty list and a reason when in none)."""
        dims = call.dims
        if dims is None:
            return (), [f"unsupported pattern: the {producer_name(call)} result has no named dims"]
        spatial = call.prim == Op.CONV2D
        ok = list(self.spec.layouts)
        problems: List[str] = []
        for v, vd in zip(kernel.inputs, kernel.in_dims):
            if v == result:
                continue
            if vd is None:
                return (), [f"unsupported pattern: {v} has no named dims (an epilogue reads "
                            "per-channel vectors and arrays of the result's shape)"]
            if set(vd) <= {dims[1] if spatial else dims[-1]}:
                continue  # a per-channel vector or a scalar
            if set(vd) != set(dims):
                return (), [f"unsupported pattern: {v} varies along [{', '.join(vd)}] (an epilogue "
                            f"reads per-channel vectors and arrays shaped like the result)"]
            stored = self._stored(v, vd)
            for layout in list(ok):
                want = physical(dims, layout, spatial)
                if stored is not None and stored != want:
                    ok.remove(layout)
                    problems.append(f"memory-layout mismatch under {layout}: {v} is stored "
                                    f"[{', '.join(stored)}], the {producer_name(call)} result "
                                    f"[{', '.join(want)}]")
        return tuple(ok), problems

    def _stored(self, v: Value, dims: Tuple[str, ...]) -> Optional[Tuple[str, ...]]:
        """The memory order of an input declared with shape: [...] (its declared order)."""
        if v.kind is Kind.INPUT and v.name in self.spec.input_names:
            shape = self.spec.input(v.name).shape
            return tuple(shape) if shape else None
        return None


def fuse_epilogues(plan: Plan, spec: OpSpec) -> Plan:
    """The plan with each fusible library call and its epilogue as one Fused step, and a note
    for every elementwise consumer of a conv2d or matmul result."""
    a = _Analysis(plan, spec)
    fused: List[Tuple[Fused, Sequence[int]]] = []
    for i, step in enumerate(a.steps):
        if isinstance(step, LibCall) and step.prim in (Op.CONV2D, Op.EINSUM):
            made = _fuse_call(a, i, step)
            if made is not None:
                fused.append(made)
    if not fused and not a.notes:
        return plan
    taken = {j for _, idx in fused for j in idx}
    order: List[Tuple[int, Step]] = [(i, s) for i, s in enumerate(a.steps) if i not in taken]
    order += [(min(idx), f) for f, idx in fused]
    steps = _topological(order)
    return Plan(plan.kind, plan.inputs, plan.attrs, plan.outputs, tuple(steps), plan.temps,
                tuple(a.notes))


def _fuse_call(a: _Analysis, i: int, call: LibCall) -> Optional[Tuple[Fused, List[int]]]:
    result = call.result
    readers = a.readers.get(result, [])
    kernels = [s for s in (a.steps[j] for j in readers) if isinstance(s, Kernel)]
    channel = channel_dim(call)
    if result.kind is Kind.OUTPUT:
        for k in kernels:
            consumer, loc = _consumer(k, result)
            a.note(call, consumer, loc, False, f"the {producer_name(call)} result is needed "
                   f"elsewhere: it is the output {result} as well")
        if channel is None:
            return None
        # the call alone, stored straight into its output block by block
        return Fused(call.name, call, None, (), channel, tuple(a.spec.layouts)), [i]
    if channel is None:
        for k in kernels:
            consumer, loc = _consumer(k, result)
            a.note(call, consumer, loc, False, "unsupported pattern: a batched or "
                   f"{len(call.params[0])}-d x {len(call.params[1])}-d matmul (epilogues fuse "
                   "into 2-d matmuls [M, K] @ [K, C] and conv2d)")
        return None
    stats: List[Tuple[int, Stat]] = []
    candidates: List[Tuple[int, Kernel]] = []
    others: List[int] = []
    for j in readers:
        step = a.steps[j]
        st = a.stat_of(step, result, channel)
        if st is not None:
            stats.append((j, st))
        elif isinstance(step, Kernel) and set(step.dims or ()) == set(call.dims or ()):
            candidates.append((j, step))
        else:
            others.append(j)
    stat_values = {st.call.result for _, st in stats}
    after_stats = [(j, k) for j, k in candidates if a.depends_on(j, stat_values)]
    after = {j for j, _ in after_stats}
    candidates = [(j, k) for j, k in candidates if j not in after]
    for j in others:
        _note_other(a, call, a.steps[j])
    for j, st in stats:
        a.note(call, "mean", st.call.loc, True, f"per-channel sums accumulated in the "
               f"{producer_name(call)} epilogue")
    for j, k in after_stats:
        consumer, loc = _consumer(k, result)
        a.note(call, consumer, loc, True, f"one pass over the {producer_name(call)} result once "
               "its statistics are complete (they need the whole result)")
    epilogue = None
    layouts: Tuple[str, ...] = ()
    if len(candidates) == 1 and not others and not after_stats:
        k = candidates[0][1]
        consumer, loc = _consumer(k, result)
        layouts, problems = a.layouts(call, k, result)
        for p in problems:
            a.note(call, consumer, loc, False, p)
        if layouts:
            epilogue = k
            a.note(call, consumer, loc, True, f"fused into the {producer_name(call)} epilogue "
                   f"(kernel {k.name}" + (f", under {' and '.join(layouts)}"
                                          if len(layouts) < len(a.spec.layouts) else "") + ")")
    else:
        for j, k in candidates:
            consumer, loc = _consumer(k, result)
            also = [str(v) for v in _also(a, j, readers)]
            a.note(call, consumer, loc, False, f"the {producer_name(call)} result is needed "
                   f"elsewhere: {', '.join(also)} read{'s' if len(also) == 1 else ''} it too")
    if epilogue is None and not stats:
        return None
    taken = [i] + [a.steps.index(p) for _, st in stats for p in (st.kernel, st.call) if p is not None]
    if epilogue is not None:
        taken.append(candidates[0][0])
    return (Fused(call.name, call, epilogue, tuple(st for _, st in stats), channel,
                  layouts or tuple(a.spec.layouts)), sorted(set(taken)))


def _also(a: _Analysis, j: int, readers: List[int]) -> List[str]:
    out: List[str] = []
    for r in readers:
        if r != j:
            s = a.steps[r]
            out.append(f"{s.prim} ({s.name})" if isinstance(s, LibCall) else
                       f"kernel {s.name} (writing {', '.join(map(str, s.outputs))})")
    return out


def _note_other(a: _Analysis, call: LibCall, step: Unfused) -> None:
    if isinstance(step, LibCall):
        if step.prim in (Op.SUM, Op.MEAN, Op.SUM_TO):
            kept = step.params[0] if step.prim != Op.SUM_TO else ()
            what = f"a reduction to [{', '.join(kept)}]" if step.prim != Op.SUM_TO else "a reduction"
            reason = f"a shape transform between the ops: {what}"
        elif step.prim == Op.FOURIER:
            reason = f"a shape transform between the ops: resampling along {step.params[0]}"
        else:
            reason = f"unsupported pattern: {producer_name(call)} feeds {producer_name(step)}"
        a.note(call, producer_name(step), step.loc, False, reason)
        return
    consumer, loc = _consumer(step, call.result)
    a.note(call, consumer, loc, False, f"a shape transform between the ops: broadcast from "
           f"[{', '.join(call.dims or ('any rank',))}] to [{', '.join(step.dims or ('any rank',))}]")


def _topological(order: List[Tuple[int, Step]]) -> List[Step]:
    """Steps in dependency order, each as early as its original position allows."""
    order = sorted(order, key=lambda t: t[0])
    writes = {v: k for k, (_, s) in enumerate(order) for v in s.writes}
    need = [{writes[v] for v in s.reads if v in writes and writes[v] != k}
            for k, (_, s) in enumerate(order)]
    done: Set[int] = set()
    out: List[Step] = []
    while len(done) < len(order):
        k = next(k for k in range(len(order)) if k not in done and need[k] <= done)
        done.add(k)
        out.append(order[k][1])
    return out
