"""A hand-written backward, checked against the one derived from forward when it is loaded."""
from __future__ import annotations

from dataclasses import replace
from typing import Tuple

import numpy as np

from ..dsl.graph import OpGraphs
from ..errors import SpecError
from ..runtime.bind import bind
from ..spec.model import Binding, OpSpec
from .cases import attr_samples, case_inputs, make_cases
from .compare import first_true, forward_nan
from .reference import evaluate, shaped
from ..kinds import Op


def check_declared_backward(spec: OpSpec, graphs: OpGraphs, seed: int = 0) -> None:
    """A hand-written backward must agree with the derived one (away from kinks), at the attrs'
    defaults and at random values inside their ranges. Any failure is a SpecError."""
    if spec.backward is None:
        return  # nothing hand-written
    try:
        _compare_backwards(spec, spec.backward, graphs, seed)
    except SpecError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise SpecError(f"backward: the hand-written gradients could not be checked against the "
                        f"derived ones: {exc}", spec.backward[0].name_loc) from None


def _check_dtype(spec: OpSpec) -> str:
    """The widest float dtype the operator declares: the arguments are checked in it."""
    floats = [d for d in ("float64", "float32", "float16") if d in spec.dtypes]
    return floats[0] if floats else "float64"


def _compare_backwards(spec: OpSpec, backward: Tuple[Binding, ...], graphs: OpGraphs,
                       seed: int) -> None:
    from ..dsl.ir import format_expr
    rng = np.random.default_rng(seed)
    dtype = _check_dtype(spec)
    variant = graphs.variant
    cases = [c for c in make_cases(spec, rng, special=False)[:12]
             if min((v.size for v in c.arrays.values()), default=0) > 0]
    if variant is not None:  # without the optional inputs this variant leaves out
        cases = [replace(c, arrays={k: v for k, v in c.arrays.items()
                                    if not spec.input(k).optional or k in variant.given})
                 for c in cases]
    for attrs in attr_samples(spec, rng):
        if variant is not None:
            attrs.update(variant.choices)
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
            for b in backward:
                if b.name not in want:
                    continue
                arr, names = bbound.values[b.name]
                a = np.asarray(shaped(got[b.name], names, arr.shape))
                e = np.asarray(shaped(want[b.name], names, arr.shape))
                nan = np.isnan(a) & np.isnan(e)
                bad = ~(np.isclose(a, e, rtol=1e-9, atol=1e-12) | (nan & nan_ok[b.name]))
                if not bad.any():
                    continue
                i = first_true(bad)
                derived = next(g for n, g in graphs.derived.outputs if n == b.name)
                inner = derived.args[0] if derived.op == Op.SUM_TO else derived
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
