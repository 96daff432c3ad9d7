"""Sweep every float32 input of templates/opkit_math.h's functions and report the max error.

    python tools/ulp_sweep.py                          # every function, every target (long)
    python tools/ulp_sweep.py expf tanhf -t portable   # some functions, one target
    python tools/ulp_sweep.py --step 97                # every 97th bit pattern (a quick look)
    python tools/ulp_sweep.py --double 20000           # float64 functions: samples vs mpmath

The functions are compiled into a small shared library with opkit's flags (-O3
-ffp-contract=off -fno-math-errno -fno-trapping-math -fno-strict-aliasing -fopenmp, plus
-march=native, -march=x86-64-v3 or nothing for the portable build) and called through ctypes
over all 2^32 bit patterns, 2^24 at a time. The reference is float64 (numpy, scipy.special)
evaluated at the float32 input: its own error, ~2^-52 relative, is 2^-29 ULP of a float32
result. The error is |y - f(x)| / ulp(f(x)), ulp of f(x)'s float32 binade (2^-149 below
2^-126), so a correctly rounded result is <= 0.5. An infinity, NaN or zero must match the
rounded reference exactly (the sign of a zero too): a mismatch counts as an infinite error.
The worst input of each function is rechecked against mpmath. powf, with two arguments,
sweeps every x for a few y and samples random pairs.

About a minute per function and target on one core; not run by the tests.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HEADER = os.path.join(ROOT, "templates", "opkit_math.h")
BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno",
              "-fno-trapping-math", "-fno-strict-aliasing", "-fopenmp"]
TARGETS = ("native", "x86-64-v3", "portable")


def target_flags(target: str) -> list:
    if target == "native":
        return ["-march=native"]
    if target == "portable":
        return ["-DOPKIT_NO_F16C"]
    return [f"-march={target}"]


# ------------------------------------------------------------------------------- the functions

def _sigmoid(x):
    from scipy.special import expit
    return expit(x)


def _erf(x):
    from scipy.special import erf
    return erf(x)


def _erfc(x):
    from scipy.special import erfc
    return erfc(x)


# name -> (arity, float64 reference on float64 arrays, mpmath reference)
FLOAT_FUNCS = {
    "expf": (1, np.exp, "exp"),
    "expm1f": (1, np.expm1, "expm1"),
    "logf": (1, np.log, "log"),
    "log1pf": (1, np.log1p, "log1p"),
    "tanhf": (1, np.tanh, "tanh"),
    "sigmoidf": (1, _sigmoid, "sigmoid"),
    "softplusf": (1, lambda x: np.logaddexp(0.0, x), "softplus"),
    "erff": (1, _erf, "erf"),
    "erfcf": (1, _erfc, "erfc"),
    "sinf": (1, np.sin, "sin"),
    "cosf": (1, np.cos, "cos"),
    "powf": (2, np.power, "pow"),
}
DOUBLE_FUNCS = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "softplus")


def mp_ref(name: str, *args):
    """f(args) in mpmath at 120 bits, as an mpf (None where the result is not finite)."""
    import mpmath as mp
    with mp.workprec(120):
        a = [mp.mpf(float(v)) for v in args]
        try:
            if name == "sigmoid":
                return 1 / (1 + mp.exp(-a[0]))
            if name == "softplus":
                return mp.log1p(mp.exp(a[0]))
            if name == "pow":
                r = mp.power(a[0], a[1])
            else:
                r = getattr(mp, name)(*a)
        except (ValueError, ZeroDivisionError):
            return None
        return r if isinstance(r, mp.mpf) else None  # complex: NaN in C


# --------------------------------------------------------------------------------- the harness

_ERR_C = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
/* err[k] = |y - ref| / ulp(ref) in the binade of ref (float32: bits 24, emin 2^-149;
 * float64: 53, 2^-1074); mismatched NaN / inf / zero (with its sign): INFINITY */
static double ulp_err(double y, double r, int mant, int emin)
{
    if (r != r || y != y) return (r != r && y != y) ? 0.0 : INFINITY;
    if (isinf(r) || isinf(y)) return y == r ? 0.0 : INFINITY;
    if (r == 0.0) return (y == 0.0 && signbit(y) == signbit(r)) ? 0.0 : INFINITY;
    int e;
    frexp(r, &e);
    int k = e - mant;
    if (k < emin) k = emin;
    return fabs(y - r) / ldexp(1.0, k);
}
/* max error, its index, and how many exceed 0.5, 1, 2 ULP */
void opk_err_f(const float *y, const double *ref, long n, double *out, long *idx, long *cnt)
{
    double m = -1.0; long at = 0;
    for (long i = 0; i < n; i++) {
        double r = ref[i];
        /* a reference beyond float's range rounds to inf (or FLT_MAX): compare rounded */
        if (fabs(r) >= 0x1.ffffffp127) r = (float)r;
        double e = ulp_err((double)y[i], r, 24, -149);
        if (e > 0.5) cnt[0]++;
        if (e > 1.0) cnt[1]++;
        if (e > 2.0) cnt[2]++;
        if (e > m) { m = e; at = i; }
    }
    *out = m; *idx = at;
}
void opk_err_d(const double *y, const double *ref, const double *ref_lo, long n, double *out,
               long *idx)
{
    double m = -1.0; long at = 0;
    for (long i = 0; i < n; i++) {
        double e = ulp_err(y[i], ref[i], 53, -1074);
        if (e != 0.0 && isfinite(e)) {  /* the reference's low part: |y - (ref + lo)| */
            int ex; frexp(ref[i], &ex);
            int k = ex - 53; if (k < -1074) k = -1074;
            e = fabs((y[i] - ref[i]) - ref_lo[i]) / ldexp(1.0, k);
        }
        if (e > m) { m = e; at = i; }
    }
    *out = m; *idx = at;
}
"""


def harness_source() -> str:
    lines = ['#include "opkit_math.h"']
    for name, (arity, _, _) in FLOAT_FUNCS.items():
        if arity == 1:
            lines.append(f"void sw_{name}(const float *restrict x, float *restrict y, long n)"
                         f" {{ for (long i = 0; i < n; i++) y[i] = opk_{name}(x[i]); }}")
        else:
            lines.append(f"void sw_{name}(const float *restrict x, const float *restrict x2, "
                         f"float *restrict y, long n)"
                         f" {{ for (long i = 0; i < n; i++) y[i] = opk_{name}(x[i], x2[i]); }}")
    for name in DOUBLE_FUNCS:
        lines.append(f"void sw_{name}(const double *restrict x, double *restrict y, long n)"
                     f" {{ for (long i = 0; i < n; i++) y[i] = opk_{name}(x[i]); }}")
    return "\n".join(lines) + "\n"


def build(target: str, cache_dir: str = "", cc: str = "") -> ctypes.CDLL:
    """The harness library for a target, cached by the header's and the harness's content."""
    cc = cc or os.environ.get("CC", "gcc")
    src = harness_source()
    flags = BASE_FLAGS + target_flags(target)
    key = hashlib.sha256((open(HEADER).read() + src + _ERR_C + " ".join(flags) + cc)
                         .encode()).hexdigest()[:16]
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "opkit_vmath")
    os.makedirs(cache_dir, exist_ok=True)
    so = os.path.join(cache_dir, f"vmath_{target}_{key}.so")
    if not os.path.exists(so):
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            c1, c2 = os.path.join(tmp, "h.c"), os.path.join(tmp, "err.c")
            with open(c1, "w") as fh:
                fh.write(src)
            with open(c2, "w") as fh:
                fh.write(_ERR_C)
            o2 = os.path.join(tmp, "err.o")
            # the error routine: plain -O2, no -march (its exactness is all that matters)
            subprocess.run([cc, "-O2", "-fPIC", "-c", c2, "-o", o2], check=True)
            tmp_so = os.path.join(tmp, "h.so")
            subprocess.run([cc] + flags + [f"-I{os.path.dirname(HEADER)}", c1, o2, "-o", tmp_so,
                                           "-lm"], check=True)
            os.replace(tmp_so, so)
    return ctypes.CDLL(so)


_F = np.ctypeslib.ndpointer(np.float32, flags="C")
_D = np.ctypeslib.ndpointer(np.float64, flags="C")


def call_float(lib, name: str, *args: np.ndarray) -> np.ndarray:
    fn = getattr(lib, "sw_" + name)
    fn.restype = None
    fn.argtypes = [_F] * (len(args) + 1) + [ctypes.c_long]
    y = np.empty_like(args[0])
    fn(*[np.ascontiguousarray(a, np.float32) for a in args], y, len(y))
    return y


def call_double(lib, name: str, x: np.ndarray) -> np.ndarray:
    fn = getattr(lib, "sw_" + name)
    fn.restype = None
    fn.argtypes = [_D, _D, ctypes.c_long]
    x = np.ascontiguousarray(x, np.float64)
    y = np.empty_like(x)
    fn(x, y, len(x))
    return y


def float_errors(lib, y: np.ndarray, ref: np.ndarray):
    """(max error, its index, counts over 0.5 / 1 / 2 ULP)."""
    fn = lib.opk_err_f
    fn.restype = None
    fn.argtypes = [_F, _D, ctypes.c_long, ctypes.POINTER(ctypes.c_double),
                   ctypes.POINTER(ctypes.c_long), np.ctypeslib.ndpointer(np.int64)]
    m, i = ctypes.c_double(), ctypes.c_long()
    cnt = np.zeros(3, np.int64)
    fn(np.ascontiguousarray(y, np.float32), np.ascontiguousarray(ref, np.float64), len(y),
       ctypes.byref(m), ctypes.byref(i), cnt)
    return m.value, i.value, cnt


def double_errors(lib, y: np.ndarray, ref_hi: np.ndarray, ref_lo: np.ndarray):
    fn = lib.opk_err_d
    fn.restype = None
    fn.argtypes = [_D, _D, _D, ctypes.c_long, ctypes.POINTER(ctypes.c_double),
                   ctypes.POINTER(ctypes.c_long)]
    m, i = ctypes.c_double(), ctypes.c_long()
    fn(y, ref_hi, ref_lo, len(y), ctypes.byref(m), ctypes.byref(i))
    return m.value, i.value


def float_reference(name: str, *args: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return FLOAT_FUNCS[name][1](*[a.astype(np.float64) for a in args])


def mp_ulp_error(name: str, y: float, *args, single=True) -> float:
    """|y - f(args)| / ulp with f in mpmath (a check of the float64 reference)."""
    import mpmath as mp
    r = mp_ref(FLOAT_FUNCS[name][2] if single else name, *args)
    if r is None or not mp.isfinite(r) or not np.isfinite(y):
        return float("nan")
    with mp.workprec(120):
        if r == 0:
            return 0.0 if y == 0 else float("inf")
        e = int(mp.floor(mp.log(abs(r), 2)))
        k = max(e - (23 if single else 52), -149 if single else -1074)
        return float(abs(mp.mpf(y) - r) / mp.mpf(2) ** k)


# ---------------------------------------------------------------------------------- the sweeps

# sinf / cosf: their error over these domains (the header's statement); beyond, only that the
# result is in [-1, 1]
DOMAINS = {"sinf": (1e4, 1.68e9), "cosf": (1e4, 1.68e9)}


def sweep_float(lib, name: str, step: int = 1, chunk: int = 1 << 24, limits=(None,)):
    """Every step-th bit pattern: {limit: (max error, worst x, counts)} over |x| <= limit
    (None: every input). With limits (sinf, cosf), inputs beyond the largest are only checked
    to give a result in [-1, 1] (NaN for inf and NaN): their count of failures is returned
    under the key "beyond"."""
    res = {lim: [-1.0, None, np.zeros(3, np.int64)] for lim in limits}
    top = max(limits)
    beyond = 0
    for start in range(0, 1 << 32, chunk):
        bits = np.arange(start, start + chunk, step, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        y = call_float(lib, name, x)
        if top is not None:
            far = np.abs(x) > top  # NaN: not far
            yf, xf = y[far], x[far]
            beyond += int(np.sum(np.isfinite(xf) & ~(np.abs(yf) <= 1)) +
                          np.sum(np.isinf(xf) & ~np.isnan(yf)))
            x, y = x[~far], y[~far]
        ref = float_reference(name, x)
        for lim, r in res.items():
            keep = slice(None) if lim is None else ~(np.abs(x) > lim)
            if lim is not None and not keep.any():
                continue
            m, i, cnt = float_errors(lib, y[keep], ref[keep])
            r[2] += cnt
            if m > r[0]:
                r[0], r[1] = m, (float(x[keep][i]),)
    out = {lim: tuple(r) for lim, r in res.items()}
    if top is not None:
        out["beyond"] = beyond
    return out


POW_Y = (0.5, -0.5, 2.0, 3.0, -3.0, 1.5, 0.1, 7.25, -27.5)


def sweep_pow(lib, step: int = 1, pairs: int = 1 << 26, chunk: int = 1 << 24, ys=POW_Y):
    """Every x for each y in ys, then random (x, y) pairs (y of moderate size, so that the
    result is mostly finite and nonzero)."""
    worst, where, counts = -1.0, None, np.zeros(3, np.int64)

    def batches():  # one at a time: 2^24 inputs
        for yv in ys:
            for start in range(0, 1 << 32, chunk * 4):  # every 4th pattern per y: 2^30 each
                bits = np.arange(start, start + chunk * 4, 4 * step, dtype=np.uint64)
                bits = bits.astype(np.uint32)
                yield bits.view(np.float32), np.full(len(bits), yv, np.float32)
        rng = np.random.default_rng(0)
        for _ in range(max(1, pairs // chunk)):
            x = rng.integers(0, 1 << 32, chunk, dtype=np.uint64).astype(np.uint32)
            yield x.view(np.float32), (rng.standard_normal(chunk) * 20).astype(np.float32)

    for x, y in batches():
        out = call_float(lib, "powf", x, y)
        m, i, cnt = float_errors(lib, out, float_reference("powf", x, y))
        counts += cnt
        if m > worst:
            worst, where = m, (float(x[i]), float(y[i]))
    return worst, where, counts


def double_samples(n: int, seed: int = 0) -> np.ndarray:
    """n float64 inputs: random bit patterns over every binade of both signs, plus a dense
    sample of [-40, 40] where the functions change form."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 0x7ff0000000000000, n // 2, dtype=np.uint64)
    sign = rng.integers(0, 2, n // 2, dtype=np.uint64) << np.uint64(63)
    a = (bits | sign).view(np.float64)
    b = rng.uniform(-40, 40, n - n // 2) * (10.0 ** rng.uniform(-6, 0, n - n // 2))
    return np.concatenate([a, b])


NUMPY_DOUBLE = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
                "tanh": np.tanh, "sigmoid": lambda t: 1 / (1 + np.exp(-t)),
                "softplus": lambda t: np.logaddexp(0, t)}


def mp_hi_lo(name: str, x: np.ndarray):
    """The mpmath value of name(x) as hi + lo doubles (where it is not finite, or zero, as
    numpy has it: mpmath has no NaN results, infinities or signed zeros to compare with)."""
    import mpmath as mp
    hi = np.empty(len(x))
    lo = np.zeros(len(x))
    for k, v in enumerate(x):
        r = mp_ref(name, v)
        if r is None or not mp.isfinite(r) or r == 0:
            with np.errstate(all="ignore"):
                hi[k] = NUMPY_DOUBLE[name](v)
            continue
        with mp.workprec(120):
            h = float(r)
            hi[k] = h
            lo[k] = float(r - mp.mpf(h)) if np.isfinite(h) else 0.0
    return hi, lo


def sweep_double(lib, name: str, n: int):
    x = double_samples(n)
    with np.errstate(all="ignore"):
        if name in ("exp", "expm1"):
            x = np.concatenate([x, np.random.default_rng(1).uniform(-745.2, 709.8, n // 4)])
        if name in ("sigmoid", "softplus", "tanh"):
            x = np.concatenate([x, np.random.default_rng(1).uniform(-745, 40, n // 4)])
    y = call_double(lib, name, x)
    hi, lo = mp_hi_lo(name, x)
    m, i = double_errors(lib, y, hi, lo)
    return m, (float(x[i]),)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("functions", nargs="*", help="float32 names (expf ...); default: all")
    ap.add_argument("-t", "--targets", default=",".join(TARGETS))
    ap.add_argument("--step", type=int, default=1, help="every step-th bit pattern")
    ap.add_argument("--double", type=int, default=0, metavar="N",
                    help="instead: the float64 functions on N samples each, against mpmath")
    args = ap.parse_args(argv)
    targets = args.targets.split(",")
    libs = {t: build(t) for t in targets}
    if args.double:
        for name in DOUBLE_FUNCS:
            for t in targets:
                t0 = time.time()
                m, at = sweep_double(libs[t], name, args.double)
                print(f"{name:10s} {t:10s} max {m:.3f} ulp at x={at[0]!r} "
                      f"({time.time() - t0:.0f} s)", flush=True)
        return 0
    for name in args.functions or list(FLOAT_FUNCS):
        for t in targets:
            t0 = time.time()
            if name == "powf":
                results = {None: sweep_pow(libs[t], args.step)}
            else:
                results = sweep_float(libs[t], name, args.step,
                                      limits=DOMAINS.get(name, (None,)))
            if "beyond" in results:
                print(f"{name:10s} {t:10s} |x|>{max(DOMAINS[name]):g}: "
                      f"{results.pop('beyond')} results outside [-1, 1] or not NaN for inf")
            for limit, (m, at, cnt) in results.items():
                y = call_float(libs[t], name, *[np.array([v], np.float32) for v in at])[0]
                check = mp_ulp_error(name, float(y), *at)
                dom = f"|x|<={limit:g}" if limit else "all"
                print(f"{name:10s} {t:10s} {dom:12s} max {m:.3f} ulp at "
                      f"{', '.join(repr(v) for v in at)} (mpmath: {check:.3f}); "
                      f">0.5: {cnt[0]}, >1: {cnt[1]}, >2: {cnt[2]} ({time.time() - t0:.0f} s)",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
