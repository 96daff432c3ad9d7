# What every generated kernel module cimports: the C support header's declarations and the
# small Cython helpers that are the same for every operator (templates/opkit_kernel.h holds the
# machinery itself). The module defines the dtype codes before this is included.

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t

cdef extern from "opkit_kernel.h" nogil:
    ctypedef float* opk_fp
    ctypedef const float* opk_cfp
    ctypedef double* opk_dp
    ctypedef const double* opk_cdp
    ctypedef int32_t* opk_ip
    ctypedef const int32_t* opk_cip
    ctypedef int64_t* opk_lp
    ctypedef const int64_t* opk_clp
    ctypedef void (*opk_tile_fn)(Py_ssize_t, char* const*, const void*) noexcept nogil
    enum: OPK_MAXOPS
    ctypedef struct opk_ntw:
        pass
    ctypedef struct opk_hsums:
        float* f[OPK_MAXOPS]
        double* acc[OPK_MAXOPS]
        Py_ssize_t rows
        double* ls[OPK_MAXOPS]
    ctypedef struct opk_hacc:
        pass
    ctypedef struct opk_hlanes:
        pass
    ctypedef void (*opk_htile_fn)(Py_ssize_t, char* const*, const void*, opk_ntw*, int, opk_hsums*) noexcept nogil
    ctypedef int (*opk_rows_fn)(Py_ssize_t, Py_ssize_t, char* const*, const Py_ssize_t*, int, const void*) noexcept nogil
    enum: OPK_MAXACC
    enum: OPK_HBLOCK
    ctypedef struct opk_kernel:
        opk_tile_fn tile
        opk_rows_fn rows
        const void* ctx
        int nin, nops, ccode
        Py_ssize_t tile_len
        int stream
        int nacc
        int acc_src[OPK_MAXACC]
        double* acc_out[OPK_MAXACC]
        Py_ssize_t acc_len[OPK_MAXACC]
        int acc_lanes[OPK_MAXACC]
        int acc_fblock
        opk_htile_fn htile
        opk_htile_fn htile_f
        uint64_t discard
    void opk_h2f_full(float* d, const uint16_t* s)
    void opk_f2h_full(uint16_t* d, const float* s)
    void opk_ntw_put(opk_ntw* w, const float* s)
    void opk_ntw_end(opk_ntw* w)
    void opk_hacc_load(opk_hacc* a, const float* f)
    void opk_hacc_store(const opk_hacc* a, float* f)
    void opk_hacc_add(opk_hacc* a, const float* g)
    void opk_hacc_flush(opk_hacc* a, double* acc)
    void opk_hlanes_load(opk_hlanes* h, const double* s)
    void opk_hlanes_store(const opk_hlanes* h, double* s)
    void opk_hlanes_add(opk_hlanes* h, const float* g)
    enum: OPK_FROWS
    const float* opk_hin(float* e, const char* p, Py_ssize_t i, int is_float)
    void opk_hin_last(float* t, const char* p, Py_ssize_t i, Py_ssize_t w, int is_float)
    void opk_hout(char* d, Py_ssize_t i, const float* g, const opk_ntw* w, opk_ntw* wl)
    void opk_hout_f(char* f, char* d, Py_ssize_t i, const float* g, const opk_ntw* w, opk_ntw* wl,
                    int hk, opk_hacc* sa, opk_hlanes* sl)
    void opk_hout_last(char* f, char* d, Py_ssize_t i, Py_ssize_t m, const float* u, const opk_ntw* w,
                       opk_ntw* wl)
    int opk_hsum_load(const opk_hsums* hs, int o, opk_hacc* sa, opk_hlanes* sl)
    void opk_hsum_store(opk_hsums* hs, int o, int hk, const opk_hacc* sa, const opk_hlanes* sl)
    int opk_hrow(Py_ssize_t* rows)
    void opk_hflush(int hk, opk_hacc* sa, double* acc)
    void opk_h2f_block(float* d, const uint16_t* s, Py_ssize_t w)
    void opk_f2f_block(float* d, const float* s, Py_ssize_t w)
    void opk_clamp_block(float* v, float lo, float hi, Py_ssize_t n)
    void opk_f2h_contig(uint16_t* d, const float* s, Py_ssize_t w)
    int OPK_F16, OPK_F32, OPK_F64, OPK_I8, OPK_I16, OPK_I32, OPK_I64, OPK_BF16, OPK_F16_HW
    int32_t opk_qmul_i(int32_t x, int32_t m, int bits)
    int64_t opk_qmul_l(int64_t x, int64_t m, int bits)
    bint opk_overflows_f(double v)
    bint opk_vanishes_f(double v)
    int opk_run(const Py_ssize_t* g, char** base, const opk_kernel* k, int available,
                Py_ssize_t threshold, int max_threads)
    int opk_run_flat(Py_ssize_t n, char** ptr, const Py_ssize_t* step, const int* code,
                     const opk_kernel* k, int available, Py_ssize_t threshold, int max_threads)


cdef inline opk_kernel opk_make(opk_tile_fn tile, opk_rows_fn rows, const void* ctx, int nin, int nops, int ccode,
                                Py_ssize_t tile_len, bint stream) noexcept nogil:
    cdef opk_kernel k
    k.tile, k.rows, k.ctx = tile, rows, ctx
    k.nin, k.nops, k.ccode, k.tile_len, k.stream = nin, nops, ccode, tile_len, stream
    k.nacc, k.acc_fblock, k.htile, k.htile_f, k.discard = 0, 0, NULL, NULL, 0
    return k


cdef inline int opk_fold_sums(opk_kernel* k, tuple sources, tuple outs, tuple lanes,
                              bint fblock) except -1:
    """Sums folded into the kernel's pass: `sources` are the operand indexes of the outputs
    they add up, `outs` the float64 arrays (C order) they are added up into, `lanes` whether
    each one's partials are kept as lanes (opk_lanes), `fblock` whether float32 lanes add
    blocks first (float16 data). The operands after the outputs lay out each sum's partials for
    the walk (C order, like outs[a], OPK_LANE_BYTES an element with lanes); the kernel keeps
    only the parts a chunk touches."""
    cdef int a
    cdef cnp.ndarray out
    if len(sources) > OPK_MAXACC:
        raise ValueError(f"opkit: at most {OPK_MAXACC} sums fold into one kernel")
    if len(outs) != len(sources) or len(lanes) != len(sources):
        raise ValueError(f"opkit: {len(sources)} folded sums need as many arrays to add up into "
                         f"and lanes flags; given {len(outs)} and {len(lanes)}")
    for a in range(len(sources)):
        if not k.nin <= sources[a] < k.nops:
            raise ValueError("opkit: a folded sum adds up an operand that is not an output")
        out = outs[a]
        if cnp.PyArray_TYPE(out) != cnp.NPY_DOUBLE or not cnp.PyArray_ISCARRAY(out):
            raise ValueError(f"opkit: folded sum {a} adds up into a writable float64 array in C "
                             f"order; it was given {out.dtype}, C-contiguous {out.flags.c_contiguous}, "
                             f"writable {out.flags.writeable}")
        k.acc_src[a] = sources[a]
        k.acc_out[a] = <double*>cnp.PyArray_DATA(out)
        k.acc_len[a] = cnp.PyArray_SIZE(out)
        k.acc_lanes[a] = 1 if lanes[a] else 0
    k.nacc = len(sources)
    k.acc_fblock = fblock
    return 0


cdef inline int opk_run_arrays(cnp.ndarray geom, tuple arrays, const opk_kernel* k, int nthreads,
                               Py_ssize_t threshold, int max_threads) except -1:
    """A kernel over the geometry built by opkit.runtime.geometry; arrays = inputs + outputs
    (+ the partial sums it accumulates)."""
    cdef char* base[OPK_MAXOPS + OPK_MAXACC]
    cdef int o, failed
    if len(arrays) < k.nops + k.nacc:
        raise ValueError("opkit: a kernel's operands do not match its geometry")
    for o in range(k.nops + k.nacc):
        base[o] = <char*>cnp.PyArray_DATA(<cnp.ndarray>arrays[o])
    with nogil:
        failed = opk_run(<const Py_ssize_t*>cnp.PyArray_DATA(geom), base, k, nthreads, threshold,
                         max_threads)
    if failed == -2:
        raise RuntimeError("opkit: a folded sum's partials are not laid out as the kernel walks "
                           "them (a bug in opkit: please report it with the call's shapes)")
    if failed:
        raise MemoryError("opkit: no memory for a kernel's tile buffers or partial sums")
    return 0


cdef inline bint opk_plain(object a):
    """An exact ndarray, C-contiguous, aligned and in native byte order: the arrays the direct
    call takes."""
    return type(a) is cnp.ndarray and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a) and \
        cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a)


cdef inline bint opk_like(object a, cnp.ndarray a0):
    """A plain array of a0's dtype and shape."""
    return opk_plain(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.PyArray_TYPE(a0) and \
        cnp.PyArray_NDIM(<cnp.ndarray>a) == cnp.PyArray_NDIM(a0) and \
        cnp.PyArray_CompareLists(cnp.PyArray_DIMS(<cnp.ndarray>a), cnp.PyArray_DIMS(a0),
                                 cnp.PyArray_NDIM(a0))
