"""The ONNX lowering of every primitive of opkit/dsl: standard operators only (opset >= 15; a
resampling along a dim the model leaves free uses DFT, opset >= 17).

Each keeps the meaning the primitive's NumPy record gives it, NaN and infinities included:
min/max propagate a NaN from either side (ONNX leaves that open), sign keeps NaN and gives +0
at -0, expm1 and log1p stay exact near 0 (ONNX has neither: Kahan's forms of them through Exp
and Log), softplus is opkit's overflow-free form.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict

import numpy as np

from ..dsl import named
from ..dsl.library import _FOURIER, resample
from .lowering import ExportError, Val, align, onnx_lowering

BOOL = 9  # TensorProto.BOOL


def _binary(name: str, onnx_op: str):
    onnx_lowering(name)(lambda em, a, b: em.op(onnx_op, a, b))


def _unary(name: str, onnx_op: str):
    onnx_lowering(name)(lambda em, a: em.op(onnx_op, a))


for _name, _op in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"),
                   ("pow", "Pow"), ("gt", "Greater"), ("ge", "GreaterOrEqual"), ("lt", "Less"),
                   ("le", "LessOrEqual"), ("eq", "Equal"), ("and", "And"), ("or", "Or")):
    _binary(_name, _op)

for _name, _op in (("neg", "Neg"), ("not", "Not"), ("exp", "Exp"), ("log", "Log"),
                   ("sqrt", "Sqrt"), ("abs", "Abs"), ("tanh", "Tanh"),
                   ("floor", "Floor"), ("ceil", "Ceil"), ("round", "Round"),
                   ("sin", "Sin"), ("cos", "Cos"), ("isnan", "IsNaN"), ("isinf", "IsInf")):
    _unary(_name, _op)


@onnx_lowering("ne")
def _ne(em, a, b):
    return em.op("Not", em.op("Equal", a, b))  # NaN != NaN holds, as in NumPy


@onnx_lowering("where")
def _where(em, c, a, b):
    return em.op("Where", c, a, b)


def _pick(em, keep_a, a, b):
    """a where `keep_a` holds or a is NaN, else b: NaN propagates from either argument."""
    return em.op("Where", em.op("Or", keep_a, em.op("IsNaN", a)), a, b)


@onnx_lowering("min")
def _min(em, a, b):
    return _pick(em, em.op("LessOrEqual", a, b), a, b)


@onnx_lowering("max")
def _max(em, a, b):
    return _pick(em, em.op("GreaterOrEqual", a, b), a, b)


@onnx_lowering("clamp")
def _clamp(em, x, lo, hi):
    return _min(em, _max(em, x, lo), hi)


@onnx_lowering("sigmoid")
def _sigmoid(em, x):
    # 1 / (1 + e ** -x), as opkit computes it: onnxruntime's float Sigmoid is an approximation
    # (relative errors of 3e-5 where the result is small)
    one = em.scalar(1.0)
    return em.op("Div", one, em.op("Add", one, em.op("Exp", em.op("Neg", x))))


@onnx_lowering("erf")
def _erf(em, x):
    if em.ctx.compute == np.float64:
        # onnxruntime has no float64 Erf: float32's, within its rounding (about 6e-8)
        return em.cast(em.op("Erf", em.cast(x, "float32")))
    return em.op("Erf", x)


@onnx_lowering("erfc")
def _erfc(em, x):
    # ONNX has no erfc: 1 - erf(x), within the absolute error of float rounding
    return em.op("Sub", em.scalar(1.0), _erf(em, x))


@onnx_lowering("sign")
def _sign(em, x):
    zero = em.scalar(0.0)
    pos = em.cast(em.op("Greater", x, zero))
    neg = em.cast(em.op("Less", x, zero))
    # NaN stays NaN; -0 gives +0 (NumPy's sign)
    return em.op("Where", em.op("IsNaN", x), x, em.op("Sub", pos, neg))


@onnx_lowering("expm1")
def _expm1(em, x):
    # Kahan: (u - 1) * (x / log(u)), u = e ** x, exact to a few ulps near 0 where e ** x - 1
    # cancels; u == 1 gives x, u - 1 == -1 gives -1, u == inf gives inf
    u = em.op("Exp", x)
    um1 = em.op("Sub", u, em.scalar(1.0))
    ratio = em.op("Mul", um1, em.op("Div", x, em.op("Log", u)))
    body = em.op("Where", em.op("Equal", um1, em.scalar(-1.0)), um1, ratio)
    body = em.op("Where", em.op("IsInf", u), u, body)
    return em.op("Where", em.op("Equal", u, em.scalar(1.0)), x, body)


@onnx_lowering("log1p")
def _log1p(em, x):
    # Kahan: log(u) * x / (u - 1), u = 1 + x; u == 1 gives x, u == inf gives inf
    u = em.op("Add", x, em.scalar(1.0))
    lu = em.op("Log", u)
    ratio = em.op("Mul", lu, em.op("Div", x, em.op("Sub", u, em.scalar(1.0))))
    body = em.op("Where", em.op("Or", em.op("IsInf", u), em.op("Equal", u, em.scalar(0.0))),
                 lu, ratio)
    return em.op("Where", em.op("Equal", u, em.scalar(1.0)), x, body)


@onnx_lowering("softplus")
def _softplus(em, x):
    # max(x, 0) + log1p(e ** -|x|): no overflow, as opkit computes it
    zero = em.scalar(0.0)
    pos = em.op("Where", em.op("Greater", x, zero), x, zero)
    return em.op("Add", pos, _log1p(em, em.op("Exp", em.op("Neg", em.op("Abs", x)))))


# ------------------------------------------------------------------------------ library

@onnx_lowering("sum")
def _sum(em, node, args, ctx) -> Val:
    (val,) = args
    keep = node.params[0]
    axes = [i for i, n in enumerate(val.names) if n not in keep]
    if not axes:
        return val
    return _reduced(em, "ReduceSum", val, axes, keep)


def _reduced(em, op: str, val: Val, axes, keep) -> Val:
    """ReduceSum / ReduceMean of val over `axes`: the dims in `keep` stay, in val's order."""
    return Val(em.op(op, val.ref, em.ints(axes), keepdims=0),
               tuple(n for n in val.names if n in keep))


def _reduced_attr_axes(em, op: str, val: Val, keep, opset: int) -> Val:
    """ReduceMax / ReduceMin / ReduceLogSumExp over the dims not in `keep` (axes an input from
    opset 18, an attribute before)."""
    axes = [i for i, n in enumerate(val.names) if n not in keep]
    if not axes:
        return val
    if opset >= 18:
        return _reduced(em, op, val, axes, keep)
    return Val(em.op(op, val.ref, axes=axes, keepdims=0), tuple(n for n in val.names if n in keep))


@onnx_lowering("amax")
def _amax(em, node, args, ctx) -> Val:
    return _reduced_attr_axes(em, "ReduceMax", args[0], node.params[0], ctx.opset)


@onnx_lowering("amin")
def _amin(em, node, args, ctx) -> Val:
    return _reduced_attr_axes(em, "ReduceMin", args[0], node.params[0], ctx.opset)


@onnx_lowering("logsumexp")
def _logsumexp(em, node, args, ctx) -> Val:
    return _reduced_attr_axes(em, "ReduceLogSumExp", args[0], node.params[0], ctx.opset)


@onnx_lowering("sum_to")
def _sum_to(em, node, args, ctx) -> Val:
    """A gradient summed over the dims its input was broadcast along, in the input's shape."""
    (val,) = args
    target = ctx.names[node.params[0]]
    shape = ctx.shapes[node.params[0]]
    ref, names = val.ref, val.names
    extra = [i for i, n in enumerate(names) if n not in target]
    if extra:
        ref = em.op("ReduceSum", ref, em.ints(extra), keepdims=0)
        names = tuple(n for n in names if n in target)
    ones = [i for i, n in enumerate(names) if shape[target.index(n)] == 1]
    if ones:
        ref = em.op("ReduceSum", ref, em.ints(ones), keepdims=1)
    return Val(em.expand(align(em, Val(ref, names), target), target, shape, names), target)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@onnx_lowering("einsum")
def _einsum(em, node, args, ctx) -> Val:
    (a, b) = args
    out = node.params[2]  # the declared dims name the contraction; the values' names place them
    letters: Dict[str, str] = {}  # dim name -> its einsum letter
    for n in a.names + b.names + tuple(out):
        if n not in letters:
            if len(letters) == len(_LETTERS):
                raise ExportError("einsum: more than 26 dims")
            letters[n] = _LETTERS[len(letters)]
    spell = lambda names: "".join(letters[n] for n in names)  # noqa: E731
    equation = f"{spell(a.names)},{spell(b.names)}->{spell(out)}"
    return Val(em.op("Einsum", a.ref, b.ref, equation=equation), tuple(out))


DFT_OPSET = 17
SHORTER = ("down", "up_T")  # the kinds that shorten a dim
WIDE = np.dtype(np.float64)  # the transforms' dtype: see _fourier_dft


@onnx_lowering("fourier")
def _fourier(em, node, args, ctx) -> Val:
    """Band-limited resampling along one dim: a product with a constant matrix where the dim's
    length is known at export, ONNX's DFT where the model leaves it free."""
    val = args[0]
    dim, kind = node.params
    what = f"fft_{kind.split('_')[0]}"
    u = int(round(ctx.constant(node.args[1], what)))
    n = 1 if dim not in val.names else val.resized.get(dim, ctx.sizes.get(dim))
    if n == 1:  # constant along dim: it stays constant; the adjoints scale it
        factor = {"up": 1.0, "down": 1.0, "up_T": float(u), "down_T": 1.0 / u}[kind]
        return val if factor == 1.0 else replace(val, ref=em.op("Mul", val.ref, em.scalar(factor)))
    if n is None:
        return _fourier_dft(em, val, dim, kind, u, ctx, what)
    return _fourier_matrix(em, val, dim, kind, u, n, ctx)


def _fourier_matrix(em, val: Val, dim: str, kind: str, u: int, n: int, ctx) -> Val:
    """The resampling as a product with a constant real matrix: the resampling of the identity
    (exact to the rounding of a sum of n products, as the FFT)."""
    length, nyquist, scale = _FOURIER[kind]
    if kind in SHORTER and n % u:
        raise ExportError(f"resampling down by {u} needs a length divisible by {u} along "
                          f"{dim}, got {n}")
    matrix = resample(np.eye(n), 0, length(n, u), nyquist, scale(u)).astype(ctx.compute)
    resized = {**val.resized, dim: length(n, u)}
    axis, last = val.names.index(dim), len(val.names) - 1
    if axis == last:
        ref = em.op("MatMul", val.ref, em.const(np.ascontiguousarray(matrix.T)))
    elif axis == last - 1:
        ref = em.op("MatMul", em.const(matrix), val.ref)
    else:
        perm = [i for i in range(len(val.names)) if i != axis] + [axis]
        moved = em.op("Transpose", val.ref, perm=perm)
        product = em.op("MatMul", moved, em.const(np.ascontiguousarray(matrix.T)))
        ref = em.op("Transpose", product, perm=[perm.index(i) for i in range(len(perm))])
    return replace(val, ref=ref, resized=resized)


def _fourier_dft(em, val: Val, dim: str, kind: str, u: int, ctx, what: str) -> Val:
    """The resampling of a free dim through ONNX's DFT, in float64 whatever the compute dtype:
    onnxruntime's float32 DFT loses up to 1e-4 at lengths other than powers of 2 (its twiddle
    angles grow with n * n); the casts cost nothing next to the transforms."""
    ratio = val.scaled.get(dim, 1)
    if kind in SHORTER and ratio % u:
        raise ExportError(f"{what} by {u} along the free {named.describe(dim)} needs a length "
                          f"divisible by {u}, which a free size does not promise: give that "
                          f"dim a size divisible by {u} (opkit export: --shape x=N,C,64,64)")
    scaled = {**val.scaled, dim: ratio // u if kind in SHORTER else ratio * u}
    if u == 1:  # every kind is the identity at factor 1
        return val
    if ctx.opset < DFT_OPSET:
        raise ExportError(f"{what} along the free {named.describe(dim)} needs ONNX's DFT, "
                          f"which opset {ctx.opset} lacks: pass opset={DFT_OPSET} or newer (opkit "
                          f"export: --opset {DFT_OPSET}), or give that dim a size "
                          "(--shape x=N,C,64,64)")
    ref = val.ref if ctx.compute == WIDE else em.cast(val.ref, WIDE)
    ref = _dft_resample(em, ref, val.names.index(dim), len(val.names), kind, u, ctx.opset)
    return replace(val, ref=ref if ctx.compute == WIDE else em.cast(ref), scaled=scaled)


def _dft_resample(em, ref, axis: int, rank: int, kind: str, u: int, opset: int):
    """opkit's resample() along `axis` of a real float64 tensor of any length: the one-sided
    spectrum (a real DFT), cut to the output's bins or left for the inverse to zero-pad, each
    bin weighted as the inverse real DFT of the output's length weighs it (and resample()'s
    Nyquist factor and scale), then that inverse's real part. The inverse is a forward DFT of
    the conjugate spectrum: onnxruntime's inverse DFT loses float64's precision at lengths
    other than powers of 2."""
    lead = rank == 1  # onnxruntime reads a 2-d signal as (batch, samples)
    if lead:
        ref, axis, rank = em.op("Unsqueeze", ref, em.ints([0])), 1, 2
    n = em.op("Shape", ref, start=axis, end=axis + 1)
    n_out = em.op("Div" if kind in SHORTER else "Mul", n, em.ints([u]))
    spectrum = _dft(em, em.op("Unsqueeze", ref, em.ints([rank])), n, axis, opset, onesided=1)
    bins = em.op("Add", em.op("Div", n_out if kind in SHORTER else n, em.ints([2])), em.ints([1]))
    if kind in SHORTER:  # the output's bins only (the inverse real DFT reads no others)
        spectrum = em.op("Slice", spectrum, em.ints([0]), bins, em.ints([axis]))
    weights = _bin_weights(em, kind, u, bins, n, n_out)
    # [bins] -> [bins, 1, ..., 2]: w on the real part, -w on the imaginary (the conjugate)
    weights = em.op("Unsqueeze", weights, em.ints(range(1, rank - axis + 1)))
    weights = em.op("Mul", weights, em.const(np.array([1.0, -1.0], WIDE)))
    signal = _dft(em, em.op("Mul", spectrum, weights), n_out, axis, opset)
    ref = em.op("Gather", signal, em.const(np.array(0, np.int64)), axis=-1)  # the real part
    return em.op("Squeeze", ref, em.ints([0])) if lead else ref


def _scalar_int(em, ref):
    return em.op("Reshape", ref, em.ints([]))


def _dft(em, ref, length, axis: int, opset: int, onesided: int = 0):
    """A forward DFT of `length` (a 1-element tensor) along `axis`: the axis is an attribute
    before opset 20, an input from then on."""
    length = _scalar_int(em, length)
    if opset >= 20:
        return em.op("DFT", ref, length, em.const(np.array(axis, np.int64)), onesided=onesided)
    return em.op("DFT", ref, length, axis=axis, onesided=onesided)


def _bin_weights(em, kind: str, u: int, bins, n, n_out):
    """Each kept bin's weight in the inverse real DFT of length n_out, with resample()'s
    Nyquist factor and its scale, over n_out (the inverse's normalisation):

    - bin 0 counts once, every other bin twice (for itself and its conjugate);
    - upsampling halves an even input's Nyquist bin (0.5, split between +n/2 and -n/2): once;
    - downsampling doubles an even output's Nyquist bin (2, the two halves summed), where the
      inverse counts it once: twice, as the others;
    - the adjoint of upsampling is an inverse real DFT as it is: an even output's Nyquist bin
      counts once; the adjoint of downsampling pads, so no bin is a Nyquist bin."""
    _, _, scale = _FOURIER[kind]
    k = em.op("Range", em.const(np.array(0, np.int64)), _scalar_int(em, bins),
              em.const(np.array(1, np.int64)))
    once = em.op("Equal", k, em.const(np.array(0, np.int64)))
    nyquist_of = {"up": n, "up_T": n_out}.get(kind)
    if nyquist_of is not None:
        twice_k = em.op("Mul", k, em.const(np.array(2, np.int64)))
        once = em.op("Or", once, em.op("Equal", twice_k, nyquist_of))
    unit = em.op("Div", em.const(np.array(scale(u), WIDE)), em.cast(n_out, WIDE))
    return em.op("Where", once, unit, em.op("Mul", unit, em.const(np.array(2.0, WIDE))))


def _mean_axes(val: Val, keep):
    return [i for i, n in enumerate(val.names) if n not in keep]


@onnx_lowering("mean")
def _mean(em, node, args, ctx) -> Val:
    (val,) = args
    keep = node.params[0]
    axes = _mean_axes(val, keep)
    if not axes:  # constant along every dim it averages: the mean is itself
        return val
    return _reduced(em, "ReduceMean", val, axes, keep)


@onnx_lowering("share")
def _share(em, node, args, ctx) -> Val:
    """A mean's gradient: divided by the number of elements averaged (0 where there were none)."""
    (val,) = args
    sizes = [ctx.sizes.get(d) for d in node.params[0]]
    if all(s is not None for s in sizes):
        count = int(np.prod(sizes))
        ref = em.op("Div", val.ref, em.scalar(count)) if count else \
            em.op("Mul", val.ref, em.scalar(0.0))
        return replace(val, ref=ref)
    count = em.cast(em.op("ReduceProd", em.op("Concat", *[em.dim_size(d) for d in node.params[0]],
                                                axis=0), keepdims=0))
    zero = em.scalar(0.0)
    ref = em.op("Where", em.op("Equal", count, zero), em.op("Mul", val.ref, zero),
                em.op("Div", val.ref, count))
    return replace(val, ref=ref)


def _logical(em, val: Val, dims, ctx):
    """`val` as a 4-d tensor with exactly the axes `dims` (broadcast where it lacks one)."""
    dims = tuple(dims)
    ref = align(em, val, dims)
    present = tuple(n for n in dims if n in val.names)
    if len(present) < len(dims) and present == dims[len(dims) - len(present):]:
        ref = em.op("Unsqueeze", ref, em.ints(range(len(dims) - len(present))))  # leading ones
    shape = tuple(ctx.sizes.get(d) for d in dims)
    return em.expand(ref, tuple(dims), shape, val.names)


def _conv_ints(node, ctx, what: str):
    stride = ctx.constant(node.args[2], f"{what}'s stride")
    padding = ctx.constant(node.args[3], f"{what}'s padding")
    return int(stride), int(padding)


@onnx_lowering("conv2d")
def _conv2d(em, node, args, ctx) -> Val:
    x_dims, w_dims, out_dims = node.params
    s, p = _conv_ints(node, ctx, "conv2d")
    x, w = _logical(em, args[0], x_dims, ctx), _logical(em, args[1], w_dims, ctx)
    return Val(em.op("Conv", x, w, strides=[s, s], pads=[p, p, p, p]), tuple(out_dims))


@onnx_lowering("conv_transpose2d")
@onnx_lowering("conv2d_dx")
def _conv2d_dx(em, node, args, ctx) -> Val:
    """The transposed convolution, padded at the end to x's size (rows no window reached; none
    for conv_transpose2d, whose size is the transposed convolution's own)."""
    g_dims, w_dims, x_dims = node.params
    s, p = _conv_ints(node, ctx, "conv2d's gradient")
    g, w = _logical(em, args[0], g_dims, ctx), _logical(em, args[1], w_dims, ctx)
    extra = []
    for out_d, k_d, x_d in zip(g_dims[2:], w_dims[2:], x_dims[2:]):
        n, k, h = (ctx.size(d, "conv2d's gradient with respect to x") for d in (out_d, k_d, x_d))
        extra.append(h - (s * (n - 1) + k - 2 * p))
    return Val(em.op("ConvTranspose", g, w, strides=[s, s], pads=[p, p, p, p],
                     output_padding=extra), tuple(x_dims))


@onnx_lowering("conv2d_dw")
def _conv2d_dw(em, node, args, ctx) -> Val:
    """The correlation of x with dy as a convolution over the batch: x as (C, N, H, W), dy as
    (O, N, OH, OW) dilated by the stride; the result (C, O, ...) cut to the kernel's size."""
    x_dims, g_dims, w_dims = node.params
    s, p = _conv_ints(node, ctx, "conv2d's gradient")
    x, g = _logical(em, args[0], x_dims, ctx), _logical(em, args[1], g_dims, ctx)
    x = em.op("Transpose", x, perm=[1, 0, 2, 3])
    g = em.op("Transpose", g, perm=[1, 0, 2, 3])
    out = em.op("Conv", x, g, dilations=[s, s], pads=[p, p, p, p])
    kh, kw = (ctx.size(d, "conv2d's gradient with respect to w") for d in w_dims[2:])
    out = em.op("Slice", out, em.ints([0, 0]), em.ints([kh, kw]), em.ints([2, 3]))
    return Val(em.op("Transpose", out, perm=[1, 0, 2, 3]), tuple(w_dims))
