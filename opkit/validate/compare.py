"""Comparing compiled results with the reference: the precision standard per dtype, ULP
distances, NaN and inf rules.

Precision standards (docs/precision.md, the CANN criteria): float16 |a-e| <= 1e-3 + 1e-3|e|,
float32 1e-4 + 1e-4|e|, float64 1e-10 + 1e-10|e|; the maximum distance in units in the last
place is reported too, over the expected values at or above the absolute floor (atol): below
it the absolute part decides, and a value near zero may be millions of its own units away while
well inside the standard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Type

import numpy as np

from ..dsl import named
from ..dsl.graph import OpGraphs
from ..spec.model import OpSpec
from .reference import evaluate


# bfloat16 keeps 8 bits of mantissa: its standard is two of its units, 2 * 2**-8
TOLERANCE = {"float16": (1e-3, 1e-3), "float32": (1e-4, 1e-4), "float64": (1e-10, 1e-10),
             "bfloat16": (8e-3, 8e-3)}


_SINT: Dict[str, Type[np.signedinteger]] = {"float16": np.int16, "float32": np.int32,
                                            "float64": np.int64, "bfloat16": np.int16}


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
    max_ulp: Optional[int] = None   # over the expected values of magnitude >= atol, if any
    where: str = ""

    def add(self, actual: np.ndarray, expected: np.ndarray, dtype: str, label: str,
            nan_ok: Optional[np.ndarray] = None, spread: Optional[np.ndarray] = None) -> None:
        """Compare one result. A NaN must be matched by a NaN; where both are NaN they count as
        equal only where `nan_ok` holds (given for gradients: where the forward result is NaN).
        `spread` (finite where given) widens the standard element by element: the conditioning
        of a result after a reduction (check.SPREAD)."""
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
            i = first_true(nan_a != nan_e)
            self._fail(f"{label}: NaN mismatch at {i}: got {a[i]}, expected {e[i]}")
            return
        if nan_ok is not None and (nan_a & ~nan_ok).any():
            i = first_true(nan_a & ~nan_ok)
            self._fail(f"{label}: NaN at {i} where the forward result is finite")
            return
        e_rounded = e.astype(dtype).astype(np.float64)
        inf = np.isinf(e_rounded) | np.isinf(a)
        if (inf & (a != e_rounded)).any():
            i = first_true(inf & (a != e_rounded))
            self._fail(f"{label}: at {i} got {a[i]}, expected {e[i]}")
            return
        fin = ~(nan_a | inf)
        if fin.any():
            err = np.abs(a[fin] - e[fin])
            allowed = atol + rtol * np.abs(e[fin])
            if spread is not None:
                allowed = allowed + np.nan_to_num(np.broadcast_to(spread, a.shape)[fin], nan=0.0,
                                                  posinf=0.0)
            ratio = err / allowed
            k = int(np.argmax(ratio))
            if ratio[k] > self.worst:
                self.worst = float(ratio[k])
                self.where = f"{label}: got {a[fin][k]!r}, expected {e[fin][k]!r}"
            self.max_abs = max(self.max_abs, float(err.max()))
        # ULPs where the relative part of the standard speaks: below its absolute floor a
        # value near zero is many of its own (tiny) units away and still well within it
        big = np.abs(e) >= atol
        if big.any():
            self.max_ulp = max(self.max_ulp or 0, ulp_distance(a[big], e[big], dtype))

    def _fail(self, text: str) -> None:
        self.worst = math.inf
        self.where = text


def first_true(mask: np.ndarray) -> Tuple[int, ...]:
    """The index of the first true element."""
    return tuple(int(k) for k in np.argwhere(mask)[0])


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
