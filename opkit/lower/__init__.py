"""Stage 3: graphs → kernel plans (fused kernels, library calls), schedules, listings, costs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..dsl.graph import OpGraphs
from ..spec.model import OpSpec
from ..target import Target
from .fuse import display, fuse
from .integer import check_integer, quantized
from .listing import Cost, compute_dtype, cost, listing
from .plan import Instr, Kernel, LibCall, Plan, Schedule

DEFAULT_TILE = 1024
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


def make_schedule(spec: OpSpec, target: Target) -> Schedule:
    s = spec.schedule
    return Schedule(tile=s.tile or DEFAULT_TILE,
                    parallel_threshold=DEFAULT_PARALLEL_THRESHOLD if s.parallel_threshold is None
                    else s.parallel_threshold,
                    max_threads=s.threads, vector_bytes=target.vector_bytes, isa=target.isa)


def lower(spec: OpSpec, graphs: OpGraphs, target: Target) -> Lowered:
    schedule = make_schedule(spec, target)
    forward = fuse(graphs.forward, schedule, "fwd")
    if spec.int_dtypes:
        check_integer(spec, forward)
    backward = fuse(graphs.backward, schedule, "bwd") if graphs.differentiable else None
    return Lowered(forward, backward, schedule)


__all__ = ["lower", "Lowered", "Plan", "Kernel", "LibCall", "Instr", "Schedule", "listing", "cost",
           "Cost", "compute_dtype", "display", "make_schedule", "quantized"]
