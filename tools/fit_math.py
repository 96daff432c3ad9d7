"""Fit the polynomial coefficients of templates/opkit_math.h, reproducibly.

Each polynomial is a weighted minimax fit (Remez exchange on a dense Chebyshev grid, in mpmath
at 200 bits), whose coefficients are then rounded to float32 or float64 one at a time, lowest
power first, refitting the remaining ones after each rounding (the rounding of a leading
coefficient is absorbed by the others). The weight turns the error of the polynomial into the
error of the function it serves (relative, or relative to what it is added to), so the reported
`max err` is the approximation error in that function, before the rounding of its evaluation.

    python tools/fit_math.py              # fit every polynomial, print C arrays (3 minutes)
    python tools/fit_math.py --check      # also check that the header holds exactly these values
    python tools/fit_math.py --write      # put them into the header (its generated block)
    python tools/fit_math.py expf_q       # only these

Needs mpmath (pip install mpmath).
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys

import mpmath as mp

mp.mp.prec = 200

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "templates", "opkit_math.h")


# ------------------------------------------------------------------------------------ rounding

def to_f32(v) -> float:
    return struct.unpack("f", struct.pack("f", float(v)))[0]


def to_f64(v) -> float:
    return float(v)  # mpf -> nearest double


def c_hex(v: float, single: bool) -> str:
    """C hex-float literal, exact."""
    if v == 0:
        return "0.0f" if single else "0.0"
    s = float(v).hex()  # e.g. 0x1.5555555555555p-3
    sign = "-" if s.startswith("-") else ""
    s = s.lstrip("-")
    mant, exp = s.split("p")
    mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
    if single:  # a float needs at most 6 hex digits after the point
        head, _, frac = mant.partition(".")
        mant = head + ("." + frac if frac else "")
    return f"{sign}{mant}p{int(exp)}" + ("f" if single else "")


def c_array(head: str, lits, width: int = 100) -> str:
    """`head = {a, b, ...};` wrapped at `width` columns."""
    lines, cur = [head + " = {"], "   "
    for i, lit in enumerate(lits):
        item = f" {lit}" + ("," if i < len(lits) - 1 else "};")
        if len(cur) + len(item) > width:
            lines.append(cur)
            cur = "   "
        cur += item
    lines.append(cur)
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- remez

def _grid(a, b, n):
    """n Chebyshev points of the first kind on [a, b] (no endpoints, no zero for a == -b)."""
    a, b = mp.mpf(a), mp.mpf(b)
    return [(a + b) / 2 + (b - a) / 2 * mp.cos(mp.pi * (2 * k + 1) / (2 * n))
            for k in range(n)][::-1]


def _solve(xs, fs, ws, powers):
    n = len(powers)
    A = mp.matrix(n + 1, n + 1)
    rhs = mp.matrix(n + 1, 1)
    for j, (x, f, w) in enumerate(zip(xs, fs, ws)):
        for i, p in enumerate(powers):
            A[j, i] = x ** p
        A[j, n] = (-1) ** j / w
        rhs[j] = f
    sol = mp.lu_solve(A, rhs)
    return [sol[i] for i in range(n)], sol[n]


def _eval(c, powers, x):
    return mp.fsum(ci * x ** p for ci, p in zip(c, powers))


def remez(g, w, a, b, powers, npts=3000, iters=40):
    """Coefficients c (for x ** powers) minimizing max over [a, b] of |w(x) (g(x) - P(x))|:
    a list of (x, g(x), w(x)) samples may be given instead of g, w, a, b."""
    xs = _grid(a, b, npts)
    gs = [g(x) for x in xs]
    ws = [abs(w(x)) for x in xs]
    return remez_samples(xs, gs, ws, powers, iters)


def remez_samples(xs, gs, ws, powers, iters=40, exchange=None):
    """Remez exchange on sampled points; `exchange(err, m)` picks the next reference (by
    default _keep_ends)."""
    exchange = exchange or _keep_ends
    n = len(powers)
    m = len(xs)
    # initial reference: the grid points nearest the Chebyshev extrema
    ref = sorted({min(m - 1, max(0, round((m - 1) * (1 - mp.cos(mp.pi * k / n)) / 2)))
                  for k in range(n + 1)})
    while len(ref) < n + 1:  # tiny grids only
        ref = sorted(set(ref) | {len(ref)})
    best = None
    for _ in range(iters):
        c, E = _solve([xs[i] for i in ref], [gs[i] for i in ref], [ws[i] for i in ref], powers)
        err = [ws[i] * (gs[i] - _eval(c, powers, xs[i])) for i in range(m)]
        emax = max(abs(e) for e in err)
        if best is None or emax < best[1]:
            best = (c, emax)
        new = exchange(err, n + 1)
        if emax - abs(E) <= 1e-4 * emax or len(new) < n + 1 or new == ref:
            break
        ref = new
    return best


def _keep_ends(err, m):
    """One extremum per run of equal sign, then m alternating ones: the smaller end dropped."""
    ext = _run_extrema(err)
    while len(ext) > m:
        ext.pop(0 if abs(err[ext[0]]) < abs(err[ext[-1]]) else -1)
    return ext


def fit(name, g, w, a, b, powers, single, npts=2000):
    """Remez fit, then coefficients rounded one at a time (lowest power first) with the
    rest refitted. Returns (coefficients for `powers`, max weighted error with the rounded
    coefficients)."""
    rnd = to_f32 if single else to_f64
    xs = _grid(a, b, npts)
    gs = [g(x) for x in xs]
    ws = [abs(w(x)) for x in xs]
    done = {}
    free = list(powers)
    while free:
        target = [gv - _eval(list(done.values()), list(done.keys()), x)
                  for x, gv in zip(xs, gs)]
        c, _ = remez_samples(xs, target, ws, free)
        p = free.pop(0)
        done[p] = mp.mpf(rnd(c[0]))
    coefs = [done[p] for p in powers]
    err = max(abs(wv * (gv - _eval(coefs, powers, x))) for x, gv, wv in zip(xs, gs, ws))
    return [rnd(v) for v in coefs], err


def _run_extrema(err):
    """The index of the largest |err| of each run of one sign, in order."""
    ext, i, n = [], 0, len(err)
    while i < n:
        j, k = i, i
        while j < n and (err[j] >= 0) == (err[i] >= 0):
            if abs(err[j]) > abs(err[k]):
                k = j
            j += 1
        ext.append(k)
        i = j
    return ext


def _exchange(err, m):
    """m alternating extrema of err: the largest of each run of one sign, then the smallest
    dropped (its two neighbours, now of one sign, merged into the larger) until m are left."""
    ext = _run_extrema(err)
    while len(ext) > m:
        if len(ext) == m + 1:
            ext.pop(0 if abs(err[ext[0]]) < abs(err[ext[-1]]) else -1)
            continue
        q = min(range(len(ext)), key=lambda t: abs(err[ext[t]]))
        if q in (0, len(ext) - 1):
            ext.pop(q)
        else:
            a, b = ext[q - 1], ext[q + 1]
            ext[q - 1:q + 2] = [a if abs(err[a]) >= abs(err[b]) else b]
    return ext


def _remez_dropping(xs, gs, ws, powers, iters=60):
    """remez_samples with _exchange: it converges where weights near 0 leave many tiny
    extrema (the quotient fits below)."""
    return remez_samples(xs, gs, ws, powers, iters, _exchange)


def fit_centered(g, w, a, b, degree, single, npts=2000):
    """As fit, for an interval [a, b] holding 0: once c_0 .. c_{p-1} are rounded, the rest is
    u^p Q(u), and Q is fitted to (g - done) / u^p with weight w |u|^p (powers p.. alone are no
    Chebyshev system on an interval holding 0, and Remez fails on them)."""
    rnd = to_f32 if single else to_f64
    xs = _grid(a, b, npts)
    gs = [g(x) for x in xs]
    ws = [abs(w(x)) for x in xs]
    done = []
    for p in range(degree + 1):
        target = [(gv - _eval(done, range(p), x)) / x ** p for x, gv in zip(xs, gs)]
        c, _ = _remez_dropping(xs, target, [wv * abs(x) ** p for x, wv in zip(xs, ws)],
                               list(range(degree + 1 - p)))
        done.append(mp.mpf(rnd(c[0])))
    err = max(abs(wv * (gv - _eval(done, range(degree + 1), x))) for x, gv, wv in zip(xs, gs, ws))
    return [rnd(v) for v in done], err


# ------------------------------------------------------------------------------ the functions

LN2 = mp.log(2)


def _expm1_q(r):  # (e^r - 1 - r) / r^2
    return (mp.expm1(r) - r) / r ** 2


def _log1p_p(f):  # (log1p(f) - f + f^2/2) / f^3
    return (mp.log1p(f) - f + f * f / 2) / f ** 3


def _atanh_r(z):  # log1p(f) = 2s + s R(z), s = f / (2 + f), z = s^2: R(z) = 2 atanh(s) / s - 2
    s = mp.sqrt(z)
    return 2 * mp.atanh(s) / s - 2


def _tanh_p(z):  # tanh(a) = a + a^3 P(a^2)
    a = mp.sqrt(z)
    return (mp.tanh(a) - a) / (a * z)


def _erf_p(z):  # erf(a) = a + a P(a^2): P(0) = 2/sqrt(pi) - 1 is small, so a float P(0) is
    a = mp.sqrt(z)  # exact enough (2/sqrt(pi) itself rounds to float with a 2^-25 error)
    return mp.erf(a) / a - 1


def _sin_s(z):  # sin(r) = r + r^3 S(r^2)
    r = mp.sqrt(z)
    return (mp.sin(r) - r) / (r * z)


def _cos_c(z):  # cos(r) = 1 - r^2/2 + r^4 C(r^2)
    return (mp.cos(mp.sqrt(z)) - 1 + z / 2) / (z * z)


def _exp2_p(r):  # 2^r = 1 + r P(r)
    return (mp.power(2, r) - 1) / r


RHALF = LN2 / 2 * (1 + mp.mpf(2) ** -10)  # |x - n ln2| with n rounded (in float: slack)
SQH = mp.sqrt(mp.mpf(0.5))
F_LO, F_HI = SQH - 1, 2 * SQH - 1  # the mantissa m in [sqrt(1/2), sqrt(2)), f = m - 1
S_MAX = (F_HI / (2 + F_HI)) * (1 + mp.mpf(2) ** -20)  # s = f / (2 + f): |s| <= 3 - 2 sqrt(2)
PI4 = mp.pi / 4 * (1 + mp.mpf(2) ** -10)
TANHF_T, TANH_T = mp.mpf("0.625"), mp.mpf("0.625")  # tanh's polynomial below T, exp above
ERF_T = mp.mpf("0.75")  # erff's polynomial below, 1 - e^(H - a^2) above
ERF_C = mp.mpf("0.75")  # H in a - ERF_C: small where erfc, its weight, is largest
TINY = mp.mpf(10) ** -40  # stands for 0 where the fitted quotient has a removable singularity

# erfcf above 0.75: erfc(a) = e^z, z = C + D(a - c) - (a - s)^2 on two intervals (lo, hi, c).
# s is half the slope of the secant of log(erfc(a)) + a^2 (it is convex), so that
# log(erfc(a)) + 2 s a - s^2 - C = D(a - c) stays small; c <= 1.75 keeps a - c exact for
# a >= 0.75; C, rounded to 2^-12 (exact in C - n LN2F_HI), is the middle of D's range. erfcf(x)
# is 0 beyond 10.0546 (a is clamped at 10.06).
ERFCF_IV = ((mp.mpf("0.75"), mp.mpf("3.75"), mp.mpf("1.75")),
            (mp.mpf("3.75"), mp.mpf("10.06"), mp.mpf("6.875")))


def _erfc_l(a):  # log(erfc(a)) + a^2, smooth and slowly varying
    return mp.log(mp.erfc(a)) + a * a


def erfcf_interval(k):
    """(lo, hi, c, s, C, max |D|) of erfcf's interval k."""
    lo, hi, c = ERFCF_IV[k]
    s = mp.nint((_erfc_l(hi) - _erfc_l(lo)) / (hi - lo) / 2 * 256) / 256
    vals = [_erfc_l(x) - 2 * s * x + s * s for x in (lo + (hi - lo) * i / 400 for i in range(401))]
    C = mp.nint((max(vals) + min(vals)) / 2 * 4096) / 4096
    return lo, hi, c, s, C, max(abs(v - C) for v in vals)


def _erfc_ulps(a):
    """erfc(a) / ulp(erfc(a)) 2^-24: in [1/2, 1) for a normal float result, below for a
    subnormal one (an error of z weighted by it is in ULP / 2^24)."""
    e = mp.erfc(a)
    return e * mp.mpf(2) ** (-1 - max(int(mp.floor(mp.log(e, 2))), -126))


def _fits():
    """name -> (single, powers, thunk returning (coefficients, max err))."""
    F = {}

    def reg(name, single, g, w, a, b, degree, npts=2000):
        powers = list(range(degree + 1))
        F[name] = (single, powers, lambda: fit(name, g, w, a, b, powers, single, npts))

    # exp / expm1: expm1(r) = r + r^2 Q(r), error relative to expm1(r) (the stricter of the two)
    rel_q = lambda r: r * r / mp.expm1(r)
    reg("expf_q", True, _expm1_q, rel_q, -RHALF, RHALF, 5)
    reg("exp_q", False, _expm1_q, rel_q, -RHALF, RHALF, 10)
    # expm1 reduces x > 0 with n = floor(x / ln2) (no cancellation in 2^n (1 + p) - 1): r in
    # [-ln2/2, ln2]
    reg("expm1f_q", True, _expm1_q, rel_q, -RHALF, 2 * RHALF, 6)
    reg("expm1_q", False, _expm1_q, rel_q, -RHALF, 2 * RHALF, 11)
    # logf: log1p(f) = f - f^2/2 + f^3 P(f), error relative to log1p(f)
    reg("logf_p", True, _log1p_p, lambda f: f ** 3 / mp.log1p(f), F_LO, F_HI, 8)
    # softplusf: log1p(E) for E = e^-|x| in (0, 1], reduced to f = E below 1/2, (E - 1) / 2
    # (exact) above: log1p(f) = f - f^2/2 + f^3 P(f) on [-1/4, 1/2], relative
    reg("softplusf_p", True, _log1p_p, lambda f: f ** 3 / mp.log1p(f), -mp.mpf(0.25),
        mp.mpf(0.5), 7)
    # log (double): log1p(f) = 2s + s z P(z), s = f / (2 + f), z = s^2; relative to ~2s
    reg("log_r", False, lambda z: _atanh_r(z) / z, lambda z: z / 2, TINY, S_MAX ** 2, 6)
    # tanh(a) = a + a^3 P(a^2) on [0, T], relative
    rel_t = lambda z: z * mp.sqrt(z) / mp.tanh(mp.sqrt(z))
    reg("tanhf_p", True, _tanh_p, rel_t, TINY, TANHF_T ** 2, 5)
    reg("tanh_p", False, _tanh_p, rel_t, TINY, TANH_T ** 2, 11)
    # erff: erf(a) = a + a P(a^2) on [0, 0.75], relative
    reg("erff_p", True, _erf_p, lambda z: mp.sqrt(z) / mp.erf(mp.sqrt(z)), TINY, ERF_T ** 2, 5)
    # erff on [0.75, 4], in float: erf = 1 - exp(H(a) - a^2), H = log(erfc(a)) + a^2 in
    # u = a - ERF_C; dH moves erf by erfc(a) dH
    reg("erff_h", True, lambda u: mp.log(mp.erfc(u + ERF_C)) + (u + ERF_C) ** 2,
        lambda u: mp.erfc(u + ERF_C), ERF_T - ERF_C, 4 - ERF_C, 6)
    # erfcf above 0.75, in float: D(u) = log(erfc(a)) + 2 s a - s^2 - C, a = c + u; an error of
    # D is one of z, a relative error of erfc, weighted into erfc's ULP (see ERFCF_IV)
    for k in range(len(ERFCF_IV)):
        lo, hi, c, s, C, _ = erfcf_interval(k)
        g = (lambda c, s, C: lambda u: _erfc_l(c + u) - 2 * s * (c + u) + s * s - C)(c, s, C)
        w = (lambda c: lambda u: _erfc_ulps(c + u))(c)
        F[f"erfcf_d{k}"] = (True, list(range(10)),
                            (lambda g, w, a, b: lambda: fit_centered(g, w, a, b, 9, True))(
                                g, w, lo - c, hi - c))
    # and e^r = 1 + r + r^2 Q(r) for its |r| <= ln2/2 + max |D|, relative
    rq = RHALF + max(erfcf_interval(k)[5] for k in range(len(ERFCF_IV))) + mp.mpf(2) ** -10
    F["erfcf_q"] = (True, list(range(6)), lambda: fit_centered(
        _expm1_q, lambda r: r * r / mp.exp(r), -rq, rq, 5, True))
    # sinf / cosf, in double: sin(r) = r (1 + z S(z)), cos(r) = 1 + z (-1/2 + z C(z)), z = r^2
    reg("sinf_s", False, _sin_s, lambda z: z, TINY, PI4 ** 2, 3)
    reg("cosf_c", False, _cos_c, lambda z: z * z, TINY, PI4 ** 2, 3)
    # powf, in double: ln(m) = 2s + s z P(z) as for log; 2^r = 1 + r P(r), |r| <= 1/2
    reg("powf_r", False, lambda z: _atanh_r(z) / z, lambda z: z / 2, TINY, S_MAX ** 2, 4)
    half = mp.mpf(0.5) * (1 + mp.mpf(2) ** -20)
    reg("powf_e", False, _exp2_p, lambda r: r / mp.power(2, r), -half, half, 7)
    return F


def split(c, bits, single):
    """c = hi + lo with hi rounded to `bits` significant bits (so n * hi is exact for an n of
    24 - bits (float) or 53 - bits (double) bits), lo the rest rounded to the format."""
    e = mp.floor(mp.log(abs(c), 2))
    q = mp.mpf(2) ** (e - bits + 1)
    hi = mp.nint(c / q) * q
    rnd = to_f32 if single else to_f64
    return rnd(hi), rnd(c - hi)


def constants():
    """The splitting constants: (name, value, single)."""
    out = []
    for nm, (hi, lo) in (("LN2F", split(LN2, 16, True)), ("LN2", split(LN2, 42, False))):
        out += [(f"OPK_{nm}_HI", hi, nm == "LN2F"), (f"OPK_{nm}_LO", lo, nm == "LN2F")]
    # pi/2 in three 23-bit pieces (n * piece exact for n < 2^30) and a double remainder
    rest, pieces = mp.pi / 2, []
    for _ in range(3):
        hi, _ = split(rest, 23, False)
        pieces.append(hi)
        rest -= mp.mpf(hi)
    pieces.append(to_f64(rest))
    out += [(f"OPK_PIO2_{i + 1}", v, False) for i, v in enumerate(pieces)]
    for k in range(len(ERFCF_IV)):  # erfcf's intervals: c, s and C, and where the next begins
        lo, _, c, s, C, _ = erfcf_interval(k)
        out += [(f"OPK_ERFCF_C{k}", to_f32(C), True), (f"OPK_ERFCF_U{k}", to_f32(c), True),
                (f"OPK_ERFCF_S{k}", to_f32(s), True)]
        if k:
            out.append((f"OPK_ERFCF_T{k}", to_f32(lo), True))
    # from this a on, erfc(a) < 2^-126: the first float past the root
    root = mp.findroot(lambda a: mp.erfc(a) - mp.mpf(2) ** -126, mp.mpf("9.19"))
    sub = to_f32(root)
    if sub < root:  # the next float up
        bits = struct.unpack("I", struct.pack("f", sub))[0]
        sub = struct.unpack("f", struct.pack("I", bits + 1))[0]
    out.append(("OPK_ERFCF_SUB", sub, True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--check", action="store_true", help="check the header holds these values")
    ap.add_argument("--write", action="store_true", help="write these values into the header")
    args = ap.parse_args(argv)
    fits = _fits()
    names = args.names or list(fits)
    header = open(HEADER).read() if args.check or args.write else ""
    bad = []
    for name, v, single in constants():  # with names, only those of the named functions
        if not args.names or any(name.startswith("OPK_%s_" % n.split("_")[0].upper())
                                 for n in args.names):
            line = f"#define {name} {c_hex(v, single)}"
            print(line)
            if args.check and not re.search(r"^%s\s*$" % re.escape(line), header, re.M):
                bad.append(name)
            header, k = re.subn(r"^#define %s .*$" % name, line, header, flags=re.M)
            if args.write and not k:
                bad.append(name)
    for name in names:
        single, powers, run = fits[name]
        coefs, err = run()
        lits = [c_hex(c, single) for c in coefs]
        ty = "float" if single else "double"
        print(f"/* {name}: degree {powers[-1]}, max err {mp.nstr(err, 3)} "
              f"(2^{mp.nstr(mp.log(err, 2), 4)}) */")
        decl = c_array(f"static const {ty} opk_c_{name}[{len(lits)}]", lits)
        print(decl)
        if args.write:
            header, k = re.subn(r"^static const \w+ opk_c_%s\[\d+\] = \{[^}]*\};$" % name,
                                decl, header, flags=re.M)
            if not k:
                bad.append(name)
        if args.check:
            m = re.search(r"opk_c_%s\[\d+\]\s*=\s*\{([^}]*)\}" % re.escape(name), header)
            if not m or [v.strip() for v in m.group(1).split(",")] != lits:
                bad.append(name)
        sys.stdout.flush()
    if args.write and not bad:
        with open(HEADER, "w") as fh:
            fh.write(header)
    if bad:
        print("the header differs for: " + ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
