"""Stage 3: graphs → kernel plans (fused kernels, library calls), schedules, listings, costs.

Everything here is a pure function of the declaration; the machine (vector width, instruction
set) enters at codegen."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..dsl.graph import OpGraphs
from ..errors import SpecError
from ..spec.model import OpSpec
from .epilogue import fuse_epilogues
from .fuse import fuse
from .integer import check_integer, quantized
from .reduce import fold_sums
from .listing import Cost, compute_dtype, cost, listing
from .plan import (LOAD, Attr, Const, Fused, FusionNote, Instr, Kernel, Kind, LibCall, Plan, Reg,
                   Schedule, Stat, Value)

DEFAULT_TILE = 256
# Below this many float32 (or float16) elements one thread runs, half as many for float64: an
# OpenMP region costs about 2 us to open, and two threads beat one from about 32K float32
# elements (16K float64) on the 2-core machines opkit is measured on (docs/performance.md).
DEFAULT_PARALLEL_THRESHOLD = 32768


@dataclass(frozen=True)
class Lowered:
    forward: Plan
    backward: Optional[Plan]
    schedule: Schedule

    @property
    def kernels(self):
        return self.forward.kernels + (self.backward.kernels if self.backward else ())

    @property
    def fusion(self):
        """What became of every elementwise consumer of a conv2d or matmul result."""
        return self.forward.fusion + (self.backward.fusion if self.backward else ())


def make_schedule(spec: OpSpec) -> Schedule:
    s = spec.schedule
    return Schedule(tile=s.tile or DEFAULT_TILE,
                    parallel_threshold=DEFAULT_PARALLEL_THRESHOLD if s.parallel_threshold is None
                    else s.parallel_threshold,
                    max_threads=s.threads)


def lower(spec: OpSpec, graphs: OpGraphs) -> Lowered:
    # a variant's kernels are named apart from the others' (v1fwd0 ...): one module holds all
    prefix = graphs.variant.prefix if graphs.variant is not None else ""
    forward = fuse_epilogues(fuse(graphs.forward, prefix + "fwd"), spec)
    if spec.int_dtypes:
        check_integer(spec, forward)
    for out_name, in_name in spec.schedule.inplace:
        if not inplace_safe(forward, Value.output(out_name), Value.input(in_name)):
            raise SpecError(f"schedule.inplace: {out_name} cannot overwrite {in_name}: "
                            f"{in_name} is still read after {out_name} is written",
                            spec.schedule.loc)
    if spec.schedule.fuse == "required":
        missed = next((n for n in forward.fusion if not n.fused), None)
        if missed is not None:
            raise SpecError(f"schedule.fuse is required, but: {missed}", missed.loc or spec.schedule.loc)
    backward = (fuse_epilogues(fuse(graphs.backward, prefix + "bwd"), spec)
                if graphs.differentiable else None)
    # integer kernels have no float64 partial sums to add into: their sums stay library calls
    if not spec.int_dtypes:
        forward = fold_sums(forward)
    backward = fold_sums(backward) if backward is not None else None
    return Lowered(forward, backward, make_schedule(spec))


def inplace_safe(plan: Plan, out: Value, inp: Value) -> bool:
    """`out` may overwrite `inp` if nothing reads `inp` after the kernel that writes `out`."""
    writer = next((i for i, s in enumerate(plan.steps)
                   if isinstance(s, Kernel) and out in s.outputs), None)
    kernel = plan.steps[writer] if writer is not None else None
    if writer is None or not isinstance(kernel, Kernel) or inp not in kernel.inputs:
        return False
    readers = [i for i, s in enumerate(plan.steps) if inp in s.reads]
    return all(i <= writer for i in readers)


__all__ = ["lower", "Lowered", "Plan", "Kernel", "LibCall", "Fused", "Stat", "FusionNote", "Instr", "Schedule", "Value", "Kind",
           "Reg", "Attr", "Const", "LOAD", "listing", "cost", "Cost", "compute_dtype",
           "make_schedule", "quantized", "inplace_safe"]
