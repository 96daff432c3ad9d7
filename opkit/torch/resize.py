"""Nearest-neighbour upsampling folded into the convolution after it.

A convolution over an r-times nearest-upsampled image sees each input pixel r x r times: the
output pixel (r*i + a, r*j + b) -- phase (a, b) -- reads a fixed set of input pixels around
(i, j), and the taps of the kernel that land on the same input pixel can be added up once, in
the weights. Each phase is then a small convolution over the image before upsampling: for
r = 2 and a 3 x 3 kernel, a 2 x 2 convolution, 16 multiply-adds per input pixel and output
channel where the upsampled convolution did 36, and no upsampled image is written or read.

All r*r phases run as one convolution over the image with r*r times the output channels (a
convolution library is far better at many output channels than at the one or few of an output
layer), whose output is interleaved into the result in one pass (docs/torch.md, "Upsampling
folded into the convolution"). The phase kernels are a linear function of the kernel, computed
in each call, so gradients reach the original parameters as they would.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def scale_factor(up: nn.Module) -> Optional[int]:
    """r when `up` is nearest upsampling by an integer r >= 2 on both axes, else None."""
    if not isinstance(up, nn.Upsample) or up.mode != "nearest" or up.size is not None:
        return None
    sf = up.scale_factor
    sf = tuple(sf) if isinstance(sf, (tuple, list)) else (sf, sf)
    if len(sf) != 2 or sf[0] != sf[1] or float(sf[0]) != int(sf[0]) or int(sf[0]) < 2:
        return None
    return int(sf[0])


def fold_problem(conv: nn.Module) -> Optional[str]:
    """Why nearest upsampling before `conv` cannot be folded into it (None: it can)."""
    if type(conv) is not nn.Conv2d:
        return f"the consumer is a {type(conv).__name__}, not an nn.Conv2d"
    if conv.stride != (1, 1):
        return f"stride={conv.stride} (1 needed)"
    if conv.dilation != (1, 1):
        return f"dilation={conv.dilation} (1 needed)"
    if conv.groups != 1:
        return f"groups={conv.groups} (1 needed)"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r} ('zeros' needed)"
    if isinstance(conv.padding, str) or any(2 * p != k - 1 for p, k in zip(conv.padding, conv.kernel_size)):
        return (f"padding={conv.padding} with kernel_size={conv.kernel_size} (the output must keep "
                "the upsampled size: an odd kernel with padding (k - 1) / 2)")
    return None


# ----------------------------------------------------------------------------- one axis

class _Axis:
    """One axis of the folding. Tap d of the kernel, in phase a, reads input pixel
    i + (a + d - p) // r. Each phase's taps that read the same pixel are added into one; the
    phases' windows are placed in a common window of `taps` pixels starting at their first
    offset, so that one convolution with symmetric `padding` computes every phase, phase a
    in output rows shift[a] .. shift[a] + H - 1."""

    def __init__(self, r: int, k: int, p: int):
        offs = [[(a + d - p) // r for d in range(k)] for a in range(r)]
        lo = [min(o) for o in offs]
        self.taps = max(max(o) - min(o) + 1 for o in offs)
        self.padding = max(-min(lo), max(lo) + self.taps - 1)
        self.shift = [lo[a] + self.padding for a in range(r)]
        self.adds = []  # per phase: [taps, k], 1 where kernel tap d adds into phase tap e
        for a in range(r):
            m = torch.zeros(self.taps, k, dtype=torch.float64)
            for d, e in enumerate(offs[a]):
                m[e - lo[a], d] = 1.0
            self.adds.append(m)


class Plan:
    """How a convolution with `kernel` taps over an r-times upsampled image runs as one
    convolution over the image itself, with r*r times the output channels: phase (a, b) of
    output channel o is channel (a*r + b)*O + o, at rows shift_h[a].., columns shift_w[b]..."""

    def __init__(self, r: int, kernel: Sequence[int], padding: Sequence[int]):
        self.r = r
        self.h, self.w = _Axis(r, kernel[0], padding[0]), _Axis(r, kernel[1], padding[1])
        # [r, taps_h, kh] x [r, taps_w, kw]: phase kernels from the kernel in one einsum
        self.adds_h, self.adds_w = torch.stack(self.h.adds), torch.stack(self.w.adds)

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        """The phases' kernels [r*r*O, C, taps_h, taps_w] from the kernel w [O, C, kh, kw]."""
        o, c = w.shape[:2]
        k = torch.einsum("aij,bkl,ocjl->aboc ik".replace(" ", ""), self.adds_h.to(w.dtype),
                         self.adds_w.to(w.dtype), w)
        return k.reshape(self.r * self.r * o, c, self.h.taps, self.w.taps)

    def params(self, w: torch.Tensor, bias: Optional[torch.Tensor], fmt):
        """(phase kernels in memory format fmt, phase bias) of the convolution (w, bias)."""
        return (self.weight(w).contiguous(memory_format=fmt),
                bias.repeat(self.r * self.r) if bias is not None else None)

    def convolve(self, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                 then=None, params=None) -> torch.Tensor:
        """conv2d(upsample(x), w, bias) with `then` (an in-place elementwise op) over the phase
        convolution's output as it is made; `params`: params(w, bias, ...) made before."""
        fmt = memory_format_of(x)
        wk, b = params if params is not None else self.params(w, bias, fmt)
        z = F.conv2d(x, wk, b, padding=(self.h.padding, self.w.padding))
        if then is not None:
            z = then(z)
        return interleaved(z, self, x.shape[-2:], fmt)


def recorded(*tensors) -> bool:
    """Whether autograd records a call on these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def versions(*tensors) -> tuple:
    """Where each tensor's data is and how often it was changed in place: equal keys, equal
    values (an optimizer step, load_state_dict or .to() changes one or the other)."""
    return tuple((t.data_ptr(), t._version, t.dtype) if t is not None else None for t in tensors)


def cached(owner, sources, x: torch.Tensor, make):
    """`make(memory_format)` (the eval weights derived from the parameters `sources`) made once
    per version of the parameters and x's memory format, kept on `owner`. Inside torch.compile
    they are made in the traced graph: Dynamo cannot compare data pointers, and the compiled
    graph computes them (or folds them, with freezing)."""
    fmt = memory_format_of(x)
    if torch.compiler.is_compiling():
        return make(fmt)
    key = versions(*sources) + (fmt,)
    if owner._cache is None or owner._cache[0] != key:
        owner._cache = (key, make(fmt))
    return owner._cache[1]


def memory_format_of(t: torch.Tensor):
    """channels_last for a 4-d tensor dense in that order (and not also in NCHW order)."""
    return (torch.channels_last if t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)


def _phases(z: torch.Tensor, plan: Plan, hw) -> List[Tuple[int, int, torch.Tensor]]:
    """(a, b, the view of z that is phase (a, b)): [N, O, H, W] each."""
    r, (h, w) = plan.r, hw
    o = z.shape[1] // (r * r)
    return [(a, b, z[:, (a * r + b) * o:(a * r + b + 1) * o,
                     plan.h.shift[a]:plan.h.shift[a] + h, plan.w.shift[b]:plan.w.shift[b] + w])
            for a in range(r) for b in range(r)]


def interleave(z: torch.Tensor, plan: Plan, hw, fmt) -> torch.Tensor:
    """The image [N, O, r*H, r*W] whose pixel (r*i + a, r*j + b) is phase (a, b)'s (i, j)."""
    r, (h, w) = plan.r, hw
    y = torch.empty((z.shape[0], z.shape[1] // (r * r), r * h, r * w), dtype=z.dtype,
                    device=z.device, memory_format=fmt)
    with torch.no_grad():
        for a, b, phase in _phases(z, plan, hw):
            y[:, :, a::r, b::r].copy_(phase)
    return y


class _Interleave(torch.autograd.Function):
    """interleave() with its backward: each phase's window of dz gets its strided view of dy,
    the rest of dz (outputs no phase takes) zero."""

    @staticmethod
    def forward(ctx, z, plan, hw, fmt):
        ctx.plan, ctx.hw, ctx.shape, ctx.zfmt = plan, hw, z.shape, memory_format_of(z)
        return interleave(z, plan, hw, fmt)

    @staticmethod
    def backward(ctx, dy):
        r = ctx.plan.r
        dz = dy.new_zeros(ctx.shape).contiguous(memory_format=ctx.zfmt)
        for a, b, phase in _phases(dz, ctx.plan, ctx.hw):
            phase.copy_(dy[:, :, a::r, b::r])
        return dz, None, None, None


def interleaved(z: torch.Tensor, plan: Plan, hw, fmt) -> torch.Tensor:
    """interleave() as autograd records it where z needs a gradient; `fmt`: the result's
    memory format."""
    if torch.is_grad_enabled() and z.requires_grad:
        return _Interleave.apply(z, plan, tuple(hw), fmt)
    return interleave(z, plan, hw, fmt)


class ResizeConv2d(nn.Module):
    """conv(Upsample(scale_factor=r, mode="nearest")(x)) as phase convolutions over x. The
    convolution stays where it was in the model (its parameters, state_dict keys and mode)."""

    def __init__(self, conv: nn.Conv2d, r: int, name: str = ""):
        super().__init__()
        problem = fold_problem(conv)
        if problem is not None:
            raise ValueError(f"ResizeConv2d: cannot fold upsampling into {name or 'the convolution'}: {problem}")
        object.__setattr__(self, "_conv", conv)  # a reference, not a child
        self.r, self.conv_name = int(r), name
        self.plan = Plan(self.r, conv.kernel_size, conv.padding)
        self._cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self._conv
        params = None
        if not recorded(x, conv.weight, conv.bias):  # eval: the phase kernels of these weights
            params = cached(self, (conv.weight, conv.bias), x,
                            lambda fmt: self.plan.params(conv.weight, conv.bias, fmt))
        return self.plan.convolve(x, conv.weight, conv.bias, params=params)

    def extra_repr(self) -> str:
        return f"conv={self.conv_name!r}, r={self.r}"
