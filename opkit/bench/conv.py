"""`opkit bench` cases of the fused convolutions (docs/fusion.md): conv2d + inference batch norm +
LeakyReLU against PyTorch's eager chain in the same layout, against the same convolution without
an epilogue, and against opkit's convolution followed by separate batch-norm and LeakyReLU
passes; a 1 x 1 convolution (a pure GEMM); the training-mode operator forward + backward against
PyTorch autograd. targets.py holds their targets (CONV_TARGETS)."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

from .harness import torch_modules

# operators the comparison needs besides the bundled ones: the bare convolution (the same
# fused call with nothing after it) and a separate batch-norm pass
_HELPERS = {
    "bench_conv2d.yaml": """name: bench_conv2d
inputs:
  x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}
  w: {dtypes: [float32, float64], shape: [O, C, KH, KW]}
attrs:
  padding: {type: int, default: 0, range: [0, 8]}
outputs:
  y: {}
forward:
  y: conv2d(x, w, 1, padding)
""",
    "bench_batch_norm.yaml": """name: bench_batch_norm
inputs:
  x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}
  gamma: {dtypes: [float32, float64], shape: [C]}
  beta: {dtypes: [float32, float64], shape: [C]}
  mean: {dtypes: [float32, float64], shape: [C]}
  var: {dtypes: [float32, float64], shape: [C]}
attrs:
  eps: {type: float, default: 1e-5}
outputs:
  y: {like: x}
forward:
  y: (x - mean) * (gamma / sqrt(var + eps)) + beta
""",
}


@functools.lru_cache(maxsize=None)
def _helpers():
    import opkit
    folder = Path(tempfile.mkdtemp(prefix="opkit-bench-ops-"))
    for name, text in _HELPERS.items():
        (folder / name).write_text(text)
    opkit.load(folder)
    return opkit.get("bench_conv2d"), opkit.get("bench_batch_norm")


def _inputs(rng, shape, k, layout, dtype):
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    wt = (rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k)).astype(dtype)
    g, b = rng.uniform(0.5, 1.5, c).astype(dtype), rng.standard_normal(c).astype(dtype)
    m, v = (0.1 * rng.standard_normal(c)).astype(dtype), rng.uniform(0.5, 2, c).astype(dtype)
    return x, wt, g, b, m, v


def _torch_chain(torch, F, x, wt, g, b, m, v, layout, pad):
    """PyTorch eager leaky_relu(batch_norm(conv2d(x, w))) on x's memory (channels_last for NHWC)."""
    tx = torch.from_numpy(x)
    tw = torch.from_numpy(wt)
    if layout == "NHWC":
        tx = tx.permute(0, 3, 1, 2)                    # a channels_last view, no copy
        tw = tw.contiguous(memory_format=torch.channels_last)
    tg, tb, tm, tv = (torch.from_numpy(a) for a in (g, b, m, v))

    def run():
        with torch.no_grad():
            return F.leaky_relu(F.batch_norm(F.conv2d(tx, tw, padding=pad), tm, tv, tg, tb,
                                             training=False, eps=1e-5), 0.2)
    return run


def _frozen_chain(torch, x, wt, g, b, m, v, layout, pad, eager):
    """torch.compile with freezing (batch norm folded into the convolution, oneDNN's
    convolution with the activation fused) of the chain as a module, channels_last; None where
    compiling fails. RuntimeError if it does not compute what `eager` (the eager chain) does."""
    import torch._inductor.config as inductor
    c, o, k = wt.shape[1], wt.shape[0], wt.shape[2]
    model = torch.nn.Sequential(torch.nn.Conv2d(c, o, k, padding=pad, bias=False),
                                torch.nn.BatchNorm2d(o), torch.nn.LeakyReLU(0.2)).eval()
    with torch.no_grad():
        for dst, src in ((model[0].weight, wt), (model[1].weight, g), (model[1].bias, b),
                         (model[1].running_mean, m), (model[1].running_var, v)):
            dst.copy_(torch.from_numpy(np.asarray(src, np.float32)))
    model = model.to(memory_format=torch.channels_last)
    tx = torch.from_numpy(x)
    tx = tx.permute(0, 3, 1, 2) if layout == "NHWC" else tx.contiguous(memory_format=torch.channels_last)
    try:
        with inductor.patch(freezing=True), torch.no_grad():
            fn = torch.compile(model)
            fn(tx)
            fn(tx)
    except Exception:  # no working compiler: the column is left out
        return None
    with torch.no_grad():
        got, want = fn(tx), eager()
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
        raise RuntimeError("opkit bench: the torch.compile column does not compute the eager "
                           f"chain (max difference {float((got - want).abs().max()):g})")

    def run():
        with torch.no_grad():
            return fn(tx)
    return run


def conv_bn_case(shape, k, layout, rng, dtype=np.float32, compiled=False):
    """The fused operator, PyTorch's chain (in x's layout, and channels_last), the bare
    convolution, the unfused chain and, with `compiled`, torch.compile with freezing."""
    import opkit
    op, leaky = opkit.get("conv2d_bn_leaky_relu"), opkit.get("leaky_relu")
    conv, bn = _helpers()
    x, wt, g, b, m, v = _inputs(rng, shape, k, layout, dtype)
    pad = k // 2
    fns = {
        "opkit": lambda: op(x, wt, g, b, m, v, padding=pad, layout=layout),
        "opkit conv": lambda: conv(x, wt, padding=pad, layout=layout),
        "opkit unfused": lambda: leaky(bn(conv(x, wt, padding=pad, layout=layout), g, b, m, v,
                                          layout=layout), alpha=0.2, layout=layout),
    }
    torch, F = torch_modules()
    if torch is not None:
        fns["torch"] = _torch_chain(torch, F, x, wt, g, b, m, v, layout, pad)
        fns["torch CL"] = fns["torch"] if layout == "NHWC" else _torch_chain(
            torch, F, np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt, g, b, m, v, "NHWC", pad)
        frozen = _frozen_chain(torch, x, wt, g, b, m, v, layout, pad, fns["torch"]) \
            if compiled else None
        if frozen is not None:
            fns["torch.compile freezing"] = frozen
    return fns, 2 * x.nbytes


def conv_bn_train_case(shape, k, layout, rng, dtype=np.float32):
    """Training-mode conv + batch norm + LeakyReLU, forward and backward, against autograd (in
    x's layout, and channels_last)."""
    import opkit
    op = opkit.get("conv2d_bn_train_leaky_relu")
    x, wt, g, b, _, _ = _inputs(rng, shape, k, layout, dtype)
    pad = k // 2
    dy = rng.standard_normal(x.shape[:1] + x.shape[1:]).astype(dtype)
    zeros = np.zeros(shape[1], dtype)

    def opkit_step():
        op(x, wt, g, b, padding=pad, layout=layout)
        return op.backward((dy, zeros, zeros), x, wt, g, b, padding=pad, layout=layout)

    fns = {"opkit": opkit_step}
    torch, F = torch_modules()
    if torch is not None:
        fns["torch"] = _autograd_step(torch, F, x, dy, wt, g, b, layout, pad)
        fns["torch CL"] = fns["torch"] if layout == "NHWC" else _autograd_step(
            torch, F, *(np.ascontiguousarray(a.transpose(0, 2, 3, 1)) for a in (x, dy)), wt, g, b,
            "NHWC", pad)
    return fns, 2 * x.nbytes


def _autograd_step(torch, F, x, dy, wt, g, b, layout, pad):
    """PyTorch's training chain, forward and autograd backward, on x's memory."""
    tx = torch.from_numpy(x)
    tdy = torch.from_numpy(dy)
    if layout == "NHWC":
        tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
    tw, tg, tb = (torch.from_numpy(a) for a in (wt, g, b))
    if layout == "NHWC":
        tw = tw.contiguous(memory_format=torch.channels_last)
    leaves = [a.detach().requires_grad_() for a in (tx, tw, tg, tb)]

    def torch_step():
        y = F.leaky_relu(F.batch_norm(F.conv2d(leaves[0], leaves[1], padding=pad), None, None,
                                      leaves[2], leaves[3], training=True, eps=1e-5), 0.2)
        return torch.autograd.grad(y, leaves, tdy)
    return torch_step
