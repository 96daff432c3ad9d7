"""Run a lowered plan on checked arrays: allocate, call kernels, run library steps."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..codegen import DTYPE_CODES, TAG_CODES, instance_tag
from ..config import get as setting
from ..dsl import named
from ..backend import thread_controls
from ..dsl.library import LIBRARY, Context, conv_ints, conv_size
from ..lower.epilogue import physical
from ..lower import Attr, Const, Fused, Kernel, Kind, LibCall, Plan, Value, compute_dtype
from .bind import Bound, dtype_name
from .geometry import geometry, operand_strides

Array = Tuple[np.ndarray, Tuple[str, ...]]   # an array and the dim names of its axes


@functools.lru_cache(maxsize=None)
def _instance(dtype: np.dtype) -> Tuple[str, np.dtype]:
    """The kernel instance (f, d, i, l) a result dtype runs on, and the dtype of its temps."""
    name = dtype_name(dtype)
    return instance_tag(name), np.dtype(compute_dtype(name))


def _problem(call: LibCall, env: Dict[Value, Array], bound: Bound, compute: np.dtype):
    """A fused call as the convolution the C code runs: (N, C, H, W, O, KH, KW, OH, OW, stride,
    padding, nhwc), x with its byte strides over (N, C, H, W) and dtype code, the weights packed
    in the compute type, the names of the output's (N, O, OH, OW) axes, and the order the
    result is stored in. A 2-d matmul [M, K] @ [K, C] is the 1 x 1 convolution of an image of
    M rows and one column."""
    if call.prim == "conv2d":
        x_dims, w_dims, out_dims = call.params
        x, xn = env[call.args[0]]
        wv = named.expand_to(*env[call.args[1]], w_dims)
        s, p = conv_ints(*(_number(a, bound) for a in call.args[2:]))
        sizes = [x.shape[xn.index(d)] if d in xn else 1 for d in x_dims]
        xs = tuple(x.strides[xn.index(d)] if d in xn and x.shape[xn.index(d)] > 1 else 0
                   for d in x_dims)
        o, c, kh, kw = wv.shape
        oh, ow = conv_size(sizes[2], kh, s, p), conv_size(sizes[3], kw, s, p)
        nhwc = bound.layout == "NHWC"
        pack = wv.transpose(2, 3, 1, 0).reshape(kh * kw * c, o) if nhwc else wv.reshape(o, -1)
        dims = (sizes[0], sizes[1], sizes[2], sizes[3], o, kh, kw, oh, ow, s, p, int(nhwc))
        phys = physical(out_dims, bound.layout, True)
        axes = out_dims
    else:  # einsum [M, K] @ [K, C]
        a_dims, b_dims, out_dims = call.params
        a, an = env[call.args[0]]
        a = named.expand_to(a, an, a_dims)
        b = named.expand_to(*env[call.args[1]], b_dims)
        (m, k), cn = a.shape, b.shape[1]
        x, xn, xs = a, a_dims, (0, a.strides[1] if k > 1 else 0, a.strides[0] if m > 1 else 0, 0)
        dims = (1, k, m, 1, cn, 1, 1, m, 1, 1, 0, 1)
        pack, phys, axes = b, out_dims, (None, out_dims[1], out_dims[0], None)
    code = DTYPE_CODES.get(dtype_name(x.dtype))
    if code is None or 0 in (dims[0], dims[1], dims[4], dims[7], dims[8]):
        return None  # nothing to multiply: the parts (NumPy) give the empty or zero result
    return (dims, x, xs, code, np.ascontiguousarray(pack, dtype=compute), axes, phys)


def _number(arg, bound: Bound):
    return bound.attrs[arg.name] if isinstance(arg, Attr) else arg.value


def _block_strides(arr: np.ndarray, names, axes) -> Optional[Tuple[int, int, int, int]]:
    """Byte strides of an epilogue operand over the output's (N, O, OH, OW) axes, 0 where it
    is broadcast; None if it varies along anything else."""
    for n, size in zip(names, arr.shape):
        if size > 1 and n not in axes:
            return None
    return tuple(0 if a is None or a not in names or arr.shape[names.index(a)] == 1
                 else arr.strides[names.index(a)] for a in axes)


@dataclass
class _State:
    """What one run of a plan carries from step to step."""

    env: Dict[Value, Array]
    bound: Bound
    module: object
    out_arrays: Dict[Value, np.ndarray]
    out_dtypes: Dict[Value, np.dtype]
    like: Dict[Value, Array]
    clip: Optional[float]
    skipped: set
    tag: str
    temp_dtype: np.dtype
    final: Dict[Value, Array]          # outputs later steps read in the compute type instead


class Executor:
    """A plan plus what the runtime precomputes about it once."""

    def __init__(self, plan: Plan, where: str):
        self.plan = plan
        self.where = where
        self._geometries: Dict[tuple, np.ndarray] = {}  # kernel geometry per operand layout
        self.values = {n: Value.input(n) for n in plan.inputs}  # arrays by the name they bind to
        self.readers: Dict[Value, List[int]] = {}
        for i, step in enumerate(plan.steps):
            for v in step.reads:
                self.readers.setdefault(v, []).append(i)
        # a temp read only by one sum_to that lands in an output can be that output, whenever the
        # call's shapes make the reduction an identity (the common case: nothing is broadcast)
        self.direct: Dict[Value, LibCall] = {}
        for i, step in enumerate(plan.steps):
            if isinstance(step, LibCall) and step.prim == "sum_to" and step.result.kind is Kind.OUTPUT:
                src = step.args[0]
                if src.kind is Kind.TEMP and self.readers.get(src) == [i]:
                    self.direct[src] = step
        # outputs that steps after the one writing them read (a batch mean the normalization uses)
        self.reread = {v for v, readers in self.readers.items() if v.kind is Kind.OUTPUT}

    def run(self, bound: Bound, module, out_arrays: Dict[Value, np.ndarray],
            out_dtypes: Dict[Value, np.dtype], like: Dict[Value, Array],
            clip: Optional[float] = None) -> Dict[str, np.ndarray]:
        """`out_arrays`: caller-given outputs; `like`: (array, names) each output takes its layout
        from; `clip`: clamp every result to [-clip, clip] (backward: gradient clipping), inside
        the kernel that writes it when nothing reduces it afterwards."""
        values = self.values
        env: Dict[Value, Array] = {values[n]: v for n, v in bound.values.items()}
        results: Dict[str, np.ndarray] = {}
        skipped = set()
        tag, temp_dtype = _instance(bound.dtype)
        for vid, arr in out_arrays.items():
            env[vid] = (arr, like[vid][1])
        state = _State(env, bound, module, out_arrays, out_dtypes, like, clip, skipped, tag,
                       temp_dtype, {})
        for step in self.plan.steps:
            if isinstance(step, Fused):
                if not self._fused(step, state):
                    for part in step.parts:  # the parts one after another
                        self._step(part, state)
                continue
            self._step(step, state)
        env.update(state.final)
        for out_name, vid in self.plan.outputs:
            results[out_name] = env[vid][0]
        return results

    def _step(self, step, st: "_State") -> None:
        """One kernel or library call of the plan."""
        env, bound, values, skipped = st.env, st.bound, self.values, st.skipped
        out_dtypes, like, clip = st.out_dtypes, st.like, st.clip
        if isinstance(step, LibCall):
            if step.name in skipped:
                return
            self._library(step, env, bound, out_dtypes, like, clip, st.final)
            return
        ins = [env[v] for v in step.inputs]
        for vid in step.outputs:
            if vid in env:
                continue
            if vid.kind is Kind.OUTPUT:
                env[vid] = self._allocate(like[vid], out_dtypes[vid])
                continue
            lib = self.direct.get(vid)
            if lib is not None:
                target = env[values[lib.params[0]]]
                nm = named.union_names([n for _, n in ins])
                sizes = named.dim_sizes(ins, [str(v) for v in step.inputs])
                shape = tuple(sizes[n] for n in nm)
                if nm == target[1] and shape == target[0].shape and lib.result not in env:
                    env[vid] = env[lib.result] = self._allocate(target, out_dtypes[lib.result])
                    skipped.add(lib.name)
                    continue
            env[vid] = self._temp(ins, step.inputs, st.temp_dtype)
        clips = None
        if clip is not None and self.plan.kind == "backward":
            # a result that lands in an output as it is gets clamped on store
            clips = tuple((-clip, clip) if v.kind is Kind.OUTPUT or
                          (v in self.direct and self.direct[v].name in skipped)
                          else (-np.inf, np.inf) for v in step.outputs)
        self._kernel(step, env, bound, st.module, st.tag,
                     any(v in st.out_arrays for v in step.outputs), clips)

    def _fused(self, step: Fused, st: "_State") -> bool:
        """Run a fused step in the compiled module; False when it cannot here (the layout is not
        one it fuses in, or the module has no compiled library backend)."""
        fn = getattr(st.module, f"{step.name}_{st.tag}", None)
        if fn is None or st.bound.layout not in step.layouts:
            return False
        problem = _problem(step.call, st.env, st.bound, st.temp_dtype)
        if problem is None:
            return False
        dims, x, xs, xcode, wpack, axes, phys = problem
        env, result = st.env, step.call.result
        shape = tuple(st.bound.sizes.get(n, 1) for n in phys)
        k = step.epilogue
        if k is not None:
            ops = list(k.inputs)
            for v in k.outputs:
                if v not in env:
                    env[v] = (self._allocate(st.like[v], st.out_dtypes[v]) if v.kind is Kind.OUTPUT
                              else (np.empty(shape, st.temp_dtype), phys))
            ops += k.outputs
            slot = k.inputs.index(result)
        else:  # the raw result: an output, or kept for the steps after the statistics
            if result not in env:
                env[result] = (self._allocate(st.like[result], st.out_dtypes[result])
                               if result.kind is Kind.OUTPUT else (np.empty(shape, st.temp_dtype), phys))
            ops, slot = [result, result], 0
        arrays, strides, codes = [], [], []
        for i, v in enumerate(ops):
            if i == slot:
                arrays.append(None), strides.append((0, 0, 0, 0)), codes.append(0)
                continue
            arr, names = env[v]
            s = _block_strides(arr, names, axes)
            if s is None:
                return False  # only when the arrays here are not what the plan lowered for
            arrays.append(arr), strides.append(s), codes.append(DTYPE_CODES[dtype_name(arr.dtype)])
        attrs = st.bound.attrs
        eattrs = tuple(attrs[a] for a in k.attrs) if k is not None else ()
        sattrs = tuple(tuple(attrs[a] for a in s.kernel.attrs) if s.kernel is not None else ()
                       for s in step.stats)
        clips = None
        if k is not None and st.clip is not None and self.plan.kind == "backward":
            clips = tuple((-st.clip, st.clip) if v.kind is Kind.OUTPUT else (-np.inf, np.inf)
                          for v in k.outputs)
        sums = np.zeros((len(step.stats), dims[4]), np.float64)
        controls = thread_controls()
        # GEMMs of several threads at once need BLAS held to one thread (thread_controls)
        nthreads = setting("num_threads") if all(controls) and dims[0] * dims[7] * dims[8] >= 64 else 1
        fn(dims, x, xs, xcode, wpack, tuple(arrays), tuple(strides), tuple(codes), slot, sums,
           eattrs, sattrs, nthreads, controls, clips)
        count = dims[0] * dims[7] * dims[8]
        for s, total in zip(step.stats, sums):
            with np.errstate(invalid="ignore", divide="ignore"):  # an empty mean is NaN
                mean = (total / count, (step.channel,))
            self._store(s.call.result, mean, st)
        return True

    def _store(self, value: Value, arr: Array, st: "_State") -> None:
        """A library result (a mean) into the environment, or into its output array."""
        if value.kind is not Kind.OUTPUT:
            st.env[value] = (arr[0].astype(st.temp_dtype), arr[1])
            return
        if value not in st.env:
            st.env[value] = self._allocate(st.like[value], st.out_dtypes[value])
        dst, names = st.env[value]
        with np.errstate(over="ignore"):
            np.copyto(dst, named.expand_to(arr[0], arr[1], names), casting="unsafe")
        self._keep_precise(value, arr, st.env, st.temp_dtype, st.final)

    @staticmethod
    def _allocate(like: Array, dtype) -> Array:
        arr, names = like
        return np.empty_like(arr, dtype=dtype), names

    @staticmethod
    def _temp(ins: List[Array], labels, dtype) -> Array:
        nm = named.union_names([n for _, n in ins])
        sizes = named.dim_sizes(ins, [str(v) for v in labels])
        return np.empty(tuple(sizes[n] for n in nm), dtype=dtype), nm

    def _kernel(self, k: Kernel, env: Dict[Value, Array], bound: Bound, module, tag: str,
                warm: bool, clips=None) -> None:
        out_arr, iter_names = env[k.outputs[0]]
        operands = [env[v] for v in k.inputs] + [env[v] for v in k.outputs]
        ccode = TAG_CODES[tag]
        key = (k.name, iter_names, out_arr.shape, ccode,
               tuple((arr.shape, arr.strides, arr.dtype, nm) for arr, nm in operands))
        geom = self._geometries.get(key)
        if geom is None:
            geom = self._geometry(k, operands, iter_names, out_arr.shape, ccode)
            if len(self._geometries) >= 256:
                self._geometries.clear()
            self._geometries[key] = geom
        if out_arr.size == 0:
            return
        fn = getattr(module, f"{k.name}_{tag}")
        args = (geom, tuple(arr for arr, _ in operands), *[bound.attrs[a] for a in k.attrs],
                setting("num_threads"), warm)
        fn(*args, clips) if clips is not None else fn(*args)

    def _geometry(self, k: Kernel, operands, iter_names, iter_shape, ccode: int) -> np.ndarray:
        strides = []
        for (arr, nm), vid in zip(operands, k.operands):
            for n, s in zip(nm, arr.shape):
                if n not in iter_names and s != 1 or (n in iter_names and s not in (1, iter_shape[iter_names.index(n)])):
                    raise ValueError(f"{self.where}: {vid} of shape {arr.shape} does "
                                     f"not fit the result's shape {iter_shape}")
            strides.append(tuple(operand_strides(arr, nm, iter_names, iter_shape)))
        geom = geometry(tuple(iter_shape), tuple(strides),
                        tuple(DTYPE_CODES[dtype_name(arr.dtype)] for arr, _ in operands),
                        tuple(arr.itemsize for arr, _ in operands), len(k.outputs), ccode)
        geom.flags.writeable = False
        return geom

    def _library(self, step: LibCall, env, bound: Bound, out_dtypes, like, clip=None,
                 final=None) -> None:
        ctx = Context(bound.values, sizes=bound.sizes)
        compute = np.dtype(compute_dtype(dtype_name(bound.dtype)))
        args = []
        for a in step.args:
            if isinstance(a, Attr):
                args.append((np.asarray(bound.attrs[a.name]), ()))
            elif isinstance(a, Const):
                args.append((np.asarray(float(a.value)), ()))
            else:
                arr, nm = env[a]
                # library calls compute in the compute dtype, like kernels: never in float16
                args.append((arr.astype(compute) if arr.dtype.itemsize < compute.itemsize else arr, nm))
        arr, nm = LIBRARY[step.prim].run(ctx, args, step.params)
        arr = np.asarray(arr)  # kernels take arrays, never NumPy scalars
        if step.result.kind is Kind.OUTPUT:
            if step.result not in env:
                env[step.result] = self._allocate(like[step.result], out_dtypes[step.result])
            dst, dst_names = env[step.result]
            # a float16 gradient summed in float32 may pass 65504: it rounds to inf, as a
            # kernel's store does, without a warning
            with np.errstate(over="ignore"):
                np.copyto(dst, named.expand_to(arr, nm, dst_names), casting="unsafe")
            if clip is not None and self.plan.kind == "backward":
                np.clip(dst, -clip, clip, out=dst)
            self._keep_precise(step.result, (arr, nm), env, compute, final)
        else:
            env[step.result] = (arr, nm)

    def _keep_precise(self, value: Value, computed: Array, env, compute: np.dtype, final) -> None:
        """An output that later steps read (a batch mean) is read by them in the compute type,
        not rounded to a float16 output first: the output array is put back at the end."""
        if final is None or value not in self.reread or env[value][0].dtype.itemsize >= compute.itemsize:
            return
        final[value] = env[value]
        arr, nm = computed
        env[value] = (named.expand_to(np.asarray(arr, dtype=compute), nm, final[value][1]),
                      final[value][1])
