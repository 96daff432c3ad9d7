"""conv2d's gradients in the module's compiled code, on the generated GEMM micro-kernels
(templates/opkit_conv.h): the weight gradient, and the input gradient as stride-1
convolutions of the output gradient with the flipped, transposed weights (one per phase of a
strided convolution). None where the module cannot take a call (another GEMM backend, an
empty problem): the NumPy form runs then."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ..abi import DTYPE_CODES, ConvProblem
from ..dsl import named
from ..dsl.library import conv_size
from ..kinds import Layout, Op
from .bind import dtype_name
from .schedule import fused_threads

Array = Tuple[np.ndarray, Tuple[str, ...]]
# conv_transpose2d is conv2d_dx with x as the output gradient: the same compiled call
CONV_GRADS = (Op.CONV2D_DX, Op.CONV2D_DW, Op.CONV_TRANSPOSE2D)


def _logical(arr: np.ndarray, names: Sequence[str], dims: Sequence[str]):
    """Sizes and byte strides of `arr` over the logical `dims` (0 where broadcast)."""
    sizes = [arr.shape[names.index(d)] if d in names else 1 for d in dims]
    strides = tuple(arr.strides[names.index(d)] if d in names and arr.shape[names.index(d)] > 1
                    else 0 for d in dims)
    return sizes, strides


def _code(arr: np.ndarray) -> Optional[int]:
    return DTYPE_CODES.get(dtype_name(arr.dtype))


def compiled_conv_grad(module, prim: Op, a: Array, b: Array, stride: int, padding: int,
                       params, sizes, layout: Layout, compute: np.dtype,
                       threads: int) -> Optional[Array]:
    """conv2d_dx(g, w), conv_transpose2d(x, w) or conv2d_dw(x, g) by the module; None where
    it cannot."""
    if getattr(module, "GEMM", "") != "opkit" or compute not in (np.float32, np.float64) \
            or _code(a[0]) is None or _code(b[0]) is None:
        return None
    if prim is Op.CONV2D_DW:
        return _weight_grad(module, a, b, stride, padding, params, sizes, layout, compute, threads)
    return _input_grad(module, a, b, stride, padding, params, sizes, layout, compute, threads)


def _weight_grad(module, xa: Array, ga: Array, s: int, p: int, params, sizes, layout: Layout,
                 compute: np.dtype, threads: int) -> Optional[Array]:
    x_dims, g_dims, w_dims = params
    (n, c, h, wd), xs = _logical(*xa, x_dims)
    (gn, o, oh, ow), gs = _logical(*ga, g_dims)
    kh, kw = sizes[w_dims[2]], sizes[w_dims[3]]
    if (oh, ow) != (conv_size(h, kh, s, p), conv_size(wd, kw, s, p)) or gn != n:
        return None  # broadcast operands: the NumPy form expands them
    conv = ConvProblem(n, c, h, wd, o, kh, kw, oh, ow, s, p, int(layout is Layout.NHWC))
    if conv.empty:
        return None
    dw = np.empty((kh * kw * c, o), compute)
    module.conv_dw(tuple(conv), xa[0], xs, _code(xa[0]), ga[0], gs, _code(ga[0]), dw,
                   fused_threads(conv, threads, True))
    return dw.reshape(kh, kw, c, o).transpose(3, 2, 0, 1), tuple(w_dims)


def _phases(size: int, k: int, s: int, p: int):
    """Per output phase r (positions r, r + s, ... of the gradient's `size`): how many
    positions, the first tap kh0 and the tap count j of its sub-kernel (taps kh0, kh0 + s, ...),
    and the gradient rows it starts at before the first (its left padding; negative: rows to
    skip)."""
    out = []
    for r in range(s):
        count = len(range(r, size, s))
        kh0 = (r + p) % s
        j = len(range(kh0, k, s))
        q = (r + p - kh0) // s
        out.append((r, count, kh0, j, j - 1 - q))
    return out


def _input_grad(module, ga: Array, wa: Array, s: int, p: int, params, sizes, layout: Layout,
                compute: np.dtype, threads: int) -> Optional[Array]:
    """The transposed convolution as s x s stride-1 convolutions, one per phase of x's rows
    and columns: phase (r, c) takes the taps that land on it, flipped and transposed, over the
    output gradient, and writes x's positions (r + s i, c + s j)."""
    g_dims, w_dims, x_dims = params
    g = named.expand_to(ga[0], ga[1], g_dims)
    wl = named.expand_to(wa[0], wa[1], w_dims)
    if g.ndim != 4 or wl.ndim != 4 or wl.shape[0] != g.shape[1]:
        return None
    n, o, oh, ow = g.shape
    _, c, kh, kw = wl.shape
    h, wd = sizes[x_dims[2]], sizes[x_dims[3]]
    if (oh, ow) != (conv_size(h, kh, s, p), conv_size(wd, kw, s, p)) or 0 in (n, c, o, h, wd):
        return None
    nhwc = layout is Layout.NHWC
    out = np.empty((n, h, wd, c) if nhwc else (n, c, h, wd), compute)
    phys = (x_dims[0], x_dims[2], x_dims[3], x_dims[1]) if nhwc else tuple(x_dims)
    dx = out.transpose(0, 3, 1, 2) if nhwc else out           # logical (N, C, H, W)
    gcode = _code(g)
    for r, rows, kh0, jh, lh in _phases(h, kh, s, p):
        for q, cols, kw0, jw, lw in _phases(wd, kw, s, p):
            part = dx[:, :, r::s, q::s]
            if rows == 0 or cols == 0:
                continue
            if jh == 0 or jw == 0:  # no tap lands here
                part[...] = 0
                continue
            src = g[:, :, max(0, -lh):, max(0, -lw):]
            ph, pw = max(lh, 0), max(lw, 0)
            if ph != pw:  # one padding for both axes: the larger one's excess padded here
                extra = abs(ph - pw)
                src = np.pad(src, ((0, 0), (0, 0), (extra if ph > pw else 0, 0),
                                   (extra if pw > ph else 0, 0)))
            pad = min(ph, pw)
            sub = wl[:, :, kh0::s, kw0::s][:, :, ::-1, ::-1]          # (O, C, jh, jw), flipped
            pack = np.ascontiguousarray(sub.transpose(2, 3, 0, 1).reshape(jh * jw * o, c),
                                        dtype=compute)
            conv = ConvProblem(n, o, src.shape[2], src.shape[3], c, jh, jw, rows, cols, 1, pad,
                               int(nhwc))
            module.conv_raw(tuple(conv), src, tuple(src.strides), gcode, pack,
                            part, tuple(part.strides), DTYPE_CODES[dtype_name(out.dtype)],
                            fused_threads(conv, threads, True))
    return out, phys
