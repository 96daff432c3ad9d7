"""The closed vocabularies that pass between the stages: primitives, value kinds, passes,
layouts, attr types. Each is a `StrEnum`, so a member prints, formats and hashes as its name (generated
source, listings and the cache key read the same text as before), while a name that is not a
member fails where it is made, not three stages later.
"""
from __future__ import annotations

import enum


class _Name(enum.StrEnum):
    # messages quote a member as the name the user wrote: 'erf', not <Op.ERF: 'erf'>
    def __repr__(self) -> str:
        return repr(self.value)


class Op(_Name):
    """Every operation an expression graph node or a kernel instruction can be: the elementwise
    primitives (dsl/primitives.py), the library calls (dsl/library.py), the leaves, and LOAD."""

    # leaves of an expression graph
    INPUT = "input"
    ATTR = "attr"
    CONST = "const"
    # a kernel instruction that reads an input array (lower/plan.py)
    LOAD = "load"
    # elementwise primitives
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    NEG = "neg"
    POW = "pow"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"
    EQ = "eq"
    NE = "ne"
    AND = "and"
    OR = "or"
    NOT = "not"
    WHERE = "where"
    MIN = "min"
    MAX = "max"
    CLAMP = "clamp"
    ABS = "abs"
    SIGN = "sign"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    SQRT = "sqrt"
    EXP = "exp"
    EXPM1 = "expm1"
    LOG = "log"
    LOG1P = "log1p"
    SIGMOID = "sigmoid"
    SOFTPLUS = "softplus"
    TANH = "tanh"
    ERF = "erf"
    ERFC = "erfc"
    SIN = "sin"
    COS = "cos"
    ISNAN = "isnan"
    ISINF = "isinf"
    # library calls
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    LOGSUMEXP = "logsumexp"
    SUM_TO = "sum_to"
    SHARE = "share"
    EINSUM = "einsum"
    FOURIER = "fourier"
    CONV2D = "conv2d"
    CONV2D_DX = "conv2d_dx"
    CONV2D_DW = "conv2d_dw"
    CONV_TRANSPOSE2D = "conv_transpose2d"


class ValueKind(_Name):
    """What a node or instruction computes: a number, or true/false (a mask)."""

    FLOAT = "float"
    BOOL = "bool"


class Pass(_Name):
    FORWARD = "forward"
    BACKWARD = "backward"


class Layout(_Name):
    """How an input's axes are named: ND (positional), NCHW, NHWC (channel last)."""

    ND = "ND"
    NCHW = "NCHW"
    NHWC = "NHWC"


class AttrType(_Name):
    """The type a declaration gives an attr (`type: float`)."""

    FLOAT = "float"
    INT = "int"
    BOOL = "bool"
    STR = "str"
