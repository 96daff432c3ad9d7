"""The TBE listing's table: how each primitive is shown in CANN TBE vector instructions, and what
it costs.

A primitive's meaning lives with it in dsl/primitives.py; this is the listing target's table
(the C targets have theirs in codegen/c_ops.py). An entry is the vector-vector instruction, the
vector-scalar form where TBE has one (`vmuls x, #0.2`), and the instructions an element costs.
`EXPANSIONS` spells out the few instructions TBE lacks; TBE has no single instruction for a
transcendental either, and `SEQUENCES` shows the sequence opkit's vector form runs
(templates/opkit_math.h, float32), whose length is the cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from ..kinds import Op


@dataclass(frozen=True)
class Tbe:
    vector: str               # vector-vector form (vadd)
    scalar: Optional[str]     # vector-scalar form (vadds), if TBE has one
    cost: float = 1.0         # vector instructions per element vector


_CMP = {name: Tbe("vcmp" + name, "vcmp" + name) for name in ("gt", "ge", "lt", "le", "eq", "ne")}

# The instructions the listing prints for one TBE does not have: {0}.. the operands, {d} the
# destination.
EXPANSIONS: Dict[str, List[str]] = {
    "vclamp": ["vmax {d}, {0}, {1}", "vmin {d}, {d}, {2}"],
    "visinf": ["vabs {d}, {0}", "vcmpeq {d}, {d}, #inf"],
}

# The transcendentals: the listing prints the function's line and, indented under it, the
# sequence opkit's vector form runs (a polynomial of degree k is k multiply-adds, `vmla`,
# Horner's scheme; `{d}.t` names a temporary of the sequence).
SEQUENCES: Dict[str, List[str]] = {
    # e^x: clamp, n = round(x / ln 2) (magic number), Cody-Waite r = x - n ln2 in two pieces,
    # e^r = 1 + r + r^2 Q(r), 2^n built in the exponent field as two factors
    "vexp": ["vmaxs {d}.x, {0}, #-104", "vmins {d}.x, {d}.x, #89",
             "vmla {d}.t, {d}.x, #log2(e), #0x1.8p23     ; n in t's low bits",
             "vadds {d}.n, {d}.t, #-0x1.8p23",
             "vmla {d}.r, {d}.n, #-ln2_hi, {d}.x", "vmuls {d}.l, {d}.n, #-ln2_lo",
             "vadd {d}.r, {d}.r, {d}.l",
             "vmul {d}.q, {d}.r, {d}.r", "vpoly5 {d}.p, {d}.r          ; 5 x vmla",
             "vmla {d}.p, {d}.q, {d}.p, {d}.r", "vadds {d}.p, {d}.p, #1",
             "vshls {d}.s, {d}.t, #23          ; 2^n, two factors",
             "vmul {d}, {d}.p, {d}.s1", "vmul {d}, {d}, {d}.s2"],
    # e^x - 1: as exp with n = floor(x / ln 2) for x > 0, 2^n (1 + p) - 1 summed exactly
    "vexpm1": ["vexp-reduce {d}.r, {d}.n, {0}      ; 7 instructions, as vexp",
               "vand {d}.rt, {d}.r, #0xfffff000", "vmul {d}.h, {d}.rt, {d}.rt",
               "vpoly6 {d}.p, {d}.r          ; 6 x vmla",
               "vshls {d}.u, {d}.n, #23", "vadd {d}.s, {d}.u, {d}.b  ; Fast2Sum x 2 (6)",
               "vmla {d}, {d}.u, {d}.p, {d}.s", "vmuls {d}, {d}, #2",
               "vcmplt {d}.m, |{0}|, #2^-24", "vsel {d}, {d}.m, {0}, {d}"],
    # log x: x = 2^E m, m in [sqrt(1/2), sqrt(2)), f = m - 1, log1p(f) = f - f^2/2 + f^3 P(f)
    "vln": ["vsubs {d}.i, {0}, #0x3f3504f3 (int)", "vshrs {d}.e, {d}.i, #23",
            "vshls {d}.k, {d}.e, #23", "vsub {d}.m, {0}, {d}.k (int)", "vadds {d}.f, {d}.m, #-1",
            "vconv_s322f32 {d}.e, {d}.e", "vmul {d}.h, {d}.f, {d}.f",
            "vpoly8 {d}.p, {d}.f          ; 8 x vmla",
            "vmla {d}, {d}.e, #ln2_hi, {d}.f  ; Fast2Sum x 2 (6)",
            "vmla {d}, {d}.h, #-0.5, {d}", "vmla {d}, {d}.p, {d}.f3, {d}",
            "vcmple {d}.m, {0}, #0", "vsel {d}, {d}.m, #nan/-inf, {d}"],
    # log(1 + x): u = 1 + x with its rounding error c (TwoSum), log(u) + c / u
    "vln1p": ["vadds {d}.u, {0}, #1", "vtwosum {d}.c, {d}.u, {0}    ; 4 instructions",
              "vln {d}, {d}.u                ; 17 instructions, as vln",
              "vdiv {d}.c, {d}.c, {d}.u", "vadd {d}, {d}, {d}.c",
              "vcmple {d}.m, {0}, #-1", "vsel {d}, {d}.m, #nan/-inf, {d}"],
    # tanh: a + a^3 P(a^2) below 0.625; above 1 - 2 / (e^2a + 1), plain (within 2 ULP)
    "vtanh": ["vabs {d}.a, {0}", "vmul {d}.z, {d}.a, {d}.a",
              "vpoly5 {d}.s, {d}.z          ; 5 x vmla", "vmla {d}.s, {d}.a, {d}.s, {d}.a",
              "vexp {d}.e, 2 {d}.a           ; 11 instructions, vexp without its error terms",
              "vadds {d}.D, {d}.e, #1", "vrec {d}.q, {d}.D, #2", "vrsubs {d}.b, {d}.q, #1",
              "vcmplt {d}.m, {d}.a, #0.625", "vsel {d}, {d}.m, {d}.s, {d}.b",
              "vcopysign {d}, {d}, {0}"],
    # 1 / (1 + e^-|x|), e^x / (1 + e^x) below 0: both tails exp-like; the sums' errors corrected
    "vsigmoid": ["vabs {d}.a, {0}", "vexp {d}.e, -{d}.a          ; 12 instructions, as vexp",
                 "vadds {d}.D, {d}.e, #1", "vtwosum {d}.Dl, {d}.D, {d}.e  ; 3 instructions",
                 "vcmpge {d}.m, {0}, #0", "vsel {d}.N, {d}.m, #1, {d}.e", "vdiv {d}.q, {d}.N, {d}.D",
                 "vrsubs {d}.inv, {d}.q, #1", "vsel {d}.inv, {d}.m, {d}.q, {d}.inv",
                 "vmla {d}, {d}.res, {d}.inv, {d}.q  ; correction (3)"],
    # max(x, 0) + log1p(e^-|x|): f = E, or (E - 1) / 2 from E = 1/2 on (+ ln 2),
    # log1p(f) = f - f^2/2 + f^3 P(f)
    "vsoftplus": ["vabs {d}.a, {0}", "vexp {d}.e, -{d}.a          ; 12 instructions, as vexp",
                  "vcmpge {d}.m, {d}.e, #0.5", "vmla {d}.h, {d}.e, #0.5, #-0.5",
                  "vsel {d}.f, {d}.m, {d}.h, {d}.e", "vpoly7 {d}.g, {d}.f          ; 7 x vmla",
                  "vmla {d}.l, {d}.f2, {d}.g, {d}.el  ; 3 instructions",
                  "vmaxs {d}.x, {0}, #0", "vfast2sum {d}.s, {d}.x, #ln2_hi  ; 4 instructions",
                  "vadd {d}, {d}.s, {d}.f + {d}.l   ; 3 instructions"],
    # erf: a + a P(a^2) below 0.75; above 1 - e^(H(a) - a^2), a^2 split exactly, in float
    "verf": ["vabs {d}.a, {0}", "vpoly5 {d}.s, a^2             ; 5 x vmla",
             "vmins {d}.c, {d}.a, #4", "vmul {d}.h, {d}.c, {d}.c", "vmla {d}.l, {d}.c, {d}.c, -{d}.h",
             "vpoly6 {d}.H, {d}.c - 0.75    ; 6 x vmla",
             "vexp {d}.e, {d}.H - {d}.h - {d}.l  ; 13 instructions, the argument never rounded",
             "vrsubs {d}.b, {d}.e, #1", "vcmplt {d}.m, {d}.a, #0.75",
             "vsel {d}, {d}.m, {d}.s, {d}.b", "vcopysign {d}, {d}, {0}"],
    # erfc: 1 - x - x P(x^2) below |x| = 0.75; above, e^z with z = C + D(a - c) - (a - s)^2 in
    # float, the constants and D's coefficients selected for one of two intervals; 2 - e^z
    # below 0
    "verfc": ["vabs {d}.a, {0}", "vpoly5 {d}.p, {0}^2          ; 6 instructions: vmul, 5 x vmla",
              "vfast2sum {d}.s, #1, -{0}     ; 3 instructions, 1 - x exactly",
              "vmla {d}.s, -{0}, {d}.p, {d}.s  ; 2 instructions: vmla, vadd",
              "vmins {d}.c, {d}.a, #10.06", "vcmpge {d}.k, {d}.a, #3.75 (int)",
              "vsel {d}.k, c s C D[0..9]     ; 13 x vsel, the interval's constants",
              "vsquare {d}.h, {d}.c - s      ; 7 instructions, (a - s)^2 = h + l exactly",
              "vpoly9 {d}.D, {d}.c - c       ; 10 instructions: vsub, 9 x vmla",
              "vexp-reduce {d}.r, {d}.n, C + D - h - l  ; 8 instructions, C - n ln2_hi - h exact",
              "vexp {d}.e, {d}.r, {d}.n      ; 16 instructions: e^r, times 2^(n+64)",
              "vmla {d}.b, {d}.e, #2^-64, {d}.m  ; 4 instructions: a subnormal rounded once",
              "vmla {d}.n, {d}.e, #-2^-64, #2  ; 2 - e^z", "vcmplt {d}.k, {0}, #0",
              "vsel {d}.b, {d}.k, {d}.n, {d}.b", "vcmplt {d}.k, {d}.a, #0.75",
              "vsel {d}, {d}.k, {d}.s, {d}.b"],
    # sin, cos: n = round(x 2/pi), r = x - n pi/2 in four pieces (double), odd/even polynomial,
    # the quadrant's bits pick sin or cos and the sign
    "vsin": ["vconv_f322f64 {d}.x, {0}", "vmla {d}.t, {d}.x, #2/pi, #0x1.8p52",
             "vadds {d}.n, {d}.t, #-0x1.8p52", "vmla {d}.r, {d}.n, #-pi/2 (4 pieces)  ; 4 x vmla",
             "vmul {d}.z, {d}.r, {d}.r", "vpoly4 {d}.s, {d}.z ; 4 x vmla", "vpoly5 {d}.c, {d}.z ; 5 x vmla",
             "vand {d}.q, {d}.t, #1", "vsel {d}, {d}.q, {d}.c, {d}.s", "vxor {d}, {d}, quadrant sign",
             "vconv_f642f32 {d}, {d}"],
    "vcos": ["vsin {d}, {0} + pi/2           ; 26 instructions, as vsin, quadrant + 1"],
    # x ** y = 2^(y log2 x) in double, then C99's special cases as selects
    "vpow": ["vlog2 {d}.l, |{0}| (f64)       ; 12 instructions", "vmul {d}.w, {1}, {d}.l",
             "vexp2 {d}.p, {d}.w (f64)       ; 11 instructions", "vconv_f642f32 {d}, {d}.p",
             "vsel {d}, special cases        ; 12 compares and selects (C99 F.9.4.4)"],
}

# The TBE instruction each library call maps to (dsl/library.py holds the calls' meaning)
CALLS: Dict[Op, str] = {
    Op.SUM_TO: "vreduce_sum", Op.SUM: "vreduce_sum", Op.MEAN: "vreduce_mean", Op.SHARE: "vdivs",
    Op.AMAX: "vreduce_max", Op.AMIN: "vreduce_min", Op.LOGSUMEXP: "vreduce_logsumexp",
    Op.EINSUM: "vmatmul", Op.FOURIER: "vfft", Op.CONV2D: "vconv", Op.CONV2D_DX: "vconv_dx",
    Op.CONV2D_DW: "vconv_dw", Op.CONV_TRANSPOSE2D: "vconv_transpose",
}

# The reductions that run as a compiled pass of their own (templates/opkit_reduce.h), per
# contiguous run of the input: {0} is the input, {d} the result. A float16 run is converted
# first (vconv_f162f32).
REDUCTIONS: Dict[str, List[str]] = {
    "amax": ["vld      {0}, gm.{0}", "vcmpne   {d}.nan, {0}, {0}        ; a NaN flags its lane",
             "vmax     {d}.acc, {d}.acc, {0}     ; a vector of lanes along the run",
             "vcmax    {d}, {d}.acc              ; the lanes into one, NaN if one was flagged",
             "vst      gm.{d}, {d}"],
    "amin": ["vld      {0}, gm.{0}", "vcmpne   {d}.nan, {0}, {0}        ; a NaN flags its lane",
             "vmin     {d}.acc, {d}.acc, {0}     ; a vector of lanes along the run",
             "vcmin    {d}, {d}.acc              ; the lanes into one, NaN if one was flagged",
             "vst      gm.{d}, {d}"],
    "logsumexp": ["vcmax    {d}.m, {0}                ; as amax, the run in cache after it",
                  "vsub     {d}.v, {0}, {d}.m          ; m: 0 where infinite",
                  "vexp     {d}.v, {d}.v               ; 19 vector instructions (vexp)",
                  "vconv_f322f64 {d}.v, {d}.v",
                  "vadd     {d}.acc, {d}.acc, {d}.v     ; float64 lanes",
                  "vcadd    {d}.s, {d}.acc",
                  "vln      {d}, {d}.s (f64)           ; once a run", "vadd     {d}, {d}, {d}.m",
                  "vst      gm.{d}, {d}"],
}

TBE: Dict[str, Tbe] = {
    "add": Tbe("vadd", "vadds"), "sub": Tbe("vsub", "vadds"), "mul": Tbe("vmul", "vmuls"),
    "div": Tbe("vdiv", "vdivs", 4), "neg": Tbe("vmuls", None),
    "pow": Tbe("vpow", "vpows", 44),
    **_CMP,
    "and": Tbe("vand", None), "or": Tbe("vor", None), "not": Tbe("vnot", None),
    "where": Tbe("vsel", None), "min": Tbe("vmin", "vmins"), "max": Tbe("vmax", "vmaxs"),
    "clamp": Tbe("vclamp", None, 2), "abs": Tbe("vabs", None), "sqrt": Tbe("vsqrt", None, 4),
    "floor": Tbe("vfloor", None), "ceil": Tbe("vceil", None), "round": Tbe("vround", None),
    "sign": Tbe("vsign", None, 3), "isnan": Tbe("vcmpne", None), "isinf": Tbe("visinf", None, 2),
    "exp": Tbe("vexp", None, 19), "expm1": Tbe("vexpm1", None, 32), "log": Tbe("vln", None, 24),
    "log1p": Tbe("vln1p", None, 31), "tanh": Tbe("vtanh", None, 26),
    "sigmoid": Tbe("vsigmoid", None, 25), "softplus": Tbe("vsoftplus", None, 34),
    "erf": Tbe("verf", None, 32), "erfc": Tbe("verfc", None, 77),
    "sin": Tbe("vsin", None, 26), "cos": Tbe("vcos", None, 26),
}
