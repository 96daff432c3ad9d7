"""Validation of compiled kernels against the NumPy reference: every dtype, layout, size class and
stride pattern, forward and backward; integer kernels bit for bit; gradients by finite
differences (gradcheck.py)."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..dsl.library import REDUCTIONS
from ..lower import Kernel
from ..runtime.bind import bind
from ..spec.model import FLOAT_DTYPES, INT_DTYPES, OpSpec
from .cases import Case, attr_samples, case_inputs, default_attrs, layout_view, make_cases, smooth
from .compare import Comparison, forward_nan
from .gradcheck import gradcheck
from .reference import evaluate, shaped
from .report import Check, Report


def _reference(spec: OpSpec, graph, given: Dict[str, object], layout: str, extra=()):
    bound = bind(spec, given, layout, f"{spec.name} (reference)", extra)
    return bound, evaluate(graph, bound.values, bound.attrs)


# A result computed after a reduction can be ill-conditioned: where the values of a LayerNorm row
# nearly agree, the rounding of their mean reaches the gradient about 1/variance times, in any
# float32 implementation (PyTorch's included). Such results are held to the standard plus SPREAD
# times how far the exact result moves when every input and every reduced value moves by up to
# one rounding of the compute type (2^-24 relative for float32, and for float16 and bfloat16
# data, which compute in float32; 2^-53 for float64): an error no formula in that precision
# avoids.
SPREAD = 4
_ROUNDING = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -24, "float32": 2.0 ** -24,
             "float64": 2.0 ** -53}


def _moved(value, dtype: str, rng):
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        return value
    return np.asarray(value, np.float64) * (1 + _ROUNDING[dtype] * rng.uniform(-1, 1, value.shape))


def _spread(spec: OpSpec, graph, given: Dict[str, object], layout: str, dtype: str, rng,
            ref, extra=(), samples: int = 3) -> Dict[str, np.ndarray]:
    """SPREAD times the largest |exact result at moved inputs - exact result| of a few moves,
    per output of `graph`."""
    out = {k: np.zeros(np.shape(v[0])) for k, v in ref.items()}
    jitter = lambda node, arr: _moved(arr, dtype, rng) if node.op in REDUCTIONS else arr  # noqa: E731
    for _ in range(samples):
        moved = {k: _moved(v, dtype, rng) for k, v in given.items()}
        bound = bind(spec, moved, layout, f"{spec.name} (reference)",
                     [(n, _moved(d, dtype, rng), o) for n, d, o in extra])
        other = evaluate(graph, bound.values, bound.attrs, jitter=jitter)
        with np.errstate(invalid="ignore"):
            for k in out:
                out[k] = np.fmax(out[k], SPREAD * np.abs(other[k][0] - ref[k][0]))
    return out


def _reduces(graph) -> bool:
    """Whether a graph computes further with the result of a reduction (sum, mean, max ...)."""
    return any(a.op in REDUCTIONS for n in graph.nodes() for a in n.args)


def validate_op(op, dtypes: Optional[List[str]] = None, seed: int = 0) -> Report:
    """Forward and backward of every dtype against the reference, plus finite differences, for
    each variant of the operator (each choice of its str attrs, optional inputs given or not)."""
    report = Report(op.spec.name)
    for variant in op.variants:
        _validate_variant(op, variant, report, dtypes, seed,
                          f" [{variant.label()}]" if len(op.variants) > 1 else "")
    return report


def variant_inputs(spec: OpSpec, variant, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A case's arrays without the optional inputs the variant leaves out."""
    return {k: v for k, v in arrays.items()
            if not spec.input(k).optional or k in variant.given}


def _validate_variant(op, variant, report: Report, dtypes, seed: int, tag: str) -> None:
    spec, graphs = op.spec, op.graphs_of(variant)
    rng = np.random.default_rng(seed)
    lowered = op.lowered(variant)
    sched = lowered.schedule
    cases = [Case(c.label, c.layout, variant_inputs(spec, variant, c.arrays), c.views)
             for c in make_cases(spec, rng, sched.tile, sched.parallel_threshold)]
    attrs = {**default_attrs(spec), **dict(variant.choices)}
    wanted = dtypes or list(spec.dtypes)
    # units in the last place measure elementwise results; after an FFT or a matmul the round-off
    # scales with the whole signal, and only the absolute/relative standard applies
    elementwise = all(isinstance(step, Kernel) and not step.sums for step in lowered.forward.steps)
    if not elementwise and not report.notes:
        report.notes.append("no ULP distances: the forward pass has library steps (fft, matmul, "
                            "sums) whose round-off scales with the whole signal")
    if "bfloat16" in wanted and not bfloat16_available():
        wanted = [d for d in wanted if d != "bfloat16"]
        if not any("bfloat16" in n for n in report.notes):
            report.notes.append("bfloat16 not validated: the ml_dtypes package is not installed")
    reduces_fwd = _reduces(graphs.forward)
    reduces_bwd = graphs.differentiable and _reduces(graphs.backward)
    if (reduces_fwd or reduces_bwd) and not any("conditioning" in n for n in report.notes):
        report.notes.append(f"results after a reduction are held to the standard plus {SPREAD}x "
                            "their spread under one rounding of the inputs and of the reduced "
                            "values (their conditioning)")
    for dtype in [d for d in wanted if d in FLOAT_DTYPES]:
        fwd, bwd = Comparison(), Comparison()
        nb = 0
        for case in cases:
            inputs = case_inputs(case, dtype)
            given = {**inputs, **attrs, **case.attrs}
            result = op(**given, layout=case.layout)
            results = result if isinstance(result, tuple) else (result,)
            bound, ref = _reference(spec, graphs.forward, given, case.layout)
            spread = (_spread(spec, graphs.forward, given, case.layout, dtype, rng, ref)
                      if reduces_fwd else {})
            for o, actual in zip(spec.outputs, results):
                names, shape, _ = bound.outputs[o.name]
                fwd.add(actual, shaped(ref[o.name], names, shape), dtype, f"{case.label} {o.name}",
                        spread=_shaped_or_none(spread.get(o.name), ref[o.name], names, shape))
            if not graphs.differentiable:
                continue
            # gradients away from the special values: inf - inf has no gradient to compare, and an
            # exact zero sits on the kink of every leaky relu (where rounding picks the branch)
            finite = case_inputs(smooth(case, spec, rng), dtype)
            dys = tuple(rng.uniform(-1, 1, np.shape(r)).astype(dtype) for r in results)
            cattrs = {**attrs, **case.attrs}
            grads = op.backward(dys if len(dys) > 1 else dys[0], **finite, **cattrs, layout=case.layout)
            extra = [(f"d{o.name}", d, o.name) for o, d in zip(spec.outputs, dys)]
            bbound, gref = _reference(spec, graphs.backward, {**finite, **cattrs}, case.layout, extra)
            gspread = (_spread(spec, graphs.backward, {**finite, **cattrs}, case.layout, dtype,
                               rng, gref, extra) if reduces_bwd else {})
            nan_ok = forward_nan(spec, graphs, bbound)
            for name, g in zip(spec.input_names, grads):
                if name not in graphs.differentiable:
                    continue
                arr, names = bbound.values[name]
                bwd.add(g, shaped(gref[name], names, arr.shape), dtype, f"{case.label} d{name}",
                        nan_ok[name],
                        _shaped_or_none(gspread.get(name), gref[name], names, arr.shape))
            nb += 1
        check = _check(f"forward {dtype}{tag}", len(cases), fwd)
        if not elementwise:
            check.max_ulp = None
        report.checks.append(check)
        if graphs.differentiable:
            report.checks.append(_check(f"backward {dtype}{tag}", nb, bwd))
    for dtype in [d for d in wanted if d in INT_DTYPES]:
        check = check_integer_kernel(op, dtype, cases, rng, variant)
        check.what += tag
        report.checks.append(check)
    if graphs.differentiable and "float64" in spec.dtypes and "float64" in wanted:
        check = gradcheck(op, cases, attrs, rng, report.notes, graphs)
        check.what += tag
        report.checks.append(check)


def _shaped_or_none(spread, value, names, shape):
    return None if spread is None else shaped((spread, value[1]), names, shape)


def bfloat16_available() -> bool:
    """NumPy knows bfloat16 once ml_dtypes is imported (an optional package)."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def _int_values(rng, shape, dtype: str, exhaustive: bool) -> np.ndarray:
    info = np.iinfo(dtype)
    if exhaustive:  # every value of the dtype (repeated), or values spread over the whole range
        every = np.arange(info.min, info.max + 1, dtype=np.int64)
        size = int(np.prod(shape, dtype=np.int64))
        if size < every.size:
            every = every[np.linspace(0, every.size - 1, size).astype(np.int64)]
        return np.resize(every, size).reshape(shape).astype(dtype)
    arr = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np.int64)
    flat = arr.reshape(-1)
    edges = [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]
    flat[:min(len(edges), flat.size)] = edges[:flat.size]
    return arr.astype(dtype)


def check_integer_kernel(op, dtype: str, cases: List[Case], rng, variant=None) -> Check:
    """Integer kernels against the exact integer reference, bit for bit: every int8 and int16
    value in the larger cases, at the attrs' defaults and at random values in their ranges."""
    from .integer import evaluate_int, saturate
    spec = op.spec
    variant = variant or op.variants[0]
    graphs = op.graphs_of(variant)
    worst, count, where = 0.0, 0, ""
    for attrs in attr_samples(spec, rng):
        attrs.update(variant.choices)
        for case in cases:
            inputs = {}
            for k, v in case.arrays.items():
                exhaustive = dtype in ("int8", "int16") and v.size >= 256
                inputs[k] = layout_view(_int_values(rng, v.shape, dtype, exhaustive), case.views[k])
            result = op(**inputs, **attrs, layout=case.layout)
            results = result if isinstance(result, tuple) else (result,)
            bound = bind(spec, {**inputs, **attrs}, case.layout, spec.name)
            ref = evaluate_int(spec, graphs.forward, bound.values, bound.attrs)
            for o, actual in zip(spec.outputs, results):
                names, shape, _ = bound.outputs[o.name]
                want = saturate(np.asarray(shaped(ref[o.name], names, shape)), dtype)
                bad = actual != want
                if actual.dtype != np.dtype(dtype) or bad.any():
                    i = tuple(np.argwhere(bad)[0]) if bad.any() else ()
                    worst = np.inf
                    where = (f"{case.label} {o.name}: got {actual[i]!r}, expected {want[i]!r}"
                             f" with {attrs}" if i else f"{case.label}: dtype {actual.dtype}")
            count += 1
    # exact or not: a mismatch is infinitely worse than allowed, and no distance is reported
    return Check(f"forward {dtype}", count, worst, 0.0, 0 if worst == 0 else None, worst == 0, where)


def _check(what: str, cases: int, c: Comparison) -> Check:
    return Check(what, cases, c.worst, c.max_abs, c.max_ulp if what.startswith("forward") else None,
                 c.worst <= 1.0, c.where)
