"""The kernel ABI: what Python and the generated C agree on, written once, here.

The dtype codes, which compute type serves each storage dtype, the layout of a kernel call's
geometry array, the fields of a fused convolution's problem and the float32 rounding bounds.
`c_defines` turns them into the C the headers read (templates/opkit_kernel.h refuses to compile
without them), so a change here changes both sides; nothing in templates/ restates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Tuple


@dataclass(frozen=True)
class StorageType:
    """A dtype arrays are stored in, as the kernels know it."""

    name: str        # NumPy's name
    code: int        # the code kernels read (geometry arrays, operand tables)
    c_name: str      # ... under this name in C
    itemsize: int
    compute: str     # the dtype it is computed in: rounded (floats) or saturated (ints) on store
    tbe: str         # its name in the TBE listing


STORAGE: Tuple[StorageType, ...] = (
    StorageType("float16", 1, "OPK_F16", 2, "float32", "f16"),
    StorageType("float32", 2, "OPK_F32", 4, "float32", "f32"),
    StorageType("float64", 3, "OPK_F64", 8, "float64", "f64"),
    StorageType("int8", 4, "OPK_I8", 1, "int32", "s8"),
    StorageType("int16", 5, "OPK_I16", 2, "int32", "s16"),
    StorageType("int32", 6, "OPK_I32", 4, "int64", "s32"),
    StorageType("int64", 7, "OPK_I64", 8, "int64", "s64"),
    StorageType("bfloat16", 8, "OPK_BF16", 2, "float32", "bf16"),
)
STORAGE_BY_NAME: Dict[str, StorageType] = {s.name: s for s in STORAGE}
DTYPE_CODES: Dict[str, int] = {s.name: s.code for s in STORAGE}
CODE_NAMES: Dict[str, str] = {s.name: s.c_name for s in STORAGE}


def compute_dtype(dtype: str) -> str:
    """float16 and bfloat16 are computed in float32 and rounded once on store; int8 and int16
    in int32, int32 in int64, saturated on store."""
    found = STORAGE_BY_NAME.get(dtype)
    return found.compute if found is not None else dtype


@dataclass(frozen=True)
class ComputeType:
    """A type kernels compute in: one instance of every kernel per compute type."""

    tag: str        # suffix of generated functions
    type: str       # C type
    ptr: str        # pointer typedefs of templates/opkit_kernel.h
    cptr: str
    dtype: str      # its NumPy name
    libm: str       # libm suffix: expf vs exp

    @property
    def code(self) -> str:
        return STORAGE_BY_NAME[self.dtype].c_name

    @property
    def size(self) -> int:
        return STORAGE_BY_NAME[self.dtype].itemsize

    @property
    def integer(self) -> bool:
        return self.type.startswith("int")

    @property
    def serves(self) -> Tuple[str, ...]:
        """The storage dtypes computed in this type."""
        return tuple(s.name for s in STORAGE if s.compute == self.dtype)

    @property
    def storage(self) -> str:
        """Those storage dtypes as a Cython condition on `dcode`."""
        return " or ".join(f"dcode == {CODE_NAMES[d]}" for d in self.serves)


COMPUTE: Dict[str, ComputeType] = {ct.dtype: ct for ct in (
    ComputeType("f", "float", "opk_fp", "opk_cfp", "float32", "f"),
    ComputeType("d", "double", "opk_dp", "opk_cdp", "float64", ""),
    ComputeType("i", "int32_t", "opk_ip", "opk_cip", "int32", ""),
    ComputeType("l", "int64_t", "opk_lp", "opk_clp", "int64", ""),
)}
TAG_CODES: Dict[str, int] = {ct.tag: DTYPE_CODES[dt] for dt, ct in COMPUTE.items()}


# A kernel call's geometry array (runtime/geometry.py builds it, opk_walk reads it): these
# fields, then shape[ndim], strides[nops][ndim] (bytes) and codes[nops]
GEOMETRY_HEAD = ("ndim", "nops", "nout", "tdim", "ccode")


class ConvProblem(NamedTuple):
    """A fused call as the convolution the C code runs (templates/opkit_conv.h's opk_conv):
    x [n, c, h, w] with o filters of kh x kw, the output [n, o, oh, ow]."""

    N: int
    C: int
    H: int
    W: int
    O: int
    KH: int
    KW: int
    OH: int
    OW: int
    stride: int
    pad: int
    nhwc: int

    @property
    def pixels(self) -> int:
        """Output pixels over the batch: the rows of the GEMM."""
        return self.N * self.OH * self.OW

    @property
    def empty(self) -> bool:
        return 0 in (self.N, self.C, self.O, self.OH, self.OW)


# a finite double rounds to float32 infinity from here up, and a nonzero one to 0 from here down
# (FLT_MAX + half an ulp: the tie goes to the even neighbour, infinity; half the smallest
# subnormal)
FLOAT32_OVERFLOW = float.fromhex("0x1.ffffffp+127")
FLOAT32_VANISH = 2.0 ** -150


def _numpy_numbers() -> List[Tuple[int, str]]:
    """(NumPy's type number, C name) of each storage dtype that is one of NumPy's own types,
    whose numbers are fixed. bfloat16 is not: ml_dtypes, where it is loaded, is given a number
    then (the source must not depend on it), and its calls take the checked path."""
    import numpy as np
    out: List[Tuple[int, str]] = []
    for s in STORAGE:
        try:
            dt = np.dtype(s.name)
        except TypeError:
            continue
        if dt.isbuiltin == 1:
            out.append((int(dt.num), s.c_name))
    return out


def c_defines(extra: Dict[str, int]) -> List[str]:
    """The ABI as C: #define lines for the dtype codes, the compute size of a code, the
    geometry array's fields and the float32 bounds, then `extra` (limits of the lowering)."""
    lines = [f"#define {s.c_name} {s.code}" for s in STORAGE]
    wide = [CODE_NAMES[d] for d, ct in COMPUTE.items() if ct.size == 8]
    lines.append("#define OPK_CSIZE(c) (" + " || ".join(f"(c) == {n}" for n in wide) + " ? 8 : 4)")
    fields = [f"OPK_G_{f.upper()}" for f in GEOMETRY_HEAD] + ["OPK_G_SHAPE"]
    lines.append(f"enum {{ {', '.join(fields)} }};")
    # a NumPy type number's dtype code, -1 for another (the direct calls' dtype dispatch)
    lines.append("#define OPK_DCODE_OF(t) (" + "".join(
        f"(t) == {num} ? {name} : " for num, name in _numpy_numbers()) + "-1)")
    lines.append(f"#define OPK_F32_OVERFLOW {FLOAT32_OVERFLOW.hex()}")
    lines.append(f"#define OPK_F32_VANISH {FLOAT32_VANISH.hex()}")
    lines += [f"#define {name} {value}" for name, value in extra.items()]
    return lines
