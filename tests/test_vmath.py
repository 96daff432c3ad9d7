"""templates/opkit_math.h: every function within its documented error bound on a sampled sweep
(every binade, the special values, both sides of every threshold), the portable and the native
build agreeing, and GCC vectorizing a loop over each function for every target.

The bounds are read from the header's table; references are float64 numpy / scipy.special for
float32 (2^-29 ULP of float32 off at worst) and mpmath for float64. The compiled harness
(tools/ulp_sweep.py builds it) is cached in the temporary folder by content."""
import importlib.util
import math
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
HEADER = REPO / "templates" / "opkit_math.h"

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or not shutil.which("gcc"),
    reason="opkit_math.h's checks need gcc on x86-64")


def _load_sweep():
    spec = importlib.util.spec_from_file_location("opk_ulp_sweep", REPO / "tools" / "ulp_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sweep = _load_sweep()
FLOAT = list(sweep.FLOAT_FUNCS)  # expf ... powf
DOUBLE = list(sweep.DOUBLE_FUNCS)  # exp ... softplus


def documented_bounds():
    """{'expf': 0.6, 'exp': 0.6, ...} from the header's table (libm: no vector form)."""
    out = {}
    for name, f32, f64 in re.findall(r"^ \*   (\w+) +([0-9.]+|libm) +([0-9.]+|libm) *$",
                                     HEADER.read_text(), re.M):
        if f32 != "libm":
            out[name + "f"] = float(f32)
        if f64 != "libm":
            out[name] = float(f64)
    return out


BOUNDS = documented_bounds()


def test_table_covers_every_function():
    assert set(BOUNDS) == set(FLOAT) | set(DOUBLE)


@pytest.fixture(scope="module")
def libs():
    pytest.importorskip("scipy.special")  # the float32 references of erf, erfc, sigmoid
    return {t: sweep.build(t) for t in ("native", "portable")}


# ------------------------------------------------------------------------------------ samples

F32 = np.float32


def _neighbors(values, k, dtype):
    """Each value and its k nearest representable neighbors on either side."""
    v = np.asarray(values, dtype)
    ity = np.int32 if dtype == np.float32 else np.int64
    bits = v.view(ity).astype(np.int64)
    out = [(bits + d) for d in range(-k, k + 1)]
    return np.concatenate(out).astype(ity).view(dtype)


def _binades(dtype, per, rng):
    """`per` random mantissas in every binade (subnormals included) of both signs."""
    if dtype == np.float32:
        e = np.repeat(np.arange(0, 255, dtype=np.uint64), per)
        bits = (e << np.uint64(23)) | rng.integers(0, 1 << 23, len(e), dtype=np.uint64)
        bits = np.concatenate([bits, bits | np.uint64(1 << 31)]).astype(np.uint32)
        return bits.view(np.float32)
    e = np.repeat(np.arange(0, 2047, dtype=np.uint64), per)
    bits = (e << np.uint64(52)) | rng.integers(0, 1 << 52, len(e), dtype=np.uint64)
    return np.concatenate([bits, bits | np.uint64(1 << 63)]).view(np.float64)


SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0]

# thresholds where a function changes form, saturates, overflows or underflows
THRESHOLDS_F = {
    "expf": [88.72283935546875, 88.7228394, -87.3365448, -103.972076, -103.278931, -104.0,
             0.34657359, -0.34657359, 89.0],
    "expm1f": [88.72283935546875, -17.3286796, -16.6355324, -20.0, 0.34657359, 0.69314718,
               -0.34657359, 2.0 ** -24, -(2.0 ** -24), 16.6355324, 17.3286796],
    "logf": [1.0, 0.70710677, 1.41421354, 2.0 ** -126, 2.0 ** -149, 3.4028235e38, 2.0, 0.5],
    "log1pf": [-1.0, -0.99999994, 0.0, -0.29289323, 0.41421354, 2.0 ** -24, -(2.0 ** -24),
               2.0 ** 24, 1.0, 3.4028235e38],
    "tanhf": [0.9, 9.01091290, 0.0, 2.0 ** -12, 10.0, 0.625],
    "sigmoidf": [0.0, -87.3365448, -103.972076, -103.278931, 16.6355324, 17.3286796, 88.7228394,
                 104.0, -104.0, -1.1137725114822388, -1.1205679178237915],  # the worst, swept
    "softplusf": [0.0, -9.70406055, 16.6355324, 20.0, -87.3365448, -103.972076, -104.0,
                  88.7228394, 0.69314718, -0.69314718, 104.0],
    "erff": [1.0, 3.91920590, 4.0, 0.0, 2.0 ** -126, 2.0 ** -149],
    "erfcf": [0.0, 0.75, 3.75, 9.19454956, 10.0545921, 10.06, 10.5, -3.91920590, 2.0 ** -26, 1.0,
              2.0],
}
THRESHOLDS_D = {
    "exp": [709.782712893384, -708.3964185322641, -745.1332191019411, -745.1332191019412,
            -746.0, 710.0, 0.34657359027997264],
    "expm1": [709.782712893384, -37.42994775023705, -36.7368005696771, -40.0, 0.6931471805599453,
              0.34657359027997264, -0.34657359027997264, 2.0 ** -54],
    "log": [1.0, 0.7071067811865476, 1.4142135623730951, 2.0 ** -1022, 5e-324,
            1.7976931348623157e308],
    "log1p": [-1.0, -0.9999999999999999, 0.0, -0.2928932188134524, 0.41421356237309515, 2.0 ** -53,
              2.0 ** 53],
    "tanh": [0.625, 19.061547465398498, 22.0, 0.0],
    "sigmoid": [0.0, -708.3964185322641, -745.1332191019411, 36.7368005696771, 37.42994775023705],
    "softplus": [0.0, 37.42994775023705, 40.0, -708.3964185322641, -745.1332191019411, 746.0],
}


def float_samples(name, rng):
    parts = [_binades(np.float32, 24, rng), np.array(SPECIALS, F32),
             _neighbors(THRESHOLDS_F.get(name, []), 24, np.float32),
             _neighbors([-t for t in THRESHOLDS_F.get(name, [])], 4, np.float32),
             rng.uniform(-20, 20, 20000).astype(F32), rng.uniform(-1.5, 1.5, 20000).astype(F32)]
    if name in ("logf", "log1pf"):
        parts.append(rng.uniform(0.5, 2.0, 20000).astype(F32))
    if name in ("sinf", "cosf"):
        # the floats nearest k pi/2 (the hardest reductions) up to 1e4, then samples to 1.68e9
        k = np.concatenate([np.arange(1, 6367), rng.integers(6367, 1_070_000_000, 8000)])
        parts.append(_neighbors((k * (math.pi / 2)).astype(F32), 1, np.float32))
    return np.concatenate(parts)


def double_samples(name, rng):
    return np.concatenate([_binades(np.float64, 2, rng), np.array(SPECIALS),
                           _neighbors(THRESHOLDS_D[name], 3, np.float64),
                           rng.uniform(-30, 30, 1500), rng.uniform(-1, 1, 1500)])


# ------------------------------------------------------------------------------- accuracy

def _float_check(lib, name, x, y2=None):
    args = (x,) if y2 is None else (x, y2)
    y = sweep.call_float(lib, name, *args)
    ref = sweep.float_reference(name, *args)
    return y, ref, sweep.float_errors(lib, y, ref)


@pytest.mark.parametrize("target", ["native", "portable"])
@pytest.mark.parametrize("name", [n for n in FLOAT if n != "powf"])
def test_float_within_bound(libs, name, target):
    x = float_samples(name, np.random.default_rng(7))
    if name in ("sinf", "cosf"):  # the documented domain; beyond it, only bounded
        far = np.array([1.7e9, -3e9, 1e20, 3.4e38, -2.5e38], F32)
        yf = sweep.call_float(libs[target], name, far)
        assert np.all(np.abs(yf) <= 1.0), yf
        x = x[~(np.abs(x) > 1.68e9)]
    _, _, (err, i, _) = _float_check(libs[target], name, x)
    assert err <= BOUNDS[name], f"{name} ({target}): {err:.3f} ulp at x = {x[i]!r}"


POW_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 1.5, -1.5, math.inf,
               -math.inf, math.nan, 2.0 ** 23 + 1, -(2.0 ** 23 + 1), 2.0 ** 24, 2.0 ** 24 + 2,
               -(2.0 ** 24 + 2), 1e10, -1e10, 2.0 ** -149, -(2.0 ** -149), 3.4028235e38, 0.999999,
               1.000001, 127.5, -126.0]


@pytest.mark.parametrize("target", ["native", "portable"])
def test_powf_special_cases_and_samples(libs, target):
    """Every pair of special and ordinary values (C99 F.9.4.4, as glibc has them), then random
    pairs, against float64 pow."""
    rng = np.random.default_rng(3)
    xs, ys = np.meshgrid(np.array(POW_SPECIAL, F32), np.array(POW_SPECIAL, F32))
    x = np.concatenate([xs.ravel(), _binades(np.float32, 4, rng),
                        rng.uniform(-4, 4, 20000).astype(F32)])
    y = np.concatenate([ys.ravel(), rng.uniform(-3, 3, len(x) - xs.size).astype(F32)])
    y[xs.size + 2000:xs.size + 4000] = np.round(y[xs.size + 2000:xs.size + 4000] * 7)
    out, _, (err, i, _) = _float_check(libs[target], "powf", x, y)
    assert err <= BOUNDS["powf"], f"powf ({target}): {err:.3f} ulp at {x[i]!r} ** {y[i]!r}"


@pytest.mark.parametrize("name", [n for n in FLOAT if n != "powf"])
def test_native_and_portable_agree(libs, name):
    """Each within the bound of f(x), so within twice the bound of each other (FMA or not is the
    only difference in their arithmetic)."""
    x = float_samples(name, np.random.default_rng(11))
    if name in ("sinf", "cosf"):
        x = x[~(np.abs(x) > 1.68e9)]
    with np.errstate(invalid="ignore"):  # signaling NaN inputs
        a = sweep.call_float(libs["native"], name, x).astype(np.float64)
        b = sweep.call_float(libs["portable"], name, x).astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    assert np.all(same | (np.isfinite(a) & np.isfinite(b))), "non-finite results differ"
    ref = sweep.float_reference(name, x)
    with np.errstate(all="ignore"):
        ulp = np.ldexp(1.0, np.maximum(np.frexp(ref)[1] - 24, -149))
        diff = np.where(same, 0.0, np.abs(a - b) / ulp)
    assert diff.max() <= 2 * BOUNDS[name], f"{name}: {diff.max():.3f} ulp at {x[diff.argmax()]!r}"


@pytest.mark.parametrize("target", ["native", "portable"])
@pytest.mark.parametrize("name", DOUBLE)
def test_double_within_bound(libs, name, target):
    pytest.importorskip("mpmath")
    x = double_samples(name, np.random.default_rng(5))
    y = sweep.call_double(libs[target], name, x)
    hi, lo = sweep.mp_hi_lo(name, x)
    err, i = sweep.double_errors(libs[target], y, hi, lo)
    assert err <= BOUNDS[name], f"{name} ({target}): {err:.3f} ulp at x = {x[i]!r}"


# exact values the references above might not pin down: signs of zero, saturation, C99 cases
EXACT = [
    ("expm1f", -0.0, -0.0), ("log1pf", -0.0, -0.0), ("tanhf", -0.0, -0.0), ("erff", -0.0, -0.0),
    ("sinf", -0.0, -0.0), ("cosf", -0.0, 1.0), ("logf", -0.0, -math.inf), ("logf", -1.0, math.nan),
    ("log1pf", -1.0, -math.inf), ("log1pf", -1.5, math.nan),
    ("expf", 88.72283172607421875, 3.4027985e38), ("expf", 88.72283935546875, math.inf),
    ("expf", -103.972076, 2.0 ** -149), ("expf", -104.0, 0.0),
    ("expm1f", -math.inf, -1.0), ("tanhf", -math.inf, -1.0), ("tanhf", 9.1, 1.0),
    ("sigmoidf", -math.inf, 0.0), ("sigmoidf", math.inf, 1.0), ("sigmoidf", -103.0,
                                                                 1.4e-45),
    ("softplusf", -math.inf, 0.0), ("softplusf", math.inf, math.inf), ("erff", math.inf, 1.0),
    ("erfcf", -math.inf, 2.0), ("erfcf", math.inf, 0.0), ("erfcf", math.nan, math.nan),
    ("erfcf", -0.0, 1.0), ("erfcf", 1e-30, 1.0), ("erfcf", -1e-30, 1.0), ("erfcf", 10.06, 0.0),
    ("erfcf", -10.0, 2.0), ("sinf", math.inf, math.nan),
    ("expm1", -0.0, -0.0), ("log1p", -0.0, -0.0), ("tanh", -0.0, -0.0), ("log", 0.0, -math.inf),
    ("log", -1e-300, math.nan), ("exp", 709.782712893384, 1.7976931348622732e308),
    ("exp", 709.7828, math.inf), ("exp", -745.1332191019411, 5e-324), ("exp", -746.0, 0.0),
    ("sigmoid", -745.0, 5e-324), ("softplus", math.inf, math.inf), ("softplus", -math.inf, 0.0),
]


@pytest.mark.parametrize("target", ["native", "portable"])
def test_exact_values(libs, target):
    for name, x, want in EXACT:
        if name.endswith("f"):
            got = float(sweep.call_float(libs[target], name, np.array([x], F32))[0])
            want = float(F32(want))
        else:
            got = float(sweep.call_double(libs[target], name, np.array([x]))[0])
        ok = (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want))
        assert ok, f"opk_{name}({x!r}) = {got!r} ({target}), want {want!r}"


# -------------------------------------------------------------------------- vectorization

FLAGS = ["-O3", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-fno-strict-aliasing", "-fopenmp"]


# loops that compose the functions as activations and their gradients do (a composition can
# stop GCC where each function alone vectorizes)
COMPOSED = {
    "mish": ("float", "v * opk_tanhf(opk_softplusf(v))"),
    "mish64": ("double", "v * opk_tanh(opk_softplus(v))"),
    "gelu": ("float", "0.5f * v * opk_erfcf(-v * 0.70710678f)"),
    "gelu_grad": ("float", "w * (0.5f * opk_erfcf(-v * 0.70710678f) + "
                           "v * 0.39894228f * opk_expf(-0.5f * v * v))"),
    "gelu_tanh": ("float", "0.5f * v * (1.0f + opk_tanhf(0.79788456f * (v + 0.044715f * v*v*v)))"),
    "silu_grad": ("float", "w * opk_sigmoidf(v) * (1.0f + v * (1.0f - opk_sigmoidf(v)))"),
    "silu_grad64": ("double", "w * opk_sigmoid(v) * (1.0 + v * (1.0 - opk_sigmoid(v)))"),
    "elu": ("float", "v > 0.0f ? v : opk_expm1f(v)"),
    "mixed64": ("double", "opk_tanh(opk_exp(v)) + opk_log1p(opk_abs(v)) - opk_expm1(w)"),
    "trig": ("float", "opk_sinf(v) * opk_cosf(w) + opk_powf(opk_absf(v), w)"),
    "logs": ("float", "opk_logf(opk_absf(v)) + opk_log1pf(opk_erff(w))"),
}


def _loops():
    """One loop a line, as an element loop calls the functions: line number -> function."""
    lines, where = ['#include "opkit_math.h"'], {}
    exprs = [(n, "float" if n in FLOAT else "double",
              f"opk_{n}(v, w)" if n == "powf" else f"opk_{n}(v)") for n in FLOAT + DOUBLE]
    for name, (t, expr) in COMPOSED.items():
        exprs.append((name, t, expr))
    for name, t, expr in exprs:
        where[len(lines) + 1] = name
        lines.append(f"void loop_{name}({t} *restrict y, const {t} *restrict x, "
                     f"const {t} *restrict x2, long n) {{ for (long i = 0; i < n; i++) "
                     f"{{ {t} v = x[i], w = x2[i]; y[i] = {expr}; }} }}")
    return "\n".join(lines) + "\n", where


@pytest.mark.parametrize("target", ["native", "x86-64-v3", "portable"])
def test_every_function_vectorizes(tmp_path, target):
    """gcc's -fopt-info-vec-optimized reports each loop vectorized (every function, and the
    compositions above), and the assembly calls nothing (no libm, no out-of-line fma)."""
    src, where = _loops()
    c = tmp_path / "loops.c"
    c.write_text(src)
    cmd = (["gcc"] + FLAGS + sweep.target_flags(target) + [f"-I{HEADER.parent}", "-S", str(c),
           "-o", str(tmp_path / "loops.s"), "-fopt-info-vec-optimized"])
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    done = {int(m) for m in re.findall(r"loops\.c:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    missing = sorted(name for line, name in where.items() if line not in done)
    assert not missing, f"not vectorized for {target}: {missing}"
    calls = re.findall(r"^\s*call\s+(\S+)", (tmp_path / "loops.s").read_text(), re.M)
    assert not calls, f"calls left for {target}: {sorted(set(calls))}"
