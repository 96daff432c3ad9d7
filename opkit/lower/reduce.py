"""Fold sums and means into the kernel that computes what they add up.

A backward pass sums gradients over the dims an input was broadcast along (dbias over N, H, W).
As a library call after the kernel, that is a second pass over memory. Folded, the kernel adds
each tile of its result into partial sums while the tile is still in cache: the runtime gives it
one float64 partial per chunk of the walk (OPK_ACC_CHUNK elements; more where a sum's partials
would outweigh the data, a size that depends on the shapes alone) and adds the chunks' partials
in order, so a sum is the same whatever the number of threads (templates/opkit_kernel.h,
opk_chunk and opk_run_chunks). A sum the walk adds whole rows into is kept as lanes (LANE_BYTES
an element), or, where the next row goes to another element, a row at a time (a double an
element): the kernel decides from the geometry. A mean is such a sum, divided by the number of
elements it adds once the partials are added up (the runtime: 0 / 0 is NaN for a mean of nothing).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Set, Tuple, Union, cast

from .plan import LOAD, Fused, Instr, Kernel, Kind, LibCall, Plan, Reg, Step, Value
from ..kinds import Op, ValueKind

MAX_SUMS = 4            # sums one kernel may fold (OPK_MAXACC)
SUM_CHUNK = 1 << 15     # elements per chunk of partial sums, at least (OPK_ACC_CHUNK)
LANE_BYTES = 192        # a sum kept as lanes, per element (opk_lanes, OPK_LANE_BYTES)
FOLDABLE = ("sum", "mean", "sum_to")
# the library reductions a module compiles (templates/opkit_reduce.h), with their OPK_R_* codes
COMPILED_REDUCTIONS = {"amax": 0, "amin": 1, "logsumexp": 2}


def fold_sums(plan: Plan) -> Plan:
    """The plan with every `sum`, `mean` and `sum_to` of a kernel's temp folded into that kernel,
    up to MAX_SUMS per kernel, and every other `sum` and `mean` (of an input, of a fused step's
    result) run as a kernel of its own that reads the array once and adds it up (no NumPy call,
    no copy)."""
    plan = _fold_fallbacks(_input_reductions(plan))
    writer: Dict[object, Kernel] = {}
    for step in plan.steps:
        if isinstance(step, Kernel):
            for v in step.outputs:
                writer[v] = step
    folded: Dict[str, List[LibCall]] = {}
    steps: List[Step] = []
    for step in plan.steps:
        if isinstance(step, LibCall) and step.prim in FOLDABLE:
            k = writer.get(step.array)
            if k is not None and _foldable(step, k, folded.get(k.name, [])):
                folded.setdefault(k.name, []).append(step)
                continue
        steps.append(step)
    if not folded:
        return plan
    # temps only sums read are not stored, unless a sum_to into an output may be the identity
    # (the runtime then has the kernel write that output instead)
    read: Set[Value] = {v for s in steps for v in s.reads}
    read |= {c.array for calls in folded.values() for c in calls
             if c.prim == Op.SUM_TO and c.result.kind is Kind.OUTPUT}
    steps = [dataclasses.replace(s, sums=tuple(folded[s.name]),
                                 discarded=tuple(v for v in s.outputs if v.kind is Kind.TEMP
                                                 and v not in read))
             if isinstance(s, Kernel) and s.name in folded else s for s in steps]
    return dataclasses.replace(plan, steps=tuple(steps))


def _fold_fallbacks(plan: Plan) -> Plan:
    """Each fused step with statistics, with its parts folded as a plan's steps are: where it
    does not fuse (another layout, no BLAS) its means still add up in compiled kernels."""
    temps, steps = plan.temps, []
    for step in plan.steps:
        if isinstance(step, Fused) and step.stats:
            parts = fold_sums(dataclasses.replace(plan, steps=step.unfolded, temps=temps))
            temps = parts.temps
            # folding turns kernels and calls into kernels and calls: no fused step among them
            fallback = cast(Tuple[Union[Kernel, LibCall], ...], parts.steps)
            step = dataclasses.replace(step, fallback=fallback)
        steps.append(step)
    return dataclasses.replace(plan, steps=tuple(steps), temps=temps)


def _foldable(call: LibCall, k: Kernel, already: List[LibCall]) -> bool:
    """A sum over named dims the kernel iterates, or a sum_to (the shape it sums to is known
    at the call: the runtime adds up into an array of that shape, or, where it is the kernel's
    own shape, has the kernel write the result directly)."""
    if len(already) >= MAX_SUMS or call.array.kind is not Kind.TEMP:
        return False
    return call.prim == Op.SUM_TO or (k.dims is not None and set(call.params[0]) <= set(k.dims))


def _input_reductions(plan: Plan) -> Plan:
    """Each `sum` or `mean` of an input of the pass, or of an array no kernel of the plan writes
    (a fused convolution's epilogue output, a library call's result), as a kernel that loads it
    into a temp, which the sum folded into it reads (the runtime then stores nothing)."""
    steps: List[Step] = []
    temps = list(plan.temps)
    kernels_write = {v for s in plan.steps if isinstance(s, Kernel) for v in s.outputs}
    for step in plan.steps:
        dims = (step.arg_dims[0] if isinstance(step, LibCall) and step.prim in (Op.SUM, Op.MEAN)
                and step.array not in kernels_write and step.arg_dims else None)
        if not isinstance(step, LibCall) or dims is None or not set(step.params[0]) <= set(dims):
            steps.append(step)
            continue
        temp = Value.temp(len(temps))
        temps.append(temp)
        load = Instr(Reg(0), LOAD, (), ValueKind.FLOAT, slot=0)
        steps.append(Kernel(f"{step.name}k", (step.array,), (temp,), (), (load,), (load.dst,),
                            (step.loc,) if step.loc is not None else (), dims, (dims,),
                            (dataclasses.replace(step, args=(temp,)),), (temp,)))
    if len(temps) == len(plan.temps):
        return plan
    return dataclasses.replace(plan, steps=tuple(steps), temps=tuple(temps))
