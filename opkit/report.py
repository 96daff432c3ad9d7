"""What `opkit show` prints: an operator described stage by stage, each section from the stage
that owns it (the declaration, the graphs, the fixed-point attrs, the fusion notes, the kernels
with their listing and the compiler's report, the slicing, the generated source), and how a call
on arrays of given shapes runs (runtime/schedule.py)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from .errors import BuildError
from .lower import Fused, Kernel, cost, listing


def describe(op, build: bool) -> str:
    """The whole report; `build`: compile first, for the vectorization report and the source
    as built."""
    lowered = op.lowered()  # (the kernel section shows the first variant's kernels)
    out = _declaration(op) + _variants(op) + _fixed_point(op.spec) + _backward(op)
    built = None
    try:
        built = op.build() if build else None
    except BuildError as exc:
        out += ["", f"(build failed: {exc})"]
    out += ["", "## kernels and schedule"] + _fusion(lowered)
    vec = built.meta.get("vectorization", {}) if built else {}
    for plan in (lowered.forward, lowered.backward):
        if plan is not None:
            out += _steps(plan, op.spec, lowered.schedule, vec) + _slices(plan)
    out += ["", "## generated source", ""]
    out += [f"# {built.source_path}", built.source_path.read_text()] if built else [op.source()]
    return "\n".join(out)


def schedules(op, shapes: Dict[str, Tuple[int, ...]], dtype: str, layout: Optional[str],
              attrs: Dict[str, object]) -> str:
    """How a forward and a backward call on inputs of these shapes run. The arrays are
    allocated, never touched."""
    from .validate.check import bfloat16_available
    if dtype == "bfloat16" and not bfloat16_available():
        raise ValueError("--dtype bfloat16 needs the ml_dtypes package: pip install ml_dtypes")
    arrays = {name: np.empty(shape, dtype) for name, shape in shapes.items()}
    found = op.schedules(**arrays, **attrs, layout=layout)
    given = ", ".join(f"{n}[{', '.join(map(str, a.shape))}]" for n, a in arrays.items())
    out = [f"# {op.name} on {given} {dtype}" + (f" {layout}" if layout else "")]
    return "\n".join(out + [f"{kind}: {sched.describe()}" for kind, sched in found.items()])


def _declaration(op) -> List[str]:
    s = op.spec
    return [f"# {s.name}: {s.summary}", f"# declared in {s.file}", "", "## declaration", "",
            s.source.rstrip(), "", "## forward", "", op.graphs.forward.format()]


def _variants(op) -> List[str]:
    """str attrs' choices, optional inputs given or not: each variant's graphs."""
    if len(op.variants) <= 1:
        return []
    out = ["", f"## variants ({len(op.variants)}, each with kernels of its own; the first is "
           "shown above and below)", ""]
    for v in op.variants:
        graphs = op.graphs_of(v)
        out += [f"variant {v.index}: {v.label()}"]
        out += ["  forward: " + line for line in graphs.forward.format().splitlines()]
        if graphs.differentiable:
            out += ["  backward: " + line for line in graphs.backward.format().splitlines()]
    return out


def _fixed_point(spec) -> List[str]:
    from .quantize import fixed_point
    quantized = [a for a in spec.attrs if a.quantize is not None]
    if not quantized:
        return []
    out = ["", "## fixed-point attrs (integer kernels; float kernels with alpha_quant)", ""]
    for a in quantized:
        if a.default is None:
            out.append(f"{a.name}: {a.quantize} bits, no default")
            continue
        m, bits, value = fixed_point(a.default, a.quantize)
        out.append(f"{a.name}: {a.quantize} bits; default {a.default!r} is m = {m}, "
                   f"{m}/2**{bits} = {value!r} (error {value - a.default:+.3g})")
    return out


def _backward(op) -> List[str]:
    if not op.graphs.differentiable:
        return []
    how = "declared (checked against the derivation)" if op.graphs.declared else "derived"
    out = ["", f"## backward, {how}", "", op.graphs.backward.format()]
    if op.graphs.declared:
        out += ["", "derived for comparison:", op.graphs.derived.format()]
    return out


def _steps(plan, spec, sch, vec: Dict) -> List[str]:
    """Each library call with its TBE instruction, each kernel with its schedule, the
    compiler's verdict on its loops, its cost and its listing per dtype."""
    from .builder import toolchain
    from .codegen import COMPUTE
    from .lower.tbe import CALLS, REDUCTIONS
    target = toolchain().target
    out: List[str] = []
    for step in _flat_steps(plan):
        if not isinstance(step, Kernel):
            out += ["", f"{step.name}: library call {step.prim}({', '.join(map(str, step.args))})"
                    f" -> {step.result} (TBE {CALLS[step.prim]})"]
            seq = REDUCTIONS.get(step.prim)
            if seq is not None:
                out.append("  compiled (templates/opkit_reduce.h): one pass over the input, "
                           "each result by one thread; per contiguous run:")
                out += ["    " + line.format(str(step.args[0]), d=str(step.result)) for line in seq]
            continue
        k = step
        out += ["", f"kernel {k.name} ({plan.kind}): reads {', '.join(map(str, k.inputs)) or '-'}; "
                f"writes {k.describe_writes()}"]
        out.append(f"  schedule: tile {sch.tile}, one thread below {sch.parallel_threshold} elements, "
                   f"{target.vector_bytes}-byte vectors ({target.isa})")
        for ct in COMPUTE.values():
            info = vec.get(f"{k.name}_{ct.tag}")
            if info is not None:
                state = (f"vectorized, {info['bytes']}-byte vectors" if info["vectorized"]
                         else "NOT vectorized" + (f": {info['notes'][0]}" if info["notes"] else ""))
                out.append(f"  element loop on {ct.type}: {state} (compiler report)")
        for dt in spec.dtypes:
            out.append(f"  {dt}: {cost(k, dt, target.vector_bytes)}")
            out += [f"    {line}" for line in listing(k, dt)]
    return out


def _slices(plan) -> List[str]:
    """How a large call runs a plan with reductions: in slices, where (runtime/schedule.py)."""
    from .runtime.schedule import ROW_SLICE_BYTES, row_dims, row_split_bytes
    dims = row_dims(plan)
    if not dims:
        return []
    return ["", f"{plan.kind} in slices: a call whose largest input has {row_split_bytes() >> 20} MiB "
            f"or more runs the steps above on slices of about {ROW_SLICE_BYTES >> 20} MiB of it along "
            f"one of {', '.join(dims)} (the dims every reduction keeps; the outermost in memory), one "
            "slice after another on every thread: each pass after the first reads what the one "
            "before wrote from cache, not from memory (`opkit show NAME --shape ...` for a given call)"]


def _fusion(lowered) -> List[str]:
    """What became of every elementwise consumer of a conv2d or matmul result."""
    from .backend import gemm
    from .builder import toolchain
    if not lowered.fusion:
        return []
    lib = gemm()
    what = (lib.describe(toolchain().target.vector_bytes) if lib else
            "none (OPKIT_GEMM=none, or OPKIT_GEMM=blas without SciPy); fused steps run their "
            "parts one after another")
    out = ["", "## fusion", "", f"GEMM for fused calls: {what}"]
    for plan in (lowered.forward, lowered.backward):
        if plan is None:
            continue
        for step in plan.steps:
            if isinstance(step, Fused):
                epi = f"epilogue {step.epilogue.name}" if step.epilogue else "no epilogue"
                out.append(f"{plan.kind} {step.name}: {step.call.prim} + {epi}"
                           + (f" + {len(step.stats)} per-channel sums" if step.stats else "")
                           + f", fused under {', '.join(step.layouts)}")
        out += [f"  {plan.kind}: {note}" for note in plan.fusion]
    return out


def _flat_steps(plan):
    """The plan's kernels and library calls, those inside fused steps included."""
    for step in plan.steps:
        yield from (step.parts if isinstance(step, Fused) else (step,))
