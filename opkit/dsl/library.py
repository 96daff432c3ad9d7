"""Primitives that are not elementwise: they run as library calls between fused kernels.

Each has a NumPy implementation over named arrays (run by the runtime on the compute dtype, and
by the reference in float64), a dims rule and a derivative rule next to it. Arguments listed in
`scalar_args` are attrs or constants (a resampling factor), not arrays.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import named
from .ir import FORMATTERS, Node
from .primitives import ONE, ZERO, apply
from ..kinds import Op, ValueKind

Value = Tuple[np.ndarray, Tuple[str, ...]]


@dataclass(frozen=True)
class LibraryPrimitive:
    name: Op
    run: Callable      # (ctx, args: [(ndarray, names)], params) -> (ndarray, names)
    vjp: Optional[Callable]
    doc: str = ""
    scalar_args: Tuple[int, ...] = ()
    format: Optional[Callable] = None  # (argument texts, params) -> text, for printed graphs
    # (node, sizes, value of a scalar argument) -> sizes of the dims the call creates (conv2d's
    # OH, OW): the runtime sizes outputs with it, and it refuses impossible calls (ValueError)
    sizes: Optional[Callable] = None
    # (params) -> the dims the call mixes values along, for a call worth running slice by slice
    # along the others (a DFT resampling: its intermediates outgrow the caches, slices keep them
    # in L2); the runtime then runs a plan of such calls and elementwise kernels in slices
    mixes: Optional[Callable] = None

    def __post_init__(self):
        object.__setattr__(self, "name", Op(self.name))  # a call opkit's IR names


LIBRARY: Dict[Op, LibraryPrimitive] = {}
# the reductions over named dims a declaration can write (validation allows for what their
# results' conditioning does to the computations after them)
REDUCTIONS = (Op.SUM, Op.MEAN, Op.AMAX, Op.AMIN, Op.LOGSUMEXP)


def register(p: LibraryPrimitive) -> LibraryPrimitive:
    LIBRARY[p.name] = p
    if p.format is not None:
        FORMATTERS[p.name] = p.format
    return p


class Context:
    """What a library call may look at besides its arguments: the bound inputs of the call and
    the size of every dim (those of the inputs and those the calls create, see derive_sizes)."""

    def __init__(self, inputs: Dict[str, Value], accumulate=None,
                 sizes: Optional[Dict[str, int]] = None):
        self.inputs = inputs
        self.accumulate = accumulate  # dtype for sums (float64 in the reference)
        self.sizes = dict(sizes) if sizes is not None else input_sizes(inputs)

    def size(self, dim: str) -> int:
        return self.sizes[dim]


def input_sizes(inputs: Dict[str, Value]) -> Dict[str, int]:
    """The sizes of the named dims of some arrays (a size-1 axis may be a broadcast one)."""
    sizes: Dict[str, int] = {}
    for arr, names in inputs.values():
        for n, s in zip(names, np.shape(arr)):
            if sizes.get(n, 1) == 1:
                sizes[n] = s
    return sizes


def derive_sizes(nodes, sizes: Dict[str, int], value_of: Callable[[Node], float]) -> Dict[str, int]:
    """`sizes` plus the sizes of the dims that library calls among `nodes` (in topological order)
    create; `value_of` gives the number of an attr or constant node. ValueError for a call that
    cannot be made with these sizes (a kernel larger than its padded input)."""
    out = dict(sizes)
    for n in nodes:
        rule = LIBRARY[n.op].sizes if n.op in LIBRARY else None
        if rule is not None:
            out.update(rule(n, out, value_of))
    return out


def _scalar(value: Value) -> float:
    return float(np.asarray(value[0]))


# ------------------------------------------------------------------------------ sum_to

def _run_sum_to(ctx: Context, args, params):
    (arr, names), = args
    target, target_names = ctx.inputs[params[0]]
    out = named.sum_to(arr, names, target_names, target.shape, dtype=ctx.accumulate)
    return out, target_names


def sum_to(value: Node, input_node: Node) -> Node:
    """The gradient `value` reduced over the dims its input was broadcast along."""
    return Node(Op.SUM_TO, (value,), (input_node.name,), ValueKind.FLOAT, input_node.dims)


register(LibraryPrimitive(Op.SUM_TO, _run_sum_to, None,
                          "sum a gradient over the dims its input was broadcast along",
                          format=lambda a, p: f"sum_to({a[0]}, {p[0]})"))


# ------------------------------------------------------------------------------ sum over dims

def _run_sum(ctx: Context, args, params):
    (arr, names), = args
    keep = params[0]
    axes = tuple(i for i, n in enumerate(names) if n not in keep)
    if not axes:
        return arr, names
    return named.total(arr, axes, ctx.accumulate), tuple(n for n in names if n in keep)


def _filled(arr: np.ndarray, axes, value: float) -> np.ndarray:
    """A reduction of `arr` over `axes` when one of them is empty: `value` everywhere."""
    return np.full([s for i, s in enumerate(arr.shape) if i not in axes], value, arr.dtype)


def _reduced(v: Node, dim: str, what: str) -> Tuple[str, ...]:
    if v.dims is None:
        raise ValueError(f"{what}(v, D) needs a value with named dims (inputs with shape: [...] or "
                         "a 4-d layout)")
    if dim not in v.dims:
        also = " nor a value in scope" if what in ("max", "min") else ""
        raise ValueError(f"{what}: {dim!r} is not a dim of its argument{also} (its dims: "
                         f"{', '.join(v.dims)})")
    return tuple(d for d in v.dims if d != dim)


def reduce_to(value: Node, dims: Tuple[str, ...]) -> Node:
    """Sum `value` over every dim that is not in `dims` (dims known at call time)."""
    if value.dims == dims:
        return value
    return Node(Op.SUM, (value,), (tuple(dims),), ValueKind.FLOAT, tuple(dims))


def _sum_vjp(g, out, v):
    return (g,)  # broadcasting by name spreads g back over the summed dims


register(LibraryPrimitive(Op.SUM, _run_sum, _sum_vjp,
                          "sum over the dims not kept (named dims)",
                          format=lambda a, p: f"sum({a[0]}, keep=[{', '.join(p[0])}])"))


def dsl_sum(v: Node, dim: str) -> Node:
    return reduce_to(v, _reduced(v, dim, "sum"))


# ------------------------------------------------------------------------------ mean over dims

def _run_mean(ctx: Context, args, params):
    (arr, names), = args
    keep = params[0]
    axes = tuple(i for i, n in enumerate(names) if n not in keep)
    # a dim the array lacks (or holds once, broadcast) is constant along it: its mean is itself
    if axes and any(arr.shape[i] == 0 for i in axes):  # the mean of nothing is NaN
        arr = _filled(arr, axes, np.nan)
    elif axes:
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in a kernel
            arr = arr.mean(axis=axes, dtype=ctx.accumulate or arr.dtype)
    return arr, tuple(n for n in names if n in keep)


def mean_over(v: Node, keep: Tuple[str, ...]) -> Node:
    if v.op == Op.MEAN:  # mean(mean(v, N), H): one mean over both dims
        v = v.args[0]
    return Node(Op.MEAN, (v,), (tuple(keep),), ValueKind.FLOAT, tuple(keep))


def _mean_vjp(g, out, v):
    removed = tuple(d for d in v.dims if d not in out.params[0])
    return (Node(Op.SHARE, (g,), (removed,), ValueKind.FLOAT, g.dims),)


register(LibraryPrimitive(Op.MEAN, _run_mean, _mean_vjp,
                          "the mean over the dims not kept (named dims)",
                          format=lambda a, p: f"mean({a[0]}, keep=[{', '.join(p[0])}])"))


def _run_share(ctx: Context, args, params):
    (arr, names), = args
    count = 1
    for d in params[0]:
        count *= ctx.size(d)
    # an empty mean has no gradient to share: 0, not 0 / 0
    return arr / count if count else np.zeros_like(arr), names


def _share_vjp(g, out, v):
    return (Node(Op.SHARE, (g,), out.params, ValueKind.FLOAT, g.dims),)


register(LibraryPrimitive(Op.SHARE, _run_share, _share_vjp,
                          "a mean's gradient: divided by the number of elements it averaged",
                          format=lambda a, p: f"share({a[0]}, [{', '.join(p[0])}])"))


def dsl_mean(v: Node, dim: str) -> Node:
    return mean_over(v, _reduced(v, dim, "mean"))


# ------------------------------------------------------------------------------ max / min over dims
# (the runtime first offers these and logsumexp to the module: runtime/reductions.py)

_EXTREMES = {Op.AMAX: (np.max, -np.inf, "max"), Op.AMIN: (np.min, np.inf, "min")}


def _run_extreme(ctx: Context, args, params, prim: Op):
    (arr, names), = args
    keep = params[0]
    axes = tuple(i for i, n in enumerate(names) if n not in keep)
    reduce, identity, _ = _EXTREMES[prim]
    if axes and any(arr.shape[i] == 0 for i in axes):  # over nothing: the identity, as a sum's 0
        arr = _filled(arr, axes, identity)
    elif axes:
        arr = reduce(arr, axis=axes)  # NaN propagates
    return arr, tuple(n for n in names if n in keep)


def _extreme_vjp(g, out, v):
    """PyTorch's amax / amin: the gradient shared evenly by the elements equal to the result
    (g / count * hit: a NaN result, which no element equals, gives NaN, as PyTorch's)."""
    hit = apply(Op.WHERE, apply(Op.EQ, v, out), ONE, ZERO)
    return (apply(Op.MUL, apply(Op.DIV, g, reduce_to(hit, out.dims)), hit),)


def extreme_over(prim: Op, v: Node, keep: Tuple[str, ...]) -> Node:
    if v.op == prim:  # amax(amax(v, H), W): one reduction over both dims
        v = v.args[0]
    return Node(prim, (v,), (tuple(keep),), ValueKind.FLOAT, tuple(keep))


for _prim, (_, _identity, _word) in _EXTREMES.items():
    register(LibraryPrimitive(
        _prim, functools.partial(_run_extreme, prim=_prim), _extreme_vjp,
        f"the {_word}imum over the dims not kept (named dims); NaN propagates; {_identity} over "
        "nothing", format=lambda a, p, _w=_word: f"{_w}({a[0]}, keep=[{', '.join(p[0])}])"))


def dsl_amax(v: Node, dim: str) -> Node:
    return extreme_over(Op.AMAX, v, _reduced(v, dim, "max"))


def dsl_amin(v: Node, dim: str) -> Node:
    return extreme_over(Op.AMIN, v, _reduced(v, dim, "min"))


# ------------------------------------------------------------------------------ logsumexp

def _run_logsumexp(ctx: Context, args, params):
    """log(sum(exp(v))) over the dims not kept, shifted by the max as PyTorch's logsumexp (an
    infinite max shifts by 0), so that no exp overflows; -inf over nothing."""
    (arr, names), = args
    keep = params[0]
    axes = tuple(i for i, n in enumerate(names) if n not in keep)
    kept = tuple(n for n in names if n in keep)
    if not axes:
        return arr, names
    if any(arr.shape[i] == 0 for i in axes):
        return _filled(arr, axes, -np.inf), kept
    top = np.max(arr, axis=axes, keepdims=True)
    top = np.where(np.isinf(top), 0, top).astype(arr.dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = np.exp(arr - top).sum(axis=axes, keepdims=True, dtype=ctx.accumulate or arr.dtype)
        out = np.log(total) + top
    return out.reshape([s for i, s in enumerate(arr.shape) if i not in axes]).astype(arr.dtype), kept


def _logsumexp_vjp(g, out, v):
    return (apply(Op.MUL, g, apply(Op.EXP, apply(Op.SUB, v, out))),)  # g times softmax(v)


register(LibraryPrimitive(Op.LOGSUMEXP, _run_logsumexp, _logsumexp_vjp,
                          "log(sum(exp(v))) over the dims not kept, without overflow",
                          format=lambda a, p: f"logsumexp({a[0]}, keep=[{', '.join(p[0])}])"))


def dsl_logsumexp(v: Node, dim: str) -> Node:
    keep = _reduced(v, dim, "logsumexp")
    return Node(Op.LOGSUMEXP, (v,), (keep,), ValueKind.FLOAT, keep)


# ------------------------------------------------------------------------------ einsum / matmul

def _letters(*name_lists: Tuple[str, ...]) -> Dict[str, str]:
    table: Dict[str, str] = {}
    for names in name_lists:
        for n in names:
            if n not in table:
                table[n] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(table)]
    return table


@functools.lru_cache(maxsize=512)
def _subscripts(an, bn, out_dims) -> str:
    table = _letters(an, bn, out_dims)
    return f"{''.join(table[n] for n in an)},{''.join(table[n] for n in bn)}->" \
           f"{''.join(table[n] for n in out_dims)}"


def _run_einsum(ctx: Context, args, params):
    (a, an), (b, bn) = args
    out_dims = params[2]  # the declared dims name the contraction; the arrays' own names place them
    sub = _subscripts(tuple(an), tuple(bn), tuple(out_dims))
    # small products stay out of BLAS: its worker threads keep spinning after a call and would
    # compete with the kernels that follow for the same cores
    work = 1
    for n, size in {**dict(zip(an, a.shape)), **dict(zip(bn, b.shape))}.items():
        work *= size
    out = np.einsum(sub, a, b, optimize=work > (1 << 22))
    if ctx.accumulate is not None:
        out = out.astype(ctx.accumulate, copy=False)
    return out, tuple(out_dims)


def einsum(a: Node, b: Node, out_dims: Tuple[str, ...]) -> Node:
    return Node(Op.EINSUM, (a, b), (a.dims, b.dims, tuple(out_dims)), ValueKind.FLOAT, tuple(out_dims))


def _einsum_vjp(g, out, a, b):
    # d/da sum(g * einsum(a, b)) = einsum(g, b) onto a's dims (dims only in g or b are summed)
    return (einsum(g, b, a.dims), einsum(a, g, b.dims))


register(LibraryPrimitive(Op.EINSUM, _run_einsum, _einsum_vjp,
                          "a product of two named-dim arrays summed over the dims the result lacks",
                          format=lambda a, p: f"einsum({a[0]}[{', '.join(p[0])}], "
                                              f"{a[1]}[{', '.join(p[1])}] -> [{', '.join(p[2])}])"))


def matmul(a: Node, b: Node) -> Node:
    """a[..., K] @ b[K, ...]: the last dim of a meets the first dim of b; shared others stay."""
    if a.dims is None or b.dims is None:
        raise ValueError("matmul needs operands with named dims: declare the inputs with "
                         "shape: [...] (for example z: shape [N, K] and w: shape [K, C])")
    if not a.dims or not b.dims or a.dims[-1] != b.dims[0]:
        raise ValueError(f"matmul: the last dim of the first operand ({a.dims[-1] if a.dims else '-'}) "
                         f"must be the first dim of the second ({b.dims[0] if b.dims else '-'})")
    k = a.dims[-1]
    out = tuple(d for d in a.dims if d != k) + tuple(d for d in b.dims if d != k and d not in a.dims)
    return einsum(a, b, out)


# ------------------------------------------------------------------------------ DFT resampling

def _fft():
    """SciPy's FFT on opkit's threads when it is installed (the same pocketfft as NumPy's, which
    runs one thread; each 1-d transform is computed alike, so results do not depend on the
    thread count), else NumPy's."""
    try:
        import scipy.fft
    except ImportError:
        return np.fft, {}
    from ..config import get
    return scipy.fft, {"workers": get("num_threads")}


def resample(x: np.ndarray, axis: int, n_out: int, nyquist: float, scale: float) -> np.ndarray:
    """Band-limited resampling of a real signal along `axis` in the DFT domain.

    Longer output: the spectrum is zero-padded (the input's Nyquist bin, for an even length,
    times `nyquist`: 0.5 splits it between +N/2 and -N/2). Shorter output: the spectrum is cut
    (the output's Nyquist bin takes `nyquist` times the real part of that bin: 2 sums the two
    halves). Then the inverse DFT, times `scale`.

    Both happen in place or inside the transforms: the Nyquist bin is scaled where the forward
    transform left it, the inverse transform pads or cuts the spectrum itself, and `scale` rides
    on the transforms' normalisation where it is theirs (`scale` = n_out / n_in, upsampling and
    downsampling, is 1/n_in on the forward transform), so no pass over memory is spent on them."""
    n_in = x.shape[axis]
    if n_in == n_out or x.size == 0:
        shape = list(x.shape)
        shape[axis] = n_out
        return (x * scale).reshape(shape) if n_in == n_out else np.zeros(shape, x.dtype)
    fft, kw = _fft()
    forward = math.isclose(scale * n_in, n_out, rel_tol=1e-12)
    norm = "forward" if forward else "backward"
    rest = 1.0 if forward else scale
    spec = fft.rfft(x, axis=axis, norm=norm, **kw)
    short = min(n_in, n_out)
    if short % 2 == 0 and nyquist != 1.0:
        at: List[Union[slice, int]] = [slice(None)] * x.ndim
        at[axis] = short // 2
        nyq = tuple(at)
        spec[nyq] = (spec[nyq] if n_out > n_in else spec[nyq].real) * nyquist
    result = fft.irfft(spec, n=n_out, axis=axis, norm=norm, **kw)
    if rest != 1.0:
        result *= rest
    return result.astype(x.dtype, copy=False)


# kind -> (length factor, Nyquist factor, scale as a function of up); see resample()
_FOURIER = {
    "up": (lambda n, u: n * u, 0.5, lambda u: float(u)),
    "down": (lambda n, u: n // u, 2.0, lambda u: 1.0 / u),
    "up_T": (lambda n, u: n // u, 1.0, lambda u: 1.0),     # the adjoint of "up"
    "down_T": (lambda n, u: n * u, 1.0, lambda u: 1.0),    # the adjoint of "down"
}
_TRANSPOSE = {"up": "up_T", "down": "down_T", "up_T": "up", "down_T": "down"}


def _run_fourier(ctx: Context, args, params):
    (arr, names), factor = args
    dim, kind = params
    u = int(round(_scalar(factor)))
    if dim not in names or arr.shape[names.index(dim)] == 1:
        # constant along `dim` (broadcast, or a signal of length 1): resampling a constant keeps
        # it constant, and the adjoints scale it by the ratio of the lengths
        factor = {"up": 1.0, "down": 1.0, "up_T": float(u), "down_T": 1.0 / u}[kind]
        return np.asarray(arr * np.asarray(factor, arr.dtype)), names
    axis = names.index(dim)
    length, nyq, scale = _FOURIER[kind]
    if kind in ("down", "up_T") and arr.shape[axis] % u:
        raise ValueError(f"resampling down by {u} needs a length divisible by {u} along {dim}, "
                         f"got {arr.shape[axis]}")
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    with np.errstate(invalid="ignore"):  # a NaN or inf input spreads over the whole signal
        return resample(arr, axis, length(arr.shape[axis], u), nyq, scale(u)), names


def fourier(v: Node, dim: str, factor: Node, kind: str) -> Node:
    return Node(Op.FOURIER, (v, factor), (dim, kind), ValueKind.FLOAT, v.dims)


def _fourier_vjp(g, out, v, factor):
    dim, kind = out.params
    return (fourier(g, dim, factor, _TRANSPOSE[kind]), None)


register(LibraryPrimitive(Op.FOURIER, _run_fourier, _fourier_vjp,
                          "band-limited resampling along one dim in the DFT domain",
                          scalar_args=(1,), format=lambda a, p: f"fft_{p[1]}({a[0]}, {p[0]}, {a[1]})",
                          mixes=lambda p: (p[0],)))


def _fourier_builder(kind: str):
    def build(v: Node, dim: str, factor: Node) -> Node:
        if v.dims is None:
            raise ValueError(f"fft_{kind}(v, D, factor) needs a value with named dims (a 4-d "
                             "layout names N, C, H, W)")
        if dim not in v.dims:
            raise ValueError(f"fft_{kind}: {dim!r} is not a dim of its argument (dims "
                             f"{', '.join(v.dims)})")
        if factor.is_const and (factor.value < 1 or factor.value != int(factor.value)):
            raise ValueError(f"fft_{kind}: the factor must be a whole number >= 1, got {factor.value!r}")
        return fourier(v, dim, factor, kind)
    return build


fft_up = _fourier_builder("up")
fft_down = _fourier_builder("down")


# ------------------------------------------------------------------------------ conv2d
#
# x has the logical dims (N, C, H, W) (an input with an NCHW / NHWC layout, whatever its memory
# order), w the dims (O, C, KH, KW) in PyTorch's order; the result has the dims (N, O, OH, OW),
# with OH = (H + 2 * padding - KH) // stride + 1. Its gradients are a transposed convolution
# (conv2d_dx) and a correlation of x with the output gradient (conv2d_dw).

def conv_size(n: int, k: int, stride: int, padding: int) -> int:
    return (n + 2 * padding - k) // stride + 1


def conv_ints(stride, padding) -> Tuple[int, int]:
    """stride and padding as the whole numbers they must be (ValueError otherwise)."""
    s, p = float(np.asarray(stride)), float(np.asarray(padding))
    if not (s.is_integer() and s >= 1):
        raise ValueError(f"conv2d: stride must be a whole number >= 1, got {s:g}")
    if not (p.is_integer() and p >= 0):
        raise ValueError(f"conv2d: padding must be a whole number >= 0, got {p:g}")
    return int(s), int(p)


def _windows(x: np.ndarray, kh: int, kw: int, stride: int, padding: int, oh: int, ow: int):
    """The (N, C, OH, OW, KH, KW) view of x's padded receptive fields (no copy but the padding)."""
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return win[:, :, ::stride, ::stride][:, :, :oh, :ow]


# images convolved in one GEMM: as many as keep their receptive-field matrix under this many
# bytes (one GEMM a batch instead of one a tiny image; the matrix stays a bounded temporary)
IM2COL_BYTES = 32 << 20


def _im2col(images: np.ndarray, kh: int, kw: int, stride: int, padding: int, oh: int, ow: int,
            dtype) -> np.ndarray:
    """Images (B, C, H, W): their receptive fields as a (C * KH * KW, B * OH * OW) matrix."""
    b, c = images.shape[:2]
    cols = _windows(images, kh, kw, stride, padding, oh, ow)    # B, C, OH, OW, KH, KW
    return cols.transpose(1, 4, 5, 0, 2, 3).reshape(c * kh * kw, b * oh * ow).astype(dtype, copy=False)


def _batches(n: int, c: int, kh: int, kw: int, oh: int, ow: int, itemsize: int):
    """Slices of the N images, each small enough for one receptive-field matrix."""
    per = max(1, IM2COL_BYTES // max(1, c * kh * kw * oh * ow * itemsize))
    return [slice(i, min(n, i + per)) for i in range(0, n, per)]


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride: int, padding: int, dtype=None) -> np.ndarray:
    """y[n, o, i, j] = sum over c, p, q of x[n, c, i*s - pad + p, j*s - pad + q] * w[o, c, p, q],
    x (N, C, H, W) and w (O, C, KH, KW): NumPy, im2col and one product per batch of images."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = conv_size(h, kh, stride, padding), conv_size(wd, kw, stride, padding)
    dtype = np.result_type(x, w) if dtype is None else dtype
    out = np.empty((n, o, oh, ow), dtype=dtype)
    wmat = w.reshape(o, -1).astype(dtype, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN or inf input spreads, as it should
        for part in _batches(n, c, kh, kw, oh, ow, np.dtype(dtype).itemsize):
            y = wmat @ _im2col(x[part], kh, kw, stride, padding, oh, ow, dtype)   # O, B*OH*OW
            out[part] = y.reshape(o, -1, oh, ow).transpose(1, 0, 2, 3)
    return out


def conv2d_dx_ref(g: np.ndarray, w: np.ndarray, stride: int, padding: int, h: int, wd: int,
                  dtype=None) -> np.ndarray:
    """The gradient with respect to x of conv2d: a transposed convolution of g (N, O, OH, OW)
    with w, onto x's (N, C, H, W); input rows no window reaches get 0."""
    n, o, oh, ow = g.shape
    _, c, kh, kw = w.shape
    dtype = np.result_type(g, w) if dtype is None else dtype
    padded = np.zeros((n, c, h + 2 * padding + stride, wd + 2 * padding + stride), dtype=dtype)
    # cols[n, c, p, q, i, j] = sum over o of w[o, c, p, q] * g[n, o, i, j]
    cols = np.tensordot(w.astype(dtype, copy=False), g.astype(dtype, copy=False), axes=([0], [1]))
    cols = cols.transpose(3, 0, 1, 2, 4, 5)
    for p in range(kh):
        for q in range(kw):
            padded[:, :, p:p + stride * oh:stride, q:q + stride * ow:stride] += cols[:, :, p, q]
    return padded[:, :, padding:padding + h, padding:padding + wd]


def conv2d_dw_ref(x: np.ndarray, g: np.ndarray, stride: int, padding: int, kh: int, kw: int,
                  dtype=None) -> np.ndarray:
    """The gradient with respect to w of conv2d: the correlation of x with g, (O, C, KH, KW),
    summed batch by batch of images (g's rows times the images' receptive fields)."""
    n, c, h, wd = x.shape
    _, o, oh, ow = g.shape
    dtype = np.result_type(x, g) if dtype is None else dtype
    out = np.zeros((o, c * kh * kw), dtype=dtype)
    for part in _batches(n, c, kh, kw, oh, ow, np.dtype(dtype).itemsize):
        cols = _im2col(x[part], kh, kw, stride, padding, oh, ow, dtype)          # CKK, B*OH*OW
        gmat = g[part].astype(dtype, copy=False).transpose(1, 0, 2, 3).reshape(o, -1)
        out += gmat @ cols.T
    return out.reshape(o, c, kh, kw)


def _logical(value: Value, dims: Tuple[str, ...]) -> np.ndarray:
    arr, names = value
    return named.expand_to(arr, names, dims)


def _conv_dtype(ctx: Context, *arrays) -> np.dtype:
    return np.dtype(ctx.accumulate) if ctx.accumulate is not None else np.result_type(*arrays)


def _run_conv2d(ctx: Context, args, params):
    xv, wv, stride, padding = args
    x_dims, w_dims, out_dims = params
    x, w = _logical(xv, x_dims), _logical(wv, w_dims)
    s, p = conv_ints(stride[0], padding[0])
    return conv2d_ref(x, w, s, p, _conv_dtype(ctx, x, w)), out_dims


def _run_conv2d_dx(ctx: Context, args, params):
    gv, wv, stride, padding = args
    g_dims, w_dims, x_dims = params
    g, w = _logical(gv, g_dims), _logical(wv, w_dims)
    s, p = conv_ints(stride[0], padding[0])
    out = conv2d_dx_ref(g, w, s, p, ctx.size(x_dims[2]), ctx.size(x_dims[3]), _conv_dtype(ctx, g, w))
    return out, x_dims


def _run_conv2d_dw(ctx: Context, args, params):
    xv, gv, stride, padding = args
    x_dims, g_dims, w_dims = params
    x, g = _logical(xv, x_dims), _logical(gv, g_dims)
    s, p = conv_ints(stride[0], padding[0])
    out = conv2d_dw_ref(x, g, s, p, ctx.size(w_dims[2]), ctx.size(w_dims[3]), _conv_dtype(ctx, x, g))
    return out, w_dims


def _conv2d_vjp(g, out, x, w, stride, padding):
    x_dims, w_dims, out_dims = out.params
    dx = Node(Op.CONV2D_DX, (g, w, stride, padding), (out_dims, w_dims, x_dims), ValueKind.FLOAT, x_dims)
    dw = Node(Op.CONV2D_DW, (x, g, stride, padding), (x_dims, out_dims, w_dims), ValueKind.FLOAT, w_dims)
    return (dx, dw, None, None)


def _conv2d_dx_vjp(g, out, gy, w, stride, padding):
    # linear in each argument: the adjoint of a transposed convolution is the convolution
    g_dims, w_dims, x_dims = out.params
    dg = Node(Op.CONV2D, (g, w, stride, padding), (x_dims, w_dims, g_dims), ValueKind.FLOAT, g_dims)
    dw = Node(Op.CONV2D_DW, (g, gy, stride, padding), (x_dims, g_dims, w_dims), ValueKind.FLOAT, w_dims)
    return (dg, dw, None, None)


def _conv2d_dw_vjp(g, out, x, gy, stride, padding):
    x_dims, g_dims, w_dims = out.params
    dx = Node(Op.CONV2D_DX, (gy, g, stride, padding), (g_dims, w_dims, x_dims), ValueKind.FLOAT, x_dims)
    dg = Node(Op.CONV2D, (x, g, stride, padding), (x_dims, w_dims, g_dims), ValueKind.FLOAT, g_dims)
    return (dx, dg, None, None)


def _spatial_sizes(node: Node, sizes: Dict[str, int], value_of, size_of, refuse) -> Dict[str, int]:
    """The sizes of a (transposed) convolution's output rows and columns: size_of(n, k, s, p)
    from the input's and the kernel's; refuse(d, k, n, kn, s, p, size) words the ValueError for
    an empty one."""
    x_dims, w_dims, out_dims = node.params
    s, p = conv_ints(value_of(node.args[2]), value_of(node.args[3]))
    out = {}
    for axis, (d, k) in enumerate(((x_dims[2], w_dims[2]), (x_dims[3], w_dims[3]))):
        if d not in sizes or k not in sizes:
            continue
        size = size_of(sizes[d], sizes[k], s, p)
        if size < 1:
            raise ValueError(refuse(d, k, sizes[d], sizes[k], s, p, size))
        out[out_dims[2 + axis]] = size
    return out


def _conv_sizes(node: Node, sizes: Dict[str, int], value_of) -> Dict[str, int]:
    return _spatial_sizes(node, sizes, value_of, conv_size, lambda d, k, n, kn, s, p, size: (
        f"conv2d: the kernel is larger than the padded input along {d}: {d} = {n} with padding "
        f"{p} on each side, {k} = {kn}"))


def _conv_format(what: str):
    return lambda a, p: f"{what}({a[0]}, {a[1]}, stride={a[2]}, padding={a[3]})"


register(LibraryPrimitive(Op.CONV2D, _run_conv2d, _conv2d_vjp,
                          "2-d convolution (cross-correlation) of x[N, C, H, W] with w[O, C, KH, KW]",
                          scalar_args=(2, 3), format=_conv_format("conv2d"), sizes=_conv_sizes))
register(LibraryPrimitive(Op.CONV2D_DX, _run_conv2d_dx, _conv2d_dx_vjp,
                          "conv2d's gradient with respect to x: a transposed convolution",
                          scalar_args=(2, 3), format=_conv_format("conv2d_dx")))
register(LibraryPrimitive(Op.CONV2D_DW, _run_conv2d_dw, _conv2d_dw_vjp,
                          "conv2d's gradient with respect to w: a correlation of x with dy",
                          scalar_args=(2, 3), format=_conv_format("conv2d_dw")))


# conv_transpose2d(x, w, stride, padding): PyTorch's transposed convolution, x [N, C, H, W], w
# [C, O, KH, KW] (ConvTranspose2d's order), the result [N, O, TH, TW] with
# TH = (H - 1) * stride - 2 * padding + KH: conv2d's gradient with respect to its input, with x
# as that gradient and w as the convolution's weights; its derivatives are conv2d_dx's (the
# convolution of dy, and the correlation of dy with x).

def transposed_size(n: int, k: int, stride: int, padding: int) -> int:
    return (n - 1) * stride - 2 * padding + k


def _transposed_sizes(node: Node, sizes: Dict[str, int], value_of) -> Dict[str, int]:
    return _spatial_sizes(node, sizes, value_of, transposed_size, lambda d, k, n, kn, s, p, size: (
        f"conv_transpose2d: the padding removes the whole output along {d}: ({d} - 1) * stride "
        f"+ {k} - 2 * padding = {size} with {d} = {n}, {k} = {kn}, stride {s}, padding {p}"))


# conv2d_dx under its own name: the same run and derivatives, but its output dims are new ones
# the call creates (their sizes by _transposed_sizes)
register(LibraryPrimitive(Op.CONV_TRANSPOSE2D, _run_conv2d_dx, _conv2d_dx_vjp,
                          "2-d transposed convolution of x[N, C, H, W] with w[C, O, KH, KW]",
                          scalar_args=(2, 3), format=_conv_format("conv_transpose2d"),
                          sizes=_transposed_sizes))


def _whole(value: Node, what: str, low: int) -> None:
    if value.is_const and not (float(value.value).is_integer() and value.value >= low):
        raise ValueError(f"conv2d: {what} must be a whole number >= {low}, got {value.value:g}")


def _conv_node(op: Op, x: Node, w: Node, stride: Node, padding: Node, order: str, c: int,
               prefix: str) -> Node:
    """A convolution's node: x [N, C, H, W], the weights in `order` with x's channel dim at
    `c` (the other one the result's), the result [N, O, <prefix>H, <prefix>W]."""
    what = op.value
    if x.dims is None or len(x.dims) != 4:
        raise ValueError(f"{what} needs x with the 4 dims N, C, H, W: declare it with "
                         "layouts: [NCHW, NHWC]")
    if w.dims is None or len(w.dims) != 4:
        raise ValueError(f"{what} needs weights declared with shape: {order}")
    if w.dims[c] != x.dims[1]:
        want = [x.dims[1] if i == c else d for i, d in enumerate(("O", "O", "KH", "KW"))]
        raise ValueError(f"{what}: the {('first', 'second')[c]} dim of the weights ({w.dims[c]}) "
                         f"must be the channel dim of x ({x.dims[1]}): declare the weights with "
                         f"shape: [{', '.join(want)}]")
    _whole(stride, "stride", 1)
    _whole(padding, "padding", 0)
    o = w.dims[1 - c]
    out = (x.dims[0], o, prefix + x.dims[2], prefix + x.dims[3])
    clash = [d for d in out[1:] if out.count(d) > 1 or (d in x.dims + w.dims and d != o)]
    if clash or o in (x.dims[0], x.dims[2], x.dims[3]):
        raise ValueError(f"{what}: the result's dims would be [{', '.join(out)}], which repeats or "
                         "reuses a dim name of x or the weights; rename the weights' dims")
    return Node(op, (x, w, stride, padding), (x.dims, w.dims, out), ValueKind.FLOAT, out)


def conv2d(x: Node, w: Node, stride: Node, padding: Node) -> Node:
    """conv2d(x, w, stride, padding) of the expression language."""
    return _conv_node(Op.CONV2D, x, w, stride, padding, "[O, C, KH, KW] (PyTorch's order)", 1, "O")


def conv_transpose2d(x: Node, w: Node, stride: Node, padding: Node) -> Node:
    """conv_transpose2d(x, w, stride, padding) of the expression language."""
    return _conv_node(Op.CONV_TRANSPOSE2D, x, w, stride, padding,
                      "[C, O, KH, KW] (ConvTranspose2d's order)", 0, "T")
