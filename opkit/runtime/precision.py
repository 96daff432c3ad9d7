"""Precision modes: which dtype a call computes in, and fixed-point slopes.

must_keep_origin_dtype  compute in the inputs' dtype (float16 through float32)   (default)
force_fp16              float inputs run and return float16
force_fp32              float16 inputs run and return float32
allow_fp32_to_fp16      float32 runs in float16 only for an operator without float32 kernels
allow_mix_precision     float32 runs in float16 for operators declared precision_reduce: true

A mode that asks for a dtype the operator has no kernels for is a TypeError naming both.
"""
from __future__ import annotations

from typing import Dict, Optional, cast

import numpy as np

from ..config import DEFAULT_PRECISION, check_precision_mode
from ..quantize import fixed_point
from ..spec.model import OpSpec

_F16, _F32 = np.dtype("float16"), np.dtype("float32")


def _cast_to(spec: OpSpec, mode: str, dtype: np.dtype) -> Optional[np.dtype]:
    """The dtype a float input of `dtype` runs in under `mode`, or None to keep it."""
    if mode == "force_fp16":
        return _F16 if dtype != _F16 else None
    if mode == "force_fp32":
        return _F32 if dtype == _F16 else None
    if dtype != _F32:
        return None
    if mode == "allow_fp32_to_fp16" and "float32" not in spec.dtypes and "float16" in spec.dtypes:
        return _F16
    if mode == "allow_mix_precision" and spec.precision_reduce:
        return _F16
    return None


def apply_mode(spec: OpSpec, given: Dict[str, object], mode: str, where: str,
               names=None) -> Dict[str, object]:
    """The call's arrays cast as the precision mode says (inputs, and cotangents in `names`)."""
    mode = check_precision_mode(mode)
    if mode == DEFAULT_PRECISION:
        return given
    out = dict(given)
    for name in list(spec.input_names) + list(names or ()):
        value = given.get(name)
        if value is None:
            continue
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        if arr.dtype.kind != "f":
            continue
        target = _cast_to(spec, mode, arr.dtype)
        if target is None:
            continue
        if target.name not in spec.dtypes:
            raise TypeError(f"{where}: precision_mode {mode!r} runs {name} ({arr.dtype.name}) in "
                            f"{target.name}, which this operator has no kernels for "
                            f"({', '.join(spec.dtypes)})")
        out[name] = arr.astype(target)
    return out


def quantized_attrs(spec: OpSpec, attrs: Dict[str, object]) -> Dict[str, object]:
    """Quantizable attrs replaced by their fixed-point value m / 2**bits."""
    out = dict(attrs)
    for a in spec.attrs:
        if a.quantize is not None and out.get(a.name) is not None:
            out[a.name] = fixed_point(cast(float, out[a.name]), a.quantize)[2]  # (a number: bound)
    return out
