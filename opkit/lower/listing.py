"""The vector-instruction listing of a kernel in TBE terms, and its static cost per element."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from .tbe import EXPANSIONS, SEQUENCES, TBE
from .integer import fixed_point_factor
from .plan import LOAD, Attr, Const, Kernel, Reg
from ..abi import STORAGE_BY_NAME, compute_dtype
from ..kinds import Op


def _text(operand, names) -> str:
    """An operand as the listing shows it: a register's name, an attr's name, #constant."""
    if isinstance(operand, Const):
        return "#" + repr(operand.value)
    if isinstance(operand, Reg):
        return names.get(operand, str(operand))
    return str(operand)


def listing(kernel: Kernel, dtype: str, quant: Optional[Dict[str, int]] = None) -> List[str]:
    """One line per vector instruction, `mnemonic dst, src...`, for one storage dtype. `quant`:
    the attrs stored as fixed point (name -> bits), used by integer dtypes."""
    ct = STORAGE_BY_NAME[compute_dtype(dtype)].tbe
    st = STORAGE_BY_NAME[dtype].tbe
    integer = dtype.startswith("int")
    quant = quant or {}
    lines: List[str] = []
    names: Dict[Reg, str] = {}   # a loaded register is shown by its array's name
    for ins in kernel.body:
        k = fixed_point_factor(ins, quant) if integer else None
        if k is not None:  # x * m / 2**bits: multiply, round, shift
            factor = ins.args[1 - k]
            assert isinstance(factor, Attr)  # what fixed_point_factor found: a quantized attr
            x, attr = _text(ins.args[k], names), factor.name
            bits = quant[attr]
            lines += [f"vmuls    {ins.dst}, {x}, {attr}.m          ; {attr} = m / 2**{bits}",
                      f"vadds    {ins.dst}, {ins.dst}, #{1 << (bits - 1)}       ; round to nearest",
                      f"vshrs    {ins.dst}, {ins.dst}, #{bits}         ; arithmetic shift"]
            continue
        if ins.op == LOAD:
            src = str(kernel.inputs[ins.slot])
            names[ins.dst] = src
            lines.append(f"vld      {src}, gm.{src}" + ("" if st == ct else f"          ; {st}"))
            if st != ct:
                lines.append(f"vconv_{st}2{ct} {src}, {src}")
            continue
        t = TBE[ins.op]
        args = [_text(a, names) for a in ins.args]
        mnemonic = t.vector
        if len(ins.args) == 2 and t.scalar:
            mnemonic, args = _scalar_form(ins.op, t, ins.args, args)
        if ins.op == Op.NEG:
            mnemonic, args = "vmuls", args + ["#-1"]
        dst = str(ins.dst)
        if mnemonic in EXPANSIONS:
            lines.extend(line.format(*args, d=dst) for line in EXPANSIONS[mnemonic])
        elif mnemonic in SEQUENCES:
            lines.append(f"{mnemonic:<8} {', '.join([dst] + args):<24} ; {t.cost:g} vector instructions:")
            lines.extend("  " + line.format(*args, d=dst) for line in SEQUENCES[mnemonic])
        else:
            lines.append(f"{mnemonic:<8} {', '.join([dst] + args)}")
    for out, res in zip(kernel.outputs, kernel.results):
        src = _text(res, names)
        if out not in kernel.discarded:
            if st != ct:
                lines.append(f"vconv_{ct}2{st} {src}, {src}" + ("     ; saturate" if integer else ""))
            lines.append(f"vst      gm.{out}, {src}")
        for s in kernel.sums:
            if s.args[0] is not out:
                continue
            # added into float64 partials while the tile is in registers
            what = "sum_to" if s.prim == Op.SUM_TO else \
                f"{s.prim} over the dims not in [{', '.join(s.params[0])}]"
            wide = src
            if ct != "f64":
                wide = f"{src}.w"
                lines.append(f"vconv_{ct}2f64 {wide}, {src}")
            lines.append(f"vadd     acc.{s.result}, acc.{s.result}, {wide}   ; {what}: float64 "
                         "partials, vcadd at the end")
    return lines


_SWAPPED = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
_COMMUTATIVE = ("add", "mul", "min", "max", "eq", "ne")


def _negated(operand, text: str) -> str:
    if isinstance(operand, Const):
        return "#" + repr(-operand.value)
    return "-" + text


def _scalar_form(op: str, t, raw, args):
    """The vector-scalar instruction (vmuls, vadds ...) when one operand is an attr or constant.

    TBE's scalar forms take the scalar last: a scalar first operand is moved there when the
    operation allows it (x - s becomes vadds x, -s), otherwise the vector form is listed."""
    scalar = [isinstance(a, (Attr, Const)) for a in raw]
    if scalar == [False, True]:
        if op == Op.SUB:
            return "vadds", [args[0], _negated(raw[1], args[1])]
        return t.scalar, args
    if scalar == [True, False]:
        if op in _COMMUTATIVE:
            return t.scalar, [args[1], args[0]]
        if op in _SWAPPED:
            return TBE[_SWAPPED[op]].scalar, [args[1], args[0]]
    return t.vector, args


@dataclass(frozen=True)
class Cost:
    vector_ops: float        # compute instructions per element vector
    bytes_per_element: int   # memory traffic of one element of the iteration space
    lanes: int

    @property
    def ops_per_element(self) -> float:
        return self.vector_ops / self.lanes

    def bound(self, bytes_per_cycle: float = 4.0) -> str:
        # one core streams about 4 bytes per cycle from memory (~12 GB/s at 3 GHz); a vector
        # instruction issues about once per cycle
        mem = self.bytes_per_element / bytes_per_cycle
        return "memory" if mem >= self.ops_per_element else "compute"

    def __str__(self) -> str:
        return (f"{self.vector_ops:g} vector ops per {self.lanes}-lane vector "
                f"({self.ops_per_element:.3g} per element), {self.bytes_per_element} bytes per element "
                f"moved: {self.bound()}-bound")


def cost(kernel: Kernel, dtype: str, vector_bytes: int) -> Cost:
    """The static cost per element on a target with `vector_bytes`-wide vectors; what is
    computed from attrs alone runs once per call and is not counted."""
    once = set(kernel.prologue) if not dtype.startswith("int") else set()
    ops = sum(TBE[i.op].cost for i in kernel.body if i.op != LOAD and i not in once)
    if dtype in ("float16", "bfloat16"):
        ops += len(kernel.operands)  # one conversion per load and store
    lanes = max(vector_bytes // STORAGE_BY_NAME[compute_dtype(dtype)].itemsize, 1)
    # a folded sum: an add into its float64 partials, after a conversion unless float64 already
    ops += (1 if compute_dtype(dtype) == "float64" else 2) * len(kernel.sums)
    moved = len(kernel.operands) - len(kernel.discarded)
    return Cost(ops, STORAGE_BY_NAME[dtype].itemsize * moved, lanes)
