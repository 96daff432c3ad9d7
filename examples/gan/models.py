"""A DCGAN-style generator and discriminator for 32x32 digits, one per activation variant.

    torch        PyTorch's own nn.LeakyReLU(0.2)
    plain        opkit's LeakyReLU (torch.ops.opkit.leaky_relu)
    spatial      a learnable slope per pixel of each layer (torch.ops.opkit.spatial_leaky_relu)
    conditional  the generator's slopes chosen per sample and channel from z
                 (torch.ops.opkit.conditional_leaky_relu); the discriminator, which has no z,
                 uses plain opkit LeakyReLU
    freq         alias-free LeakyReLU (torch.ops.opkit.freq_leaky_relu: upsample x2, LeakyReLU,
                 low-pass, downsample)
    fused        each convolution with its batch norm and LeakyReLU as one opkit operator
                 (conv2d_bn_train_leaky_relu while training, conv2d_bn_leaky_relu in eval mode,
                 conv2d_bias_leaky_relu where there is no batch norm)
    optimized    the `torch` model passed through opkit.torch.optimize (see train.py)
    tuned        opkit's LeakyReLU with the reference article's DCGAN slope, 0.25 = 32/128 (exact
                 on the 7-bit fixed-point grid)

`alpha_bits=b` stores every slope as m / 2**b, as a kernel with fixed-point slopes computes: a
fixed slope is rounded once; a learnable slope map is rounded in each forward while its float
values learn (FixedPointSpatialLeakyReLU).

For the same seed every variant starts from the same convolution and batch-norm weights (they
are drawn from a generator of their own, seeded by one draw from PyTorch's global generator
when the model is built, and building moves the global generator by that one draw only), so
the variants differ in their activations alone.

`Generator()` and `Discriminator()` build the `torch` variant with the default sizes, so the
file can be named as `examples/gan/models.py:Discriminator` where a model factory is asked for.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import opkit.torch  # noqa: F401  (registers torch.ops.opkit.*)
from opkit.quantize import fixed_point
from opkit.torch import nn as onn

VARIANTS = ("torch", "plain", "spatial", "conditional", "freq", "fused", "optimized", "tuned")
ALPHA = 0.2
TUNED_ALPHA = 0.25  # the reference article's DCGAN slope: 32/128
Z_DIM = 32
WIDTH = 32
IMAGE = 32


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    return "torch" if variant == "optimized" else variant  # optimize() starts from `torch`


def fixed_slope(alpha: float, bits: Optional[int]) -> float:
    """alpha, or alpha rounded to m / 2**bits."""
    return alpha if bits is None else fixed_point(alpha, bits)[2]


class FixedPointSpatialLeakyReLU(onn.SpatialLeakyReLU):
    """SpatialLeakyReLU computing with its slope map rounded to m / 2**bits, as a kernel that
    stores fixed-point slopes does; the gradient reaches the float map unchanged (straight
    through), so the map learns in float and only its rounding is used."""

    def __init__(self, map_shape, init: float, bits: int):
        fixed_point(init, bits)  # bits in range: opkit's error otherwise
        super().__init__(map_shape, init=init)
        self.bits = int(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, scale = self.alpha_map, 2.0 ** self.bits
        return torch.ops.opkit.spatial_leaky_relu(x, a + (torch.round(a * scale) / scale - a).detach())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"


def activation(variant: str, channels: int, size: int, z_dim: int = 0,
               bits: Optional[int] = None) -> nn.Module:
    """The LeakyReLU of `variant` after a layer of `channels` x `size` x `size` (z_dim > 0: the
    layer is in the generator and the conditional slope can see z; bits: fixed-point slopes)."""
    alpha = fixed_slope(TUNED_ALPHA if variant == "tuned" else ALPHA, bits)
    if variant == "torch":
        return nn.LeakyReLU(alpha)
    if variant == "spatial":
        if bits is None:
            return onn.SpatialLeakyReLU((1, 1, size, size), init=ALPHA)
        return FixedPointSpatialLeakyReLU((1, 1, size, size), init=ALPHA, bits=bits)
    if variant == "conditional" and z_dim:
        # slopes in [0.1, 0.3]: the middle is the other variants' 0.2
        return onn.ConditionalLeakyReLU(z_dim, channels, alpha_min=0.1, alpha_max=0.3)
    if variant == "freq":
        return onn.FreqLeakyReLU(alpha, up=2, gain=1.0)
    return onn.LeakyReLU(alpha)


class Block(nn.Module):
    """[nearest 2x upsampling] -> conv -> [batch norm] -> activation."""

    def __init__(self, conv: nn.Module, bn, act: nn.Module, up: bool = False):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest") if up else None
        self.conv, self.bn, self.act = conv, bn, act
        self.conditional = isinstance(act, onn.ConditionalLeakyReLU)

    def forward(self, x, z=None):
        if self.up is not None:
            x = self.up(x)
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x, z) if self.conditional else self.act(x)


class FusedBlock(nn.Module):
    """The same parameters as Block (conv, bn), run as one opkit operator: the convolution's
    output is normalized and activated block by block while it is in cache."""

    def __init__(self, conv: nn.Conv2d, bn, up: bool = False, alpha: float = ALPHA):
        super().__init__()
        if conv.stride[0] != conv.stride[1] or conv.padding[0] != conv.padding[1] or \
                conv.dilation != (1, 1) or conv.groups != 1:
            raise ValueError(f"FusedBlock: the fused operators take a square stride and padding, "
                             f"no dilation or groups; got {conv}")
        self.up = nn.Upsample(scale_factor=2, mode="nearest") if up else None
        self.conv, self.bn, self.alpha = conv, bn, alpha

    def forward(self, x, z=None):
        if self.up is not None:
            x = self.up(x)
        conv, bn = self.conv, self.bn
        shape = dict(stride=conv.stride[0], padding=conv.padding[0], alpha=self.alpha)
        if bn is None:
            return torch.ops.opkit.conv2d_bias_leaky_relu(x, conv.weight, conv.bias, **shape)
        if not self.training:
            return torch.ops.opkit.conv2d_bn_leaky_relu(x, conv.weight, bn.weight, bn.bias,
                                                        bn.running_mean, bn.running_var,
                                                        eps=bn.eps, **shape)
        y, mean, var = torch.ops.opkit.conv2d_bn_train_leaky_relu(x, conv.weight, bn.weight,
                                                                  bn.bias, eps=bn.eps, **shape)
        update_running_stats(bn, mean, var, y.numel() // y.shape[1])
        return y


@torch.no_grad()
def update_running_stats(bn: nn.BatchNorm2d, mean, var, count: int) -> None:
    """What nn.BatchNorm2d does in training mode: the biased batch variance normalizes, the
    unbiased one goes into the running average (momentum None: a cumulative average)."""
    bn.num_batches_tracked += 1
    m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    bn.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
    bn.running_var.mul_(1 - m).add_(var.detach() * (count / max(count - 1, 1)), alpha=m)


def _block(variant, conv, bn, channels, size, z_dim=0, up=False, bits=None) -> nn.Module:
    if variant == "fused":
        return FusedBlock(conv, bn, up=up, alpha=fixed_slope(ALPHA, bits))
    return Block(conv, bn, activation(variant, channels, size, z_dim, bits), up=up)


def dcgan_init(model: nn.Module, seed: int) -> nn.Module:
    """DCGAN's initialization (convolution weights N(0, 0.02), batch-norm scales N(1, 0.02)),
    then the conditional slopes' projections, all from a generator seeded with `seed`: the
    modules are visited in the same order in every variant, the slope parameters last."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                m.weight.normal_(0.0, 0.02, generator=gen)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.normal_(1.0, 0.02, generator=gen)
                m.bias.zero_()
        for m in model.modules():
            if isinstance(m, onn.ConditionalLeakyReLU):
                # small weights: every slope starts near the middle of [alpha_min, alpha_max]
                m.w.normal_(0.0, 0.1 / m.z_dim ** 0.5, generator=gen)
    return model


def _seed() -> int:
    return int(torch.randint(0, 2 ** 62, (1,)))


def _own_rng():
    """Module constructors draw from the global generator (PyTorch's default initialization,
    the slope parameters), each variant differently: a model leaves it as one draw moved it."""
    return torch.random.fork_rng(devices=[])


class Generator(nn.Module):
    """z [N, z_dim] -> image [N, 1, 32, 32] in [-1, 1]: a 4x4 transposed convolution from z,
    then three rounds of nearest 2x upsampling and a 3x3 convolution (upsampling + convolution
    instead of strided transposed convolutions, which leave checkerboard patterns)."""

    def __init__(self, variant: str = "torch", z_dim: int = Z_DIM, width: int = WIDTH,
                 alpha_bits: Optional[int] = None):
        super().__init__()
        seed = _seed()
        v = _check_variant(variant)
        self.variant, self.z_dim = variant, z_dim
        c4, c2, c1 = 4 * width, 2 * width, width
        with _own_rng():
            self._build(v, z_dim, c4, c2, c1, alpha_bits)
        dcgan_init(self, seed)

    def _build(self, v, z_dim, c4, c2, c1, bits):
        # the transposed convolution has no fused operator: a Block in every variant
        self.stem = Block(nn.ConvTranspose2d(z_dim, c4, 4, 1, 0, bias=False), nn.BatchNorm2d(c4),
                          activation("plain" if v == "fused" else v, c4, 4, z_dim, bits))
        self.up1 = _block(v, nn.Conv2d(c4, c2, 3, 1, 1, bias=False), nn.BatchNorm2d(c2), c2, 8,
                          z_dim, up=True, bits=bits)
        self.up2 = _block(v, nn.Conv2d(c2, c1, 3, 1, 1, bias=False), nn.BatchNorm2d(c1), c1, 16,
                          z_dim, up=True, bits=bits)
        self.out = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                 nn.Conv2d(c1, 1, 3, 1, 1), nn.Tanh())

    def forward(self, z):
        x = self.stem(z[:, :, None, None], z)
        x = self.up1(x, z)
        x = self.up2(x, z)
        return self.out(x)


class Discriminator(nn.Module):
    """image [N, 1, 32, 32] -> logit [N]: three 4x4 stride-2 convolutions (the first with a
    bias and no batch norm, as in DCGAN), each followed by LeakyReLU, and a 4x4 convolution to
    one logit."""

    def __init__(self, variant: str = "torch", width: int = WIDTH,
                 alpha_bits: Optional[int] = None):
        super().__init__()
        seed = _seed()
        v = _check_variant(variant)
        self.variant = variant
        with _own_rng():
            self._build(v, width, 2 * width, 4 * width, alpha_bits)
        dcgan_init(self, seed)

    def _build(self, v, c1, c2, c4, bits):
        self.b1 = _block(v, nn.Conv2d(1, c1, 4, 2, 1), None, c1, 16, bits=bits)
        self.b2 = _block(v, nn.Conv2d(c1, c2, 4, 2, 1, bias=False), nn.BatchNorm2d(c2), c2, 8,
                         bits=bits)
        self.b3 = _block(v, nn.Conv2d(c2, c4, 4, 2, 1, bias=False), nn.BatchNorm2d(c4), c4, 4,
                         bits=bits)
        self.head = nn.Conv2d(c4, 1, 4, 1, 0)

    def forward(self, x):
        x = self.b3(self.b2(self.b1(x)))
        return self.head(x).reshape(-1)

