"""How the C targets write each primitive in a kernel's element loop, and what the compiler makes
of it.

A primitive's meaning (its NumPy reference, its derivative, its kinds) lives with the primitive
in dsl/primitives.py; this is the C renderer's table, in the manner of inductor's
`CppOverrides`/`CppVecOverrides` and tinygrad's `code_for_op`: one `CForm` per primitive, and
per compute type only what differs (`DOUBLE`: the float64 forms that call libm because
templates/opkit_math.h has no vector form for them). Every x86-64 target (portable, x86-64-v3,
native) compiles the same text; GCC vectorizes it, and `scalar_calls` says where it cannot.

Transcendentals call templates/opkit_math.h: branch-free inline functions GCC vectorizes, with
the error bounds `ulp` gives (measured by tools/ulp_sweep.py, docs/spec.md's function table).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple
from ..kinds import Op


@dataclass(frozen=True)
class CForm:
    # an expression over {0}, {1} ... ({f}: "f" for float, "" for double); or statements, one
    # per line, assigning {d} (with a temporary {t})
    text: str
    # the same for when no argument after the first can be NaN (a number, an attr): ordered
    # selects GCC makes one vmax / vmin each
    bounded: str = ""
    # a function the compiler keeps scalar (a libm call); a CPU feature's name: vectorized only
    # where the target has it (rounding needs SSE4.1's roundps)
    scalar: bool = False
    needs: str = ""
    # the largest error, in ULP of the result, measured for float32 and float64 (None: exact,
    # as IEEE's +, -, *, /, sqrt and the selects are)
    ulp: Tuple[Optional[float], Optional[float]] = (None, None)

    def vectorizes_on(self, features: Iterable[str]) -> bool:
        return not self.scalar and (not self.needs or self.needs in features)


_CMP = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}

# NaN propagates through min, max and clamp from either argument (NumPy's minimum/maximum): two
# plain selects in a row, which GCC vectorizes in chains, where it gives up on chains of
# selects on `(x <= y) | (x != x)`. Against a bound that cannot be NaN one ordered select does:
# x86's min and max return their second operand (here x) when either is NaN, so NaN in x still
# propagates, and a tie keeps x's own zero as the two-select form does.
C: Dict[str, CForm] = {
    "add": CForm("({0} + {1})"),
    "sub": CForm("({0} - {1})"),
    "mul": CForm("({0} * {1})"),
    "div": CForm("({0} / {1})"),
    "neg": CForm("(-{0})"),
    **{name: CForm("({0} %s {1})" % sym) for name, sym in _CMP.items()},
    "and": CForm("({0} & {1})"),
    "or": CForm("({0} | {1})"),
    "not": CForm("(not {0})"),
    "where": CForm("({1} if {0} else {2})"),
    "min": CForm("{t} = ({0} if {0} <= {1} else {1})\n{d} = ({0} if {0} != {0} else {t})",
                 bounded="{d} = ({1} if {1} < {0} else {0})"),
    "max": CForm("{t} = ({0} if {0} >= {1} else {1})\n{d} = ({0} if {0} != {0} else {t})",
                 bounded="{d} = ({1} if {1} > {0} else {0})"),
    "clamp": CForm("{t} = ({0} if {0} >= {1} else {1})\n{t} = ({0} if {0} != {0} else {t})\n"
                   "{d} = ({t} if {t} <= {2} else {2})\n{d} = ({t} if {t} != {t} else {d})",
                   bounded="{t} = ({1} if {1} > {0} else {0})\n{d} = ({2} if {2} < {t} else {t})"),
    "abs": CForm("fabs{f}({0})"),
    "sqrt": CForm("sqrt{f}({0})"),
    "floor": CForm("floor{f}({0})", needs="sse4_1"),
    "ceil": CForm("ceil{f}({0})", needs="sse4_1"),
    "round": CForm("rint{f}({0})", needs="sse4_1"),
    # sign(-0) is +0 and sign(NaN) is NaN, as in NumPy: x - x is +0 for +-0 and NaN for NaN (and
    # only reached by those: the infinities take the first two branches)
    "sign": CForm("(1 if {0} > 0 else (-1 if {0} < 0 else {0} - {0}))"),
    "isnan": CForm("({0} != {0})"),
    "isinf": CForm("(fabs{f}({0}) == INFINITY)"),
    # templates/opkit_math.h; the bounds are tools/ulp_sweep.py's (every float32 input, float64
    # on 200,000-250,000 samples each; the worst of the native, x86-64-v3 and portable builds)
    "exp": CForm("opk_exp{f}({0})", ulp=(0.77, 0.60)),
    "expm1": CForm("opk_expm1{f}({0})", ulp=(0.73, 0.64)),
    "log": CForm("opk_log{f}({0})", ulp=(0.64, 0.58)),
    "log1p": CForm("opk_log1p{f}({0})", ulp=(0.67, 0.64)),
    "tanh": CForm("opk_tanh{f}({0})", ulp=(1.34, 0.73)),
    "sigmoid": CForm("opk_sigmoid{f}({0})", ulp=(1.87, 0.63)),
    "softplus": CForm("opk_softplus{f}({0})", ulp=(1.05, 0.63)),
    "erf": CForm("opk_erf{f}({0})", ulp=(1.15, None)),
    "erfc": CForm("opk_erfc{f}({0})", ulp=(1.30, None)),
    "sin": CForm("opk_sin{f}({0})", ulp=(0.51, None)),
    "cos": CForm("opk_cos{f}({0})", ulp=(0.51, None)),
    "pow": CForm("opk_pow{f}({0}, {1})", ulp=(0.51, None)),
}

# float64: where opkit_math.h has no vector form, glibc's (scalar; its own documented bounds)
DOUBLE: Dict[str, CForm] = {
    name: CForm(f"{name}({{0}}{', {1}' if name == 'pow' else ''})", scalar=True)
    for name in ("erf", "erfc", "sin", "cos", "pow")
}

# int32 and int64 compute (int8, int16, int32 data): where C's float form does not apply
INTEGER: Dict[str, CForm] = {
    "abs": CForm("({0} if {0} >= 0 else -{0})"),
}
# each compute type's table of what differs from C (tags: opkit/abi.py's COMPUTE)
OVERRIDES: Dict[str, Dict[str, CForm]] = {"f": {}, "d": DOUBLE, "i": INTEGER, "l": INTEGER}

# The functions of opkit_math.h the forms call, declared for Cython (templates/module.pyx.j2)
MATH_FUNCTIONS = tuple(sorted(
    {f"opk_{name}{suffix}" for name, form in C.items() if form.text.startswith("opk_")
     for suffix in ("f", "") if suffix or name not in DOUBLE}))


def _libm_calls() -> Tuple[str, ...]:
    """The C math library's functions the forms call ({f}: the float and the double one)."""
    names: set = set()
    for table in (C, *OVERRIDES.values()):
        for cf in table.values():
            for m in re.finditer(r"\b([a-z][a-z0-9_]*)(\{f\})?\(", cf.text + "\n" + cf.bounded):
                if not m.group(1).startswith("opk_"):
                    names.update((m.group(1), m.group(1) + "f") if m.group(2) else (m.group(1),))
    return tuple(sorted(names))


# ... cimported from libc.math by every module (templates/module.pyx.j2), with what the
# renderer writes itself (render.py: infinite constants, rounding a fixed-point attr)
LIBM = _libm_calls() + ("INFINITY", "NAN", "lrint")


def form(prim: str, tag: str) -> CForm:
    """How `prim` is written for the compute type of this tag: its override, else C's."""
    return OVERRIDES[tag].get(prim) or C[prim]


def declaration(function: str) -> str:
    """The Cython prototype of an opkit_math.h function (pow takes two arguments)."""
    t = "float" if function.endswith("f") else "double"
    args = f"{t}, {t}" if function.startswith("opk_pow") else t
    return f"{t} {function}({args})"


def scalar_calls(ops: Iterable[str], tag: str, features: Iterable[str]) -> Tuple[str, ...]:
    """The primitives among `ops` that keep an element loop of this compute type scalar on a
    target with these CPU features."""
    features = tuple(features)
    return tuple(sorted({op for op in ops if op in C and not form(op, tag).vectorizes_on(features)}))


def accuracy(prim: str) -> str:
    """The function table's accuracy column: `0.77 / 0.6 ULP` (float32 / float64)."""
    f32, f64 = C[prim].ulp
    if prim == Op.SQRT:
        return "correctly rounded (IEEE)"
    if prim in DOUBLE:
        f64_text = "libm"
    else:
        f64_text = "exact" if f64 is None else f"{f64:g}"
    f32_text = "exact" if f32 is None else f"{f32:g}"
    if f32_text == f64_text == "exact":
        return "exact"
    return f"{f32_text} / {f64_text} ULP" if f64_text != "libm" else f"{f32_text} ULP / libm"
