"""Validation of compiled kernels against the NumPy reference, and finite-difference gradients.

Precision standards (DESIGN.md §7): float16 |a-e| <= 1e-3 + 1e-3|e|, float32 1e-4 + 1e-4|e|,
float64 1e-10 + 1e-10|e|; the maximum distance in units in the last place is reported too.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..dsl import named
from ..dsl.graph import OpGraphs
from ..errors import SpecError
from ..spec.model import FLOAT_DTYPES, INT_DTYPES, LAYOUT_DIMS, LAYOUT_PHYSICAL, OpSpec
from ..runtime.bind import bind
from .reference import evaluate, shaped

TOLERANCE = {"float16": (1e-3, 1e-3), "float32": (1e-4, 1e-4), "float64": (1e-10, 1e-10)}
_UINT = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}
_SINT = {"float16": np.int16, "float32": np.int32, "float64": np.int64}
DIM_SIZES = {"N": 2, "C": 3, "H": 5, "W": 7}


# ------------------------------------------------------------------------------- comparison

def ulp_distance(actual: np.ndarray, expected: np.ndarray, dtype: str) -> int:
    """Largest distance in representable steps between actual and expected rounded to dtype."""
    a = np.ascontiguousarray(actual, dtype=dtype)
    e = np.ascontiguousarray(expected.astype(dtype))
    ok = np.isfinite(a) & np.isfinite(e)
    if not ok.any():
        return 0
    ia = a[ok].view(_SINT[dtype]).astype(np.int64)
    ie = e[ok].view(_SINT[dtype]).astype(np.int64)
    top = np.int64(np.iinfo(_SINT[dtype]).min)
    # map sign-magnitude bit patterns to a monotone integer line
    ia = np.where(ia < 0, top - ia, ia)
    ie = np.where(ie < 0, top - ie, ie)
    return int(np.max(np.abs(ia - ie)))


@dataclass
class Comparison:
    worst: float = 0.0        # largest error / allowed error; <= 1 passes
    max_abs: float = 0.0
    max_ulp: int = 0
    where: str = ""

    def add(self, actual: np.ndarray, expected: np.ndarray, dtype: str, label: str,
            nan_ok: Optional[np.ndarray] = None) -> None:
        """Compare one result. A NaN must be matched by a NaN; where both are NaN they count as
        equal only where `nan_ok` holds (given for gradients: where the forward result is NaN)."""
        atol, rtol = TOLERANCE[dtype]
        a = np.asarray(actual, dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        if a.shape != e.shape:
            self._fail(f"{label}: shape {a.shape}, expected {e.shape}")
            return
        if a.size == 0:
            return
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        if (nan_a != nan_e).any():
            i = _first(nan_a != nan_e)
            self._fail(f"{label}: NaN mismatch at {i}: got {a[i]}, expected {e[i]}")
            return
        if nan_ok is not None and (nan_a & ~nan_ok).any():
            i = _first(nan_a & ~nan_ok)
            self._fail(f"{label}: NaN at {i} where the forward result is finite")
            return
        e_rounded = e.astype(dtype).astype(np.float64)
        inf = np.isinf(e_rounded) | np.isinf(a)
        if (inf & (a != e_rounded)).any():
            i = _first(inf & (a != e_rounded))
            self._fail(f"{label}: at {i} got {a[i]}, expected {e[i]}")
            return
        fin = ~(nan_a | inf)
        if fin.any():
            err = np.abs(a[fin] - e[fin])
            ratio = err / (atol + rtol * np.abs(e[fin]))
            k = int(np.argmax(ratio))
            if ratio[k] > self.worst:
                self.worst = float(ratio[k])
                self.where = f"{label}: got {a[fin][k]!r}, expected {e[fin][k]!r}"
            self.max_abs = max(self.max_abs, float(err.max()))
        self.max_ulp = max(self.max_ulp, ulp_distance(a, e, dtype))

    def _fail(self, text: str) -> None:
        self.worst = math.inf
        self.where = text


def _first(mask: np.ndarray) -> Tuple[int, ...]:
    """The index of the first true element."""
    return tuple(int(k) for k in np.argwhere(mask)[0])


@dataclass
class Check:
    what: str                 # e.g. "forward float16"
    cases: int
    worst: float
    max_abs: float
    max_ulp: Optional[int]
    passed: bool
    detail: str = ""


@dataclass
class Report:
    op: str
    checks: List[Check] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    def summary(self) -> str:
        if not self.ok:
            bad = next(c for c in self.checks if not c.passed)
            return f"FAIL {bad.what}: {bad.detail}"
        ulps = {}
        for c in self.checks:
            if c.what.startswith("forward") and c.max_ulp is not None:
                dt = c.what.split()[-1]
                ulps[dt] = max(ulps.get(dt, 0), c.max_ulp)
        grad = [c for c in self.checks if c.what.startswith("gradcheck")]
        parts = [f"{dt.replace('float', 'f')} {u} ulp" for dt, u in ulps.items()]
        if not ulps:
            worst = max((c.worst for c in self.checks if c.what.startswith("forward")), default=0)
            parts.append(f"within {worst:.2g} of the allowed error")
        if grad:
            parts.append(f"grad rel err {max(g.max_abs for g in grad):.1e}")
        return "pass (" + ", ".join(parts) + ")"

    def to_dict(self) -> dict:
        return {"op": self.op, "ok": self.ok, "summary": self.summary(),
                "checks": [asdict(c) for c in self.checks], "notes": self.notes}

    def format(self) -> str:
        rows = [f"{self.op}: {self.summary()}"]
        for c in self.checks:
            ulp = "-" if c.max_ulp is None else str(c.max_ulp)
            rows.append(f"  {c.what:<22} {c.cases:>3} cases  worst {c.worst:8.3g} of allowed  "
                        f"max |err| {c.max_abs:9.3g}  max ulp {ulp:>4}  {'ok' if c.passed else 'FAIL'}"
                        + ("" if c.passed else f"  {c.detail}"))
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows)


# ------------------------------------------------------------------------------- inputs

@dataclass
class Case:
    label: str
    layout: str
    arrays: Dict[str, np.ndarray]     # float64 values, cast by the caller
    views: Dict[str, str]             # how each input is laid out: "", "T", "rev", "step"


def _main_input(spec: OpSpec) -> str:
    for o in spec.outputs:
        if o.like:
            return o.like
    return spec.inputs[0].name


def _values(rng, shape, domain, special: bool) -> np.ndarray:
    lo, hi = domain
    arr = rng.uniform(lo, hi, size=shape)
    if special and arr.size >= 16:
        flat = arr.reshape(-1)
        picks = rng.choice(flat.size, size=5, replace=False)
        for p, v in zip(picks, (0.0, -0.0, np.inf, -np.inf, np.nan)):
            flat[p] = v
    return arr


def _full_shapes(spec: OpSpec, layout: str, tile: int, threshold: int) -> List[Tuple[str, Dict[str, int]]]:
    """(label, dim sizes) per case; positional dims are named '@k'."""
    if layout in LAYOUT_DIMS:
        return [("small", dict(DIM_SIZES)),
                ("odd", {"N": 1, "C": 5, "H": 3, "W": 9}),
                ("unit", {"N": 1, "C": 1, "H": 1, "W": 1}),
                ("empty", {"N": 0, "C": 3, "H": 2, "W": 2}),
                ("threaded", {"N": 2, "C": 8, "H": 41, "W": max(threshold // 600, 5)})]
    shapes = [("0-d", ()), ("empty", (0,)), ("one", (1,)), ("odd", (37,)), ("2-d", (5, 7)),
              ("4-d", (2, 3, 4, 5)), ("tile+1", (tile + 1,)), ("threaded", (threshold + 77,))]
    return [(label, {f"@{len(s) - 1 - i}": n for i, n in enumerate(s)}) for label, s in shapes]


def make_cases(spec: OpSpec, rng, tile: int = 1024, threshold: int = 32768,
               special: bool = True) -> List[Case]:
    main = _main_input(spec)
    cases = []
    for layout in spec.layouts:
        anchor = LAYOUT_PHYSICAL.get(layout)
        for label, sizes in _full_shapes(spec, layout, tile, threshold):
            if anchor is None and any(i.shape for i in spec.inputs) and not sizes:
                continue
            full_names = anchor if anchor else tuple(sorted(sizes, key=lambda n: -int(n[1:])))
            arrays, views = {}, {}
            for k, i in enumerate(spec.inputs):
                if i.shape is not None:
                    shape = tuple(sizes.get(d, 3 + (hash(d) % 3)) for d in i.shape)
                elif (i.layouts_declared and layout in LAYOUT_DIMS) or i.name == main:
                    shape = tuple(sizes[n] for n in full_names)
                else:
                    # a broadcast partner: some dims of size 1, or fewer dims (NumPy rules)
                    full = [sizes[n] for n in full_names]
                    pattern = k % 3
                    if pattern == 1 and full:
                        full = [1 if j % 2 == 0 else s for j, s in enumerate(full)]
                    elif pattern == 2 and len(full) > 1:
                        full = full[1:]
                    shape = tuple(full)
                arrays[i.name] = _values(rng, shape, i.domain, special and i.name == main)
                views[i.name] = ""
            cases.append(Case(f"{layout} {label}", layout, arrays, views))
            if label in ("2-d", "small", "odd", "4-d"):
                for view in ("T", "rev", "step"):
                    c = Case(f"{layout} {label} {view}", layout,
                             {k: v.copy() for k, v in arrays.items()}, {k: view for k in arrays})
                    cases.append(c)
    return cases


def _smooth(case: Case, spec: OpSpec, rng) -> Case:
    """The case with its special values (0, inf, nan) replaced by ordinary ones."""
    arrays = {}
    for k, v in case.arrays.items():
        lo, hi = spec.input(k).domain
        bad = ~np.isfinite(v) | (v == 0)
        arrays[k] = np.where(bad, rng.uniform(lo, hi, v.shape), v) if bad.any() else v
    return Case(case.label, case.layout, arrays, case.views)


def layout_view(arr: np.ndarray, view: str) -> np.ndarray:
    """The same values in a non-contiguous arrangement (values and shape are unchanged)."""
    if arr.ndim == 0 or view == "":
        return arr
    if view == "T":  # stored transposed: a Fortran-ordered copy
        return np.asfortranarray(arr)
    if view == "rev":  # negative strides along every axis
        buf = np.ascontiguousarray(arr[(slice(None, None, -1),) * arr.ndim])
        return buf[(slice(None, None, -1),) * arr.ndim]
    if view == "step":  # every other element of a bigger buffer
        big = np.zeros(arr.shape[:-1] + (arr.shape[-1] * 2,), dtype=arr.dtype)
        big[..., ::2] = arr
        return big[..., ::2]
    raise ValueError(view)


def case_inputs(case: Case, dtype: str) -> Dict[str, np.ndarray]:
    return {k: layout_view(v.astype(dtype), case.views[k]) for k, v in case.arrays.items()}


def default_attrs(spec: OpSpec) -> Dict[str, object]:
    out = {}
    for a in spec.attrs:
        if not a.required:
            out[a.name] = a.default
        elif a.type == "bool":
            out[a.name] = True
        elif a.range is not None and math.isfinite(a.range.low) and math.isfinite(a.range.high):
            mid = (a.range.low + a.range.high) / 2
            out[a.name] = int(round(mid)) if a.type == "int" else mid
        else:
            out[a.name] = 1 if a.type == "int" else 0.5
    return out


# ------------------------------------------------------------------------------- checks

def _reference(spec: OpSpec, graph, given: Dict[str, object], layout: str, extra=()):
    bound = bind(spec, given, layout, f"{spec.name} (reference)", extra)
    return bound, evaluate(graph, bound.values, bound.attrs)


def forward_nan(spec: OpSpec, graphs: OpGraphs, bound) -> Dict[str, np.ndarray]:
    """Per differentiable input of a bound call, the elements whose gradient may be NaN: those
    that reach a NaN forward result (a NaN gradient anywhere else is an error)."""
    ref = evaluate(graphs.forward, bound.values, bound.attrs)
    out = {}
    for name in graphs.differentiable:
        arr, names = bound.values[name]
        hits = np.zeros(arr.shape, dtype=bool)
        for value, value_names in ref.values():
            nan = np.isnan(value)
            if nan.any():
                hits |= named.sum_to(nan.astype(np.int64), value_names, names, arr.shape) > 0
        out[name] = hits
    return out


def validate_op(op, dtypes: Optional[List[str]] = None, seed: int = 0) -> Report:
    """Forward and backward of every dtype against the reference, plus finite differences."""
    spec, graphs = op.spec, op.graphs
    rng = np.random.default_rng(seed)
    sched = op.lowered().schedule
    cases = make_cases(spec, rng, sched.tile, sched.parallel_threshold)
    attrs = default_attrs(spec)
    report = Report(spec.name)
    wanted = dtypes or list(spec.dtypes)
    # units in the last place measure elementwise results; after an FFT or a matmul the round-off
    # scales with the whole signal, and only the absolute/relative standard applies
    elementwise = all(isinstance(step, Kernel) for step in op.lowered().forward.steps)
    if not elementwise:
        report.notes.append("no ULP distances: the forward pass has library steps (fft, matmul, "
                            "sums) whose round-off scales with the whole signal")
    for dtype in [d for d in wanted if d in FLOAT_DTYPES]:
        fwd, bwd = Comparison(), Comparison()
        nb = 0
        for case in cases:
            inputs = case_inputs(case, dtype)
            given = {**inputs, **attrs}
            result = op(**given, layout=case.layout)
            results = result if isinstance(result, tuple) else (result,)
            bound, ref = _reference(spec, graphs.forward, given, case.layout)
            for o, actual in zip(spec.outputs, results):
                names, shape, _ = bound.outputs[o.name]
                fwd.add(actual, shaped(ref[o.name], names, shape), dtype, f"{case.label} {o.name}")
            if not graphs.differentiable:
                continue
            # gradients away from the special values: inf - inf has no gradient to compare, and an
            # exact zero sits on the kink of every leaky relu (where rounding picks the branch)
            finite = case_inputs(_smooth(case, spec, rng), dtype)
            dys = tuple(rng.uniform(-1, 1, np.shape(r)).astype(dtype) for r in results)
            grads = op.backward(dys if len(dys) > 1 else dys[0], **finite, **attrs, layout=case.layout)
            extra = [(f"d{o.name}", d, o.name) for o, d in zip(spec.outputs, dys)]
            bbound, gref = _reference(spec, graphs.backward, {**finite, **attrs}, case.layout, extra)
            nan_ok = forward_nan(spec, graphs, bbound)
            for name, g in zip(spec.input_names, grads):
                if name not in graphs.differentiable:
                    continue
                arr, names = bbound.values[name]
                bwd.add(g, shaped(gref[name], names, arr.shape), dtype, f"{case.label} d{name}",
                        nan_ok[name])
            nb += 1
        check = _check(f"forward {dtype}", len(cases), fwd)
        if not elementwise:
            check.max_ulp = None
        report.checks.append(check)
        if graphs.differentiable:
            report.checks.append(_check(f"backward {dtype}", nb, bwd))
    for dtype in [d for d in wanted if d in INT_DTYPES]:
        report.checks.append(check_integer_kernel(op, dtype, cases, rng))
    if graphs.differentiable and "float64" in spec.dtypes and "float64" in wanted:
        report.checks.append(gradcheck(op, cases, attrs, rng, report.notes))
    return report


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


def check_integer_kernel(op, dtype: str, cases: List[Case], rng) -> Check:
    """Integer kernels against the exact integer reference, bit for bit: every int8 and int16
    value in the larger cases, at the attrs' defaults and at random values in their ranges."""
    from .integer import evaluate_int, saturate
    spec, graphs = op.spec, op.graphs
    worst, count, where = 0.0, 0, ""
    for attrs in attr_samples(spec, rng):
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


def gradcheck(op, cases: List[Case], attrs, rng, notes: List[str], h: float = 1e-6,
              tol: float = 1e-6) -> Check:
    """Central differences of the compiled float64 forward against the compiled backward, at
    ordinary points (no zeros, infinities or NaN) where the forward result is finite."""
    spec, graphs = op.spec, op.graphs
    worst, count, where = 0.0, 0, ""
    for case in cases:
        contiguous = not any(case.views.values())
        if not contiguous or min((v.size for v in case.arrays.values()), default=0) == 0:
            continue
        base = _smooth(case, spec, rng).arrays
        if not all(np.isfinite(t).all() for t in _outputs(op(**base, **attrs, layout=case.layout))):
            notes.append(f"gradcheck skipped {case.label}: the forward result is not finite there")
            continue
        for _ in range(5):
            dirs = {k: rng.standard_normal(np.shape(v)) for k, v in base.items()
                    if k in graphs.differentiable}
            if not _stable(op, base, dirs, attrs, case.layout, h):
                base = {k: v + rng.uniform(-1e-3, 1e-3, np.shape(v)) for k, v in base.items()}
                continue
            ys = _outputs(op(**base, **attrs, layout=case.layout))
            dys = tuple(rng.standard_normal(np.shape(t)) for t in ys)
            grads = op.backward(dys if len(dys) > 1 else dys[0], **base, **attrs, layout=case.layout)
            for name, g in zip(spec.input_names, grads):
                if name not in dirs:
                    continue

                def loss(sign: float):
                    moved = dict(base)
                    moved[name] = base[name] + sign * h * dirs[name]
                    outs = _outputs(op(**moved, **attrs, layout=case.layout))
                    terms = [d * o for d, o in zip(dys, outs)]
                    return (math.fsum(float(np.sum(t)) for t in terms),
                            math.fsum(float(np.sum(np.abs(t))) for t in terms))

                (up, mag), (down, _) = loss(1.0), loss(-1.0)
                fd = (up - down) / (2 * h)
                an = float(np.sum(g * dirs[name]))
                label = f"{case.label} d{name}: finite difference {fd!r}, backward {an!r}"
                count += 1
                if not (math.isfinite(fd) and math.isfinite(an)):
                    # the forward is finite here, so is its derivative: NaN or inf is a failure
                    worst, where = math.inf, label
                    continue
                # the difference quotient carries rounding noise of about eps * sum|terms| / h
                noise = 10 * np.finfo(np.float64).eps * mag / h
                scale = max(abs(fd), abs(an)) + noise / tol
                err = abs(fd - an) / scale if scale else 0.0  # 0 / 0: both are exactly 0
                if err > worst:
                    worst, where = err, label
            break
        else:
            notes.append(f"gradcheck skipped {case.label}: every direction crossed a kink")
    return Check("gradcheck float64", count, worst / tol, worst, None, worst <= tol, where)


def _outputs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _stable(op, base, dirs, attrs, layout, h) -> bool:
    """No kink between x - h*v and x + h*v: no branch condition of the forward graph (a where's
    condition, which argument min or max picks, the sign abs sees ...) changes."""
    spec = op.spec
    masks = []
    for sign in (-1.0, 1.0):
        moved = {k: (v + sign * h * dirs[k]) if k in dirs else v for k, v in base.items()}
        m: List[np.ndarray] = []
        bound = bind(spec, {**moved, **attrs}, layout, spec.name)
        evaluate(op.graphs.forward, bound.values, bound.attrs, masks=m)
        masks.append(m)
    return all(np.array_equal(a, b) for a, b in zip(*masks))


def attr_samples(spec: OpSpec, rng, count: int = 2) -> List[Dict[str, object]]:
    """The defaults, then `count` random points inside each attr's range."""
    samples = [default_attrs(spec)]
    for _ in range(count):
        attrs = {}
        for a in spec.attrs:
            lo, hi = (a.range.low, a.range.high) if a.range else (-2.0, 2.0)
            lo, hi = max(lo, -4.0), min(hi, 4.0)
            if a.type == "bool":
                attrs[a.name] = bool(rng.integers(2))
            elif a.type == "int":
                attrs[a.name] = int(rng.integers(int(math.ceil(lo)), int(math.floor(hi)) + 1)) \
                    if math.floor(hi) >= math.ceil(lo) else default_attrs(spec)[a.name]
            else:
                v = float(rng.uniform(lo, hi)) if hi > lo else lo
                attrs[a.name] = v if a.range is None or v in a.range else default_attrs(spec)[a.name]
        samples.append(attrs)
    return samples


def check_declared_backward(spec: OpSpec, graphs: OpGraphs, seed: int = 0) -> None:
    """A hand-written backward must agree with the derived one (away from kinks), at the attrs'
    defaults and at random values inside their ranges. Any failure is a SpecError."""
    try:
        _compare_backwards(spec, graphs, seed)
    except SpecError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise SpecError(f"backward: the hand-written gradients could not be checked against the "
                        f"derived ones: {exc}", spec.backward[0].name_loc) from None


def _check_dtype(spec: OpSpec) -> str:
    """The widest float dtype the operator declares: the arguments are checked in it."""
    floats = [d for d in ("float64", "float32", "float16") if d in spec.dtypes]
    return floats[0] if floats else "float64"


def _compare_backwards(spec: OpSpec, graphs: OpGraphs, seed: int) -> None:
    from ..dsl.ir import format_expr
    rng = np.random.default_rng(seed)
    dtype = _check_dtype(spec)
    cases = [c for c in make_cases(spec, rng, special=False)[:12]
             if min((v.size for v in c.arrays.values()), default=0) > 0]
    for attrs in attr_samples(spec, rng):
        for case in cases:
            given = {**case_inputs(case, dtype), **attrs}
            bound = bind(spec, given, case.layout, spec.name)
            extra = [(f"d{o.name}", rng.uniform(-1, 1, bound.outputs[o.name][1]), o.name)
                     for o in spec.outputs]
            bbound = bind(spec, given, case.layout, spec.name, extra)
            # the gradients are compared on the float64 values (rounded to float16, random
            # values would land on a kink such as x == 0.5 now and then)
            bbound = replace(bbound, values={k: (case.arrays.get(k, v), names)
                                             for k, (v, names) in bbound.values.items()})
            got = evaluate(graphs.backward, bbound.values, bbound.attrs)
            want = evaluate(graphs.derived, bbound.values, bbound.attrs)
            nan_ok = forward_nan(spec, graphs, bbound)
            for b in spec.backward:
                if b.name not in want:
                    continue
                arr, names = bbound.values[b.name]
                a = np.asarray(shaped(got[b.name], names, arr.shape))
                e = np.asarray(shaped(want[b.name], names, arr.shape))
                nan = np.isnan(a) & np.isnan(e)
                bad = ~(np.isclose(a, e, rtol=1e-9, atol=1e-12) | (nan & nan_ok[b.name]))
                if not bad.any():
                    continue
                i = _first(bad)
                derived = next(g for n, g in graphs.derived.outputs if n == b.name)
                inner = derived.args[0] if derived.op == "sum_to" else derived
                at = ", ".join(f"{k}={v!r}" for k, v in attrs.items())
                where = f"({case.label} case{', ' + at if at else ''})"
                if nan[i]:
                    raise SpecError(
                        f"backward.{b.name}: the gradient is NaN where the forward result is "
                        f"finite, hand-written and derived alike {where}; check the expressions "
                        f"or keep inputs.{b.name}.domain where they are defined", b.loc)
                raise SpecError(
                    f"backward.{b.name}: the hand-written gradient disagrees with the one derived "
                    f"from forward: {float(a[i]):.6g} instead of {float(e[i]):.6g} {where}; the "
                    f"derived gradient is {format_expr(inner)}", b.loc)
