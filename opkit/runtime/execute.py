"""Run a lowered plan on checked arrays: allocate, call kernels, run library steps."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

import numpy as np

from ..codegen import DTYPE_CODES, TAG_CODES, instance_tag
from ..config import config, get as setting
from ..dsl import named
from ..backend import thread_controls
from ..dsl.library import LIBRARY, Context, conv_ints, conv_size
from ..lower.epilogue import physical
from ..lower.reduce import COMPILED_REDUCTIONS, LANE_BYTES
from ..lower import Attr, Const, Fused, Kernel, Kind, LibCall, Plan, Value, compute_dtype
from .bind import Bound, dtype_name
from .geometry import geometry, operand_strides, walk_dims
from .reductions import compiled_reduction
from .conv_grads import CONV_GRADS, compiled_conv_grad
from .schedule import (WHOLE, ArrayLayout, ExecSchedule, Settings, execution_schedule,
                       fused_threads, plan_facts, summed_for_outputs)
from ..abi import ConvProblem
from ..kinds import Layout, Op, Pass

Array = Tuple[np.ndarray, Tuple[str, ...]]   # an array and the dim names of its axes


@functools.lru_cache(maxsize=None)
def _instance(dtype: np.dtype) -> Tuple[str, np.dtype]:
    """The kernel instance (f, d, i, l) a result dtype runs on, and the dtype of its temps."""
    name = dtype_name(dtype)
    return instance_tag(name), np.dtype(compute_dtype(name))


def _problem(call: LibCall, env: Dict[Value, Array], bound: Bound, compute: np.dtype,
             direct: bool):
    """A fused call as the convolution the C code runs: its ConvProblem, x with its byte
    strides over (N, C, H, W) and dtype code, the weights packed in the compute type, the names of the output's (N, O, OH, OW) axes, and the order the
    result is stored in. A 2-d matmul [M, K] @ [K, C] is the 1 x 1 convolution of an image of
    M rows and one column."""
    if call.prim == Op.CONV2D:
        x_dims, w_dims, out_dims = call.params
        x, xn = env[call.array]
        wv = named.expand_to(*env[call.array_arg(1)], w_dims)
        s, p = conv_ints(*(_number(a, bound) for a in call.args[2:]))
        sizes = [x.shape[xn.index(d)] if d in xn else 1 for d in x_dims]
        xs = tuple(x.strides[xn.index(d)] if d in xn and x.shape[xn.index(d)] > 1 else 0
                   for d in x_dims)
        o, c, kh, kw = wv.shape
        oh, ow = conv_size(sizes[2], kh, s, p), conv_size(sizes[3], kw, s, p)
        nhwc = bound.layout is Layout.NHWC
        # [KH * KW * C, O] for the micro-kernels and BLAS in NHWC, [O, C * KH * KW] for BLAS in NCHW
        pack = (wv.transpose(2, 3, 1, 0).reshape(kh * kw * c, o) if nhwc or direct
                else wv.reshape(o, -1))
        conv = ConvProblem(sizes[0], sizes[1], sizes[2], sizes[3], o, kh, kw, oh, ow, s, p, int(nhwc))
        phys = physical(out_dims, bound.layout, True)
        axes = out_dims
    else:  # einsum [M, K] @ [K, C]
        a_dims, b_dims, out_dims = call.params
        a, an = env[call.array]
        a = named.expand_to(a, an, a_dims)
        b = named.expand_to(*env[call.array_arg(1)], b_dims)
        (m, k), cn = a.shape, b.shape[1]
        x, xn, xs = a, a_dims, (0, a.strides[1] if k > 1 else 0, a.strides[0] if m > 1 else 0, 0)
        conv = ConvProblem(N=1, C=k, H=m, W=1, O=cn, KH=1, KW=1, OH=m, OW=1, stride=1, pad=0, nhwc=1)
        pack, phys, axes = b, out_dims, (None, out_dims[1], out_dims[0], None)
    code = DTYPE_CODES.get(dtype_name(x.dtype))
    if code is None or conv.empty:
        return None  # nothing to multiply: the parts (NumPy) give the empty or zero result
    return (conv, x, xs, code, np.ascontiguousarray(pack, dtype=compute), axes, phys)


def _number(arg, bound: Bound):
    return bound.attrs[arg.name] if isinstance(arg, Attr) else arg.value


def _block_strides(arr: np.ndarray, names, axes) -> Optional[Tuple[int, ...]]:
    """Byte strides of an epilogue operand over the output's (N, O, OH, OW) axes, 0 where it
    is broadcast; None if it varies along anything else."""
    for n, size in zip(names, arr.shape):
        if size > 1 and n not in axes:
            return None
    return tuple(0 if a is None or a not in names or arr.shape[names.index(a)] == 1
                 else arr.strides[names.index(a)] for a in axes)


def _remember(cache: dict, key, value) -> None:
    """A per-layout cache entry; a cache that has seen 256 layouts starts again."""
    if len(cache) >= 256:
        cache.clear()
    cache[key] = value


class _Shaped(NamedTuple):
    shape: Tuple[int, ...]  # what named.dim_sizes reads of an array


_SPACES: Dict[tuple, Tuple[Tuple[str, ...], Tuple[int, ...]]] = {}


def _iteration_space(layouts: Tuple[Tuple[Tuple[int, ...], Tuple[str, ...]], ...],
                     labels) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """The names and shape of the space a kernel reading arrays of these (shape, names)
    iterates over; ValueError names the clashing ones (`labels`: only errors read them)."""
    found = _SPACES.get(layouts)
    if found is None:
        nm = named.union_names([n for _, n in layouts])
        sizes = named.dim_sizes([(cast(np.ndarray, _Shaped(shape)), n) for shape, n in layouts],
                                [str(v) for v in labels])
        found = nm, tuple(sizes[n] for n in nm)
        _remember(_SPACES, layouts, found)
    return found


def _narrowed(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 sum in the compute dtype: past float32's range it is inf, as a kernel's store
    makes it, without NumPy's overflow warning."""
    if np.dtype(dtype).itemsize >= arr.dtype.itemsize:
        return arr.astype(dtype, copy=False)
    with np.errstate(over="ignore"):
        return arr.astype(dtype)


_ANCHOR = np.zeros(1)  # the memory a partials layout views: the kernel never reads it


@dataclass
class _Folded:
    """A sum folded into a kernel's pass: `total` (float64) is what the kernel adds it up into,
    over the dims `names`; with `lanes`, the kernel keeps each element as lanes (opk_lanes)."""

    total: np.ndarray
    names: Tuple[str, ...]
    lanes: bool

    def layout(self) -> np.ndarray:
        """How the kernel addresses the partials: `total`'s shape in C order, LANE_BYTES an
        element with lanes (else 8). Only its strides are used: the kernel keeps each chunk's
        touched span in a buffer of its own."""
        return _partials_layout(self.total.shape, self.lanes)


@functools.lru_cache(maxsize=256)
def _partials_layout(shape: Tuple[int, ...], lanes: bool) -> np.ndarray:
    strides, step = [], LANE_BYTES if lanes else 8
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return np.lib.stride_tricks.as_strided(_ANCHOR, shape, tuple(reversed(strides)))


def _mean_of(total: np.ndarray, summed: Array, keep: Tuple[str, ...]) -> np.ndarray:
    """A folded mean: the float64 sum of `summed` over the dims not in `keep`, divided by the
    number of elements it added (the mean of nothing is 0 / 0, NaN, as NumPy's)."""
    arr, names = summed
    count = 1
    for n, size in zip(names, arr.shape):
        if n not in keep:
            count *= size
    with np.errstate(invalid="ignore"):
        return total / count


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
        self._lane_flags: Dict[tuple, List[bool]] = {}  # Executor._lanes per operand layout
        self.values = {n: Value.input(n) for n in plan.inputs}  # arrays by the name they bind to
        self.readers: Dict[Value, List[int]] = {}
        for i, step in enumerate(plan.steps):
            for v in step.reads:
                self.readers.setdefault(v, []).append(i)
        # a temp read only by one sum_to that lands in an output can be that output, whenever the
        # call's shapes make the reduction an identity (the common case: nothing is broadcast)
        self.direct: Dict[Value, LibCall] = {}
        for i, step in enumerate(plan.steps):
            if isinstance(step, LibCall) and step.prim == Op.SUM_TO and step.result.kind is Kind.OUTPUT:
                src = step.array
                if src.kind is Kind.TEMP and self.readers.get(src) == [i]:
                    self.direct[src] = step
        # a kernel's temps read only by sums folded into it: they need not be stored
        # (those of a fused step's parts too: the stat kernels its fallback runs)
        self.folded: Dict[Value, List[LibCall]] = {}
        for step in plan.kernels:
            for c in step.sums:
                if c.array not in self.readers:
                    self.folded.setdefault(c.array, []).append(c)
        # outputs that steps after the one writing them read (a batch mean the normalization uses)
        self.reread = {v for v, readers in self.readers.items() if v.kind is Kind.OUTPUT}
        self.wide = summed_for_outputs(plan)
        self.facts = plan_facts(plan)
        self._schedules: Dict[tuple, ExecSchedule] = {}  # the schedule per layout and settings

    def run(self, bound: Bound, module, out_arrays: Dict[Value, np.ndarray],
            out_dtypes: Dict[Value, np.dtype], like: Dict[Value, Array],
            clip: Optional[float] = None) -> Dict[str, np.ndarray]:
        """`out_arrays`: caller-given outputs; `like`: (array, names) each output takes its layout
        from; `clip`: clamp every result to [-clip, clip] (backward: gradient clipping), inside
        the kernel that writes it when nothing reduces it afterwards."""
        sched = self.schedule(bound, like, clip)
        if sched.slices is not None:
            sl = sched.slices
            return self._run_sliced(sl.dim, sl.length, sl.threads, bound, module, out_arrays,
                                    out_dtypes, like, clip, sl.partial)
        return self._run_whole(bound, module, out_arrays, out_dtypes, like, clip)

    def schedule(self, bound: Bound, like: Dict[Value, Array],
                 clip: Optional[float] = None) -> ExecSchedule:
        """How this call runs (runtime/schedule.py), found once per layout and settings."""
        if not self.facts.may_slice:
            return ExecSchedule(None, max(1, setting("num_threads")), WHOLE)
        settings = Settings.now(setting("num_threads"), clip is not None)
        key = (tuple((a.shape, a.strides, a.itemsize, nm) for a, nm in bound.values.values()),
               tuple((a.shape, nm) for a, nm in like.values()), settings)
        found = self._schedules.get(key)
        if found is None:
            found = execution_schedule(
                self.facts, [ArrayLayout(a.shape, nm, a.strides, a.nbytes)
                             for a, nm in bound.values.values()],
                {vid: ArrayLayout(a.shape, nm) for vid, (a, nm) in like.items()},
                bound.sizes, settings)
            _remember(self._schedules, key, found)
        return found

    def _run_sliced(self, d: str, step: int, threads: int, bound: Bound, module, out_arrays,
                    out_dtypes, like, clip, partial: Tuple[Value, ...] = ()) -> Dict[str, np.ndarray]:
        """The plan run on slices of `step` along `d` on `threads` threads (one thread inside
        each slice), or with `threads` 0 one slice after another (every thread inside each):
        into the whole outputs, allocated first. The `partial` outputs (sums over d) are each
        slice's own float64 sums, added up in slice order."""
        outs = dict(out_arrays)
        for _, vid in self.plan.outputs:
            if vid not in outs:
                outs[vid] = self._allocate(like[vid], out_dtypes[vid])[0]
        starts = range(0, bound.sizes[d], step)
        parts = {vid: [np.zeros(like[vid][0].shape) for _ in starts] for vid in partial}

        def cut(arr: np.ndarray, names, lo: int) -> np.ndarray:
            if d not in names or arr.shape[names.index(d)] == 1:  # (broadcast along d)
                return arr
            index = [slice(None)] * arr.ndim
            index[names.index(d)] = slice(lo, lo + step)
            return arr[tuple(index)]

        def one(lo: int) -> None:
            n = min(step, bound.sizes[d] - lo)
            part = dataclasses.replace(
                bound, values={k: (cut(a, nm, lo), nm) for k, (a, nm) in bound.values.items()},
                sizes={**bound.sizes, d: n})
            part_like = {vid: (cut(a, nm, lo), nm) for vid, (a, nm) in like.items()}
            part_outs = {vid: cut(arr, like[vid][1], lo) for vid, arr in outs.items()}
            part_outs.update({vid: p[lo // step] for vid, p in parts.items()})
            dtypes = {**out_dtypes, **{vid: np.dtype(np.float64) for vid in parts}}
            with config(num_threads=1) if threads else contextlib.nullcontext():
                self._run_whole(part, module, part_outs, dtypes, part_like, clip)

        if threads:
            # each slice in a copy of the caller's settings (isa, ...), taken here: a pool thread
            # starts with the defaults
            contexts = [contextvars.copy_context() for _ in starts]
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda c, lo: c.run(one, lo), contexts, starts))
        else:
            for lo in starts:
                one(lo)
        for vid, p in parts.items():
            total = functools.reduce(np.add, p)
            with np.errstate(over="ignore"):  # past float16's range: inf, as a kernel stores it
                np.copyto(outs[vid], total, casting="unsafe")
        return {name: outs[vid] for name, vid in self.plan.outputs}

    def _run_whole(self, bound: Bound, module, out_arrays: Dict[Value, np.ndarray],
                   out_dtypes: Dict[Value, np.dtype], like: Dict[Value, Array],
                   clip: Optional[float] = None) -> Dict[str, np.ndarray]:
        values = self.values
        env: Dict[Value, Array] = {values[n]: v for n, v in bound.values.items()}
        results: Dict[str, np.ndarray] = {}
        skipped: set = set()
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
            self._library(step, env, bound, out_dtypes, like, clip, st.final, st.module)
            return
        ins = [env[v] for v in step.inputs]
        for vid in step.outputs:
            if vid.kind is Kind.OUTPUT and vid not in env:
                env[vid] = self._allocate(like[vid], out_dtypes[vid])
        space, labels = self._space(step, env, ins)
        landed = set()   # outputs of the kernel that are an output array as they are
        summed = []      # the folded sums this call adds up in the pass
        discard = 0      # operand bits of the outputs only those sums read: not stored
        for vid in step.outputs:
            if vid in env:
                continue
            lib = self.direct.get(vid)
            if lib is not None and self._lands(lib, vid, space, labels, st):
                skipped.add(lib.name)
                landed.add(vid)
                continue
            folded = self.folded.get(vid)
            if folded is not None:
                # read only by sums folded into this kernel: a sum_to that is an identity
                # here is its output array; the others add the values up, stored or not
                ident = next((c for c in folded if c.prim == Op.SUM_TO and c.result.kind is Kind.OUTPUT
                              and self._lands(c, vid, space, labels, st)), None)
                if ident is not None:
                    landed.add(vid)
                else:
                    nm, shape = self._temp_shape(space, labels)
                    env[vid] = (np.broadcast_to(np.empty((), st.temp_dtype), shape), nm)
                    discard |= 1 << (len(step.inputs) + step.outputs.index(vid))
                summed += [c for c in folded if c is not ident]
                continue
            env[vid] = self._temp(space, labels, st.temp_dtype)
        summed += [c for c in step.sums if c.args[0] not in self.folded]
        clips = None
        if clip is not None and self.plan.kind == Pass.BACKWARD:
            # a result that lands in an output as it is gets clamped on store
            clips = tuple((-clip, clip) if v.kind is Kind.OUTPUT or v in landed
                          else (-np.inf, np.inf) for v in step.outputs)
        sums = self._sums(summed, env, values, self._lanes(step, env, summed))
        later: List[Value] = []
        if sums and clips is not None:
            # a folded sum adds up the gradient as computed; what lands in an output is clamped
            # after the pass, as a library call's result is
            sources = {c.array for c in summed}
            later = [v for v, c in zip(step.outputs, clips) if v in sources and c[0] != -np.inf]
            clips = tuple((-np.inf, np.inf) if v in sources else c for v, c in zip(step.outputs, clips))
        self._kernel(step, env, bound, st.module, st.tag, self._writes_given(step, st), clips,
                     [(step.outputs.index(c.array), part) for c, part in zip(summed, sums)],
                     discard)
        for v in later:   # (clip is given: `later` has entries only then)
            np.clip(env[v][0], -cast(float, clip), clip, out=env[v][0])
        for c, part in zip(summed, sums):
            total = _mean_of(part.total, env[c.array], c.params[0]) if c.prim == Op.MEAN \
                else part.total
            # a slice's own sum, or one only a sum_to into an output reads: kept as added up
            if out_dtypes.get(c.result) != np.float64 and c.result not in self.wide:
                total = _narrowed(total, st.temp_dtype)
            self._put(c.result, (total, part.names), env, out_dtypes, like, clip,
                      st.temp_dtype, st.final)

    @staticmethod
    def _writes_given(k: Kernel, st: "_State") -> bool:
        """Whether the kernel writes memory the caller gave (out=), its own output or a temp that
        lands in one (an identity sum_to): long runs are then streamed."""
        given = {id(a) for a in st.out_arrays.values()}
        return any(id(st.env[v][0]) in given for v in k.outputs)

    def _lanes(self, k: Kernel, env: Dict[Value, Array], calls: List[LibCall]) -> List[bool]:
        """For each folded sum, whether the walk adds runs into it whole (it does not vary along
        the output's fastest dim): then it is kept as lanes (opk_lanes)."""
        operands = [env[v] for v in k.inputs] + [env[v] for v in k.outputs]
        found_targets = [env[self.values[c.params[0]]] if c.prim == Op.SUM_TO else None for c in calls]
        targets = tuple((t[0].shape, t[1]) if t is not None else None for t in found_targets)
        key = (k.name, tuple(id(c) for c in calls), targets,
               tuple((arr.shape, arr.strides, nm) for arr, nm in operands))
        found = self._lane_flags.get(key)
        if found is None:
            found = self._lanes_of(k, env, calls, operands)
            _remember(self._lane_flags, key, found)
        return found

    def _lanes_of(self, k: Kernel, env: Dict[Value, Array], calls: List[LibCall],
                  operands: List[Array]) -> List[bool]:
        out_arr, iter_names = env[k.outputs[0]]
        strides = [operand_strides(arr, nm, iter_names, out_arr.shape) for arr, nm in operands]
        dims = walk_dims(out_arr.shape, strides, len(k.inputs), len(operands))
        if not dims:
            return [True] * len(calls)
        fastest = iter_names[dims[-1]]  # the walk's innermost dim (geometry)
        lanes = []
        for c in calls:
            if c.prim == Op.SUM_TO:
                target, names = env[self.values[c.params[0]]]
                lanes.append(fastest not in names or target.shape[names.index(fastest)] == 1)
            else:
                lanes.append(fastest not in c.params[0])
        return lanes

    def _space(self, k: Kernel, env: Dict[Value, Array], ins: List[Array]):
        """The arrays (and their labels) whose broadcast shape the kernel's temps take: its
        inputs, its output arrays, and the targets of the sum_tos that reduce its results. An
        output or a target only adds dims the inputs lack when the value does not depend on
        them (an output `c * 2` of a per-channel c, a gradient `dx: 0`): it is then broadcast to
        that shape, as NumPy and `sum_to` of a smaller value do."""
        calls = [c for c in k.sums if c.prim == Op.SUM_TO]
        calls += [self.direct[v] for v in k.outputs if v in self.direct]
        extra = [v for v in k.outputs if v.kind is Kind.OUTPUT]
        extra += [self.values[c.params[0]] for c in calls]
        return ins + [env[v] for v in extra], list(k.inputs) + extra

    def _lands(self, lib: LibCall, vid: Value, space: List[Array], labels, st: "_State") -> bool:
        """Whether `lib` (a sum_to of the kernel's `vid`) is an identity for this call (`space`:
        what the kernel's temps broadcast, `_space`); then its result array (allocated now
        unless the caller gave it) is where the kernel writes vid."""
        target = st.env[self.values[lib.params[0]]]
        nm, shape = self._temp_shape(space, labels)
        if nm != target[1] or shape != target[0].shape:
            return False
        if lib.result not in st.env:  # (else an array the caller gave)
            st.env[lib.result] = self._allocate(target, st.out_dtypes[lib.result])
        st.env[vid] = st.env[lib.result]
        return True

    @staticmethod
    def _sums(calls: List[LibCall], env: Dict[Value, Array], values,
              lanes: List[bool]) -> List["_Folded"]:
        """What each folded sum adds up into (float64, zero until a kernel runs), over the dims a
        `sum` keeps or in the shape a `sum_to` sums to, and how the kernel lays out its partials:
        as lanes (opk_lanes) where `lanes` says."""
        out = []
        for c, lane in zip(calls, lanes):
            if c.prim == Op.SUM_TO:
                target, names = env[values[c.params[0]]]
                shape = target.shape
            else:
                arr, arr_names = env[c.array]
                names = tuple(n for n in arr_names if n in c.params[0])
                shape = tuple(arr.shape[arr_names.index(n)] for n in names)
            out.append(_Folded(np.zeros(shape), names, lane))
        return out

    def _fused(self, step: Fused, st: "_State") -> bool:
        """Run a fused step in the compiled module; False when it cannot here (the layout is not
        one it fuses in, or the module has no compiled library backend)."""
        fn = getattr(st.module, f"{step.name}_{st.tag}", None)
        if fn is None or st.bound.layout not in step.layouts:
            return False
        direct = getattr(st.module, "GEMM", "") == "opkit"  # the generated micro-kernels
        problem = _problem(step.call, st.env, st.bound, st.temp_dtype, direct)
        if problem is None:
            return False
        conv, x, xs, xcode, wpack, axes, phys = problem
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
        arrays: List[Optional[np.ndarray]] = []
        strides: List[Tuple[int, ...]] = []
        codes: List[int] = []
        for i, v in enumerate(ops):
            if i == slot:
                arrays.append(None)
                strides.append((0, 0, 0, 0))
                codes.append(0)
                continue
            arr, names = env[v]
            block = _block_strides(arr, names, axes)
            if block is None:
                return False  # only when the arrays here are not what the plan lowered for
            arrays.append(arr)
            strides.append(block)
            codes.append(DTYPE_CODES[dtype_name(arr.dtype)])
        attrs = st.bound.attrs
        eattrs = tuple(attrs[a] for a in k.attrs) if k is not None else ()
        sattrs = tuple(tuple(attrs[a] for a in s.kernel.attrs) if s.kernel is not None else ()
                       for s in step.stats)
        clips = None
        if k is not None and st.clip is not None and self.plan.kind == Pass.BACKWARD:
            clips = tuple((-st.clip, st.clip) if v.kind is Kind.OUTPUT else (-np.inf, np.inf)
                          for v in k.outputs)
        sums = np.zeros((len(step.stats), conv.O), np.float64)
        controls = thread_controls()
        nthreads = fused_threads(conv, setting("num_threads"), direct or all(controls))
        fn(tuple(conv), x, xs, xcode, wpack, tuple(arrays), tuple(strides), tuple(codes), slot,
           sums, eattrs, sattrs, nthreads, controls, clips)
        count = conv.pixels
        for s, total in zip(step.stats, sums):
            with np.errstate(invalid="ignore", divide="ignore"):  # an empty mean is NaN
                mean = (total / count, (step.channel,))
            self._store(s.call.result, mean, st)
        return True

    def _store(self, value: Value, arr: Array, st: "_State") -> None:
        """A library result (a mean) into the environment, or into its output array."""
        if value.kind is not Kind.OUTPUT:
            st.env[value] = (_narrowed(arr[0], st.temp_dtype), arr[1])
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
    def _temp_shape(ins: List[Array], labels) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
        """The names and shape of the space a kernel reading `ins` iterates over."""
        return _iteration_space(tuple((arr.shape, n) for arr, n in ins), labels)

    @classmethod
    def _temp(cls, ins: List[Array], labels, dtype) -> Array:
        nm, shape = cls._temp_shape(ins, labels)
        return np.empty(shape, dtype=dtype), nm

    def _kernel(self, k: Kernel, env: Dict[Value, Array], bound: Bound, module, tag: str,
                warm: bool, clips=None, sums: Sequence[Tuple[int, "_Folded"]] = (),
                discard: int = 0) -> None:
        """`sums`: (output index, _Folded) of the sums folded into `k` that this call adds up
        (the layout of each one's partials is an operand: the kernel keeps the parts a chunk
        touches)."""
        out_arr, iter_names = env[k.outputs[0]]
        operands = ([env[v] for v in k.inputs] + [env[v] for v in k.outputs]
                    + [(folded.layout(), folded.names) for _, folded in sums])
        ccode = TAG_CODES[tag]
        key = (k.name, iter_names, out_arr.shape, ccode,
               tuple((arr.shape, arr.strides, arr.dtype, nm) for arr, nm in operands))
        geom = self._geometries.get(key)
        if geom is None:
            geom = self._geometry(k, operands, iter_names, out_arr.shape, ccode, len(sums))
            _remember(self._geometries, key, geom)
        if out_arr.size == 0:
            return
        fn = getattr(module, f"{k.name}_{tag}")
        args = (geom, tuple(arr for arr, _ in operands), *[bound.attrs[a] for a in k.attrs],
                setting("num_threads"), warm)
        extra = {}
        if sums:
            extra = {"sums": tuple(len(k.inputs) + i for i, _ in sums),
                     "sum_outs": tuple(folded.total for _, folded in sums),
                     "sum_lanes": tuple(folded.lanes for _, folded in sums),
                     # data stored narrower than computed (float16): float32 lanes add blocks
                     # first (opk_lanes)
                     "sum_blocks": bound.dtype.itemsize < _instance(bound.dtype)[1].itemsize,
                     "discard": discard}
        fn(*args, clips, **extra) if clips is not None else fn(*args, **extra)

    def _geometry(self, k: Kernel, operands, iter_names, iter_shape, ccode: int,
                  nsums: int = 0) -> np.ndarray:
        strides = []
        labels = list(k.operands) + ["a folded sum"] * nsums
        for (arr, nm), vid in zip(operands, labels):
            for n, s in zip(nm, arr.shape):
                if n not in iter_names and s != 1 or (n in iter_names and s not in (1, iter_shape[iter_names.index(n)])):
                    raise ValueError(f"{self.where}: {vid} of shape {arr.shape} does "
                                     f"not fit the result's shape {iter_shape}")
            strides.append(tuple(operand_strides(arr, nm, iter_names, iter_shape)))
        # partial sums are written like outputs, and walked in the outputs' order (never
        # transposed through a block buffer: a tile is added up where it is computed)
        geom = geometry(tuple(iter_shape), tuple(strides),
                        tuple(DTYPE_CODES[dtype_name(arr.dtype)] for arr, _ in operands),
                        tuple(arr.itemsize for arr, _ in operands), len(k.outputs) + nsums, ccode,
                        transpose=not nsums, nsums=nsums)
        geom.flags.writeable = False
        return geom

    def _library(self, step: LibCall, env, bound: Bound, out_dtypes, like, clip=None,
                 final=None, module=None) -> None:
        compute = _instance(bound.dtype)[1]
        if step.prim in COMPILED_REDUCTIONS:  # the module's, where it takes the call
            arr, nm = env[step.args[0]]
            done = compiled_reduction(module, step.prim, arr, nm, step.params[0],
                                      setting("num_threads"))
            if done is not None:
                self._put(step.result, (done, tuple(n for n in nm if n in step.params[0])), env,
                          out_dtypes, like, clip, compute, final)
                return
        if step.prim in CONV_GRADS and module is not None:  # the module's GEMM, where it takes it
            s, p = conv_ints(*(_number(a, bound) for a in step.args[2:]))
            grad = compiled_conv_grad(module, step.prim, env[step.args[0]], env[step.args[1]], s, p,
                                      step.params, bound.sizes, bound.layout, compute,
                                      setting("num_threads"))
            if grad is not None:
                self._put(step.result, grad, env, out_dtypes, like, clip, compute, final)
                return
        ctx = Context(bound.values, sizes=bound.sizes)
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
        self._put(step.result, (np.asarray(arr), nm), env, out_dtypes, like, clip, compute, final)

    def _put(self, value: Value, computed: Array, env, out_dtypes, like, clip, compute: np.dtype,
             final) -> None:
        """A library call's (or folded sum's) result into the environment, or into its output."""
        arr, nm = computed  # an array: kernels take arrays, never NumPy scalars
        if value.kind is not Kind.OUTPUT:
            env[value] = (arr, nm)
            return
        if value not in env:
            env[value] = self._allocate(like[value], out_dtypes[value])
        dst, dst_names = env[value]
        # a float16 gradient summed in float32 may pass 65504: it rounds to inf, as a
        # kernel's store does, without a warning
        src = named.expand_to(arr, nm, dst_names)
        narrows = dst.dtype.itemsize < src.dtype.itemsize  # (errstate costs a call's µs)
        with np.errstate(over="ignore") if narrows else contextlib.nullcontext():
            np.copyto(dst, src, casting="unsafe")
        if clip is not None and self.plan.kind == Pass.BACKWARD:
            np.clip(dst, -clip, clip, out=dst)
        self._keep_precise(value, (arr, nm), env, compute, final)

    def _keep_precise(self, value: Value, computed: Array, env, compute: np.dtype, final) -> None:
        """An output that later steps read (a batch mean) is read by them in the compute type,
        not rounded to a float16 output first: the output array is put back at the end."""
        if final is None or value not in self.reread or env[value][0].dtype.itemsize >= compute.itemsize:
            return
        final[value] = env[value]
        arr, nm = computed
        env[value] = (named.expand_to(np.asarray(arr, dtype=compute), nm, final[value][1]),
                      final[value][1])
