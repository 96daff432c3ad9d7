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
#include <stddef.h>
#include <string.h>
#include <Python.h>

/* OPKIT_NO_F16C (the portable build) keeps every intrinsic out */
#if (defined(__AVX512F__) || defined(__F16C__)) && !defined(OPKIT_NO_F16C)
#include <immintrin.h>
#define OPK_F16_HW 1
#else
#define OPK_F16_HW 0
#endif

/* the helpers a float16 loop calls a block at a time: not inlined, the state they take by
 * address (a writer, column sums) would live in memory instead of registers */
#if defined(__GNUC__)
#define OPK_BLOCK_FN static inline __attribute__((always_inline))
#else
#define OPK_BLOCK_FN static inline
#endif

/* restrict-qualified pointers: a kernel tile never reads memory it writes at another index */
typedef float *__restrict opk_fp;
typedef const float *__restrict opk_cfp;
typedef double *__restrict opk_dp;
typedef const double *__restrict opk_cdp;
typedef int32_t *__restrict opk_ip;
typedef const int32_t *__restrict opk_cip;
typedef int64_t *__restrict opk_lp;
typedef const int64_t *__restrict opk_clp;

/* The ABI (opkit/abi.py: the storage dtype codes OPK_F16 ..., OPK_CSIZE, the geometry array's
 * fields OPK_G_*, the float32 bounds) and the lowering's limits (OPK_MAXOPS ...) come from opkit
 * itself: the generated module and the runtime's source define them (opkit/abi.py: c_defines)
 * before this header. */
#if !defined(OPK_F16) || !defined(OPK_CSIZE) || !defined(OPK_F32_OVERFLOW) || \
    !defined(OPK_MAXOPS) || !defined(OPK_MAXACC) || !defined(OPK_ACC_CHUNK) || !defined(OPK_LANE_BYTES)
#error "opkit_kernel.h is included by opkit's generated modules and its runtime source, which define the dtype codes"
#endif

/* the fixed-point product x * m / 2**bits, rounded to nearest with ties toward +inf: an integer
 * multiply, an add and an arithmetic shift (gcc and clang shift signed integers arithmetically).
 * int32: |x| <= 2**15 (int8, int16 data) and |m| < 2**15 cannot overflow; int64 holds int32 data */
static inline int32_t opk_qmul_i(int32_t x, int32_t m, int bits)
{
    return (x * m + ((int32_t)1 << (bits - 1))) >> bits;
}

static inline int64_t opk_qmul_l(int64_t x, int64_t m, int bits)
{
    return (x * m + ((int64_t)1 << (bits - 1))) >> bits;
}

/* ---------------------------------------------------------------- attrs rounded to float */

/* A finite double rounds to float infinity from OPK_F32_OVERFLOW up and a nonzero one to zero
 * at or below OPK_F32_VANISH (opkit/abi.py, which the runtime's check reads too). Written as
 * comparisons, so no out-of-range conversion happens. */
static inline int opk_overflows_f(double v)
{
    double a = v < 0 ? -v : v;
    return a >= OPK_F32_OVERFLOW && a <= 0x1.fffffffffffffp+1023;
}

static inline int opk_vanishes_f(double v)
{
    double a = v < 0 ? -v : v;
    return a > 0 && a <= OPK_F32_VANISH;
}

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

/* A float16 kernel converts blocks of OPK_HBLOCK elements around its element loop, which the
 * compiler vectorizes as it does the float one: the block stays in registers and L1, and no
 * float tile makes a round trip through memory per pass. (A block of one vector gets unrolled
 * whole, and gcc then leaves a loop with branches scalar; blocks of 128 and more measured
 * slower than 64.) Whole blocks convert with a fixed count: no tail tests, no calls. */
#define OPK_HBLOCK 64
typedef float opk_hblock[OPK_HBLOCK];

static inline void opk_h2f_full(float *d, const uint16_t *s) { opk_h2f_contig(d, s, OPK_HBLOCK); }

/* a whole block rounded to float16 */
static inline void opk_f2h_full(uint16_t *d, const float *s) { opk_f2h_contig(d, s, OPK_HBLOCK); }

/* the last, partial block: d[0 .. OPK_HBLOCK) = s[0 .. w) as floats, then zeros */
static inline void opk_h2f_block(float *d, const uint16_t *s, Py_ssize_t w)
{
    opk_h2f_contig(d, s, w);
    for (Py_ssize_t i = w; i < OPK_HBLOCK; i++) d[i] = 0.0f;
}

/* ... and of an input that is float already */
static inline void opk_f2f_block(float *d, const float *s, Py_ssize_t w)
{
    memcpy(d, s, (size_t)w * sizeof(float));
    for (Py_ssize_t i = w; i < OPK_HBLOCK; i++) d[i] = 0.0f;
}

/* Gradient clipping of a block of float results, [lo, hi] (an ordered comparison is false for
 * NaN, so NaN stays NaN: the clamp the element loops apply on store); nothing to do for the
 * bounds of a call that does not clip. */
static inline void opk_clamp_block(float *v, float lo, float hi, Py_ssize_t n)
{
    if (lo == -INFINITY && hi == INFINITY) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float c = v[i] < lo ? lo : v[i];
        v[i] = c > hi ? hi : c;
    }
}

/* n copies of one float16 (or any 16-bit) value */
static inline void opk_fill_u16(uint16_t *d, uint16_t v, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) d[i] = v;
}

/* ---------------------------------------------------------------- bfloat16 */

/* bfloat16 is the top half of a float: widening is a shift; narrowing rounds to nearest even
 * on the dropped 16 bits, and keeps a NaN a (quiet) NaN */
static inline float opk_bf2f(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t opk_f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
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
#define OPK_BF2D(v) ((double)opk_bf2f(v))
#define OPK_D2BF(v) opk_f2bf((float)(v))
#define OPK_D2H(v) opk_f2h((float)(v))

/* dst[0..n) = operand elements src, src+stride, ... converted to float */
static inline void opk_load_f(float *dst, const char *src, Py_ssize_t stride, int code, Py_ssize_t n)
{
    if (stride == 0) {  /* broadcast along this run: one value, filled (vectorized) */
        float v;
        opk_load_f(&v, src, 1, code, 1);
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    switch (code) {
    case OPK_F16:
        if (stride == 2) opk_h2f_contig(dst, (const uint16_t *)src, n);
        else OPK_GATHER(uint16_t, dst, src, stride, n, opk_h2f);
        break;
    case OPK_BF16: OPK_GATHER(uint16_t, dst, src, stride, n, opk_bf2f); break;
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
    if (stride == 0) {
        double v;
        opk_load_d(&v, src, 1, code, 1);
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    switch (code) {
    case OPK_F16: OPK_GATHER(uint16_t, dst, src, stride, n, OPK_H2D); break;
    case OPK_BF16: OPK_GATHER(uint16_t, dst, src, stride, n, OPK_BF2D); break;
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
    case OPK_BF16: OPK_SCATTER(uint16_t, dst, stride, src, n, opk_f2bf); break;
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
    case OPK_BF16: OPK_SCATTER(uint16_t, dst, stride, src, n, OPK_D2BF); break;
    case OPK_F32: OPK_SCATTER(float, dst, stride, src, n, OPK_TO_F); break;
    default:
        if (stride == 8) memcpy(dst, src, (size_t)n * 8);
        else OPK_SCATTER(double, dst, stride, src, n, OPK_ID);
    }
}

/* ---------------------------------------------------------------- streaming stores */

/* Outputs much larger than the caches are written with non-temporal stores: the lines go
 * straight to memory instead of being read first (read-for-ownership) and evicted later. */
#define OPK_STREAM_MIN (1 << 21)  /* elements of a call from which results stream: smaller
                                     * outputs stay in the last-level cache for the next
                                     * operation */
/* ... and of a run piece of such a call: a group of NHWC rows (OPK_GROUP elements) or an NCHW
 * row streams too, whole lines from its first aligned one (opk_stream_f); its edges, shared
 * with the runs beside it, take plain stores. Not streamed, each run's output lines were read
 * before being written: float32 backward passes with folded sums took 1.1 to 1.2 times as
 * long (16M elements, NHWC and NCHW, two threads). */
#define OPK_STREAM_RUN 1024

static inline void opk_stream_f(float *dst, const float *src, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if OPK_F16_HW && defined(__AVX512F__)
    for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif OPK_F16_HW  /* whole lines too: a line streamed in part goes to memory in part */
    for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];
    for (; i + 16 <= n; i += 16) {
        _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
        _mm256_stream_ps(dst + i + 8, _mm256_loadu_ps(src + i + 8));
    }
#endif
    for (; i < n; i++) dst[i] = src[i];
}

static inline void opk_stream_d(double *dst, const double *src, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if OPK_F16_HW && defined(__AVX512F__)
    for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];
    for (; i + 8 <= n; i += 8) _mm512_stream_pd(dst + i, _mm512_loadu_pd(src + i));
#elif OPK_F16_HW
    for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];
    for (; i + 8 <= n; i += 8) {
        _mm256_stream_pd(dst + i, _mm256_loadu_pd(src + i));
        _mm256_stream_pd(dst + i + 4, _mm256_loadu_pd(src + i + 4));
    }
#endif
    for (; i < n; i++) dst[i] = src[i];
}

/* integers stream as the bits they are */
#define opk_stream_i(dst, src, n) opk_stream_f((float *)(dst), (const float *)(src), (n))
#define opk_stream_l(dst, src, n) opk_stream_d((double *)(dst), (const double *)(src), (n))

/* A float16 run's results streamed (non-temporal stores) whole lines at a time, wherever the
 * run starts. NumPy puts a large array's data 16 bytes into a page, so each group of NHWC rows
 * (opk_walk_rows) and each NCHW row starts and ends inside a line, and a line streamed in part
 * goes to memory in part (read, merged, written): it measured slower than not streaming at
 * all. The writer shifts each block's results by the run's offset in its first line (`sh`
 * elements), carries a block's last `sh` to the line the next one completes, and gives the
 * run's first and last lines, which it shares with the runs beside it, plain stores.
 * The blocks must be consecutive: one writer an output, over a run's tiles in order. */
typedef struct {
#if OPK_F16_HW && defined(__AVX512BW__)
    __m512i carry, idx;    /* the last block's second line; the shift as a permutation */
#else
    uint16_t carry[32];
#endif
    uint16_t *line;        /* the next whole line to stream */
    uint16_t *first;       /* the run's first element */
    int sh;                /* the run's offset in its first line, in elements (0 .. 31) */
    int state;             /* 0: no block yet, 1: blocks stored, 2: ended (or not used) */
} opk_ntw;

/* a writer for the run starting at d (an even address) */
OPK_BLOCK_FN void opk_ntw_start(opk_ntw *w, uint16_t *d)
{
    const uintptr_t a = (uintptr_t)d;
    w->sh = (int)((a & 63) >> 1);
    w->first = d;
    w->line = (uint16_t *)(a & ~(uintptr_t)63) + (w->sh ? 32 : 0);
    w->state = 0;
#if OPK_F16_HW && defined(__AVX512BW__)
    /* lane i of a line takes element 32 - sh + i of (previous block part, next block part) */
    w->idx = _mm512_add_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
                                               19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                                               6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi16((short)(32 - w->sh)));
    w->carry = _mm512_setzero_si512();
#endif
}

/* the next OPK_HBLOCK (64) results, rounded to float16 */
OPK_BLOCK_FN void opk_ntw_put(opk_ntw *w, const float *s)
{
    const int sh = w->sh;
#if OPK_F16_HW && defined(__AVX512BW__)
    const int r = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i v0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(_mm512_loadu_ps(s), r)),
                                          _mm512_cvtps_ph(_mm512_loadu_ps(s + 16), r), 1);
    const __m512i v1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(_mm512_loadu_ps(s + 32), r)),
                                          _mm512_cvtps_ph(_mm512_loadu_ps(s + 48), r), 1);
    if (sh == 0) {
        _mm512_stream_si512((__m512i *)w->line, v0);
        _mm512_stream_si512((__m512i *)(w->line + 32), v1);
        w->line += 64;
    } else if (w->state == 0) {
        _Alignas(64) uint16_t b[32];  /* (a masked store here: 1.6 times slower) */
        _mm512_store_si512((__m512i *)b, v0);
        memcpy(w->first, b, (size_t)(32 - sh) * 2);
        _mm512_stream_si512((__m512i *)w->line, _mm512_permutex2var_epi16(v0, w->idx, v1));
        w->line += 32;
    } else {
        _mm512_stream_si512((__m512i *)w->line, _mm512_permutex2var_epi16(w->carry, w->idx, v0));
        _mm512_stream_si512((__m512i *)(w->line + 32), _mm512_permutex2var_epi16(v0, w->idx, v1));
        w->line += 64;
    }
    w->carry = v1;
#else
    uint16_t v[OPK_HBLOCK], buf[32];
    opk_f2h_contig(v, s, OPK_HBLOCK);
    if (w->state == 0 && sh) {
        memcpy(w->first, v, (size_t)(32 - sh) * 2);
        memcpy(buf, v + 32 - sh, 64);
        opk_stream_i(w->line, buf, 16);
        w->line += 32;
    } else {
        memcpy(buf, w->carry, (size_t)sh * 2);
        memcpy(buf + sh, v, (size_t)(32 - sh) * 2);
        opk_stream_i(w->line, sh ? buf : v, 16);
        memcpy(buf, v + 32 - sh, 64);
        opk_stream_i(w->line + 32, buf, 16);
        w->line += 64;
    }
    memcpy(w->carry, v + 64 - sh, (size_t)sh * 2);
#endif
    w->state = 1;
}

/* the run's last line: the carried elements, plainly (the elements after them are the next
 * run's, or the partial block's that follows as it is) */
OPK_BLOCK_FN void opk_ntw_end(opk_ntw *w)
{
    if (w->state == 1 && w->sh) {
#if OPK_F16_HW && defined(__AVX512BW__)
        _Alignas(64) uint16_t b[32];
        _mm512_store_si512((__m512i *)b, _mm512_permutex2var_epi16(w->carry, w->idx, w->carry));
        memcpy(w->line, b, (size_t)w->sh * 2);
#else
        memcpy(w->line, w->carry, (size_t)w->sh * 2);
#endif
    }
    w->state = 2;
}

/* Streamed lines are visible to every thread once the kernel returns: each thread fences once
 * after its share (opk_walk, opk_flat_part), not after every run (a group of NHWC rows is a
 * run of up to OPK_GROUP elements, and a fence waits for the write-combining buffers to drain). */
static inline void opk_fence(void)
{
#if OPK_F16_HW
    _mm_sfence();
#endif
}

/* ---------------------------------------------------------------- transposition */

/* dst[i * ldd + r] = src[r * lds + i] for r < nr, i < ni: a block computed in the input's order
 * written in the output's. AVX-512 transposes 16 x 16 floats (8 x 8 doubles) in registers. */
#if OPK_F16_HW && defined(__AVX512F__)
static inline void opk_t16x16(float *dst, Py_ssize_t ldd, const float *src, Py_ssize_t lds,
                              int stream)
{
    __m512 r[16], t[16], u[16];
    for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(src + k * lds);
    for (int g = 0; g < 4; g++) {
        t[4 * g + 0] = _mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]);
        t[4 * g + 1] = _mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]);
        t[4 * g + 2] = _mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]);
        t[4 * g + 3] = _mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
        /* u[4g + j], lane L: column 4L + j of rows 4g .. 4g + 3 */
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {  /* a 4 x 4 transpose of 128-bit lanes */
        __m512 p0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
        __m512 p1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
        __m512 p2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        __m512 p3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
        __m512 q0 = _mm512_shuffle_f32x4(p0, p2, 0x88), q1 = _mm512_shuffle_f32x4(p1, p3, 0x88);
        __m512 q2 = _mm512_shuffle_f32x4(p0, p2, 0xDD), q3 = _mm512_shuffle_f32x4(p1, p3, 0xDD);
        if (stream) {  /* whole aligned lines into memory the caller gave: no read for ownership */
            _mm512_stream_ps(dst + (0 + j) * ldd, q0);
            _mm512_stream_ps(dst + (4 + j) * ldd, q1);
            _mm512_stream_ps(dst + (8 + j) * ldd, q2);
            _mm512_stream_ps(dst + (12 + j) * ldd, q3);
        } else {
            _mm512_storeu_ps(dst + (0 + j) * ldd, q0);
            _mm512_storeu_ps(dst + (4 + j) * ldd, q1);
            _mm512_storeu_ps(dst + (8 + j) * ldd, q2);
            _mm512_storeu_ps(dst + (12 + j) * ldd, q3);
        }
    }
}

static inline void opk_t8x8d(double *dst, Py_ssize_t ldd, const double *src, Py_ssize_t lds)
{
    __m512d r[8], u[8];
    for (int k = 0; k < 8; k++) r[k] = _mm512_loadu_pd(src + k * lds);
    for (int g = 0; g < 4; g++) {  /* u[2g + j], lane L: column 2L + j of rows 2g, 2g + 1 */
        u[2 * g + 0] = _mm512_unpacklo_pd(r[2 * g], r[2 * g + 1]);
        u[2 * g + 1] = _mm512_unpackhi_pd(r[2 * g], r[2 * g + 1]);
    }
    for (int j = 0; j < 2; j++) {
        __m512d p0 = _mm512_shuffle_f64x2(u[j], u[2 + j], 0x88);
        __m512d p1 = _mm512_shuffle_f64x2(u[j], u[2 + j], 0xDD);
        __m512d p2 = _mm512_shuffle_f64x2(u[4 + j], u[6 + j], 0x88);
        __m512d p3 = _mm512_shuffle_f64x2(u[4 + j], u[6 + j], 0xDD);
        _mm512_storeu_pd(dst + (0 + j) * ldd, _mm512_shuffle_f64x2(p0, p2, 0x88));
        _mm512_storeu_pd(dst + (2 + j) * ldd, _mm512_shuffle_f64x2(p1, p3, 0x88));
        _mm512_storeu_pd(dst + (4 + j) * ldd, _mm512_shuffle_f64x2(p0, p2, 0xDD));
        _mm512_storeu_pd(dst + (6 + j) * ldd, _mm512_shuffle_f64x2(p1, p3, 0xDD));
    }
}
#define OPK_TRANSPOSE_HW 1
#else
#define OPK_TRANSPOSE_HW 0
#endif

static void opk_transpose_f(float *dst, Py_ssize_t ldd, const float *src, Py_ssize_t lds,
                            Py_ssize_t nr, Py_ssize_t ni, int stream)
{
    Py_ssize_t r0 = 0, i0 = 0;
#if OPK_TRANSPOSE_HW
    /* streaming needs every 16-float row start on a 64-byte line */
    stream = stream && !((uintptr_t)dst & 63) && !((ldd * 4) & 63);
    for (i0 = 0; i0 + 16 <= ni; i0 += 16)
        for (r0 = 0; r0 + 16 <= nr; r0 += 16)
            opk_t16x16(dst + i0 * ldd + r0, ldd, src + r0 * lds + i0, lds, stream);
    /* the ragged edges below */
    for (Py_ssize_t i = 0; i < i0; i++)
        for (Py_ssize_t r = nr - nr % 16; r < nr; r++) dst[i * ldd + r] = src[r * lds + i];
#endif
    for (Py_ssize_t i = i0; i < ni; i++)
        for (Py_ssize_t r = 0; r < nr; r++) dst[i * ldd + r] = src[r * lds + i];
    (void)r0;
    (void)stream;
}

static void opk_transpose_d(double *dst, Py_ssize_t ldd, const double *src, Py_ssize_t lds,
                            Py_ssize_t nr, Py_ssize_t ni)
{
    Py_ssize_t i0 = 0;
#if OPK_TRANSPOSE_HW
    for (i0 = 0; i0 + 8 <= ni; i0 += 8)
        for (Py_ssize_t r0 = 0; r0 + 8 <= nr; r0 += 8)
            opk_t8x8d(dst + i0 * ldd + r0, ldd, src + r0 * lds + i0, lds);
    for (Py_ssize_t i = 0; i < i0; i++)
        for (Py_ssize_t r = nr - nr % 8; r < nr; r++) dst[i * ldd + r] = src[r * lds + i];
#endif
    for (Py_ssize_t i = i0; i < ni; i++)
        for (Py_ssize_t r = 0; r < nr; r++) dst[i * ldd + r] = src[r * lds + i];
}

/* ---------------------------------------------------------------- integers */

#define OPK_SAT(v, lo, hi) ((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v))
#define OPK_I8C(v) ((int8_t)OPK_SAT((v), -128, 127))
#define OPK_I16C(v) ((int16_t)OPK_SAT((v), -32768, 32767))
#define OPK_I32C(v) ((int32_t)OPK_SAT((v), INT32_MIN, INT32_MAX))
#define OPK_TO_I(v) ((int32_t)(v))
#define OPK_TO_L(v) ((int64_t)(v))

/* integer storage widened to int32 (from int8, int16) or int64 (from any) */
static inline void opk_load_i(int32_t *dst, const char *src, Py_ssize_t stride, int code, Py_ssize_t n)
{
    if (stride == 0) {
        int32_t v;
        opk_load_i(&v, src, 1, code, 1);
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    switch (code) {
    case OPK_I8: OPK_GATHER(int8_t, dst, src, stride, n, OPK_TO_I); break;
    case OPK_I16: OPK_GATHER(int16_t, dst, src, stride, n, OPK_TO_I); break;
    default:
        if (stride == 4) memcpy(dst, src, (size_t)n * 4);
        else OPK_GATHER(int32_t, dst, src, stride, n, OPK_ID);
    }
}

static inline void opk_load_l(int64_t *dst, const char *src, Py_ssize_t stride, int code, Py_ssize_t n)
{
    if (stride == 0) {
        int64_t v;
        opk_load_l(&v, src, 1, code, 1);
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    switch (code) {
    case OPK_I8: OPK_GATHER(int8_t, dst, src, stride, n, OPK_TO_L); break;
    case OPK_I16: OPK_GATHER(int16_t, dst, src, stride, n, OPK_TO_L); break;
    case OPK_I32: OPK_GATHER(int32_t, dst, src, stride, n, OPK_TO_L); break;
    default:
        if (stride == 8) memcpy(dst, src, (size_t)n * 8);
        else OPK_GATHER(int64_t, dst, src, stride, n, OPK_ID);
    }
}

/* stores saturate to the storage dtype's range */
static inline void opk_store_i(char *dst, Py_ssize_t stride, int code, const int32_t *src, Py_ssize_t n)
{
    switch (code) {
    case OPK_I8: OPK_SCATTER(int8_t, dst, stride, src, n, OPK_I8C); break;
    case OPK_I16: OPK_SCATTER(int16_t, dst, stride, src, n, OPK_I16C); break;
    default:
        if (stride == 4) memcpy(dst, src, (size_t)n * 4);
        else OPK_SCATTER(int32_t, dst, stride, src, n, OPK_ID);
    }
}

static inline void opk_store_l(char *dst, Py_ssize_t stride, int code, const int64_t *src, Py_ssize_t n)
{
    switch (code) {
    case OPK_I8: OPK_SCATTER(int8_t, dst, stride, src, n, OPK_I8C); break;
    case OPK_I16: OPK_SCATTER(int16_t, dst, stride, src, n, OPK_I16C); break;
    case OPK_I32: OPK_SCATTER(int32_t, dst, stride, src, n, OPK_I32C); break;
    default:
        if (stride == 8) memcpy(dst, src, (size_t)n * 8);
        else OPK_SCATTER(int64_t, dst, stride, src, n, OPK_ID);
    }
}

/* loads and stores by compute type code (OPK_CSIZE(c): its bytes, opkit/abi.py): the walkers
 * handle every kernel instance alike */
static inline void opk_load_c(int ccode, char *dst, const char *src, Py_ssize_t stride, int code,
                              Py_ssize_t n)
{
    switch (ccode) {
    case OPK_F64: opk_load_d((double *)dst, src, stride, code, n); break;
    case OPK_I32: opk_load_i((int32_t *)dst, src, stride, code, n); break;
    case OPK_I64: opk_load_l((int64_t *)dst, src, stride, code, n); break;
    default: opk_load_f((float *)dst, src, stride, code, n);
    }
}

static inline void opk_store_c(int ccode, char *dst, Py_ssize_t stride, int code, const char *src,
                               Py_ssize_t n)
{
    switch (ccode) {
    case OPK_F64: opk_store_d(dst, stride, code, (const double *)src, n); break;
    case OPK_I32: opk_store_i(dst, stride, code, (const int32_t *)src, n); break;
    case OPK_I64: opk_store_l(dst, stride, code, (const int64_t *)src, n); break;
    default: opk_store_f(dst, stride, code, (const float *)src, n);
    }
}

/* ---------------------------------------------------------------- iteration */

/* OPK_MAXOPS (operands per kernel) and the dtype codes are defined by the generated module,
 * from opkit's own constants (opkit/codegen/render.py), before it includes this header. */
#define OPK_MAXDIM 64     /* NumPy's own limit on dims */
/* operands of a walk: a kernel's inputs and outputs, then the partial sums it accumulates */
#define OPK_MAXARR (OPK_MAXOPS + OPK_MAXACC)
/* a transposing block: OPK_BLOCK_O elements along the outputs' contiguous dim (one 64-byte line
 * of float32) by OPK_BLOCK_I along the inputs' (long sequential reads, few streams) */
#ifndef OPK_BLOCK_O
#define OPK_BLOCK_O 16
#endif
#ifndef OPK_BLOCK_I
#define OPK_BLOCK_I 512
#endif
#ifndef OPK_PREFETCH_LINES
#define OPK_PREFETCH_LINES 4
#endif

/* The fused element loop of one kernel instance over contiguous operands stored in the
 * compute type: p[0 .. nin) are read, p[nin .. nops) written. */
typedef void (*opk_tile_fn)(Py_ssize_t n, char *const *p, const void *ctx);
/* rows of `inner` elements: operands in `mask` (inputs) hold one value per row, the others run on
 * contiguously from row to row; everything is stored in the compute type */
/* A lanes sum (opk_lanes) in registers (htile_f), over whole blocks of OPK_FBLOCK (128)
 * positions, two float16 blocks each: the sixteen float32 lanes of the block, then into the
 * eight float64 lanes, the adds of opk_accum_blocks_f in the same order. */
typedef struct {
#if OPK_F16_HW && defined(__AVX512F__)
    __m512d s;
    __m512 a;
#else
    double s[8];
    float a[16];
#endif
    int half;    /* the block's first half is in a */
} opk_hlanes;

OPK_BLOCK_FN void opk_hlanes_load(opk_hlanes *h, const double *s)
{
#if OPK_F16_HW && defined(__AVX512F__)
    h->s = _mm512_loadu_pd(s);
    h->a = _mm512_setzero_ps();
#else
    memcpy(h->s, s, sizeof h->s);
#endif
    h->half = 0;
}

OPK_BLOCK_FN void opk_hlanes_store(const opk_hlanes *h, double *s)
{
#if OPK_F16_HW && defined(__AVX512F__)
    _mm512_storeu_pd(s, h->s);
#else
    memcpy(s, h->s, sizeof h->s);
#endif
}

/* the next OPK_HBLOCK results of the block */
OPK_BLOCK_FN void opk_hlanes_add(opk_hlanes *h, const float *g)
{
#if OPK_F16_HW && defined(__AVX512F__)
    __m512 a = h->half ? _mm512_add_ps(h->a, _mm512_loadu_ps(g)) : _mm512_loadu_ps(g);
    for (int q = 16; q < OPK_HBLOCK; q += 16) a = _mm512_add_ps(a, _mm512_loadu_ps(g + q));
    if (h->half) {  /* lane l, then l + 8, into float64 lane l */
        h->s = _mm512_add_pd(h->s, _mm512_cvtps_pd(_mm512_castps512_ps256(a)));
        h->s = _mm512_add_pd(h->s, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
    }
    h->a = a;
#else
    for (int q = 0; q < OPK_HBLOCK; q++)
        h->a[q & 15] = h->half || q >= 16 ? h->a[q & 15] + g[q] : g[q];
    if (h->half)
        for (int l = 0; l < 8; l++) h->s[l] = (h->s[l] + (double)h->a[l]) + (double)h->a[l + 8];
#endif
    h->half ^= 1;
}

/* Sums a float16 loop adds up in registers (htile_f). Column sums, where a run's rows are its
 * blocks (OPK_HBLOCK channels over NHWC, say): output i's block of float32 column sums f[i]
 * (an opk_cols block, NULL: not summed so), added row by row and into its float64 partials
 * acc[i] every OPK_FROWS rows, as opk_cols_accum does; `rows` of the block are in. Or a
 * lanes sum (a per-channel sum over NCHW's rows): ls[i]. */
typedef struct {
    float *f[OPK_MAXOPS];
    double *acc[OPK_MAXOPS];
    Py_ssize_t rows;
    double *ls[OPK_MAXOPS];  /* or output i's lanes sum's float64 lanes (opk_lanes.s), for a
                              * tile of whole OPK_FBLOCK blocks: opk_hlanes */
} opk_hsums;

/* A block of OPK_HBLOCK column sums in registers (htile_f): the same float32 adds, row after
 * row, and the same flush into float64, as opk_cols_accum and opk_cols_flush. */
typedef struct {
#if OPK_F16_HW && defined(__AVX512F__)
    __m512 v[4];
#else
    float v[OPK_HBLOCK];
#endif
} opk_hacc;

OPK_BLOCK_FN void opk_hacc_load(opk_hacc *a, const float *f)
{
#if OPK_F16_HW && defined(__AVX512F__)
    for (int q = 0; q < 4; q++) a->v[q] = _mm512_loadu_ps(f + 16 * q);
#else
    memcpy(a->v, f, sizeof a->v);
#endif
}

OPK_BLOCK_FN void opk_hacc_store(const opk_hacc *a, float *f)
{
#if OPK_F16_HW && defined(__AVX512F__)
    for (int q = 0; q < 4; q++) _mm512_storeu_ps(f + 16 * q, a->v[q]);
#else
    memcpy(f, a->v, sizeof a->v);
#endif
}

/* a row: a += g */
OPK_BLOCK_FN void opk_hacc_add(opk_hacc *a, const float *g)
{
#if OPK_F16_HW && defined(__AVX512F__)
    for (int q = 0; q < 4; q++) a->v[q] = _mm512_add_ps(a->v[q], _mm512_loadu_ps(g + 16 * q));
#else
    for (int j = 0; j < OPK_HBLOCK; j++) a->v[j] += g[j];
#endif
}

/* acc += a in float64, and a cleared */
OPK_BLOCK_FN void opk_hacc_flush(opk_hacc *a, double *acc)
{
#if OPK_F16_HW && defined(__AVX512F__)
    for (int q = 0; q < 4; q++) {
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(a->v[q]));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a->v[q]), 1)));
        _mm512_storeu_pd(acc + 16 * q, _mm512_add_pd(_mm512_loadu_pd(acc + 16 * q), lo));
        _mm512_storeu_pd(acc + 16 * q + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 16 * q + 8), hi));
        a->v[q] = _mm512_setzero_ps();
    }
#else
    for (int j = 0; j < OPK_HBLOCK; j++) {
        acc[j] += (double)a->v[j];
        a->v[j] = 0.0f;
    }
#endif
}

/* the element loop on float16 operands: whole blocks stream their float16 results through
 * w[i] (output i's writer, over the run's tiles) unless w is NULL; the inputs in `fmask`
 * (bit i) are floats already, read as they are; htile_f adds the column sums in `hs` (or
 * NULL) from its registers */
typedef void (*opk_htile_fn)(Py_ssize_t n, char *const *p, const void *ctx, opk_ntw *w, int fmask,
                             opk_hsums *hs);
/* 0 (and nothing done) where it has no variant for the per-row input set `mask` */
typedef int (*opk_rows_fn)(Py_ssize_t nrows, Py_ssize_t inner, char *const *ptr,
                           const Py_ssize_t *rstep, int mask, const void *ctx);

/* One call of a kernel instance: what the generated module knows about it, and the call's
 * context (its attrs, rounded to the compute type). */
typedef struct {
    opk_tile_fn tile;
    opk_rows_fn rows;          /* NULL: no row variants */
    const void *ctx;
    int nin, nops;             /* inputs; inputs + outputs */
    int ccode;                 /* the compute type's code */
    Py_ssize_t tile_len;       /* elements per tile where operands are converted or gathered */
    int stream;                /* the outputs are memory the caller gave (and the call is large):
                                * stream long runs */
    int nacc;                  /* sums folded into the pass: operands nops .. nops + nacc */
    int acc_src[OPK_MAXACC];   /* the output (operand index) each sum adds up */
    double *acc_out[OPK_MAXACC];   /* per sum: where its elements are added up (float64), */
    Py_ssize_t acc_len[OPK_MAXACC];  /* how many there are, */
    int acc_lanes[OPK_MAXACC];       /* and whether each is kept as lanes (opk_lanes) */
    int acc_fblock;                  /* float32 lanes add blocks first (float16 data) */
    int acc_rows[OPK_MAXACC];        /* set per call (opk_run_chunks): a lanes sum kept as row
                                      * sums (opk_accum_rows), 8 bytes an element */
    opk_htile_fn htile;        /* NULL, or the element loop on float16 operands (stored as they
                                * are; converted in registers): contiguous float16, inputs of
                                * step 0, and float inputs (a float16 call's float temps) */
    opk_htile_fn htile_f;      /* the same for the sums folded in: output i as floats into
                                * p[nin + i] where a sum reads it, rounded into its float16
                                * destination p[nops + i] where stored (NULL: not) */
    uint64_t discard;          /* bit o: output operand o is not stored (only a folded sum reads it) */
} opk_kernel;

/* geometry, built by opkit/runtime/geometry.py as an intp array (its fields: opkit/abi.py's
 * GEOMETRY_HEAD, indexed as OPK_G_NDIM ...):
 *   [ndim, nops, nout, tdim, ccode, shape[ndim], strides[nops][ndim] (bytes), codes[nops]]
 * the last dim is the one the outputs are contiguous along; ndim >= 1. With tdim >= 0 the
 * walk goes in blocks of OPK_BLOCK_O x OPK_BLOCK_I over the last dim and dim tdim (along which
 * the inputs are contiguous): rows along tdim are computed into a block buffer in the compute
 * type (ccode) and the buffer is transposed into the outputs, with streaming stores when the
 * outputs are memory the caller gave. Work units are elements, or blocks. */

static inline Py_ssize_t opk_cdiv(Py_ssize_t a, Py_ssize_t b) { return (a + b - 1) / b; }

/* A sum the walk adds whole runs into is kept as lanes: eight float64 lanes, element p going
 * to lane p % 8, each adding its elements in the walk's order. On float16 (and bfloat16) data,
 * whose own rounding is 2^13 times coarser, a float32 kernel first adds the elements of each
 * block of OPK_FBLOCK positions (aligned to the walk's start) into sixteen float32 lanes
 * (element p to lane p % 16, eight terms each), then float lane l and l + 8 into float64 lane
 * l: a quarter of the float64 work, and the same numbers however the walk is cut (the block
 * being added is kept with its number; blocks never straddle a chunk). */
#define OPK_FBLOCK 128
typedef struct {
    double s[8];     /* the float64 lanes */
    float f[16];     /* the float32 lanes of block `block` */
    int64_t block;
    int64_t unused[7];
} opk_lanes;
_Static_assert(sizeof(opk_lanes) == OPK_LANE_BYTES, "opk_lanes: OPK_LANE_BYTES (opkit/lower/reduce.py)");

/* Column sums on float16 (and bfloat16) data: where every row of a run adds into the same
 * sums (a per-channel sum over NHWC's pixels, say), each column adds its terms in float32 over
 * blocks of OPK_FROWS rows, counted from the run's first row, then the block into its float64
 * sum: a conversion and a float64 add per block of a column instead of per element, as the
 * lanes add blocks (opk_lanes). The block being added is kept here from tile to tile, so the
 * sums do not depend on where the run is cut into tiles (the streaming head, the tile length
 * of the build); runs are the same for any number of threads. */
#define OPK_FROWS 8
#define OPK_FCOLS 512   /* the longest rows kept so (a group of rows has four or more) */
typedef struct {
    float f[OPK_FCOLS];   /* the block's float32 sums, column by column */
    Py_ssize_t rows;      /* whole rows in it */
} opk_cols;

/* What a float16 loop (htile, htile_f: templates/module.pyx.j2) does per operand and block of
 * OPK_HBLOCK elements at element i of its run, inlined whole into the loop: the writers and the
 * sums it keeps in registers over the loop are taken by address, and stay in registers. */

/* the loop's copy of output o's writer, w[o] (w NULL: the run does not stream, and the copy is
 * not used) */
OPK_BLOCK_FN opk_ntw opk_ntw_at(const opk_ntw *w, int o)
{
    opk_ntw none;
    if (w != NULL) return w[o];
    memset(&none, 0, sizeof none);
    return none;
}

/* ... back into w[o] after the loop */
OPK_BLOCK_FN void opk_ntw_back(opk_ntw *w, int o, const opk_ntw *wl)
{
    if (w != NULL) w[o] = *wl;
}

/* an input block as floats: the float16 values converted into e, unless they are floats
 * already (is_float: a float16 call's float temp). The loops convert their inputs in order,
 * each a statement of its own: as arguments of the element loop's call, gcc converted them last
 * to first, and float16 LeakyReLU's backward at 64K elements took 1.05 times as long. */
OPK_BLOCK_FN void opk_hconv(float *e, const char *p, Py_ssize_t i, int is_float)
{
    if (!is_float) opk_h2f_full(e, (const uint16_t *)p + i);
}

/* ... and where the element loop reads it: e, or the floats themselves */
OPK_BLOCK_FN const float *opk_hin(const float *e, const char *p, Py_ssize_t i, int is_float)
{
    return is_float ? (const float *)p + i : e;
}

/* the run's last, partial block of an input: its w elements into t, then zeros */
OPK_BLOCK_FN void opk_hin_last(float *t, const char *p, Py_ssize_t i, Py_ssize_t w, int is_float)
{
    if (is_float) opk_f2f_block(t, (const float *)p + i, w);
    else opk_h2f_block(t, (const uint16_t *)p + i, w);
}

/* a block of results g rounded into float16 d: stored, or streamed through the writer wl (the
 * loop's copy of w[o]) when the run streams (w != NULL) */
OPK_BLOCK_FN void opk_hout(char *d, Py_ssize_t i, const float *g, const opk_ntw *w, opk_ntw *wl)
{
    if (w == NULL) opk_f2h_full((uint16_t *)d + i, g);
    else opk_ntw_put(wl, g);
}

/* htile_f: a block of results g copied into the float tile f a sum reads and rounded into d
 * (each where not NULL), and added into its sums in registers (hk: opk_hsum_load) */
OPK_BLOCK_FN void opk_hout_f(char *f, char *d, Py_ssize_t i, const float *g, const opk_ntw *w,
                             opk_ntw *wl, int hk, opk_hacc *sa, opk_hlanes *sl)
{
    if (f != NULL) memcpy((float *)f + i, g, OPK_HBLOCK * sizeof(float));
    if (d != NULL) opk_hout(d, i, g, w, wl);
    if (hk == 1) opk_hacc_add(sa, g);
    else if (hk == 2) opk_hlanes_add(sl, g);
}

/* the run's last, partial block of results (m of u): the writer's last line first (the block is
 * stored as it is after it), then copied into f and rounded into d, each where not NULL */
OPK_BLOCK_FN void opk_hout_last(char *f, char *d, Py_ssize_t i, Py_ssize_t m, const float *u,
                                const opk_ntw *w, opk_ntw *wl)
{
    if (w != NULL) opk_ntw_end(wl);
    if (f != NULL) memcpy((float *)f + i, u, (size_t)m * sizeof(float));
    if (d != NULL) opk_f2h_contig((uint16_t *)d + i, u, m);
}

/* htile_f: how output o's blocks are added up in registers, from hs (NULL: not at all): 1 into
 * its column sums (sa, loaded), 2 into its lanes sum (sl, loaded), 0 not */
OPK_BLOCK_FN int opk_hsum_load(const opk_hsums *hs, int o, opk_hacc *sa, opk_hlanes *sl)
{
    if (hs == NULL) return 0;
    if (hs->f[o] != NULL) {
        opk_hacc_load(sa, hs->f[o]);
        return 1;
    }
    if (hs->ls[o] == NULL) return 0;
    opk_hlanes_load(sl, hs->ls[o]);
    return 2;
}

/* ... and stored back into hs after the loop, with the rows of the column sums' block */
OPK_BLOCK_FN void opk_hsum_store(opk_hsums *hs, int o, int hk, const opk_hacc *sa, const opk_hlanes *sl,
                                 Py_ssize_t rows)
{
    if (hs != NULL) hs->rows = rows;
    if (hk == 1) opk_hacc_store(sa, hs->f[o]);
    else if (hk == 2) opk_hlanes_store(sl, hs->ls[o]);
}

/* a row (block) more into the column sums: 1, and the count restarted, at OPK_FROWS rows, when
 * each output's column sums are flushed (opk_hflush) */
OPK_BLOCK_FN int opk_hrow(Py_ssize_t *rows)
{
    if (++*rows < OPK_FROWS) return 0;
    *rows = 0;
    return 1;
}

OPK_BLOCK_FN void opk_hflush(int hk, opk_hacc *sa, double *acc)
{
    if (hk == 1) opk_hacc_flush(sa, acc);
}

/* The runtime: the walk over a geometry and everything it calls. It takes the kernel's tile
 * functions through opk_kernel and no module's code, so it is compiled once per toolchain, with
 * OPK_RUNTIME defined (opkit/builder/runtime.py), into an object every module links; a module
 * sees only the entry points it calls. */
#if defined(__GNUC__)
#define OPK_RT_FN __attribute__((visibility("hidden")))
#else
#define OPK_RT_FN
#endif
OPK_RT_FN int opk_walk(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t *g, char **base,
                       const opk_kernel *k);
OPK_RT_FN int opk_run(const Py_ssize_t *g, char **base, const opk_kernel *kernel, int available,
                      Py_ssize_t threshold, int max_threads);
OPK_RT_FN int opk_run_flat(Py_ssize_t n, char **ptr, const Py_ssize_t *step, const int *code,
                           const opk_kernel *kernel, int available, Py_ssize_t threshold,
                           int max_threads);

#ifdef OPK_RUNTIME

static inline Py_ssize_t opk_units(const Py_ssize_t *g)
{
    const Py_ssize_t nd = g[OPK_G_NDIM], td = g[OPK_G_TDIM];
    const Py_ssize_t *shape = g + OPK_G_SHAPE;
    Py_ssize_t total = 1;
    for (Py_ssize_t d = 0; d < nd; d++) {
        if (td >= 0 && d == td) total *= opk_cdiv(shape[d], OPK_BLOCK_I);
        else if (td >= 0 && d == nd - 1) total *= opk_cdiv(shape[d], OPK_BLOCK_O);
        else total *= shape[d];
    }
    return total;
}

static inline void opk_stream_c(int ccode, char *dst, const char *src, Py_ssize_t n)
{
    if (OPK_CSIZE(ccode) == 8) opk_stream_d((double *)dst, (const double *)src, n);
    else opk_stream_f((float *)dst, (const float *)src, n);
}

/* the float32 lanes added into the float64 lanes (lane l, then l + 8), and cleared */
static inline void opk_lanes_flush(opk_lanes *L)
{
    for (int l = 0; l < 8; l++) {
        L->s[l] += (double)L->f[l];
        L->s[l] += (double)L->f[l + 8];
    }
    memset(L->f, 0, sizeof L->f);
}

/* eight float64 lanes added pairwise, as opk_lanes_value */
static inline double opk_pairwise8(const double *s)
{
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* a lanes sum's value: its float64 lanes after the last flush, added pairwise,
 * ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) */
static inline double opk_lanes_value(const opk_lanes *L)
{
    double s[8];
    for (int l = 0; l < 8; l++) s[l] = (L->s[l] + (double)L->f[l]) + (double)L->f[l + 8];
    return opk_pairwise8(s);
}

/* Whole blocks of float32 results into lanes: each block's sixteen float lanes in two vector
 * registers (the same adds as the plain loop in opk_accum_lanes_f), then into the float64 lanes. */
static inline void opk_accum_blocks_f(opk_lanes *L, const float *v, Py_ssize_t nblocks)
{
#if OPK_F16_HW
    __m256d lo = _mm256_loadu_pd(L->s), hi = _mm256_loadu_pd(L->s + 4);
    for (Py_ssize_t b = 0; b < nblocks; b++, v += OPK_FBLOCK) {
        __m256 a = _mm256_loadu_ps(v), c = _mm256_loadu_ps(v + 8);
        for (int k = 16; k < OPK_FBLOCK; k += 16) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(v + k));
            c = _mm256_add_ps(c, _mm256_loadu_ps(v + k + 8));
        }
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(c)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)));
    }
    _mm256_storeu_pd(L->s, lo);
    _mm256_storeu_pd(L->s + 4, hi);
#else
    for (Py_ssize_t b = 0; b < nblocks; b++, v += OPK_FBLOCK) {
        for (int k = 0; k < OPK_FBLOCK; k++) L->f[k & 15] = k < 16 ? v[k] : L->f[k & 15] + v[k];
        opk_lanes_flush(L);
    }
#endif
}

/* Elements pos .. pos + n of the walk (float32) into a lanes sum. */
static inline void opk_accum_lanes_f(opk_lanes *L, const float *v, Py_ssize_t n, Py_ssize_t pos)
{
    Py_ssize_t j = 0;
    while (j < n) {
        const Py_ssize_t p = pos + j, b = p / OPK_FBLOCK;
        if (b != L->block) {  /* a block the walk left unfinished here (it went elsewhere) */
            opk_lanes_flush(L);
            L->block = b;
        }
        if (p % OPK_FBLOCK == 0 && n - j >= OPK_FBLOCK) {  /* whole blocks */
            const Py_ssize_t nb = (n - j) / OPK_FBLOCK;
            opk_accum_blocks_f(L, v + j, nb);
            j += nb * OPK_FBLOCK;
            L->block = (pos + j) / OPK_FBLOCK;
            continue;
        }
        const Py_ssize_t end = (b + 1) * OPK_FBLOCK - pos, stop = end < n ? end : n;
        for (; j < stop && ((pos + j) & 15); j++) L->f[(pos + j) & 15] += v[j];
#if OPK_F16_HW
        if (j + 16 <= stop) {  /* lanes 0-7 and 8-15 side by side: the same adds */
            __m256 a = _mm256_loadu_ps(L->f), c = _mm256_loadu_ps(L->f + 8);
            for (; j + 16 <= stop; j += 16) {
                a = _mm256_add_ps(a, _mm256_loadu_ps(v + j));
                c = _mm256_add_ps(c, _mm256_loadu_ps(v + j + 8));
            }
            _mm256_storeu_ps(L->f, a);
            _mm256_storeu_ps(L->f + 8, c);
        }
#endif
        for (; j < stop; j++) L->f[(pos + j) & 15] += v[j];
        if (j == end) {  /* the block is complete */
            opk_lanes_flush(L);
            L->block = b + 1;
        }
    }
}

/* Elements pos .. pos + n of the walk (float32) straight into a lanes sum's float64 lanes. */
static inline void opk_accum_lanes_d(opk_lanes *L, const float *v, Py_ssize_t n, Py_ssize_t pos)
{
    Py_ssize_t j = 0;
    for (; j < n && ((pos + j) & 7); j++) L->s[(pos + j) & 7] += (double)v[j];
#if OPK_F16_HW
    /* the lanes in two registers (gcc leaves the loop below scalar): the same adds */
    __m256d lo = _mm256_loadu_pd(L->s), hi = _mm256_loadu_pd(L->s + 4);
    for (; j + 8 <= n; j += 8) {
        const __m256 f = _mm256_loadu_ps(v + j);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    }
    _mm256_storeu_pd(L->s, lo);
    _mm256_storeu_pd(L->s + 4, hi);
#endif
    for (; j < n; j++) L->s[(pos + j) & 7] += (double)v[j];
}

/* Sums folded into a kernel's pass: a tile's results (compute type, contiguous), elements
 * pos .. pos + n of the walk, added into float64 partial sums `step` bytes apart. With step 0
 * the run adds into one sum, kept as lanes (opk_lanes), so each sum adds its elements in the
 * same order however the walk is cut into runs (by threads, rows or strides). */
static inline void opk_accum(int ccode, int fblock, char *acc, Py_ssize_t step, const char *src,
                             Py_ssize_t n, Py_ssize_t pos)
{
    if (step == 0) {
        opk_lanes *L = (opk_lanes *)acc;
        if (ccode == OPK_F64) {
            const double *v = (const double *)src;
            for (Py_ssize_t j = 0; j < n; j++) L->s[(pos + j) & 7] += v[j];
        } else if (fblock) {
            opk_accum_lanes_f(L, (const float *)src, n, pos);
        } else {
            opk_accum_lanes_d(L, (const float *)src, n, pos);
        }
        return;
    }
    if (ccode == OPK_F64) {
        const double *v = (const double *)src;
        if (step == 8) { double *a = (double *)acc; for (Py_ssize_t j = 0; j < n; j++) a[j] += v[j]; }
        else for (Py_ssize_t j = 0; j < n; j++) *(double *)(acc + j * step) += v[j];
    } else {
        const float *v = (const float *)src;
        if (step == 8) { double *a = (double *)acc; for (Py_ssize_t j = 0; j < n; j++) a[j] += (double)v[j]; }
        else for (Py_ssize_t j = 0; j < n; j++) *(double *)(acc + j * step) += (double)v[j];
    }
}

/* acc[c] += v[q * inner + c] for rows q = 0 .. rows, each sum adding its terms in row order:
 * the sums of a group of rows stay in registers across the rows. */
static inline void opk_accum_cols_f(double *acc, const float *v, Py_ssize_t inner, Py_ssize_t rows)
{
    Py_ssize_t c = 0;
#if OPK_F16_HW
    for (; c + 16 <= inner; c += 16) {
        __m256d a0 = _mm256_loadu_pd(acc + c), a1 = _mm256_loadu_pd(acc + c + 4);
        __m256d a2 = _mm256_loadu_pd(acc + c + 8), a3 = _mm256_loadu_pd(acc + c + 12);
        for (Py_ssize_t q = 0; q < rows; q++) {
            const __m256 f = _mm256_loadu_ps(v + q * inner + c), g = _mm256_loadu_ps(v + q * inner + c + 8);
            a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
            a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
            a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(g)));
            a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1)));
        }
        _mm256_storeu_pd(acc + c, a0);
        _mm256_storeu_pd(acc + c + 4, a1);
        _mm256_storeu_pd(acc + c + 8, a2);
        _mm256_storeu_pd(acc + c + 12, a3);
    }
#endif
    for (Py_ssize_t q = 0; q < rows; q++)
        for (Py_ssize_t j = c; j < inner; j++) acc[j] += (double)v[q * inner + j];
}

/* the sums of a run kept as column blocks (bit a), each zeroed */
static inline int opk_cols_start(const opk_kernel *k, opk_cols *cols, int ccode,
                                 const Py_ssize_t *step, const Py_ssize_t *acc_rs, Py_ssize_t inner)
{
    int mask = 0;
    if (!k->acc_fblock || ccode != OPK_F32 || inner > OPK_FCOLS) return 0;
    for (int a = 0; a < k->nacc; a++) {
        if (acc_rs[a] != 0 || step[k->nops + a] != 8) continue;
        memset(cols[a].f, 0, (size_t)inner * sizeof(float));
        cols[a].rows = 0;
        mask |= 1 << a;
    }
    return mask;
}

/* the block into the float64 sums, and cleared */
static inline void opk_cols_flush(opk_cols *cb, double *acc, Py_ssize_t inner)
{
    Py_ssize_t c = 0;
#if OPK_F16_HW
    /* read as opk_cols_add stores it, eight floats a time: a wider load across two of its
     * stores cannot be forwarded and waits for every store before it to reach the cache (the
     * streamed ones too) */
    for (; c + 8 <= inner; c += 8) {
        const __m256 f = _mm256_loadu_ps(cb->f + c);
        _mm256_storeu_pd(acc + c, _mm256_add_pd(_mm256_loadu_pd(acc + c),
                                                _mm256_cvtps_pd(_mm256_castps256_ps128(f))));
        _mm256_storeu_pd(acc + c + 4, _mm256_add_pd(_mm256_loadu_pd(acc + c + 4),
                                                    _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
        _mm256_storeu_ps(cb->f + c, _mm256_setzero_ps());
    }
#endif
    for (; c < inner; c++) {
        acc[c] += (double)cb->f[c];
        cb->f[c] = 0.0f;
    }
    cb->rows = 0;
}

/* f[c] += v[q * inner + c] for whole rows q = 0 .. rows, row by row */
static inline void opk_cols_add(float *f, const float *v, Py_ssize_t inner, Py_ssize_t rows)
{
    Py_ssize_t c = 0;
#if OPK_F16_HW
    for (; c + 16 <= inner; c += 16) {  /* sixteen columns in registers across the rows */
        __m256 a = _mm256_loadu_ps(f + c), b = _mm256_loadu_ps(f + c + 8);
        for (Py_ssize_t q = 0; q < rows; q++) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(v + q * inner + c));
            b = _mm256_add_ps(b, _mm256_loadu_ps(v + q * inner + c + 8));
        }
        _mm256_storeu_ps(f + c, a);
        _mm256_storeu_ps(f + c + 8, b);
    }
#endif
    for (Py_ssize_t q = 0; q < rows; q++)
        for (Py_ssize_t j = c; j < inner; j++) f[j] += v[q * inner + j];
}

/* A tile's n results, starting `col` elements into a row, into the column blocks */
static inline void opk_cols_accum(opk_cols *cb, double *acc, const float *v, Py_ssize_t inner,
                                  Py_ssize_t col, Py_ssize_t n)
{
    while (n > 0) {
        Py_ssize_t rows = 1;
        if (col == 0 && n >= inner) {
            rows = n / inner < OPK_FROWS - cb->rows ? n / inner : OPK_FROWS - cb->rows;
            opk_cols_add(cb->f, v, inner, rows);
            v += rows * inner;
            n -= rows * inner;
        } else {
            const Py_ssize_t m = inner - col < n ? inner - col : n;
            for (Py_ssize_t j = 0; j < m; j++) cb->f[col + j] += v[j];
            v += m;
            n -= m;
            col += m;
            if (col < inner) return;  /* the row goes on in the next tile */
            col = 0;
        }
        cb->rows += rows;
        if (cb->rows == OPK_FROWS) opk_cols_flush(cb, acc, inner);
    }
}

/* Row sums: where the rows next to each other in the walk add into different elements of a sum
 * (a per-pixel sum over NHWC's channels), lanes per element (OPK_LANE_BYTES) would outweigh
 * short rows many times over. The row being added is kept as lanes here instead, its elements
 * numbered from the row's start, from tile to tile; a complete row adds its lanes' value into
 * its element (one double). The walk hands rows whole to a run, cut only where a chunk ends,
 * so the sums do not depend on the tiles or on the number of threads. */
static inline void opk_rows_clear(opk_lanes *rl) { memset(rl, 0, offsetof(opk_lanes, unused)); }

/* a run's row sums (those of k's sums kept so), cleared */
static inline void opk_rows_start(const opk_kernel *k, opk_lanes *rl)
{
    for (int a = 0; a < k->nacc; a++)
        if (k->acc_rows[a]) opk_rows_clear(&rl[a]);
}

#if OPK_F16_HW
/* Whole rows into row sums with each row's lanes in registers: the same adds, in the same
 * order, as opk_accum for a row that starts a run of the lanes (which stores and reloads them). */
static inline void opk_rows_whole(int ccode, int fblock, char *acc, Py_ssize_t rs, Py_ssize_t inner,
                                  const char *src, Py_ssize_t rows)
{
    _Alignas(32) double s[8];
    _Alignas(32) float f[16];
    for (Py_ssize_t q = 0; q < rows; q++, acc += rs) {
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        Py_ssize_t j = 0;
        if (ccode == OPK_F64) {
            const double *v = (const double *)src + q * inner;
            for (; j + 8 <= inner; j += 8) {
                lo = _mm256_add_pd(lo, _mm256_loadu_pd(v + j));
                hi = _mm256_add_pd(hi, _mm256_loadu_pd(v + j + 4));
            }
            _mm256_store_pd(s, lo);
            _mm256_store_pd(s + 4, hi);
            for (; j < inner; j++) s[j & 7] += v[j];
        } else if (fblock) {  /* float32 lanes over blocks of OPK_FBLOCK, then into lo and hi */
            const float *v = (const float *)src + q * inner;
            __m256 a = _mm256_setzero_ps(), c = _mm256_setzero_ps();
            for (; j + 16 <= inner; j += 16) {
                a = _mm256_add_ps(a, _mm256_loadu_ps(v + j));
                c = _mm256_add_ps(c, _mm256_loadu_ps(v + j + 8));
                if ((j + 16) % OPK_FBLOCK) continue;
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(c)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)));
                a = c = _mm256_setzero_ps();
            }
            _mm256_store_ps(f, a);
            _mm256_store_ps(f + 8, c);
            for (; j < inner; j++) f[j & 15] += v[j];
            _mm256_store_pd(s, lo);
            _mm256_store_pd(s + 4, hi);
            for (int l = 0; l < 8; l++) s[l] = (s[l] + (double)f[l]) + (double)f[l + 8];
        } else {
            const float *v = (const float *)src + q * inner;
            for (; j + 8 <= inner; j += 8) {
                const __m256 x = _mm256_loadu_ps(v + j);
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
            }
            _mm256_store_pd(s, lo);
            _mm256_store_pd(s + 4, hi);
            for (; j < inner; j++) s[j & 7] += (double)v[j];
        }
        *(double *)acc += opk_pairwise8(s);
    }
}
#endif

/* A tile's n results, `col` elements into a row of `inner`, into row sums (rows rs bytes apart). */
static inline void opk_rows_accum(int ccode, int fblock, opk_lanes *rl, char *acc, Py_ssize_t rs,
                                  Py_ssize_t inner, Py_ssize_t col, const char *src, Py_ssize_t n)
{
    const Py_ssize_t cs = OPK_CSIZE(ccode);
    while (n > 0) {
#if OPK_F16_HW
        if (col == 0 && n >= inner) {  /* (rl is clear at the start of a row) */
            const Py_ssize_t rows = n / inner;
            opk_rows_whole(ccode, fblock, acc, rs, inner, src, rows);
            src += rows * inner * cs;
            n -= rows * inner;
            acc += rows * rs;
            continue;
        }
#endif
        const Py_ssize_t m = inner - col < n ? inner - col : n;
        opk_accum(ccode, fblock, (char *)rl, 0, src, m, col);
        src += m * cs;
        n -= m;
        if (col + m < inner) return;  /* the row goes on in the next tile */
        *(double *)acc += opk_lanes_value(rl);
        opk_rows_clear(rl);
        acc += rs;
        col = 0;
    }
}

/* Add a tile of results into a folded sum's partials: the run's elements go to rows of `inner`
 * (the first one `col` elements in), element c of row q to acc + q * rs + c * step; through
 * the run's column blocks `cb` or row sums `rl` where kept so (else NULL). */
static inline void opk_accum_rows(int ccode, int fblock, char *acc, Py_ssize_t rs, Py_ssize_t step,
                                  Py_ssize_t inner, Py_ssize_t col, const char *src, Py_ssize_t n,
                                  Py_ssize_t pos, opk_cols *cb, opk_lanes *rl)
{
    const Py_ssize_t cs = OPK_CSIZE(ccode);
    if (cb != NULL) {  /* column blocks (opk_cols_start) */
        opk_cols_accum(cb, (double *)acc, (const float *)src, inner, col, n);
        return;
    }
    if (rl != NULL) {
        opk_rows_accum(ccode, fblock, rl, acc, rs, inner, col, src, n);
        return;
    }
    while (n > 0) {
        if (rs == 0 && step == 8 && col == 0 && ccode == OPK_F32 && n >= 2 * inner) {
            const Py_ssize_t rows = n / inner;  /* whole rows adding into the same sums */
            opk_accum_cols_f((double *)acc, (const float *)src, inner, rows);
            src += rows * inner * cs;
            n -= rows * inner;
            pos += rows * inner;
            continue;
        }
        const Py_ssize_t m = inner - col < n ? inner - col : n;
        opk_accum(ccode, fblock, acc + col * step, step, src, m, pos);
        src += m * cs;
        n -= m;
        pos += m;
        acc += rs;
        col = 0;
    }
}

/* A run for the float16 element loops: every stored output float16 and contiguous, every
 * input float16 or float, contiguous or broadcast along the run (step 0). The inputs the
 * loop reads as floats (bit o): the float ones (a float16 call's temps are in the compute
 * type, and a float one broadcast is filled as floats once); -1: not such a run. A float16
 * input broadcast along the run is filled as float16 (opk_segment_half), so that a run of
 * float16 operands goes through the loop that converts them in registers (fmask 0): the
 * loop that also reads floats keeps its converted blocks in memory. */
static inline int opk_half_inputs(const opk_kernel *k, const Py_ssize_t *step, const int *code)
{
    int fmask = 0;
    for (int o = 0; o < k->nops; o++) {
        if (o >= k->nin) {
            if (!(k->discard >> o & 1) && (code[o] != OPK_F16 || step[o] != 2)) return -1;
        } else if (code[o] == OPK_F32 && (step[o] == 0 || step[o] == 4)) {
            fmask |= 1 << o;
        } else if (code[o] != OPK_F16 || (step[o] != 2 && step[o] != 0)) {
            return -1;
        }
    }
    return fmask;
}

/* Float16 runs shorter than this are not streamed: a run's first and last lines take plain
 * stores (opk_ntw), which a run of a few lines would be mostly made of. */
#ifndef OPK_HALF_STREAM_RUN
#define OPK_HALF_STREAM_RUN 1024
#endif

/* The float16 loops take OPK_HALF_TILES tiles' worth of elements at a time: they work in
 * blocks of OPK_HBLOCK within it anyway, and a tile's fixed cost (the call, the sums' rows,
 * the pointers) was a third of a float16 backward's time with folded sums at 256 elements. */
#define OPK_HALF_TILES 4

/* Writers (opk_ntw) for a float16 run's stored outputs, or NULL: the call is small, the run
 * short, an output on an odd address, or the tiles not whole blocks. */
static inline opk_ntw *opk_ntw_run(const opk_kernel *k, char *const *out, Py_ssize_t n,
                                   Py_ssize_t len, opk_ntw *w)
{
    if (!k->stream || n < OPK_HALF_STREAM_RUN || len % OPK_HBLOCK) return NULL;
    for (int o = k->nin; o < k->nops; o++)
        if (!(k->discard >> o & 1) && ((uintptr_t)out[o] & 1)) return NULL;
    for (int o = k->nin; o < k->nops; o++) {
        w[o - k->nin].state = 2;
        if (!(k->discard >> o & 1)) opk_ntw_start(&w[o - k->nin], (uint16_t *)out[o]);
    }
    return w;
}

/* The column sums htile_f adds up in registers (opk_hsums), or NULL: every sum is kept as
 * column blocks (opk_cols_start) of rows that are whole blocks, in runs and tiles of whole
 * rows, and no output is summed twice. */
static inline opk_hsums *opk_hsums_start(const opk_kernel *k, opk_cols *cols, int cmask,
                                         char *const *ptr, Py_ssize_t n, Py_ssize_t len,
                                         Py_ssize_t inner, opk_hsums *hs)
{
    if (inner != OPK_HBLOCK || n % inner || len % inner || cmask != (1 << k->nacc) - 1)
        return NULL;
    for (int o = 0; o < k->nops - k->nin; o++) hs->f[o] = NULL, hs->ls[o] = NULL;
    for (int a = 0; a < k->nacc; a++) {
        const int o = k->acc_src[a] - k->nin;
        if (hs->f[o] != NULL) return NULL;
        hs->f[o] = cols[a].f;
        hs->acc[o] = (double *)ptr[k->nops + a];
    }
    hs->rows = 0;
    return hs;
}

/* Whether a float16 run's sums are all lanes sums htile_f can add up in registers, a tile of
 * whole blocks at a time (opk_hlanes_tile): float32 lanes over blocks (float16 data), each
 * sum's element the same along a row (row sums: opk_rows_accum) or along the run, no output
 * summed twice. */
static inline int opk_hlanes_ok(const opk_kernel *k, const Py_ssize_t *step, const Py_ssize_t *acc_rs,
                                Py_ssize_t n, Py_ssize_t inner)
{
    int seen = 0;
    if (!k->acc_fblock || k->nacc == 0) return 0;
    for (int a = 0; a < k->nacc; a++) {
        if (step[k->nops + a] != 0 || (!k->acc_rows[a] && acc_rs[a] != 0 && n > inner)) return 0;
        if (seen >> k->acc_src[a] & 1) return 0;
        seen |= 1 << k->acc_src[a];
    }
    return 1;
}

/* The lanes sums for a tile of m elements, i into the run (walk position pos + i), or NULL
 * where a sum's blocks do not start with the tile (a row sum's count from its row's start):
 * each one's float32 lanes are flushed where they hold another block, as opk_accum_lanes_f
 * does first. */
static inline opk_hsums *opk_hlanes_tile(const opk_kernel *k, char *const *ptr, opk_lanes *rows,
                                         Py_ssize_t i, Py_ssize_t m, Py_ssize_t pos,
                                         Py_ssize_t inner, opk_hsums *hs)
{
    const Py_ssize_t col = i % inner;
    if (m % OPK_FBLOCK) return NULL;
    for (int a = 0; a < k->nacc; a++) {
        const Py_ssize_t p = k->acc_rows[a] ? col : pos + i;
        if (p % OPK_FBLOCK || (k->acc_rows[a] && col + m > inner)) return NULL;
    }
    for (int o = 0; o < k->nops - k->nin; o++) hs->f[o] = NULL, hs->ls[o] = NULL;
    for (int a = 0; a < k->nacc; a++) {
        opk_lanes *L = k->acc_rows[a] ? &rows[a] : (opk_lanes *)ptr[k->nops + a];
        const Py_ssize_t b = (k->acc_rows[a] ? col : pos + i) / OPK_FBLOCK;
        if (L->block != b) {
            opk_lanes_flush(L);
            L->block = b;
        }
        hs->ls[k->acc_src[a] - k->nin] = L->s;
    }
    hs->rows = 0;
    return hs;
}

/* ... and after it: each lanes sum's next block; a row sum whose row the tile completed is
 * added into its element, as opk_rows_accum does */
static inline void opk_hlanes_done(const opk_kernel *k, char *const *ptr, opk_lanes *rows,
                                   const Py_ssize_t *acc_rs, Py_ssize_t i, Py_ssize_t m,
                                   Py_ssize_t pos, Py_ssize_t inner)
{
    const Py_ssize_t col = i % inner;
    for (int a = 0; a < k->nacc; a++) {
        if (!k->acc_rows[a]) {
            ((opk_lanes *)ptr[k->nops + a])->block = (pos + i + m) / OPK_FBLOCK;
            continue;
        }
        rows[a].block = (col + m) / OPK_FBLOCK;
        if (col + m < inner) continue;
        *(double *)(ptr[k->nops + a] + (i / inner) * acc_rs[a]) += opk_lanes_value(&rows[a]);
        opk_rows_clear(&rows[a]);
    }
}

static inline void opk_ntw_finish(const opk_kernel *k, opk_ntw *w)
{
    for (int o = 0; w != NULL && o < k->nops - k->nin; o++) opk_ntw_end(&w[o]);
}

/* A float16 run through the kernel's float16 element loop (`fmask`: opk_half_inputs): an input
 * broadcast along the run is converted once and repeated into a float scratch tile; float
 * inputs are read as they are. With folded sums, the loop (htile_f) rounds each block of an
 * output to float16 where it is stored and copies the float block into a tile where a sum
 * reads it: the sums add up the results before they are rounded. Into memory the caller gave
 * (k->stream: a large call), the results are streamed (opk_ntw_run). */
static void opk_segment_half(const opk_kernel *k, char *scratch, Py_ssize_t n, char **ptr,
                             const Py_ssize_t *step, const int *code, int fmask, Py_ssize_t inner,
                             const Py_ssize_t *acc_rs, Py_ssize_t pos)
{
    const Py_ssize_t len = k->tile_len * OPK_HALF_TILES;
    int tiled = k->nacc > 0, summed = 0;
    char *t[2 * OPK_MAXOPS];    /* htile_f: then the outputs' float16 destinations */
    Py_ssize_t es[OPK_MAXOPS];  /* bytes per element as the loop reads it */
    opk_ntw ws[OPK_MAXOPS];
    for (int a = 0; a < k->nacc; a++) summed |= 1 << k->acc_src[a];
    for (int o = 0; o < k->nops; o++) es[o] = fmask >> o & 1 ? 4 : 2;
    for (int o = 0; o < k->nin; o++) {
        if (step[o] != 0) continue;
        char *tile = scratch + o * len * 4;
        if (fmask >> o & 1) opk_load_f((float *)tile, ptr[o], 0, code[o], n < len ? n : len);
        else opk_fill_u16((uint16_t *)tile, *(const uint16_t *)ptr[o], n < len ? n : len);
        tiled = 1;
    }
    opk_ntw *w = opk_ntw_run(k, ptr, n, tiled ? len : OPK_HBLOCK, ws);
    if (!tiled) {
        k->htile(n, ptr, k->ctx, w, fmask, NULL);
        opk_ntw_finish(k, w);
        return;
    }
    opk_cols cols[OPK_MAXACC];
    opk_lanes rows[OPK_MAXACC];
    const int cmask = opk_cols_start(k, cols, OPK_F32, step, acc_rs, inner);
    opk_rows_start(k, rows);
    opk_hsums hsums, hl;
    opk_hsums *hs = opk_hsums_start(k, cols, cmask, ptr, n, len, inner, &hsums);
    if (hs != NULL) summed = 0;  /* no sum reads a float tile */
    const int lanes = hs == NULL && cmask == 0 && opk_hlanes_ok(k, step, acc_rs, n, inner);
    for (Py_ssize_t i = 0, m; i < n; i += m) {
        m = n - i < len ? n - i : len;
        for (int o = 0; o < k->nops; o++)
            t[o] = o >= k->nin ? (k->nacc ? scratch + o * len * 4 : ptr[o] + i * 2)
                               : (step[o] == 0 ? scratch + o * len * 4 : ptr[o] + i * es[o]);
        if (k->nacc == 0) {
            k->htile(m, t, k->ctx, w, fmask, NULL);
            continue;
        }
        /* a tile of whole blocks adds its lanes sums in registers */
        opk_hsums *th = lanes ? opk_hlanes_tile(k, ptr, rows, i, m, pos, inner, &hl) : hs;
        for (int o = k->nin; o < k->nops; o++) {
            if (!(summed >> o & 1) || th == &hl) t[o] = NULL;
            t[k->nops + o - k->nin] = k->discard >> o & 1 ? NULL : ptr[o] + i * 2;
        }
        k->htile_f(m, t, k->ctx, w, fmask, th);
        if (th == &hl) opk_hlanes_done(k, ptr, rows, acc_rs, i, m, pos, inner);
        for (int a = 0; a < k->nacc && th == NULL; a++)
            opk_accum_rows(OPK_F32, k->acc_fblock, ptr[k->nops + a] + (i / inner) * acc_rs[a],
                           acc_rs[a], step[k->nops + a], inner, i % inner, t[k->acc_src[a]], m,
                           pos + i, cmask >> a & 1 ? &cols[a] : NULL, k->acc_rows[a] ? &rows[a] : NULL);
    }
    opk_ntw_finish(k, w);
    for (int a = 0; a < k->nacc; a++) {
        if (hs != NULL) cols[a].rows = hs->rows;
        if (cmask >> a & 1) opk_cols_flush(&cols[a], (double *)ptr[k->nops + a], inner);
    }
}

/* A run whose only other inputs are broadcast along it (a per-channel bias over NCHW's rows of
 * H x W): the kernel's row loop takes those as scalars and writes the outputs in place, with no
 * tile in between. 0: no such loop for this run. */
static inline int opk_row_run(const opk_kernel *k, Py_ssize_t n, char **ptr, const Py_ssize_t *step,
                              const int *code, const int *direct)
{
    static const Py_ssize_t rstep[OPK_MAXOPS] = {0};
    int mask = 0;
    if (k->rows == NULL || k->nacc > 0) return 0;
    for (int o = 0; o < k->nops; o++) {
        if (o < k->nin && step[o] == 0 && code[o] == k->ccode) mask |= 1 << o;
        else if (!direct[o]) return 0;
    }
    return mask != 0 && k->rows(1, n, ptr, rstep, mask, k->ctx);
}

/* The first tile's length in a streaming run: short enough that every later tile starts the
 * first streamed output on a line, so that only the run's own first and last lines take plain
 * stores. Cut at len, the tiles of a run NumPy put 16 bytes into a page each began inside a
 * line, and the line two tiles shared was stored plainly, read before being written: float32
 * LeakyReLU (16M elements, one thread) took 1.5 times as long, the float32 backward passes
 * with folded sums 1.2 to 1.3 times. Row sums over rows no longer than a tile (a per-pixel
 * sum over NHWC's channels) keep tiles of whole rows: cut inside a row, opk_rows_accum adds
 * the pieces through lanes in memory, and spatial_leaky_relu's NHWC backward took 1.06 times
 * as long. */
static inline Py_ssize_t opk_line_tile(const opk_kernel *k, char *const *ptr, const int *direct,
                                       Py_ssize_t cs, Py_ssize_t len, Py_ssize_t inner)
{
    const Py_ssize_t line = 64 / cs;
    for (int a = 0; a < k->nacc; a++)  /* tiles of whole rows add them up in registers */
        if (k->acc_rows[a] && inner <= len) return len;
    for (int o = k->nin; o < k->nops; o++) {
        if (!direct[o] || k->discard >> o & 1) continue;
        const uintptr_t off = (uintptr_t)ptr[o] & 63;
        if (off == 0 || off % cs || len < line || len % line) return len;
        return len - off / cs;
    }
    return len;
}

/* One row piece: operands stored in the compute type with unit stride are used in place, the
 * others are converted or gathered into tiles of `scratch` (nops x tile_len elements); an input
 * broadcast along the run (step 0) is filled into its tile once; long runs into memory the
 * caller gave are computed into a tile and streamed out; an output in k->discard is not stored
 * (only a folded sum reads it). Folded sums (operands nops .. nops + nacc) take each tile while
 * it is in cache: the run is `inner`-element rows, the sums' partials move on by acc_rs a row. */
static void opk_segment_rows(const opk_kernel *k, char *scratch, Py_ssize_t n, char **ptr,
                             const Py_ssize_t *step, const int *code, Py_ssize_t inner,
                             const Py_ssize_t *acc_rs, Py_ssize_t pos)
{
    const int nin = k->nin, nops = k->nops, cc = k->ccode;
    const Py_ssize_t cs = OPK_CSIZE(cc), len = k->tile_len;
    const int fmask = k->htile != NULL && (k->nacc == 0 || k->htile_f != NULL)
                      ? opk_half_inputs(k, step, code) : -1;
    if (fmask >= 0) {
        opk_segment_half(k, scratch, n, ptr, step, code, fmask, inner, acc_rs, pos);
        return;
    }
    const int streaming = k->stream && n >= OPK_STREAM_RUN;
    int direct[OPK_MAXOPS], all_direct = k->nacc == 0;  /* sums are added up tile by tile */
    char *t[OPK_MAXOPS];
    for (int o = 0; o < nops; o++) {
        direct[o] = code[o] == cc && step[o] == cs;
        all_direct &= direct[o];
    }
    if (all_direct && !streaming) {
        k->tile(n, ptr, k->ctx);
        return;
    }
    if (opk_row_run(k, n, ptr, step, code, direct)) return;
    for (int o = 0; o < nin; o++)
        if (step[o] == 0) opk_load_c(cc, scratch + o * len * cs, ptr[o], 0, code[o], n < len ? n : len);
    opk_cols cols[OPK_MAXACC];
    opk_lanes rows[OPK_MAXACC];
    const int cmask = opk_cols_start(k, cols, cc, step, acc_rs, inner);
    opk_rows_start(k, rows);
    const Py_ssize_t first = streaming ? opk_line_tile(k, ptr, direct, cs, len, inner) : len;
    for (Py_ssize_t i = 0, m; i < n; i += m) {
        m = i == 0 ? first : len;
        m = n - i < m ? n - i : m;
        for (int o = 0; o < nops; o++) {
            if (direct[o] && !(streaming && o >= nin)) {
                t[o] = ptr[o] + i * step[o];
            } else {
                t[o] = scratch + o * len * cs;
                if (o < nin && step[o] != 0)
                    opk_load_c(cc, t[o], ptr[o] + i * step[o], step[o], code[o], m);
            }
        }
        k->tile(m, t, k->ctx);
        for (int a = 0; a < k->nacc; a++)  /* the results are still in cache */
            opk_accum_rows(cc, k->acc_fblock, ptr[nops + a] + (i / inner) * acc_rs[a], acc_rs[a],
                           step[nops + a], inner, i % inner, t[k->acc_src[a]], m, pos + i,
                           cmask >> a & 1 ? &cols[a] : NULL, k->acc_rows[a] ? &rows[a] : NULL);
        for (int o = nin; o < nops; o++) {
            if (direct[o] && streaming) opk_stream_c(cc, ptr[o] + i * step[o], t[o], m);
            else if (!direct[o] && !(k->discard >> o & 1))
                opk_store_c(cc, ptr[o] + i * step[o], step[o], code[o], t[o], m);
        }
    }
    for (int a = 0; a < k->nacc; a++)
        if (cmask >> a & 1) opk_cols_flush(&cols[a], (double *)ptr[nops + a], inner);
}

/* A run that is one row piece, for kernels without folded sums. */
static inline void opk_segment(const opk_kernel *k, char *scratch, Py_ssize_t n, char **ptr,
                               const Py_ssize_t *step, const int *code)
{
    static const Py_ssize_t no_rows[OPK_MAXACC] = {0};
    opk_segment_rows(k, scratch, n, ptr, step, code, n > 0 ? n : 1, no_rows, 0);
}

/* Scratch tiles for one thread's walk: on the stack when small (the usual case), else on the
 * heap; NULL when even that fails. */
#define OPK_STACK_SCRATCH 32768
static inline char *opk_scratch(const opk_kernel *k, char *stack)
{
    const size_t bytes = (size_t)k->nops * (size_t)k->tile_len * OPK_CSIZE(k->ccode)
                         * (k->htile != NULL ? OPK_HALF_TILES : 1);
    return bytes <= OPK_STACK_SCRATCH ? stack : (char *)PyMem_RawMalloc(bytes);
}

/* Short rows (NHWC with a per-pixel value broadcast over C, or a per-channel one repeated on
 * every pixel, say) cost a call each. When every output runs on contiguously from one row to
 * the next, rows are handed to the kernel in groups: the inputs that do not are spread into a
 * contiguous tile first (a per-row value filled, a row repeated on every row copied, once while
 * it stays the same), so the kernel sees one long direct run; folded sums follow the rows. */
#ifndef OPK_GROUP
#define OPK_GROUP 8192   /* elements per group of rows: each group is a run with its fixed
                            * costs (writers, sums, the walk's step); at 2048, fused_bias's
                            * float16 forward over NHWC took 1.2 times as long (16M elements) */
#endif

/* rows [0, nrows) of a float16 input spread into a contiguous group tile as float16 (for
 * the float16 loops, which convert it in registers with the rest) */
static inline void opk_spread_u16(uint16_t *dst, const char *src, Py_ssize_t rs, Py_ssize_t step,
                                  Py_ssize_t nrows, Py_ssize_t inner)
{
    for (Py_ssize_t q = 0; q < (rs == 0 ? 1 : nrows); q++) {
        const char *row = src + q * rs;
        if (step == 0) opk_fill_u16(dst + q * inner, *(const uint16_t *)row, inner);
        else for (Py_ssize_t j = 0; j < inner; j++) dst[q * inner + j] = *(const uint16_t *)(row + j * step);
    }
    for (Py_ssize_t q = 1; rs == 0 && q < nrows; q++)  /* the same row on every row */
        memcpy(dst + q * inner, dst, (size_t)inner * 2);
}

/* rows [0, nrows) of an input spread into a contiguous group tile in the compute type */
static inline void opk_spread(int ccode, char *dst, const char *src, Py_ssize_t rs,
                              Py_ssize_t step, int code, Py_ssize_t nrows, Py_ssize_t inner)
{
    const Py_ssize_t cs = OPK_CSIZE(ccode);
    if (rs == 0) {  /* the same row on every row: convert it once, then copy */
        opk_load_c(ccode, dst, src, step, code, inner);
        for (Py_ssize_t q = 1; q < nrows; q++)
            memcpy(dst + q * inner * cs, dst, (size_t)(inner * cs));
        return;
    }
    for (Py_ssize_t q = 0; q < nrows; q++)
        opk_load_c(ccode, dst + q * inner * cs, src + q * rs, step, code, inner);
}

/* A group of rows through the kernel's row loop: an output only folded sums read goes into
 * `buf` (OPK_GROUP elements an output), then the sums add up the group's rows (whole rows,
 * `pos` the walk's position), as opk_segment_rows adds a run's tiles. In a call that streams,
 * the stored outputs go through `buf` too, OPK_ROWS_BATCH elements at a time, and are
 * streamed from it, not read before being written: spatial_leaky_relu's and
 * conditional_leaky_relu's float32 backward passes over NHWC (16M elements, two threads) took
 * 0.95 of the time written in place. (The forwards, without sums, measured no gain.) */
#define OPK_ROWS_BATCH 2048
static void opk_rows_summed(const opk_kernel *k, Py_ssize_t nrows, Py_ssize_t inner, char *const *row,
                            const Py_ssize_t *rs, const Py_ssize_t *step, int mask, char *buf,
                            Py_ssize_t pos)
{
    const int nin = k->nin, nops = k->nops, cc = k->ccode;
    const Py_ssize_t cs = OPK_CSIZE(cc);
    const int streamed = k->stream && nrows * inner >= OPK_STREAM_RUN && inner <= OPK_ROWS_BATCH;
    const Py_ssize_t per = streamed ? OPK_ROWS_BATCH / inner : nrows;
    char *p[OPK_MAXOPS];
    Py_ssize_t r[OPK_MAXOPS];
    opk_cols cols[OPK_MAXACC];
    opk_lanes rl[OPK_MAXACC];
    const int cmask = opk_cols_start(k, cols, cc, step, rs + nops, inner);
    opk_rows_start(k, rl);
    for (Py_ssize_t q = 0; q < nrows; q += per) {
        const Py_ssize_t nq = nrows - q < per ? nrows - q : per;
        for (int o = 0; o < nops; o++) {
            const int own = o >= nin && (streamed || k->discard >> o & 1);
            p[o] = own ? buf + (o - nin) * OPK_GROUP * cs : row[o] + q * rs[o];
            r[o] = own ? inner * cs : rs[o];
        }
        k->rows(nq, inner, p, r, mask, k->ctx);
        for (int o = nin; streamed && o < nops; o++)
            if (!(k->discard >> o & 1)) opk_stream_c(cc, row[o] + q * rs[o], p[o], nq * inner);
        for (int a = 0; a < k->nacc; a++)
            opk_accum_rows(cc, k->acc_fblock, row[nops + a] + q * rs[nops + a], rs[nops + a],
                           step[nops + a], inner, 0, p[k->acc_src[a]], nq * inner, pos + q * inner,
                           cmask >> a & 1 ? &cols[a] : NULL, k->acc_rows[a] ? &rl[a] : NULL);
    }
    for (int a = 0; a < k->nacc; a++)
        if (cmask >> a & 1) opk_cols_flush(&cols[a], (double *)row[nops + a], inner);
}

static void opk_walk_rows(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t *g, char **base,
                          const opk_kernel *kn, char *scratch)
{
    const Py_ssize_t nd = g[OPK_G_NDIM], nops = g[OPK_G_NOPS], nout = g[OPK_G_NOUT];
    const Py_ssize_t nin = nops - nout, nk = kn->nops;  /* operands nk .. nops: folded sums */
    const int ccode = (int)g[OPK_G_CCODE];
    const Py_ssize_t csize = OPK_CSIZE(ccode);
    const Py_ssize_t *shape = g + OPK_G_SHAPE;
    const Py_ssize_t *strides = shape + nd;
    const Py_ssize_t *codes = strides + nops * nd;
    Py_ssize_t idx[OPK_MAXDIM];
    char *row[OPK_MAXARR], *ptr[OPK_MAXARR];
    const char *filled[OPK_MAXARR];
    Py_ssize_t step[OPK_MAXARR], gstep[OPK_MAXARR], rs[OPK_MAXARR], filled_rows[OPK_MAXARR];
    int code[OPK_MAXARR], gcode[OPK_MAXARR], spreads[OPK_MAXARR];
    const Py_ssize_t inner = shape[nd - 1];
    Py_ssize_t r = start / inner, col = start % inner;
    for (Py_ssize_t d = nd - 2; d >= 0; d--) { idx[d] = r % shape[d]; r /= shape[d]; }
    for (Py_ssize_t k = 0; k < nops; k++) {
        const Py_ssize_t *s = strides + k * nd;
        char *p = base[k];
        for (Py_ssize_t d = 0; d < nd - 1; d++) p += idx[d] * s[d];
        row[k] = p;
        step[k] = s[nd - 1];
        rs[k] = nd >= 2 ? s[nd - 2] : 0;
        code[k] = (int)codes[k];
        filled[k] = NULL;
        filled_rows[k] = 0;
    }
    /* can rows be grouped? */
    int group = nd >= 2 && inner * 4 <= OPK_GROUP, any_spread = 0, any_rowwise = 0;
    for (Py_ssize_t o = 0; group && o < nops; o++) {
        const int runs_on = rs[o] == inner * step[o];
        spreads[o] = o < nin && !runs_on;
        any_spread |= spreads[o];
        any_rowwise |= !runs_on;
        if (o >= nin && o < nk && !runs_on) group = 0;  /* an output must run on */
    }
    group = group && any_rowwise;
    /* the kernel's own row loop takes per-row values as scalars: no spreading, when every
     * operand is stored in the compute type and runs contiguously, or is per-row, or is one row
     * repeated on every row (a per-channel weight over NHWC beside per-pixel statistics: read
     * in place, or converted once into a row of the compute type, `conv`); an output only
     * folded sums read goes to a buffer of its own (opk_rows_summed) */
    int mask = 0, use_rows = group && any_spread && kn->rows != NULL, conv = 0;
    for (Py_ssize_t o = 0; use_rows && o < nk; o++) {
        const int repeated = spreads[o] && rs[o] == 0 && step[o] != 0;
        if (spreads[o] && step[o] == 0) mask |= 1 << o;
        else if (spreads[o] && !repeated) use_rows = 0;
        if (repeated && (code[o] != ccode || step[o] != csize)) { conv |= 1 << o; continue; }
        if (o >= nin && kn->discard >> o & 1) continue;
        if (code[o] != ccode || (!spreads[o] && step[o] != csize)) use_rows = 0;
    }
    if (use_rows && !kn->rows(0, inner, NULL, NULL, mask, kn->ctx)) use_rows = 0;
    if (!use_rows) conv = 0;
    char *spread = NULL;
    const size_t spread_bytes = (size_t)(use_rows ? nk - nin : nin) * OPK_GROUP * csize;
    if (group && any_spread && (!use_rows || kn->nacc > 0 || conv)) {
        /* spread inputs, or the outputs only folded sums read (or streamed: opk_rows_summed),
         * then the converted rows */
        spread = (char *)PyMem_RawMalloc(spread_bytes + (conv ? (size_t)nin * inner * csize : 0));
        if (spread == NULL) group = use_rows = conv = 0;
    }
    Py_ssize_t left = stop - start;
    for (;;) {
        Py_ssize_t rows_here = group && col == 0 ? shape[nd - 2] - idx[nd - 2] : 0;
        Py_ssize_t nrows = rows_here < left / inner ? rows_here : left / inner;
        if (nrows > OPK_GROUP / inner) nrows = OPK_GROUP / inner;
        Py_ssize_t m;
        if (nrows >= 2 && use_rows) {
            char *rp[OPK_MAXARR];
            for (Py_ssize_t k = 0; k < nops; k++) {
                rp[k] = row[k];
                if (!(conv >> k & 1)) continue;
                rp[k] = spread + spread_bytes + k * inner * csize;
                if (filled[k] != row[k]) {  /* the row in the compute type, once while it stays */
                    opk_load_c(ccode, rp[k], row[k], step[k], code[k], inner);
                    filled[k] = row[k];
                }
            }
            if (kn->nacc > 0) opk_rows_summed(kn, nrows, inner, rp, rs, step, mask, spread, stop - left);
            else kn->rows(nrows, inner, rp, rs, mask, kn->ctx);
            m = nrows * inner;
        } else if (nrows >= 2) {
            for (Py_ssize_t k = 0; k < nops; k++) {
                if (spreads[k]) {
                    char *dst = spread + k * OPK_GROUP * csize;
                    /* float16 stays float16 where the kernel has float16 loops; else the
                     * compute type (the float16 loops read floats too) */
                    const int half = kn->htile != NULL && code[k] == OPK_F16;
                    /* a row repeated on every row is spread once while it stays the same */
                    if (!(rs[k] == 0 && filled[k] == row[k] && filled_rows[k] >= nrows)) {
                        if (half) opk_spread_u16((uint16_t *)dst, row[k], rs[k], step[k], nrows, inner);
                        else opk_spread(ccode, dst, row[k], rs[k], step[k], code[k], nrows, inner);
                        filled[k] = row[k];
                        filled_rows[k] = nrows;
                    }
                    ptr[k] = dst;
                    gstep[k] = half ? 2 : csize;
                    gcode[k] = half ? OPK_F16 : ccode;
                } else {
                    ptr[k] = row[k];
                    gstep[k] = step[k];
                    gcode[k] = code[k];
                }
            }
            m = nrows * inner;
            opk_segment_rows(kn, scratch, m, ptr, gstep, gcode, inner, rs + nk, stop - left);
        } else {
            nrows = 1;
            m = inner - col < left ? inner - col : left;
            for (Py_ssize_t k = 0; k < nops; k++) ptr[k] = row[k] + col * step[k];
            opk_segment_rows(kn, scratch, m, ptr, step, code, m, rs + nk, stop - left);
        }
        if (nrows >= 2) {
            for (Py_ssize_t k = 0; k < nops; k++) row[k] += (nrows - 1) * rs[k];
            idx[nd - 2] += nrows - 1;
        }
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
    if (spread) PyMem_RawFree(spread);
}

static int opk_walk_blocks(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t *g, char **base,
                           const opk_kernel *kn, char *scratch)
{
    const Py_ssize_t nd = g[OPK_G_NDIM], nops = g[OPK_G_NOPS], nout = g[OPK_G_NOUT];
    const Py_ssize_t td = g[OPK_G_TDIM], od = nd - 1;
    const int ccode = (int)g[OPK_G_CCODE], stream = kn->stream;
    const Py_ssize_t csize = OPK_CSIZE(ccode);
    const Py_ssize_t *shape = g + OPK_G_SHAPE;
    const Py_ssize_t *strides = shape + nd;
    const Py_ssize_t *codes = strides + nops * nd;
    const Py_ssize_t nbo = opk_cdiv(shape[od], OPK_BLOCK_O), nbi = opk_cdiv(shape[td], OPK_BLOCK_I);
    char *ptr[OPK_MAXOPS], *origin[OPK_MAXOPS];
    Py_ssize_t step[OPK_MAXOPS];
    int code[OPK_MAXOPS];
    /* one block buffer per output, in the compute type: OPK_BLOCK_O rows of OPK_BLOCK_I */
    char *buf = (char *)PyMem_RawMalloc((size_t)(nout ? nout : 1) * OPK_BLOCK_O * OPK_BLOCK_I * csize);
    char tmp[OPK_BLOCK_O * 8];
    if (buf == NULL) return -1;
    for (Py_ssize_t u = start; u < stop; u++) {
        Py_ssize_t ob = u % nbo, rest = u / nbo;
        Py_ssize_t ib = rest % nbi;
        rest /= nbi;
        for (Py_ssize_t k = 0; k < nops; k++) origin[k] = base[k];
        for (Py_ssize_t d = nd - 2; d >= 0; d--) {      /* the outer dims, innermost first */
            if (d == td) continue;
            Py_ssize_t i = rest % shape[d];
            rest /= shape[d];
            for (Py_ssize_t k = 0; k < nops; k++) origin[k] += i * strides[k * nd + d];
        }
        const Py_ssize_t o0 = ob * OPK_BLOCK_O, i0 = ib * OPK_BLOCK_I;
        const Py_ssize_t bo = shape[od] - o0 < OPK_BLOCK_O ? shape[od] - o0 : OPK_BLOCK_O;
        const Py_ssize_t bi = shape[td] - i0 < OPK_BLOCK_I ? shape[td] - i0 : OPK_BLOCK_I;
        for (Py_ssize_t k = 0; k < nops; k++)
            origin[k] += o0 * strides[k * nd + od] + i0 * strides[k * nd + td];
        if (u + 1 < stop) {
            /* the next block reads rows no prefetcher is following yet: start them (a hint
             * only; an address past the end is never loaded) */
            const int wrap = (u + 1) % nbo == 0;
            for (Py_ssize_t k = 0; k < nops - nout; k++) {
                const Py_ssize_t so = strides[k * nd + od], si = strides[k * nd + td];
                const char *next = wrap ? origin[k] - o0 * so + OPK_BLOCK_I * si
                                        : origin[k] + OPK_BLOCK_O * so;
                for (Py_ssize_t r = 0; r < OPK_BLOCK_O; r++)
                    for (int line = 0; line < OPK_PREFETCH_LINES; line++)
                        __builtin_prefetch(next + r * so + line * 64, 0, 3);
            }
        }
        for (Py_ssize_t r = 0; r < bo; r++) {           /* rows along tdim, into the buffer */
            for (Py_ssize_t k = 0; k < nops; k++) {
                if (k < nops - nout) {
                    ptr[k] = origin[k] + r * strides[k * nd + od];
                    step[k] = strides[k * nd + td];
                    code[k] = (int)codes[k];
                } else {
                    ptr[k] = buf + ((k - (nops - nout)) * OPK_BLOCK_O + r) * OPK_BLOCK_I * csize;
                    step[k] = csize;
                    code[k] = ccode;
                }
            }
            opk_segment(kn, scratch, bi, ptr, step, code);
        }
        for (Py_ssize_t k = nops - nout; k < nops; k++) {  /* transpose into the outputs */
            const char *src = buf + (k - (nops - nout)) * OPK_BLOCK_O * OPK_BLOCK_I * csize;
            const Py_ssize_t so = strides[k * nd + od], si = strides[k * nd + td];
            if ((int)codes[k] == ccode && so == csize && si % csize == 0) {
                /* a transposition moves bits: the float routines serve any 4- or 8-byte type */
                if (csize == 8)
                    opk_transpose_d((double *)origin[k], si / 8, (const double *)src, OPK_BLOCK_I, bo, bi);
                else
                    opk_transpose_f((float *)origin[k], si / 4, (const float *)src, OPK_BLOCK_I, bo, bi, stream);
                continue;
            }
            for (Py_ssize_t i = 0; i < bi; i++) {       /* convert / scatter: one output row */
                for (Py_ssize_t r = 0; r < bo; r++)
                    memcpy(tmp + r * csize, src + (r * OPK_BLOCK_I + i) * csize, (size_t)csize);
                opk_store_c(ccode, origin[k] + i * si, so, (int)codes[k], tmp, bo);
            }
        }
    }
    PyMem_RawFree(buf);  /* (opk_walk fences) */
    return 0;
}

/* Run a kernel over work units [start, stop) (elements, or blocks when transposing); -1 when
 * memory for its buffers cannot be had. Threads call this on disjoint ranges, so each element is
 * computed exactly once and the result does not depend on the number of threads. */
OPK_RT_FN int opk_walk(Py_ssize_t start, Py_ssize_t stop, const Py_ssize_t *g, char **base,
                    const opk_kernel *k)
{
    _Alignas(64) char stack[OPK_STACK_SCRATCH];
    char *scratch = opk_scratch(k, stack);
    int status = 0;
    if (stop <= start) return 0;
    if (scratch == NULL) return -1;
    if (g[OPK_G_TDIM] >= 0) status = opk_walk_blocks(start, stop, g, base, k, scratch);
    else opk_walk_rows(start, stop, g, base, k, scratch);
    if (k->stream) opk_fence();
    if (scratch != stack) PyMem_RawFree(scratch);
    return status;
}

/* How many threads run `total` elements when `available` may: one below the threshold (an
 * OpenMP region costs about 2 us to open), never fewer than 1024 elements a thread, at most
 * `max_threads` (0: no limit). The rule of every element kernel, in this one place (a fused
 * convolution's threads: opkit/runtime/schedule.py, fused_threads). */
static inline int opk_threads(Py_ssize_t total, int available, Py_ssize_t threshold, int max_threads)
{
    if (total < threshold || total < 2 || available <= 1) return 1;
    if (max_threads > 0 && available > max_threads) available = max_threads;
    const Py_ssize_t by_size = total / 1024 > 1 ? total / 1024 : 1;
    return by_size < available ? (int)by_size : available;
}

/* The least and greatest of sum_d idx[d] * st[d] over the flat (row-major) indices [s, e) of
 * dims d .. nd - 1: whole rows of a dim take their extremes at its ends, so a range costs two
 * paths down the dims. */
static void opk_span(const Py_ssize_t *shape, const Py_ssize_t *st, int d, int nd, Py_ssize_t s,
                     Py_ssize_t e, Py_ssize_t *lo, Py_ssize_t *hi)
{
    Py_ssize_t sub = 1, flo = 0, fhi = 0;
    if (d == nd) { *lo = *hi = 0; return; }
    for (int q = d + 1; q < nd; q++) {
        sub *= shape[q];
        flo += st[q] < 0 ? (shape[q] - 1) * st[q] : 0;
        fhi += st[q] > 0 ? (shape[q] - 1) * st[q] : 0;
    }
    const Py_ssize_t a = s / sub, b = (e - 1) / sub;
    Py_ssize_t l, h;
    if (s == a * sub && e == (b + 1) * sub) {  /* whole rows a .. b */
        *lo = flo + (st[d] < 0 ? b : a) * st[d];
        *hi = fhi + (st[d] < 0 ? a : b) * st[d];
        return;
    }
    if (a == b) {
        opk_span(shape, st, d + 1, nd, s - a * sub, e - a * sub, &l, &h);
        *lo = a * st[d] + l;
        *hi = a * st[d] + h;
        return;
    }
    opk_span(shape, st, d + 1, nd, s - a * sub, sub, &l, &h);   /* the end of row a */
    *lo = a * st[d] + l;
    *hi = a * st[d] + h;
    opk_span(shape, st, d + 1, nd, 0, e - b * sub, &l, &h);     /* the start of row b */
    if (b * st[d] + l < *lo) *lo = b * st[d] + l;
    if (b * st[d] + h > *hi) *hi = b * st[d] + h;
    if (b - a >= 2) {                                           /* rows a + 1 .. b - 1 */
        const Py_ssize_t r0 = (a + 1) * st[d], r1 = (b - 1) * st[d];
        if ((r0 < r1 ? r0 : r1) + flo < *lo) *lo = (r0 < r1 ? r0 : r1) + flo;
        if ((r0 > r1 ? r0 : r1) + fhi > *hi) *hi = (r0 > r1 ? r0 : r1) + fhi;
    }
}

/* The partial sums of chunk c's sums: [lo, hi) bytes of each sum's elements (opk_lanes each
 * where the walk adds whole runs into one, opk_accum, unless kept as row sums), kept at `off`
 * in one buffer. */
typedef struct { Py_ssize_t lo, hi, off; } opk_part;

/* A chunk's partials added into the sums (out[k] += element k's partial, its lanes' value
 * where kept as lanes), for the sum's elements [k0, k1). */
static inline void opk_fold_chunk(const char *buf, const opk_part *pt, Py_ssize_t ext, double *out,
                                  Py_ssize_t k0, Py_ssize_t k1)
{
    const Py_ssize_t a = pt->lo / ext > k0 ? pt->lo / ext : k0;
    const Py_ssize_t b = pt->hi / ext < k1 ? pt->hi / ext : k1;
    if (ext == 8) {  /* doubles: a loop the compiler vectorizes */
        const double *v = (const double *)(buf + pt->off - pt->lo);
        for (Py_ssize_t k = a; k < b; k++) out[k] += v[k];
        return;
    }
    for (Py_ssize_t k = a; k < b; k++) {
        const char *v = buf + pt->off + k * ext - pt->lo;
        out[k] += ext == OPK_LANE_BYTES ? opk_lanes_value((const opk_lanes *)v) : *(const double *)v;
    }
}

/* The bytes of partials chunks of `chunk` elements keep: the span of each sum's elements
 * (opk_span), `ext` bytes an element. Into parts when given, with each one's offset. -2: a sum's
 * partials are not laid out as the walk adds into them. */
static Py_ssize_t opk_parts(Py_ssize_t total, Py_ssize_t chunk, const Py_ssize_t *g,
                            const opk_kernel *k, const Py_ssize_t *ext, opk_part *parts)
{
    const Py_ssize_t nd = g[OPK_G_NDIM], *shape = g + OPK_G_SHAPE, *strides = shape + nd;
    const Py_ssize_t nchunks = opk_cdiv(total, chunk);
    Py_ssize_t bytes = 0;
    for (Py_ssize_t c = 0; c < nchunks; c++) {
        const Py_ssize_t stop = (c + 1) * chunk < total ? (c + 1) * chunk : total;
        for (int a = 0; a < k->nacc; a++) {
            opk_part pt;
            opk_span(shape, strides + (k->nops + a) * nd, 0, (int)nd, c * chunk, stop, &pt.lo, &pt.hi);
            pt.hi += ext[a];
            pt.off = bytes;
            bytes += pt.hi - pt.lo;
            if (pt.lo < 0 || pt.lo % ext[a] || pt.hi > k->acc_len[a] * ext[a]) return -2;
            if (parts != NULL) parts[c * k->nacc + a] = pt;
        }
    }
    return bytes;
}

/* Elements per chunk: OPK_ACC_CHUNK, unless a sum keeps the walk's fastest dim (a per-pixel sum
 * over NCHW's channels): every chunk then touches as many of its elements as it has terms, and
 * the partials would outweigh the data (and fault in fresh pages on every call). Chunks then
 * grow, by doubling, to the first size whose partials come to at most a byte an element. The
 * size depends on the shapes alone, so the sums stay the same for any number of threads. */
static Py_ssize_t opk_chunk(Py_ssize_t total, const Py_ssize_t *g, const opk_kernel *k,
                            const Py_ssize_t *ext)
{
    const Py_ssize_t chunk = OPK_ACC_CHUNK, first = opk_parts(total, chunk, g, k, ext, NULL);
    if (first <= total) return chunk;  /* (or -2: opk_run_chunks refuses the layout) */
    for (Py_ssize_t c = 2 * chunk; c < 2 * total; c *= 2) {
        const Py_ssize_t bytes = opk_parts(total, c, g, k, ext, NULL);
        if (bytes >= 0 && bytes <= total) return c;
    }
    return chunk;
}

/* A kernel that folds sums into its pass runs in chunks (opk_chunk), each adding into partial
 * sums of its own: the chunks, and so every sum, are the same whatever the number of threads.
 * A lanes sum whose next row in the walk is another element is kept as row sums (opk_rows_accum;
 * its partials' strides, laid out OPK_LANE_BYTES an element by the caller, scaled to 8 bytes).
 * A chunk keeps partials only for the span of each sum's elements it touches (a few channels'
 * worth, say, of a sum over N, H and W), zeroed as it starts, in cache; the chunks' partials
 * are then added into the sums in chunk order. -1: no memory; -2: a sum's partials are not
 * laid out as the walk adds into them. */
static int opk_run_chunks(Py_ssize_t total, const Py_ssize_t *geom, char **base,
                          const opk_kernel *kernel, int nt)
{
    const Py_ssize_t nops = geom[OPK_G_NOPS], nd = geom[OPK_G_NDIM];
    const Py_ssize_t glen = OPK_G_SHAPE + nd + nops * nd + nops;
    const int na = kernel->nacc;
    opk_kernel call = *kernel;
    const opk_kernel *k = &call;
    Py_ssize_t ext[OPK_MAXACC];
    /* the geometry with row sums' partials laid out 8 bytes an element */
    Py_ssize_t *g = (Py_ssize_t *)PyMem_RawMalloc((size_t)glen * sizeof(Py_ssize_t));
    if (g == NULL) return -1;
    memcpy(g, geom, (size_t)glen * sizeof(Py_ssize_t));
    for (int a = 0; a < na; a++) {  /* lanes where the walk adds runs whole (opk_accum) */
        Py_ssize_t *s = g + OPK_G_SHAPE + nd + (k->nops + a) * nd;
        if ((s[nd - 1] == 0) != (k->acc_lanes[a] != 0)) { PyMem_RawFree(g); return -2; }
        /* row sums where the next row of the walk adds into another element (opk_rows_accum) */
        call.acc_rows[a] = k->acc_lanes[a] && nd >= 2 && s[nd - 2] != 0;
        ext[a] = k->acc_lanes[a] && !call.acc_rows[a] ? OPK_LANE_BYTES : 8;
        if (call.acc_rows[a])
            for (Py_ssize_t d = 0; d < nd; d++) s[d] = s[d] / OPK_LANE_BYTES * 8;
    }
    const Py_ssize_t chunk = opk_chunk(total, g, k, ext), nchunks = opk_cdiv(total, chunk);
    opk_part *parts = (opk_part *)PyMem_RawMalloc((size_t)(nchunks * na) * sizeof(opk_part) + 1);
    const Py_ssize_t bytes = parts == NULL ? -1 : opk_parts(total, chunk, g, k, ext, parts);
    char *buf = bytes < 0 ? NULL : (char *)PyMem_RawMalloc((size_t)bytes + 1);
    if (buf == NULL) {
        PyMem_RawFree(parts);
        PyMem_RawFree(g);
        return bytes == -2 ? -2 : -1;
    }
    int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: failed) if(nt > 1)
    for (Py_ssize_t c = 0; c < nchunks; c++) {
        char *b[OPK_MAXARR];
        for (Py_ssize_t o = 0; o < nops; o++) {
            if (o < k->nops) { b[o] = base[o]; continue; }
            const opk_part *pt = parts + c * na + (o - k->nops);
            memset(buf + pt->off, 0, (size_t)(pt->hi - pt->lo));  /* in cache from here on */
            b[o] = buf + pt->off - pt->lo;  /* the walk adds at offsets lo .. hi from here */
        }
        const Py_ssize_t stop = (c + 1) * chunk < total ? (c + 1) * chunk : total;
        failed |= opk_walk(c * chunk, stop, g, b, k);
    }
    /* each sum's elements split among the threads, each adding the chunks in order */
    const int ft = bytes >= (1 << 22) ? nt : 1;
#pragma omp parallel for num_threads(ft) schedule(static) if(ft > 1)
    for (int t = 0; t < ft; t++)
        for (int a = 0; a < na; a++) {
            const Py_ssize_t K = k->acc_len[a], k0 = K * t / ft, k1 = K * (t + 1) / ft;
            for (Py_ssize_t q = k0; q < k1; q++) k->acc_out[a][q] = 0.0;
            for (Py_ssize_t c = 0; c < nchunks; c++)
                opk_fold_chunk(buf, parts + c * na + a, ext[a], k->acc_out[a], k0, k1);
        }
    PyMem_RawFree(buf);
    PyMem_RawFree(parts);
    PyMem_RawFree(g);
    return failed ? -1 : 0;
}

/* The kernel as one call runs it: the results of a small call are not streamed (whoever reads
 * them next finds them in cache). */
static inline opk_kernel opk_for_call(const opk_kernel *k, Py_ssize_t total)
{
    opk_kernel c = *k;
    c.stream = k->stream && total >= OPK_STREAM_MIN;
    return c;
}

/* A kernel over a geometry, split statically over threads; -1: out of memory. */
OPK_RT_FN int opk_run(const Py_ssize_t *g, char **base, const opk_kernel *kernel, int available,
                   Py_ssize_t threshold, int max_threads)
{
    const Py_ssize_t units = opk_units(g), nd = g[OPK_G_NDIM];
    Py_ssize_t total = 1;
    for (Py_ssize_t d = 0; d < nd; d++) total *= g[OPK_G_SHAPE + d];
    const opk_kernel call = opk_for_call(kernel, total), *k = &call;
    const int nt = opk_threads(total, available, threshold, max_threads);
    int failed = 0;
    if (k->nacc > 0) return opk_run_chunks(total, g, base, k, nt);
    if (nt <= 1) return opk_walk(0, units, g, base, k);
#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: failed)
    for (int t = 0; t < nt; t++)
        failed |= opk_walk(units * t / nt, units * (t + 1) / nt, g, base, k);
    return failed ? -1 : 0;
}

/* One thread's share [s, e) of the direct call's n elements. */
static int opk_flat_part(Py_ssize_t s, Py_ssize_t e, char **ptr, const Py_ssize_t *step,
                         const int *code, const opk_kernel *k)
{
    _Alignas(64) char stack[OPK_STACK_SCRATCH];
    char *scratch = opk_scratch(k, stack), *p[OPK_MAXOPS];
    if (scratch == NULL) return -1;
    for (int o = 0; o < k->nops; o++) p[o] = ptr[o] + s * step[o];
    opk_segment(k, scratch, e - s, p, step, code);
    if (k->stream) opk_fence();
    if (scratch != stack) PyMem_RawFree(scratch);
    return 0;
}

/* The direct call: n elements of contiguous operands (step bytes apart, storage codes code);
 * a small call never opens a parallel region. */
OPK_RT_FN int opk_run_flat(Py_ssize_t n, char **ptr, const Py_ssize_t *step, const int *code,
                        const opk_kernel *kernel, int available, Py_ssize_t threshold, int max_threads)
{
    const opk_kernel call = opk_for_call(kernel, n), *k = &call;
    const int nt = opk_threads(n, available, threshold, max_threads);
    int failed = 0;
    if (nt <= 1) return opk_flat_part(0, n, ptr, step, code, k);
#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: failed)
    for (int t = 0; t < nt; t++)
        failed |= opk_flat_part(n * t / nt, n * (t + 1) / nt, ptr, step, code, k);
    return failed ? -1 : 0;
}

#endif /* OPK_RUNTIME */
#endif /* OPKIT_KERNEL_H */
