# What every generated kernel module cimports: the C support header's declarations and the
# small Cython helpers that are the same for every operator (templates/opkit_kernel.h holds the
# machinery itself), and the fixed-width integer types (cimported with these; the libm
# functions the element loops call the module cimports itself, from codegen/c_ops.py's LIBM).
# The module defines the dtype codes before this is included.

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t

cdef extern from "opkit_kernel.h" nogil:
    int OPK_DCODE_OF(int t)   # (defined by the module: opkit/abi.py's c_defines)
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
    ctypedef float opk_hblock[OPK_HBLOCK]  # a block of a float16 loop's operand, as floats
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
    enum: OPK_FROWS
    opk_ntw opk_ntw_at(const opk_ntw* w, int o)
    void opk_ntw_back(opk_ntw* w, int o, const opk_ntw* wl)
    void opk_hconv(float* e, const char* p, Py_ssize_t i, int is_float)
    const float* opk_hin(const float* e, const char* p, Py_ssize_t i, int is_float)
    void opk_hin_last(float* t, const char* p, Py_ssize_t i, Py_ssize_t w, int is_float)
    void opk_hout(char* d, Py_ssize_t i, const float* g, const opk_ntw* w, opk_ntw* wl)
    void opk_hout_f(char* f, char* d, Py_ssize_t i, const float* g, const opk_ntw* w, opk_ntw* wl,
                    int hk, opk_hacc* sa, opk_hlanes* sl)
    void opk_hout_last(char* f, char* d, Py_ssize_t i, Py_ssize_t m, const float* u, const opk_ntw* w,
                       opk_ntw* wl)
    int opk_hsum_load(const opk_hsums* hs, int o, opk_hacc* sa, opk_hlanes* sl)
    void opk_hsum_store(opk_hsums* hs, int o, int hk, const opk_hacc* sa, const opk_hlanes* sl,
                        Py_ssize_t rows)
    int opk_hrow(Py_ssize_t* rows)
    void opk_hflush(int hk, opk_hacc* sa, double* acc)
    void opk_clamp_block(float* v, float lo, float hi, Py_ssize_t n)
    int OPK_F16, OPK_F32, OPK_F64, OPK_I8, OPK_I16, OPK_I32, OPK_I64, OPK_BF16, OPK_F16_HW
    int32_t opk_qmul_i(int32_t x, int32_t m, int bits)
    int64_t opk_qmul_l(int64_t x, int64_t m, int bits)
    bint opk_overflows_f(double v)
    bint opk_vanishes_f(double v)
    int opk_run(const Py_ssize_t* g, char** base, const opk_kernel* k, int available,
                Py_ssize_t threshold, int max_threads)
    int opk_run_flat(Py_ssize_t n, char** ptr, const Py_ssize_t* step, const int* code,
                     const opk_kernel* k, int available, Py_ssize_t threshold, int max_threads)


cdef inline int opk_make(opk_kernel* k, opk_tile_fn tile, opk_rows_fn rows, const void* ctx, int nin,
                         int nops, int ccode, Py_ssize_t tile_len, bint stream, opk_htile_fn htile,
                         opk_htile_fn htile_f) noexcept nogil:
    """A kernel instance's call, into k (a generated <kernel>_init makes it, and returns the 0
    this returns); its float16 loops (htile, htile_f: NULL, none) run where the CPU converts
    float16 (OPK_F16_HW)."""
    k.tile, k.rows, k.ctx = tile, rows, ctx
    k.nin, k.nops, k.ccode, k.tile_len, k.stream = nin, nops, ccode, tile_len, stream
    k.nacc, k.acc_fblock, k.htile, k.htile_f, k.discard = 0, 0, NULL, NULL, 0
    if OPK_F16_HW:
        k.htile, k.htile_f = htile, htile_f
    return 0


cdef inline int opk_fits(int failed, str where, str ctype, tuple names, tuple values) except -1:
    """A kernel's attrs as its <kernel>_init took them (`names`, `values`): an error where one,
    or a value computed from them alone, does not fit the compute type."""
    if failed:
        given = ", ".join([f"{n}={v!r}" for n, v in zip(names, values)])
        raise ValueError(f"{where}: {given or 'an attr'}, or a value computed from these attrs "
                         f"alone, does not fit {ctype} (float32: magnitudes from 1.4e-45 to "
                         "3.4e38); pass float64 arrays, or attrs within that range")
    return 0


cdef inline int opk_fold_sums(opk_kernel* k, tuple sources, tuple outs, tuple lanes,
                              bint fblock, uint64_t discard) except -1:
    """Sums folded into the kernel's pass (none where `sources` is None): `sources` are the
    operand indexes of the outputs they add up, `outs` the float64 arrays (C order) they are
    added up into, `lanes` whether each one's partials are kept as lanes (opk_lanes), `fblock`
    whether float32 lanes add blocks first (float16 data), `discard` the output operands only
    those sums read (bit o: not stored). The operands after the outputs lay out each sum's
    partials for the walk (C order, like outs[a], OPK_LANE_BYTES an element with lanes); the
    kernel keeps only the parts a chunk touches."""
    cdef int a
    cdef cnp.ndarray out
    if sources is None:
        return 0
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
    k.discard = discard
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


# ---------------------------------------------------------------- the direct calls
# What the generated fast_forward / fast_backward share (templates/module.pyx.j2): the common
# call's arguments, checked; anything else gets False or None, and the call NotImplemented (the
# checked path, which explains errors, takes it).

cdef inline bint opk_plain_like(tuple args, Py_ssize_t n):
    """args[0] a plain array, and args[1 .. n) plain arrays of its dtype and shape."""
    cdef Py_ssize_t i
    if not opk_plain(args[0]):
        return False
    for i in range(1, n):
        if not opk_like(args[i], <cnp.ndarray>args[0]):
            return False
    return True


cdef inline int opk_dcode(cnp.ndarray a, int codes):
    """The dtype code (OPK_F16 ...) of a's dtype where bit <code> of `codes` (the operator's
    dtypes) is set, else -1 (OPK_DCODE_OF: opkit/abi.py)."""
    cdef int c = OPK_DCODE_OF(cnp.PyArray_TYPE(a))
    return c if c >= 0 and (codes >> c) & 1 else -1


cdef inline object opk_arg(tuple args, Py_ssize_t pos, dict kwargs, str name, object default,
                           Py_ssize_t* used):
    """An attr's value: given by position, else by keyword (counted in `used`), else `default`."""
    if pos < len(args):
        return args[pos]
    if name in kwargs:
        used[0] += 1
        return kwargs[name]
    return default


cdef inline bint opk_number(object v, bint floats, double* x) except -1:
    """A number attr's value into x: an int up to 2**53 (attrs reach kernels as doubles, exact up
    to there) or, where `floats`, a float; an int past 2**53 is the checked path's to explain."""
    if (floats and isinstance(v, float)) or \
            (type(v) is int and -9007199254740992 <= v <= 9007199254740992):
        x[0] = v
        return True
    return False


cdef inline bint opk_flag(object v, bint* x):
    """A bool attr's value into x: True or False themselves."""
    if type(v) is not bool:
        return False
    x[0] = v is True
    return True


cdef inline char* opk_data(object a):
    return <char*>cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline object opk_output(object out, cnp.ndarray a0, tuple args, int nin, int inplace):
    """The one output: a new array like a0, or `out`, a plain writable array like a0 that shares
    no memory with any of the nin inputs, but for being input i itself where bit i of `inplace`
    allows it."""
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(a0)
    cdef char* lo
    cdef char* p
    cdef int i
    if out is None:
        return cnp.PyArray_EMPTY(cnp.PyArray_NDIM(a0), cnp.PyArray_DIMS(a0), cnp.PyArray_TYPE(a0), 0)
    if not opk_like(out, a0) or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out):
        return None
    lo = opk_data(out)
    for i in range(nin):
        p = opk_data(args[i])
        if p < lo + nb and lo < p + nb and (p != lo or not (inplace >> i) & 1):
            return None
    return out


cdef inline object opk_outputs(object out, cnp.ndarray a0, int n):
    """n new arrays like a0 (an op with several outputs takes no out= here)."""
    if out is not None:
        return None
    return tuple([cnp.PyArray_EMPTY(cnp.PyArray_NDIM(a0), cnp.PyArray_DIMS(a0), cnp.PyArray_TYPE(a0), 0)
                  for _ in range(n)])


cdef inline object opk_grads(object out, cnp.ndarray a0, tuple args, int nin, int mask, int nslots,
                             int ngrads, int* given):
    """The backward call's ngrads gradients. out= (None, or a tuple or list of one entry per
    input, nslots) gives the gradient of each input in `mask` (bit j) in turn, as None or a plain
    writable array like a0 that shares no memory with an operand; the other entries are None.
    The gradients it does not give are new arrays; `given`: whether it gave any."""
    cdef list grads = [None] * ngrads
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(a0)
    cdef int i, j, g = 0
    cdef char* lo
    cdef char* p
    if out is not None:
        if (type(out) is not tuple and type(out) is not list) or len(out) != nslots:
            return None
        for j in range(nslots):
            if (mask >> j) & 1:
                grads[g] = out[j]
                g += 1
            elif out[j] is not None:
                return None
    given[0] = False
    for i in range(ngrads):
        if grads[i] is None:
            grads[i] = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(a0), cnp.PyArray_DIMS(a0), cnp.PyArray_TYPE(a0), 0)
            continue
        if not opk_like(grads[i], a0) or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>grads[i]):
            return None
        lo = opk_data(grads[i])
        for j in range(nin + i):
            p = opk_data(args[j] if j < nin else grads[j - nin])
            if p < lo + nb and lo < p + nb:
                return None
        given[0] = True
    return tuple(grads)


cdef inline int opk_run_flat_call(char** ptr, int nops, cnp.ndarray a0, int dcode, const opk_kernel* k,
                                  int nthreads, Py_ssize_t threshold, int max_threads) except -1:
    """The kernel over the call's nops operands: contiguous, of a0's dtype and size."""
    cdef Py_ssize_t step[OPK_MAXOPS]
    cdef int code[OPK_MAXOPS]
    cdef Py_ssize_t n = cnp.PyArray_SIZE(a0)
    cdef int o, failed
    for o in range(nops):
        step[o] = cnp.PyArray_ITEMSIZE(a0)
        code[o] = dcode
    with nogil:
        failed = opk_run_flat(n, ptr, step, code, k, nthreads, threshold, max_threads)
    if failed:
        raise MemoryError("opkit: no memory for a kernel's tile buffers")
    return 0
