"""Every opkit operator as a PyTorch custom operator (torch.library.custom_op).

For an operator `name` with inputs x, ... and attrs a, ...:

    opkit::name(Tensor x, ..., float a=<default>, ...) -> Tensor             autograd, fake kernel
    opkit::name_out(Tensor x, ..., float a=.., *, Tensor(a!) out) -> Tensor(a!)      torch.Tag.out
    opkit::name_(Tensor(a!) x, ..., float a=..) -> Tensor(a!)                torch.Tag.inplace,
                                        when the declaration lets the output overwrite x
    opkit_backward::name(Tensor dy, Tensor x, ..., float a=..) -> Tensor     the gradients of the
                                        differentiable inputs: opkit's own backward pass

The backward is an operator of its own, with a fake kernel, so torch.compile traces the backward
pass as well as the forward. An operator's own name wins over another's `_out` or `_` variant.
"""
from __future__ import annotations

import math
import threading
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..config import DEFAULT_PRECISION, call_state
from ..config import get as setting
from ..runtime import Op
from ..spec.model import DtypeLimit
from .tensors import DTYPES, TORCH_DTYPES, Convert, as_array, channels_last, check_tensor, torch_order

NAMESPACE = "opkit"
BACKWARD_NAMESPACE = "opkit_backward"
_TYPES = {"float": "float", "int": "int", "bool": "bool", "str": "str"}

_lock = threading.RLock()
_ENTRIES: Dict[str, "Entry"] = {}
_FAILED: Dict[str, str] = {}  # operator name -> why it could not be registered


class RegistrationError(Exception):
    """Why an operator cannot be a PyTorch operator (opkit.torch warns and goes on)."""


# ----------------------------------------------------------------------------- schemas

def _default(a) -> Optional[str]:
    """The schema text of an attr's default (None: the attr is required)."""
    if a.required:
        return None
    v = a.default
    if v is None:
        return "None"
    if a.type == "bool":
        return "True" if v else "False"
    if a.type == "int":
        return str(int(v))
    if a.type == "str":
        return repr(v)  # a choice: letters, digits and underscores
    if isinstance(v, DtypeLimit):
        return "None"   # the call's dtype decides it: None stands for it
    return repr(float(v)) if math.isfinite(v) else "None"  # schemas cannot spell inf


def _attr_decl(a) -> str:
    typ = _TYPES.get(a.type)
    if typ is None:
        raise RegistrationError(f"attr {a.name} of type {a.type!r} has no PyTorch schema type")
    default = _default(a)
    optional = a.nullable or default == "None"
    return f"{typ}{'?' if optional else ''} {a.name}" + (f"={default}" if default is not None else "")


def schema(spec, mutable: Optional[str] = None, outs: Sequence[str] = (),
           cotangents: Sequence[str] = (), returns: Optional[int] = None) -> str:
    """A schema string: any cotangents, the inputs as Tensors, then the attrs with their defaults
    (positional or keyword, as opkit's own calls take them), then any out= tensors."""
    args = [f"Tensor {c}" for c in cotangents]
    args += [f"Tensor? {i.name}=None" if i.optional else
             f"Tensor{'(a!)' if i.name == mutable else ''} {i.name}" for i in spec.inputs]
    args += [_attr_decl(a) for a in spec.attrs]
    letters = "abcdefghijklmnopqrstuvwxyz"
    if outs:
        args += ["*"] + [f"Tensor({letters[j]}!) {n}" for j, n in enumerate(outs)]
    if mutable:
        ret = "Tensor(a!)"
    elif outs:
        rets = [f"Tensor({letters[j]}!)" for j in range(len(outs))]
        ret = rets[0] if len(rets) == 1 else f"({', '.join(rets)})"
    else:
        n = len(spec.outputs) if returns is None else returns
        ret = "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"
    return f"({', '.join(args)}) -> {ret}"


# ----------------------------------------------------------------------------- one operator

class Entry:
    """The PyTorch side of one opkit operator: its conversions and the calls registered."""

    def __init__(self, op: Op):
        self.op = op
        self.name = op.name
        spec = op.spec
        self.spec = spec
        self.conv = Convert(op, f"torch.ops.{NAMESPACE}.{op.name}")
        self.n_out = len(spec.outputs)
        self.out_names = ["out"] if self.n_out == 1 else list(spec.output_names)
        # every input that can take a gradient (an optional one in the variants that give it)
        self.differentiable = [k for k, i in enumerate(spec.inputs) if i.differentiable]
        # attrs whose default a schema cannot spell (inf) are optional there; None means default
        self.unspelled = {a.name: a.default for a in spec.attrs
                          if not a.required and not a.nullable and _default(a) == "None"}
        self.inplace = self._inplace_input()
        self.variants = {"out": f"{op.name}_out"}  # kind -> torch.ops.opkit name
        if self.inplace:
            self.variants["inplace"] = f"{op.name}_"
        self.defs: Dict[str, object] = {}  # kind -> its CustomOpDef
        self.guard = None
        # the common call takes a shorter path (see _forward_plain)
        self.plain = self.conv.agnostic and self.n_out == 1 and not self.unspelled and \
            not any(i.optional for i in spec.inputs)
        self.attr_set = frozenset(spec.attr_names)
        self.allowed = [frozenset(TORCH_DTYPES[d] for d in i.dtypes if d in TORCH_DTYPES)
                        for i in spec.inputs]

    def _inplace_input(self) -> Optional[str]:
        """The input the in-place variant overwrites: the first input, when the declaration lets
        the only output overwrite it (PyTorch's in-place ops mutate their first argument)."""
        pairs = dict(self.spec.schedule.inplace)
        first = self.spec.input_names[0]
        if self.n_out == 1 and pairs.get(self.spec.output_names[0]) == first:
            return first
        return None

    # -------------------------------------------------------------- shared pieces

    def _split(self, args: tuple, kwargs: dict, lead: int) -> Tuple[tuple, dict]:
        """(the leading tensors, the attrs by name). The dispatcher may leave out trailing attrs
        equal to their defaults: opkit fills those in."""
        n = lead + len(self.spec.inputs)
        attrs = dict(zip(self.spec.attr_names, args[n:])) if len(args) > n else {}
        if kwargs:
            attrs.update(kwargs)
        head = tuple(args[:n])
        if len(head) < n:  # trailing optional inputs left out, or given by keyword
            head += tuple(attrs.pop(i.name, None) for i in self.spec.inputs[len(head) - lead:])
        for name, default in self.unspelled.items():
            if name in attrs and attrs[name] is None:
                if isinstance(default, DtypeLimit):
                    del attrs[name]  # opkit takes the limit of the call's dtype
                else:
                    attrs[name] = default
        return head, attrs

    @staticmethod
    def _mode() -> dict:
        """opkit's precision modes would change a result's dtype behind PyTorch's back (and
        behind a compiled graph's): torch calls compute in their tensors' dtypes."""
        if call_state()[2] or setting("precision_mode") == DEFAULT_PRECISION:
            return {}
        return {"precision_mode": DEFAULT_PRECISION}

    def _names(self, call, arrays, attrs):
        return self.conv.names(call, arrays, attrs) if self.conv.needs_names(call) else None

    # -------------------------------------------------------------- the calls

    def forward(self, *args, **kwargs):
        if self.plain and self.attr_set.issuperset(kwargs):
            result = self._forward_plain(args, kwargs)
            if result is not None:
                return result
        tensors, attrs = self._split(args, kwargs, 0)
        call = self.conv.call(tensors)
        arrays = [as_array(v) for v in call.views]
        results = self.op(*arrays, layout=call.layout, **self._mode(), **attrs)
        if self.n_out == 1:
            results = (results,)
        bound = self._names(call, arrays, attrs)
        outs = []
        for o, arr in enumerate(results):
            t = torch.from_numpy(arr)
            if any(np.may_share_memory(arr, a) for a in arrays if a is not None):  # not an input
                t = t.clone()
            t = self.conv.to_logical(t, call, o, bound)
            k = self.conv.like[o]
            outs.append(torch_order(t, call.tensors[k]) if k is not None else t)
        return outs[0] if self.n_out == 1 else tuple(outs)

    def _plain_arrays(self, tensors, allowed) -> Optional[Tuple[List[np.ndarray], bool]]:
        """(NumPy views, whether they are NHWC views of channels_last tensors) when every tensor
        is a dense CPU tensor of a declared dtype in the first one's memory format, else None."""
        nhwc = tensors[0].dim() == 4 and channels_last(tensors[0])
        arrays = []
        for t, dtypes in zip(tensors, allowed):
            if not (t.is_cpu and t.dtype in dtypes):
                return None
            if nhwc:
                if not (t.dim() == 4 and channels_last(t)):
                    return None
            elif not t.is_contiguous():
                return None
            a = (t.detach() if t.requires_grad else t).numpy()
            arrays.append(a.transpose(0, 2, 3, 1) if nhwc else a)  # (NumPy's is the cheap one)
        return arrays, nhwc

    def _plain_attrs(self, values, kwargs) -> Optional[dict]:
        """The attrs by name; None when one is given twice (the full path says so)."""
        attrs = dict(zip(self.spec.attr_names, values))
        if len(values) > len(attrs) or not attrs.keys().isdisjoint(kwargs):
            return None
        attrs.update(kwargs)
        return attrs

    @staticmethod
    def _tensor(arr: np.ndarray, nhwc: bool) -> torch.Tensor:
        return torch.from_numpy(arr.transpose(0, 3, 1, 2) if nhwc else arr)

    def _plain(self, args, kwargs, allowed):
        """(NumPy views of the leading tensors, NHWC or not, attrs) for a plain call, or None."""
        found = self._plain_arrays(args[:len(allowed)], allowed)
        attrs = self._plain_attrs(args[len(allowed):], kwargs) if found is not None else None
        return None if attrs is None else (*found, attrs)

    def _forward_plain(self, args, kwargs):
        """The common call with less code on the way (each call after a large one finds the
        caches cold, so every step shows): dense CPU tensors of the declared dtypes (contiguous,
        or all channels_last), an operator that takes them as they are and gives one result.
        None: take the full path."""
        found = self._plain(args, kwargs, self.allowed)
        if found is None:
            return None
        arrays, nhwc, attrs = found
        result = self.op(*arrays, **self._mode(), **attrs)
        if any(np.may_share_memory(result, a) for a in arrays):
            return None
        return self._tensor(result, nhwc)

    def _backward_plain(self, args, kwargs):
        """backward's common call, as _forward_plain: dy and the inputs dense alike."""
        n = 1 + len(self.allowed)
        if self.n_out != 1 or len(args) < n or args[0] is None or args[0].dtype != args[1].dtype:
            return None
        found = self._plain(args, kwargs, [self.allowed[0]] + self.allowed)
        if found is None:
            return None
        arrays, nhwc, attrs = found
        grads = self.op.backward(arrays[0], *arrays[1:], **self._mode(), **attrs)
        outs = []
        for k in self.differentiable:
            if any(np.may_share_memory(grads[k], a) for a in arrays):
                return None
            outs.append(self._tensor(grads[k], nhwc))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def inplace_plain(self, args, kwargs) -> bool:
        """The in-place call on dense tensors, as _forward_plain; False: not done (take the
        full path)."""
        found = self._plain(args, kwargs, self.allowed)
        if found is None:
            return False
        arrays, _, attrs = found
        self.op(*arrays, out=arrays[0], **self._mode(), **attrs)
        return True

    def forward_fake(self, *args, **kwargs):
        tensors, attrs = self._split(args, kwargs, 0)
        outs = self.conv.fake_outputs(self.conv.call(tensors), attrs)
        return outs[0] if self.n_out == 1 else tuple(outs)

    def forward_out(self, *args, **kwargs):
        outs = [kwargs.pop(n) for n in self.out_names]
        tensors, attrs = self._split(args, kwargs, 0)
        call = self.conv.call(tensors)
        arrays = [as_array(v) for v in call.views]
        bound = self._names(call, arrays, attrs)
        views = []
        for o, (n, t) in enumerate(zip(self.out_names, outs)):
            check_tensor(t, n, list(DTYPES.values()), self.conv.where)
            _check_writable(t, n, f"torch.ops.{NAMESPACE}.{self.variants['out']}")
            views.append(as_array(self.conv.to_physical(t, call, o, bound)))
        self.op(*arrays, layout=call.layout, out=views[0] if self.n_out == 1 else tuple(views),
                **self._mode(), **attrs)
        return outs[0] if self.n_out == 1 else tuple(outs)

    def forward_inplace(self, *args, **kwargs):
        tensors, attrs = self._split(args, kwargs, 0)
        where = f"torch.ops.{NAMESPACE}.{self.variants['inplace']}"
        call = self.conv.call(tensors)
        _check_writable(tensors[0], self.inplace, where)
        arrays = [as_array(v) for v in call.views]
        dtype = self.conv.names(call, arrays, attrs).dtype
        if dtype != arrays[0].dtype:
            raise TypeError(f"{where}: the result is {dtype.name} (the inputs' dtypes promoted), "
                            f"which {self.inplace} ({arrays[0].dtype.name}) cannot hold: call "
                            f"torch.ops.{NAMESPACE}.{self.name}, or convert the other inputs to "
                            f"{arrays[0].dtype.name}")
        self.op(*arrays, layout=call.layout, out=arrays[0], **self._mode(), **attrs)
        return tensors[0]

    def inplace_autograd(self, keyset, *args, **kwargs):
        """The in-place variant's autograd kernel: an error while autograd records (the gradient
        needs the input the call overwrites), else straight to the kernel."""
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            raise RuntimeError(
                f"torch.ops.{NAMESPACE}.{self.name}_ overwrites {self.inplace}, which the gradient "
                f"needs, so it has no autograd formula: call torch.ops.{NAMESPACE}.{self.name} "
                "where gradients flow (or work under torch.no_grad())")
        with torch._C._AutoDispatchBelowAutograd():
            return self.inplace_op.redispatch(keyset & torch._C._after_autograd_keyset,
                                              *args, **kwargs)

    def backward(self, *args, **kwargs):
        if self.plain and self.attr_set.issuperset(kwargs):
            result = self._backward_plain(args, kwargs)
            if result is not None:
                return result
        head, attrs = self._split(args, kwargs, self.n_out)
        cots, tensors = head[:self.n_out], head[self.n_out:]
        call = self.conv.call(tensors)
        arrays = [as_array(v) for v in call.views]
        bound = self._names(call, arrays, attrs)
        dys = []
        for o, c in enumerate(cots):
            check_tensor(c, f"d{self.spec.outputs[o].name}", ("float16", "float32", "float64"),
                         f"torch.ops.{BACKWARD_NAMESPACE}.{self.name}")
            dys.append(as_array(self.conv.to_physical(c, call, o, bound)))
        grads = self.op.backward(dys[0] if self.n_out == 1 else tuple(dys), *arrays,
                                 layout=call.layout, **self._mode(), **attrs)
        outs = []
        for k in self.differentiable:
            if grads[k] is None:  # an optional input the call left out: a placeholder
                outs.append(cots[0].new_empty(0))
                continue
            g = torch.from_numpy(grads[k])
            if any(np.may_share_memory(grads[k], a) for a in arrays + dys if a is not None):
                g = g.clone()
            outs.append(self.conv.grad_to_logical(g, call, k))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def backward_fake(self, *args, **kwargs):
        head, _ = self._split(args, kwargs, self.n_out)
        tensors = head[self.n_out:]
        self.conv.call(tensors)  # the same checks
        outs = [torch.empty_like(tensors[k]) if tensors[k] is not None
                else head[0].new_empty(0) for k in self.differentiable]
        return outs[0] if len(outs) == 1 else tuple(outs)

    # -------------------------------------------------------------- autograd

    def setup_context(self, ctx, inputs, output):
        n = len(self.spec.inputs)
        # trailing optional inputs a call leaves out are not among `inputs`: they are None
        tensors = tuple(inputs[:n]) + (None,) * (n - len(inputs[:n]))
        ctx.save_for_backward(*tensors)
        ctx.attrs = inputs[n:]

    def grad(self, ctx, *grads):
        needs = ctx.needs_input_grad
        wanted = [k for k in self.differentiable if k < len(needs) and needs[k]]
        result = [None] * len(needs)
        if wanted:
            saved = ctx.saved_tensors
            gs = self.backward_op(*grads, *saved, *ctx.attrs)
            if len(self.differentiable) == 1:
                gs = (gs,)
            for k, g in zip(self.differentiable, gs):
                if k in wanted and saved[k] is not None:
                    result[k] = g
        return tuple(result)

    def no_double_backward(self, ctx, *grads):
        raise RuntimeError(f"torch.ops.{NAMESPACE}.{self.name} has a first derivative only: opkit "
                           "derives no backward of a backward pass (a gradient of a gradient)")

    # -------------------------------------------------------------- registration

    def register(self, taken) -> None:
        """Define the operators; `taken`: names other operators own (no variant takes them)."""
        spec, name = self.spec, self.name
        self.variants = {k: v for k, v in self.variants.items() if v not in taken}
        fn = torch.library.custom_op(f"{NAMESPACE}::{name}", self.forward, mutates_args=(),
                                     schema=schema(spec))
        fn.register_fake(self.forward_fake)
        if self.differentiable:
            cots = [f"d{o}" for o in spec.output_names]
            bwd = torch.library.custom_op(f"{BACKWARD_NAMESPACE}::{name}", self.backward,
                                          mutates_args=(),
                                          schema=schema(spec, cotangents=cots,
                                                        returns=len(self.differentiable)))
            bwd.register_fake(self.backward_fake)
            bwd.register_autograd(self.no_double_backward,
                                  setup_context=lambda ctx, inputs, output: None)
            self.backward_op = bwd._opoverload
        fn.register_autograd(self.grad, setup_context=self.setup_context)
        if "out" in self.variants:
            # a name of its own, as torch.library's examples have it: Inductor (2.13) calls an
            # overload `name.out` it finds by itself with the attrs twice when they are keywords
            self.defs["out"] = torch.library.custom_op(
                f"{NAMESPACE}::{self.variants['out']}", self.forward_out,
                mutates_args=tuple(self.out_names), schema=schema(spec, outs=self.out_names),
                tags=torch.Tag.out)
        if "inplace" in self.variants:
            fn_ = self.defs["inplace"] = torch.library.custom_op(
                f"{NAMESPACE}::{self.variants['inplace']}", self.forward_inplace,
                mutates_args=(self.inplace,), schema=schema(spec, mutable=self.inplace),
                tags=torch.Tag.inplace)
            self.inplace_op = fn_._opoverload
            # custom_op gives a mutating operator an autograd kernel that lets the call through
            # and fails only in backward; CPU tensors get this one instead (a backend's own
            # autograd key takes precedence over the Autograd alias)
            self.guard = torch.library.Library(NAMESPACE, "FRAGMENT")
            self.guard.impl(self.variants["inplace"], self.inplace_autograd, "AutogradCPU",
                            with_keyset=True)

    def drop(self, variant: Optional[str]) -> None:
        """Remove a variant whose name another operator takes, or with None every variant (the
        operator is registered again, perhaps from a changed declaration)."""
        for kind, torch_name in list(self.variants.items()):
            if variant is None or torch_name == variant:
                del self.variants[kind]
                if kind in self.defs:
                    self.defs.pop(kind)._lib._destroy()
                if kind == "inplace" and self.guard is not None:
                    self.guard._destroy()
                    self.guard = None


# ----------------------------------------------------------------------------- the direct call

class _Direct(torch.autograd.Function):
    """An eager call that skips PyTorch's dispatcher (tens of microseconds a call, more than
    the kernel of a small activation): the same forward and backward as the registered
    operator, the same autograd semantics, a first derivative only."""

    @staticmethod
    def forward(ctx, entry, kwargs, *args):
        ctx.entry, ctx.kwargs = entry, kwargs
        n = len(entry.spec.inputs)
        ctx.rest = args[n:]
        ctx.save_for_backward(*args[:n])
        return entry.forward(*args, **dict(kwargs))

    @staticmethod
    def backward(ctx, dy):
        entry = ctx.entry
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        result = [None] * len(needs)
        wanted = [k for k in entry.differentiable if needs[k] and saved[k] is not None]
        if wanted:
            # create_graph: the registered backward operator, whose own backward says that
            # opkit has no second derivative (an error where one is taken)
            run = entry.backward_op if torch.is_grad_enabled() else entry.backward
            gs = run(dy, *saved, *ctx.rest, **dict(ctx.kwargs))
            if len(entry.differentiable) == 1:
                gs = (gs,)
            for k, g in zip(entry.differentiable, gs):
                if k in wanted:
                    result[k] = g
        return (None, None, *result)


def _eager(args) -> bool:
    """Plain eager CPU tensors, with nothing tracing, compiling, transforming or intercepting
    the call: only then may a call skip the dispatcher."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() \
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TYPES or not a.is_cpu or _wrapped(a):
                return False
        elif a is not None and not isinstance(a, (bool, int, float, str)):
            return False  # an fx Proxy, a SymFloat ...
    return True


def call_(name: str, *args, **kwargs):
    """torch.ops.opkit.<name>_(*args, **kwargs): the result written over the first input,
    skipping the dispatcher as `call` does (never where autograd records the call)."""
    entry = _ENTRIES.get(name)
    if entry is not None and entry.plain and "inplace" in entry.variants and _eager(args) \
            and _eager(kwargs.values()) and entry.attr_set.issuperset(kwargs) \
            and not (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                                     for a in args)) \
            and entry.inplace_plain(args, kwargs):
        return args[0]
    return getattr(torch.ops.opkit, f"{name}_")(*args, **kwargs)


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def call(name: str, *args, **kwargs):
    """torch.ops.opkit.<name>(*args, **kwargs), skipping the dispatcher for a single-output
    operator called eagerly on plain CPU tensors; opkit.torch's modules call operators this
    way. Under torch.compile, tracing, vmap or a mode the call goes through the dispatcher."""
    entry = _ENTRIES.get(name)
    if entry is not None and entry.n_out == 1 and _eager(args) and _eager(kwargs.values()):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return _Direct.apply(entry, tuple(kwargs.items()), *args)
        return entry.forward(*args, **kwargs)  # nothing to record
    return getattr(torch.ops.opkit, name)(*args, **kwargs)


def _check_writable(t: torch.Tensor, name: str, where: str) -> None:
    """A tensor to write must not hold one element at several positions (as expand() makes)."""
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride())):
        raise ValueError(f"{where}: {name} has elements that share memory (an expanded tensor), "
                         f"so it cannot be written: pass {name}.clone()")


def register(op: Op) -> None:
    """Make `op` torch.ops.opkit.<name> (again, when its declaration is loaded again)."""
    with _lock:
        try:
            old = _ENTRIES.pop(op.name, None)
            if old is not None:
                old.drop(None)
            for other in _ENTRIES.values():
                other.drop(op.name)
            _FAILED.pop(op.name, None)
            entry = Entry(op)
            entry.register(taken=set(_ENTRIES))
            _ENTRIES[op.name] = entry
        except Exception as exc:  # noqa: BLE001  (opkit.load must go on whatever PyTorch says)
            _FAILED[op.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"opkit.torch: operator {op.name} ({op.spec.file}) is not available as "
                          f"torch.ops.{NAMESPACE}.{op.name}: {_FAILED[op.name]}", stacklevel=2)


def names() -> List[str]:
    return sorted(_ENTRIES)


def failure(name: str) -> Optional[str]:
    """Why operator `name` could not be registered, if it could not."""
    return _FAILED.get(name)
