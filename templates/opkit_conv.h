/* opkit fused convolution: a GEMM per output block, and the operator's generated epilogue on
 * each block while it is in cache.
 *
 * Included (after opkit_kernel.h) by generated modules that have fused steps. The output is cut
 * into blocks of whole output rows of one image; each thread takes blocks in turn and computes
 * the block's raw result in one of two ways:
 *  - direct (opkit's generated micro-kernels, opkit/codegen/gemm.py: declared by the module,
 *    OPK_GL_F defined, and compiled into the runtime it links): the block's input rows are
 *    copied once, zero-padded, in the compute type (float16 converted, NCHW transposed on the
 *    way), or read where they are; register tiles then read every kernel tap straight from
 *    them, so no unfolded matrix is ever made;
 *  - BLAS: the block's receptive fields are unfolded into a thread-local matrix and multiplied
 *    with the packed weights in one single-threaded GEMM (SciPy's BLAS); the library's thread
 *    count is 1 for the duration of the call, so its own pool stays asleep.
 * Then the epilogue kernel runs over the block (bias, normalization, activation ...) and the
 * per-channel statistics are summed, so the raw result never goes to memory.
 *
 * Per-channel sums are kept per block and added in block order at the end, so results do not
 * depend on the number of threads.
 */
#ifndef OPKIT_CONV_H
#define OPKIT_CONV_H

#include <stdlib.h>
#include "opkit_kernel.h"

/* Fortran BLAS, as scipy.linalg.cython_blas exports it */
typedef void (*opk_sgemm_fn)(char *ta, char *tb, int *m, int *n, int *k, float *alpha,
                             float *a, int *lda, float *b, int *ldb, float *beta, float *c, int *ldc);
typedef void (*opk_dgemm_fn)(char *ta, char *tb, int *m, int *n, int *k, double *alpha,
                             double *a, int *lda, double *b, int *ldb, double *beta, double *c,
                             int *ldc);
typedef void (*opk_blas_set_fn)(int);
typedef int (*opk_blas_get_fn)(void);

#define OPK_MAXSTAT 8
/* input channels the direct path transposes at a time from NCHW (their rows held in `tmp`) */
#define OPK_CONV_TGROUP 16
/* unfolded bytes a block aims at: the block's matrix and result stay in the core's L2 */
#ifndef OPK_CONV_BLOCK_BYTES
#define OPK_CONV_BLOCK_BYTES (384 * 1024)
#endif

/* An operand of an epilogue or statistic kernel: its origin and byte strides over the logical
 * output dims (N, O, OH, OW), 0 where it is broadcast; the block operand is replaced by the
 * thread's result block. */
typedef struct {
    char *base;
    Py_ssize_t s[4];
    int code;
} opk_operand;

typedef struct {
    /* the convolution: x[N, C, H, W] (byte strides xs over the logical dims), the packed weights
     * (compute type: [KH*KW*C, O] for the micro-kernels and BLAS in NHWC, [O, C*KH*KW] for
     * BLAS in NCHW), the output's layout */
    Py_ssize_t N, C, H, W, O, KH, KW, OH, OW, stride, pad;
    int nhwc, ccode;
    const char *x;
    Py_ssize_t xs[4];
    int xcode;
    const char *wpack;
    void *gemm;                         /* BLAS sgemm/dgemm; NULL: the generated micro-kernels */
    char *wpk;                          /* direct: the weights in panels (set by opk_conv_run) */
    Py_ssize_t ld;                      /* direct: output channels per block row, panels padded */
    int cm;                             /* direct NCHW: channel-major tiles (opk_conv_direct) */
    opk_blas_set_fn blas_set;           /* the BLAS library's thread count, or NULL */
    opk_blas_get_fn blas_get;
    /* the epilogue: kernel `epi` over operands `ops` (inputs, then outputs), `slot` the input
     * that reads the block; without one (NULL) the raw result is stored to ops[1], ops[0] and
     * slot 0 standing for the block */
    const opk_kernel *epi;
    int nops, slot;
    opk_operand ops[OPK_MAXOPS];
    /* statistics: per-channel sums of the block (stat[i] NULL) or of what stat[i] computes
     * from it, into sums [nstat][O]; kept per block in `partials` [nblocks][nstat][O] first */
    int nstat;
    const opk_kernel *stat[OPK_MAXSTAT];
    double *sums;
    double *partials;
    int threads;
    Py_ssize_t rows;                    /* output rows per block (set by opk_conv_plan) */
    /* the weight gradient (opk_conv_dw_run): the output gradient (N, O, OH, OW) */
    const char *gy;
    Py_ssize_t gs[4];
    int gcode;
} opk_conv;

static inline Py_ssize_t opk_conv_k(const opk_conv *cv) { return cv->C * cv->KH * cv->KW; }

/* Element (p, o) of a block of P pixels is at p * ps + o * os: pixel-major in NHWC ([P][ld] for
 * the micro-kernels, [P][O] for BLAS), channel-major [O][P] in NCHW, the output's own order. */
static inline void opk_conv_block_strides(const opk_conv *cv, Py_ssize_t P, Py_ssize_t *ps,
                                          Py_ssize_t *os)
{
    if (cv->nhwc) { *ps = cv->gemm == NULL ? cv->ld : cv->O; *os = 1; }
    else { *ps = 1; *os = P; }
}

/* Output rows per block and the number of blocks: about OPK_CONV_BLOCK_BYTES of unfolded input
 * (BLAS), or of result and input rows (direct), per block; at least one row. */
static inline Py_ssize_t opk_conv_plan(opk_conv *cv)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode);
    Py_ssize_t per_row = opk_conv_k(cv) * cv->OW * cs;
    if (cv->N <= 0 || cv->OH <= 0 || cv->OW <= 0 || cv->O <= 0 || opk_conv_k(cv) <= 0) {
        cv->rows = 1;
        return 0;  /* the caller does not send empty problems; nothing to do if it does */
    }
    if (cv->gemm == NULL)  /* direct: the block's result (and its input rows) stay in L2 */
        per_row = (cv->ld + cv->stride * cv->stride * cv->C) * cv->OW * cs;
    Py_ssize_t rows = per_row > 0 ? OPK_CONV_BLOCK_BYTES / per_row : cv->OH;
    if (rows < 1) rows = 1;
    if (rows > cv->OH) rows = cv->OH;
    cv->rows = rows;
    return cv->N * opk_cdiv(cv->OH, rows);
}

/* The receptive fields of output rows [oh0, oh0 + rows) of image n, unfolded in the compute
 * type: NHWC as [P][KH][KW][C] (a pixel's window is one row of the matrix), NCHW as
 * [C][KH][KW][P] (each kernel tap is one row over the block's pixels); zeros in the padding. */
static void opk_im2col(const opk_conv *cv, Py_ssize_t n, Py_ssize_t oh0, Py_ssize_t rows,
                       char *cols)
{
    const int cc = cv->ccode;
    const Py_ssize_t cs = OPK_CSIZE(cc), C = cv->C, KH = cv->KH, KW = cv->KW, OW = cv->OW;
    const Py_ssize_t s = cv->stride, pad = cv->pad, P = rows * OW;
    const char *xn = cv->x + n * cv->xs[0];
    if (cv->nhwc) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            for (Py_ssize_t ow = 0; ow < OW; ow++) {
                char *dst = cols + (r * OW + ow) * KH * KW * C * cs;
                for (Py_ssize_t kh = 0; kh < KH; kh++) {
                    const Py_ssize_t ih = (oh0 + r) * s - pad + kh;
                    for (Py_ssize_t kw = 0; kw < KW; kw++, dst += C * cs) {
                        const Py_ssize_t iw = ow * s - pad + kw;
                        if (ih < 0 || ih >= cv->H || iw < 0 || iw >= cv->W)
                            memset(dst, 0, (size_t)(C * cs));
                        else
                            opk_load_c(cc, dst, xn + ih * cv->xs[2] + iw * cv->xs[3], cv->xs[1],
                                       cv->xcode, C);
                    }
                }
            }
        }
        return;
    }
    for (Py_ssize_t c = 0; c < C; c++) {
        for (Py_ssize_t kh = 0; kh < KH; kh++) {
            for (Py_ssize_t kw = 0; kw < KW; kw++) {
                char *dst = cols + ((c * KH + kh) * KW + kw) * P * cs;
                /* the output columns whose tap lands inside the input: [lo, hi) */
                Py_ssize_t lo = pad - kw > 0 ? (pad - kw + s - 1) / s : 0;
                Py_ssize_t hi = (cv->W - 1 + pad - kw) >= 0 ? (cv->W - 1 + pad - kw) / s + 1 : 0;
                if (hi > OW) hi = OW;
                if (lo > hi) lo = hi;
                for (Py_ssize_t r = 0; r < rows; r++, dst += OW * cs) {
                    const Py_ssize_t ih = (oh0 + r) * s - pad + kh;
                    if (ih < 0 || ih >= cv->H || lo == hi) {
                        memset(dst, 0, (size_t)(OW * cs));
                        continue;
                    }
                    memset(dst, 0, (size_t)(lo * cs));
                    opk_load_c(cc, dst + lo * cs, xn + c * cv->xs[1] + ih * cv->xs[2] +
                               (lo * s - pad + kw) * cv->xs[3], s * cv->xs[3], cv->xcode, hi - lo);
                    memset(dst + hi * cs, 0, (size_t)((OW - hi) * cs));
                }
            }
        }
    }
}

#ifdef OPK_GL_F
/* Input columns [jlo, jhi) of the padded rows hold x's columns [jlo - pad, jhi - pad); the
 * rest are zeros. */
static inline void opk_conv_cols(const opk_conv *cv, Py_ssize_t *jlo, Py_ssize_t *jhi)
{
    const Py_ssize_t Wp = (cv->OW - 1) * cv->stride + cv->KW;
    *jlo = cv->pad < Wp ? cv->pad : Wp;
    *jhi = cv->W + cv->pad < Wp ? cv->W + cv->pad : Wp;
    if (*jhi < *jlo) *jhi = *jlo;
}

/* The input rows output rows [oh0, oh0 + rows) of image n read, zero-padded, channels last, in
 * the compute type: [R][Wp][C], R = (rows - 1) * stride + KH, Wp = (OW - 1) * stride + KW, column
 * j being input column j - pad. `tmp` holds OPK_CONV_TGROUP channels' input rows (NCHW's
 * transpose). */
static void opk_conv_input(const opk_conv *cv, Py_ssize_t n, Py_ssize_t oh0, Py_ssize_t rows,
                           char *xin, char *tmp)
{
    const int cc = cv->ccode;
    const Py_ssize_t cs = OPK_CSIZE(cc), C = cv->C, s = cv->stride, pad = cv->pad;
    const Py_ssize_t R = (rows - 1) * s + cv->KH, Wp = (cv->OW - 1) * s + cv->KW;
    Py_ssize_t jlo, jhi;
    opk_conv_cols(cv, &jlo, &jhi);
    const Py_ssize_t nj = jhi - jlo;
    /* channels, then pixels, run on in memory: one load per row */
    const int packed = cv->xs[3] == C * cv->xs[1] || cv->C == 1 || nj <= 1;
    const char *xn = cv->x + n * cv->xs[0];
    /* unpadded rows that run on in memory (a matmul's matrix, a 1 x 1 window's image): one load */
    if (pad == 0 && Wp == cv->W && oh0 * s + R <= cv->H && cv->xs[1] != 0 &&
        (cv->W == 1 || cv->xs[3] == C * cv->xs[1]) && cv->xs[2] == cv->W * C * cv->xs[1]) {
        opk_load_c(cc, xin, xn + oh0 * s * cv->xs[2], cv->xs[1], cv->xcode, R * Wp * C);
        return;
    }
    for (Py_ssize_t r = 0; r < R; r++) {
        char *dst = xin + r * Wp * C * cs;
        const Py_ssize_t ih = oh0 * s - pad + r;
        if (ih < 0 || ih >= cv->H || nj == 0) {
            memset(dst, 0, (size_t)(Wp * C * cs));
            continue;
        }
        memset(dst, 0, (size_t)(jlo * C * cs));
        memset(dst + jhi * C * cs, 0, (size_t)((Wp - jhi) * C * cs));
        const char *src = xn + ih * cv->xs[2] + (jlo - pad) * cv->xs[3];
        if (packed) {
            opk_load_c(cc, dst + jlo * C * cs, src, C == 1 ? cv->xs[3] : cv->xs[1], cv->xcode, nj * C);
        } else {  /* channels apart (NCHW): rows of OPK_CONV_TGROUP channels, then transposed */
            for (Py_ssize_t c0 = 0; c0 < C; c0 += OPK_CONV_TGROUP) {
                const Py_ssize_t g = C - c0 < OPK_CONV_TGROUP ? C - c0 : OPK_CONV_TGROUP;
                for (Py_ssize_t c = 0; c < g; c++)
                    opk_load_c(cc, tmp + c * nj * cs, src + (c0 + c) * cv->xs[1], cv->xs[3],
                               cv->xcode, nj);
                if (cc == OPK_F64) {
                    double *d = (double *)dst + jlo * C + c0;
                    const double *t = (const double *)tmp;
                    for (Py_ssize_t j = 0; j < nj; j++)
                        for (Py_ssize_t c = 0; c < g; c++) d[j * C + c] = t[c * nj + j];
                } else {
                    float *d = (float *)dst + jlo * C + c0;
                    const float *t = (const float *)tmp;
                    for (Py_ssize_t j = 0; j < nj; j++)
                        for (Py_ssize_t c = 0; c < g; c++) d[j * C + c] = t[c * nj + j];
                }
            }
        }
    }
}

/* opk_conv_input's rows channel-major, [C][R][Wp], for channel-major tiles */
static void opk_conv_input_cm(const opk_conv *cv, Py_ssize_t n, Py_ssize_t oh0, Py_ssize_t rows,
                              char *xin)
{
    const int cc = cv->ccode;
    const Py_ssize_t cs = OPK_CSIZE(cc), s = cv->stride, pad = cv->pad;
    const Py_ssize_t R = (rows - 1) * s + cv->KH, Wp = (cv->OW - 1) * s + cv->KW;
    Py_ssize_t jlo, jhi;
    opk_conv_cols(cv, &jlo, &jhi);
    const Py_ssize_t nj = jhi - jlo;
    const char *xn = cv->x + n * cv->xs[0];
    for (Py_ssize_t c = 0; c < cv->C; c++) {
        for (Py_ssize_t r = 0; r < R; r++) {
            char *dst = xin + (c * R + r) * Wp * cs;
            const Py_ssize_t ih = oh0 * s - pad + r;
            if (ih < 0 || ih >= cv->H || nj == 0) {
                memset(dst, 0, (size_t)(Wp * cs));
                continue;
            }
            memset(dst, 0, (size_t)(jlo * cs));
            memset(dst + jhi * cs, 0, (size_t)((Wp - jhi) * cs));
            opk_load_c(cc, dst + jlo * cs, xn + c * cv->xs[1] + ih * cv->xs[2] + (jlo - pad) * cv->xs[3],
                       cv->xs[3], cv->xcode, nj);
        }
    }
}

/* The block's raw result from the padded input rows, on register tiles:
 *  - pixel-major (NHWC, or NCHW where channel-major tiles do not fit): tiles of up to `mr`
 *    pixels (each with its own row pointer, so a tile may span output rows) by one panel of
 *    output channels, panel by panel so a panel's weights stay in cache across the block;
 *  - channel-major (NCHW, stride 1, output rows a whole number of vectors: cv->cm): tiles of
 *    output channels by a run of pixels of one output row, the input rows channel-major
 *    ([C][R][Wp]), the weights [O][KH * KW * C]; stored as the NCHW block [O][P]. */
#define OPK_CONV_DIRECT(tag, ctype, L, NVMAX)                                                      \
static void opk_conv_direct_##tag(const opk_conv *cv, const char *xin, Py_ssize_t hs,             \
                                  Py_ssize_t ws, char *res, Py_ssize_t rows)                       \
{                                                                                                  \
    const Py_ssize_t C = cv->C, s = cv->stride, OW = cv->OW, K = opk_conv_k(cv), O = cv->O;        \
    const Py_ssize_t Wp = (OW - 1) * s + cv->KW, P = rows * OW, nrmax = (NVMAX) * (L);             \
    const Py_ssize_t R = (rows - 1) * s + cv->KH, ntap = cv->KH * cv->KW;                          \
    Py_ssize_t toff[ntap], boff[ntap];                                                             \
    const ctype *a[OPK_GEMM_MAXROWS];                                                              \
    if (cv->cm) {                                                                                  \
        for (Py_ssize_t t = 0; t < ntap; t++) {                                                    \
            toff[t] = t * C;                                                                       \
            boff[t] = (t / cv->KW) * Wp + t % cv->KW;                                              \
        }                                                                                          \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                    \
            for (Py_ssize_t ow0 = 0; ow0 < OW; ow0 += nrmax) {                                     \
                const int nv = (int)((OW - ow0 < nrmax ? OW - ow0 : nrmax) / (L));                 \
                int mr = 0;                                                                        \
                while (mr < OPK_GEMM_MAXROWS && opk_ukrs_##tag[nv][mr + 1] != NULL) mr++;          \
                const ctype *b = (const ctype *)xin + r * Wp + ow0;                                \
                for (Py_ssize_t o0 = 0; o0 < O; o0 += mr) {                                        \
                    const int m = O - o0 < mr ? (int)(O - o0) : mr;                                \
                    for (int i = 0; i < m; i++) a[i] = (const ctype *)cv->wpk + (o0 + i) * K;      \
                    opk_ukrs_##tag[nv][m](a, toff, (int)ntap, C, 1, b, boff, R * Wp,               \
                                          (ctype *)res + o0 * P + r * OW + ow0, P, 1, 0);          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        return;                                                                                    \
    }                                                                                              \
    for (Py_ssize_t t = 0; t < ntap; t++) toff[t] = (t / cv->KW) * hs + (t % cv->KW) * ws;        \
    for (Py_ssize_t o0 = 0; o0 < O; o0 += nrmax) {                                                 \
        const int nv = (int)opk_cdiv(O - o0 < nrmax ? O - o0 : nrmax, (L));                        \
        const Py_ssize_t nr = (Py_ssize_t)nv * (L);                                                \
        int mr = 0;                                                                                \
        while (mr < OPK_GEMM_MAXROWS && opk_ukrs_##tag[nv][mr + 1] != NULL) mr++;                  \
        for (Py_ssize_t t = 0; t < ntap; t++) boff[t] = t * C * nr;                                \
        const ctype *b = (const ctype *)cv->wpk + K * o0;                                          \
        for (Py_ssize_t p = 0; p < P; p += mr) {                                                   \
            const int m = P - p < mr ? (int)(P - p) : mr;                                          \
            for (int i = 0; i < m; i++) {                                                          \
                const Py_ssize_t r = (p + i) / OW, ow = (p + i) % OW;                              \
                a[i] = (const ctype *)xin + r * s * hs + ow * s * ws;                              \
            }                                                                                      \
            if (cv->nhwc)                                                                          \
                opk_ukrs_##tag[nv][m](a, toff, (int)ntap, C, 1, b, boff, nr,                       \
                                      (ctype *)res + p * cv->ld + o0, cv->ld, 1, 0);               \
            else                                                                                   \
                opk_ukrs_##tag[nv][m](a, toff, (int)ntap, C, 1, b, boff, nr,                       \
                                      (ctype *)res + o0 * P + p, 1, P, 0);                         \
        }                                                                                          \
    }                                                                                              \
}
OPK_CONV_DIRECT(f, float, OPK_GL_F, OPK_GNV_F)
OPK_CONV_DIRECT(d, double, OPK_GL_D, OPK_GNV_D)

/* A block row's width: the output channels in panels of up to NVMAX vectors, the last padded
 * to whole vectors. */
static Py_ssize_t opk_conv_width(const opk_conv *cv)
{
    const int dbl = cv->ccode == OPK_F64;
    const Py_ssize_t L = dbl ? OPK_GL_D : OPK_GL_F, nrmax = L * (dbl ? OPK_GNV_D : OPK_GNV_F);
    const Py_ssize_t last = cv->O > 0 ? (cv->O - 1) / nrmax * nrmax : 0;
    return last + opk_cdiv(cv->O - last, L) * L;
}

/* The weights [K][O] in panels of up to NVMAX vectors of output channels, [panel][K][nr], zeros
 * past O (channel-major tiles: [O][K]), aligned for vector loads; sets ld and cm. NULL when
 * memory cannot be had. */
static char *opk_conv_panels(opk_conv *cv)
{
    const int dbl = cv->ccode == OPK_F64;
    const Py_ssize_t L = dbl ? OPK_GL_D : OPK_GL_F, nrmax = L * (dbl ? OPK_GNV_D : OPK_GNV_F);
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), K = opk_conv_k(cv), O = cv->O;
    cv->ld = opk_conv_width(cv);
    cv->cm = !cv->nhwc && cv->stride == 1 && cv->OW % L == 0;
    char *raw = (char *)PyMem_RawMalloc((size_t)(K * cv->ld * cs) + 128);
    if (raw == NULL) return NULL;
    char *wpk = raw + (128 - ((size_t)raw & 63));  /* aligned for vector loads; raw kept before */
    ((char **)wpk)[-1] = raw;
    if (cv->cm) {  /* [O][K]: a tile's rows are output channels */
        for (Py_ssize_t o = 0; o < O; o++)
            for (Py_ssize_t k = 0; k < K; k++)
                memcpy(wpk + (o * K + k) * cs, cv->wpack + (k * O + o) * cs, (size_t)cs);
        return wpk;
    }
    for (Py_ssize_t o0 = 0; o0 < O; o0 += nrmax) {
        const Py_ssize_t w = O - o0 < nrmax ? O - o0 : nrmax, nr = opk_cdiv(w, L) * L;
        for (Py_ssize_t k = 0; k < K; k++) {
            char *dst = wpk + (K * o0 + k * nr) * cs;
            memcpy(dst, cv->wpack + (k * O + o0) * cs, (size_t)(w * cs));
            memset(dst + w * cs, 0, (size_t)((nr - w) * cs));
        }
    }
    return wpk;
}
#endif

/* res = the block's raw result: NHWC [P][O], NCHW [O][P] (row-major, compute type) */
static void opk_conv_gemm(const opk_conv *cv, const char *cols, char *res, Py_ssize_t P)
{
    int m, nn, k = (int)opk_conv_k(cv), lda, ldb, ldc;
    char t = 'N';
    const char *a, *b;
    if (cv->nhwc) {  /* column-major res^T[O][P] = W^T[O][K] cols^T[K][P] */
        m = (int)cv->O; nn = (int)P; a = cv->wpack; lda = m; b = cols; ldb = k; ldc = m;
    } else {         /* column-major res^T[P][O] = cols^T[P][K] W^T[K][O] */
        m = (int)P; nn = (int)cv->O; a = cols; lda = m; b = cv->wpack; ldb = k; ldc = m;
    }
    if (cv->ccode == OPK_F64) {
        double one = 1.0, zero = 0.0;
        ((opk_dgemm_fn)cv->gemm)(&t, &t, &m, &nn, &k, &one, (double *)a, &lda, (double *)b, &ldb,
                                 &zero, (double *)res, &ldc);
    } else {
        float one = 1.0f, zero = 0.0f;
        ((opk_sgemm_fn)cv->gemm)(&t, &t, &m, &nn, &k, &one, (float *)a, &lda, (float *)b, &ldb,
                                 &zero, (float *)res, &ldc);
    }
}

/* A kernel over the block [rows][OW][O] (NHWC) or [O][rows][OW] (NCHW): a geometry of three
 * dims, neighbours merged where every operand runs on contiguously, walked by opk_walk. */
static int opk_conv_walk(const opk_conv *cv, const opk_kernel *k, int nops, int nout,
                         const opk_operand *ops, int slot, char *block, char *const *spread,
                         Py_ssize_t n, Py_ssize_t oh0, Py_ssize_t rows)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), P = rows * cv->OW;
    /* dims outer to inner, as logical indexes into s[]: 0 N, 1 O, 2 OH, 3 OW */
    const int order[2][3] = {{1, 2, 3}, {2, 3, 1}};
    const int *dims = order[cv->nhwc ? 1 : 0];
    Py_ssize_t size[4] = {1, cv->O, rows, cv->OW};
    Py_ssize_t g[OPK_G_SHAPE + 3 + OPK_MAXOPS * 3 + OPK_MAXOPS];
    Py_ssize_t st[OPK_MAXOPS][4];
    char *base[OPK_MAXOPS];
    Py_ssize_t ps, os;
    opk_conv_block_strides(cv, P, &ps, &os);
    for (int o = 0; o < nops; o++) {
        if (o == slot || spread[o] != NULL) {  /* laid out as the block */
            st[o][0] = 0;
            st[o][1] = os * cs;
            st[o][3] = ps * cs;
            st[o][2] = st[o][3] * cv->OW;
            base[o] = o == slot ? block : spread[o];
        } else {
            for (int d = 0; d < 4; d++) st[o][d] = ops[o].s[d];
            base[o] = ops[o].base + n * ops[o].s[0] + oh0 * ops[o].s[2];
        }
    }
    /* merge dims from the inside out where every operand is contiguous across them */
    Py_ssize_t shape[3], strides[OPK_MAXOPS][3];
    int nd = 0;
    for (int i = 2; i >= 0; i--) {
        const int d = dims[i];
        int merge = nd > 0;
        for (int o = 0; merge && o < nops; o++)
            merge = st[o][d] == strides[o][nd - 1] * shape[nd - 1];
        if (merge) {  /* the inner stride steps through both */
            shape[nd - 1] *= size[d];
        } else {
            shape[nd] = size[d];
            for (int o = 0; o < nops; o++) strides[o][nd] = st[o][d];
            nd++;
        }
    }
    /* the geometry lists dims outer first */
    g[OPK_G_NDIM] = nd; g[OPK_G_NOPS] = nops; g[OPK_G_NOUT] = nout; g[OPK_G_TDIM] = -1;
    g[OPK_G_CCODE] = cv->ccode;
    Py_ssize_t total = 1;
    for (int i = 0; i < nd; i++) {
        g[OPK_G_SHAPE + i] = shape[nd - 1 - i];
        total *= shape[nd - 1 - i];
    }
    for (int o = 0; o < nops; o++) {
        for (int i = 0; i < nd; i++) g[OPK_G_SHAPE + nd + o * nd + i] = strides[o][nd - 1 - i];
        g[OPK_G_SHAPE + nd + nops * nd + o] = o == slot || spread[o] != NULL ? cv->ccode : ops[o].code;
    }
    return opk_walk(0, total, g, base, k);
}

/* the per-channel sums of a block of values (compute type, laid out as the block), in block
 * order */
static void opk_conv_sums(const opk_conv *cv, const char *v, Py_ssize_t P, double *acc)
{
    const Py_ssize_t O = cv->O;
    Py_ssize_t ps, os;
    opk_conv_block_strides(cv, P, &ps, &os);
    for (Py_ssize_t o = 0; o < O; o++) acc[o] = 0.0;
    if (cv->ccode == OPK_F64) {
        const double *d = (const double *)v;
        if (os == 1) { for (Py_ssize_t p = 0; p < P; p++) for (Py_ssize_t o = 0; o < O; o++) acc[o] += d[p * ps + o]; }
        else { for (Py_ssize_t o = 0; o < O; o++) { double t = 0; for (Py_ssize_t p = 0; p < P; p++) t += d[o * os + p]; acc[o] = t; } }
    } else {
        const float *f = (const float *)v;
        if (os == 1) { for (Py_ssize_t p = 0; p < P; p++) for (Py_ssize_t o = 0; o < O; o++) acc[o] += f[p * ps + o]; }
        else { for (Py_ssize_t o = 0; o < O; o++) { double t = 0; for (Py_ssize_t p = 0; p < P; p++) t += f[o * os + p]; acc[o] = t; } }
    }
}

/* the raw result stored as it is (converted to the destination's dtype by the walker) */
static void opk_conv_copy_f(Py_ssize_t n, char *const *p, const void *ctx)
{
    (void)ctx;
    memcpy(p[1], p[0], (size_t)n * 4);
}

static void opk_conv_copy_d(Py_ssize_t n, char *const *p, const void *ctx)
{
    (void)ctx;
    memcpy(p[1], p[0], (size_t)n * 8);
}

/* NHWC: a per-channel input (a bias, a scale) repeated over a block's pixels once per thread, in
 * the compute type, so every operand of the epilogue runs on contiguously through the whole
 * block and the kernel sees one long run instead of one call per pixel. NULL where not needed
 * (NCHW takes per-channel values as one scalar per row); -1 when memory cannot be had. */
static int opk_conv_spread(const opk_conv *cv, const opk_kernel *epi, Py_ssize_t Pmax,
                           char **spread)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), O = cv->O;
    Py_ssize_t ps, os;
    opk_conv_block_strides(cv, Pmax, &ps, &os);
    for (int o = 0; o < OPK_MAXOPS; o++) spread[o] = NULL;
    if (!cv->nhwc || cv->epi == NULL || os != 1) return 0;
    for (int o = 0; o < epi->nin; o++) {
        const opk_operand *op = cv->ops + o;
        if (o == cv->slot || op->s[0] || op->s[2] || op->s[3] || !op->s[1]) continue;
        spread[o] = (char *)PyMem_RawMalloc((size_t)(Pmax * ps * cs) + 64);
        if (spread[o] == NULL) return -1;
        memset(spread[o], 0, (size_t)(ps * cs));
        opk_load_c(cv->ccode, spread[o], op->base, op->s[1], op->code, O);
        for (Py_ssize_t p = 1; p < Pmax; p++)
            memcpy(spread[o] + p * ps * cs, spread[o], (size_t)(ps * cs));
    }
    return 0;
}

/* One thread's blocks [b0, b1): -1 when its buffers cannot be had. */
static int opk_conv_part(const opk_conv *cv, Py_ssize_t b0, Py_ssize_t b1)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), K = opk_conv_k(cv);
    const Py_ssize_t per_image = opk_cdiv(cv->OH, cv->rows), Pmax = cv->rows * cv->OW;
    const int direct = cv->gemm == NULL;
    /* unpadded input in the compute type, channels adjacent: the tiles read it where it is */
    const int inplace = direct && !cv->cm && cv->pad == 0 && cv->xcode == cv->ccode &&
                        cv->xs[1] == cs && cv->xs[2] % cs == 0 && cv->xs[3] % cs == 0 &&
                        (cv->OH - 1) * cv->stride + cv->KH <= cv->H &&
                        (cv->OW - 1) * cv->stride + cv->KW <= cv->W;
    /* the block's result; direct: its padded input rows (none when read in place) and
     * OPK_CONV_TGROUP channels' rows, else its unfolded matrix */
    const Py_ssize_t width = direct ? cv->ld : cv->O;
    const Py_ssize_t incols = !direct ? K * Pmax : inplace ? 0 :
        ((cv->rows - 1) * cv->stride + cv->KH) * ((cv->OW - 1) * cv->stride + cv->KW) * cv->C +
        OPK_CONV_TGROUP * cv->W;
    char *cols = (char *)PyMem_RawMalloc((size_t)(incols * cs) + 64);
    char *res = (char *)PyMem_RawMalloc((size_t)(width * Pmax * cs) + 64);
    char *tmp = cv->nstat ? (char *)PyMem_RawMalloc((size_t)(width * Pmax * cs) + 64) : NULL;
    int failed = cols == NULL || res == NULL || (cv->nstat && tmp == NULL);
    /* without an epilogue the walk copies the block to ops[1] (ops[0] stands for the block) */
    opk_kernel copy = {.tile = cv->ccode == OPK_F64 ? opk_conv_copy_d : opk_conv_copy_f,
                       .nin = 1, .nops = 2, .ccode = cv->ccode, .tile_len = 1024};
    const opk_kernel *epi = cv->epi != NULL ? cv->epi : &copy;
    char *spread[OPK_MAXOPS];
    failed |= opk_conv_spread(cv, epi, Pmax, spread) != 0;
    for (Py_ssize_t b = b0; b < b1 && !failed; b++) {
        const Py_ssize_t n = b / per_image, oh0 = (b % per_image) * cv->rows;
        const Py_ssize_t rows = cv->OH - oh0 < cv->rows ? cv->OH - oh0 : cv->rows, P = rows * cv->OW;
        if (direct) {
#ifdef OPK_GL_F
            const char *xin = cols;
            Py_ssize_t hs = ((cv->OW - 1) * cv->stride + cv->KW) * cv->C, ws = cv->C;
            if (cv->cm) {
                opk_conv_input_cm(cv, n, oh0, rows, cols);
            } else if (inplace) {  /* the tiles read x itself */
                xin = cv->x + n * cv->xs[0] + oh0 * cv->stride * cv->xs[2];
                hs = cv->xs[2] / cs;
                ws = cv->xs[3] / cs;
            } else {  /* OPK_CONV_TGROUP channels' rows after the padded rows */
                opk_conv_input(cv, n, oh0, rows, cols, cols + (incols - OPK_CONV_TGROUP * cv->W) * cs);
            }
            if (cv->ccode == OPK_F64) opk_conv_direct_d(cv, xin, hs, ws, res, rows);
            else opk_conv_direct_f(cv, xin, hs, ws, res, rows);
#endif
        } else {
            opk_im2col(cv, n, oh0, rows, cols);
            opk_conv_gemm(cv, cols, res, P);
        }
        for (int i = 0; i < cv->nstat; i++) {
            const char *v = res;
            if (cv->stat[i] != NULL) {  /* the summand, elementwise from the block */
                char *p[2] = {res, tmp};
                cv->stat[i]->tile((cv->nhwc ? width : cv->O) * P, p, cv->stat[i]->ctx);
                v = tmp;
            }
            opk_conv_sums(cv, v, P, cv->partials + (b * cv->nstat + i) * cv->O);
        }
        failed |= opk_conv_walk(cv, epi, cv->nops, cv->nops - epi->nin, cv->ops, cv->slot, res,
                                spread, n, oh0, rows) != 0;
    }
    for (int o = 0; o < OPK_MAXOPS; o++)
        if (spread[o] != NULL) PyMem_RawFree(spread[o]);
    PyMem_RawFree(cols);
    PyMem_RawFree(res);
    if (tmp) PyMem_RawFree(tmp);
    return failed ? -1 : 0;
}

/* Run the fused convolution over `threads` OpenMP threads (static split of the blocks); -1:
 * out of memory. */
static int opk_conv_run(opk_conv *cv)
{
    const Py_ssize_t per = cv->nstat * cv->O;
    for (Py_ssize_t i = 0; i < per; i++) cv->sums[i] = 0.0;
    cv->wpk = NULL;
    cv->cm = 0;
    if (cv->gemm == NULL) {
#ifdef OPK_GL_F
        if (cv->N > 0 && cv->OH > 0 && cv->OW > 0 && cv->O > 0 && opk_conv_k(cv) > 0 &&
            (cv->wpk = opk_conv_panels(cv)) == NULL)
            return -1;
#else
        return -1;  /* not reached: a module without micro-kernels passes its BLAS */
#endif
    }
    const Py_ssize_t nb = opk_conv_plan(cv);
    int nt = cv->threads < 1 ? 1 : cv->threads, failed = 0;
    if (nt > nb) nt = (int)(nb > 0 ? nb : 1);
    cv->partials = per && nb ? (double *)PyMem_RawMalloc((size_t)(nb * per) * sizeof(double)) : NULL;
    if (nb == 0 || (per && cv->partials == NULL)) {
        if (cv->wpk) PyMem_RawFree(((char **)cv->wpk)[-1]);
        return nb == 0 ? 0 : -1;
    }
    /* every GEMM runs on the thread that calls it: BLAS's own pool stays asleep for the call */
    const int blas_before = cv->blas_set != NULL && cv->blas_get != NULL ? cv->blas_get() : 0;
    if (blas_before > 1) cv->blas_set(1);
    if (nt <= 1) {
        failed = opk_conv_part(cv, 0, nb);
    } else {
#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: failed)
        for (int t = 0; t < nt; t++)
            failed |= opk_conv_part(cv, nb * t / nt, nb * (t + 1) / nt);
    }
    if (blas_before > 1) cv->blas_set(blas_before);
    for (Py_ssize_t b = 0; b < nb && !failed; b++)   /* in block order, whatever the threads */
        for (Py_ssize_t i = 0; i < per; i++) cv->sums[i] += cv->partials[b * per + i];
    if (cv->partials) PyMem_RawFree(cv->partials);
    if (cv->wpk) PyMem_RawFree(((char **)cv->wpk)[-1]);
    return failed ? -1 : 0;
}

#ifdef OPK_GL_F
/* ---------------------------------------------------------------- the weight gradient */

/* dw[t][c][o] = sum over output pixels p of x's value at channel c under tap t of p's window,
 * times gy[p][o]: per block of output rows, the input rows as the forward reads them and the
 * block's gy as [P][O]; register tiles of input channels x output channels run over the block's
 * pixels (the tap's input column advancing by stride * C per pixel), adding into a partial. */
#define OPK_CONV_DW(tag, ctype, L, NVMAX)                                                          \
static void opk_conv_dw_block_##tag(const opk_conv *cv, const char *xin, const char *gblk,        \
                                    Py_ssize_t rows, char *part)                                   \
{                                                                                                  \
    const Py_ssize_t C = cv->C, s = cv->stride, OW = cv->OW, O = cv->O, nrmax = (NVMAX) * (L);    \
    const Py_ssize_t Wp = (OW - 1) * s + cv->KW;                                                   \
    Py_ssize_t roff[rows], boff[rows];                                                             \
    for (Py_ssize_t r = 0; r < rows; r++) {                                                        \
        roff[r] = r * s * Wp * C;                                                                  \
        boff[r] = r * OW * O;                                                                      \
    }                                                                                              \
    for (Py_ssize_t t = 0; t < cv->KH * cv->KW; t++) {                                             \
        const Py_ssize_t tap = ((t / cv->KW) * Wp + t % cv->KW) * C;                               \
        for (Py_ssize_t o0 = 0; o0 < O; o0 += nrmax) {                                             \
            const int nv = (int)opk_cdiv(O - o0 < nrmax ? O - o0 : nrmax, (L));                    \
            int mr = 0;                                                                            \
            while (mr < OPK_GEMM_MAXROWS && opk_ukrs_##tag[nv][mr + 1] != NULL) mr++;              \
            for (Py_ssize_t c0 = 0; c0 < C; c0 += mr) {                                            \
                const int m = C - c0 < mr ? (int)(C - c0) : mr;                                    \
                const ctype *a[OPK_GEMM_MAXROWS];                                                  \
                for (int i = 0; i < m; i++) a[i] = (const ctype *)xin + tap + c0 + i;              \
                opk_ukrs_##tag[nv][m](a, roff, (int)rows, OW, s * C, (const ctype *)gblk + o0,     \
                                      boff, O,                                                     \
                                      (ctype *)part + (t * C + c0) * cv->ld + o0, cv->ld, 1, 1);   \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
}
OPK_CONV_DW(f, float, OPK_GL_F, OPK_GNV_F)
OPK_CONV_DW(d, double, OPK_GL_D, OPK_GNV_D)

/* partial sums of the weight gradient: a fixed number of them whatever the thread count (so the
 * result does not depend on it), within this many bytes */
#define OPK_DW_CHUNKS 8
#define OPK_DW_PARTIAL_BYTES (64 << 20)

/* One chunk of blocks [b0, b1) into its partial [KH*KW*C][ld] (zeroed here); -1: no memory. */
static int opk_conv_dw_chunk(const opk_conv *cv, Py_ssize_t b0, Py_ssize_t b1, char *part)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), per_image = opk_cdiv(cv->OH, cv->rows);
    const Py_ssize_t Pmax = cv->rows * cv->OW, wide = cv->W > cv->OW ? cv->W : cv->OW;
    const Py_ssize_t xn = ((cv->rows - 1) * cv->stride + cv->KH) *
                          ((cv->OW - 1) * cv->stride + cv->KW) * cv->C;
    char *xin = (char *)PyMem_RawMalloc((size_t)(xn * cs) + 64);
    /* gy's block, with a vector's room past its end: the last panel's loads run over O */
    char *gblk = (char *)PyMem_RawMalloc((size_t)((Pmax * cv->O + cv->ld) * cs) + 64);
    char *tmp = (char *)PyMem_RawMalloc((size_t)(OPK_CONV_TGROUP * wide * cs) + 64);
    int failed = xin == NULL || gblk == NULL || tmp == NULL;
    opk_conv g = *cv;  /* gy read as an input: O channels, OH x OW, a 1 x 1 window */
    g.x = cv->gy; g.xcode = cv->gcode; g.C = cv->O; g.H = cv->OH; g.W = cv->OW;
    g.KH = g.KW = 1; g.stride = 1; g.pad = 0;
    for (int d = 0; d < 4; d++) g.xs[d] = cv->gs[d];
    if (!failed) {
        memset(part, 0, (size_t)(opk_conv_k(cv) * cv->ld * cs));
        memset(gblk + Pmax * cv->O * cs, 0, (size_t)(cv->ld * cs));
    }
    for (Py_ssize_t b = b0; b < b1 && !failed; b++) {
        const Py_ssize_t n = b / per_image, oh0 = (b % per_image) * cv->rows;
        const Py_ssize_t rows = cv->OH - oh0 < cv->rows ? cv->OH - oh0 : cv->rows;
        opk_conv_input(cv, n, oh0, rows, xin, tmp);
        opk_conv_input(&g, n, oh0, rows, gblk, tmp);
        if (cv->ccode == OPK_F64) opk_conv_dw_block_d(cv, xin, gblk, rows, part);
        else opk_conv_dw_block_f(cv, xin, gblk, rows, part);
    }
    PyMem_RawFree(xin);
    PyMem_RawFree(gblk);
    PyMem_RawFree(tmp);
    return failed ? -1 : 0;
}

/* The weight gradient into dw [KH*KW*C][O] (compute type), over `threads` OpenMP threads;
 * -1: out of memory. */
static int opk_conv_dw_run(opk_conv *cv, char *dw)
{
    const Py_ssize_t cs = OPK_CSIZE(cv->ccode), K = opk_conv_k(cv), O = cv->O;
    memset(dw, 0, (size_t)(K * O * cs));
    if (cv->N <= 0 || cv->OH <= 0 || cv->OW <= 0 || O <= 0 || K <= 0) return 0;
    cv->gemm = NULL;
    cv->cm = 0;
    cv->ld = opk_conv_width(cv);
    const Py_ssize_t nb = opk_conv_plan(cv), each = K * cv->ld * cs;
    const Py_ssize_t fit = OPK_DW_PARTIAL_BYTES / each > 0 ? OPK_DW_PARTIAL_BYTES / each : 1;
    Py_ssize_t nc = OPK_DW_CHUNKS;
    if (nc > nb) nc = nb;
    if (nc > fit) nc = fit;
    char *parts = (char *)PyMem_RawMalloc((size_t)(nc * each) + 64);
    if (parts == NULL) return -1;
    int nt = cv->threads < 1 ? 1 : cv->threads, failed = 0;
    if (nt > nc) nt = (int)nc;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: failed) if (nt > 1)
    for (Py_ssize_t c = 0; c < nc; c++)
        failed |= opk_conv_dw_chunk(cv, nb * c / nc, nb * (c + 1) / nc, parts + c * each);
    for (Py_ssize_t c = 0; c < nc && !failed; c++) {   /* in chunk order, whatever the threads */
        for (Py_ssize_t k = 0; k < K; k++) {
            if (cv->ccode == OPK_F64) {
                const double *p = (const double *)(parts + c * each) + k * cv->ld;
                double *d = (double *)dw + k * O;
                for (Py_ssize_t o = 0; o < O; o++) d[o] += p[o];
            } else {
                const float *p = (const float *)(parts + c * each) + k * cv->ld;
                float *d = (float *)dw + k * O;
                for (Py_ssize_t o = 0; o < O; o++) d[o] += p[o];
            }
        }
    }
    PyMem_RawFree(parts);
    return failed ? -1 : 0;
}
#endif

#endif /* OPKIT_CONV_H */
