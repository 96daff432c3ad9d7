"""Run a lowered plan on checked arrays: allocate, call kernels, run library steps."""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..codegen import DTYPE_CODES, TAG_CODES, instance_tag
from ..config import get as setting
from ..dsl import named
from ..dsl.library import LIBRARY, Context
from ..lower import Attr, Const, Kernel, Kind, LibCall, Plan, Value, compute_dtype
from .bind import Bound, dtype_name
from .geometry import geometry, operand_strides

Array = Tuple[np.ndarray, Tuple[str, ...]]   # an array and the dim names of its axes


@functools.lru_cache(maxsize=None)
def _instance(dtype: np.dtype) -> Tuple[str, np.dtype]:
    """The kernel instance (f, d, i, l) a result dtype runs on, and the dtype of its temps."""
    name = dtype_name(dtype)
    return instance_tag(name), np.dtype(compute_dtype(name))


class Executor:
    """A plan plus what the runtime precomputes about it once."""

    def __init__(self, plan: Plan, where: str):
        self.plan = plan
        self.where = where
        self._geometries: Dict[tuple, np.ndarray] = {}  # kernel geometry per operand layout
        self.values = {n: Value.input(n) for n in plan.inputs}  # arrays by the name they bind to
        self.readers: Dict[Value, List[int]] = {}
        for i, step in enumerate(plan.steps):
            for v in (step.inputs if isinstance(step, Kernel) else step.args):
                self.readers.setdefault(v, []).append(i)
        # a temp read only by one sum_to that lands in an output can be that output, whenever the
        # call's shapes make the reduction an identity (the common case: nothing is broadcast)
        self.direct: Dict[Value, LibCall] = {}
        for i, step in enumerate(plan.steps):
            if isinstance(step, LibCall) and step.prim == "sum_to" and step.result.kind is Kind.OUTPUT:
                src = step.args[0]
                if src.kind is Kind.TEMP and self.readers.get(src) == [i]:
                    self.direct[src] = step

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
        for step in self.plan.steps:
            if isinstance(step, LibCall):
                if step.name in skipped:
                    continue
                self._library(step, env, bound, out_dtypes, like, clip)
                continue
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
                env[vid] = self._temp(ins, step.inputs, temp_dtype)
            clips = None
            if clip is not None and self.plan.kind == "backward":
                # a result that lands in an output as it is gets clamped on store
                clips = tuple((-clip, clip) if v.kind is Kind.OUTPUT or
                              (v in self.direct and self.direct[v].name in skipped)
                              else (-np.inf, np.inf) for v in step.outputs)
            self._kernel(step, env, bound, module, tag, any(v in out_arrays for v in step.outputs), clips)
        for out_name, vid in self.plan.outputs:
            results[out_name] = env[vid][0]
        return results

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

    def _library(self, step: LibCall, env, bound: Bound, out_dtypes, like, clip=None) -> None:
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
        else:
            env[step.result] = (arr, nm)
