"""Tensors to the NumPy arrays opkit's kernels take and back, without copying the data.

A CPU tensor's `.numpy()` is a view of its memory and `torch.from_numpy` wraps an array without
a copy, so a call moves no data besides the kernels' own reads and writes.

Tensor shapes are logical: a 4-d tensor is N, C, H, W whatever its memory format. Operators that
do not care which axis holds the channels (every input broadcasts by position) take the
tensors' strided views as they are, with layout ND, and their results keep the memory order of
the input they are `like` (a channels_last input gives a channels_last result). Operators that
name the channel axis take a channels_last tensor as layout NHWC: the view in memory order
(N, H, W, C), which is contiguous, with every layout-following input viewed the same way; the
results are permuted back, so they are channels_last tensors with the logical shape.

The same rules give the fake (shape-only) results for torch.compile: the output of an operator
takes `torch.empty_like` of its `like` input, which for a dense input (contiguous, channels_last
or any permutation) has the strides NumPy gives opkit's result; a result of a non-dense input
(expanded, sliced) is copied into that order, the one case that costs a copy.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.fx.experimental.symbolic_shapes import optimization_hint

from ..runtime.bind import bind
from ..runtime.shapes import shape_rules
from ..spec.model import LAYOUT_PHYSICAL

DTYPES: Dict[torch.dtype, str] = {
    torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
NHWC_NAMES = LAYOUT_PHYSICAL["NHWC"]


def _or_list(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check_tensor(t, name: str, allowed: Sequence[str], where: str) -> None:
    """A strided CPU tensor of one of the `allowed` dtypes, or a TypeError saying what to do."""
    if isinstance(t, torch.Tensor) and t.is_cpu and t.layout == torch.strided \
            and DTYPES.get(t.dtype) in allowed:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a tensor, got {type(t).__name__}")
    if t.device.type not in ("cpu", "meta"):
        raise TypeError(f"{where}: {name} is on device {t.device}, but opkit kernels run on the "
                        f"CPU: pass {name}.cpu() (and move the result back with .to({str(t.device)!r}))")
    if t.layout != torch.strided:
        raise TypeError(f"{where}: {name} has layout {t.layout}; opkit takes dense tensors: "
                        f"pass {name}.to_dense()")
    got = DTYPES.get(t.dtype)
    if got not in allowed:
        kinds = _or_list([f"torch.{d}" for d in allowed])
        fix = f"{name}.to(torch.{'float32' if 'float32' in allowed else allowed[-1]})"
        raise TypeError(f"{where}: {name} must be a tensor of {kinds}, got {t.dtype}"
                        + ("" if t.dtype == torch.bool else f"; convert it first, e.g. {fix}"))


def as_array(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    """The NumPy view of a checked CPU tensor (no copy); None stays None (an optional input
    left out)."""
    if t is None:
        return None
    if t.requires_grad:
        t = t.detach()
    if t.is_neg():  # a lazily negated view (autograd makes some): NumPy cannot read the bit
        t = t.resolve_neg()
    return t.numpy()


def _dense(t: torch.Tensor) -> bool:
    return (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)
            or is_non_overlapping_and_dense_or_false(t))


def channels_last(t: torch.Tensor) -> bool:
    return (t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last))


def torch_order(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`result` laid out as `torch.empty_like(like)`: itself when `like` is dense (NumPy's
    memory order then agrees with torch's), else a copy in torch's order."""
    if _dense(like):
        return result
    fixed = torch.empty_like(like, dtype=result.dtype)
    fixed.copy_(result)
    return fixed


def _hint(size) -> int:
    return size if isinstance(size, int) else optimization_hint(size, fallback=2)


class Call:
    """How one call's tensors reach the operator: the layout it names and each input's view."""

    __slots__ = ("layout", "nhwc", "tensors", "views", "padded")

    def __init__(self, layout: Optional[str], nhwc: bool, tensors: Tuple[torch.Tensor, ...],
                 views: List[torch.Tensor], padded: List[int]):
        self.layout = layout    # the layout keyword for opkit (None: the operator's default)
        self.nhwc = nhwc        # layout-following inputs are viewed in N, H, W, C order
        self.tensors = tensors
        self.views = views
        self.padded = padded    # per input: leading axes added before permuting, or -1


class Convert:
    """What an operator's declaration decides about its tensors, computed once."""

    def __init__(self, op, where: str):
        spec = op.spec
        self.op = op
        self.spec = spec
        self.where = where
        self.inputs = spec.inputs
        self.default = spec.layouts[0]
        # every input broadcasts by position: layouts only name axes, and never change a result
        self.agnostic = "ND" in spec.layouts and all(i.shape is None for i in spec.inputs)
        self.anchor = next((k for k, i in enumerate(spec.inputs) if i.layouts_declared), None)
        self.like = [spec.input_names.index(o.like) if o.like else None for o in spec.outputs]
        self.flat = [-1] * len(spec.inputs)  # no input viewed anew

    def _layout(self, layout: str) -> Optional[str]:
        return None if layout == self.default else layout

    def mode(self, tensors: Sequence[torch.Tensor]) -> Tuple[Optional[str], bool]:
        layouts = self.spec.layouts
        if self.agnostic:
            return self._layout("ND"), False
        x = tensors[self.anchor] if self.anchor is not None else None
        if x is None or x.dim() != 4:
            return None, False
        if "NHWC" in layouts and (channels_last(x) or "NCHW" not in layouts):
            return self._layout("NHWC"), True
        if "NCHW" in layouts:
            return self._layout("NCHW"), False
        return (self._layout("ND") if "ND" in layouts else None), False

    def call(self, tensors: Sequence[torch.Tensor]) -> Call:
        """Check the tensors and view each one the way the operator takes it (an optional
        input left out stays None)."""
        for i, t in zip(self.inputs, tensors):
            if not (t is None and i.optional):
                check_tensor(t, i.name, i.dtypes, self.where)
        layout, nhwc = self.mode(tensors)
        if not nhwc:
            return Call(layout, False, tuple(tensors), list(tensors), self.flat)
        views, padded = [], []
        for i, t in zip(self.inputs, tensors):
            pad = -1
            if t is None:
                views.append(None)
                padded.append(pad)
                continue
            if nhwc and i.shape is None:
                if t.dim() == 4:
                    pad = 0
                elif t.dim() < 4 and not i.layouts_declared:
                    pad = 4 - t.dim()  # broadcasts from the right: N, C, H, W in logical order
            if pad > 0:
                t = t[(None,) * pad]
            views.append(t.permute(TO_NHWC) if pad >= 0 else t)
            padded.append(pad)
        return Call(layout, nhwc, tuple(tensors), views, padded)

    # ------------------------------------------------------------------ outputs

    def names(self, call: Call, arrays: Sequence[np.ndarray], attrs: dict):
        """opkit's checked view of the call (dim names, sizes, result dtype) from `arrays`."""
        given = dict(zip(self.spec.input_names, arrays), **attrs)
        return bind(self.spec, given, call.layout, self.where, cache=self.op._shapes)

    def _physical_out(self, call: Call, o: int, bound) -> bool:
        """Whether output `o` comes back in N, H, W, C order (and is permuted to logical)."""
        k = self.like[o]
        if k is not None:
            return call.padded[k] >= 0
        if not call.nhwc:
            return False
        name = self.spec.outputs[o].name
        names = tuple(bound.outputs[name][0])
        # an output on dims of its own stored as its input is (a conv2d result: N, OH, OW, O)
        rules = shape_rules(self.spec)
        logical = dict(rules.outputs).get(name)
        return names == NHWC_NAMES or (logical is not None and names != logical and
                                       names == rules.physical(logical, "NHWC"))

    def to_logical(self, t: torch.Tensor, call: Call, o: int, bound=None) -> torch.Tensor:
        """Output `o` as opkit shapes it → its logical tensor."""
        if not self._physical_out(call, o, bound):
            return t
        t = t.permute(TO_NCHW)
        k = self.like[o]
        pad = call.padded[k] if k is not None else 0
        return t[(0,) * pad] if pad > 0 else t

    def to_physical(self, t: torch.Tensor, call: Call, o: int, bound=None) -> torch.Tensor:
        """A tensor shaped like output `o` (an out= buffer, a gradient) → the view opkit takes."""
        if not self._physical_out(call, o, bound):
            return t
        k = self.like[o]
        pad = call.padded[k] if k is not None else 0
        return (t[(None,) * pad] if pad > 0 else t).permute(TO_NHWC)

    def grad_to_logical(self, g: torch.Tensor, call: Call, k: int) -> torch.Tensor:
        """The gradient of input `k` (shaped like its view) → its logical shape and order."""
        pad = call.padded[k]
        if pad >= 0:
            g = g.permute(TO_NCHW)
            if pad > 0:
                g = g[(0,) * pad]
        return torch_order(g, call.tensors[k])

    def needs_names(self, call: Call) -> bool:
        return call.nhwc and any(k is None for k in self.like)

    # ------------------------------------------------------------------ shapes only

    def dummies(self, call: Call) -> List[np.ndarray]:
        """Arrays with the views' shapes and dtypes and no memory, for opkit's checks."""
        return [None if v is None else
                np.broadcast_to(np.empty((), DTYPES[v.dtype]), tuple(_hint(s) for s in v.shape))
                for v in call.views]

    def fake_outputs(self, call: Call, attrs: dict) -> List[torch.Tensor]:
        """The outputs' shapes, dtypes and strides, computed as a real call would lay them out
        (the same checks run, so a bad call fails while tracing too)."""
        bound = self.names(call, self.dummies(call), attrs)
        dtype = TORCH_DTYPES[bound.dtype.name]
        outs = []
        for o, out in enumerate(self.spec.outputs):
            k = self.like[o]
            if k is not None:
                outs.append(torch.empty_like(call.tensors[k], dtype=dtype))
                continue
            names, _, _ = bound.outputs[out.name]
            sizes = {}  # each dim's (possibly symbolic) size, from an input that has it
            for v, name in zip(call.views, self.spec.input_names):
                if v is None:
                    continue
                for n, s in zip(bound.values[name][1], v.shape):
                    if n not in sizes and _hint(s) == bound.sizes[n]:
                        sizes[n] = s
            # a dim a call creates (a convolution's OH) is no input's: its size as bound
            t = call.views[0].new_empty([sizes.get(n, bound.sizes[n]) for n in names], dtype=dtype)
            outs.append(self.to_logical(t, call, o, bound))
        return outs
