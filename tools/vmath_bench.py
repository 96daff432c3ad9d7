"""Time templates/opkit_math.h's functions in a plain C loop, against glibc's scalar libm.

    python tools/vmath_bench.py                 # 16M float32 elements, one thread
    python tools/vmath_bench.py -n 1048576 --double

Each variant compiles the same loop `y[i] = f(x[i])` with opkit's flags and a target:
-march=native with 512-bit and with 256-bit vectors preferred, x86-64-v3, the portable build,
and "libm": the same loop calling glibc (expf, tanhf ...; sigmoid and softplus in their libm
forms, 1 / (1 + expf(-x)) and fmaxf(x, 0) + log1pf(expf(-fabsf(x)))), which GCC leaves
scalar. Milliseconds per call, the best of several; inputs uniform on [-10, 10] (log, log1p
and pow: (0, 10]).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BASE = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
        "-fno-strict-aliasing", "-fopenmp"]
VARIANTS = {
    "native-512": ["-march=native", "-mprefer-vector-width=512"],
    "native-256": ["-march=native", "-mprefer-vector-width=256"],
    "x86-64-v3": ["-march=x86-64-v3"],
    "portable": [],
    "libm": ["-march=native", "-DUSE_LIBM"],
}
FLOAT = {  # name: (opkit expression, libm expression)
    "exp": ("opk_expf(v)", "expf(v)"),
    "expm1": ("opk_expm1f(v)", "expm1f(v)"),
    "log": ("opk_logf(v)", "logf(v)"),
    "log1p": ("opk_log1pf(v)", "log1pf(v)"),
    "tanh": ("opk_tanhf(v)", "tanhf(v)"),
    "sigmoid": ("opk_sigmoidf(v)", "1.0f / (1.0f + expf(-v))"),
    "softplus": ("opk_softplusf(v)", "(v > 0 ? v : 0.0f) + log1pf(expf(-fabsf(v)))"),
    "erf": ("opk_erff(v)", "erff(v)"),
    "erfc": ("opk_erfcf(v)", "erfcf(v)"),
    "sin": ("opk_sinf(v)", "sinf(v)"),
    "cos": ("opk_cosf(v)", "cosf(v)"),
    "pow": ("opk_powf(v, 1.7f)", "powf(v, 1.7f)"),
    "copy": ("v", "v"),
}
DOUBLE = {
    "exp": ("opk_exp(v)", "exp(v)"),
    "expm1": ("opk_expm1(v)", "expm1(v)"),
    "log": ("opk_log(v)", "log(v)"),
    "log1p": ("opk_log1p(v)", "log1p(v)"),
    "tanh": ("opk_tanh(v)", "tanh(v)"),
    "sigmoid": ("opk_sigmoid(v)", "1.0 / (1.0 + exp(-v))"),
    "softplus": ("opk_softplus(v)", "(v > 0 ? v : 0.0) + log1p(exp(-fabs(v)))"),
    "copy": ("v", "v"),
}

SRC = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "opkit_math.h"
typedef %(T)s T;
%(KERNELS)s
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
#define TIME(name, arg) { \
    double best = 1e30; \
    for (int r = 0; r < reps; r++) { \
        double t0 = now(); \
        k_##name(y, arg, n); \
        double t = now() - t0; \
        if (t < best) best = t; \
    } \
    printf(#name " %%.2f\n", best * 1e3); \
    fflush(stdout); }
int main(int argc, char **argv)
{
    long n = atol(argv[1]); int reps = atoi(argv[2]);
    T *x = malloc(n * sizeof(T)), *xp = malloc(n * sizeof(T)), *y = malloc(n * sizeof(T));
    unsigned s = 12345;
    for (long i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        double u = (s >> 8) * (1.0 / 16777216.0);
        x[i] = (T)(20.0 * u - 10.0); xp[i] = (T)(10.0 * u + 1e-6); y[i] = 0;
    }
%(CALLS)s
    return 0;
}
"""


def source(funcs: dict, libm: bool, double: bool) -> str:
    kernels, calls = [], []
    for name, (opk, lib) in funcs.items():
        expr = lib if libm else opk
        kernels.append(f"__attribute__((noinline)) void k_{name}(T *restrict y, "
                       f"const T *restrict x, long n)\n"
                       f"{{ for (long i = 0; i < n; i++) {{ T v = x[i]; y[i] = {expr}; }} }}")
        calls.append(f"    TIME({name}, {'xp' if name in ('log', 'log1p', 'pow') else 'x'})")
    return SRC % {"T": "double" if double else "float", "KERNELS": "\n".join(kernels),
                  "CALLS": "\n".join(calls)}


def run(n: int, reps: int, double: bool, variants) -> dict:
    funcs = DOUBLE if double else FLOAT
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for var in variants:
            flags = VARIANTS[var]
            libm = "-DUSE_LIBM" in flags
            src = os.path.join(tmp, f"{var}.c")
            exe = os.path.join(tmp, var)
            with open(src, "w") as fh:
                fh.write(source(funcs, libm, double))
            subprocess.run(["gcc"] + BASE + [f for f in flags if f != "-DUSE_LIBM"] +
                           [f"-I{os.path.join(ROOT, 'templates')}", src, "-o", exe, "-lm"],
                           check=True)
            res = subprocess.run([exe, str(n), str(reps)], capture_output=True, text=True,
                                 check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            out[var] = {ln.split()[0]: float(ln.split()[1]) for ln in res.stdout.splitlines()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--double", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    res = run(args.n, args.reps, args.double, variants)
    names = list((DOUBLE if args.double else FLOAT))
    print(f"{'ms per call, n=' + str(args.n):24s}" + "".join(f"{v:>12s}" for v in variants))
    for name in names:
        print(f"{name:24s}" + "".join(f"{res[v][name]:12.2f}" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
