"""Primitives that are not elementwise: they run as library calls between fused kernels.

Each has a NumPy implementation over named arrays (run by the runtime on the compute dtype, and
by the reference in float64), a dims rule and a derivative rule next to it. Arguments listed in
`scalar_args` are attrs or constants (a resampling factor), not arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from . import named
from .ir import FORMATTERS, Node

Value = Tuple[np.ndarray, Tuple[str, ...]]


@dataclass(frozen=True)
class LibraryPrimitive:
    name: str
    run: Callable      # (ctx, args: [(ndarray, names)], params) -> (ndarray, names)
    vjp: Optional[Callable]
    tbe: str           # how the listing shows the call
    doc: str = ""
    scalar_args: Tuple[int, ...] = ()
    format: Optional[Callable] = None  # (argument texts, params) -> text, for printed graphs


LIBRARY: Dict[str, LibraryPrimitive] = {}


def register(p: LibraryPrimitive) -> LibraryPrimitive:
    LIBRARY[p.name] = p
    if p.format is not None:
        FORMATTERS[p.name] = p.format
    return p


class Context:
    """What a library call may look at besides its arguments: the bound inputs of the call."""

    def __init__(self, inputs: Dict[str, Value], accumulate=None):
        self.inputs = inputs
        self.accumulate = accumulate  # dtype for sums (float64 in the reference)


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
    return Node("sum_to", (value,), (input_node.name,), "float", input_node.dims)


register(LibraryPrimitive("sum_to", _run_sum_to, None, "vreduce_sum",
                          "sum a gradient over the dims its input was broadcast along",
                          format=lambda a, p: f"sum_to({a[0]}, {p[0]})"))


# ------------------------------------------------------------------------------ sum over dims

def _run_sum(ctx: Context, args, params):
    (arr, names), = args
    keep = params[0]
    axes = tuple(i for i, n in enumerate(names) if n not in keep)
    if not axes:
        return arr, names
    return arr.sum(axis=axes, dtype=ctx.accumulate), tuple(n for n in names if n in keep)


def reduce_to(value: Node, dims: Tuple[str, ...]) -> Node:
    """Sum `value` over every dim that is not in `dims` (dims known at call time)."""
    if value.dims == dims:
        return value
    return Node("sum", (value,), (tuple(dims),), "float", tuple(dims))


def _sum_vjp(g, out, v):
    return (g,)  # broadcasting by name spreads g back over the summed dims


register(LibraryPrimitive("sum", _run_sum, _sum_vjp, "vreduce_sum",
                          "sum over the dims not kept (named dims)",
                          format=lambda a, p: f"sum({a[0]}, keep=[{', '.join(p[0])}])"))


def dsl_sum(v: Node, dim: str) -> Node:
    if v.dims is None:
        raise ValueError("sum(v, D) needs a value with named dims (inputs with shape: [...] or a "
                         "4-d layout)")
    if dim not in v.dims:
        raise ValueError(f"sum: {dim!r} is not a dim of its argument (dims {', '.join(v.dims)})")
    return reduce_to(v, tuple(d for d in v.dims if d != dim))


# ------------------------------------------------------------------------------ einsum / matmul

def _letters(*name_lists):
    table: Dict[str, str] = {}
    for names in name_lists:
        for n in names:
            if n not in table:
                table[n] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(table)]
    return table


def _run_einsum(ctx: Context, args, params):
    (a, an), (b, bn) = args
    out_dims = params[2]  # the declared dims name the contraction; the arrays' own names place them
    table = _letters(an, bn, out_dims)
    sub = f"{''.join(table[n] for n in an)},{''.join(table[n] for n in bn)}->" \
          f"{''.join(table[n] for n in out_dims)}"
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
    return Node("einsum", (a, b), (a.dims, b.dims, tuple(out_dims)), "float", tuple(out_dims))


def _einsum_vjp(g, out, a, b):
    # d/da sum(g * einsum(a, b)) = einsum(g, b) onto a's dims (dims only in g or b are summed)
    return (einsum(g, b, a.dims), einsum(a, g, b.dims))


register(LibraryPrimitive("einsum", _run_einsum, _einsum_vjp, "vmatmul",
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

def resample(x: np.ndarray, axis: int, n_out: int, nyquist: float, scale: float) -> np.ndarray:
    """Band-limited resampling of a real signal along `axis` in the DFT domain.

    Longer output: the spectrum is zero-padded (the input's Nyquist bin, for an even length,
    times `nyquist`: 0.5 splits it between +N/2 and -N/2). Shorter output: the spectrum is cut
    (the output's Nyquist bin takes `nyquist` times the real part of that bin: 2 sums the two
    halves). Then the inverse DFT, times `scale`."""
    n_in = x.shape[axis]
    if n_in == n_out or x.size == 0:
        shape = list(x.shape)
        shape[axis] = n_out
        return (x * scale).reshape(shape) if n_in == n_out else np.zeros(shape, x.dtype)
    spec = np.fft.rfft(x, axis=axis)
    short = min(n_in, n_out)
    shape = list(spec.shape)
    shape[axis] = n_out // 2 + 1
    out = np.zeros(shape, dtype=spec.dtype)
    keep = [slice(None)] * x.ndim
    keep[axis] = slice(0, short // 2 + 1)
    out[tuple(keep)] = spec[tuple(keep)]
    if short % 2 == 0:
        nyq = [slice(None)] * x.ndim
        nyq[axis] = short // 2
        nyq = tuple(nyq)
        out[nyq] = (spec[nyq] if n_out > n_in else spec[nyq].real) * nyquist
    result = np.fft.irfft(out, n=n_out, axis=axis)
    return (result * scale).astype(x.dtype, copy=False)


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
    return Node("fourier", (v, factor), (dim, kind), "float", v.dims)


def _fourier_vjp(g, out, v, factor):
    dim, kind = out.params
    return (fourier(g, dim, factor, _TRANSPOSE[kind]), None)


register(LibraryPrimitive("fourier", _run_fourier, _fourier_vjp, "vfft",
                          "band-limited resampling along one dim in the DFT domain",
                          scalar_args=(1,), format=lambda a, p: f"fft_{p[1]}({a[0]}, {p[0]}, {a[1]})"))


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
