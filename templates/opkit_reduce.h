/* Reductions other than sums, for the library calls amax, amin and logsumexp
 * (opkit/dsl/library.py): the input viewed as `rows` runs of `n` elements, element j of run r at
 * byte offset r * rs + j * js, and y[r] the reduction of run r. Two memory orders are compiled:
 * runs of contiguous elements (js is the element size: a softmax's row), reduced in vectors;
 * and contiguous runs of outputs (rs is the element size: a max over C of NCHW), where the
 * outputs of a block are updated together, element j of each at a time. Every output is reduced
 * by one thread in one order, so a result does not depend on the number of threads.
 *
 * max and min propagate NaN (a NaN flag per lane, as comparisons cannot); logsumexp is
 * m + log(sum(exp(x - m))) with m the max (0 where it is infinite, as PyTorch's logsumexp), the
 * exponentials from opkit_math.h summed in double. Runs of no element never reach here. float16
 * runs are converted to float32 first (opk_reduce_h; this header follows opkit_kernel.h). */
#ifndef OPKIT_REDUCE_H
#define OPKIT_REDUCE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "opkit_math.h"

enum { OPK_R_MAX = 0, OPK_R_MIN = 1, OPK_R_LSE = 2 };

#define OPK_RL 16        /* lanes of a run's sum of exponentials (the lane loops vectorize) */
#define OPK_RBLOCK 512   /* outputs updated together in the other order (on the stack) */

/* A small call runs on one thread: opening a parallel region costs about 2 us (lower/__init__.py,
 * DEFAULT_PARALLEL_THRESHOLD). */
static inline int opk_rthreads(Py_ssize_t total, Py_ssize_t units, int available)
{
    if (total < 32768 || available <= 1 || units < 2) return 1;
    return units < available ? (int)units : available;
}

/* The vectors a contiguous run is reduced in: GCC's vector extension, as wide as the target's
 * (a loop over an array of lanes kept them in memory and ran at a fifth of the speed; a wider
 * vector than the target has is split badly on SSE2: 16 bytes there) */
#if defined(__AVX512F__)
#define OPK_RVB 64
#elif defined(__AVX__)
#define OPK_RVB 32
#else
#define OPK_RVB 16
#endif

#define OPK_REDUCE_DEFINE(SFX, T, IT, EXPF)                                                     \
typedef T opk_rv_##SFX __attribute__((vector_size(OPK_RVB)));                                  \
typedef IT opk_ri_##SFX __attribute__((vector_size(OPK_RVB)));                                 \
                                                                                                \
/* the max (min: lower) of run x[0 .. n), contiguous, NaN if one is */                          \
static inline T opk_rext_##SFX(const T *x, Py_ssize_t n, int lower)                            \
{                                                                                               \
    enum { W = OPK_RVB / (int)sizeof(T) };                                                      \
    const T start = lower ? (T)INFINITY : (T)-INFINITY;                                         \
    opk_rv_##SFX m = (opk_rv_##SFX){0} + start;                                                 \
    opk_ri_##SFX bad = (opk_ri_##SFX){0};                                                       \
    Py_ssize_t j = 0;                                                                           \
    for (; j + W <= n; j += W) {                                                                \
        opk_rv_##SFX v;                                                                         \
        memcpy(&v, x + j, sizeof v);                                                            \
        const opk_ri_##SFX take = lower ? v < m : v > m;                                        \
        bad |= v != v;                                                                          \
        m = (opk_rv_##SFX)(((opk_ri_##SFX)v & take) | ((opk_ri_##SFX)m & ~take));              \
    }                                                                                           \
    T r = start;                                                                                \
    IT any = 0;                                                                                 \
    for (int l = 0; l < W; l++) {                                                               \
        r = (lower ? m[l] < r : m[l] > r) ? m[l] : r;                                           \
        any |= bad[l];                                                                          \
    }                                                                                           \
    for (; j < n; j++) {                                                                        \
        const T v = x[j];                                                                       \
        any |= v != v;                                                                          \
        r = (lower ? v < r : v > r) ? v : r;                                                    \
    }                                                                                           \
    return any ? (T)NAN : r;                                                                    \
}                                                                                               \
                                                                                                \
/* log(sum(exp(x - s))) + s over run x[0 .. n), contiguous, s its max (0 if infinite) */        \
static inline T opk_rlse_##SFX(const T *x, Py_ssize_t n)                                       \
{                                                                                               \
    const T m = opk_rext_##SFX(x, n, 0);                                                        \
    if (m != m) return m;                                                                       \
    const T s = isinf(m) ? (T)0 : m;                                                            \
    double acc[OPK_RL];                                                                         \
    for (int l = 0; l < OPK_RL; l++) acc[l] = 0;                                                \
    Py_ssize_t j = 0;                                                                           \
    for (; j + OPK_RL <= n; j += OPK_RL)                                                        \
        for (int l = 0; l < OPK_RL; l++) acc[l] += (double)EXPF(x[j + l] - s);                  \
    for (; j < n; j++) acc[0] += (double)EXPF(x[j] - s);                                        \
    for (int w = OPK_RL / 2; w > 0; w /= 2)  /* pairwise, in a fixed order */                   \
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];                                       \
    return (T)(log(acc[0]) + (double)s);                                                        \
}                                                                                               \
                                                                                                \
/* outputs y[0 .. b) of contiguous runs (element j of output i at x + i + j * js): the max or   \
 * min, or with op OPK_R_LSE the logsumexp (a second walk sums the exponentials) */             \
static void opk_rcols_##SFX(const char *x, Py_ssize_t b, Py_ssize_t n, Py_ssize_t js, T *y,     \
                            int op)                                                             \
{                                                                                               \
    T bad[OPK_RBLOCK];                                                                          \
    const int lower = op == OPK_R_MIN;                                                          \
    for (Py_ssize_t i = 0; i < b; i++) { y[i] = lower ? (T)INFINITY : (T)-INFINITY; bad[i] = 0; } \
    for (Py_ssize_t j = 0; j < n; j++) {                                                        \
        const T *v = (const T *)(x + j * js);                                                   \
        if (lower)                                                                              \
            for (Py_ssize_t i = 0; i < b; i++) {                                                \
                bad[i] = v[i] != v[i] ? (T)1 : bad[i];                                          \
                y[i] = v[i] < y[i] ? v[i] : y[i];                                               \
            }                                                                                   \
        else                                                                                    \
            for (Py_ssize_t i = 0; i < b; i++) {                                                \
                bad[i] = v[i] != v[i] ? (T)1 : bad[i];                                          \
                y[i] = v[i] > y[i] ? v[i] : y[i];                                               \
            }                                                                                   \
    }                                                                                           \
    for (Py_ssize_t i = 0; i < b; i++) y[i] = bad[i] != 0 ? (T)NAN : y[i];                      \
    if (op != OPK_R_LSE) return;                                                                \
    double acc[OPK_RBLOCK];                                                                     \
    for (Py_ssize_t i = 0; i < b; i++) {                                                        \
        acc[i] = 0;                                                                             \
        bad[i] = isinf(y[i]) ? (T)0 : y[i];  /* the shift; a NaN stays */                       \
    }                                                                                           \
    for (Py_ssize_t j = 0; j < n; j++) {                                                        \
        const T *v = (const T *)(x + j * js);                                                   \
        for (Py_ssize_t i = 0; i < b; i++) acc[i] += (double)EXPF(v[i] - bad[i]);               \
    }                                                                                           \
    for (Py_ssize_t i = 0; i < b; i++)                                                          \
        y[i] = y[i] != y[i] ? y[i] : (T)(log(acc[i]) + (double)bad[i]);                         \
}                                                                                               \
                                                                                                \
/* y[r] for r < rows; 0, or -1 for a memory order neither form takes */                         \
static int opk_reduce_##SFX(const char *x, Py_ssize_t rows, Py_ssize_t rs, Py_ssize_t n,        \
                            Py_ssize_t js, T *y, int op, int available)                         \
{                                                                                               \
    if ((Py_ssize_t)sizeof(T) == js) {                                                          \
        const int nt = opk_rthreads(rows * n, rows, available);                                 \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                            \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                 \
            const T *row = (const T *)(x + r * rs);                                             \
            y[r] = op == OPK_R_LSE ? opk_rlse_##SFX(row, n) : opk_rext_##SFX(row, n, op == OPK_R_MIN); \
        }                                                                                       \
        return 0;                                                                               \
    }                                                                                           \
    if ((Py_ssize_t)sizeof(T) == rs) {                                                          \
        const Py_ssize_t blocks = (rows + OPK_RBLOCK - 1) / OPK_RBLOCK;                         \
        const int nt = opk_rthreads(rows * n, blocks, available);                               \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                            \
        for (Py_ssize_t q = 0; q < blocks; q++) {                                               \
            const Py_ssize_t r = q * OPK_RBLOCK;                                                \
            const Py_ssize_t b = rows - r < OPK_RBLOCK ? rows - r : OPK_RBLOCK;                 \
            opk_rcols_##SFX(x + r * rs, b, n, js, y + r, op);                                   \
        }                                                                                       \
        return 0;                                                                               \
    }                                                                                           \
    return -1;                                                                                  \
}

OPK_REDUCE_DEFINE(f, float, int32_t, opk_expf)
OPK_REDUCE_DEFINE(d, double, int64_t, opk_exp)

#undef OPK_REDUCE_DEFINE

/* float16 data (results in float32): each run converted to float32 (opkit_kernel.h's
 * opk_h2f_contig) into a buffer of the thread's, then reduced as float32 data are; -2: no
 * memory for the buffers */
static int opk_reduce_h(const char *x, Py_ssize_t rows, Py_ssize_t rs, Py_ssize_t n,
                        Py_ssize_t js, float *y, int op, int available)
{
    int failed = 0;
    if (js == 2) {
        const int nt = opk_rthreads(rows * n, rows, available);
#pragma omp parallel num_threads(nt) reduction(|: failed)
        {
            float *buf = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
            failed = buf == NULL;
#pragma omp for schedule(static)
            for (Py_ssize_t r = 0; r < rows; r++) {
                if (buf == NULL) continue;
                opk_h2f_contig(buf, (const uint16_t *)(x + r * rs), n);
                y[r] = op == OPK_R_LSE ? opk_rlse_f(buf, n) : opk_rext_f(buf, n, op == OPK_R_MIN);
            }
            free(buf);
        }
        return failed ? -2 : 0;
    }
    if (rs != 2) return -1;
    /* outputs in blocks: the block's elements j converted into a float32 run of their own,
     * `n` runs a block (a buffer of n * OPK_RBLOCK floats a thread) */
    const Py_ssize_t blocks = (rows + OPK_RBLOCK - 1) / OPK_RBLOCK;
    const int nt = opk_rthreads(rows * n, blocks, available);
#pragma omp parallel num_threads(nt) reduction(|: failed)
    {
        float *buf = (float *)malloc((size_t)(n > 0 ? n : 1) * OPK_RBLOCK * sizeof(float));
        failed = buf == NULL;
#pragma omp for schedule(static)
        for (Py_ssize_t q = 0; q < blocks; q++) {
            if (buf == NULL) continue;
            const Py_ssize_t r = q * OPK_RBLOCK;
            const Py_ssize_t b = rows - r < OPK_RBLOCK ? rows - r : OPK_RBLOCK;
            for (Py_ssize_t j = 0; j < n; j++)
                opk_h2f_contig(buf + j * b, (const uint16_t *)(x + r * rs + j * js), b);
            opk_rcols_f((const char *)buf, b, n, b * (Py_ssize_t)sizeof(float), y + r, op);
        }
        free(buf);
    }
    return failed ? -2 : 0;
}

#endif /* OPKIT_REDUCE_H */
