"""Nearest-neighbour upsampling folded into the convolution after it.

A convolution over an r-times nearest-upsampled image sees each input pixel r x r times: the
output pixel (r*i + a, r*j + b) -- phase (a, b) -- reads a fixed set of input pixels around
(i, j), and the taps of the kernel that land on the same input pixel can be added up once, in
the weights. Each phase is then a small convolution over the image before upsampling: for
r = 2 and a 3 x 3 kernel, a 2 x 2 convolution, 16 multiply-adds per input pixel and output
channel where the upsampled convolution did 36, and no upsampled image is written or read.
The phases' outputs are interleaved into the result (docs/torch.md, "Upsampling folded into the
convolution").

Phase weights are a linear function of the original weights (computed in each call, so
gradients reach the original parameters as they would).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# up to this many output channels (times r*r) the phases run as one convolution with r*r times
# the channels over the union of their windows, which convolution libraries handle far better
# than a few output channels; above it each phase is a convolution of its own (fewer taps)
ONE_CONV_CHANNELS = 16


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
        return "the consumer is not an nn.Conv2d"
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

def _offsets(r: int, k: int, p: int) -> List[List[int]]:
    """offsets[a][d]: the input pixel (relative to i) that tap d of phase a reads."""
    return [[(a + d - p) // r for d in range(k)] for a in range(r)]


def _axis(r: int, k: int, p: int, union: bool) -> Tuple[List[torch.Tensor], int, int, List[int]]:
    """(per phase a 0/1 matrix [taps, k] adding kernel taps into phase taps, left padding,
    right padding, first tap offset per phase). union: every phase over the same window."""
    offs = _offsets(r, k, p)
    lo = [min(o) for o in offs]
    hi = [max(o) for o in offs]
    if union:
        lo = [min(lo)] * r
        hi = [max(hi)] * r
    mats = []
    for a in range(r):
        m = torch.zeros(hi[a] - lo[a] + 1, k, dtype=torch.float64)
        for d, e in enumerate(offs[a]):
            m[e - lo[a], d] = 1.0
        mats.append(m)
    return mats, max(0, -min(lo)), max(0, max(hi)), lo


class Plan:
    """How a convolution with `kernel` taps over an r-times upsampled image runs as phase
    convolutions over the image itself."""

    def __init__(self, r: int, kernel: Sequence[int], padding: Sequence[int], out_channels: int):
        self.r = r
        self.one = out_channels * r * r <= ONE_CONV_CHANNELS
        (self.mh, self.ph, self.qh, self.lo_h) = _axis(r, kernel[0], padding[0], self.one)
        (self.mw, self.pw, self.qw, self.lo_w) = _axis(r, kernel[1], padding[1], self.one)

    def weights(self, w: torch.Tensor) -> List[torch.Tensor]:
        """Each phase's kernel [O, C, th, tw] from the kernel w [O, C, kh, kw], phase (a, b) at
        a * r + b."""
        out = []
        for mh in self.mh:
            for mw in self.mw:
                out.append(torch.einsum("ij,kl,ocjl->ocik", mh.to(w.dtype), mw.to(w.dtype), w))
        return out

    def convolve(self, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                 then=None) -> List[torch.Tensor]:
        """The r*r phases of conv2d(upsample(x), w, bias), each [N, O, H, W]; `then` (an
        in-place elementwise op) goes over each convolution's output as it is made."""
        then = then or (lambda t: t)
        ws = self.weights(w)
        fmt = memory_format_of(x)
        if self.one:  # one convolution over the shared window, r*r times the channels
            wall = torch.cat(ws).contiguous(memory_format=fmt)
            ball = bias.repeat(len(ws)) if bias is not None else None
            z = then(F.conv2d(F.pad(x, (self.pw, self.qw, self.ph, self.qh)), wall, ball))
            return list(z.chunk(len(ws), dim=1))
        xp = F.pad(x, (self.pw, self.qw, self.ph, self.qh))
        H, W = x.shape[-2:]
        phases = []
        for a in range(self.r):
            for b in range(self.r):
                wk = ws[a * self.r + b]
                top, left = self.lo_h[a] + self.ph, self.lo_w[b] + self.pw
                window = xp[:, :, top:top + H + wk.shape[2] - 1, left:left + W + wk.shape[3] - 1]
                phases.append(then(F.conv2d(window, wk.contiguous(memory_format=fmt), bias)))
        return phases


def memory_format_of(t: torch.Tensor):
    """channels_last for a 4-d tensor dense in that order (and not also in NCHW order)."""
    return (torch.channels_last if t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)


class _Interleave(torch.autograd.Function):
    """r*r phase images [N, C, H, W] -> the image [N, C, r*H, r*W] whose pixel (r*i + a,
    r*j + b) is phase (a, b)'s pixel (i, j); the backward hands each phase its strided view."""

    @staticmethod
    def forward(ctx, r, fmt, *phases):
        ctx.r = r
        return interleave(phases, r, fmt)

    @staticmethod
    def backward(ctx, dy):
        r = ctx.r
        return (None, None, *[dy[:, :, a::r, b::r] for a in range(r) for b in range(r)])


def interleave(phases: Sequence[torch.Tensor], r: int, fmt) -> torch.Tensor:
    p0 = phases[0]
    n, c, h, w = p0.shape
    y = torch.empty((n, c, r * h, r * w), dtype=p0.dtype, device=p0.device, memory_format=fmt)
    with torch.no_grad():
        for a in range(r):
            for b in range(r):
                y[:, :, a::r, b::r].copy_(phases[a * r + b])
    return y


def interleaved(phases: Sequence[torch.Tensor], r: int, fmt) -> torch.Tensor:
    """interleave() as autograd records it where a phase needs a gradient; `fmt`: the result's
    memory format."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in phases):
        return _Interleave.apply(r, fmt, *phases)
    return interleave(phases, r, fmt)


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
        self.plan = Plan(self.r, conv.kernel_size, conv.padding, conv.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self._conv
        return interleaved(self.plan.convolve(x, conv.weight, conv.bias), self.r, memory_format_of(x))

    def extra_repr(self) -> str:
        return f"conv={self.conv_name!r}, r={self.r}, phases={'one convolution' if self.plan.one else 'r*r convolutions'}"
