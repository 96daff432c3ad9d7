"""`opkit bench`: kernels timed side by side with the copy bandwidth, NumPy and PyTorch.

Every number is a median over interleaved repetitions (opkit, copy, NumPy, PyTorch, opkit, ...),
so a noisy neighbour slows all contenders alike, and every target is a ratio measured in the
same run. PyTorch is optional: without it its columns stay empty.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._version import __version__

Fn = Callable[[], object]


def _torch():
    try:
        import torch
        import torch.nn.functional as F
        return torch, F
    except ImportError:
        return None, None


def timed(fns: Dict[str, Optional[Fn]], repeat: int, warmup: int = 2,
          rounds: Optional[Dict[str, List[float]]] = None, shuffle=None,
          budget: Optional[float] = None) -> Dict[str, float]:
    """Median seconds per call of each function, the functions interleaved round by round
    (each round's times are appended to `rounds` when it is given). `shuffle`: a NumPy
    Generator that orders each round anew, so no function always runs right after the same
    other one (PyTorch's worker threads keep spinning for a while after its own calls).
    `budget`: fewer rounds (at least 5) where `repeat` of them would take longer (seconds); a
    contender after the first that takes more than a fifth of it per call (NumPy's float16
    arithmetic on millions of elements, say) is warmed up once and timed once, outside the
    rounds."""
    fns = {k: f for k, f in fns.items() if f is not None}
    slow, warm = set(), set()  # (a call longer than the budget is warm after one call)
    for i in range(warmup):
        for j, (k, f) in enumerate(fns.items()):
            if k in slow or k in warm:
                continue
            t0 = time.perf_counter()
            f()
            dt = time.perf_counter() - t0
            if budget is not None and i == 0 and j > 0 and dt > budget / 5:
                slow.add(k)
            if budget is not None and dt > budget:
                warm.add(k)
    times: Dict[str, List[float]] = {k: [] for k in fns}
    # tiny calls are timed in batches so the clock's resolution does not matter
    inner, per_round = {}, 0.0
    for k, f in fns.items():
        t0 = time.perf_counter()
        f()
        dt = time.perf_counter() - t0
        inner[k] = max(1, min(10000, int(2e-3 / max(dt, 1e-9))))
        if k in slow:
            times[k].append(dt)
        else:
            per_round += dt * inner[k]
    if budget is not None:  # (3 rounds where one alone takes longer than the budget)
        repeat = max(3 if per_round > budget else 5, min(repeat, int(budget / max(per_round, 1e-9))))
    for _ in range(repeat):
        order = [k for k in fns if k not in slow]
        if shuffle is not None:
            order = [order[i] for i in shuffle.permutation(len(order))]
        for k in order:
            f, n = fns[k], inner[k]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[k].append((time.perf_counter() - t0) / n)
    if rounds is not None:
        rounds.update(times)
    return {k: float(np.median(v)) for k, v in times.items()}


@dataclass
class Row:
    case: str
    op: str
    pass_: str
    dtype: str
    shape: Tuple[int, ...]
    bytes: int                        # memory traffic of one call: inputs read + outputs written
    seconds: Dict[str, float] = field(default_factory=dict)
    rounds: Dict[str, List[float]] = field(default_factory=dict, repr=False)

    def gbps(self, who: str) -> Optional[float]:
        t = self.seconds.get(who)
        return self.bytes / t / 1e9 if t else None

    def ratio(self, slower: str, faster: str = "opkit") -> Optional[float]:
        """How many times faster `faster` is: the median of the round-by-round ratios when the
        rounds were kept (a drifting load on the machine cancels out), else of the medians."""
        a, b = self.rounds.get(slower), self.rounds.get(faster)
        if a and b and len(a) == len(b):
            return float(np.median([x / y for x, y in zip(a, b)]))
        a, b = self.seconds.get(slower), self.seconds.get(faster)
        return a / b if a and b else None


# ------------------------------------------------------------------------------- the cases

def _leaky_case(shape, dtype, rng, out: bool):
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = _torch()
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


def _leaky_backward_case(shape, dtype, rng):
    import opkit
    op = opkit.get("leaky_relu")
    torch, _ = _torch()
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y = np.empty_like(x)
    a = dtype(0.2)
    fns = {"opkit": lambda: op.backward(dy, x, alpha=0.2), "copy": lambda: np.copyto(y, x),
           "numpy": lambda: np.where(x > 0, dy, a * dy)}
    if torch is not None:
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        fns["torch"] = lambda: torch.ops.aten.leaky_relu_backward(tdy, tx, 0.2, False)
    return fns, 3 * x.nbytes, 2 * x.nbytes


def _layout_conversion_case(shape, dtype, rng):
    """An NCHW array written into NHWC memory (out= is the NHWC buffer's NCHW-ordered view)."""
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = _torch()
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


def _view_case(shape, dtype, rng):
    """The NHWC view of an NCHW array, no out=: the result keeps the input's memory order."""
    import opkit
    op = opkit.get("leaky_relu")
    x = rng.standard_normal(shape).astype(dtype)
    view = x.transpose(0, 2, 3, 1)
    return {"opkit": lambda: op(view, alpha=0.2, layout="NHWC"),
            "opkit contiguous": lambda: op(x, alpha=0.2)}, 2 * x.nbytes


def _spatial_case(shape, dtype, rng):
    import opkit
    sp, lr = opkit.get("spatial_leaky_relu"), opkit.get("leaky_relu")
    torch, F = _torch()
    x = rng.standard_normal(shape).astype(dtype)             # NHWC
    amap = rng.uniform(0.1, 0.3, shape[:3] + (1,)).astype(dtype)
    fns = {"opkit": lambda: sp(x, amap, layout="NHWC"), "opkit leaky_relu": lambda: lr(x, alpha=0.2),
           "numpy": lambda: np.where(x > 0, x, amap * x)}
    if torch is not None:
        tx, ta = torch.from_numpy(x), torch.from_numpy(amap)
        fns["torch"] = lambda: torch.where(tx > 0, tx, ta * tx)
    return fns, 2 * x.nbytes


def _spatial_map_backward_case(shape, layout, dtype, rng):
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


def _conditional_case(shape, dtype, rng):
    import opkit
    cond, lr = opkit.get("conditional_leaky_relu"), opkit.get("leaky_relu")
    torch, F = _torch()
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


def _fused_bias_case(shape, dtype, rng):
    import opkit
    op = opkit.get("fused_bias_leaky_relu")
    torch, F = _torch()
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


def _leaky_half_case(shape, rng, pass_):
    """float16 into warm memory on both sides: opkit out= against aten's out= kernels."""
    import opkit
    op = opkit.get("leaky_relu")
    torch, _ = _torch()
    x = rng.standard_normal(shape).astype(np.float16)
    dy = rng.standard_normal(shape).astype(np.float16)
    y = np.empty_like(x)
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


def _fused_bias_backward_case(shape, dtype, rng):
    """dx and dbias (NHWC): opkit's backward against PyTorch autograd through the eager chain."""
    import opkit
    op = opkit.get("fused_bias_leaky_relu")
    torch, F = _torch()
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


def _conditional_pass_case(shape, dtype, rng, pass_):
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


def _freq_case(shape, rng, pass_):
    """freq_leaky_relu (NCHW, up=2) against the same computation in torch.fft: rfft2,
    zero-padding, irfft2, LeakyReLU, rfft2, cropping, irfft2 (the backward through autograd)."""
    import opkit
    op = opkit.get("freq_leaky_relu")
    torch, F = _torch()
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    y = np.empty_like(x)
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


def _small_case(shape, dtype, rng):
    import opkit
    op = opkit.get("leaky_relu")
    torch, F = _torch()
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
    torch, _ = _torch()
    if torch is None:
        return None
    import opkit.torch  # noqa: F401
    return torch.ops.opkit.leaky_relu


def _torch_call_case(size, rng):
    """torch.ops.opkit.leaky_relu against the NumPy-level call of the same kernel and against
    F.leaky_relu, all allocating their result."""
    import opkit
    torch, F = _torch()
    top = _torch_op()
    if top is None:
        return None
    op = opkit.get("leaky_relu")
    x = rng.standard_normal(size).astype(np.float32)
    tx = torch.from_numpy(x)
    return {"opkit": lambda: top(tx, 0.2), "opkit numpy": lambda: op(x, alpha=0.2),
            "torch": lambda: F.leaky_relu(tx, 0.2)}, 2 * x.nbytes


def _torch_autograd_case(size, rng):
    """Forward and backward through autograd: torch.ops.opkit.leaky_relu against torch.nn.LeakyReLU."""
    torch, _ = _torch()
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


def torch_notes(rows: List[Row]) -> List[str]:
    """The calls through torch.ops next to the NumPy-level call of the same kernel."""
    out = []
    for r in rows:
        s = r.seconds
        if not r.case.startswith("torch.ops") or "opkit" not in s:
            continue
        unit, scale = ("us", 1e6) if s["opkit"] < 1e-4 else ("ms", 1e3)
        parts = [f"{s['opkit'] * scale:.3g} {unit} through torch.ops"]
        if "opkit numpy" in s:
            parts.append(f"{s['opkit numpy'] * scale:.3g} {unit} NumPy-level "
                         f"(+{(s['opkit'] - s['opkit numpy']) * scale:.3g} {unit}, "
                         f"{1 / r.ratio('opkit numpy'):.3f}x)")
        if "torch" in s:
            parts.append(f"PyTorch {s['torch'] * scale:.3g} {unit}")
        out.append(f"{r.case}: " + "; ".join(parts))
    return out


M16 = 16 << 20
# A 5% limit needs many rounds: a round's ratio of two 16M calls spreads by about +-8% here
SHUFFLED = {"shuffle": True, "rounds": 61}
# (case name, builder, shape, dtype, pass, target checks[, options: shuffle, at least this many rounds])
# a check is (label, numerator, denominator, minimum): seconds[numerator] / seconds[denominator];
# a builder returns None when what it compares with is not installed (the checks are then n/a)
TARGETS = [
    ("leaky_relu float32, 16M, out=", lambda r: _leaky_case((M16,), np.float32, r, True), (M16,),
     "float32", "forward", [("vs copy bandwidth", "copy", "opkit", 0.9), ("vs torch out=", "torch", "opkit", 1.0)]),
    ("leaky_relu float32, 16M, allocating", lambda r: _leaky_case((M16,), np.float32, r, False), (M16,),
     "float32", "forward", [("vs torch allocating", "torch", "opkit", 1.0)]),
    ("leaky_relu float16, 16M", lambda r: _leaky_case((M16,), np.float16, r, False), (M16,),
     "float16", "forward", [("vs torch float16", "torch", "opkit", 0.9), ("vs numpy float16", "numpy", "opkit", 30.0)]),
    ("leaky_relu float32 backward, 16M", lambda r: _leaky_backward_case((M16,), np.float32, r), (M16,),
     "float32", "backward", [("vs torch leaky_relu_backward", "torch", "opkit", 1.0)]),
    ("NCHW [8,64,128,128] into NHWC out=", lambda r: _layout_conversion_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs numpy out=view", "numpy", "opkit", 5.0),
                                               ("vs torch .contiguous(channels_last)", "torch", "opkit", 3.0)]),
    ("NHWC view of [8,64,128,128], no out=", lambda r: _view_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs the contiguous call", "opkit contiguous", "opkit", 0.9)]),
    ("16-element arrays, per call", lambda r: _small_case((16,), np.float32, r), (16,), "float32", "forward",
     [("vs numpy np.maximum(x, alpha * x)", "numpy", "opkit", 1.0)]),
    ("spatial_leaky_relu NHWC [8,128,128,64]", lambda r: _spatial_case((8, 128, 128, 64), np.float32, r),
     (8, 128, 128, 64), "float32", "forward", [("vs leaky_relu (time ratio >= 1/1.3)", "opkit leaky_relu", "opkit", 1 / 1.3)]),
    ("conditional_leaky_relu NCHW [8,64,128,128]", lambda r: _conditional_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs leaky_relu (time ratio >= 1/1.3)", "opkit leaky_relu", "opkit", 1 / 1.3)]),
    ("fused_bias_leaky_relu NHWC [8,128,128,64]", lambda r: _fused_bias_case((8, 128, 128, 64), np.float32, r),
     (8, 128, 128, 64), "float32", "forward", [("vs numpy chain", "numpy", "opkit", 3.0), ("vs torch eager chain", "torch", "opkit", 1.5)]),
    ("leaky_relu float16, 16M, out=", lambda r: _leaky_half_case((M16,), r, "forward"), (M16,),
     "float16", "forward", [("vs copy bandwidth", "copy", "opkit", 0.85), ("vs torch out=", "torch", "opkit", 1.0)]),
    ("leaky_relu float16 backward, 16M, out=", lambda r: _leaky_half_case((M16,), r, "backward"), (M16,),
     "float16", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85),
                             ("vs torch leaky_relu_backward(grad_input=)", "torch", "opkit", 1.0)]),
    ("fused_bias_leaky_relu backward NHWC [8,128,128,64] float32",
     lambda r: _fused_bias_backward_case((8, 128, 128, 64), np.float32, r), (8, 128, 128, 64), "float32",
     "backward", [("vs torch autograd (dx, dbias)", "torch", "opkit", 3.0)]),
    ("fused_bias_leaky_relu backward NHWC [8,128,128,64] float16",
     lambda r: _fused_bias_backward_case((8, 128, 128, 64), np.float16, r), (8, 128, 128, 64), "float16",
     "backward", [("vs torch autograd (dx, dbias)", "torch", "opkit", 3.0)]),
    ("conditional_leaky_relu forward NCHW [8,64,128,128], out=",
     lambda r: _conditional_pass_case((8, 64, 128, 128), np.float32, r, "forward"), (8, 64, 128, 128),
     "float32", "forward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("conditional_leaky_relu backward NCHW [8,64,128,128], out=",
     lambda r: _conditional_pass_case((8, 64, 128, 128), np.float32, r, "backward"), (8, 64, 128, 128),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("spatial_leaky_relu backward NCHW [8,64,128,128], map [N,1,H,W], out=",
     lambda r: _spatial_map_backward_case((8, 64, 128, 128), "NCHW", np.float32, r), (8, 64, 128, 128),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("spatial_leaky_relu backward NHWC [8,128,128,64], map [N,H,W,1], out=",
     lambda r: _spatial_map_backward_case((8, 128, 128, 64), "NHWC", np.float32, r), (8, 128, 128, 64),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("freq_leaky_relu forward NCHW [8,64,64,64]", lambda r: _freq_case((8, 64, 64, 64), r, "forward"),
     (8, 64, 64, 64), "float32", "forward", [("vs the torch.fft pipeline", "torch", "opkit", 1.0)]),
    ("freq_leaky_relu backward NCHW [8,64,64,64]", lambda r: _freq_case((8, 64, 64, 64), r, "backward"),
     (8, 64, 64, 64), "float32", "backward", [("vs the torch.fft pipeline (autograd)", "torch", "opkit", 1.0)]),
    ("torch.ops.opkit.leaky_relu float32, 16M", lambda r: _torch_call_case(M16, r), (M16,), "float32",
     "forward", [("vs the NumPy-level call (time <= 1.05x)", "opkit numpy", "opkit", 1 / 1.05),
                 ("vs torch F.leaky_relu", "torch", "opkit", 1.0)], SHUFFLED),
    ("torch.ops.opkit.leaky_relu fwd+bwd autograd, 16M", lambda r: _torch_autograd_case(M16, r), (M16,),
     "float32", "autograd", [("vs torch nn.LeakyReLU forward+backward", "torch", "opkit", 1.0)], SHUFFLED),
    ("torch.ops.opkit.leaky_relu, 16 elements", lambda r: _torch_call_case(16, r), (16,), "float32",
     "forward", [], SHUFFLED),
]


from .conv import CONV_TARGETS  # noqa: E402  (the fused convolutions: docs/fusion.md)

TARGETS += CONV_TARGETS


@dataclass
class TargetResult:
    case: str
    check: str
    ratio: Optional[float]
    minimum: float

    @property
    def met(self) -> Optional[bool]:
        return None if self.ratio is None else self.ratio >= self.minimum


def run_targets(repeat: int, rng) -> Tuple[List[Row], List[TargetResult]]:
    rows, results = [], []
    for name, build, shape, dtype, pass_, checks, *options in TARGETS:
        built = build(rng)
        if built is None:
            results += [TargetResult(name, label, None, minimum) for label, _, _, minimum in checks]
            continue
        fns, nbytes = built[0], built[1]
        rounds: Dict[str, List[float]] = {}
        option = options[0] if options else {}
        seconds = timed(fns, max(repeat, option.get("rounds", 0)), rounds=rounds,
                        shuffle=rng if option.get("shuffle") else None)
        if "copy" in seconds and len(built) > 2:
            # the copy moved built[2] bytes: the time it takes for this call's traffic
            seconds["copy"] *= nbytes / built[2]
            rounds["copy"] = [t * nbytes / built[2] for t in rounds["copy"]]
        row = Row(name, name.split()[0], pass_, dtype, shape, nbytes, seconds, rounds)
        rows.append(row)
        for label, num, den, minimum in checks:
            results.append(TargetResult(name, label, row.ratio(num, den), minimum))
        del fns
    return rows, results


def build_times(jobs: int) -> Tuple[float, float]:
    """`opkit build` of every bundled operator into an empty cache, then again (warm)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, OPKIT_CACHE_DIR=cache)
        env.pop("OPKIT_PATH", None)
        out = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "opkit", "build", "-q", "-j", str(jobs)], env=env,
                           check=True, capture_output=True)
            out.append(time.perf_counter() - t0)
    return out[0], out[1]


# ------------------------------------------------------------------------------- generic runs

def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def _shape_for(size: int, layout: str) -> Tuple[int, ...]:
    """About `size` elements (at most): two images of 64 channels, or (small sizes) one image
    of one channel, at least 3 x 3 (a convolution's kernel fits)."""
    if layout == "ND":
        return (size,)
    n, c = (2, 64) if size >= 4096 else (1, 1)
    side = max(int(math.sqrt(size / (n * c))), 3)
    if side >= 32:  # a multiple of 16: no prime sides for the FFTs of freq_leaky_relu
        side -= side % 16
    return (n, c, side, side) if layout == "NCHW" else (n, side, side, c)


NUMPY_LIMIT = 1.0  # seconds per call beyond which the generic cases leave NumPy's column out


def generic_rows(names: List[str], sizes: List[int], dtypes: List[str], layouts: List[str],
                 passes: List[str], repeat: int, rng, budget: float = 1.0,
                 progress=None, notes: Optional[List[str]] = None,
                 compiled: bool = True, attrs: Sequence[str] = (),
                 dims: Optional[Dict[str, int]] = None) -> List[Row]:
    """Each operator on inputs shaped like its first input, against the copy of the same bytes,
    NumPy running the same graph in the same dtype and PyTorch's own kernels where PyTorch has
    the computation (torch_columns.py). Every side writes into memory it has written before
    (opkit and the copy through out=), so page faults are nobody's. Each case takes about
    `budget` seconds (see timed); `progress(text)` hears of each case as it starts.
    A case the operator does not take (a convolution's kernel larger than the image) is left
    out, and NumPy's column where one call would take longer than NUMPY_LIMIT seconds (predicted
    from the case's smaller size: its float16 convolutions take half a minute at 16M); `notes`
    hears of both. `compiled`: a torch.compile column beside PyTorch's eager one (each case
    compiles its formula first). `attrs`: NAME=VALUE texts, each set on the operators that have
    the attr (the others keep their defaults; an attr none of them has is an error). `dims`:
    sizes of named dims (a softmax's K); with any of N, C, H, W they shape the 4-d inputs, and
    `sizes` is not used."""
    import opkit
    chosen = {name: _chosen_attrs(opkit.get(name), attrs) for name in names}
    unused = [t for t in attrs if not any(t.partition("=")[0] in c for c in chosen.values())]
    if unused:
        have = sorted({a.name for n in names for a in opkit.get(n).spec.attrs})
        raise ValueError(f"--attr {unused[0]!r}: none of {', '.join(names)} has the attr "
                         f"{unused[0].partition('=')[0]!r} (their attrs: {', '.join(have) or 'none'})")
    dims = dims or {}
    if any(d in dims for d in "NCHW"):
        sizes = [0]  # (the dims give the shape)
    cases = [(name, layout, size, dtype, pass_)
             for name in names for layout in _layouts_of(opkit.get(name), layouts)
             for size in sorted(sizes) for dtype in dtypes if dtype in opkit.get(name).spec.dtypes
             for pass_ in passes]
    rows, numpy_rate = [], {}
    notes = notes if notes is not None else []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # (FusionWarning at build: `opkit show` tells it)
        start = time.perf_counter()
        for i, case in enumerate(cases):
            label = f"{_named(case[0], chosen[case[0]])} {case[4]} {case[1]} " \
                f"{_size_text(case[2]) if case[2] else _dims_text(dims)} {case[3]}"
            if progress is not None:
                elapsed = int(time.perf_counter() - start)
                progress(f"[{i + 1}/{len(cases)} {elapsed // 60}:{elapsed % 60:02d}] {label}")
            key = case[:2] + case[3:]
            predicted = numpy_rate.get(key, 0.0) * case[2]
            if predicted > NUMPY_LIMIT:
                notes.append(f"{label}: NumPy's column left out (about {predicted:.2g} s a call)")
            try:
                row = _generic_row(*case, repeat, rng, budget, numpy=predicted <= NUMPY_LIMIT,
                                   compiled=compiled, chosen=chosen[case[0]], dims=dims)
            except ValueError as exc:  # (SpecError too) opkit refuses these shapes; it says why
                notes.append(f"{label}: skipped: {exc}")
                continue
            if row is not None:
                rows.append(row)
                if "numpy" in row.seconds and case[2] >= 4096:  # (per element, not per call)
                    numpy_rate[key] = row.seconds["numpy"] / case[2]
    return rows


# the targets of an elementwise operator at 16M elements (docs/performance.md): the copy of
# the same bytes by dtype, PyTorch eager and torch.compile of the same formula
ELEMENTWISE = {"float32": 0.8, "float16": 0.7}


def elementwise_targets(rows: List[Row]) -> List[TargetResult]:
    """Each row's ratios against the elementwise targets (n/a where a contender is missing)."""
    out = []
    for r in rows:
        name = f"{r.case} {r.dtype}"
        if r.dtype in ELEMENTWISE:
            out.append(TargetResult(name, "vs copy bandwidth", r.ratio("copy"), ELEMENTWISE[r.dtype]))
        out.append(TargetResult(name, "x torch eager", r.ratio("torch"), 1.0))
        out.append(TargetResult(name, "x torch.compile", r.ratio("torch.compile"), 1.0))
    return out


def _layouts_of(op, layouts: List[str]) -> List[str]:
    return [l for l in layouts if l in op.spec.layouts] or [op.spec.layouts[0]]


def _dims_text(dims: Dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def _size_text(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else \
        f"{n >> 10}K" if n >= 1 << 10 and n % (1 << 10) == 0 else str(n)


# sizes of the dims an operator's other inputs have beyond N, C, H, W (a conv's kernel, a z)
_OTHER_DIMS = {"KH": 3, "KW": 3, "R": 3, "S": 3}


def _chosen_attrs(op, texts: Sequence[str]) -> Dict[str, object]:
    """The NAME=VALUE texts naming an attr of `op`, read as its declared types."""
    from ..cli import attr_option
    names = {a.name for a in op.spec.attrs}
    return dict(attr_option(op, t) for t in texts if t.partition("=")[0] in names)


def _dims_option(texts: Sequence[str]) -> Dict[str, int]:
    """--dims NAME=SIZE texts as {name: size}; ValueError for a malformed one."""
    out = {}
    for t in texts:
        name, _, value = t.partition("=")
        if not name.isidentifier() or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--dims {t!r}: expected NAME=SIZE with a positive whole size, "
                             "e.g. K=4096")
        out[name] = int(value)
    return out


def _named(name: str, chosen: Dict[str, object]) -> str:
    """gelu, or gelu[approximate=tanh] where attrs were chosen."""
    return name + (f"[{','.join(f'{k}={v}' for k, v in chosen.items())}]" if chosen else "")


def _generic_row(name, layout, size, dtype, pass_, repeat, rng, budget,
                 numpy: bool = True, compiled: bool = True,
                 chosen: Optional[Dict[str, object]] = None,
                 dims: Optional[Dict[str, int]] = None) -> Optional[Row]:
    import opkit
    from ..runtime.bind import bind
    from ..validate.cases import default_attrs
    from ..validate.reference import evaluate
    op = opkit.get(name)
    if pass_ == "backward" and not op.graphs.differentiable:
        return None
    attrs = dict(default_attrs(op.spec), **(chosen or {}))
    shape = _shape_for(size or 4096, layout)
    logical = dict(zip(("N", "C", "H", "W"), shape if layout != "NHWC" else
                       (shape[0], shape[3], shape[1], shape[2])))
    logical.update(dims or {})
    if layout in ("NCHW", "NHWC"):
        shape = tuple(logical[d] for d in layout)
    inputs = {}
    for i in op.spec.inputs:
        s = tuple(d if isinstance(d, int) else logical.get(d, _OTHER_DIMS.get(d, 16))
                  for d in i.shape) if i.shape else shape
        lo, hi = i.domain
        lo, hi = max(lo, -4.0), min(hi, 4.0)   # (float32 draws: a 16M case sets up fast)
        inputs[i.name] = (rng.random(s, dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)).astype(dtype)
    main = inputs[op.spec.inputs[0].name]
    shape, size = main.shape, size or main.size
    kw = dict(inputs, **attrs)
    if op.spec.layouts[0] != "ND":
        kw["layout"] = layout
    bound = bind(op.spec, {**inputs, **attrs}, layout, name)
    if pass_ == "forward":
        outs = tuple(np.empty(bound.outputs[o.name][1], dtype) for o in op.spec.outputs)
        fn = lambda: op(**kw, out=outs if len(outs) > 1 else outs[0])
        nbytes = sum(a.nbytes for a in inputs.values()) + sum(o.nbytes for o in outs)
        graph, values = op.graphs.forward, dict(bound.values)
        dys, grads = None, None
    else:
        dys = tuple(rng.standard_normal(bound.outputs[o.name][1], dtype=np.float32).astype(dtype)
                    for o in op.spec.outputs)
        extra = [(f"d{o.name}", d, o.name) for o, d in zip(op.spec.outputs, dys)]
        bound = bind(op.spec, {**inputs, **attrs}, layout, name, extra)
        takes = op.graphs.differentiable
        grads = tuple(np.empty_like(inputs[n]) if n in takes else None for n in op.spec.input_names)
        dy = dys if len(dys) > 1 else dys[0]
        fn = lambda: op.backward(dy, **kw, out=grads)
        nbytes = (sum(a.nbytes for a in inputs.values()) + sum(d.nbytes for d in dys)
                  + sum(g.nbytes for g in grads if g is not None))
        graph, values = op.graphs.backward, dict(bound.values)
    dst = np.empty_like(main)
    fns = {"opkit": fn, "copy": lambda: np.copyto(dst, main),
           "numpy": (lambda: evaluate(graph, values, bound.attrs, dtype=np.dtype(dtype))) if numpy else None}
    fns["torch"] = _torch_column(op, pass_, bound, attrs, dys, grads, layout)
    if compiled and fns["torch"] is not None:
        fns["torch.compile"] = _torch_column(op, pass_, bound, attrs, dys, grads, layout, compiled=True)
    rounds: Dict[str, List[float]] = {}
    t = timed(fns, repeat, budget=budget, rounds=rounds)
    # the copy moves one input's bytes twice (read, write); scale it to this call's traffic
    t["copy"] *= nbytes / (2 * main.nbytes)
    rounds["copy"] = [c * nbytes / (2 * main.nbytes) for c in rounds["copy"]]
    # (the rounds are kept: "vs copy" and "x torch" are medians of round-by-round ratios, so a
    # burst of load on the machine that slows both sides of one round cancels out)
    where = _size_text(size) if not dims else "[" + ",".join(map(str, shape)) + "]"
    return Row(f"{_named(name, chosen or {})} {pass_} {layout} {where}", name, pass_,
               dtype, shape, nbytes, t, rounds)


def _torch_column(op, pass_, bound, attrs, dys, grads, layout, compiled: bool = False):
    """PyTorch's computation of the same call over the same memory, or None; `compiled`: the
    same formula through torch.compile."""
    torch, _ = _torch()
    if torch is None or (dys is not None and len(dys) != 1):
        return None
    from .torch_columns import torch_pass
    from ..dsl import named
    x_arr, x_names = bound.values[op.spec.inputs[0].name]
    tensors, raw = {}, {}
    for name, (arr, names) in bound.values.items():
        if name not in op.spec.input_names:
            continue  # an output gradient
        raw[name] = torch.from_numpy(arr)
        shaped = bool(op.spec.input(name).shape) and all(n in x_names for n in names)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(
            named.expand_to(arr, names, x_names) if shaped else arr))

    def aligned(t, dims):
        order = [d for d in x_names if d in dims]
        t = t.permute(*[dims.index(d) for d in order])
        return t.reshape([t.shape[order.index(d)] if d in order else 1 for d in x_names])

    dy = torch.from_numpy(dys[0]) if dys is not None else None
    gouts = [torch.from_numpy(g) for g in grads if g is not None] if grads is not None else None
    # (written once here, so its pages are mapped before the timing, as opkit's out= are)
    out = torch.zeros_like(tensors[op.spec.inputs[0].name]) if pass_ == "forward" else None
    return torch_pass(op.name, pass_, tensors, dict(attrs, _layout=layout), dy, gouts, aligned,
                      raw, compiled, out)


# ------------------------------------------------------------------------------- reports

def machine() -> Dict[str, object]:
    from ..target import current
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    torch, _ = _torch()
    from ..config import get
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": get("num_threads"),
            "target": current().describe(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
            "opkit": __version__, "date": time.strftime("%Y-%m-%d %H:%M")}


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_rows(rows: List[Row]) -> str:
    head = ["case", "dtype", "opkit ms", "GB/s", "copy GB/s", "vs copy", "numpy ms", "x numpy",
            "torch ms", "x torch", "compile ms", "x compile"]
    table = []
    for r in rows:
        s = r.seconds
        ms = lambda who: _fmt(s.get(who) and s[who] * 1e3, ".4g")  # noqa: E731
        table.append([r.case, r.dtype, ms("opkit"), _fmt(r.gbps("opkit"), ".1f"),
                      _fmt(r.gbps("copy"), ".1f"), _fmt(r.ratio("copy"), ".2f"),
                      ms("numpy"), _fmt(r.ratio("numpy"), ".2f"), ms("torch"), _fmt(r.ratio("torch"), ".2f"),
                      ms("torch.compile"), _fmt(r.ratio("torch.compile"), ".2f")])
    widths = [max(len(str(x[i])) for x in table + [head]) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(t) for t in table])


def format_targets(results: List[TargetResult]) -> str:
    out = []
    for t in results:
        state = ("n/a (torch not installed)" if _torch()[0] is None else "n/a (no such contender here)") \
            if t.met is None else ("met" if t.met else "NOT MET")
        out.append(f"{t.case:<44} {t.check:<40} {_fmt(t.ratio, '7.2f')}x  (>= {t.minimum:.2f}x)  {state}")
    return "\n".join(out)


def plot(rows: List[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    who = ["opkit", "copy", "numpy", "torch"]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.5))
    height = 0.2
    for k, name in enumerate(who):
        vals = [r.gbps(name) or 0 for r in rows]
        ax.barh([i + k * height for i in range(len(rows))], vals, height, label=name)
    ax.set_yticks([i + 1.5 * height for i in range(len(rows))])
    ax.set_yticklabels([f"{r.case} ({r.dtype})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (bytes read + written per call / median time)")
    ax.legend(loc="lower right")
    ax.set_title("opkit bench")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time kernels against the copy bandwidth, NumPy and PyTorch")
    b.add_argument("names", nargs="*", help="operators to time (default: the performance targets)")
    b.add_argument("--all", action="store_true", help="time every registered operator")
    from ..cli import add_path_option
    add_path_option(b)
    b.add_argument("--sizes", default="16,64K,4M",
                   help="elements per input, e.g. 16,64K,16M (16M: beyond every cache)")
    b.add_argument("--dtypes", default="float32,float16", help="comma-separated dtypes")
    b.add_argument("--layouts", default="ND,NCHW,NHWC", help="layouts to try where an operator has them")
    b.add_argument("--passes", default="forward,backward")
    b.add_argument("--threads", type=int, help="kernel threads (default: all cores); torch uses the same")
    b.add_argument("--repeat", type=int, default=15, help="interleaved rounds per case (median)")
    b.add_argument("--budget", type=float, default=0.3, metavar="SECONDS",
                   help="with operator names: about this long timing each case (at least 5 rounds)")
    b.add_argument("--build-times", action="store_true", help="also time a cold and a warm `opkit build`")
    b.add_argument("--no-compile", action="store_true",
                   help="with operator names: leave out torch.compile's column (it compiles each case first)")
    b.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                   help="with operator names: set this attr where an operator has it (repeatable), "
                        "e.g. --attr approximate=tanh for gelu's tanh form")
    b.add_argument("--dims", action="append", default=[], metavar="NAME=SIZE",
                   help="with operator names: the size of a named dim (repeatable), e.g. --dims "
                        "N=4096 --dims K=4096 for a softmax over [N, K]; N, C, H and W also shape "
                        "4-d inputs (then --sizes is not used)")
    b.add_argument("--check", action="store_true",
                   help="with operator names: check every row against the elementwise targets "
                        "(vs copy >= 0.8 float32 / 0.7 float16, x torch >= 1, x torch.compile >= 1)")
    b.add_argument("--json", default="", help="write the results here (default: bench-<date>.json)")
    b.add_argument("--plot", default="", metavar="PNG", help="draw a chart (needs matplotlib)")
    b.set_defaults(func=main)


def _progress(text: str) -> None:
    """One line per case on stderr (overwritten in place on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
    else:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def main(args) -> int:
    import opkit
    if args.threads:
        opkit.configure(num_threads=args.threads)
    torch, _ = _torch()
    if torch is not None:
        from ..config import get
        torch.set_num_threads(get("num_threads"))
    rng = np.random.default_rng(0)
    info = machine()
    print(f"# {info['cpu']}, {info['cores']} cores, {info['threads']} threads; {info['target']}")
    print(f"# numpy {info['numpy']}, torch {info['torch'] or 'not installed'}, opkit {info['opkit']}")
    results: List[TargetResult] = []
    if args.names or args.all:
        names = list(args.names) + (opkit.list_ops() if args.all else [])
        notes: List[str] = []
        rows = generic_rows(list(dict.fromkeys(names)), [_parse_size(s) for s in args.sizes.split(",")],
                            args.dtypes.split(","), args.layouts.split(","), args.passes.split(","),
                            args.repeat, rng, budget=args.budget, progress=_progress, notes=notes,
                            compiled=not args.no_compile, attrs=args.attr,
                            dims=_dims_option(args.dims))
        if args.check:
            results = elementwise_targets(rows)
    else:
        rows, results = run_targets(args.repeat, rng)
    if (args.names or args.all) and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    print(format_rows(rows))
    if args.names or args.all:
        for line in notes:
            print(line)
    notes = torch_notes(rows)
    if notes:
        print()
        print("\n".join(notes))
    builds = None
    if args.build_times:
        from ..config import get
        builds = build_times(get("num_threads"))
        for label, seconds, limit in (("cold", builds[0], 90.0), ("warm", builds[1], 2.0)):
            results.append(TargetResult(f"opkit build, {label} cache", "seconds (limit)", limit / seconds, 1.0))
            print(f"opkit build, {label} cache: {seconds:.1f} s (target <= {limit:.0f} s)")
    if results:
        print()
        print(format_targets(results))
    path = args.json or f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path, "w") as fh:
        json.dump({"machine": info, "command": " ".join(sys.argv),
                   "rows": [{k: v for k, v in asdict(r).items() if k != "rounds"} for r in rows],
                   "targets": [dict(asdict(t), met=t.met) for t in results], "notes": notes,
                   "build_seconds": builds}, fh, indent=1, default=str)
    print(f"\nwrote {path}")
    if args.plot:
        try:
            plot(rows, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("opkit bench: --plot needs matplotlib (pip install 'opkit[plot]')", file=sys.stderr)
            return 1
    return 0
