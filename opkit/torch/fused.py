"""Conv2d (→ BatchNorm2d) → LeakyReLU as one module over opkit's fused convolution operators;
`opkit.torch.optimize` puts it in place of such chains (docs/torch.md, "Tuning a model").

The module reads the convolution's and batch norm's parameters and buffers from the original
modules, which stay where they were in the model: the state_dict keeps its keys, and
.to()/.half()/.train()/.eval() of the model reach them as before.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import get as _get
from ..config import DEFAULT_PRECISION
from ..runtime.precision import _cast_to
from .library import call, call_
from .resize import Plan, cached, recorded
from .tensors import DTYPES, TORCH_DTYPES

# where the convolution runs: opkit's fused operator, or PyTorch's conv2d with opkit's
# activation after it
CONV_CHOICES = ("opkit", "torch")


def _added(z: torch.Tensor, r: Optional[torch.Tensor]) -> torch.Tensor:
    """z + r into z where that is what z + r gives (same shape and dtype), else a new tensor."""
    if r is None:
        return z
    if r.shape == z.shape and r.dtype == z.dtype:
        return z.add_(r)
    return z + r


class _NoEffect(torch.autograd.Function):
    """y, with `b` recorded as an input whose gradient is zero: a convolution's bias before a
    training batch norm cancels out, and its gradient is zero (not None, so weight decay and
    momentum update it as they would the original's)."""

    @staticmethod
    def forward(ctx, y, b):
        ctx.b_shape, ctx.b_dtype = b.shape, b.dtype
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        return dy, dy.new_zeros(ctx.b_shape, dtype=ctx.b_dtype)


class FusedConvLeakyReLU(nn.Module):
    """y = LeakyReLU(BatchNorm2d(Conv2d(x))) (or without the batch norm) in one opkit call.

    Eval: conv2d_bias_leaky_relu / conv2d_bn_leaky_relu with the running statistics.
    Training: conv2d_bn_train_leaky_relu normalizes with the batch's statistics, and the running
    statistics are updated as nn.BatchNorm2d updates them (momentum, or the cumulative average
    when momentum is None; the unbiased variance; num_batches_tracked).
    With conv="torch" for a mode, PyTorch's conv2d runs the convolution and opkit the rest.
    """

    def __init__(self, conv: nn.Module, bn: Optional[nn.BatchNorm2d], alpha: float,
                 stride: int, padding: int, names=("", None), precision_mode: str = DEFAULT_PRECISION,
                 eval_conv: str = "opkit", train_conv: str = "opkit", residual: bool = False):
        super().__init__()
        # plain references, not children: the modules stay registered where they were
        object.__setattr__(self, "_conv", conv)
        object.__setattr__(self, "_bn", bn)
        self.alpha = float(alpha)
        self.stride, self.padding = int(stride), int(padding)
        self.conv_name, self.bn_name = names
        self.precision_mode = precision_mode
        # ConvTranspose2d (a DCGAN generator's stem): PyTorch's transposed convolution with
        # the batch norm folded in and opkit's slope; opkit has no fused operator for it
        self.transposed = isinstance(conv, nn.ConvTranspose2d)
        # a residual added before the slope (conv(x) + r): PyTorch's convolution, the addition
        # and the slope in place over its output (the fused operators take no residual)
        self.residual = residual
        if self.transposed or residual:
            eval_conv = train_conv = "torch"
        self.eval_conv, self.train_conv = eval_conv, train_conv
        self.up, self.plan = 1, None
        self._cache = None  # (versions of the parameters, the eval convolution's weights)

    def fold_upsampling(self, r: int) -> None:
        """Take nearest r-times upsampling of the input into the convolution (resize.py): the
        module's input is then the image before upsampling."""
        self.up, self.plan = int(r), Plan(int(r), self._conv.kernel_size, self._conv.padding)

    @property
    def conv(self) -> nn.Conv2d:
        return self._conv

    @property
    def bn(self) -> Optional[nn.BatchNorm2d]:
        return self._bn

    @property
    def operator(self) -> str:
        """What the current mode runs: an opkit fused operator (conv="opkit"), or PyTorch's
        convolution and opkit's leaky_relu (conv="torch")."""
        training = self._bn.training if self._bn is not None else self.training
        return self.runs(training)

    def runs(self, training: bool) -> str:
        """What a call in training or in eval runs, in words for reports."""
        if (self.train_conv if training else self.eval_conv) == "torch":
            conv = "conv_transpose2d" if self.transposed else "conv2d"
            act = "add + leaky_relu" if self.residual else "leaky_relu"
            if self._bn is None:
                return f"{conv} + {act}"
            return f"{conv} + batch_norm + {act}" if training else \
                f"{conv} (batch norm folded in) + {act}"
        if self._bn is None:
            return "conv2d_bias_leaky_relu"
        return "conv2d_bn_train_leaky_relu" if training else "conv2d_bn_leaky_relu"

    def describe(self) -> str:
        """What it runs in eval, and in training where that differs."""
        ev, tr = self.runs(False), self.runs(True)
        return ev if ev == tr else f"{ev} (training: {tr})"

    def forward(self, x: torch.Tensor, r: Optional[torch.Tensor] = None) -> torch.Tensor:
        training = self._bn.training if self._bn is not None else self.training
        if (self.train_conv if training else self.eval_conv) == "torch" or r is not None:
            return self._torch_conv(x, training, r)
        if self.up > 1:  # opkit's convolution takes the upsampled image
            x = F.interpolate(x, scale_factor=self.up, mode="nearest")
        return self._opkit_conv(x, training)

    # ------------------------------------------------------------------ precision

    def _run(self, name: str, x: torch.Tensor, *tensors, **attrs):
        """torch.ops.opkit.<name> with every tensor cast as the precision mode casts an opkit
        call's inputs; results come back in x's dtype, so the model around keeps its dtypes."""
        target = None
        if self.precision_mode != DEFAULT_PRECISION:
            cast = _cast_to(_get(name).spec, self.precision_mode, np.dtype(DTYPES[x.dtype]))
            target = TORCH_DTYPES[cast.name] if cast is not None else None
        if target is None or target == x.dtype:
            return call(name, x, *tensors, **attrs)
        out = call(name, x.to(target), *(t.to(target) for t in tensors), **attrs)
        if isinstance(out, tuple):  # y and the batch statistics
            return (out[0].to(x.dtype),) + tuple(out[1:])
        return out.to(x.dtype)

    # ------------------------------------------------------------------ the two ways

    def _bias(self, x: torch.Tensor) -> torch.Tensor:
        b = self._conv.bias
        return b if b is not None else x.new_zeros(self._conv.out_channels, dtype=self._conv.weight.dtype)

    def _affine(self, like: torch.Tensor):
        bn = self._bn
        if bn.affine:
            return bn.weight, bn.bias
        return like.new_ones(bn.num_features), like.new_zeros(bn.num_features)

    def _opkit_conv(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        conv, bn = self._conv, self._bn
        geometry = dict(stride=self.stride, padding=self.padding, alpha=self.alpha)
        if bn is None:
            return self._run("conv2d_bias_leaky_relu", x, conv.weight, self._bias(x), **geometry)
        gamma, beta = self._affine(bn.running_mean)
        if not training:
            mean = bn.running_mean if conv.bias is None else bn.running_mean - conv.bias
            return self._run("conv2d_bn_leaky_relu", x, conv.weight, gamma, beta, mean,
                             bn.running_var, eps=float(bn.eps), **geometry)
        y, mean, var = self._run("conv2d_bn_train_leaky_relu", x, conv.weight, gamma, beta,
                                 eps=float(bn.eps), **geometry)
        if conv.bias is not None:  # the batch norm removes the bias from y, not from the mean
            mean = mean + conv.bias.detach()
            y = _NoEffect.apply(y, conv.bias)
        self._update(y, mean, var)
        return y

    def _torch_conv(self, x: torch.Tensor, training: bool,
                    r: Optional[torch.Tensor] = None) -> torch.Tensor:
        conv, bn = self._conv, self._bn
        if training:  # PyTorch's convolution with its bias (and batch norm), opkit's slope
            z = self._conv2d(x, conv.weight, conv.bias)
            z = bn(z) if bn is not None else z
            return self._run("leaky_relu", z if r is None else z + r, alpha=self.alpha)
        sources = (conv.weight, conv.bias) + ((bn.weight, bn.bias, bn.running_mean, bn.running_var)
                                             if bn is not None else ())
        extra = (r,) if r is not None else ()
        if self.precision_mode == DEFAULT_PRECISION and not recorded(x, *sources, *extra):
            # nothing records the call: the folded weights are made once for these parameters,
            # the convolution adds the bias, then the residual and the slope go over its output
            # in place
            w, shift = cached(self, sources, x, lambda fmt: self._eval_params(x, fmt))
            then = lambda z: call_("leaky_relu", _added(z, r), alpha=self.alpha)  # noqa: E731
            if self.plan is not None:
                return self.plan.convolve(x, None, None, then, params=(w, shift))
            return then(self._raw(x, w, shift))
        w, shift = self._folded(x)
        if self.up > 1 or r is not None:
            z = self._conv2d(x, w, shift.to(w.dtype))
            return self._run("leaky_relu", z if r is None else z + r, alpha=self.alpha)
        z = self._raw(x, w, None)
        return self._run("fused_bias_leaky_relu", z, shift, alpha=self.alpha, gain=1.0)

    def _eval_params(self, x: torch.Tensor, fmt):
        """The folded weights and bias, as phase kernels where upsampling is folded in."""
        w, shift = self._folded(x)
        shift = shift.to(w.dtype)
        return self.plan.params(w, shift, fmt) if self.plan is not None else (w, shift)

    def _folded(self, x: torch.Tensor):
        """(weights, bias) of the convolution with the inference batch norm folded in."""
        conv, bn = self._conv, self._bn
        w, shift = conv.weight, self._bias(x)
        if bn is not None:
            gamma, beta = self._affine(bn.running_mean)
            scale = gamma / torch.sqrt(bn.running_var + bn.eps)
            # output channels: the first dim of a convolution's weights, the second of a transposed one's
            w = w * (scale.reshape(1, -1, 1, 1) if self.transposed else scale.reshape(-1, 1, 1, 1))
            shift = beta + (shift - bn.running_mean) * scale
        return w, shift

    def _conv2d(self, x, w, b, then=None):
        """PyTorch's conv2d, over the upsampled image when upsampling is folded in; `then`: an
        in-place elementwise op over the result."""
        if self.plan is not None:
            return self.plan.convolve(x, w, b, then)
        z = self._raw(x, w, b)
        return then(z) if then is not None else z

    def _raw(self, x, w, b):
        """PyTorch's convolution (or transposed convolution) of x with these weights."""
        if self.transposed:
            c = self._conv
            return F.conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding, c.groups,
                                      c.dilation)
        return F.conv2d(x, w, b, self.stride, self.padding)

    def _update(self, y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        """The running statistics, as nn.BatchNorm2d updates them in training."""
        bn = self._bn
        n = y.numel() // y.shape[1]
        if n <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {list(y.shape)} (batch norm {self.bn_name})")
        if not bn.track_running_stats:
            return
        with torch.no_grad():
            bn.num_batches_tracked.add_(1)
            f = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            unbiased = var.detach().to(bn.running_var.dtype) * (n / (n - 1))
            bn.running_mean.copy_(f * mean.detach().to(bn.running_mean.dtype)
                                  + (1 - f) * bn.running_mean)
            bn.running_var.copy_(f * unbiased + (1 - f) * bn.running_var)

    def extra_repr(self) -> str:
        parts = [f"conv={self.conv_name!r}"] + ([f"bn={self.bn_name!r}"] if self._bn is not None else [])
        parts += [f"alpha={self.alpha:g}", f"stride={self.stride}", f"padding={self.padding}"]
        if self.precision_mode != DEFAULT_PRECISION:
            parts.append(f"precision_mode={self.precision_mode!r}")
        if self.up > 1:
            parts.append(f"upsampling folded in (x{self.up})")
        if "torch" in (self.eval_conv, self.train_conv):
            parts.append(f"eval_conv={self.eval_conv!r}, train_conv={self.train_conv!r}")
        return ", ".join(parts)
