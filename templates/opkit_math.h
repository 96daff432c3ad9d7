/* opkit_math.h: elementary functions that GCC vectorizes inside an element loop.
 *
 * glibc's expf, tanhf, erff ... are calls, and a loop that calls them stays scalar unless the
 * compiler may swap in a vector library (-ffast-math). These are `static inline`, branch-free
 * C: range reduction, a minimax polynomial, ternary selects for the special cases and bit
 * manipulation through memcpy, so once inlined into `for (j...) y[j] = opk_expf(x[j])` GCC
 * if-converts and vectorizes the whole body for every x86-64 target opkit builds (portable
 * SSE2, x86-64-v3, -march=native with AVX-512). No -ffast-math is assumed or needed: NaN, the
 * infinities, signed zeros and subnormals keep their C99 (glibc) meaning.
 *
 * What the code avoids, and why: int64 compares and selects (SSE2 has no pcmpgtq: selects are
 * made on float/double compares, or on integer bit masks); int32 multiplies (no pmulld before
 * SSE4.1); float <-> int64 conversions (none before AVX-512DQ: the 0x1.8p52 magic number rounds
 * and its low bits are the integer); rint/floor (no roundps before SSE4.1: the magic number
 * again); tables indexed by the data (a gather). OPK_FMA is one rounding where the target has
 * FMA, two otherwise (-ffp-contract=off keeps a * b + c unfused): the algorithms are built so
 * that the steps that must be exact are exact either way (Cody-Waite splits with short high
 * parts, Fast2Sum, Dekker's product without FMA).
 *
 * Coefficients: tools/fit_math.py (weighted minimax, rounded to the format; `--check` checks
 * this file against it). Error: max |y - f(x)| / ulp(f(x)) with f(x) exact, in the ULP of
 * f(x)'s binade (a correctly rounded result is within 0.5), the largest of the -march=native
 * (AVX-512, FMA), -march=x86-64-v3 and portable (SSE2, no FMA) builds: float32 over every input
 * (python tools/ulp_sweep.py, against float64 numpy / scipy.special), float64 on 200,000 to
 * 250,000 samples a function against mpmath (python tools/ulp_sweep.py --double 200000: random
 * bit patterns over every binade, and dense where the functions change form).
 * tests/test_vmath.py checks these bounds on samples. "libm": no vector form here, call libm.
 * float32 exp reaches its maximum on results below 2^-125 (subnormal results); above, 0.64.
 * float32 tanh, sigmoid, softplus, erf and erfc, allowed 2 ULP, leave out the corrections that
 * would make them sub-ULP, for speed (with FMA / portable): tanh 1.34 / 1.33 just above 0.625,
 * where it changes form; sigmoid 1.65 / 1.86 near -1.12; softplus 0.94 / 1.05; erf 0.96 / 1.15 just
 * above 0.75, where it changes form; erfc 1.19 / 1.30 near 3.66, the far end of its first
 * polynomial.
 *
 *   function    float32   float64
 *   exp         0.77      0.60
 *   expm1       0.73      0.64
 *   log         0.64      0.58
 *   log1p       0.67      0.64
 *   tanh        1.34      0.73
 *   sigmoid     1.87      0.63
 *   softplus    1.05      0.63
 *   erf         1.15      libm
 *   erfc        1.30      libm
 *   sin         0.51      libm
 *   cos         0.51      libm
 *   pow         0.51      libm
 *
 * sigmoid(x) = 1 / (1 + e^-x); softplus(x) = log(1 + e^x). sinf/cosf reduce x exactly for
 * |x| < 1.68e9 (n pi/2 in three 23-bit pieces, n < 2^30); beyond, the reduction loses bits
 * (about |x| 2^-52 absolute; past 2^40, x counts as +-2^40) and the result is only bounded to
 * [-1, 1]; inf and NaN give NaN.
 *
 * Builds with opkit's flags: -ffp-contract=off, and never -ffast-math or -fassociative-math
 * (they would fold the exact sums, (a - s) + b, to 0). Keep the selects on float/double
 * compares: a bit operation on a selected double can leave GCC an int64 select, which it
 * cannot vectorize for SSE2 (tests/test_vmath.py compiles composed loops to catch that).
 */
#ifndef OPKIT_MATH_H
#define OPKIT_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define OPK_MATH_INLINE static inline __attribute__((always_inline))
#else
#define OPK_MATH_INLINE static inline
#endif

#if defined(__FMA__)
#define OPK_HAS_FMA 1
#define OPK_FMA(a, b, c) __builtin_fma((a), (b), (c))
#define OPK_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define OPK_HAS_FMA 0
#define OPK_FMA(a, b, c) ((a) * (b) + (c))
#define OPK_FMAF(a, b, c) ((a) * (b) + (c))
#endif

#define OPK_INFF __builtin_inff()
#define OPK_NANF __builtin_nanf("")
#define OPK_INF __builtin_inf()
#define OPK_NAN __builtin_nan("")
/* x + MAGIC rounds x to an integer (|x| < 2^22, 2^51) and holds it in its low mantissa bits */
#define OPK_MAGICF 0x1.8p23f
#define OPK_MAGIC 0x1.8p52

/* ---------------------------------------------------------------- generated: tools/fit_math.py */
#define OPK_LN2F_HI 0x1.62e4p-1f
#define OPK_LN2F_LO 0x1.7f7d1cp-20f
#define OPK_LN2_HI 0x1.62e42fefa38p-1
#define OPK_LN2_LO 0x1.ef35793c7673p-45
#define OPK_PIO2_1 0x1.921fb4p0
#define OPK_PIO2_2 0x1.4442dp-24
#define OPK_PIO2_3 0x1.846988p-48
#define OPK_PIO2_4 0x1.8cc51701b839ap-72
#define OPK_ERFCF_C0 -0x1.a3cp-2f
#define OPK_ERFCF_U0 0x1.cp0f
#define OPK_ERFCF_S0 -0x1.a8p-3f
#define OPK_ERFCF_C1 -0x1.6cdp0f
#define OPK_ERFCF_U1 0x1.b8p2f
#define OPK_ERFCF_S1 -0x1.3p-4f
#define OPK_ERFCF_T1 0x1.ep1f
#define OPK_ERFCF_SUB 0x1.2639cp3f
static const float opk_c_expf_q[6] = {
    0x1p-1f, 0x1.55552cp-3f, 0x1.555502p-5f, 0x1.1155a8p-7f, 0x1.6d2e48p-10f, 0x1.3b896ap-13f};
static const double opk_c_exp_q[11] = {
    0x1p-1, 0x1.5555555555559p-3, 0x1.5555555555558p-5, 0x1.111111110f72cp-7, 0x1.6c16c16c15333p-10,
    0x1.a01a01afbdf8ep-13, 0x1.a01a01a8ff6f5p-16, 0x1.71ddf867b6fc6p-19, 0x1.27e4e45dfedd9p-22,
    0x1.af5f2cdb55f5ap-26, 0x1.1f4781174bd4p-29};
static const float opk_c_expm1f_q[7] = {
    0x1p-1f, 0x1.555552p-3f, 0x1.55555cp-5f, 0x1.111518p-7f, 0x1.6be7e2p-10f, 0x1.9bf78p-13f,
    0x1.f4080ep-16f};
static const double opk_c_expm1_q[12] = {
    0x1p-1, 0x1.5555555555561p-3, 0x1.5555555555547p-5, 0x1.111111110e2bap-7, 0x1.6c16c16c30562p-10,
    0x1.a01a01ae69c1bp-13, 0x1.a01a00c6be637p-16, 0x1.71de20da7ce99p-19, 0x1.27e757986e7cp-22,
    0x1.ae6e24703833ap-26, 0x1.1aea3ef458846p-29, 0x1.ab87cb619431fp-33};
static const float opk_c_logf_p[9] = {
    0x1.555548p-2f, -0x1.00000ap-2f, 0x1.99a468p-3f, -0x1.555a5ep-3f, 0x1.233c1p-3f,
    -0x1.fc72aep-4f, 0x1.e6ffe4p-4f, -0x1.dc3848p-4f, 0x1.119edcp-4f};
static const float opk_c_softplusf_p[8] = {
    0x1.5555a4p-2f, -0x1.00002cp-2f, 0x1.9968c6p-3f, -0x1.54f5aep-3f, 0x1.28a1acp-3f,
    -0x1.0d6882p-3f, 0x1.aa6b4ep-4f, -0x1.6cb174p-5f};
static const double opk_c_log_r[7] = {
    0x1.5555555555592p-1, 0x1.999999997ff19p-2, 0x1.24924941e1558p-2, 0x1.c71c521451543p-3,
    0x1.74663ced59814p-3, 0x1.39a1e8ca27d79p-3, 0x1.2f03ba335a27dp-3};
static const float opk_c_tanhf_p[6] = {
    -0x1.555554p-2f, 0x1.11107ap-3f, -0x1.b9f188p-5f, 0x1.63a55p-6f, -0x1.0c5edp-7f,
    0x1.1a2816p-9f};
static const double opk_c_tanh_p[12] = {
    -0x1.5555555555552p-2, 0x1.1111111110c52p-3, -0x1.ba1ba1b9d195ep-5, 0x1.664f4870c2fdcp-6,
    -0x1.226e32cf94214p-7, 0x1.d6d35a378f19fp-9, -0x1.7d9c330567fabp-10, 0x1.350b8719a3194p-11,
    -0x1.f11347d2c78cap-13, 0x1.801b72cb28398p-14, -0x1.fac5323dbd6b1p-16, 0x1.9604c416fc833p-18};
static const float opk_c_erff_p[6] = {
    0x1.06eba8p-3f, -0x1.81273ap-2f, 0x1.ce2acep-4f, -0x1.b7a75cp-6f, 0x1.4f188ap-8f,
    -0x1.613e5p-11f};
static const float opk_c_erff_h[7] = {
    -0x1.5bd606p-1f, -0x1.73a5d2p-1f, 0x1.8987dp-3f, -0x1.b167eap-5f, 0x1.a03ed8p-7f,
    -0x1.2d04bap-9f, 0x1.d74fd6p-13f};
static const float opk_c_erfcf_d0[10] = {
    -0x1.3f680ep-4f, -0x1.7521f2p-5f, 0x1.70e242p-4f, -0x1.508148p-6f, 0x1.2f2ee6p-8f,
    -0x1.fa0426p-11f, 0x1.6af6d4p-13f, -0x1.71948p-16f, 0x1.dcc97ap-21f, 0x1.38c716p-23f};
static const float opk_c_erfcf_d1[10] = {
    -0x1.e774a8p-5f, 0x1.834286p-8f, 0x1.46631p-7f, -0x1.dd600ap-11f, 0x1.817d5p-14f,
    -0x1.4845e4p-17f, 0x1.1a218ep-20f, -0x1.a4dd52p-24f, 0x1.d0061p-27f, -0x1.814564p-29f};
static const float opk_c_erfcf_q[6] = {
    0x1p-1f, 0x1.55555p-3f, 0x1.55544cp-5f, 0x1.11160ep-7f, 0x1.6df984p-10f, 0x1.9cb5fep-13f};
static const double opk_c_sinf_s[4] = {
    -0x1.5555554ca99a5p-3, 0x1.1111088a438c5p-7, -0x1.a00f93d784e91p-13, 0x1.6cd5fb4dfab1p-19};
static const double opk_c_cosf_c[4] = {
    0x1.5555554f42d7fp-5, -0x1.6c16b88c43932p-10, 0x1.a01117c36c134p-16, -0x1.24291499a9cdp-22};
static const double opk_c_powf_r[5] = {
    0x1.555555561e2d8p-1, 0x1.999996a98d3e8p-2, 0x1.249411cef5495p-2, 0x1.c62b1fe7a940fp-3,
    0x1.9114de82fce19p-3};
static const double opk_c_powf_e[8] = {
    0x1.62e42fef89d1ep-1, 0x1.ebfbdffb679cap-3, 0x1.c6b08dd310707p-5, 0x1.3b2ab55f5c7b5p-7,
    0x1.5d873f04ef028p-10, 0x1.43083aa7c22ep-13, 0x1.00e5603994c2ap-16, 0x1.66c703864895ap-20};
/* ------------------------------------------------------------------------- end of generated */

/* ------------------------------------------------------------------------------------ helpers */

OPK_MATH_INLINE uint32_t opk_asuint(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
OPK_MATH_INLINE float opk_asfloat(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
OPK_MATH_INLINE uint64_t opk_asuint64(double x) { uint64_t u; memcpy(&u, &x, sizeof u); return u; }
OPK_MATH_INLINE double opk_asdouble(uint64_t u) { double x; memcpy(&x, &u, sizeof x); return x; }

OPK_MATH_INLINE float opk_absf(float x) { return opk_asfloat(opk_asuint(x) & 0x7fffffffu); }
OPK_MATH_INLINE double opk_abs(double x)
{
    return opk_asdouble(opk_asuint64(x) & 0x7fffffffffffffffull);
}
/* |x| with the sign of s */
OPK_MATH_INLINE float opk_signf(float x, float s)
{
    return opk_asfloat((opk_asuint(x) & 0x7fffffffu) | (opk_asuint(s) & 0x80000000u));
}
OPK_MATH_INLINE double opk_sign(double x, double s)
{
    return opk_asdouble((opk_asuint64(x) & 0x7fffffffffffffffull) |
                        (opk_asuint64(s) & 0x8000000000000000ull));
}

/* Horner; a constant n unrolls completely once inlined */
#define OPK_LEN(c) ((int)(sizeof(c) / sizeof((c)[0])))
#define OPK_POLYF(x, c) opk_polyf((x), (c), OPK_LEN(c))
#define OPK_POLY(x, c) opk_poly((x), (c), OPK_LEN(c))
OPK_MATH_INLINE float opk_polyf(float x, const float *c, int n)
{
    float r = c[n - 1];
    for (int i = n - 2; i >= 0; i--)
        r = OPK_FMAF(r, x, c[i]);
    return r;
}
OPK_MATH_INLINE double opk_poly(double x, const double *c, int n)
{
    double r = c[n - 1];
    for (int i = n - 2; i >= 0; i--)
        r = OPK_FMA(r, x, c[i]);
    return r;
}

/* Estrin's scheme (n <= 16): depth log2(n) multiply-adds instead of Horner's n - 1, so that the
 * loops, which latency bounds more than throughput, overlap more */
#define OPK_ESTRINF(x, c) opk_estrinf((x), (c), OPK_LEN(c))
OPK_MATH_INLINE float opk_estrinf(float x, const float *c, int n)
{
#define OPK_C_(i) c[(i) < n ? (i) : n - 1]
#define OPK_P2_(i) (n > (i) + 1 ? OPK_FMAF(OPK_C_((i) + 1), x, OPK_C_(i)) : OPK_C_(i))
    float x2 = x * x, x4 = x2 * x2, x8 = x4 * x4;
    float a0 = OPK_P2_(0), a1 = OPK_P2_(2), a2 = OPK_P2_(4), a3 = OPK_P2_(6);
    float a4 = OPK_P2_(8), a5 = OPK_P2_(10), a6 = OPK_P2_(12), a7 = OPK_P2_(14);
    float b0 = n > 2 ? OPK_FMAF(a1, x2, a0) : a0, b1 = n > 6 ? OPK_FMAF(a3, x2, a2) : a2;
    float b2 = n > 10 ? OPK_FMAF(a5, x2, a4) : a4, b3 = n > 14 ? OPK_FMAF(a7, x2, a6) : a6;
    float d0 = n > 4 ? OPK_FMAF(b1, x4, b0) : b0, d1 = n > 12 ? OPK_FMAF(b3, x4, b2) : b2;
    return n > 8 ? OPK_FMAF(d1, x8, d0) : d0;
#undef OPK_C_
#undef OPK_P2_
}

/* the polynomials of the functions allowed 2 ULP: without FMA, Horner's chain of dependent
 * multiplies and adds is twice as long and its latency, more than the operation count, bounds
 * the loop; with FMA, the count does */
#if OPK_HAS_FMA
#define OPK_POLYF_FAST OPK_POLYF
#else
#define OPK_POLYF_FAST OPK_ESTRINF
#endif

/* a * b == p + *e exactly (FMA, or Dekker's splitting into 26-bit halves) */
OPK_MATH_INLINE double opk_two_prod(double a, double b, double *e)
{
    double p = a * b;
#if OPK_HAS_FMA
    *e = __builtin_fma(a, b, -p);
#else
    const double split = 0x1p27 + 1.0;
    double ta = split * a, tb = split * b;
    double ah = ta - (ta - a), al = a - ah;
    double bh = tb - (tb - b), bl = b - bh;
    *e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
#endif
    return p;
}

/* ------------------------------------------------------------------------------ exp (float) */

/* e^x = (hi + lo) s1 s2 for x in [-104, 89], hi = e^r rounded to float and lo (|lo| <= ulp/2)
 * the rest. x = n ln2 + r, |r| <= ln2/2; n ln2 is subtracted in two pieces, the first exact
 * (n has 8 bits, LN2F_HI 16), so rh + rl is r with rh exact; e^r - 1 = rh + rl + r^2 Q(r) + d r
 * with r = rh + rl rounded and d its error (first order), and 1 + rh is split exactly
 * (Fast2Sum): hi is the only rounding. 2^n is two normal factors, so that a subnormal result
 * is rounded once, by the last multiply, and 2^128 is reachable. */
typedef struct { float s1, s2, hi, lo; } opk_expf_parts_t;

/* `lite` (a constant at every call, so the compiler keeps one form): without the first-order
 * term of r's rounding (d), and with the faster polynomial evaluation; hi is still e^r rounded
 * once, lo its rounding error, and e^r's other errors are 2^-25 of an ULP. For the functions
 * allowed 2 ULP (opk_expf_lite_parts). */
OPK_MATH_INLINE opk_expf_parts_t opk_expf_parts_k(float x, int lite)
{
    opk_expf_parts_t o;
    float t = OPK_FMAF(x, 0x1.715476p0f, OPK_MAGICF);
    float n = t - OPK_MAGICF;
    float rh = OPK_FMAF(n, -OPK_LN2F_HI, x);
    float rl = n * -OPK_LN2F_LO;
    float r = rh + rl;
    float d = (rh - r) + rl;  /* r + d = rh + rl exactly */
    float one = 1.0f + rh;
    float q = lite ? OPK_POLYF_FAST(r, opk_c_expf_q) : OPK_POLYF(r, opk_c_expf_q);
    float tail = ((1.0f - one) + rh) + OPK_FMAF(r * r, q, lite ? rl : OPK_FMAF(d, r, rl));
    o.hi = one + tail;  /* hi = e^r rounded, lo its error (Fast2Sum again) */
    o.lo = (one - o.hi) + tail;
    uint32_t nb = opk_asuint(t) - opk_asuint(OPK_MAGICF) + 254u;  /* n + 2 * bias, > 0 */
    o.s1 = opk_asfloat((nb >> 1) << 23);
    o.s2 = opk_asfloat((nb - (nb >> 1)) << 23);
    return o;
}

OPK_MATH_INLINE opk_expf_parts_t opk_expf_parts(float x) { return opk_expf_parts_k(x, 0); }

/* e^x; overflow to inf above 88.7228, gradual underflow down to 2^-149 */
OPK_MATH_INLINE float opk_expf(float x)
{
    float xc = x < -104.0f ? -104.0f : x;  /* e^-104 rounds to 0; a NaN passes both */
    xc = xc > 89.0f ? 89.0f : xc;
    opk_expf_parts_t p = opk_expf_parts(xc);
    return p.hi * p.s1 * p.s2;
}

/* e^x - 1. x = n ln2 + r as in opk_expf_parts, but n = floor(x / ln2) for x > 0 (r in
 * [0, ln2]): 2^n (1 + p) - 1 then never cancels. With u = 2^(n-1), e^x - 1 =
 * 2 (a + u rh + (u T + c)) where a + c = u - 1/2 and a is exact: u - 1/2 while that is exact
 * (|n| <= 24), else u (c = -1/2) or -1/2 (c = u). a + u rh is split exactly (Fast2Sum: a's
 * exponent is at least u rh's), so near 0 (n = 0) the result is rh + T, as accurate as the
 * polynomial. Halving keeps 2^(n-1) finite for n = 128; below 2^-24 the result is x. */
OPK_MATH_INLINE float opk_expm1f(float x)
{
    float xc = x < -20.0f ? -20.0f : x;  /* below -17.4 the result rounds to -1 */
    xc = xc > 89.0f ? 89.0f : xc;
    float t = OPK_FMAF(xc, 0x1.715476p0f, xc > 0.0f ? -0.5f : 0.0f) + OPK_MAGICF;
    float n = t - OPK_MAGICF;
    float rh = OPK_FMAF(n, -OPK_LN2F_HI, xc);
    float rl = n * -OPK_LN2F_LO;
    float r = rh + rl;
    float d = (rh - r) + rl;
    /* r^2 = h + hl, h exact: r's top 12 bits squared */
    float rt = opk_asfloat(opk_asuint(r) & 0xfffff000u);
    float h = rt * rt, hl = (r - rt) * (r + rt);
    /* e^r - 1 = rh + h/2 + T: r^2 Q(r) = h/2 + r^3 Q1(r) + hl/2, Q1 = (Q - 1/2) / r */
    float Q1 = opk_polyf(r, opk_c_expm1f_q + 1, OPK_LEN(opk_c_expm1f_q) - 1);
    float T = OPK_FMAF(r * (r * r), Q1, OPK_FMAF(0.5f, hl, OPK_FMAF(d, r, rl)));
    float u = opk_asfloat((opk_asuint(t) - opk_asuint(OPK_MAGICF) + 126u) << 23);
    float a = n > 24.0f ? u : (n < -24.0f ? -0.5f : u - 0.5f);
    float c = n > 24.0f ? -0.5f : (n < -24.0f ? u : 0.0f);
    float b = u * rh;
    float s = a + b;
    float e = (a - s) + b;
    float v = 0.5f * u * h;  /* exact; |s| >= |v| (Fast2Sum) */
    float s2 = s + v;
    float e2 = (s - s2) + v;
    float y = 2.0f * (s2 + ((e + e2) + OPK_FMAF(u, T, c)));
    return opk_absf(x) < 0x1p-24f ? x : y;  /* x itself (also -0 and subnormals, which the
                                              * halving would round) */
}

/* ------------------------------------------------------------------------------ log (float) */

/* log(x) = hi + lo for positive normal x, with k added to its exponent. x = 2^E m with
 * m in [sqrt(1/2), sqrt(2)), f = m - 1 exact; log(x) = E ln2 + log1p(f), log1p(f) =
 * f - f^2/2 + f^3 P(f). E LN2F_HI is exact, and so is h = ft^2 (ft: f's top 12 bits, f^2 =
 * h + hl); E LN2F_HI + f - h/2 is summed exactly (two Fast2Sums, each adding the smaller),
 * so only the small terms carry rounding. */
typedef struct { float hi, lo; } opk_ff_t;

OPK_MATH_INLINE opk_ff_t opk_logf_parts(float x, float k)
{
    opk_ff_t o;
    uint32_t ix = opk_asuint(x);
    int32_t ei = (int32_t)(ix - 0x3f3504f3u) >> 23;  /* 0x3f3504f3: sqrt(1/2) */
    float m = opk_asfloat(ix - ((uint32_t)ei << 23));
    float f = m - 1.0f;
    float E = (float)ei + k;
    float ft = opk_asfloat(opk_asuint(f) & 0xfffff000u);
    float h = ft * ft, hl = (f - ft) * (f + ft);
    float A = E * OPK_LN2F_HI;
    float s1 = A + f;
    float e1 = (A - s1) + f;
    float v = -0.5f * h;
    float s2 = s1 + v;
    float e2 = (s1 - s2) + v;
    float tail = OPK_FMAF(f * (f * f), OPK_POLYF(f, opk_c_logf_p),
                          OPK_FMAF(-0.5f, hl, E * OPK_LN2F_LO));
    o.hi = s2;
    o.lo = (e1 + e2) + tail;
    return o;
}

/* natural logarithm: log(0) = -inf, log(x < 0) = NaN, log(inf) = inf */
OPK_MATH_INLINE float opk_logf(float x)
{
    int sub = x < 0x1p-126f;  /* subnormal: scale into the normal range first */
    opk_ff_t l = opk_logf_parts(sub ? x * 0x1p23f : x, sub ? -23.0f : 0.0f);
    float y = l.hi + l.lo;
    float special = x < 0.0f ? OPK_NANF : x;  /* inf and NaN stay */
    special = x == 0.0f ? -OPK_INFF : special;
    return (x > 0.0f) & (x < OPK_INFF) ? y : special;
}

/* log(1 + x): u + c = 1 + x exactly (TwoSum), log1p(x) = log(u) + c / u */
OPK_MATH_INLINE float opk_log1pf(float x)
{
    float u = 1.0f + x;
    float bp = u - 1.0f;
    float c = (1.0f - (u - bp)) + (x - bp);
    opk_ff_t l = opk_logf_parts(u, 0.0f);  /* u >= 2^-24 for x > -1: normal */
    float y = opk_signf(l.hi + (l.lo + c / u), x);  /* the sign of x: -0 stays -0 */
    float special = x < -1.0f ? OPK_NANF : x;
    special = x == -1.0f ? -OPK_INFF : special;
    return (x > -1.0f) & (x < OPK_INFF) ? y : special;
}

/* ------------------------------------------------------------ tanh, sigmoid, softplus (float) */

/* e^x = (hi + lo) s1 s2 as opk_expf_parts, lighter (see opk_expf_parts_k) */
OPK_MATH_INLINE opk_expf_parts_t opk_expf_lite_parts(float x) { return opk_expf_parts_k(x, 1); }

/* e^x within about 1 ULP: r = x - n ln2 and 1 + r + r^2 Q(r) rounded as they come, for tanh
 * and sigmoid, whose other roundings dominate. `wide` (a constant at every call): 2^n as two
 * normal factors, as in opk_expf_parts, for x in [-104, 89], so that a subnormal result
 * rounds once; else one factor, for a normal result (x in [-87.3, 88.7]), three integer
 * operations fewer (tanh is 5-10% faster so). */
OPK_MATH_INLINE float opk_expf_fast_k(float x, int wide)
{
    float t = OPK_FMAF(x, 0x1.715476p0f, OPK_MAGICF);
    float n = t - OPK_MAGICF;
    float r = OPK_FMAF(n, -OPK_LN2F_LO, OPK_FMAF(n, -OPK_LN2F_HI, x));
    float p = OPK_FMAF(r * r, OPK_POLYF_FAST(r, opk_c_expf_q), r) + 1.0f;
    uint32_t nb = opk_asuint(t) - opk_asuint(OPK_MAGICF) + (wide ? 254u : 127u);
    if (!wide) return p * opk_asfloat(nb << 23);
    return (p * opk_asfloat((nb >> 1) << 23)) * opk_asfloat((nb - (nb >> 1)) << 23);
}

OPK_MATH_INLINE float opk_expf_fast(float x) { return opk_expf_fast_k(x, 0); }

/* tanh: a + a^3 P(a^2) below 0.625; above, 1 - q, q = 2 / (e^2a + 1) (rounds to 1 from 9.01
 * on), plain: q <= 0.45 scales down the errors of e^2a, of the sum and of the quotient, and
 * tanh >= 0.55 keeps 1 - q in [1/2, 1), so that one ULP of q is at most half one of tanh. */
OPK_MATH_INLINE float opk_tanhf(float x)
{
    float a = opk_absf(x);
    float z = a * a;
    float small = OPK_FMAF(a * z, OPK_POLYF_FAST(z, opk_c_tanhf_p), a);
    float ac = a > 10.0f ? 10.0f : a;
    float big = 1.0f - 2.0f / (opk_expf_fast(2.0f * ac) + 1.0f);
    return opk_signf(a < 0.625f ? small : big, x);
}

/* 1 / (1 + E) for x >= 0 and E / (1 + E) = E - E q for x < 0, q = E / (1 + E), with
 * E = e^-|x| (opk_expf_fast_k, wide), so that the lower tail is exp-like (subnormal down to
 * -103.97). For x < 0 the last step is one FMA: the quotient's and the sum's roundings enter
 * scaled by q / (1 - q) < 1 (q < 1/2), and E's own error by 1 / (1 + E). No correction terms:
 * within the 2 ULP allowed, they would cost a third of the speed. */
OPK_MATH_INLINE float opk_sigmoidf(float x)
{
    float a = opk_absf(x);
    float E = opk_expf_fast_k(a > 104.0f ? -104.0f : -a, 1);
    int pos = x >= 0.0f;
    float q = (pos ? 1.0f : E) / (1.0f + E);
    return pos ? q : OPK_FMAF(-E, q, E);
}

/* max(x, 0) + log1p(E), E = e^-|x| in (0, 1]: f = E, or (E - 1) / 2 (exact) from E = 1/2 on,
 * log1p(E) = log1p(f) or ln2 + log1p(f), log1p(f) = f - f^2/2 + f^3 P(f) on [-1/4, 1/2]. E's
 * rounding error El enters as El / (1 + E) ~ El (1 - E/2); max(x, 0) + LN2F_HI is summed exactly
 * (Fast2Sum), so that the sum rounds once. e^-104 rounds to 0: -inf gives 0, inf gives inf. */
OPK_MATH_INLINE float opk_softplusf(float x)
{
    float a = opk_absf(x);
    opk_expf_parts_t p = opk_expf_lite_parts(a > 104.0f ? -104.0f : -a);
    float E = (p.hi * p.s1) * p.s2, El = p.lo * (p.s1 * p.s2);
    int hi = E >= 0.5f;
    float f = hi ? OPK_FMAF(0.5f, E, -0.5f) : E;
    float g = OPK_FMAF(f, OPK_POLYF_FAST(f, opk_c_softplusf_p), -0.5f);
    float lp = OPK_FMAF(f * f, g, El * OPK_FMAF(-0.5f, E, 1.0f));  /* log1p(f) - f */
    float mx = x > 0.0f ? x : 0.0f;
    float k = hi ? OPK_LN2F_HI : 0.0f;
    float s = k + mx;
    float e = hi ? (k - s) + mx : 0.0f;  /* Fast2Sum (mx < 1 there); inf - inf elsewhere */
    return s + (e + (f + (lp + (hi ? OPK_LN2F_LO : 0.0f))));
}

/* --------------------------------------------------------------------------------- erf (float) */

/* erf: a + a P(a^2) below 0.75 (P(0) = 2/sqrt(pi) - 1 is small, so neither its float rounding
 * nor that of a P shows: a P is at most 7% of erf); above, 1 - e^z, z = H(a) - a^2 with H ~
 * log(erfc(a)) + a^2 on [0.75, 4] (in a - 0.75), in float: e^z = erfc(a) <= 0.29 scales its
 * errors down. a^2 = h + l exactly (FMA, or a's top 12 bits squared), z = n ln2 + r with
 * -h - n LN2F_HI exact (n has 5 bits, h's ULP is small enough), so that z itself never rounds
 * (its ULP at -1.25 would be 0.28 ULP of erf); beyond 3.92 the result rounds to 1. */
OPK_MATH_INLINE float opk_erff(float x)
{
    float a = opk_absf(x);
    float small = OPK_FMAF(a, OPK_POLYF(a * a, opk_c_erff_p), a);
    float ac = a > 4.0f ? 4.0f : a;  /* a NaN passes */
#if OPK_HAS_FMA
    float h = ac * ac, l = __builtin_fmaf(ac, ac, -h);
#else
    float at = opk_asfloat(opk_asuint(ac) & 0xfffff000u);
    float h = at * at, l = (ac - at) * (ac + at);
#endif
    float H = OPK_POLYF_FAST(ac - 0.75f, opk_c_erff_h);
    float t = OPK_FMAF(H - h, 0x1.715476p0f, OPK_MAGICF);
    float n = t - OPK_MAGICF;
    float rh = OPK_FMAF(n, -OPK_LN2F_HI, -h) + H;  /* the first sum exact */
    float rl = OPK_FMAF(n, -OPK_LN2F_LO, -l);
    float r = rh + rl;
    float one = 1.0f + rh;
    float p = one + (((1.0f - one) + rh) + OPK_FMAF(r * r, OPK_POLYF_FAST(r, opk_c_expf_q), rl));
    float big = 1.0f - p * opk_asfloat((opk_asuint(t) - opk_asuint(OPK_MAGICF) + 127u) << 23);
    return opk_signf(a < 0.75f ? small : big, x);
}

/* -------------------------------------------------------------------------------- erfc (float) */

/* erfc: below |x| = 0.75, 1 - x - x P(x^2) with erff's P and 1 - x split exactly (erfc >= 0.289
 * there). Above, erfc(a) = e^z (a = |x|, clamped at 10.06: erfcf is 0 from 10.0546 on; a NaN
 * passes), z = C + D(a - c) - (a - s)^2 in float on [0.75, 3.75) and [3.75, 10.06], the constants
 * and D's coefficients selected per lane. An absolute error of z is a relative one of erfc, and
 * 2^-24 relative is one ULP at most:
 * - (a - s)^2 = h + l, h = bh^2 rounded (l: FMA, or bh's top 12 bits squared), a - s = bh + bl
 *   (Fast2Sum). s is half the slope of log(erfc(a)) + a^2 over the interval: the exact square
 *   carries that trend, and |D| <= 0.085 keeps D's roundings small. u = a - c is exact (c = 1.75
 *   in the first interval: |u| <= 1 where a < 1).
 * - z = n ln2 + rh + rl, n = rint((C - h) / ln2) without D, so |r| <= ln2/2 + 0.085 (erfcf_q's
 *   range): C - n LN2F_HI - h is exact (C a multiple of 2^-12, h's ULP >= 2^-24, |rh| < 1/2), and
 *   the rest, rl = D - l - n LN2F_LO, is small. e^r = one + tail as in opk_expf_parts, its
 *   polynomial in Estrin's form even with FMA: a shorter chain after D's, measured faster.
 * - 2^n = 2^(n+64) 2^-64. With FMA, from the a on where erfc < 2^-126, the last factor goes in as
 *   fma(P, 2^-64, 2^-126) - 2^-126: the sum rounds on the subnormal grid and the subtraction is
 *   exact, for a multiply that rounds to a subnormal stalls (a microcode assist on Zen 4, where
 *   it made this loop a third slower over tools/vmath_bench.py's inputs). x < 0: 2 - e^z in the
 *   same FMA.
 * The interval is told by an integer compare: GCC threads a float one with the other compares of
 * a and duplicates the polynomial on both paths. */
OPK_MATH_INLINE float opk_erfcf(float x)
{
    float a = opk_absf(x);
    float s0 = 1.0f - x;
    float small = s0 + OPK_FMAF(-x, OPK_POLYF(x * x, opk_c_erff_p), (1.0f - s0) - x);
    float ac = a > 10.06f ? 10.06f : a;
    int hi = (int32_t)opk_asuint(a) >= (int32_t)opk_asuint(OPK_ERFCF_T1);
    float c = hi ? OPK_ERFCF_U1 : OPK_ERFCF_U0, s = hi ? OPK_ERFCF_S1 : OPK_ERFCF_S0;
    float C = hi ? OPK_ERFCF_C1 : OPK_ERFCF_C0;
    float d[OPK_LEN(opk_c_erfcf_d0)];
    for (int i = 0; i < OPK_LEN(d); i++)
        d[i] = hi ? opk_c_erfcf_d1[i] : opk_c_erfcf_d0[i];
    float bh = ac - s;
    float bl = (ac - bh) - s;
#if OPK_HAS_FMA
    float h = bh * bh, l = __builtin_fmaf(bh + bh, bl, __builtin_fmaf(bh, bh, -h));
#else
    float bt = opk_asfloat(opk_asuint(bh) & 0xfffff000u);
    float h = bt * bt, l = (bh + bh) * bl + (bh - bt) * (bh + bt);
#endif
    float D = OPK_POLYF_FAST(ac - c, d);
    float t = OPK_FMAF(C - h, 0x1.715476p0f, OPK_MAGICF);
    float n = t - OPK_MAGICF;
    float rh = OPK_FMAF(n, -OPK_LN2F_HI, C) - h;  /* exact */
    float rl = D + OPK_FMAF(n, -OPK_LN2F_LO, -l);
    float r = rh + rl;
    float one = 1.0f + rh;
    float tail = ((1.0f - one) + rh) + OPK_FMAF(r * r, OPK_ESTRINF(r, opk_c_erfcf_q), rl);
    float s64 = opk_asfloat((opk_asuint(t) - opk_asuint(OPK_MAGICF) + 191u) << 23);  /* 2^(n+64) */
    float P = OPK_FMAF(tail, s64, one * s64);
#if OPK_HAS_FMA
    float m = a >= OPK_ERFCF_SUB ? 0x1p-126f : 0.0f;
    float big = x < 0.0f ? __builtin_fmaf(P, -0x1p-64f, 2.0f) : __builtin_fmaf(P, 0x1p-64f, m) - m;
#else
    float E = P * 0x1p-64f;
    float big = x < 0.0f ? 2.0f - E : E;
#endif
    return a < 0.75f ? small : big;
}

/* ------------------------------------------------------------------------- sin, cos (float) */

/* sin(x + q pi/2) in double: n = rint(x 2/pi), r = x - n pi/2 with pi/2 in 23-bit pieces (n
 * times each is exact for n < 2^30, and the first two subtractions are exact), so r is good
 * to 2^-52 relative on |x| < 1.68e9. The quadrant's low bits are t's; the sin/cos choice and
 * the sign are bit masks (SSE2 has no 64-bit compare). */
OPK_MATH_INLINE float opk_sincosf_k(float x, uint64_t quadrant)
{
    double xd = x;
    /* past the exact range, |x| <= 2^40 keeps r bounded (inf and NaN pass) */
    xd = (xd > 0x1p40) & (xd < OPK_INF) ? 0x1p40 : xd;
    xd = (xd < -0x1p40) & (xd > -OPK_INF) ? -0x1p40 : xd;
    double t = OPK_FMA(xd, 0x1.45f306dc9c883p-1, OPK_MAGIC);  /* 2/pi */
    double n = t - OPK_MAGIC;
    double r = OPK_FMA(n, -OPK_PIO2_1, xd);
    r = OPK_FMA(n, -OPK_PIO2_2, r);
    r = OPK_FMA(n, -OPK_PIO2_3, r);
    r = OPK_FMA(n, -OPK_PIO2_4, r);
    double z = r * r;
    double s = r * OPK_FMA(z, OPK_POLY(z, opk_c_sinf_s), 1.0);  /* r (1 + ...): sin(-0) = -0 */
    double c = OPK_FMA(z, OPK_FMA(z, OPK_POLY(z, opk_c_cosf_c), -0.5), 1.0);
    uint64_t q = opk_asuint64(t) + quadrant;
    uint64_t odd = 0 - (q & 1);
    uint64_t v = (opk_asuint64(c) & odd) | (opk_asuint64(s) & ~odd);
    return (float)opk_asdouble(v ^ ((q & 2) << 62));
}

OPK_MATH_INLINE float opk_sinf(float x) { return opk_sincosf_k(x, 0); }
OPK_MATH_INLINE float opk_cosf(float x) { return opk_sincosf_k(x, 1); }

/* ------------------------------------------------------------------------------- pow (float) */

/* log2(x) in double for positive normal float x (times 2^-k): x = 2^E m, m in
 * [sqrt(1/2), sqrt(2)), ln(m) = 2s + s z P(z), s = (m - 1) / (m + 1), z = s^2: 2^-45 relative */
OPK_MATH_INLINE double opk_log2_for_float(float x, float k)
{
    uint32_t ix = opk_asuint(x);
    int32_t ei = (int32_t)(ix - 0x3f3504f3u) >> 23;
    double f = (double)opk_asfloat(ix - ((uint32_t)ei << 23)) - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double lnm = OPK_FMA(s * z, OPK_POLY(z, opk_c_powf_r), 2.0 * s);
    return OPK_FMA(lnm, 0x1.71547652b82fep0, (double)((float)ei + k));
}

/* x^y as 2^(y log2|x|) in double (w = y log2|x| good to 2^-45 relative, 2^w to 2^-38), the
 * result rounded once to float (overflow, subnormal); then the special cases of C99 F.9.4.4 */
OPK_MATH_INLINE float opk_powf(float x, float y)
{
    float ax = opk_absf(x), ay = opk_absf(y);
    /* y an integer? odd? Below 2^23, ay + 2^23 is exact for an integer and its last mantissa
     * bit is the parity; from 2^23 to 2^24 ay's own last bit is; beyond, ay is even. */
    float yt = ay + 0x1p23f;
    int small = ay < 0x1p23f;
    int yint = (yt - 0x1p23f == ay) | !small;
    uint32_t ybits = small ? opk_asuint(yt) : opk_asuint(ay);
    int yodd = yint & (ay < 0x1p24f) & (int)(ybits & 1u);
    int sub = ax < 0x1p-126f;
    double w = (double)y * opk_log2_for_float(sub ? ax * 0x1p23f : ax, sub ? -23.0f : 0.0f);
    w = w < -200.0 ? -200.0 : (w > 200.0 ? 200.0 : w);  /* far past float's range; NaN passes */
    double wt = w + OPK_MAGIC;
    double wr = w - (wt - OPK_MAGIC);  /* exact, in [-1/2, 1/2] */
    double p = OPK_FMA(wr, OPK_POLY(wr, opk_c_powf_e), 1.0);
    double scale = opk_asdouble((opk_asuint64(wt) - opk_asuint64(OPK_MAGIC) + 1023u) << 52);
    float mag = (float)(p * scale);  /* the one rounding: overflow, subnormal */
    mag = ax == 0.0f ? (y < 0.0f ? OPK_INFF : 0.0f) : mag;
    mag = ax == OPK_INFF ? (y < 0.0f ? 0.0f : OPK_INFF) : mag;
    float res = (opk_asuint(x) >> 31) & yodd ? -mag : mag;  /* (-0)^3 = -0, (-inf)^-3 = -0 */
    res = (x < 0.0f) & (x > -OPK_INFF) & !yint ? OPK_NANF : res;
    float yinf = ax == 1.0f ? 1.0f : ((ax < 1.0f) == (y < 0.0f) ? OPK_INFF : 0.0f);
    res = ay == OPK_INFF ? yinf : res;
    res = (x != x) | (y != y) ? x + y : res;
    return (y == 0.0f) | (x == 1.0f) ? 1.0f : res;  /* even for a NaN */
}

/* ----------------------------------------------------------------------------- exp (double) */

/* as opk_expf_parts: e^x = (hi + lo) s1 s2 for x in [-746, 710]; n has 11 bits, LN2_HI 42 */
typedef struct { double s1, s2, hi, lo; } opk_exp_parts_t;

OPK_MATH_INLINE opk_exp_parts_t opk_exp_parts(double x)
{
    opk_exp_parts_t o;
    double t = OPK_FMA(x, 0x1.71547652b82fep0, OPK_MAGIC);
    double n = t - OPK_MAGIC;
    double rh = OPK_FMA(n, -OPK_LN2_HI, x);
    double rl = n * -OPK_LN2_LO;
    double r = rh + rl;
    double d = (rh - r) + rl;
    double one = 1.0 + rh;
    double tail = ((1.0 - one) + rh) + OPK_FMA(r * r, OPK_POLY(r, opk_c_exp_q),
                                              OPK_FMA(d, r, rl));
    o.hi = one + tail;
    o.lo = (one - o.hi) + tail;
    uint64_t nb = opk_asuint64(t) - opk_asuint64(OPK_MAGIC) + 2046u;
    o.s1 = opk_asdouble((nb >> 1) << 52);
    o.s2 = opk_asdouble((nb - (nb >> 1)) << 52);
    return o;
}

/* e^x; overflow above 709.78, gradual underflow down to 2^-1074 */
OPK_MATH_INLINE double opk_exp(double x)
{
    double xc = x < -746.0 ? -746.0 : x;
    xc = xc > 710.0 ? 710.0 : xc;
    opk_exp_parts_t p = opk_exp_parts(xc);
    return p.hi * p.s1 * p.s2;
}

/* e^x - 1, as opk_expm1f (2^(n-1) - 1/2 is exact for |n| <= 53) */
OPK_MATH_INLINE double opk_expm1(double x)
{
    double xc = x < -40.0 ? -40.0 : x;  /* below -37.4 the result rounds to -1 */
    xc = xc > 710.0 ? 710.0 : xc;
    double t = OPK_FMA(xc, 0x1.71547652b82fep0, xc > 0.0 ? -0.5 : 0.0) + OPK_MAGIC;
    double n = t - OPK_MAGIC;
    double rh = OPK_FMA(n, -OPK_LN2_HI, xc);
    double rl = n * -OPK_LN2_LO;
    double r = rh + rl;
    double d = (rh - r) + rl;
    double rt = opk_asdouble(opk_asuint64(r) & 0xfffffffff8000000ull);  /* top 26 bits */
    double h = rt * rt, hl = (r - rt) * (r + rt);
    double Q1 = opk_poly(r, opk_c_expm1_q + 1, OPK_LEN(opk_c_expm1_q) - 1);
    double T = OPK_FMA(r * (r * r), Q1, OPK_FMA(0.5, hl, OPK_FMA(d, r, rl)));
    double u = opk_asdouble((opk_asuint64(t) - opk_asuint64(OPK_MAGIC) + 1022u) << 52);
    double a = n > 53.0 ? u : (n < -53.0 ? -0.5 : u - 0.5);
    double c = n > 53.0 ? -0.5 : (n < -53.0 ? u : 0.0);
    double b = u * rh;
    double s = a + b;
    double e = (a - s) + b;
    double v = 0.5 * u * h;
    double s2 = s + v;
    double e2 = (s - s2) + v;
    double y = 2.0 * (s2 + ((e + e2) + OPK_FMA(u, T, c)));
    return opk_abs(x) < 0x1p-54 ? x : y;
}

/* ----------------------------------------------------------------------------- log (double) */

/* log(x) = hi + lo for positive normal x, plus k: x = 2^E m, m in [sqrt(1/2), sqrt(2)) (E and
 * m through an exponent-field offset: logical shifts only); log1p(f) = f - hfsq + s (hfsq + R),
 * s = f / (2 + f), R = z P(z), z = s^2, hfsq = f^2/2. As in opk_logf_parts, E LN2_HI + f -
 * ft^2/2 is summed exactly (ft: f's top 26 bits). */
typedef struct { double hi, lo; } opk_dd_t;

OPK_MATH_INLINE opk_dd_t opk_log_parts(double x, double k)
{
    opk_dd_t o;
    uint64_t ix = opk_asuint64(x) + (0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull);
    /* the biased exponent (< 2^11) as a double, through the 2^52 magic number */
    double E = opk_asdouble(0x4330000000000000ull | (ix >> 52)) - (0x1p52 + 1023.0) + k;
    double m = opk_asdouble((ix & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull);
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double R = z * OPK_POLY(z, opk_c_log_r);
    double hfsq = 0.5 * f * f;
    double ft = opk_asdouble(opk_asuint64(f) & 0xfffffffff8000000ull);  /* top 26 bits */
    double h = ft * ft, hl = (f - ft) * (f + ft);  /* f^2 = h + hl, h exact */
    double A = E * OPK_LN2_HI;
    double s1 = A + f;
    double e1 = (A - s1) + f;
    double v = -0.5 * h;
    double s2 = s1 + v;
    double e2 = (s1 - s2) + v;
    o.hi = s2;
    o.lo = (e1 + e2) + OPK_FMA(-0.5, hl, OPK_FMA(E, OPK_LN2_LO, s * (hfsq + R)));
    return o;
}

OPK_MATH_INLINE double opk_log(double x)
{
    int sub = x < 0x1p-1022;
    opk_dd_t l = opk_log_parts(sub ? x * 0x1p54 : x, sub ? -54.0 : 0.0);
    double y = l.hi + l.lo;
    double special = x < 0.0 ? OPK_NAN : x;
    special = x == 0.0 ? -OPK_INF : special;
    return (x > 0.0) & (x < OPK_INF) ? y : special;
}

OPK_MATH_INLINE double opk_log1p(double x)
{
    double u = 1.0 + x;
    double bp = u - 1.0;
    double c = (1.0 - (u - bp)) + (x - bp);
    opk_dd_t l = opk_log_parts(u, 0.0);
    double y = x == 0.0 ? x : l.hi + (l.lo + c / u);  /* -0 stays -0 */
    double special = x < -1.0 ? OPK_NAN : x;
    special = x == -1.0 ? -OPK_INF : special;
    return (x > -1.0) & (x < OPK_INF) ? y : special;
}

/* ----------------------------------------------------------- tanh, sigmoid, softplus (double) */

/* tanh: a + a^3 P(a^2) below 0.625; above, 1 - q with q = 2 / D, D = e^2a + 1 carried as
 * Dh + Dl, q corrected by its exact residual (2 - q Dh, from opk_two_prod) and by Dl */
OPK_MATH_INLINE double opk_tanh(double x)
{
    double a = opk_abs(x);
    double z = x * x;
    double small = OPK_FMA(x * z, OPK_POLY(z, opk_c_tanh_p), x);
    double ac = a > 22.0 ? 22.0 : a;  /* tanh rounds to 1 from 19.06 on */
    opk_exp_parts_t p = opk_exp_parts(2.0 * ac);
    double sc = p.s1 * p.s2;
    double Eh = p.hi * sc;  /* exact: a power of two times hi */
    double Dh = Eh + 1.0;  /* Fast2Sum: Eh >= 3.4 */
    double Dl = ((Eh - Dh) + 1.0) + p.lo * sc;
    double q = 2.0 / Dh;
    double pe, pp = opk_two_prod(q, Dh, &pe);
    double corr = ((2.0 - pp) - pe - q * Dl) * (0.5 * q);  /* q_exact - q */
    double h = 1.0 - q;  /* Fast2Sum: 1 >= q */
    double big = h + (((1.0 - h) - q) - corr);
    /* the sign by selects: bit operations on a selected double can leave GCC an int64 select,
     * which SSE2 cannot vectorize */
    return x == 0.0 ? x : (a < 0.625 ? small : (x < 0.0 ? -big : big));
}

/* 1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 (the lower tail exp-like). E = e^-|x| = Eh + El
 * and D = 1 + Eh = Dh + Dl (Fast2Sum); the quotient q = N / Dh is corrected by its residual,
 * exact (Dekker's product), and by (Nl - q (Dl + El)) / Dh, 1 / Dh ~ q (x >= 0) or 1 - q. */
OPK_MATH_INLINE double opk_sigmoid(double x)
{
    double xc = opk_abs(x);
    xc = xc > 746.0 ? 746.0 : xc;
    opk_exp_parts_t p = opk_exp_parts(-xc);
    double Eh = (p.hi * p.s1) * p.s2, El = (p.lo * p.s1) * p.s2;
    double Dh = 1.0 + Eh;
    double Dl = ((1.0 - Dh) + Eh) + El;
    int pos = x >= 0.0;
    double N = pos ? 1.0 : Eh, Nl = pos ? 0.0 : El;
    double q = N / Dh;
    double pe, pp = opk_two_prod(q, Dh, &pe);
    double inv = pos ? q : 1.0 - q;  /* ~ 1 / Dh */
    return q + (((N - pp) - pe) + Nl - q * Dl) * inv;
}

/* max(x, 0) + log1p(E), E = e^-|x| = Eh + El: 1 + Eh = u + c exactly, log1p(E) =
 * log(u) + (c + El) / u, and max(x, 0) + log(u)'s high part is summed exactly (TwoSum) */
OPK_MATH_INLINE double opk_softplus(double x)
{
    double xc = opk_abs(x);
    xc = xc > 746.0 ? 746.0 : xc;
    opk_exp_parts_t p = opk_exp_parts(-xc);
    double Eh = (p.hi * p.s1) * p.s2, El = (p.lo * p.s1) * p.s2;
    double u = 1.0 + Eh;
    double c = ((1.0 - u) + Eh) + El;
    opk_dd_t l = opk_log_parts(u, 0.0);
    double mx = x > 0.0 ? x : 0.0;
    double sh = mx + l.hi;
    double bp = sh - mx;
    double sl = (mx - (sh - bp)) + (l.hi - bp);
    double y = sh + (sl + (l.lo + c / u));
    /* for E < 2^-28, log1p(E) = E - E^2/2 to 2^-57: u = 1 + E would lose E's bits */
    y = Eh < 0x1p-28 ? mx + (Eh + OPK_FMA(-0.5 * Eh, Eh, El)) : y;
    return x > 40.0 ? x : (x != x ? x : y);  /* softplus(x) rounds to x from 37.4 on */
}

#endif /* OPKIT_MATH_H */
