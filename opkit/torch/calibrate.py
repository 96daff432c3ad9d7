"""LeakyReLU slopes of a PyTorch model, snapped to fixed point (m / 2**bits), and
`AlphaCalibration`, which re-snaps them during training and can clip the activations'
gradients (docs/torch.md, "Tuning a model").

A slope is fixed (a float attribute: nn.LeakyReLU's negative_slope, the alpha of opkit's
modules and fused convolutions), a learnable scalar (nn.PReLU with one parameter) or a map
(nn.PReLU per channel, SpatialLeakyReLU's alpha_map).
"""
from __future__ import annotations

import numbers
from typing import Dict, List, NamedTuple, Optional

import torch
from torch import nn

from ..quantize import fixed_point
from ..runtime.op import check_clip
from . import nn as opnn
from .fused import FusedConvLeakyReLU


class Slope:
    """One module's slope: where it lives and how to read and write it."""

    def __init__(self, name: str, module: nn.Module, attr: str):
        self.name, self.module, self.attr = name, module, attr

    @property
    def kind(self) -> str:
        value = getattr(self.module, self.attr)
        if not isinstance(value, torch.Tensor):
            return "fixed"
        return "scalar" if value.numel() == 1 else "map"

    @property
    def learnable(self) -> bool:
        return isinstance(getattr(self.module, self.attr), nn.Parameter)

    def value(self):
        """The slope: a float, or a detached copy of the tensor."""
        v = getattr(self.module, self.attr)
        return v.detach().clone() if isinstance(v, torch.Tensor) else float(v)

    def snap(self, bits: int) -> "Change":
        """Snap to m / 2**bits (round to nearest, ties to even, as opkit.quantize_alpha)."""
        old = self.value()
        if not isinstance(old, torch.Tensor):
            new = fixed_point(old, bits)[2]
            setattr(self.module, self.attr, new)
            return Change(self.name, self.kind, old, new, abs(new - old), bits)
        t = getattr(self.module, self.attr)
        if t.numel():  # every m must fit: the error a float slope would give
            fixed_point(float(t.detach().abs().max()), bits)
        with torch.no_grad():
            t.copy_(torch.round(t * 2.0 ** bits) / 2.0 ** bits)
        drift = float((t.detach() - old).abs().max()) if t.numel() else 0.0
        if t.numel() == 1:
            return Change(self.name, self.kind, float(old), float(t.detach()), drift, bits)
        return Change(self.name, self.kind, old, t.detach().clone(), drift, bits)


class Change(NamedTuple):
    """A slope before and after snapping to m / 2**bits; `drift` is the largest change of any
    element."""
    name: str
    kind: str
    old: object
    new: object
    drift: float
    bits: int

    def __str__(self) -> str:
        if self.kind == "map":
            return (f"{self.name}: alpha map snapped to multiples of 1/{2 ** self.bits}, max change "
                    f"{self.drift:.3g}")
        # the fixed-point value exactly: m / 2**bits has at most `bits` decimals
        m = round(self.new * 2 ** self.bits)
        return f"{self.name}: alpha {self.old:g} -> {m}/{2 ** self.bits} = {self.new!r}"


# module type -> the attribute holding its slope
_SLOPE_ATTRS = ((nn.LeakyReLU, "negative_slope"), (nn.PReLU, "weight"),
                (opnn.LeakyReLU, "alpha"), (opnn.FreqLeakyReLU, "alpha"),
                (opnn.FusedBiasLeakyReLU, "alpha"), (opnn.SpatialLeakyReLU, "alpha_map"))


def slopes(model: nn.Module) -> List[Slope]:
    """Every slope of `model` (modules' own; opkit's fused convolutions count), in module
    order. ConditionalLeakyReLU computes its slopes from a latent code, so it has none."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, FusedConvLeakyReLU):
            found.append(Slope(name, module, "alpha"))
            continue
        for cls, attr in _SLOPE_ATTRS:
            if isinstance(module, cls):
                found.append(Slope(name, module, attr))
                break
    return found


class _ClipGrad(torch.autograd.Function):
    """Identity forward; the backward clamps the gradient to [-clip, clip] (NaN stays NaN, as
    the operators' clip= does)."""

    @staticmethod
    def forward(ctx, x, clip, copy):
        ctx.clip = clip
        return x.clone() if copy else x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy.clamp(-ctx.clip, ctx.clip), None, None


def _clip_hooks(slope: Slope, clip: float) -> list:
    """Clamp the gradient the activation passes back to its input, and its slope's own
    gradient when the slope is learnable."""
    module = slope.module
    copy = bool(getattr(module, "inplace", False))  # an in-place module overwrites its input

    def pre(mod, args):
        x = args[0]
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            return (_ClipGrad.apply(x, clip, copy),) + tuple(args[1:])
        return None
    handles = [module.register_forward_pre_hook(pre)]
    value = getattr(module, slope.attr)
    if isinstance(value, nn.Parameter):
        handles.append(value.register_hook(lambda g: g.clamp(-clip, clip)))
    return handles


class AlphaCalibration:
    """Keep a model's LeakyReLU slopes on the fixed-point grid m / 2**bits while it trains.

        calib = opkit.torch.AlphaCalibration(model, every=1000, bits=7, clip=0.1)
        for batch in data:
            ...; loss.backward(); optimizer.step()
            calib.step()

    Every `every` calls of .step() each slope (fixed, learnable scalar or learnable map) is
    snapped to m / 2**bits, and the largest change per module is recorded in .history.
    With `clip`, the gradient each activation passes back to its input, and a learnable slope's
    gradient, are clamped to [-clip, clip] (as the operators' clip= does). Fused convolutions
    keep their activation's gradient inside the operator: it is not clipped there.
    """

    def __init__(self, model: nn.Module, every: int = 1000, bits: int = 7,
                 clip: Optional[float] = None):
        where = "opkit.torch.AlphaCalibration"
        if not isinstance(model, nn.Module):
            raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ValueError(f"{where}: every must be a positive integer (steps between "
                             f"re-quantizations), got {every!r}")
        fixed_point(0.0, bits)  # bits in 1..15, the same error opkit.quantize_alpha gives
        self.clip = check_clip(clip, where)
        self.model, self.every, self.bits = model, int(every), int(bits)
        self.slopes = slopes(model)
        if not self.slopes:
            raise ValueError(f"{where}: the model has no LeakyReLU slopes to calibrate (it has no "
                             "nn.LeakyReLU, nn.PReLU or opkit.torch.nn activation modules)")
        self.steps = 0
        self.history: List[Dict[str, object]] = []
        self._handles = []
        if self.clip is not None:
            for s in self.slopes:
                if not isinstance(s.module, FusedConvLeakyReLU):
                    self._handles += _clip_hooks(s, self.clip)

    def step(self) -> Optional[List[Change]]:
        """Count a training step; every `every` steps re-quantize (and return the changes)."""
        self.steps += 1
        if self.steps % self.every:
            return None
        return self.quantize()

    def quantize(self) -> List[Change]:
        """Snap every slope now and record each module's drift."""
        changes = [s.snap(self.bits) for s in self.slopes]
        self.history.append({"step": self.steps,
                             "drift": {c.name: c.drift for c in changes}})
        return changes

    def remove(self) -> None:
        """Remove the gradient-clipping hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __repr__(self) -> str:
        return (f"AlphaCalibration({len(self.slopes)} slopes, every={self.every}, bits={self.bits}, "
                f"clip={self.clip}, steps={self.steps})")
