"""The callable operator: checks arguments, builds its module on first use, runs its plans."""
from __future__ import annotations

import threading
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..builder import BuildResult, build, toolchain
from ..errors import BuildError
from ..target import fallback_isas
from ..config import get as setting
from ..config import call_state
from ..spec.model import INT_DTYPES
from .bind import dtype_name
from .precision import apply_mode, quantized_attrs
from ..codegen import render
from ..dsl.graph import OpGraphs, build_graphs
from ..dsl.variants import Variant, pick, variants
from ..backend import gemm
from ..errors import FusionWarning
from ..lower import Fused, Lowered, Value, lower
from ..spec.model import OpSpec
from .bind import Bound, bind, split_args
from .execute import Executor
from .schedule import ExecSchedule
from ..kinds import AttrType, Pass
from .scalars import check_scalars


def _disjoint(labelled, where: str) -> None:
    """out= arrays that share memory: a ValueError naming the two."""
    for i, (a, x) in enumerate(labelled):
        for b, y in labelled[i + 1:]:
            if np.may_share_memory(x, y):
                raise ValueError(f"{where}: {a} and {b} overlap in memory; give each result "
                                 "an array of its own")


def check_clip(clip, where: str) -> Optional[float]:
    if clip is None:
        return None
    if isinstance(clip, bool) or not isinstance(clip, (int, float, np.floating, np.integer)):
        raise TypeError(f"{where}: clip must be a positive number or None, got {type(clip).__name__}")
    clip = float(clip)
    if not clip > 0:
        raise ValueError(f"{where}: clip must be > 0, got {clip!r}")
    return clip


class Op:
    """A registered operator: `op(x, ...)`, `op.backward(dy, x, ...)`, `op.spec`, `op.name`."""

    def __init__(self, spec: OpSpec, graphs: OpGraphs, lowered: Optional[Lowered] = None):
        """Nothing is compiled, probed or (unless `lowered` is given) lowered here: operators
        cost nothing until they are called. `graphs` (and `lowered`) are those of the first
        variant; an operator with str attrs or optional inputs builds the others on demand."""
        self.spec = spec
        self.name = spec.name
        self.graphs = graphs
        self.variants: Tuple[Variant, ...] = variants(spec)
        self.__doc__ = f"{spec.name}: {spec.summary}" if spec.summary else spec.name
        self._lock = threading.RLock()
        self._modules: Dict[str, object] = {}
        self._fast: Dict[str, Callable] = {}  # isa -> the module's direct call, if it has one
        self._fast_bwd: Dict[str, Callable] = {}  # isa -> its direct backward call, if any
        self._shapes: Dict[tuple, object] = {}  # what calls with the same shapes decided
        self._builds: Dict[str, BuildResult] = {}
        self._graphs: Dict[int, OpGraphs] = {0: graphs}         # by variant index
        self._lowered: Dict[int, Lowered] = {0: lowered} if lowered is not None else {}
        self._executors: Dict[int, Tuple[Executor, Optional[Executor]]] = {}
        # the arrays a call writes, named once: calls key their arrays by these
        self._outputs = {o.name: Value.output(o.name) for o in spec.outputs}
        self._grads = {i.name: Value.output("d" + i.name) for i in spec.inputs}
        self._fusion_warned = False
        self._inplace = {(self._outputs[o], i) for o, i in spec.schedule.inplace}

    def __repr__(self) -> str:
        ins = ", ".join(self.spec.input_names)
        attrs = ", ".join(f"{a.name}={a.default!r}" for a in self.spec.attrs if not a.required)
        return f"<opkit op {self.name}({ins}{', ' + attrs if attrs else ''}) from {self.spec.file}>"

    # ------------------------------------------------------------------ pipeline

    def graphs_of(self, variant: Variant) -> OpGraphs:
        """The graphs of one variant (what str attrs and optional inputs decide)."""
        graphs = self._graphs.get(variant.index)
        if graphs is None:
            with self._lock:
                graphs = self._graphs.get(variant.index)
                if graphs is None:
                    graphs = self._graphs[variant.index] = build_graphs(self.spec, variant)
        return graphs

    def lowered(self, variant: Optional[Variant] = None) -> Lowered:
        """The kernel plans (of the first variant, or of `variant`): a pure function of the
        declaration, the same on every machine."""
        index = variant.index if variant is not None else 0
        done = self._lowered.get(index)
        if done is None:
            with self._lock:
                done = self._lowered.get(index)
                if done is None:
                    graphs = self.graphs_of(variant) if variant is not None else self.graphs
                    done = self._lowered[index] = lower(self.spec, graphs)
        return done

    def _run_plans(self, variant: Optional[Variant] = None) -> Tuple[Executor, Optional[Executor]]:
        index = variant.index if variant is not None else 0
        found = self._executors.get(index)
        if found is None:
            lowered = self.lowered(variant)
            bwd = lowered.backward
            found = self._executors[index] = (
                Executor(lowered.forward, f"{self.name}()"),
                Executor(bwd, f"{self.name}.backward()") if bwd is not None else None)
        return found

    @property
    def _fwd(self) -> Executor:
        return self._run_plans()[0]

    @property
    def _bwd(self) -> Optional[Executor]:
        return self._run_plans()[1]

    def to_onnx(self, path=None, inputs=None, attrs=None, **options):
        """Export to ONNX (opkit.onnx.export: example inputs or shapes, attrs, layout, dtype,
        opset, backward); writes `path` when given and returns the ModelProto."""
        from ..onnx import export
        return export(self, path, inputs, attrs, **options)

    def source(self, isa: str = "") -> str:
        """The generated Cython module for `isa` (default: the isa setting): every variant's
        kernels in one module."""
        others = [(v, self.graphs_of(v), self.lowered(v)) for v in self.variants[1:]]
        return render(self.spec, self.graphs, self.lowered(), toolchain(isa).target, others)

    def fusion_notes(self) -> Tuple[str, ...]:
        """The forward pass's "Cannot fuse ..." lines: the ones FusionWarning reports at build
        (`opkit show` lists every line, the backward's included)."""
        lowered = self.lowered()
        notes = [str(n) for n in lowered.forward.fusion if not n.fused]
        if gemm() is None:  # the fused steps run their parts one after another
            notes += [f"Cannot fuse the epilogue of {s.call.prim} ({s.call.loc}): no GEMM backend "
                      "for fused calls (OPKIT_GEMM=none, or OPKIT_GEMM=blas without SciPy); the "
                      "call and its epilogue run one after another" for s in lowered.forward.steps
                      if isinstance(s, Fused)]
        return tuple(notes)

    def build(self, force: bool = False, isa: str = "") -> BuildResult:
        """Compile the kernels into the cache (a cache hit does no work). Each unfused epilogue
        of the forward pass is reported as an opkit.FusionWarning."""
        tc = toolchain(isa)
        if not getattr(self, "_fusion_warned", False):  # once per operator, not every build
            self._fusion_warned = True
            for note in self.fusion_notes():
                warnings.warn(note, FusionWarning, stacklevel=2)
        with self._lock:
            result: Optional[BuildResult]
            try:
                result = build(self.name, self.source(tc.target.isa), self.spec.canonical(), tc,
                               force=force)
            except BuildError as exc:
                # no compiler and no module for this CPU's features: the best shipped one it runs
                refused: List[str] = []
                result = None if force or tc.available else self._shipped_fallback(tc, refused)
                if result is None:
                    if refused:  # shipped modules of another ISA exist but do not serve: why
                        raise BuildError("; ".join([str(exc), *refused])) from None
                    raise
            self._builds[tc.target.isa] = result
            if force:
                self._modules.pop(tc.target.isa, None)
                self._fast.pop(tc.target.isa, None)
                self._fast_bwd.pop(tc.target.isa, None)
            return result

    def _shipped_fallback(self, tc, refused: List[str]) -> Optional[BuildResult]:
        """For the native ISA without a compiler: a shipped module of the best ISA level this
        CPU runs (x86-64-v3, then portable), if a wheel carries one; `refused` collects why
        those built for this operator's content are not used."""
        for isa in fallback_isas(tc.target.isa):
            try:
                return build(self.name, self.source(isa), self.spec.canonical(), toolchain(isa))
            except BuildError as exc:
                refused += getattr(exc, "refused", [])
        return None

    def module(self, isa: str = ""):
        """The loaded kernel module for `isa` (default: the isa setting), built on first use."""
        key = isa or setting("isa")
        mod = self._modules.get(key)
        if mod is None:
            with self._lock:
                mod = self._modules.get(key)
                if mod is None:
                    mod = self.build(isa=key).load()
                    self._modules[key] = mod
                    self._fast[key] = self._direct(mod, "fast_forward", 0)
                    self._fast_bwd[key] = self._direct(mod, "fast_backward", 1)
        return mod

    def _direct(self, mod, fn: str, leading: int):
        """The module's direct call `fn`, or None. An operator with str attrs has one per
        variant (`Variant.direct`): the call's values pick it, and leave its keywords (the direct
        call parses the other attrs). `leading`: the arguments before the inputs (backward's dy)."""
        names = tuple(a.name for a in self.spec.attrs if a.type == AttrType.STR)
        if not names:
            return getattr(mod, fn, None)
        table = {tuple(value for _, value in v.choices): getattr(mod, v.direct(fn), None)
                 for v in self.variants}
        if any(f is None for f in table.values()):
            return None
        defaults = tuple(a.default for a in self.spec.attrs if a.type == AttrType.STR)
        most = leading + len(self.spec.inputs)  # (a str attr given by position: checked path)

        def direct(args, kwargs, out, nthreads):
            choice = tuple(kwargs.get(n, d) for n, d in zip(names, defaults))
            f = table.get(choice) if len(args) <= most and \
                all(type(c) is str for c in choice) else None
            if f is None:
                return NotImplemented
            return f(args, {k: v for k, v in kwargs.items() if k not in names}, out, nthreads)
        return direct

    # ------------------------------------------------------------------ calls

    def _prepare_out(self, out, bound: Bound, where: str) -> Dict[Value, np.ndarray]:
        outputs = self.spec.outputs
        if isinstance(out, tuple):
            outs = out
        elif len(outputs) == 1:
            outs = (out,)
        else:
            raise TypeError(f"{where}: out must be a tuple of {len(outputs)} arrays "
                            f"({', '.join(o.name for o in outputs)}), got {type(out).__name__}")
        if len(outs) != len(outputs):
            raise ValueError(f"{where}: out must hold {len(outputs)} array(s), got {len(outs)}")
        result = {}
        labels = []
        for o, arr in zip(outputs, outs):
            label = "out" if len(outputs) == 1 else f"out[{o.name}]"
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{where}: {label} must be a NumPy array, got {type(arr).__name__}")
            if dtype_name(arr.dtype) != dtype_name(bound.dtype):  # any byte order
                raise TypeError(f"{where}: {label} must have dtype {bound.dtype.name} (the result's "
                                f"dtype), got {arr.dtype.name}")  # (only on the error path)
            _, shape, _ = bound.outputs[o.name]
            if arr.shape != tuple(shape):
                raise ValueError(f"{where}: {label} must have shape {tuple(shape)}, got {arr.shape}")
            if not arr.flags.writeable:
                raise ValueError(f"{where}: {label} is read-only")
            result[self._outputs[o.name]] = arr
            labels.append((label, arr))
        _disjoint(labels, where)
        return result

    def _resolve_overlap(self, bound: Bound, outs: Dict[Value, np.ndarray]) -> None:
        """An input sharing memory with an out array is copied first, unless it is exactly the
        same array and the declaration lets that output overwrite it (schedule.inplace)."""
        inplace = self._inplace
        for vid, out_arr in outs.items():
            for name, (arr, names) in list(bound.values.items()):
                if not np.may_share_memory(out_arr, arr):
                    continue
                same = (arr.__array_interface__["data"][0] == out_arr.__array_interface__["data"][0]
                        and arr.shape == out_arr.shape and arr.strides == out_arr.strides
                        and arr.dtype == out_arr.dtype)
                if same and (vid, name) in inplace:
                    continue
                bound.values[name] = (arr.copy(order="K"), names)

    @staticmethod
    def _aligned(bound: Bound) -> None:
        for vid, (arr, names) in list(bound.values.items()):
            if not arr.flags.aligned:
                bound.values[vid] = (arr.copy(order="K"), names)

    @staticmethod
    def _stage_outs(outs: Dict[Value, np.ndarray], dtype: np.dtype) -> Dict[Value, np.ndarray]:
        """Plain, aligned, native-order arrays for the kernels to write: subclasses (np.memmap
        ...) are written through a base-class view; unaligned or byte-swapped outputs get a
        buffer of their own, copied into them after the run."""
        kernel_outs = {}
        for vid, arr in outs.items():
            base = arr if type(arr) is np.ndarray else arr.view(np.ndarray)
            if not base.flags.aligned or not base.dtype.isnative:
                base = np.empty_like(base, dtype=dtype)
            kernel_outs[vid] = base
        return kernel_outs

    def _like(self, bound: Bound) -> Dict[Value, tuple]:
        like = {}
        for o in self.spec.outputs:
            out_names, shape, like_arr = bound.outputs[o.name]
            if like_arr is None:
                like_arr = np.broadcast_to(np.empty((), bound.dtype), shape)
            like[self._outputs[o.name]] = (like_arr, out_names)
        return like

    def __call__(self, *args, out=None, layout: Optional[str] = None,
                 precision_mode: Optional[str] = None, **kwargs):
        if layout is None and precision_mode is None:
            isa, nthreads, plain = call_state()
            fast = self._fast.get(isa) if plain else None
            if fast is not None:
                result = fast(*self._inputs_in_place(args, kwargs), out, nthreads)
                if result is not NotImplemented:
                    return result
        return self._call(args, kwargs, out, layout, precision_mode)

    def _inputs_in_place(self, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        """(args, kwargs) with the inputs given by keyword moved into their positions: the
        direct calls take inputs positionally. The checked path gets the call as written."""
        names = self.spec.input_names
        if not kwargs or len(args) >= len(names) or names[len(args)] not in kwargs:
            return args, kwargs
        kwargs = dict(kwargs)
        for name in names[len(args):]:
            if name not in kwargs:
                break
            args += (kwargs.pop(name),)
        return args, kwargs

    def _variant(self, bound: Bound) -> Variant:
        """The variant a checked call runs: its str attrs' values, the optional inputs given."""
        if len(self.variants) == 1:
            return self.variants[0]
        given = tuple(i.name for i in self.spec.inputs if i.optional and i.name in bound.values)
        return pick(self.variants, bound.attrs, given)

    def _prepare(self, args, kwargs, layout, precision_mode, where, extra=()):
        """Arguments matched, cast by the precision mode, checked and bound. `extra`:
        (name, output) of the output gradients a backward call carries."""
        given = split_args(self.spec, self.spec.input_names, args, kwargs, where,
                           [name for name, _ in extra])
        mode = precision_mode if precision_mode is not None else setting("precision_mode")
        given = apply_mode(self.spec, given, mode, where, [name for name, _ in extra])
        extra = [(name, given[name], like) for name, like in extra]
        bound = bind(self.spec, given, layout, where, extra, cache=self._shapes)
        if setting("alpha_quant") or dtype_name(bound.dtype) in INT_DTYPES:
            bound.attrs = quantized_attrs(self.spec, bound.attrs)
        return bound

    def _call(self, args, kwargs, out, layout, precision_mode):
        where = f"{self.name}()"
        bound = self._prepare(args, kwargs, layout, precision_mode, where)
        fwd = self._run_plans(self._variant(bound))[0]
        check_scalars(self.spec, fwd.plan, bound.attrs, bound.dtype, where)
        given = self._prepare_out(out, bound, where) if out is not None else {}
        self._aligned(bound)
        outs = self._stage_outs(given, bound.dtype)
        self._resolve_overlap(bound, outs)
        like = self._like(bound)
        dtypes = {vid: bound.dtype for vid in like}
        results = fwd.run(bound, self.module(), outs, dtypes, like)
        for vid, arr in given.items():
            if not np.may_share_memory(arr, outs[vid]):  # a buffer of its own (_stage_outs)
                np.copyto(arr, outs[vid])
            results[vid.name] = arr  # the caller's own object, whatever its type
        values = tuple(results[o.name] for o in self.spec.outputs)
        return values[0] if len(values) == 1 else values

    def schedules(self, *args, layout: Optional[str] = None, clip: Optional[float] = None,
                  **kwargs) -> Dict[Pass, ExecSchedule]:
        """How a forward call on these arrays, and the backward call after it, run
        (runtime/schedule.py: whole, or in slices along a dim), without running them. Only the
        arrays' shapes, strides and dtypes are read (`opkit show NAME --shape ...`)."""
        where = f"{self.name}.schedules()"
        bound = self._prepare(args, kwargs, layout, None, where)
        variant = self._variant(bound)
        fwd, bwd = self._run_plans(variant)
        found = {Pass.FORWARD: fwd.schedule(bound, self._like(bound))}
        if bwd is not None and dtype_name(bound.dtype) not in INT_DTYPES:
            cots = {f"d{name}": np.empty(shape, bound.dtype)   # (never written: not touched)
                    for name, (_, shape, _) in bound.outputs.items()}
            grad = self._prepare(args, {**kwargs, **cots}, layout, None, where,
                                 [(f"d{o.name}", o.name) for o in self.spec.outputs])
            found[Pass.BACKWARD] = bwd.schedule(grad, self._grad_targets(grad, variant)[1],
                                                check_clip(clip, where))
        return found

    def backward(self, dy, *args, out: Optional[tuple] = None, layout: Optional[str] = None,
                 precision_mode: Optional[str] = None, clip: Optional[float] = None, **kwargs) -> Tuple:
        """Gradients of every input, in declared order (None for non-differentiable ones).

        `dy` is the gradient of the output (a tuple of them when the operator has several).
        `out`: a tuple with one entry per input, an array to write that input's gradient into
        (its shape and dtype) or None to have it allocated.
        `clip`: every gradient is clamped to [-clip, clip] in the same pass that computes it."""
        if layout is None and precision_mode is None and clip is None and type(dy) is np.ndarray:
            isa, nthreads, plain = call_state()
            fast = self._fast_bwd.get(isa) if plain else None
            if fast is not None:
                inputs, named = self._inputs_in_place(args, kwargs)
                result = fast((dy,) + inputs, named, out, nthreads)
                if result is not NotImplemented:
                    return result
        where = f"{self.name}.backward()"
        if not any(i.differentiable for i in self.spec.inputs):
            raise TypeError(f"{where}: {self.name} has no differentiable inputs")
        clip = check_clip(clip, where)
        outputs = self.spec.outputs
        if len(outputs) == 1:
            cots = tuple(dy) if isinstance(dy, tuple) else (dy,)
        else:
            if not isinstance(dy, (tuple, list)):
                raise TypeError(f"{where}: dy must be a tuple of {len(outputs)} gradients "
                                f"({', '.join('d' + o.name for o in outputs)})")
            cots = tuple(dy)
        if len(cots) != len(outputs):
            raise ValueError(f"{where}: expected {len(outputs)} output gradient(s), got {len(cots)}")
        cot_names = [f"d{o.name}" for o in outputs]
        kwargs = dict(kwargs)
        for name, c in zip(cot_names, cots):
            if name in kwargs:
                raise TypeError(f"{where} got {name} twice (as dy and by keyword)")
            kwargs[name] = c
        bound = self._prepare(args, kwargs, layout, precision_mode, where,
                              [(n, o.name) for n, o in zip(cot_names, outputs)])
        ints = [n for n in self.spec.input_names
                if n in bound.values and bound.values[n][0].dtype.kind in "iu"]
        if ints or dtype_name(bound.dtype) in INT_DTYPES:
            raise TypeError(f"{where}: integer calls have no gradient ({', '.join(ints) or 'dy'} "
                            "is an integer array); pass float arrays")
        variant = self._variant(bound)
        bwd = self._run_plans(variant)[1]
        results = {}
        given = self._prepare_grad_out(out, bound, variant, where) if out is not None else {}
        if bwd is not None:  # (None: only absent optional inputs could take gradients)
            check_scalars(self.spec, bwd.plan, bound.attrs, bound.dtype, where)
            self._aligned(bound)
            dtypes, like = self._grad_targets(bound, variant)
            outs = {vid: self._stage_outs({vid: arr}, dtypes[vid])[vid] for vid, arr in given.items()}
            self._resolve_overlap(bound, outs)
            results = bwd.run(bound, self.module(), outs, dtypes, like, clip)
            for vid, arr in given.items():
                if not np.may_share_memory(arr, outs[vid]):  # a buffer of its own (_stage_outs)
                    np.copyto(arr, outs[vid])
                results[vid.name] = arr
        return tuple(results.get(f"d{n}") for n in self.spec.input_names)

    def _prepare_grad_out(self, out, bound: Bound, variant: Variant,
                          where: str) -> Dict[Value, np.ndarray]:
        """backward(out=...): one entry per input, None or the array its gradient goes into."""
        names = self.spec.input_names
        if not isinstance(out, (tuple, list)) or len(out) != len(names):
            raise TypeError(f"{where}: out must be a tuple of {len(names)} entries, one per input "
                            f"({', '.join('d' + n for n in names)}), each an array or None; got "
                            f"{type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""))
        takes = self.graphs_of(variant).differentiable
        result = {}
        labels = []
        for name, arr in zip(names, out):
            if arr is None:
                continue
            label = f"out[d{name}]"
            if name not in takes:
                raise ValueError(f"{where}: {label} must be None: {name} takes no gradient"
                                 + (" (it was not given)" if name not in bound.values else ""))
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{where}: {label} must be a NumPy array or None, got {type(arr).__name__}")
            inp = bound.values[name][0]
            if dtype_name(arr.dtype) != dtype_name(inp.dtype):
                raise TypeError(f"{where}: {label} must have dtype {inp.dtype.name} ({name}'s dtype), "
                                f"got {arr.dtype.name}")
            if arr.shape != inp.shape:
                raise ValueError(f"{where}: {label} must have shape {inp.shape} ({name}'s shape), "
                                 f"got {arr.shape}")
            if not arr.flags.writeable:
                raise ValueError(f"{where}: {label} is read-only")
            result[self._grads[name]] = arr
            labels.append((label, arr))
        _disjoint(labels, where)
        return result

    def _grad_targets(self, bound: Bound, variant: Variant):
        """(dtypes, like) of the gradients a backward call writes."""
        like, dtypes = {}, {}
        for name in self.graphs_of(variant).differentiable:
            arr, names = bound.values[name]
            like[self._grads[name]] = (arr, names)
            dtypes[self._grads[name]] = arr.dtype  # a gradient takes its input's dtype
        return dtypes, like

