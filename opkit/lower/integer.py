"""Integer kernels: which forward passes have an integer form, and what each step becomes.

An integer kernel computes in int32 (int8 and int16 inputs) or int64 (int32 inputs) and
saturates on store. A float attr declared `quantize: K` enters as the fixed-point m / 2**K: its
product with a value x is ``(x * m + 2**(K-1)) >> K`` (round to nearest, ties toward +inf).
Comparisons, selects, min, max, abs, negation, addition, subtraction and products of integer
values keep their meaning; nothing else has an integer form, and saying so is a SpecError at
the line that needs it.
"""
from __future__ import annotations

from typing import Dict, Optional

from ..errors import SpecError
from ..spec.model import OpSpec
from .plan import LOAD, Attr, Const, Instr, Kernel, LibCall, Plan
from ..kinds import AttrType, Op

# the primitives an integer kernel computes exactly as written
INTEGER_OPS = ("add", "sub", "mul", "neg", "abs", "min", "max", "clamp", "sign", "where", "gt", "ge",
               "lt", "le", "eq", "ne", "and", "or", "not")


def quantized(spec: OpSpec) -> Dict[str, int]:
    """attr name -> fixed-point bits, for the attrs declared `quantize:`."""
    return {a.name: a.quantize for a in spec.attrs if a.quantize is not None}


def fixed_point_factor(ins: Instr, quant: Dict[str, int]) -> Optional[int]:
    """The index of the value multiplied by a quantized attr in `ins`, or None."""
    if ins.op != Op.MUL:
        return None
    a, b = ins.args
    if isinstance(a, Attr) and a.name in quant and not isinstance(b, (Attr, Const)):
        return 1
    if isinstance(b, Attr) and b.name in quant and not isinstance(a, (Attr, Const)):
        return 0
    return None


def check_integer(spec: OpSpec, plan: Plan) -> None:
    """The forward pass has an integer form, or a SpecError points at the line that has none."""
    quant = quantized(spec)
    dtypes = ", ".join(spec.int_dtypes)
    for step in plan.steps:
        if not isinstance(step, Kernel):
            prim = step.prim if isinstance(step, LibCall) else step.call.prim
            raise SpecError(f"inputs: {dtypes} declared, but forward needs {prim}, which has no "
                            "integer form; declare float dtypes only", spec.loc)
        for ins in step.body:
            if ins.op == LOAD:
                continue
            where = ins.loc or spec.loc
            if ins.op not in INTEGER_OPS:
                raise SpecError(f"forward: {dtypes} declared, but {ins.op} has no integer form; "
                                "declare float dtypes only, or write the formula without it", where)
            if fixed_point_factor(ins, quant) is not None:
                continue
            for arg in ins.args:
                if isinstance(arg, Const) and not isinstance(arg.value, bool) and \
                        not float(arg.value).is_integer():
                    raise SpecError(f"forward: {dtypes} declared, but the constant {arg.value!r} is "
                                    "not an integer", where)
                if isinstance(arg, Attr) and arg.name.startswith("finfo."):
                    raise SpecError(f"forward: {dtypes} declared, but {arg.name} is a limit of "
                                    "float dtypes; declare float dtypes only", where)
                if isinstance(arg, Attr):
                    a = spec.attr(arg.name)
                    if a.type == AttrType.FLOAT:
                        hint = ("; declare it `quantize: 7` to use it as a fixed-point multiplier"
                                if a.quantize is None else
                                "; a quantized attr can only multiply a value")
                        raise SpecError(f"forward: {dtypes} declared, but the float attr {a.name} is "
                                        f"used in {ins.op}{hint}", where)
