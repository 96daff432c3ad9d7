"""The activation catalogue in examples/activations, each operator against (a) its definition
written here in NumPy (the ONNX formulas; gradients as PyTorch's backward formulas), in float16,
float32 and float64, at its kinks, at large magnitudes and at +-inf and NaN; (b) torch.autograd
where PyTorch is installed, to the last few units at the kinks; (c) opkit's own validation,
finite differences included. The operators are made from their files without registering
them."""
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import numpy as np
import pytest

from opkit.builder import toolchain
from opkit.registry import make_op
from opkit.validate import validate_op

from conftest import REPO, declaration, write_op

ACTIVATIONS = REPO / "examples" / "activations"
DTYPES = [np.float16, np.float32, np.float64]
# the project's standards: |actual - expected| <= tol + tol * |expected|
TOL = {np.float16: 1e-3, np.float32: 1e-4, np.float64: 1e-12}
ATOL64 = 1e-14  # float64: an ulp of an intermediate near 1 (1 + tanh(...) in GELU's tanh form)
INF, NAN = math.inf, math.nan


@functools.lru_cache(maxsize=None)
def op(name):
    return make_op(ACTIVATIONS / f"{name}.yaml")


def dname(dtype) -> str:
    return np.dtype(dtype).name


def close(actual, expected, dtype, what):
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol,
                               atol=ATOL64 if dtype is np.float64 else tol, err_msg=what)


# ---------------------------------------------------------------- the NumPy definitions

def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erfc = np.vectorize(math.erfc, otypes=[np.float64])  # the standard library's, not SciPy's
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
GELU_K = math.sqrt(2 / math.pi)


def _mish_grad(x):
    t, s = np.tanh(np.log1p(np.exp(x))), _sigmoid(x)
    return t + x * s * (1 - t * t)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))


def _gelu_tanh_grad(x):
    t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x)


@dataclass
class Act:
    """One operator with one set of attrs: its forward and its derivative in float64 NumPy,
    and the inputs where its derivative jumps."""

    name: str
    forward: Callable
    grad: Callable
    attrs: Dict[str, object] = field(default_factory=dict)
    kinks: List[float] = field(default_factory=list)
    defaults: Dict[str, float] = field(default_factory=dict)  # what the call leaves out

    @property
    def id(self) -> str:
        return self.name + "".join(f"-{k}={v}" for k, v in self.attrs.items())


ACTS = [
    Act("leakyrelu", lambda x, alpha: np.where(x > 0, x, alpha * x),
        lambda x, alpha: np.where(x > 0, 1.0, alpha), {"alpha": 0.125}, [0.0]),
    Act("elu", lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)),
        lambda x, alpha: np.where(x > 0, 1.0, alpha * np.exp(x)), {"alpha": 0.75}, [0.0]),
    Act("selu", lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
        lambda x: SELU_SCALE * np.where(x > 0, 1.0, SELU_ALPHA * np.exp(x)), {}, [0.0]),
    # the max/min definition's gradient at 0: its two ties share it, 1/2 + 1/2 * exp(0) = 1
    Act("celu", lambda x, alpha: np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha)),
        lambda x, alpha: np.where(x > 0, 1.0, np.exp(x / alpha)), {"alpha": 0.5}, [0.0]),
    # kinks at -2 and 2 in every dtype; the gradient is 0 at both, as torch.nn.Hardsigmoid's
    Act("hardsigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1),
        lambda x, alpha, beta: np.where((alpha * x + beta <= 0) | (alpha * x + beta >= 1), 0.0,
                                        alpha), {"alpha": 0.25, "beta": 0.5}, [-2.0, 2.0]),
    Act("hardsigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1),
        lambda x, alpha, beta: np.where((alpha * x + beta <= 0) | (alpha * x + beta >= 1), 0.0,
                                        alpha), {}, [-2.5, 2.5],
        defaults={"alpha": 0.2, "beta": 0.5}),
    # PyTorch's hardswish_backward: 0 at -3 and 1 at 3 (the outer pieces)
    Act("hardswish", lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
        lambda x: np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0)), {}, [-3.0, 0.0, 3.0]),
    Act("softplus", lambda x, beta, threshold: np.where(
            x * beta > threshold, x, np.logaddexp(0, x * beta) / beta),
        lambda x, beta, threshold: np.where(x * beta > threshold, 1.0, _sigmoid(x * beta)),
        {"beta": 2.0, "threshold": 3.0}, [1.5]),
    Act("softplus", lambda x, beta, threshold: np.where(
            x * beta > threshold, x, np.logaddexp(0, x * beta) / beta),
        lambda x, beta, threshold: np.where(x * beta > threshold, 1.0, _sigmoid(x * beta)),
        {"beta": 0.5, "threshold": 1e6}, []),
    # the quotient rule: NaN at +-inf, as x / (1 + |x|) itself
    Act("softsign", lambda x: x / (1 + np.abs(x)),
        lambda x: ((1 + np.abs(x)) - x * np.sign(x)) / (1 + np.abs(x)) ** 2, {}, [0.0]),
    # ONNX: x where x > alpha, else 0; NaN stays NaN here (as torch.nn.Threshold(alpha, 0))
    Act("thresholdedrelu", lambda x, alpha: np.where(x <= alpha, 0.0, x),
        lambda x, alpha: np.where(x <= alpha, 0.0, 1.0), {"alpha": 1.5}, [1.5]),
    Act("relu", lambda x: np.maximum(x, 0), lambda x: np.where(x <= 0, 0.0, 1.0), {}, [0.0]),
    Act("relu6", lambda x: np.clip(x, 0, 6), lambda x: np.where((x <= 0) | (x >= 6), 0.0, 1.0),
        {}, [0.0, 6.0]),
    Act("sigmoid", _sigmoid, lambda x: _sigmoid(x) * (1 - _sigmoid(x)), {}, []),
    Act("tanh", np.tanh, lambda x: 1 - np.tanh(x) ** 2, {}, []),
    Act("mish", lambda x: x * np.tanh(np.log1p(np.exp(x))), _mish_grad, {}, []),
    Act("gelu", lambda x: 0.5 * x * _erfc(-x / math.sqrt(2)),
        lambda x: 0.5 * _erfc(-x / math.sqrt(2)) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
        {}, []),
    Act("gelu", _gelu_tanh, _gelu_tanh_grad, {"approximate": "tanh"}, []),
    # ONNX: x - bias where x > lambd, x + bias where x < -lambd, else 0; NaN stays NaN
    Act("shrink", lambda x, bias, lambd: np.where((x >= -lambd) & (x <= lambd), 0.0,
                                                  np.where(x > lambd, x - bias, x + bias)),
        lambda x, bias, lambd: np.where((x >= -lambd) & (x <= lambd), 0.0, 1.0),
        {"bias": 0.25, "lambd": 0.5}, [-0.5, 0.5]),
    Act("silu", lambda x: x / (1 + np.exp(-x)),
        lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))), {}, []),
    Act("logsigmoid", lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))),
        lambda x: 1 / (1 + np.exp(x)), {}, []),
    Act("hardtanh", lambda x, min_val, max_val: np.clip(x, min_val, max_val),
        lambda x, min_val, max_val: np.where((x <= min_val) | (x >= max_val), 0.0, 1.0),
        {"min_val": -0.5, "max_val": 2.0}, [-0.5, 2.0]),
    Act("threshold", lambda x, threshold, value: np.where(x <= threshold, value, x),
        lambda x, threshold, value: np.where(x <= threshold, 0.0, 1.0),
        {"threshold": 1.0, "value": -2.0}, [1.0]),
]


def points(dtype, kinks=()) -> np.ndarray:
    """Random values, the kinks and their neighbours, large magnitudes (where exp overflows
    float32 and float64), +-inf and NaN."""
    special = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 6.0, -6.0, 20.0, -20.0, 88.0, -88.0,
               710.0, -710.0, 1000.0, -1000.0, 1e4, -1e4, INF, -INF, NAN]
    near = [k + d for k in kinks for d in (-1e-3, 1e-3)]
    random = np.random.default_rng(0).uniform(-8, 8, 300)
    x = np.concatenate([random, kinks, near, special]).astype(dtype)
    assert np.array_equal(x[300:300 + len(kinks)], kinks)  # the kinks are representable
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("act", ACTS, ids=lambda a: a.id)
def test_forward_and_gradient_match_numpy(act, dtype):
    o = op(act.name)
    x = points(dtype, act.kinks)
    x64 = x.astype(np.float64)
    numeric = {k: v for k, v in {**act.defaults, **act.attrs}.items() if not isinstance(v, str)}
    with np.errstate(all="ignore"):
        want_y = act.forward(x64, **numeric)
        dy = np.random.default_rng(1).uniform(0.5, 2.0, x.shape).astype(dtype)
        want_dx = dy.astype(np.float64) * act.grad(x64, **numeric)
    y = o(x, **act.attrs)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, want_y, dtype, f"{act.id} forward {dname(dtype)}")
    dx, = o.backward(dy, x, **act.attrs)
    assert dx.dtype == dtype
    close(dx, want_dx, dtype, f"{act.id} gradient {dname(dtype)}")


# ---------------------------------------------------------------- PReLU: a slope that broadcasts

def reduce_to(full, shape):
    """Sum a full-size gradient back to a broadcast operand's shape (NumPy's rules, reversed)."""
    out = full.sum(axis=tuple(range(full.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(axis=axes, keepdims=True) if axes else out


def prelu_inputs(dtype, slope_shape):
    rng = np.random.default_rng(2)
    x = rng.uniform(-4, 4, (2, 3, 4, 5))
    x[0, :, 0, :4] = [0.0, -0.0, 1e4, -1e4]
    x[1, 0, 1, :3] = [INF, -INF, NAN]       # one channel's slope gradient is NaN
    slope = rng.uniform(0.05, 0.5, slope_shape)
    dy = rng.uniform(0.5, 2.0, x.shape)
    return x.astype(dtype), slope.astype(dtype), dy.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (), (1,)], ids=str)
def test_prelu_slope_broadcasts(slope_shape, dtype):
    """A slope per channel of NCHW data, shape (C, 1, 1), or one slope; its gradient comes back
    in its own shape."""
    x, slope, dy = prelu_inputs(dtype, slope_shape)
    x64, s64, dy64 = (a.astype(np.float64) for a in (x, slope, dy))
    o = op("prelu")
    close(o(x, slope), np.where(x64 > 0, x64, s64 * x64), dtype, "prelu forward")
    dx, dslope = o.backward(dy, x, slope)
    close(dx, dy64 * np.where(x64 > 0, 1.0, s64), dtype, "prelu dx")
    assert dslope.shape == slope.shape and dslope.dtype == dtype
    with np.errstate(invalid="ignore"):
        want = reduce_to(dy64 * np.where(x64 > 0, 0.0, x64), slope.shape)
    # float16: the sum is formed in float32 and rounded once, as the reference sum is rounded
    close(dslope, want, dtype, "prelu dslope")


# ---------------------------------------------------------------- Clip: optional tensor bounds

CLIP_CASES = {  # name: (min, max); None = not given; shapes broadcast to x's (4, 6)
    "none": (None, None),
    "min": (np.float64(-1.0), None),
    "max": (None, np.array([2.0])),
    "both": (np.array([[-1.0], [0.0], [-2.0], [0.5]]), np.array(1.5)),
    "crossed": (np.array([-1.0, 3.0, -1.0, 3.0, 0.0, 2.0]), np.array(2.0)),  # min > max
}


def clip_x(dtype):
    x = np.random.default_rng(3).uniform(-3, 3, (4, 6))
    x[0] = [-1.0, 1.5, 2.0, 0.0, 0.5, -2.0]      # on the bounds
    x[1, :4] = [INF, -INF, NAN, 1e4]
    return x.astype(dtype)


def clip_reference(x, lo, hi, dy):
    """ONNX Clip's result with the dtype's limits for missing bounds; torch.clamp's gradients."""
    lo = np.finfo(x.dtype).min if lo is None else lo
    hi = np.finfo(x.dtype).max if hi is None else hi
    x64, lo64, hi64, dy64 = (np.asarray(a, np.float64) for a in (x, lo, hi, dy))
    y = np.minimum(np.maximum(x64, lo64), hi64)
    dx = np.where((x64 >= lo64) & (x64 <= hi64), dy64, 0.0)
    dlo = np.where((x64 < lo64) & (lo64 < hi64), dy64, 0.0)
    dhi = np.where((x64 > hi64) | (lo64 > hi64), dy64, 0.0)
    return y, dx, reduce_to(dlo, np.shape(lo)), reduce_to(dhi, np.shape(hi))


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", list(CLIP_CASES))
def test_clip_optional_bounds(case, dtype):
    lo, hi = (None if b is None else np.asarray(b, dtype) for b in CLIP_CASES[case])
    x = clip_x(dtype)
    dy = np.random.default_rng(4).uniform(0.5, 2.0, x.shape).astype(dtype)
    o = op("clip")
    y = o(x, lo, hi)
    want_y, want_dx, want_dlo, want_dhi = clip_reference(x, lo, hi, dy)
    close(y, want_y, dtype, "clip forward")
    assert y.dtype == dtype
    dx, dlo, dhi = o.backward(dy, x, lo, hi)
    close(dx, want_dx, dtype, "clip dx")
    for got, want, bound in ((dlo, want_dlo, lo), (dhi, want_dhi, hi)):
        if bound is None:
            assert got is None
        else:
            assert got.shape == bound.shape
            close(got, want, dtype, "clip bound gradient")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_clip_without_bounds_stops_at_the_dtype_limits(dtype):
    """ONNX's defaults are the lowest and highest finite values: 65504 in float16."""
    big = np.finfo(dtype).max
    y = op("clip")(np.array([INF, -INF, NAN, 1.0], dtype))
    np.testing.assert_array_equal(y, np.array([big, -big, NAN, 1.0], dtype))
    y = op("clip")(np.array([INF, -INF], dtype), max=np.array(2.0, dtype))
    np.testing.assert_array_equal(y, np.array([2.0, -big], dtype))


# ---------------------------------------------------------------- the catalogue as documented

def test_every_activation_is_documented_and_tested():
    files = sorted(p.stem for p in ACTIVATIONS.glob("*.yaml"))
    table = re.findall(r"^\| [^|]+ \| \[`(\w+)\.yaml`\]", (ACTIVATIONS / "README.md").read_text(),
                       re.MULTILINE)
    assert sorted(table) == files
    assert {a.name for a in ACTS} == set(files) - {"prelu", "clip"}  # tested on their own
    assert sorted({t.name for t in TORCH}) == files


@pytest.mark.parametrize("name", sorted(p.stem for p in ACTIVATIONS.glob("*.yaml")))
def test_validates(name):
    """opkit's own validation: every dtype, layout and stride pattern against the reference,
    finite differences in float64, for each variant (GELU's approximate, Clip's bounds)."""
    report = validate_op(op(name))
    assert report.ok, report.format()


# ---------------------------------------------------------------- what the primitives get right

def test_sign_of_infinities(tmp_path):
    """sign(+-inf) is +-1, as NumPy's: Shrink's x - bias * sign(x) stays infinite at +-inf."""
    o = make_op(write_op(tmp_path, declaration("sign(x)")))
    x = np.array([INF, -INF, NAN, 0.0, -0.0, 2.5, -1e-300])
    for dtype in (np.float32, np.float64):
        np.testing.assert_array_equal(o(x.astype(dtype)), np.sign(x.astype(dtype)))


@pytest.mark.skipif("fma" not in toolchain("native").target.features,
                    reason="the native target has no fused multiply-add to contract into")
def test_multiply_add_rounds_as_numpy_does(tmp_path):
    """a * x + b rounds twice, as NumPy's: contracted into one fused multiply-add, 1/6 * -3 + 0.5
    would be 2.8e-17 instead of 0, and a kink decided on the sum would flip (HardSigmoid with
    alpha = 1/6 at x = -3: gradient alpha instead of torch's 0)."""
    o = make_op(write_op(tmp_path, declaration("a * x + b", inputs=("x", "a", "b"))))
    x, a, b = np.array([-3.0]), np.array([1 / 6]), np.array([0.5])
    np.testing.assert_array_equal(o(x, a, b), a * x + b)


# ---------------------------------------------------------------- against torch.autograd

@dataclass
class Torch:
    name: str
    attrs: Dict[str, object]
    fn: Callable                  # (torch.nn.functional, tensor) -> tensor
    kinks: List[float]
    loose64: bool = False         # torch's float64 result has float32's precision

    @property
    def id(self) -> str:
        return self.name + "".join(f"-{k}={v}" for k, v in self.attrs.items())


TORCH = [
    Torch("leakyrelu", {"alpha": 0.125}, lambda F, t: F.leaky_relu(t, 0.125), [0.0]),
    Torch("prelu", {}, None, [0.0]),  # test_prelu_matches_torch
    Torch("elu", {"alpha": 0.75}, lambda F, t: F.elu(t, 0.75), [0.0]),
    Torch("selu", {}, lambda F, t: F.selu(t), [0.0]),
    Torch("celu", {"alpha": 0.5}, lambda F, t: F.celu(t, 0.5), [0.0]),
    # hardsigmoid_backward multiplies by 1.0f / 6.0f, a float32 sixth, in float64 too
    Torch("hardsigmoid", {"alpha": 1 / 6}, lambda F, t: F.hardsigmoid(t), [-3.0, 3.0],
          loose64=True),
    Torch("hardswish", {}, lambda F, t: F.hardswish(t), [-3.0, 0.0, 3.0]),
    Torch("softplus", {"beta": 2.0, "threshold": 3.0}, lambda F, t: F.softplus(t, 2.0, 3.0), [1.5]),
    Torch("softplus", {}, lambda F, t: F.softplus(t), [20.0]),
    Torch("softsign", {}, lambda F, t: F.softsign(t), [0.0]),
    Torch("thresholdedrelu", {"alpha": 1.5}, lambda F, t: F.threshold(t, 1.5, 0.0), [1.5]),
    Torch("relu", {}, lambda F, t: F.relu(t), [0.0]),
    Torch("relu6", {}, lambda F, t: F.relu6(t), [0.0, 6.0]),
    Torch("sigmoid", {}, lambda F, t: F.sigmoid(t), [0.0]),
    Torch("tanh", {}, lambda F, t: F.tanh(t), [0.0]),
    Torch("mish", {}, lambda F, t: F.mish(t), [0.0]),
    Torch("gelu", {}, lambda F, t: F.gelu(t), [0.0]),
    Torch("gelu", {"approximate": "tanh"}, lambda F, t: F.gelu(t, approximate="tanh"), [0.0]),
    Torch("shrink", {"bias": 0.0, "lambd": 0.5}, lambda F, t: F.hardshrink(t, 0.5), [-0.5, 0.5]),
    Torch("shrink", {"bias": 0.5, "lambd": 0.5}, lambda F, t: F.softshrink(t, 0.5), [-0.5, 0.5]),
    Torch("clip", {}, None, [0.0]),  # test_clip_matches_torch_clamp
    Torch("silu", {}, lambda F, t: F.silu(t), [0.0]),
    Torch("logsigmoid", {}, lambda F, t: F.logsigmoid(t), [0.0]),
    Torch("hardtanh", {"min_val": -0.5, "max_val": 2.0}, lambda F, t: F.hardtanh(t, -0.5, 2.0),
          [-0.5, 2.0]),
    Torch("threshold", {"threshold": 1.0, "value": -2.0}, lambda F, t: F.threshold(t, 1.0, -2.0),
          [1.0]),
]


def torch_grad(torch, fn, *arrays, dy=None):
    """fn's value and the gradients of its arguments, by torch.autograd."""
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*ts)
    y.backward(torch.ones_like(y) if dy is None else torch.tensor(dy))
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


def torch_alone(torch, fn, x, where):
    """fn's value and gradient at each selected element of x on its own: PyTorch's scalar loop.
    Its vectorized loops can differ there (with AVX-512, gelu gives NaN at +inf, not inf)."""
    y, dx = np.full_like(x, np.nan), np.full_like(x, np.nan)
    for i in np.flatnonzero(where):
        (y[i],), ((dx[i],),) = torch_grad(torch, fn, x[i:i + 1])
    return y, dx


def same_at(actual, expected, where, what):
    """Agreement at the elements `where` selects, up to the rounding of the formulas (a few
    units in the last place; a zero must be a zero), NaN with NaN: a branch or tie decided
    differently is far outside it."""
    eps = np.finfo(np.asarray(actual).dtype).eps
    np.testing.assert_allclose(np.asarray(actual)[where], np.asarray(expected)[where],
                               rtol=4 * eps, atol=0, err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("ref", [t for t in TORCH if t.fn is not None], ids=lambda t: t.id)
def test_matches_torch(ref, dtype):
    """The same value and gradient as torch.autograd, at the kinks and at +-inf to the last few
    units (each point on its own, through PyTorch's scalar loop), elsewhere within the dtype's
    standard. Not the gradient at NaN: PyTorch's own differs between its vectorized loops and
    their scalar tails (hardtanh, elu, ...)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    x = points(dtype, ref.kinks)
    want_y, (want_dx,) = torch_grad(torch, lambda t: ref.fn(F, t), x)
    o = op(ref.name)
    y = o(x, **ref.attrs)
    dx, = o.backward(np.ones_like(x), x, **ref.attrs)
    exact = np.isin(x, ref.kinks) | np.isinf(x)
    alone_y, alone_dx = torch_alone(torch, lambda t: ref.fn(F, t), x, exact | np.isnan(x))
    same_at(y, alone_y, exact | np.isnan(x), f"{ref.id} forward at the kinks, +-inf and NaN")
    same_at(dx, alone_dx, exact, f"{ref.id} gradient at the kinks and +-inf")
    rest = ~(exact | np.isnan(x))
    # elsewhere torch rounds float16 intermediates of composite functions (softsign, ...)
    tol = np.float32 if ref.loose64 and dtype is np.float64 else dtype
    close(y[rest], want_y[rest].astype(np.float64), tol, f"{ref.id} forward")
    close(dx[rest], want_dx[rest].astype(np.float64), tol, f"{ref.id} gradient")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "single"])
def test_prelu_matches_torch(per_channel, dtype):
    """torch.nn.PReLU(num_parameters=C) on NCHW is the slope reshaped to (C, 1, 1)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    x, slope, _ = prelu_inputs(dtype, (3,) if per_channel else (1,))
    x[1, 0, 1, 2] = 0.0  # no NaN: it makes a whole channel's slope gradient NaN
    want_y, (want_dx, want_dw) = torch_grad(torch, F.prelu, x, slope)
    shaped = slope.reshape(3, 1, 1) if per_channel else slope
    o = op("prelu")
    y = o(x, shaped)
    dx, dslope = o.backward(np.ones_like(x), x, shaped)
    same_at(y, want_y, np.isin(x, [0.0]) | ~np.isfinite(x), "prelu forward at 0 and +-inf")
    same_at(dx, want_dx, np.isin(x, [0.0]) | ~np.isfinite(x), "prelu gradient at 0 and +-inf")
    close(y, want_y.astype(np.float64), dtype, "prelu forward")
    close(dx, want_dx.astype(np.float64), dtype, "prelu dx")
    close(dslope.reshape(slope.shape), want_dw.astype(np.float64), dtype, "prelu dslope")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", ["min", "max", "both", "crossed"])
def test_clip_matches_torch_clamp(case, dtype):
    """torch.clamp with tensor bounds, gradients to x and to each bound; finite x only, as
    torch.clamp keeps +-inf where a bound is missing while ONNX stops at the dtype's limits."""
    torch = pytest.importorskip("torch")
    x = clip_x(dtype)
    x[1, :2] = [0.0, -0.0]
    lo, hi = (None if b is None else np.asarray(b, dtype) for b in CLIP_CASES[case])
    given = [a for a in (lo, hi) if a is not None]

    def clamp(t, *bounds):
        it = iter(bounds)
        return torch.clamp(t, min=next(it) if lo is not None else None,
                           max=next(it) if hi is not None else None)
    want_y, want_grads = torch_grad(torch, clamp, x, *given)
    o = op("clip")
    y = o(x, lo, hi)
    grads = [g for g in o.backward(np.ones_like(x), x, lo, hi) if g is not None]
    np.testing.assert_array_equal(y, want_y)
    assert len(grads) == len(want_grads)
    for got, want in zip(grads, want_grads):
        np.testing.assert_array_equal(got, want)


def test_min_max_clamp_against_scalar_bounds_keep_numpys_meaning(tmp_path):
    """A bound that cannot be NaN (a number, an attr, minus an attr) compiles to one ordered
    select (one vmax / vmin): NaN in x still propagates, ties keep x's signed zero, lo > hi
    gives hi, and a bound given as an array keeps the two-sided NaN form."""
    forward = {"y0": "max(x, 0.0)", "y1": "min(x, -0.0)", "y2": "clamp(x, lo, hi)",
               "y3": "clamp(x, -hi, hi)", "y4": "max(x, w) + min(w, x)", "y5": "min(x, -lo)"}
    path = write_op(tmp_path, declaration(
        forward, inputs=("x", ("w", "{dtypes: [float32, float64]}")),
        attrs={"lo": "{type: float, default: 0.0}", "hi": "{type: float, default: inf}"},
        outputs=list(forward)))
    probe = make_op(path)
    source = probe.source()
    assert "(a_lo if a_lo > v" in source and "(a_hi if a_hi < v" in source
    x = np.array([NAN, -0.0, 0.0, -1.5, 2.5, INF, -INF, 0.25])
    w = np.array([1.0, 0.0, -0.0, NAN, NAN, 3.0, -3.0, 0.25])
    for dtype in (np.float32, np.float64):
        for lo, hi in ((0.0, INF), (-1.0, 2.0), (1.0, -1.0), (-0.0, 0.0)):
            xs, ws = x.astype(dtype), w.astype(dtype)
            ys = probe(xs, ws, lo=lo, hi=hi)
            want = [np.maximum(xs, dtype(0.0)), np.minimum(xs, dtype(-0.0)),
                    np.minimum(np.maximum(xs, dtype(lo)), dtype(hi)),
                    np.minimum(np.maximum(xs, dtype(-hi)), dtype(hi)),
                    np.maximum(xs, ws) + np.minimum(ws, xs), np.minimum(xs, dtype(-lo))]
            for name, got, ref in zip(forward, ys, want):
                np.testing.assert_array_equal(got, ref, err_msg=f"{name} {dname(dtype)} {lo} {hi}")
                # a tie keeps x's own zero, as the generic form does (NumPy's maximum does
                # not say which zero it returns)
                tie = (got == xs) & (name != "y4")
                assert (np.signbit(got)[tie] == np.signbit(xs)[tie]).all(), name
