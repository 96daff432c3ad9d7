/* opkit kernel support: storage <-> compute conversion and the strided iteration walker.
 *
 * Included by every generated kernel module. Kernels compute on contiguous tiles in float or
 * double; operands stored in another dtype (float16) or with other strides are converted or
 * gathered into a tile first and scattered back after. float16 conversion uses the CPU's
 * instructions when the compiler targets them (AVX-512F, F16C) and exact portable C otherwise.
 */
#ifndef OPKIT_KERNEL_H
#define OPKIT_KERNEL_H

#include <stdint.h>
#include <string.h>
#include <Python.h>

#if (defined(__AVX512F__) || defined(__F16C__)) && !defined(OPKIT_NO_F16C)
#include <immintrin.h>
#define OPK_F16_HW 1
#else
#define OPK_F16_HW 0
#endif

/* restrict-qualified pointers: a kernel tile never reads memory it writes at another index */
typedef float *__restrict opk_fp;
typedef const float *__restrict opk_cfp;
typedef double *__restrict opk_dp;
typedef const double *__restrict opk_cdp;

/* storage dtype codes, shared with opkit/runtime (DTYPE_CODES) */
enum { OPK_F16 = 1, OPK_F32 = 2, OPK_F64 = 3 };

/* ---------------------------------------------------------------- float16, portable and exact */

static inline float opk_h2f_soft(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t expo = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (expo == 0x1fu) {                       /* inf, nan: keep the payload */
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (expo != 0) {                    /* normal: rebias 15 -> 127 */
        bits = sign | ((expo + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {                    /* signed zero */
        bits = sign;
    } else {                                   /* subnormal: normalise the mantissa */
        uint32_t e = 113u;
        while (!(mant & 0x400u)) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float -> float16, round to nearest even; overflow -> inf; nan stays nan */
static inline uint16_t opk_f2h_soft(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x47800000u)                      /* >= 65536, inf or nan */
        return sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (x < 0x38800000u) {                     /* below the smallest normal half: 2^-14 */
        /* adding 0.5 aligns the half's subnormal grid with float's last bits; the FPU rounds */
        float magic, g;
        uint32_t mbits = 0x3f000000u, gbits;   /* 0.5f */
        memcpy(&magic, &mbits, sizeof magic);
        memcpy(&g, &x, sizeof g);
        g += magic;
        memcpy(&gbits, &g, sizeof gbits);
        return sign | (uint16_t)(gbits - mbits);
    }
    /* normal: rebias the exponent and round the 13 dropped bits to nearest even */
    x += 0xc8000fffu + ((x >> 13) & 1u);
    return sign | (uint16_t)(x >> 13);
}

#if OPK_F16_HW
static inline float opk_h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t opk_f2h(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
#define opk_h2f opk_h2f_soft
#define opk_f2h opk_f2h_soft
#endif

static inline void opk_h2f_contig(float *dst, const uint16_t *src, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if OPK_F16_HW && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#endif
#if OPK_F16_HW
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = opk_h2f(src[i]);
}

static inline void opk_f2h_contig(uint16_t *dst, const float *src, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if OPK_F16_HW && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if OPK_F16_HW
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = opk_f2h(src[i]);
}

/* ---------------------------------------------------------------- tile loads and stores */

#define OPK_GATHER(T, dst, src, stride, n, conv) do {                        \
        for (Py_ssize_t i_ = 0; i_ < (n); i_++) {                           \
            T v_; memcpy(&v_, (src) + i_ * (stride), sizeof v_);            \
            (dst)[i_] = conv(v_);                                           \
        } } while (0)
#define OPK_SCATTER(T, dst, stride, src, n, conv) do {                       \
        for (Py_ssize_t i_ = 0; i_ < (n); i_++) {                           \
            T v_ = conv((src)[i_]); memcpy((dst) + i_ * (stride), &v_, sizeof v_); \
        } } while (0)
#define OPK_ID(v) (v)
#define OPK_TO_F(v) ((float)(v))
#define OPK_TO_D(v) ((double)(v))
#define OPK_H2D(v) ((double)opk_h2f(v))
#define OPK_D2H(v) opk_f2h((float)(v))

/* dst[0..n) = operand elements src, src+stride, ... converted to float */
static inline void opk_load_f(float *dst, const char *src, Py_ssize_t stride, int code, Py_ssize_t n)
{
    switch (code) {
    case OPK_F16:
        if (stride == 2) opk_h2f_contig(dst, (const uint16_t *)src, n);
        else OPK_GATHER(uint16_t, dst, src, stride, n, opk_h2f);
        break;
    case OPK_F32:
        if (stride == 4) memcpy(dst, src, (size_t)n * 4);
        else OPK_GATHER(float, dst, src, stride, n, OPK_ID);
        break;
    default:
        OPK_GATHER(double, dst, src, stride, n, OPK_TO_F);
    }
}

static inline void opk_load_d(double *dst, const char *src, Py_ssize_t stride, int code, Py_ssize_t n)
{
    switch (code) {
    case OPK_F16: OPK_GATHER(uint16_t, dst, src, stride, n, OPK_H2D); break;
    case OPK_F32: OPK_GATHER(float, dst, src, stride, n, OPK_TO_D); break;
    default:
        if (stride == 8) memcpy(dst, src, (size_t)n * 8);
        else OPK_GATHER(double, dst, src, stride, n, OPK_ID);
    }
}

static inline void opk_store_f(char *dst, Py_ssize_t stride, int code, const float *src, Py_ssize_t n)
{
    switch (code) {
    case OPK_F16:
        if (stride == 2) opk_f2h_contig((uint16_t *)dst, src, n);
        else OPK_SCATTER(uint16_t, dst, stride, src, n, opk_f2h);
        break;
    case OPK_F32:
        if (stride == 4) memcpy(dst, src, (size_t)n * 4);
        else OPK_SCATTER(float, dst, stride, src, n, OPK_ID);
        break;
    default:
        OPK_SCATTER(double, dst, stride, src, n, OPK_TO_D);
    }
}

static inline void opk_store_d(char *dst, Py_ssize_t stride, int code, const double *src, Py_ssize_t n)
{
    switch (code) {
    case OPK_F16: OPK_SCATTER(uint16_t, dst, stride, src, n, OPK_D2H); break;
    case OPK_F32: OPK_SCATTER(float, dst, stride, src, n, OPK_TO_F); break;
    default:
        if (stride == 8) memcpy(dst, src, (size_t)n * 8);
        else OPK_SCATTER(double, dst, stride, src, n, OPK_ID);
    }
}

/* ---------------------------------------------------------------- iteration */

#define OPK_MAXDIM 64
#define OPK_MAXOPS 32

/* geometry, built by opkit/runtime/geometry.py as an intp array:
 *   [ndim, nops, shape[ndim], strides[nops][ndim] (bytes), codes[nops]]
 * the last dim is the inner one; ndim >= 1 */
typedef void (*opk_segment_fn)(Py_ssize_t n, char **ptr, Py_ssize_t *step, int *code, void *ctx);

static inline Py_ssize_t opk_total(const Py_ssize_t *g)
{
    Py_ssize_t total = 1;
    for (Py_ssize_t d = 0; d < g[0]; d++) total *= g[2 + d];
    return total;
}

/* Run fn over the flat element range [start, stop) of the iteration space, one row piece at a
 * time. Threads call this on disjoint ranges, so each element is computed exactly once and the
 * result does not depend on the number of threads. */
static void opk_walk(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t *g, char **base,
                     opk_segment_fn fn, void *ctx)
{
    const Py_ssize_t nd = g[0], nops = g[1];
    const Py_ssize_t *shape = g + 2;
    const Py_ssize_t *strides = shape + nd;
    const Py_ssize_t *codes = strides + nops * nd;
    Py_ssize_t idx[OPK_MAXDIM];
    char *row[OPK_MAXOPS], *ptr[OPK_MAXOPS];
    Py_ssize_t step[OPK_MAXOPS];
    int code[OPK_MAXOPS];
    if (stop <= start) return;
    const Py_ssize_t inner = shape[nd - 1];
    Py_ssize_t r = start / inner, col = start % inner;
    for (Py_ssize_t d = nd - 2; d >= 0; d--) { idx[d] = r % shape[d]; r /= shape[d]; }
    for (Py_ssize_t k = 0; k < nops; k++) {
        const Py_ssize_t *s = strides + k * nd;
        char *p = base[k];
        for (Py_ssize_t d = 0; d < nd - 1; d++) p += idx[d] * s[d];
        row[k] = p;
        step[k] = s[nd - 1];
        code[k] = (int)codes[k];
    }
    Py_ssize_t left = stop - start;
    for (;;) {
        Py_ssize_t m = inner - col < left ? inner - col : left;
        for (Py_ssize_t k = 0; k < nops; k++) ptr[k] = row[k] + col * step[k];
        fn(m, ptr, step, code, ctx);
        left -= m;
        if (left <= 0) break;
        col = 0;
        for (Py_ssize_t d = nd - 2; d >= 0; d--) {      /* odometer over the outer dims */
            const int wrap = ++idx[d] == shape[d];
            for (Py_ssize_t k = 0; k < nops; k++)
                row[k] += wrap ? -(shape[d] - 1) * strides[k * nd + d] : strides[k * nd + d];
            if (!wrap) break;
            idx[d] = 0;
        }
    }
}

#endif /* OPKIT_KERNEL_H */
