"""Fold sums into the kernel that computes what they add up.

A backward pass sums gradients over the dims an input was broadcast along (dbias over N, H, W).
As a library call after the kernel, that is a second pass over memory. Folded, the kernel adds
each tile of its result into partial sums while the tile is still in cache: the runtime gives it
one float64 partial per chunk of the walk (OPK_ACC_CHUNK elements; more where a sum's partials
would outweigh the data, a size that depends on the shapes alone) and adds the chunks' partials
in order, so a sum is the same whatever the number of threads (templates/opkit_kernel.h,
opk_chunk and opk_run_chunks). A sum the walk adds whole rows into is kept as lanes (LANE_BYTES
an element), or, where the next row goes to another element, a row at a time (a double an
element): the kernel decides from the geometry.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List

from .plan import Kernel, Kind, LibCall, Plan

MAX_SUMS = 4            # sums one kernel may fold (OPK_MAXACC)
SUM_CHUNK = 1 << 15     # elements per chunk of partial sums, at least (OPK_ACC_CHUNK)
LANE_BYTES = 192        # a sum kept as lanes, per element (opk_lanes, OPK_LANE_BYTES)


def fold_sums(plan: Plan) -> Plan:
    """The plan with every `sum` and `sum_to` of a kernel's temp folded into that kernel, up to
    MAX_SUMS per kernel."""
    writer: Dict[object, Kernel] = {}
    for step in plan.steps:
        if isinstance(step, Kernel):
            for v in step.outputs:
                writer[v] = step
    folded: Dict[str, List[LibCall]] = {}
    steps = []
    for step in plan.steps:
        k = (writer.get(step.args[0]) if isinstance(step, LibCall) and step.prim in ("sum", "sum_to")
             else None)
        if k is not None and _foldable(step, k, folded.get(k.name, [])):
            folded.setdefault(k.name, []).append(step)
            continue
        steps.append(step)
    if not folded:
        return plan
    steps = [dataclasses.replace(s, sums=tuple(folded[s.name]))
             if isinstance(s, Kernel) and s.name in folded else s for s in steps]
    return dataclasses.replace(plan, steps=tuple(steps))


def _foldable(call: LibCall, k: Kernel, already: List[LibCall]) -> bool:
    """A sum over named dims the kernel iterates, or a sum_to (the shape it sums to is known
    at the call: the runtime adds up into an array of that shape, or, where it is the kernel's
    own shape, has the kernel write the result directly)."""
    if len(already) >= MAX_SUMS or call.args[0].kind is not Kind.TEMP:
        return False
    return call.prim == "sum_to" or (k.dims is not None and set(call.params[0]) <= set(k.dims))
