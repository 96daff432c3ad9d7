"""torch.nn modules over the bundled operators, and `Op` for any registered operator.

Slopes and gains are hyperparameters (plain attributes, shown by repr); slope maps, latent
projections and biases are parameters (or buffers, when not learnable), so they are in the
state_dict and follow `.double()`, `.half()` and `.to(dtype)`.
"""
from __future__ import annotations

import difflib
import math
from typing import Optional, Sequence

import torch
from torch import nn

from .. import get as _get
from ..runtime.bind import check_attrs
from .library import call


def _checked(name: str, where: str, /, **attrs) -> dict:
    """The attrs as the operator checks them (TypeError/ValueError now, not at the first call);
    the values given are kept as given."""
    spec = _get(name).spec
    for key in attrs:
        if key not in spec.attr_names:
            close = difflib.get_close_matches(key, spec.attr_names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; it takes {', '.join(spec.attr_names)}" if spec.attr_names else "; it takes none")
            raise TypeError(f"{where}: {name} has no attr {key!r}{hint}")
    check_attrs(spec, attrs, where)
    return attrs


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v)


class LeakyReLU(nn.Module):
    """y = x where x > 0, else alpha * x (torch.ops.opkit.leaky_relu)."""

    def __init__(self, alpha: float = 0.2):
        super().__init__()
        _checked("leaky_relu", "opkit.torch.nn.LeakyReLU", alpha=alpha)
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return call("leaky_relu", x, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={_fmt(self.alpha)}"


class SpatialLeakyReLU(nn.Module):
    """LeakyReLU with a slope per position: alpha_map of shape `map_shape` broadcasts against
    x by PyTorch's rules (e.g. (1, 1, H, W) for one slope per pixel of an N, C, H, W input)."""

    def __init__(self, map_shape: Sequence[int], init: float = 0.2, learnable: bool = True,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.map_shape = tuple(int(s) for s in map_shape)
        self.learnable = learnable
        alpha_map = torch.full(self.map_shape, float(init), dtype=dtype or torch.get_default_dtype())
        if learnable:
            self.alpha_map = nn.Parameter(alpha_map)
        else:
            self.register_buffer("alpha_map", alpha_map)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return call("spatial_leaky_relu", x, self.alpha_map)

    def extra_repr(self) -> str:
        return f"map_shape={self.map_shape}, learnable={self.learnable}"


class ConditionalLeakyReLU(nn.Module):
    """A slope per sample and channel from a latent code z [N, z_dim]:
    alpha = alpha_min + (alpha_max - alpha_min) * sigmoid(z @ w + b); forward(x, z)."""

    def __init__(self, z_dim: int, channels: int, alpha_min: float = 0.1, alpha_max: float = 0.3,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        _checked("conditional_leaky_relu", "opkit.torch.nn.ConditionalLeakyReLU",
                 alpha_min=alpha_min, alpha_max=alpha_max)
        self.z_dim, self.channels = int(z_dim), int(channels)
        self.alpha_min, self.alpha_max = alpha_min, alpha_max
        dtype = dtype or torch.get_default_dtype()
        # small weights and no bias: every slope starts near the middle of [alpha_min, alpha_max]
        self.w = nn.Parameter(torch.randn(self.z_dim, self.channels, dtype=dtype)
                              / math.sqrt(max(self.z_dim, 1)) * 0.1)
        self.b = nn.Parameter(torch.zeros(self.channels, dtype=dtype))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return call("conditional_leaky_relu", x, z, self.w, self.b,
                    alpha_min=self.alpha_min, alpha_max=self.alpha_max)

    def extra_repr(self) -> str:
        return (f"z_dim={self.z_dim}, channels={self.channels}, alpha_min={_fmt(self.alpha_min)}, "
                f"alpha_max={_fmt(self.alpha_max)}")


class FreqLeakyReLU(nn.Module):
    """Alias-free LeakyReLU: band-limited upsampling by `up`, LeakyReLU, low-pass and
    downsampling back, times gain (over H and W of an N, C, H, W input)."""

    def __init__(self, alpha: float = 0.2, up: int = 2, gain: float = 1.0):
        super().__init__()
        _checked("freq_leaky_relu", "opkit.torch.nn.FreqLeakyReLU", alpha=alpha, up=up, gain=gain)
        self.alpha, self.up, self.gain = alpha, up, gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return call("freq_leaky_relu", x, alpha=self.alpha, up=self.up, gain=self.gain)

    def extra_repr(self) -> str:
        return f"alpha={_fmt(self.alpha)}, up={self.up}, gain={_fmt(self.gain)}"


class FusedBiasLeakyReLU(nn.Module):
    """StyleGAN2's fused bias + LeakyReLU + gain (+ clamp), with a learnable per-channel bias."""

    def __init__(self, channels: int, alpha: float = 0.2, gain: float = math.sqrt(2),
                 clamp: Optional[float] = None, dtype: Optional[torch.dtype] = None):
        super().__init__()
        _checked("fused_bias_leaky_relu", "opkit.torch.nn.FusedBiasLeakyReLU",
                 alpha=alpha, gain=gain, clamp=clamp)
        self.channels = int(channels)
        self.alpha, self.gain, self.clamp = alpha, gain, clamp
        self.bias = nn.Parameter(torch.zeros(self.channels, dtype=dtype or torch.get_default_dtype()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return call("fused_bias_leaky_relu", x, self.bias, alpha=self.alpha, gain=self.gain,
                    clamp=self.clamp)

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, alpha={_fmt(self.alpha)}, gain={_fmt(self.gain)}, "
                f"clamp={_fmt(self.clamp)}")


class Op(nn.Module):
    """Any registered operator with fixed attrs: Op("soft_clip", limit=2.0)(x)."""

    def __init__(self, name: str, **attrs):
        super().__init__()
        from . import op as _op
        _op(name)  # KeyError with close matches for an unknown name
        self.name = name
        self.attrs = _checked(name, f"opkit.torch.nn.Op({name!r})", **attrs)

    def forward(self, *inputs: torch.Tensor):
        return call(self.name, *inputs, **self.attrs)

    def extra_repr(self) -> str:
        return ", ".join([repr(self.name)] + [f"{k}={_fmt(v)}" for k, v in self.attrs.items()])
