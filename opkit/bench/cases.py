"""The hand-written cases of `opkit bench`'s targets: each builds the calls it compares (opkit,
the copy of the same bytes, NumPy, PyTorch where it is installed) and returns them with the
bytes one call moves (and, where the copy moves other bytes, those). The fused convolutions'
cases are in conv.py; targets.py says what each is measured against."""
from __future__ import annotations

import math

import numpy as np

from .harness import torch_modules


def _pass_arrays(shape, dtype, rng):
    """x and dy drawn from N(0, 1) in `dtype`, and a result buffer like x."""
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, dy, np.empty_like(x)


def leaky_case(shape, dtype, rng, out: bool):
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)
    y = np.empty_like(x)
    a = dtype(0.2) if dtype != np.float64 else 0.2
    fns = {"opkit": (lambda: op(x, alpha=0.2, out=y)) if out else (lambda: op(x, alpha=0.2)),
           "copy": lambda: np.copyto(y, x),
           "numpy": (lambda: np.maximum(x, a * x, out=y)) if out else (lambda: np.maximum(x, a * x))}
    if torch is not None:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        fns["torch"] = (lambda: torch._C._nn.leaky_relu(tx, 0.2, out=ty)) if out else \
            (lambda: F.leaky_relu(tx, 0.2))
    return fns, 2 * x.nbytes


def leaky_backward_case(shape, dtype, rng):
    import opkit
    op = opkit.get("leaky_relu")
    torch, _ = torch_modules()
    x, dy, y = _pass_arrays(shape, dtype, rng)
    a = dtype(0.2)
    fns = {"opkit": lambda: op.backward(dy, x, alpha=0.2), "copy": lambda: np.copyto(y, x),
           "numpy": lambda: np.where(x > 0, dy, a * dy)}
    if torch is not None:
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        fns["torch"] = lambda: torch.ops.aten.leaky_relu_backward(tdy, tx, 0.2, False)
    return fns, 3 * x.nbytes, 2 * x.nbytes


def layout_conversion_case(shape, dtype, rng):
    """An NCHW array written into NHWC memory (out= is the NHWC buffer's NCHW-ordered view)."""
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)
    n, c, h, w = shape
    buf = np.empty((n, h, w, c), dtype)
    view = buf.transpose(0, 3, 1, 2)
    a = dtype(0.2)
    fns = {"opkit": lambda: op(x, alpha=0.2, out=view), "copy": lambda: np.copyto(view, x),
           "numpy": lambda: np.maximum(x, a * x, out=view)}
    if torch is not None:
        tx = torch.from_numpy(x)
        fns["torch"] = lambda: F.leaky_relu(tx, 0.2).contiguous(memory_format=torch.channels_last)
    return fns, 2 * x.nbytes


def view_case(shape, dtype, rng):
    """The NHWC view of an NCHW array, no out=: the result keeps the input's memory order."""
    import opkit
    op = opkit.get("leaky_relu")
    x = rng.standard_normal(shape).astype(dtype)
    view = x.transpose(0, 2, 3, 1)
    return {"opkit": lambda: op(view, alpha=0.2, layout="NHWC"),
            "opkit contiguous": lambda: op(x, alpha=0.2)}, 2 * x.nbytes


def spatial_case(shape, dtype, rng):
    import opkit
    sp, lr = opkit.get("spatial_leaky_relu"), opkit.get("leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)             # NHWC
    amap = rng.uniform(0.1, 0.3, shape[:3] + (1,)).astype(dtype)
    fns = {"opkit": lambda: sp(x, amap, layout="NHWC"), "opkit leaky_relu": lambda: lr(x, alpha=0.2),
           "numpy": lambda: np.where(x > 0, x, amap * x)}
    if torch is not None:
        tx, ta = torch.from_numpy(x), torch.from_numpy(amap)
        fns["torch"] = lambda: torch.where(tx > 0, tx, ta * tx)
    return fns, 2 * x.nbytes


def spatial_map_backward_case(shape, layout, dtype, rng):
    """spatial_leaky_relu backward with its per-pixel map ([N, 1, H, W]; [N, H, W, 1] over
    NHWC, `shape` in the layout's order): dx and the map's gradient, a sum over C folded into
    the pass, against the copy of the same bytes, both into warm memory."""
    import opkit
    sp = opkit.get("spatial_leaky_relu")
    x = rng.standard_normal(shape).astype(dtype)
    amap = rng.uniform(0.1, 0.3, (shape[0], 1) + shape[2:] if layout == "NCHW"
                       else shape[:3] + (1,)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    out, dst = (np.empty_like(x), np.empty_like(amap)), np.empty_like(x)
    return {"opkit": lambda: sp.backward(dy, x, amap, layout=layout, out=out),
            "copy": lambda: np.copyto(dst, x)}, 3 * x.nbytes + 2 * amap.nbytes, 2 * x.nbytes


def conditional_case(shape, dtype, rng):
    import opkit
    cond, lr = opkit.get("conditional_leaky_relu"), opkit.get("leaky_relu")
    torch, F = torch_modules()
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)             # NCHW
    z = rng.standard_normal((n, 64)).astype(dtype)
    wt = rng.standard_normal((64, c)).astype(dtype) * dtype(0.1)
    b = rng.standard_normal(c).astype(dtype)

    def numpy_chain():
        alpha = 0.1 + 0.2 / (1 + np.exp(-(z @ wt + b)))
        return np.where(x > 0, x, alpha.astype(dtype)[:, :, None, None] * x)

    fns = {"opkit": lambda: cond(x, z, wt, b), "opkit leaky_relu": lambda: lr(x, alpha=0.2),
           "numpy": numpy_chain}
    if torch is not None:
        tx, tz, tw, tb = (torch.from_numpy(a) for a in (x, z, wt, b))

        def torch_chain():
            alpha = 0.1 + 0.2 * torch.sigmoid(tz @ tw + tb)
            return torch.where(tx > 0, tx, alpha[:, :, None, None] * tx)
        fns["torch"] = torch_chain
    return fns, 2 * x.nbytes


def fused_bias_case(shape, dtype, rng):
    import opkit
    op = opkit.get("fused_bias_leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)             # NHWC
    b = rng.standard_normal(shape[-1]).astype(dtype)
    gain = dtype(math.sqrt(2))

    def numpy_chain():
        v = x + b
        return np.clip(np.where(v > 0, v, dtype(0.2) * v) * gain, -256, 256)

    fns = {"opkit": lambda: op(x, b, layout="NHWC", clamp=256.0), "numpy": numpy_chain}
    if torch is not None:
        tx, tb = torch.from_numpy(x), torch.from_numpy(b)
        fns["torch"] = lambda: (F.leaky_relu(tx + tb, 0.2) * float(gain)).clamp(-256, 256)
    return fns, 2 * x.nbytes


def leaky_half_case(shape, rng, pass_):
    """float16 into warm memory on both sides: opkit out= against aten's out= kernels."""
    import opkit
    op = opkit.get("leaky_relu")
    torch, _ = torch_modules()
    x, dy, y = _pass_arrays(shape, np.float16, rng)
    if pass_ == "forward":
        fns = {"opkit": lambda: op(x, alpha=0.2, out=y), "copy": lambda: np.copyto(y, x)}
        if torch is not None:
            tx, ty = torch.from_numpy(x), torch.from_numpy(y)
            fns["torch"] = lambda: torch._C._nn.leaky_relu(tx, 0.2, out=ty)
        return fns, 2 * x.nbytes
    out = (y,)
    fns = {"opkit": lambda: op.backward(dy, x, alpha=0.2, out=out), "copy": lambda: np.copyto(y, x)}
    if torch is not None:
        tx, tdy, ty = torch.from_numpy(x), torch.from_numpy(dy), torch.from_numpy(y)
        grad = torch.ops.aten.leaky_relu_backward.grad_input
        fns["torch"] = lambda: grad(tdy, tx, 0.2, False, grad_input=ty)
    return fns, 3 * x.nbytes, 2 * x.nbytes


def fused_bias_backward_case(shape, dtype, rng):
    """dx and dbias (NHWC): opkit's backward against PyTorch autograd through the eager chain."""
    import opkit
    op = opkit.get("fused_bias_leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    out = (np.empty_like(x), np.empty_like(b))
    fns = {"opkit": lambda: op.backward(dy, x, b, layout="NHWC", clamp=256.0, out=out)}
    if torch is not None:
        tx = torch.from_numpy(x).requires_grad_()
        tb = torch.from_numpy(b).requires_grad_()
        y = (F.leaky_relu(tx + tb, 0.2) * math.sqrt(2)).clamp(-256, 256)
        tdy = torch.from_numpy(dy)
        fns["torch"] = lambda: torch.autograd.grad(y, (tx, tb), tdy, retain_graph=True)
    return fns, 3 * x.nbytes


def conditional_pass_case(shape, dtype, rng, pass_):
    """conditional_leaky_relu (NCHW) against the copy of the same bytes, both into warm memory."""
    import opkit
    cond = opkit.get("conditional_leaky_relu")
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    z = rng.standard_normal((n, 64)).astype(dtype)
    wt = (rng.standard_normal((64, c)) * 0.1).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    y, dst = np.empty_like(x), np.empty_like(x)
    if pass_ == "forward":
        return {"opkit": lambda: cond(x, z, wt, b, out=y), "copy": lambda: np.copyto(dst, x)}, \
            2 * x.nbytes, 2 * x.nbytes
    dy = rng.standard_normal(shape).astype(dtype)
    out = tuple(np.empty_like(a) for a in (x, z, wt, b))
    return {"opkit": lambda: cond.backward(dy, x, z, wt, b, out=out),
            "copy": lambda: np.copyto(dst, x)}, 3 * x.nbytes, 2 * x.nbytes


def freq_case(shape, rng, pass_):
    """freq_leaky_relu (NCHW, up=2) against the same computation in torch.fft: rfft2,
    zero-padding, irfft2, LeakyReLU, rfft2, cropping, irfft2 (the backward through autograd)."""
    import opkit
    op = opkit.get("freq_leaky_relu")
    torch, F = torch_modules()
    x, dy, y = _pass_arrays(shape, np.float32, rng)
    if pass_ == "forward":
        fns = {"opkit": lambda: op(x, out=y)}
    else:
        out = (np.empty_like(x),)
        fns = {"opkit": lambda: op.backward(dy, x, out=out)}
    if torch is None:
        return fns, 2 * x.nbytes
    h, w = shape[2:]

    def pipeline(t):
        spec = torch.fft.rfft2(t)
        big = torch.zeros(shape[:2] + (2 * h, w + 1), dtype=spec.dtype)
        big[..., : h // 2, : w // 2 + 1] = spec[..., : h // 2, :]
        big[..., -(h // 2):, : w // 2 + 1] = spec[..., -(h // 2):, :]
        u = torch.fft.irfft2(big, s=(2 * h, 2 * w)) * 4
        a = F.leaky_relu(u, 0.2)
        s2 = torch.fft.rfft2(a)
        crop = torch.cat([s2[..., : h // 2, : w // 2 + 1], s2[..., -(h // 2):, : w // 2 + 1]], dim=-2)
        return torch.fft.irfft2(crop, s=(h, w)) / 4

    tx = torch.from_numpy(x)
    if pass_ == "forward":
        fns["torch"] = lambda: pipeline(tx)
    else:
        leaf = tx.clone().requires_grad_()
        ty = pipeline(leaf)
        tdy = torch.from_numpy(dy)
        fns["torch"] = lambda: torch.autograd.grad(ty, (leaf,), tdy, retain_graph=True)
    return fns, 2 * x.nbytes


def small_case(shape, dtype, rng):
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = torch_modules()
    x = rng.standard_normal(shape).astype(dtype)
    a = dtype(0.2)
    fns = {"opkit": lambda: op(x, alpha=0.2), "numpy": lambda: np.maximum(x, a * x)}
    if torch is not None:
        tx = torch.from_numpy(x)
        fns["torch"] = lambda: F.leaky_relu(tx, 0.2)
    return fns, 2 * x.nbytes


# ------------------------------------------------------------------------------- through PyTorch

def _torch_op():
    """torch.ops.opkit.leaky_relu (opkit.torch registers it), or None without PyTorch."""
    torch, _ = torch_modules()
    if torch is None:
        return None
    import opkit.torch  # noqa: F401
    return torch.ops.opkit.leaky_relu


def torch_call_case(size, rng):
    """torch.ops.opkit.leaky_relu against the NumPy-level call of the same kernel and against
    F.leaky_relu, all allocating their result."""
    import opkit
    torch, F = torch_modules()
    top = _torch_op()
    if top is None:
        return None
    op = opkit.get("leaky_relu")
    x = rng.standard_normal(size).astype(np.float32)
    tx = torch.from_numpy(x)
    return {"opkit": lambda: top(tx, 0.2), "opkit numpy": lambda: op(x, alpha=0.2),
            "torch": lambda: F.leaky_relu(tx, 0.2)}, 2 * x.nbytes


def torch_autograd_case(size, rng):
    """Forward and backward through autograd: torch.ops.opkit.leaky_relu against torch.nn.LeakyReLU."""
    torch, _ = torch_modules()
    top = _torch_op()
    if top is None:
        return None
    x = torch.from_numpy(rng.standard_normal(size).astype(np.float32)).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    ref = torch.nn.LeakyReLU(0.2)

    def step(f):
        def run():
            x.grad = None  # every step writes a fresh gradient, as a training step does
            f(x).backward(dy)
        return run
    # forward: x read, y written; backward: x and dy read, dx written
    return {"opkit": step(lambda t: top(t, 0.2)), "torch": step(ref)}, 5 * x.numel() * x.element_size()
