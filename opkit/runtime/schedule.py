"""How a plan runs on arrays of given shapes and strides: whole, or in slices along a dim.

`execution_schedule` is a pure function of the plan's facts (`PlanFacts`, computed once per
plan), the layouts of the call's arrays and the settings (threads, clipping). The executor
(runtime/execute.py) carries out what it returns and caches it per layout; `opkit show NAME
--shape ...` prints it. The schedule never changes a result: slices along a dim the plan does
not mix, and sums across slices added in slice order, whatever the number of threads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..abi import ConvProblem
from ..dsl.library import LIBRARY
from ..kinds import Op
from ..lower.plan import Kernel, Kind, LibCall, Plan, Value
from ..lower.reduce import COMPILED_REDUCTIONS

# input bytes per slice of a resampling plan: its intermediates (the signal upsampled and its
# spectra) stay within a 2 MB L2
SLICE_BYTES = 1 << 20
# bytes of the largest input per slice of a plan with reductions: each pass after a reduction
# then reads what the pass before wrote from the 32 MB L3, not from memory (2, 4 and 8 MB
# measured alike for softmax and layer_norm at 64 MB, docs/performance.md)
ROW_SLICE_BYTES = 4 << 20


def row_split_bytes(row_slice_bytes: Optional[int] = None) -> int:
    """A plan with reductions runs in slices when its largest input has this much or more:
    four slices."""
    return 4 * (ROW_SLICE_BYTES if row_slice_bytes is None else row_slice_bytes)


@dataclass(frozen=True)
class Settings:
    """The settings a schedule depends on: the threads a call may use, whether its results are
    clipped, and the slice sizes (the module's constants unless a caller gives others)."""

    threads: int
    clip: bool = False
    slice_bytes: int = SLICE_BYTES
    row_slice_bytes: int = ROW_SLICE_BYTES

    @classmethod
    def now(cls, threads: int, clip: bool) -> "Settings":
        """The settings with the slice sizes as the module has them at this moment."""
        return cls(max(1, threads), clip, SLICE_BYTES, ROW_SLICE_BYTES)


@dataclass(frozen=True)
class ArrayLayout:
    """What the schedule reads of an array: its shape, the dim names of its axes, its byte
    strides and its size in bytes."""

    shape: Tuple[int, ...]
    names: Tuple[str, ...]
    strides: Tuple[int, ...] = ()
    nbytes: int = 0

    def size_of(self, dim: str) -> Optional[int]:
        return self.shape[self.names.index(dim)] if dim in self.names else None


@dataclass(frozen=True)
class PlanFacts:
    """What the schedule needs to know of a plan, found once per plan (`plan_facts`)."""

    batch_dims: Tuple[str, ...]       # resampling plans: dims each slice may take a part of
    row_dims: Tuple[str, ...]         # plans with reductions: dims every reduction keeps
    outputs: Tuple[Value, ...]
    summed_to: frozenset              # outputs a sum_to writes (slices may add them up)
    reread: frozenset                 # outputs later steps read

    @property
    def may_slice(self) -> bool:
        return bool(self.batch_dims or self.row_dims)


@dataclass(frozen=True)
class Slices:
    """Run the plan on slices of `length` along `dim`. With `threads` > 0, that many slices run
    at once, each on one thread; with 0, one after another, each on every thread. The
    `partial` outputs (sums over `dim`) are each slice's float64 sums, added in slice order."""

    dim: str
    length: int
    count: int
    threads: int
    partial: Tuple[Value, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class ExecSchedule:
    slices: Optional[Slices]          # None: the plan runs whole
    threads: int                      # the threads the call may use
    why: str                          # why it runs whole, or the rule that sliced it

    def describe(self) -> str:
        if self.slices is None:
            return f"runs whole on up to {self.threads} thread(s): {self.why}"
        s = self.slices
        how = (f"{s.threads} slices at a time, one thread each" if s.threads
               else f"one after another, each on up to {self.threads} thread(s)")
        text = f"runs in {s.count} slices of {s.length} along {s.dim}, {how}: {s.why}"
        if s.partial:
            text += (f"; {', '.join(map(str, s.partial))} added up across the slices in "
                     "float64, in slice order")
        return text


WHOLE = "nothing in the plan is worth slicing"


# a fused convolution of fewer output pixels runs on one thread: too few GEMM rows to split
FUSED_MIN_PIXELS = 64


def fused_threads(problem: ConvProblem, threads: int, parallel: bool) -> int:
    """The threads a fused convolution runs its blocks on (templates/opkit_conv.h carries it
    out): every thread the call may use where its GEMMs can run side by side (the generated
    micro-kernels always; SciPy's BLAS where it can be held to one thread for the call:
    backend's thread_controls) and the output has FUSED_MIN_PIXELS or more; else one."""
    return max(1, threads) if parallel and problem.pixels >= FUSED_MIN_PIXELS else 1


def plan_facts(plan: Plan) -> PlanFacts:
    batch = _batch_dims(plan)
    readers: Dict[Value, list] = {}
    for s in plan.steps:
        for v in s.reads:
            readers.setdefault(v, []).append(s)
    summed_to = frozenset(c.result for s in plan.steps
                          for c in ((s,) if isinstance(s, LibCall) else getattr(s, "sums", ()))
                          if c.prim == Op.SUM_TO and c.result.kind is Kind.OUTPUT)
    reread = frozenset(v for v in readers if v.kind is Kind.OUTPUT)
    return PlanFacts(batch, () if batch else row_dims(plan), tuple(v for _, v in plan.outputs),
                     summed_to, reread)


def execution_schedule(facts: PlanFacts, inputs: Sequence[ArrayLayout],
                       outputs: Mapping[Value, ArrayLayout], sizes: Mapping[str, int],
                       settings: Settings) -> ExecSchedule:
    """How a plan with these facts runs on inputs and outputs of these layouts, `sizes` the
    size of every dim, with these settings."""
    threads = max(1, settings.threads)
    sliced: object
    if facts.batch_dims:
        sliced = _resampling_slices(facts, inputs, outputs, sizes, threads, settings.slice_bytes)
    elif facts.row_dims:
        sliced = _row_slices(facts, inputs, outputs, settings.clip, settings.row_slice_bytes)
    else:
        return ExecSchedule(None, threads, WHOLE)
    if isinstance(sliced, Slices):
        return ExecSchedule(sliced, threads, sliced.why)
    return ExecSchedule(None, threads, str(sliced))


def _resampling_slices(facts: PlanFacts, inputs, outputs, sizes, threads: int, unit: int):
    """A DFT resampling's intermediates (four times the input for up=2, and their spectra)
    outgrow the caches, and every pass of the transforms then goes to memory. Slices of about
    SLICE_BYTES of input keep them in L2, one slice per thread, each transform on one thread."""
    biggest = max((a.nbytes for a in inputs), default=0)
    if biggest < 4 * unit:
        return f"the largest input ({biggest} bytes) is under {4 * unit}"
    for d in facts.batch_dims:
        n = sizes.get(d, 1)
        if n < 2 * threads or _partial_outputs(facts, d, n, outputs) != ():
            continue   # (an output, or a sum_to's target, shorter along d)
        length = max(1, min(n // (2 * threads), int(unit * n // biggest)))
        return Slices(d, length, -(-n // length), threads, (),
                      f"a resampling's intermediates stay in L2 in slices of about "
                      f"{unit} input bytes")
    return f"no dim of {', '.join(facts.batch_dims)} has {2 * threads} or more to slice"


def _row_slices(facts: PlanFacts, inputs, outputs, clip: bool, unit: int):
    """Each pass of a plan with reductions reads what the one before wrote (a row max, the
    exponentials and their sum, the quotient): over a large array every pass goes to memory.
    A slice of about ROW_SLICE_BYTES of its largest input keeps them in cache. Slices run one
    after another, each on every thread; the slicing depends on the shapes alone. The dim: the
    outermost in memory of the largest input among those the reductions keep whose slices come
    near that size."""
    big = max(inputs, key=lambda a: a.nbytes, default=ArrayLayout((), ()))
    if big.nbytes < row_split_bytes(unit):
        return f"the largest input ({big.nbytes} bytes) is under {row_split_bytes(unit)}"
    dims = sorted((d for d in facts.row_dims if (big.size_of(d) or 1) > 1),
                  key=lambda d: -abs(big.strides[big.names.index(d)]))
    for d in dims:
        n = big.shape[big.names.index(d)]
        length = max(1, unit * n // big.nbytes)
        if big.nbytes * length // n > 2 * unit and d != dims[-1]:
            continue   # too few along d for slices in cache: a dim further in
        partial = _partial_outputs(facts, d, n, outputs)
        if partial is None:
            return f"an output other than a weight's gradient is shorter along {d}"
        if partial and clip:
            return f"clipped per slice, a sum across slices along {d} would not be"
        return Slices(d, length, -(-n // length), 0, partial,
                      f"each pass after a reduction reads the one before from cache in slices "
                      f"of about {unit} bytes")
    return f"the largest input has no dim of {', '.join(facts.row_dims)} to slice"


def _partial_outputs(facts: PlanFacts, d: str, n: int,
                     outputs: Mapping[Value, ArrayLayout]) -> Optional[Tuple[Value, ...]]:
    """The outputs that do not run the whole length n along d: each a sum_to's result (a
    weight's gradient), which slices along d add up in float64 across the slices. None when
    some other output is shorter along d, or a later step reads such a sum."""
    partial = []
    for vid in facts.outputs:
        if outputs[vid].size_of(d) == n:
            continue
        if vid not in facts.summed_to or vid in facts.reread:
            return None
        partial.append(vid)
    return tuple(partial)


def _batch_dims(plan: Plan) -> Tuple[str, ...]:
    """The dims (of N, C) a plan worth running in slices treats one slice at a time: it has a
    library call that says so (`LibraryPrimitive.mixes`: a DFT resampling), none of those mixes
    values along them, and nothing else but elementwise kernels and sum_tos (checked per call)
    runs. Empty for every other plan."""
    along: set = set()
    slicing = False
    for s in plan.steps:
        mixes = LIBRARY[s.prim].mixes if isinstance(s, LibCall) else None
        if mixes is not None and isinstance(s, LibCall):
            along.update(mixes(s.params))
            slicing = True
        elif not (isinstance(s, Kernel) and not s.sums
                  or isinstance(s, LibCall) and s.prim == Op.SUM_TO):
            return ()
    return tuple(d for d in ("N", "C") if slicing and d not in along)


def row_dims(plan: Plan) -> Tuple[str, ...]:
    """The dims a plan with reductions may run slice by slice along: those every reduction of
    the plan keeps, that no mean's gradient divides by (`share`), where the plan has nothing
    but kernels, reductions and sum_tos (a sum_to over the dim is added up across the slices:
    checked per call, `_partial_outputs`). Empty for plans without reductions."""
    keep: Optional[set] = None
    excluded: set = set()
    terminal = summed_for_outputs(plan)
    for s in plan.steps:
        if isinstance(s, Kernel):
            if s.dims is None:
                return ()
            calls = [c for c in s.sums if c.prim != Op.SUM_TO and c.result not in terminal]
        elif isinstance(s, LibCall) and (s.prim in (Op.SUM, Op.MEAN) or s.prim in COMPILED_REDUCTIONS):
            calls = [s]
        elif isinstance(s, LibCall) and s.prim == Op.SHARE:
            excluded.update(s.params[0])
            continue
        elif isinstance(s, LibCall) and s.prim == Op.SUM_TO:
            continue
        else:
            return ()
        for c in calls:
            keep = set(c.params[0]) if keep is None else keep & set(c.params[0])
    return tuple(sorted(keep - excluded)) if keep else ()


def summed_for_outputs(plan: Plan) -> set:
    """The temps a sum folded into a kernel writes that nothing but sum_tos into outputs read
    (a weight's gradient, summed over N, H and W): they are kept in float64, as added up, for
    the sum_to, and a plan in slices adds them up across its slices."""
    readers: Dict[Value, list] = {}
    for s in plan.steps:
        for v in s.reads:
            readers.setdefault(v, []).append(s)
    return {c.result for s in plan.steps if isinstance(s, Kernel) for c in s.sums
            if c.prim == Op.SUM and c.result in readers
            and all(isinstance(r, LibCall) and r.prim == Op.SUM_TO and r.result.kind is Kind.OUTPUT
                    for r in readers[c.result])}
