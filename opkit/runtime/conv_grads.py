"""conv2d's gradients in the module's compiled code, on the generated GEMM micro-kernels
(templates/opkit_conv.h): the weight gradient for any stride, and the input gradient of a
stride-1 convolution, which is the convolution of the output gradient with the flipped,
transposed weights. None where the module cannot take a call (another GEMM backend, a stride
or padding the transposed form does not cover, an empty problem): the NumPy form runs then."""
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
CONV_GRADS = (Op.CONV2D_DX, Op.CONV2D_DW)


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
    """conv2d_dx(g, w) or conv2d_dw(x, g) by the module; None where it cannot."""
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


def _input_grad(module, ga: Array, wa: Array, s: int, p: int, params, sizes, layout: Layout,
                compute: np.dtype, threads: int) -> Optional[Array]:
    g_dims, w_dims, x_dims = params
    (n, o, oh, ow), gs = _logical(*ga, g_dims)
    wl = named.expand_to(wa[0], wa[1], w_dims)
    if wl.ndim != 4 or wl.shape[0] != o:
        return None
    _, c, kh, kw = wl.shape
    h, wd = sizes[x_dims[2]], sizes[x_dims[3]]
    # the transposed convolution of stride 1 is a convolution padded by k - 1 - p on each side
    if s != 1 or kh != kw or p > kh - 1 or (oh, ow) != (conv_size(h, kh, 1, p), conv_size(wd, kw, 1, p)):
        return None
    conv = ConvProblem(n, o, oh, ow, c, kh, kw, h, wd, 1, kh - 1 - p, int(layout is Layout.NHWC))
    if conv.empty:
        return None
    # w'[c, o, i, j] = w[o, c, kh-1-i, kw-1-j], packed [KH * KW * O, C] as a forward's weights
    pack = np.ascontiguousarray(wl[:, :, ::-1, ::-1].transpose(2, 3, 0, 1).reshape(kh * kw * o, c),
                                dtype=compute)
    nhwc = layout is Layout.NHWC
    out = np.empty((n, h, wd, c) if nhwc else (n, c, h, wd), compute)
    phys = (x_dims[0], x_dims[2], x_dims[3], x_dims[1]) if nhwc else tuple(x_dims)
    ostrides = tuple(out.strides[phys.index(d)] for d in x_dims)
    module.conv_raw(tuple(conv), ga[0], gs, _code(ga[0]), pack, out, ostrides,
                    DTYPE_CODES[dtype_name(out.dtype)], fused_threads(conv, threads, True))
    return out, phys
