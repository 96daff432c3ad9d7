"""Attrs, and values computed from attrs alone, checked against the compute type before a call.

Float kernels take their attrs rounded to the compute type, and compute what depends on attrs
alone once per call in double precision before rounding it (the kernel's `init` in the
generated module). In float32 such a value may not fit: `limit=1e300` becomes inf and
`limit=1e-300` becomes 0, and `limit * tanh(x / limit)` then gives NaN. Those calls are refused
here, before anything is written, with the attr named. The generated direct call applies the
same bounds (templates/opkit_kernel.h: opk_overflows_f, opk_vanishes_f) and hands such calls to
the checked path, which raises.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, cast

import numpy as np

from ..dsl.primitives import PRIMITIVES
from ..lower import Attr, Const, Plan, compute_dtype
from ..spec.model import OpSpec
from .bind import dtype_name
from ..abi import FLOAT32_OVERFLOW, FLOAT32_VANISH
from ..kinds import AttrType, Op, ValueKind

_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "gt": ">", "ge": ">=", "lt": "<",
            "le": "<=", "eq": "==", "ne": "!=", "and": "&", "or": "|"}


def overflows(v: float) -> bool:
    return math.isfinite(v) and abs(v) >= FLOAT32_OVERFLOW


def vanishes(v: float) -> bool:
    return v != 0 and abs(v) <= FLOAT32_VANISH


def _operand(arg, values: Dict, attrs: Dict[str, object]):
    if isinstance(arg, Attr):
        return attrs[arg.name]
    if isinstance(arg, Const):
        return arg.value
    return values[arg]


def _text(arg, texts: Dict) -> str:
    return texts[arg] if arg in texts else str(arg)


def _advice(dtype: str) -> str:
    return f"float32, the compute type of {dtype} calls; pass float64 arrays"


def check_scalars(spec: OpSpec, plan: Plan, attrs: Dict[str, object], dtype: np.dtype,
                  where: str) -> None:
    """ValueError when an attr or an attr-only value of `plan` does not fit float32 and the call
    computes in float32 (float16 and float32 data)."""
    name = dtype_name(dtype)
    if compute_dtype(name) != "float32":
        return
    float_attrs, prologues = _what_to_check(spec, plan)
    for a in float_attrs:
        v = cast(Optional[float], attrs[a])   # a float attr, bound: a number or None
        if v is None:
            continue
        if overflows(v):
            raise ValueError(f"{where}: {a}={v!r} does not fit {_advice(name)}, or a value of "
                             f"{a} within ±3.4e38")
        if vanishes(v):
            raise ValueError(f"{where}: {a}={v!r} rounds to 0 in {_advice(name)}, or a value "
                             f"of {a} of magnitude 1.4e-45 or more")
    # the values a prologue computes depend only on the attrs: each set is checked once
    # (by repr: -0.0 is not 0.0 here, 1 / -0.0 is -inf)
    given = tuple((a, repr(v)) for a, v in attrs.items()) if prologues else ()
    for kernel in prologues:
        key = (id(kernel), name, given)
        if _PASSED.get(key) is kernel:
            continue
        _check_prologue(kernel, attrs, name, where)
        if len(_PASSED) >= 1024:
            _PASSED.clear()
        _PASSED[key] = kernel


_CHECKS: Dict[int, tuple] = {}
_PASSED: Dict[tuple, object] = {}  # prologue checks that passed: (kernel id, dtype, attrs) -> kernel


def _what_to_check(spec: OpSpec, plan: Plan):
    """(float attrs the element loops read, kernels with a prologue): the same for every call."""
    found = _CHECKS.get(id(plan))
    if found is None or found[0] is not plan:
        float_attrs = sorted({a for k in plan.kernels for a in k.loop_attrs
                              if spec.attr_type(a) == AttrType.FLOAT})
        found = (plan, float_attrs, [k for k in plan.kernels if k.prologue_results])
        _CHECKS[id(plan)] = found
    return found[1], found[2]


def _check_prologue(kernel, attrs: Dict[str, object], name: str, where: str) -> None:
    values: Dict = {}
    texts: Dict = {}
    crossing = kernel.prologue_results
    for ins in kernel.prologue:
        args = [_operand(a, values, attrs) for a in ins.args]
        with np.errstate(all="ignore"):
            v = PRIMITIVES[ins.op].numpy(*[np.float64(x) if not isinstance(x, bool)
                                            else np.bool_(x) for x in args])
        values[ins.dst] = bool(v) if ins.kind == ValueKind.BOOL else float(v)
        parts: List[str] = [_text(a, texts) for a in ins.args]
        texts[ins.dst] = (f"({parts[0]} {_SYMBOLS[ins.op]} {parts[1]})" if ins.op in _SYMBOLS
                          else f"-{parts[0]}" if ins.op == Op.NEG
                          else f"{ins.op}({', '.join(parts)})")
        if ins.kind == ValueKind.FLOAT and ins.dst in crossing and overflows(values[ins.dst]):
            used = sorted(set(_attrs_of(ins.dst, kernel.prologue)))
            given = ", ".join(f"{a}={attrs[a]!r}" for a in used)
            line = f" ({ins.loc})" if ins.loc else ""
            raise ValueError(f"{where}: {texts[ins.dst]}{line} is {values[ins.dst]:.6g} with "
                             f"{given}, which does not fit {_advice(name)}, or change "
                             f"{' or '.join(used)}")


def _attrs_of(dst, prologue) -> List[str]:
    """The names of the attrs a prologue value is computed from."""
    by_dst = {i.dst: i for i in prologue}
    found, stack = [], [dst]
    while stack:
        for a in by_dst[stack.pop()].args:
            if isinstance(a, Attr):
                found.append(a.name)
            elif not isinstance(a, Const):
                stack.append(a)
    return found
