"""The GAN LeakyReLU family, compiled, against references written directly in NumPy in this file
(not the graph interpreter opkit validates with): spatial_leaky_relu, conditional_leaky_relu,
freq_leaky_relu and fused_bias_leaky_relu over every dtype, layout, stride pattern and size class;
gradients against analytic NumPy gradients and central finite differences; the special semantics
of each operator; bad input."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import opkit
from opkit.validate import validate_op

DTYPES = [np.float16, np.float32, np.float64]
LAYOUTS = ["NCHW", "NHWC"]
VIEWS = ["c", "other_layout", "neg", "step"]
# (N, C, H, W): H and W odd and even, including 1
SIZES = [(2, 3, 5, 7), (1, 1, 1, 1), (2, 4, 6, 8), (1, 2, 1, 4), (3, 5, 2, 1), (1, 3, 9, 3)]
LARGE = (2, 8, 48, 48)              # 36864 elements: past the 32768 parallel threshold
CHANNEL_AXIS = {"NCHW": 1, "NHWC": 3}
HW_AXES = {"NCHW": (2, 3), "NHWC": (1, 2)}

# The precision standard against a float64 reference: |a - e| <= atol + rtol * |e|.
TOL = {"float16": (1e-3, 1e-3), "float32": (1e-4, 1e-4), "float64": (1e-12, 1e-12)}
# freq_leaky_relu sums every output from all up*H x up*W resampled values through FFTs: the
# float32 round-off is about eps32 * log2(size) * (the signal's magnitude), an absolute error that
# does not shrink with the output value, so outputs near zero (frequent after LeakyReLU + low-pass)
# get a looser absolute bound in float32. float16 is computed in float32 and rounded once, so the
# float16 rounding (5e-4 relative) dominates and the standard bound holds.
FREQ_TOL = {"float16": (1e-3, 1e-3), "float32": (3e-4, 1e-4), "float64": (1e-12, 1e-12)}

ids_dtype = lambda d: np.dtype(d).name  # noqa: E731


def name(dtype) -> str:
    return np.dtype(dtype).name


def physical(dims, layout):
    n, c, h, w = dims
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


# ------------------------------------------------------------------------------ NumPy references

def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def sum_to(g: np.ndarray, shape) -> np.ndarray:
    """A broadcast gradient summed back to `shape` (NumPy broadcasting rules)."""
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def per_channel(v: np.ndarray, layout: str) -> np.ndarray:
    """A [C] vector (or an [N, C] array) shaped to broadcast along the layout's channel axis."""
    v = f64(v)
    if v.ndim == 1:
        return v.reshape((1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1))
    n, c = v.shape
    return v.reshape((n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c))


# spatial_leaky_relu

def spatial_ref(x, alpha_map):
    x, a = f64(x), f64(alpha_map)
    return np.where(x > 0, x, a * x)


def spatial_grad_ref(dy, x, alpha_map):
    x, a, dy = f64(x), f64(alpha_map), f64(dy)
    dx = np.where(x > 0, dy, a * dy)
    full = np.broadcast_to(np.where(x > 0, 0.0, x * dy), np.broadcast_shapes(x.shape, a.shape))
    return dx, sum_to(full, a.shape)


# conditional_leaky_relu

def sigmoid(t):
    return 1.0 / (1.0 + np.exp(-t))


def cond_ref(x, z, w, b, alpha_min=0.1, alpha_max=0.3, layout="NCHW"):
    s = sigmoid(f64(z) @ f64(w) + f64(b))
    alpha = alpha_min + (alpha_max - alpha_min) * s            # [N, C]
    x = f64(x)
    return np.where(x > 0, x, per_channel(alpha, layout) * x)


def cond_grad_ref(dy, x, z, w, b, alpha_min=0.1, alpha_max=0.3, layout="NCHW"):
    x, dy, z, w = f64(x), f64(dy), f64(z), f64(w)
    s = sigmoid(z @ w + f64(b))
    alpha = alpha_min + (alpha_max - alpha_min) * s
    dx = np.where(x > 0, dy, per_channel(alpha, layout) * dy)
    dalpha = np.where(x > 0, 0.0, x * dy).sum(axis=HW_AXES[layout])     # [N, C]
    dt = dalpha * (alpha_max - alpha_min) * s * (1 - s)                 # d(z @ w + b)
    return dx, dt @ w.T, z.T @ dt, dt.sum(axis=0)


# freq_leaky_relu: band-limited resampling in the DFT domain with the full complex FFT

def _at(index, axis, ndim):
    sel = [slice(None)] * ndim
    sel[axis] = index
    return tuple(sel)


def _pad(x: np.ndarray, axis: int, up: int, nyquist: float) -> np.ndarray:
    """Length N -> M = up * N: the DFT coefficients copied into a zero spectrum of length M
    (indices 0 .. ceil(N/2)-1 at the start, the negative frequencies at the end; an even N's
    Nyquist coefficient X[N/2], times `nyquist`, put at both N/2 and M - N/2), inverse DFT."""
    if up == 1:
        return f64(x).copy()
    n = x.shape[axis]
    m = up * n
    X = np.fft.fft(x, axis=axis)
    shape = list(x.shape)
    shape[axis] = m
    Z = np.zeros(shape, complex)
    pos, neg = (n + 1) // 2, (n - 1) // 2
    Z[_at(slice(0, pos), axis, x.ndim)] = X[_at(slice(0, pos), axis, x.ndim)]
    if neg:
        Z[_at(slice(m - neg, m), axis, x.ndim)] = X[_at(slice(n - neg, n), axis, x.ndim)]
    if n % 2 == 0:
        Z[_at(n // 2, axis, x.ndim)] = X[_at(n // 2, axis, x.ndim)] * nyquist
        Z[_at(m - n // 2, axis, x.ndim)] = X[_at(n // 2, axis, x.ndim)] * nyquist
    return np.fft.ifft(Z, axis=axis).real


def _crop(y: np.ndarray, axis: int, up: int, nyquist: float) -> np.ndarray:
    """Length M -> N = M / up: the same coefficients taken back (an even N's Nyquist coefficient
    is `nyquist` times the sum of the two at N/2 and M - N/2), inverse DFT of length N."""
    if up == 1:
        return f64(y).copy()
    m = y.shape[axis]
    n = m // up
    Y = np.fft.fft(y, axis=axis)
    shape = list(y.shape)
    shape[axis] = n
    X = np.zeros(shape, complex)
    pos, neg = (n + 1) // 2, (n - 1) // 2
    X[_at(slice(0, pos), axis, y.ndim)] = Y[_at(slice(0, pos), axis, y.ndim)]
    if neg:
        X[_at(slice(n - neg, n), axis, y.ndim)] = Y[_at(slice(m - neg, m), axis, y.ndim)]
    if n % 2 == 0:
        X[_at(n // 2, axis, y.ndim)] = (Y[_at(n // 2, axis, y.ndim)] + Y[_at(m - n // 2, axis, y.ndim)]) * nyquist
    return np.fft.ifft(X, axis=axis).real


def dft_up(x: np.ndarray, axis: int, up: int) -> np.ndarray:
    """Upsampling as the issue defines it: the Nyquist coefficient split in half, times up."""
    return _pad(x, axis, up, 0.5) * up


def dft_down(y: np.ndarray, axis: int, up: int) -> np.ndarray:
    """Downsampling as the issue defines it: the two Nyquist halves summed, divided by up."""
    return _crop(y, axis, up, 1.0) / up


def dft_up_adjoint(y: np.ndarray, axis: int, up: int) -> np.ndarray:
    """The transpose of dft_up. With F the DFT matrix, up(x) = up * F_M^-1 P F_N x, so
    up^T(y) = up * F_N^H P^T F_M^-H y = ifft_N(P^T fft_M(y)) * (up * N / M) = ifft_N(P^T fft_M(y)):
    P^T takes the kept coefficients back and averages the Nyquist pair (P wrote half of X[N/2]
    into each)."""
    return _crop(y, axis, up, 0.5)


def dft_down_adjoint(x: np.ndarray, axis: int, up: int) -> np.ndarray:
    """The transpose of dft_down: down(y) = F_N^-1 Q F_M y / up, so
    down^T(x) = ifft_M(Q^T fft_N(x)) * (M / (up * N)) = ifft_M(Q^T fft_N(x)); Q^T copies X[N/2]
    (whole) to both N/2 and M - N/2 (Q summed the two)."""
    return _pad(x, axis, up, 1.0)


def freq_upsampled(x, up, layout):
    h, w = HW_AXES[layout]
    return dft_up(dft_up(f64(x), h, up), w, up)          # along H, then W


def freq_ref(x, alpha=0.2, up=2, gain=1.0, layout="NCHW"):
    h, w = HW_AXES[layout]
    u = freq_upsampled(x, up, layout)
    a = np.where(u > 0, u, alpha * u)
    return gain * dft_down(dft_down(a, h, up), w, up)


def freq_grad_ref(dy, x, alpha=0.2, up=2, gain=1.0, layout="NCHW"):
    """The adjoint chain: down^T along W then H, the LeakyReLU slope at u, up^T along W then H."""
    h, w = HW_AXES[layout]
    u = freq_upsampled(x, up, layout)
    da = dft_down_adjoint(dft_down_adjoint(gain * f64(dy), w, up), h, up)
    du = np.where(u > 0, da, alpha * da)
    return (dft_up_adjoint(dft_up_adjoint(du, w, up), h, up),)


# fused_bias_leaky_relu

def fused_ref(x, bias, alpha=0.2, gain=math.sqrt(2), clamp=None, layout="NCHW"):
    v = f64(x) + per_channel(bias, layout)
    y = np.where(v > 0, v, alpha * v) * gain
    return y if clamp is None else np.clip(y, -clamp, clamp)


def fused_grad_ref(dy, x, bias, alpha=0.2, gain=math.sqrt(2), clamp=None, layout="NCHW"):
    v = f64(x) + per_channel(bias, layout)
    pre = np.where(v > 0, v, alpha * v) * gain
    g = f64(dy) * gain * np.where(v > 0, 1.0, alpha)
    if clamp is not None:
        g = np.where(np.abs(pre) <= clamp, g, 0.0)        # zero where the clamp is active
    others = tuple(a for a in range(4) if a != CHANNEL_AXIS[layout])
    return g, g.sum(axis=others)


# ------------------------------------------------------------------------------ helpers

def assert_close(actual, expected, dtype, what, tol=TOL):
    """actual (in `dtype`) against a float64 reference: same shape, NaN and infinities where the
    reference has them, finite values within atol + rtol * |e|."""
    atol, rtol = tol[name(dtype)]
    actual = np.asarray(actual)
    expected = f64(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    a = actual.astype(np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(expected)), f"{what}: NaN positions differ"
    inf = np.isinf(expected)
    assert np.array_equal(a[inf], expected[inf]), f"{what}: infinities differ"
    fin = np.isfinite(expected)
    err = np.abs(a[fin] - expected[fin])
    bound = atol + rtol * np.abs(expected[fin])
    if err.size and (err > bound).any():
        k = int(np.argmax(err / bound))
        raise AssertionError(f"{what}: {int((err > bound).sum())} of {err.size} values off; worst "
                             f"got {a[fin][k]!r}, expected {expected[fin][k]!r} (|err| {err[k]:.3g})")


def view_of(arr: np.ndarray, view: str, layout: str = "NCHW") -> np.ndarray:
    """The same values and shape in another memory arrangement."""
    if view == "c" or arr.ndim == 0:
        return arr
    if view == "other_layout":
        if arr.ndim != 4:
            return arr
        # NHWC: x.transpose(0, 2, 3, 1) of contiguous NCHW memory; NCHW: the mirror image
        if layout == "NHWC":
            return np.ascontiguousarray(arr.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(arr.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if view == "neg":
        rev = (slice(None, None, -1),) * arr.ndim
        return np.ascontiguousarray(arr[rev])[rev]
    if view == "step":       # every 2nd element along the last axis, every 3rd along the first
        big = np.zeros((3 * arr.shape[0],) + arr.shape[1:-1] + (2 * arr.shape[-1],), arr.dtype)
        sel = (slice(None, None, 3),) + (slice(None),) * (arr.ndim - 2) + (slice(None, None, 2),)
        if arr.ndim == 1:
            big = np.zeros(6 * arr.shape[0], arr.dtype)
            sel = (slice(None, None, 6),)
        big[sel] = arr
        return big[sel]
    raise AssertionError(view)


def check_view(arr, view):
    """The view helper really gives what it says."""
    if view == "neg" and arr.size > 1:
        assert any(s < 0 for s in arr.strides)
    if view == "step" and arr.size > 1:
        assert not arr.flags.c_contiguous


def away_from_zero(values: np.ndarray, margin: float = 0.05) -> np.ndarray:
    """Values with |v| >= margin, sign kept (no finite difference crosses the kink at 0)."""
    return np.where(values >= 0, 1.0, -1.0) * np.maximum(np.abs(values), margin)


def fd_check(op, inputs: dict, attrs: dict, layout: str, rng, h=1e-6, tol=1e-6, stable=None):
    """Central differences of the compiled float64 forward in a random direction per input,
    against op.backward. `stable(moved_inputs)` -> a boolean mask that must not change between
    x - h v and x + h v (no kink inside the step); a direction that crosses one is redrawn."""
    y = op(**inputs, **attrs, layout=layout)
    dy = rng.standard_normal(y.shape)
    grads = op.backward(dy, **inputs, **attrs, layout=layout)
    assert len(grads) == len(inputs)
    for (key, arr), g in zip(inputs.items(), grads):
        assert g.shape == arr.shape and g.dtype == np.float64, (key, g.shape, arr.shape)
        for _ in range(10):
            v = rng.standard_normal(arr.shape)
            plus = {**inputs, key: arr + h * v}
            minus = {**inputs, key: arr - h * v}
            if stable is None or np.array_equal(stable(plus), stable(minus)):
                break
        else:
            raise AssertionError(f"every direction for {key} crossed a kink")
        yp = op(**plus, **attrs, layout=layout)
        ym = op(**minus, **attrs, layout=layout)
        fd = math.fsum((dy * (yp - ym)).ravel()) / (2 * h)
        an = math.fsum((g * v).ravel())
        # rounding noise of the difference quotient: about eps * sum|dy * y| / h
        noise = 10 * np.finfo(np.float64).eps * float(np.sum(np.abs(dy * y))) / h
        assert abs(fd - an) <= tol * max(abs(fd), abs(an)) + noise, (op.name, key, fd, an)


def raises(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert re.search(pattern, str(info.value)), str(info.value)
    return info.value


@pytest.fixture(scope="module")
def spatial():
    return opkit.get("spatial_leaky_relu")


@pytest.fixture(scope="module")
def cond():
    return opkit.get("conditional_leaky_relu")


@pytest.fixture(scope="module")
def freq():
    return opkit.get("freq_leaky_relu")


@pytest.fixture(scope="module")
def fused():
    return opkit.get("fused_bias_leaky_relu")


# ------------------------------------------------------------------------------ the references themselves

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16])
@pytest.mark.parametrize("up", [1, 2, 3, 4])
def test_reference_resampling_round_trip_and_adjoints(n, up):
    rng = np.random.default_rng(n * 10 + up)
    x = rng.standard_normal((3, n))
    y = rng.standard_normal((3, up * n))
    u = dft_up(x, 1, up)
    assert u.shape == (3, up * n)
    np.testing.assert_allclose(dft_down(u, 1, up), x, rtol=0, atol=1e-13)       # down(up(x)) == x
    np.testing.assert_allclose(dft_up(np.full((2, n), -1.5), 1, up), -1.5, atol=1e-13)
    np.testing.assert_allclose(dft_down(np.full((2, up * n), 2.5), 1, up), 2.5, atol=1e-13)
    if up == 1:
        np.testing.assert_allclose(u, x, rtol=0, atol=1e-13)
    # the adjoints, by the dot-product identity <A x, y> == <x, A^T y>
    assert math.isclose(np.sum(u * y), np.sum(x * dft_up_adjoint(y, 1, up)), rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(np.sum(dft_down(y, 1, up) * x), np.sum(y * dft_down_adjoint(x, 1, up)),
                        rel_tol=1e-12, abs_tol=1e-12)
    # and as matrices: the adjoint applied to the identity is the transposed matrix
    U = dft_up(np.eye(n), 0, up)
    D = dft_down(np.eye(up * n), 0, up)
    np.testing.assert_allclose(dft_up_adjoint(np.eye(up * n), 0, up), U.T, atol=1e-13)
    np.testing.assert_allclose(dft_down_adjoint(np.eye(n), 0, up), D.T, atol=1e-13)
    np.testing.assert_allclose(D @ U, np.eye(n), atol=1e-13)
    # a band-limited signal (a sampled cosine below Nyquist) is resampled exactly
    if n >= 3:
        t = np.arange(up * n) / (up * n)
        wave = np.cos(2 * np.pi * t + 0.3)
        np.testing.assert_allclose(dft_up(wave[::up], 0, up), wave, atol=1e-12)


@pytest.mark.parametrize("backend", ["scipy", "numpy"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("up", [2, 3, 4])
def test_resampling_matches_the_reference(backend, axis, up, monkeypatch):
    """opkit's resampling (every kind, through SciPy's FFTs or NumPy's) against the complex-DFT
    references above, in float64 and float32, for odd and even lengths."""
    from opkit.dsl import library
    if backend == "scipy":
        pytest.importorskip("scipy.fft")
    else:
        monkeypatch.setattr(library, "_fft", lambda: (np.fft, {}))
    rng = np.random.default_rng(up * 7 + axis)
    refs = {"up": dft_up, "down": dft_down, "up_T": dft_up_adjoint, "down_T": dft_down_adjoint}
    for n in (1, 2, 3, 5, 6, 8, 9, 16):
        for kind, ref in refs.items():
            length, nyquist, scale = library._FOURIER[kind]
            m = n if kind in ("up", "down_T") else up * n
            shape = (m, 5) if axis == 0 else (4, m)
            for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-6)):
                x = rng.standard_normal(shape).astype(dtype)
                got = library.resample(x, axis, length(m, up), nyquist, scale(up))
                assert got.dtype == dtype
                np.testing.assert_allclose(got, ref(f64(x), axis, up), rtol=0,
                                           atol=tol * max(1, m), err_msg=f"{kind} n={n}")
                # a scale that is not the transforms' own normalisation
                got = library.resample(x, axis, length(m, up), nyquist, -0.37 * scale(up))
                np.testing.assert_allclose(got, -0.37 * ref(f64(x), axis, up), rtol=0,
                                           atol=tol * max(1, m), err_msg=f"{kind} n={n} scaled")


def test_reference_gradients_are_directional_derivatives():
    """The analytic NumPy gradients against central differences of the NumPy forwards:
    <grad(dy), v> == <dy, (f(x + h v) - f(x - h v)) / 2h>."""
    rng = np.random.default_rng(42)
    h = 1e-6

    def check(f, grad, args, dy):
        grads = grad(dy, *args)
        for k, (arr, g) in enumerate(zip(args, grads)):
            assert g.shape == np.shape(arr)
            v = rng.standard_normal(np.shape(arr))
            plus = list(args)
            minus = list(args)
            plus[k] = arr + h * v
            minus[k] = arr - h * v
            fd = np.sum(dy * (f(*plus) - f(*minus))) / (2 * h)
            assert math.isclose(fd, np.sum(g * v), rel_tol=1e-6, abs_tol=1e-8), (f.__name__, k)

    for layout in LAYOUTS:
        dims = physical((2, 3, 4, 5), layout)
        x = away_from_zero(rng.uniform(-2, 2, dims), 0.05)
        dy = rng.standard_normal(dims)
        am = rng.uniform(0, 1, dims[:1] + (1,) * 3 if layout == "NCHW" else dims[:3] + (1,))
        check(spatial_ref, spatial_grad_ref, (x, am), dy)
        z, w, b = rng.standard_normal((2, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3)
        check(lambda *a: cond_ref(*a, 0.05, 0.6, layout),
              lambda d, *a: cond_grad_ref(d, *a, 0.05, 0.6, layout), (x, z, w, b), dy)
        bias = rng.standard_normal(3)
        xb = x - per_channel(bias, layout)             # xb + bias == x: away from the kink at 0
        check(lambda *a: fused_ref(*a, 0.3, 1.5, 2.0, layout),
              lambda d, *a: fused_grad_ref(d, *a, 0.3, 1.5, 2.0, layout), (xb, bias), dy)
        for dims2, up in (((2, 3, 4, 5), 2), ((1, 2, 3, 6), 3), ((1, 1, 1, 2), 4)):
            xs = rng.uniform(-2, 2, physical(dims2, layout))
            dys = rng.standard_normal(xs.shape)
            check(lambda a: freq_ref(a, 0.15, up, 1.3, layout),
                  lambda d, a: freq_grad_ref(d, a, 0.15, up, 1.3, layout), (xs,), dys)


# ------------------------------------------------------------------------------ the grids

def _spatial_alpha_shapes(dims, layout):
    """[N,H,W,1], [1,H,W,1], [H,W,1], [1], (), full -- for NCHW the same maps as [N,1,H,W] ..."""
    n, c, h, w = dims
    if layout == "NHWC":
        return [(n, h, w, 1), (1, h, w, 1), (h, w, 1), (1,), (), (n, h, w, c)]
    return [(n, 1, h, w), (1, 1, h, w), (h, w), (1,), (), (n, c, h, w)]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_spatial_grid(spatial, dtype, layout, view):
    rng = np.random.default_rng(1)
    for dims in SIZES:
        shape = physical(dims, layout)
        x = view_of(rng.uniform(-3, 3, shape).astype(dtype), view, layout)
        dy = rng.uniform(-1, 1, shape).astype(dtype)
        for ashape in _spatial_alpha_shapes(dims, layout):
            am = view_of(rng.uniform(0, 1, ashape).astype(dtype), "c" if view == "other_layout" else view)
            check_view(am, view)
            what = f"{dims} alpha_map {ashape}"
            y = spatial(x, am, layout=layout)
            assert y.dtype == dtype and y.shape == shape
            assert_close(y, spatial_ref(x, am), dtype, what)
            dx, dam = spatial.backward(dy, x, am, layout=layout)
            assert dx.dtype == dtype and dam.dtype == dtype and dam.shape == am.shape, what
            rdx, rdam = spatial_grad_ref(dy, x, am)
            assert_close(dx, rdx, dtype, what + " dx")
            assert_close(dam, rdam, dtype, what + " dalpha_map")


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_conditional_grid(cond, dtype, layout, view):
    rng = np.random.default_rng(2)
    for dims in SIZES:
        n, c, _, _ = dims
        shape = physical(dims, layout)
        for k in (1, 4):
            x = view_of(rng.uniform(-3, 3, shape).astype(dtype), view, layout)
            z = view_of(rng.standard_normal((n, k)).astype(dtype), view)
            w = view_of((0.7 * rng.standard_normal((k, c))).astype(dtype), view)
            b = view_of(rng.standard_normal(c).astype(dtype), view)
            dy = rng.uniform(-1, 1, shape).astype(dtype)
            for attrs in ({}, {"alpha_min": 0.05, "alpha_max": 0.6}, {"alpha_min": 0.4, "alpha_max": 0.0}):
                what = f"{dims} K={k} {attrs}"
                y = cond(x, z, w, b, layout=layout, **attrs)
                assert y.dtype == dtype and y.shape == shape
                assert_close(y, cond_ref(x, z, w, b, layout=layout, **attrs), dtype, what)
                grads = cond.backward(dy, x, z, w, b, layout=layout, **attrs)
                refs = cond_grad_ref(dy, x, z, w, b, layout=layout, **attrs)
                for label, g, r, src in zip(("dx", "dz", "dw", "db"), grads, refs, (x, z, w, b)):
                    assert g.dtype == dtype and g.shape == src.shape, (what, label)
                    assert_close(g, r, dtype, f"{what} {label}")


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_freq_grid(freq, dtype, layout, view):
    rng = np.random.default_rng(3)
    for dims in SIZES:
        shape = physical(dims, layout)
        x = view_of(rng.uniform(-2, 2, shape).astype(dtype), view, layout)
        dy = rng.uniform(-1, 1, shape).astype(dtype)
        for attrs in ({}, {"alpha": 0.1, "up": 3, "gain": 1.7}, {"alpha": 0.3, "up": 1},
                      {"up": 4, "gain": 0.5}):
            what = f"{dims} {attrs}"
            y = freq(x, layout=layout, **attrs)
            assert y.dtype == dtype and y.shape == shape
            assert_close(y, freq_ref(x, layout=layout, **attrs), dtype, what, FREQ_TOL)
            dx, = freq.backward(dy, x, layout=layout, **attrs)
            assert dx.dtype == dtype and dx.shape == shape
            assert_close(dx, freq_grad_ref(dy, x, layout=layout, **attrs)[0], dtype, what + " dx", FREQ_TOL)


def _fused_inputs(rng, dims, layout, dtype, attrs):
    """x and bias with x + bias and the scaled value kept off the kinks (0 and +-clamp), so that
    the float32/float16 computation takes the same branch as the float64 reference."""
    shape = physical(dims, layout)
    bias = rng.standard_normal(dims[1]).astype(dtype)
    x = rng.uniform(-3, 3, shape)
    v = away_from_zero(x + per_channel(bias, layout), 0.02)
    clamp = attrs.get("clamp")
    if clamp is not None:
        scale = attrs.get("gain", math.sqrt(2)) * np.where(v > 0, 1.0, attrs.get("alpha", 0.2))
        near = np.abs(np.abs(v * scale) - clamp) < 0.02
        v = np.where(near, v * 1.1, v)
    x = (v - per_channel(bias, layout)).astype(dtype)
    return x, bias


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_fused_bias_grid(fused, dtype, layout, view):
    rng = np.random.default_rng(4)
    for dims in SIZES:
        shape = physical(dims, layout)
        dy = rng.uniform(-1, 1, shape).astype(dtype)
        for attrs in ({}, {"clamp": 2.0}, {"alpha": 0.3, "gain": 1.5, "clamp": 0.7},
                      {"alpha": 0.0, "gain": 1.0, "clamp": None}):
            x, bias = _fused_inputs(rng, dims, layout, dtype, attrs)
            x, bias = view_of(x, view, layout), view_of(bias, view)
            check_view(x, view)
            what = f"{dims} {attrs}"
            y = fused(x, bias, layout=layout, **attrs)
            assert y.dtype == dtype and y.shape == shape
            assert_close(y, fused_ref(x, bias, layout=layout, **attrs), dtype, what)
            dx, dbias = fused.backward(dy, x, bias, layout=layout, **attrs)
            assert dx.dtype == dtype and dbias.dtype == dtype and dbias.shape == bias.shape
            rdx, rdb = fused_grad_ref(dy, x, bias, layout=layout, **attrs)
            assert_close(dx, rdx, dtype, what + " dx")
            assert_close(dbias, rdb, dtype, what + " dbias")


def _large_inputs(rng, op, dtype, layout="NHWC"):
    dims = LARGE
    shape = physical(dims, layout)
    x = rng.uniform(-3, 3, shape).astype(dtype)
    if op.name == "spatial_leaky_relu":
        return {"x": x, "alpha_map": rng.uniform(0, 1, shape[:3] + (1,)).astype(dtype)}, {}
    if op.name == "conditional_leaky_relu":
        return {"x": x, "z": rng.standard_normal((2, 5)).astype(dtype),
                "w": rng.standard_normal((5, dims[1])).astype(dtype),
                "b": rng.standard_normal(dims[1]).astype(dtype)}, {}
    if op.name == "freq_leaky_relu":
        return {"x": x}, {"up": 2, "gain": 1.2}
    x, bias = _fused_inputs(rng, dims, layout, dtype, {"clamp": 1.5})
    return {"x": x, "bias": bias}, {"clamp": 1.5}


REFS = {"spatial_leaky_relu": (spatial_ref, spatial_grad_ref),
        "conditional_leaky_relu": (cond_ref, cond_grad_ref),
        "freq_leaky_relu": (freq_ref, freq_grad_ref),
        "fused_bias_leaky_relu": (fused_ref, fused_grad_ref)}
GAN_OPS = list(REFS)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
@pytest.mark.parametrize("op_name", GAN_OPS)
def test_large_case_threads_bitwise_equal_and_correct(op_name, dtype):
    """More than 32768 elements: the multi-thread path gives the same bits as one thread, and the
    values of the reference."""
    op = opkit.get(op_name)
    rng = np.random.default_rng(5)
    inputs, attrs = _large_inputs(rng, op, dtype)
    assert inputs["x"].size > 32768
    dy = rng.uniform(-1, 1, inputs["x"].shape).astype(dtype)
    with opkit.config(num_threads=1):
        y1 = op(**inputs, **attrs, layout="NHWC")
        g1 = op.backward(dy, **inputs, **attrs, layout="NHWC")
    with opkit.config(num_threads=2):
        y2 = op(**inputs, **attrs, layout="NHWC")
        g2 = op.backward(dy, **inputs, **attrs, layout="NHWC")
    assert y1.tobytes() == y2.tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(g1, g2))
    fwd, bwd = REFS[op_name]
    tol = FREQ_TOL if op_name == "freq_leaky_relu" else TOL
    assert_close(y2, fwd(*inputs.values(), **attrs, layout="NHWC") if op_name != "spatial_leaky_relu"
                 else fwd(*inputs.values()), dtype, f"{op_name} large", tol)
    refs = (bwd(dy, *inputs.values(), **attrs, layout="NHWC") if op_name != "spatial_leaky_relu"
            else bwd(dy, *inputs.values()))
    for key, g, r in zip(inputs, g2, refs):
        assert g.shape == inputs[key].shape
        assert_close(g, r, dtype, f"{op_name} large d{key}", tol)


# ------------------------------------------------------------------------------ mixed dtypes

def test_spatial_float32_alpha_map_with_float16_x(spatial):
    """The result dtype is NumPy's promotion (float16 with float32 gives float32), and the values
    are NumPy's own float32 computation; each gradient takes its input's dtype."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-3, 3, (2, 5, 7, 3)).astype(np.float16)
    am = rng.uniform(0, 1, (5, 7, 1)).astype(np.float32)
    y = spatial(x, am, layout="NHWC")
    assert y.dtype == np.result_type(x, am) == np.float32
    np.testing.assert_array_equal(y, np.where(x > 0, x, am * x))
    assert_close(y, spatial_ref(x, am), np.float32, "mixed forward")
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    dx, dam = spatial.backward(dy, x, am, layout="NHWC")
    assert dx.dtype == np.float16 and dam.dtype == np.float32 and dam.shape == am.shape
    rdx, rdam = spatial_grad_ref(dy, x, am)
    assert_close(dx, rdx, np.float16, "mixed dx")
    assert_close(dam, rdam, np.float32, "mixed dalpha_map")
    # float32 x with a float64 map: float64
    y64 = spatial(x.astype(np.float32), am.astype(np.float64), layout="NHWC")
    assert y64.dtype == np.float64
    assert_close(y64, spatial_ref(x.astype(np.float32), am.astype(np.float64)), np.float64, "f32 x f64")


def test_fused_float32_bias_with_float16_x(fused):
    rng = np.random.default_rng(7)
    x, bias = _fused_inputs(rng, (2, 3, 4, 5), "NCHW", np.float16, {})
    bias = bias.astype(np.float32)
    y = fused(x, bias)
    assert y.dtype == np.float32
    assert_close(y, fused_ref(x, bias), np.float32, "mixed forward")
    dx, db = fused.backward(np.ones_like(y), x, bias)
    assert dx.dtype == np.float16 and db.dtype == np.float32


# ------------------------------------------------------------------------------ finite differences

@pytest.mark.parametrize("layout", LAYOUTS)
def test_finite_differences_float64(spatial, cond, freq, fused, layout):
    rng = np.random.default_rng(8)
    for dims in ((2, 3, 5, 7), (1, 2, 4, 4), (1, 1, 1, 3)):
        shape = physical(dims, layout)
        n, c, h, w = dims
        x = away_from_zero(rng.uniform(-3, 3, shape), 1e-2)
        for ashape in _spatial_alpha_shapes(dims, layout):
            fd_check(spatial, {"x": x, "alpha_map": rng.uniform(0, 1, ashape)}, {}, layout, rng)
        inputs = {"x": x, "z": rng.standard_normal((n, 3)), "w": rng.standard_normal((3, c)),
                  "b": rng.standard_normal(c)}
        fd_check(cond, inputs, {"alpha_min": 0.05, "alpha_max": 0.7}, layout, rng)
        fd_check(cond, inputs, {}, layout, rng)
        for attrs in ({}, {"clamp": 1.0, "alpha": 0.3, "gain": 1.5}):
            xf, bias = _fused_inputs(rng, dims, layout, np.float64, {**attrs, "clamp": attrs.get("clamp", 1e9)})
            fd_check(fused, {"x": xf, "bias": bias}, attrs, layout, rng)
        for attrs in ({}, {"alpha": 0.1, "up": 3, "gain": 1.3}, {"up": 1}):
            up = attrs.get("up", 2)
            xs = rng.uniform(-2, 2, shape)
            fd_check(freq, {"x": xs}, attrs, layout, rng,
                     stable=lambda moved: freq_upsampled(moved["x"], up, layout) > 0)


# ------------------------------------------------------------------------------ special semantics

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_freq_alpha_one_is_gain_times_x(freq, dtype, layout):
    """alpha = 1 leaves only down(up(x)) == x, times gain."""
    rng = np.random.default_rng(9)
    for dims in SIZES:
        x = rng.uniform(-2, 2, physical(dims, layout)).astype(dtype)
        for up, gain in ((2, 1.0), (3, 0.7), (4, 2.0), (1, 1.5)):
            y = freq(x, alpha=1.0, up=up, gain=gain, layout=layout)
            assert_close(y, gain * f64(x), dtype, f"{dims} up={up} gain={gain}", FREQ_TOL)
            dx, = freq.backward(np.ones_like(x), x, alpha=1.0, up=up, gain=gain, layout=layout)
            assert_close(dx, np.full(x.shape, gain), dtype, f"{dims} up={up} dx", FREQ_TOL)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_freq_up_one_is_leaky_relu_times_gain(freq, dtype):
    rng = np.random.default_rng(10)
    x = rng.uniform(-2, 2, (2, 3, 5, 4)).astype(dtype)
    for layout in LAYOUTS:
        y = freq(x, alpha=0.25, up=1, gain=1.5, layout=layout)
        xd = f64(x)
        assert_close(y, 1.5 * np.where(xd > 0, xd, 0.25 * xd), dtype, layout)
        dy = rng.uniform(-1, 1, x.shape).astype(dtype)
        dx, = freq.backward(dy, x, alpha=0.25, up=1, gain=1.5, layout=layout)
        assert_close(dx, 1.5 * np.where(xd > 0, f64(dy), 0.25 * f64(dy)), dtype, layout + " dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_freq_constant_image_stays_constant(freq, dtype):
    values = np.array([1.25, -0.5, 3.0, -2.0])
    for layout in LAYOUTS:
        for dims in ((4, 1, 6, 5), (4, 1, 1, 1), (4, 1, 8, 8)):
            x = np.broadcast_to(values.reshape(4, 1, 1, 1), physical(dims, layout)).astype(dtype)
            y = freq(x, alpha=0.2, up=2, gain=1.1, layout=layout)
            want = 1.1 * np.where(values > 0, values, 0.2 * values)
            assert_close(y, np.broadcast_to(want.reshape(4, 1, 1, 1), y.shape), dtype, f"{dims}",
                         FREQ_TOL)


def test_freq_nan_spreads_over_its_image_only(freq):
    """Resampling mixes every pixel of an image, so a NaN makes its whole (n, c) image NaN; the
    other images are untouched. With up = 1 nothing is mixed."""
    x = np.random.default_rng(11).uniform(-1, 1, (2, 3, 4, 5))
    x[1, 2, 3, 1] = np.nan
    y = freq(x)
    assert np.isnan(y[1, 2]).all()
    mask = np.ones(y.shape, bool)
    mask[1, 2] = False
    assert np.isfinite(y[mask]).all()
    assert_close(y[mask], freq_ref(np.where(np.isnan(x), 0, x))[mask], np.float64, "other images")
    y1 = freq(x, up=1)
    assert np.isnan(y1).sum() == 1 and np.isnan(y1[1, 2, 3, 1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_freq_in_slices_matches_the_reference(freq, monkeypatch, dtype, layout, threads):
    """A large call runs in slices along N (or C where N is short), a thread each: every slice
    writes its own part of the outputs, broadcast operands stay whole, and the result is the
    whole call's. Slices are forced here on small inputs."""
    from opkit.config import get as setting
    from opkit.runtime import execute, schedule
    monkeypatch.setattr(schedule, "SLICE_BYTES", 64)
    sliced = []
    real = execute.Executor._run_sliced

    def spy(self, d, step, *args, **kw):
        sliced.append((d, step))
        return real(self, d, step, *args, **kw)
    monkeypatch.setattr(execute.Executor, "_run_sliced", spy)
    seen = []   # the settings each run of the plan (a slice) sees
    whole = execute.Executor._run_whole

    def settings(self, *args, **kw):
        seen.append((setting("num_threads"), setting("alpha_quant")))
        return whole(self, *args, **kw)
    monkeypatch.setattr(execute.Executor, "_run_whole", settings)
    rng = np.random.default_rng(23)
    with opkit.config(num_threads=threads):
        for dims, attrs in (((5, 3, 6, 4), {}), ((1, 7, 4, 5), {"up": 3, "alpha": 0.1, "gain": 1.3})):
            shape = physical(dims, layout)
            x = rng.uniform(-2, 2, shape).astype(dtype)
            dy = rng.uniform(-1, 1, shape).astype(dtype)
            what = f"{dims} {attrs} {threads} threads"
            out = np.full(shape, np.nan, dtype)
            y = freq(x, layout=layout, out=out, **attrs)
            assert y is out
            assert_close(y, freq_ref(x, layout=layout, **attrs), dtype, what, FREQ_TOL)
            dx, = freq.backward(dy, x, layout=layout, **attrs)
            assert_close(dx, freq_grad_ref(dy, x, layout=layout, **attrs)[0], dtype, what + " dx",
                         FREQ_TOL)
            # dy broadcast along N and C (stride 0): each slice reads its part of the view
            row = np.broadcast_to(dy[:1, :1] if layout == "NCHW" else dy[:1, :, :, :1], shape)
            dx, = freq.backward(row, x, layout=layout, **attrs)
            assert_close(dx, freq_grad_ref(np.ascontiguousarray(row), x, layout=layout, **attrs)[0],
                         dtype, what + " dx, broadcast dy", FREQ_TOL)
            # dy of size one along every dim: each slice reads all of it
            ones = np.ones((1, 1, 1, 1), dtype)
            assert_close(freq.backward(ones, x, layout=layout, **attrs)[0],
                         freq_grad_ref(np.ones(shape), x, layout=layout, **attrs)[0], dtype,
                         what + " dx, dy of size one", FREQ_TOL)
            # in place: each slice reads and writes its own part of x
            y = freq(x.copy(), layout=layout, **attrs)
            xi = x.copy()
            freq(xi, layout=layout, out=xi, **attrs)
            np.testing.assert_array_equal(xi, y)
    # N = 5 along N, N = 1 along C: each of the six calls (three forward, three backward) in slices
    assert [d for d, _ in sliced] == ["N"] * 6 + ["C"] * 6, sliced
    assert all(step * 2 * threads <= (5 if d == "N" else 7) for d, step in sliced)
    # one thread inside each slice; every other setting is the caller's
    assert seen and all(s == (1, False) for s in seen)
    seen.clear()
    with opkit.config(num_threads=threads, alpha_quant=True):
        freq(np.ones((4, 2, 4, 4)))
    assert seen and all(s == (1, True) for s in seen)


def test_only_plans_of_resampling_calls_and_elementwise_kernels_run_in_slices():
    """A plan runs in slices only where a library call says it pays (LibraryPrimitive.mixes:
    fourier) and nothing reduces but a sum_to: freq_leaky_relu, along N and C (its transforms run
    along H and W); no other bundled operator (folded sums, convolutions, matmuls)."""
    for name in opkit.list_ops():
        for ex in opkit.get(name)._run_plans():
            if ex is not None:
                want = ("N", "C") if name == "freq_leaky_relu" else ()
                assert ex.facts.batch_dims == want, (name, ex.plan.kind)


def test_freq_empty_inputs(freq):
    for shape in ((0, 3, 4, 4), (2, 3, 0, 4), (2, 0, 4, 4)):
        x = np.zeros(shape)
        assert freq(x).shape == shape
        dx, = freq.backward(x, x)
        assert dx.shape == shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_fused_clamp(fused, dtype, layout):
    rng = np.random.default_rng(12)
    x, bias = _fused_inputs(rng, (2, 3, 6, 5), layout, dtype, {"clamp": 1.0})
    y = fused(x, bias, clamp=1.0, layout=layout)
    assert np.all(np.abs(y.astype(np.float64)) <= 1.0)
    pre = fused_ref(x, bias, layout=layout)
    active = np.abs(pre) > 1.0
    assert active.sum() > 10 and (~active).sum() > 10
    np.testing.assert_array_equal(y[active], np.sign(pre[active]).astype(dtype))
    dx, dbias = fused.backward(np.ones_like(y), x, bias, clamp=1.0, layout=layout)
    assert np.all(dx[active] == 0)                          # zero gradient beyond the clamp
    assert np.all(dx[~active] != 0)
    assert_close(dbias, fused_grad_ref(np.ones(y.shape), x, bias, clamp=1.0, layout=layout)[1],
                 dtype, "dbias")
    # exactly at the bound the gradient still flows (clamp's tie rule: lo <= v <= hi passes it)
    xe = np.array([1.0, -5.0, 0.5, 2.0]).reshape(1, 1, 1, 4).astype(dtype)
    if layout == "NHWC":
        xe = xe.reshape(1, 1, 4, 1)
    ye = fused(xe, np.zeros(1, dtype), alpha=0.2, gain=1.0, clamp=1.0, layout=layout)
    np.testing.assert_array_equal(ye.ravel(), np.array([1.0, -1.0, 0.5, 1.0], dtype))
    de, _ = fused.backward(np.ones_like(xe), xe, np.zeros(1, dtype), alpha=0.2, gain=1.0, clamp=1.0,
                           layout=layout)
    np.testing.assert_array_equal(de.ravel(), np.array([1.0, 0.2, 1.0, 0.0], dtype))


def test_fused_clamp_none_means_no_clamp(fused):
    rng = np.random.default_rng(13)
    x = rng.uniform(-1e4, 1e4, (2, 3, 4, 5))
    bias = rng.standard_normal(3)
    unclamped = fused_ref(x, bias)
    assert np.abs(unclamped).max() > 1e4
    y_default = fused(x, bias)
    np.testing.assert_array_equal(y_default, fused(x, bias, clamp=None))
    np.testing.assert_array_equal(y_default, fused(x, bias, clamp=float("inf")))
    assert_close(y_default, unclamped, np.float64, "clamp None")
    dx, _ = fused.backward(np.ones_like(x), x, bias)
    assert np.all(dx != 0)
    assert_close(dx, fused_grad_ref(np.ones_like(x), x, bias)[0], np.float64, "clamp None dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_conditional_with_equal_slopes_is_leaky_relu(cond, dtype):
    rng = np.random.default_rng(14)
    leaky = opkit.get("leaky_relu")
    for layout in LAYOUTS:
        x = rng.uniform(-3, 3, physical((2, 3, 4, 5), layout)).astype(dtype)
        x.flat[:3] = [0.0, -0.0, -1.0]
        z, w, b = (rng.standard_normal(s).astype(dtype) for s in ((2, 6), (6, 3), (3,)))
        y = cond(x, z, w, b, alpha_min=0.35, alpha_max=0.35, layout=layout)
        np.testing.assert_array_equal(y, leaky(x, alpha=0.35, layout=layout))
        dy = rng.uniform(-1, 1, x.shape).astype(dtype)
        dx, dz, dw, db = cond.backward(dy, x, z, w, b, alpha_min=0.35, alpha_max=0.35, layout=layout)
        np.testing.assert_array_equal(dx, leaky.backward(dy, x, alpha=0.35, layout=layout)[0])
        assert not dz.any() and not dw.any() and not db.any()   # alpha no longer depends on them


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dtype)
def test_spatial_with_scalar_alpha_map_is_leaky_relu(spatial, dtype):
    rng = np.random.default_rng(15)
    leaky = opkit.get("leaky_relu")
    x = rng.uniform(-3, 3, (2, 3, 4, 5)).astype(dtype)
    x.flat[:4] = [0.0, -0.0, np.inf, -np.inf]
    dy = rng.uniform(-1, 1, x.shape).astype(dtype)
    for am in (np.array(0.3, dtype), np.full(1, 0.3, dtype), np.full((1, 1, 1, 1), 0.3, dtype)):
        alpha = float(am.reshape(()))
        for layout in ("ND", "NCHW", "NHWC"):
            np.testing.assert_array_equal(spatial(x, am, layout=layout), leaky(x, alpha=alpha))
            dx, dam = spatial.backward(dy, x, am, layout=layout)
            np.testing.assert_array_equal(dx, leaky.backward(dy, x, alpha=alpha)[0])
            assert dam.shape == am.shape
            assert_close(dam, spatial_grad_ref(dy, x, am)[1], dtype, "dalpha_map")


def test_elementwise_ops_special_values(spatial, cond, fused):
    """NaN propagates where it is; x == 0 takes the alpha branch (gradient alpha * dy); +-inf
    follow the formula; 0 * -inf is NaN."""
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -2.0, 3.0, 1e-300]).reshape(1, 1, 2, 4)
    y = spatial(x, np.array(0.5))
    np.testing.assert_array_equal(y.ravel(), [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 3.0, 1e-300])
    assert np.signbit(y.ravel()[1])
    assert np.isnan(spatial(x, np.array(0.0)).ravel()[3])              # 0 * -inf
    dx, dam = spatial.backward(np.ones_like(x), x, np.array(0.5))
    assert dx.ravel()[0] == 0.5 and dx.ravel()[1] == 0.5 and dx.ravel()[7] == 1.0
    z, w, b = np.zeros((1, 2)), np.zeros((2, 1)), np.zeros(1)        # sigmoid(0) = 1/2
    yc = cond(x, z, w, b, alpha_min=0.2, alpha_max=0.6)                # alpha = 0.4
    np.testing.assert_array_equal(yc.ravel(), [0.0, -0.0, np.inf, -np.inf, np.nan, -0.8, 3.0, 1e-300])
    dxc = cond.backward(np.ones_like(x), x, z, w, b, alpha_min=0.2, alpha_max=0.6)[0]
    assert dxc.ravel()[0] == 0.4 and dxc.ravel()[6] == 1.0
    yf = fused(x, np.zeros(1), alpha=0.5, gain=2.0)
    np.testing.assert_array_equal(yf.ravel(), [0.0, 0.0, np.inf, -np.inf, np.nan, -2.0, 6.0, 2e-300])
    yf = fused(x, np.zeros(1), alpha=0.5, gain=2.0, clamp=3.0)
    np.testing.assert_array_equal(yf.ravel(), [0.0, 0.0, 3.0, -3.0, np.nan, -2.0, 3.0, 2e-300])
    dxf, _ = fused.backward(np.ones_like(x), x, np.zeros(1), alpha=0.5, gain=2.0)
    assert dxf.ravel()[0] == 1.0 and dxf.ravel()[6] == 2.0            # x + b == 0: alpha * gain
    # a NaN in the bias reaches exactly its channel
    xs = np.ones((1, 3, 2, 2))
    yb = fused(xs, np.array([0.0, np.nan, 0.0]))
    assert np.isnan(yb[:, 1]).all() and not np.isnan(yb[:, [0, 2]]).any()


def test_broadcast_gradients_come_back_in_their_own_shape(spatial, cond, fused):
    """Gradients of broadcast inputs: dalpha_map, dbias, dz, dw, db, including size-1 dims."""
    rng = np.random.default_rng(16)
    x = rng.uniform(-3, 3, (2, 6, 5, 3))                               # NHWC, C = 3
    dy = rng.uniform(-1, 1, x.shape)
    for ashape in ((2, 6, 5, 1), (1, 6, 5, 1), (6, 5, 1), (1, 1, 5, 1), (5, 1), (1,), ()):
        am = rng.uniform(0, 1, ashape)
        _, dam = spatial.backward(dy, x, am, layout="NHWC")
        assert dam.shape == ashape
        assert_close(dam, spatial_grad_ref(dy, x, am)[1], np.float64, f"dalpha_map {ashape}")
    for k in (1, 7):
        z, w, b = rng.standard_normal((2, k)), rng.standard_normal((k, 3)), rng.standard_normal(3)
        _, dz, dw, db = cond.backward(dy, x, z, w, b, layout="NHWC")
        assert (dz.shape, dw.shape, db.shape) == ((2, k), (k, 3), (3,))
    bias = rng.standard_normal(3)
    _, dbias = fused.backward(dy, x, bias, layout="NHWC")
    assert dbias.shape == (3,)
    assert_close(dbias, fused_grad_ref(dy, x, bias, layout="NHWC")[1], np.float64, "dbias")


def test_broadcast_dy(spatial, cond, freq, fused):
    """dy may be any array that broadcasts to the output (a stride-0 view, a 0-d scalar)."""
    rng = np.random.default_rng(18)
    x = rng.uniform(-2, 2, (2, 3, 4, 5))
    calls = [(spatial, (x, np.full(1, 0.3)), {}), (cond, (x, np.ones((2, 2)), np.ones((2, 3)), np.ones(3)), {}),
             (fused, (x, np.ones(3)), {"clamp": 1.0}), (freq, (x,), {})]
    for op, args, attrs in calls:
        full = op.backward(np.full(x.shape, 0.5), *args, **attrs)
        for dy in (np.broadcast_to(np.float64(0.5), x.shape), np.broadcast_to(np.full(5, 0.5), x.shape)):
            got = op.backward(dy, *args, **attrs)
            for g, f in zip(got, full):
                np.testing.assert_array_equal(g, f)
        for g, f in zip(op.backward(np.float64(0.5), *args, **attrs), full):
            np.testing.assert_allclose(g, f, rtol=1e-12, atol=1e-14)


def test_freq_backward_with_scalar_dy_does_not_crash(freq):
    code = ("import json, numpy as np, opkit\n"
            "x = np.linspace(-1, 1, 4).reshape(1, 1, 2, 2)\n"
            "dx, = opkit.get('freq_leaky_relu').backward(np.float64(1.0), x)\n"
            "print(json.dumps(dx.ravel().tolist()))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ))
    assert run.returncode == 0, f"exit status {run.returncode}: {run.stderr[-500:]}"
    x = np.linspace(-1, 1, 4).reshape(1, 1, 2, 2)
    want, = freq.backward(np.ones_like(x), x)
    np.testing.assert_array_equal(json.loads(run.stdout), want.ravel().tolist())


@pytest.mark.parametrize("dy_shape", [(1, 1, 1, 1), (1,)], ids=str)
def test_freq_backward_with_size_one_dy(freq, dy_shape):
    x = np.random.default_rng(19).uniform(-2, 2, (2, 3, 4, 5))
    want, = freq.backward(np.ones_like(x), x)
    got, = freq.backward(np.ones(dy_shape), x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ out= and in place

@pytest.mark.parametrize("op_name", GAN_OPS)
def test_out_in_other_layout_and_in_place(op_name):
    op = opkit.get(op_name)
    rng = np.random.default_rng(17)
    inputs, attrs = _large_inputs(rng, op, np.float32, layout="NCHW")
    inputs["x"] = inputs["x"][:, :, :9, :7].copy()                     # (2, 8, 9, 7) NCHW
    if op_name == "spatial_leaky_relu":
        inputs["alpha_map"] = rng.uniform(0, 1, (2, 1, 9, 7)).astype(np.float32)
    want = op(**inputs, **attrs, layout="NCHW")
    buf = np.full((2, 9, 7, 8), 7.0, np.float32)                        # NHWC memory
    out = buf.transpose(0, 3, 1, 2)
    assert op(**inputs, **attrs, layout="NCHW", out=out) is out
    np.testing.assert_array_equal(out, want)
    x = inputs["x"].copy()
    r = op(**{**inputs, "x": x}, **attrs, layout="NCHW", out=x)          # in place (or copied first)
    assert r is x
    np.testing.assert_array_equal(x, want)


# ------------------------------------------------------------------------------ bad input

X_NCHW = np.linspace(-2, 2, 2 * 3 * 5 * 7).reshape(2, 3, 5, 7)          # N=2, C=3, H=5, W=7
X_NHWC = np.ascontiguousarray(X_NCHW.transpose(0, 2, 3, 1))             # (2, 5, 7, 3)
Z, W, B = np.ones((2, 4)), np.ones((4, 3)), np.ones(3)


def _bad_calls():
    """(exception, pattern, op name, args, kwargs): each message names the argument and says what
    was expected and what was given."""
    sp, cd, fq, fb = GAN_OPS
    return [
        # spatial: a map that does not broadcast to x
        (ValueError, r"alpha_map \(shape \(2, 5, 7, 2\)\) has size 2 along dim C but x "
                     r"\(shape \(2, 5, 7, 3\)\) has size 3", sp, (X_NHWC, np.ones((2, 5, 7, 2))),
         {"layout": "NHWC"}),
        (ValueError, r"alpha_map \(shape \(2, 5, 7, 2\)\) has size 2 .* x \(shape \(2, 5, 7, 3\)\) has "
                     r"size 3", sp, (X_NHWC, np.ones((2, 5, 7, 2))), {}),
        (ValueError, r"alpha_map \(shape \(7, 5\)\) has size 7 along dim H but x \(shape "
                     r"\(2, 3, 5, 7\)\) has size 5", sp, (X_NCHW, np.ones((7, 5))), {"layout": "NCHW"}),
        (ValueError, r"alpha_map has 5 dims but layout NHWC has 4; it must broadcast to \[N, H, W, C\]",
         sp, (X_NHWC, np.ones((1, 2, 5, 7, 3))), {"layout": "NHWC"}),
        (ValueError, r"alpha_map \(shape \(2, 2, 5, 7, 3\)\) does not broadcast to x \(shape "
                     r"\(2, 5, 7, 3\)\): it has more dims", sp, (X_NHWC, np.ones((2, 2, 5, 7, 3))), {}),
        # conditional: K of z and w, C of w and b against x's channel count
        (ValueError, r"w \(shape \(5, 3\)\) has size 5 along dim K but z \(shape \(2, 4\)\) has size 4",
         cd, (X_NCHW, Z, np.ones((5, 3)), B), {}),
        (ValueError, r"w \(shape \(4, 7\)\) has size 7 along dim C but x \(shape \(2, 3, 5, 7\)\) has "
                     r"size 3", cd, (X_NCHW, Z, np.ones((4, 7)), B), {}),
        (ValueError, r"w \(shape \(4, 3\)\) has size 3 along dim C but x \(shape \(2, 3, 5, 7\)\) has "
                     r"size 7", cd, (X_NCHW, Z, W, B), {"layout": "NHWC"}),
        (ValueError, r"b \(shape \(4,\)\) has size 4 along dim C but x .* has size 3", cd,
         (X_NCHW, Z, W, np.ones(4)), {}),
        (ValueError, r"z \(shape \(3, 4\)\) has size 3 along dim N but x .* has size 2", cd,
         (X_NCHW, np.ones((3, 4)), W, B), {}),
        (ValueError, r"z must have 2 dims \[N, K\], got shape \(4,\)", cd, (X_NCHW, np.ones(4), W, B), {}),
        (ValueError, r"b must have 1 dims \[C\], got shape \(1, 3\)", cd, (X_NCHW, Z, W, np.ones((1, 3))), {}),
        # fused bias: the layout decides which axis is C
        (ValueError, r"bias \(shape \(7,\)\) has size 7 along dim C but x \(shape \(2, 3, 5, 7\)\) has "
                     r"size 3", fb, (X_NCHW, np.ones(7)), {"layout": "NCHW"}),
        (ValueError, r"bias \(shape \(3,\)\) has size 3 along dim C but x \(shape \(2, 3, 5, 7\)\) has "
                     r"size 7", fb, (X_NCHW, np.ones(3)), {"layout": "NHWC"}),
        (ValueError, r"bias \(shape \(5,\)\) has size 5 along dim C but x \(shape \(2, 5, 7, 3\)\) has "
                     r"size 3", fb, (X_NHWC, np.ones(5)), {"layout": "NHWC"}),
        # attrs
        (ValueError, r"freq_leaky_relu(\.backward)?\(\): up must be in \[1, 16\], got 0", fq, (X_NCHW,), {"up": 0}),
        (ValueError, r"up must be in \[1, 16\], got -1", fq, (X_NCHW,), {"up": -1}),
        (ValueError, r"up must be in \[1, 16\], got 17", fq, (X_NCHW,), {"up": 17}),
        (TypeError, r"up must be an integer, got 2\.5", fq, (X_NCHW,), {"up": 2.5}),
        (ValueError, r"clamp must be in \(0\.0, inf\], got 0\.0", fb, (X_NCHW, B), {"clamp": 0}),
        (ValueError, r"clamp must be in \(0\.0, inf\], got -1\.0", fb, (X_NCHW, B), {"clamp": -1}),
        (ValueError, r"alpha must be in \[0\.0, 1\.0\], got 1\.5", fq, (X_NCHW,), {"alpha": 1.5}),
        (ValueError, r"gain must be in \[0\.0, inf\), got -1\.0", fb, (X_NCHW, B), {"gain": -1.0}),
        (ValueError, r"alpha_max must be in \[0\.0, 1\.0\], got 2\.0", cd, (X_NCHW, Z, W, B), {"alpha_max": 2.0}),
        # layouts
        (ValueError, r"layout NCHW needs x with 4 dims \[N, C, H, W\], got shape \(3, 5, 7\)", sp,
         (X_NCHW[0], np.ones(1)), {"layout": "NCHW"}),
        (ValueError, r"layout NCHW needs x with 4 dims \[N, C, H, W\], got shape \(3, 5, 7\)", cd,
         (X_NCHW[0], Z, W, B), {}),
        (ValueError, r"layout NCHW needs x with 4 dims \[N, C, H, W\], got shape \(3, 5, 7\)", fq,
         (X_NCHW[0],), {}),
        (ValueError, r"layout NCHW needs x with 4 dims \[N, C, H, W\], got shape \(3, 5, 7\)", fb,
         (X_NCHW[0], B), {"layout": "NCHW"}),
        (ValueError, r"layout must be 'ND', 'NCHW' or 'NHWC', got 'NCWH'", sp, (X_NCHW, np.ones(1)),
         {"layout": "NCWH"}),
        (ValueError, r"layout must be 'NCHW' or 'NHWC', got 'nchw'", fq, (X_NCHW,), {"layout": "nchw"}),
        (ValueError, r"layout must be 'NCHW' or 'NHWC', got 'ND'", fb, (X_NCHW, B), {"layout": "ND"}),
        (ValueError, r"layout must be 'NCHW' or 'NHWC', got 'CHWN'", cd, (X_NCHW, Z, W, B), {"layout": "CHWN"}),
        # dtypes
        (TypeError, r"x must be an array of float16, float32 or float64, got dtype int32", sp,
         (X_NCHW.astype(np.int32), np.ones(1)), {}),
        (TypeError, r"alpha_map must be an array of float16, float32 or float64, got dtype int64", sp,
         (X_NCHW, np.ones(1, np.int64)), {}),
        (TypeError, r"z must be an array of float16, float32 or float64, got dtype int64", cd,
         (X_NCHW, Z.astype(np.int64), W, B), {}),
        (TypeError, r"x must be an array of float16, float32 or float64, got dtype int16", fq,
         (X_NCHW.astype(np.int16),), {}),
        (TypeError, r"bias must be an array of float16, float32 or float64, got dtype int32", fb,
         (X_NCHW, B.astype(np.int32)), {}),
        (TypeError, r"x must be an array of float16, float32 or float64, got dtype uint8", fb,
         (X_NCHW.astype(np.uint8), B), {}),
    ]


BAD = _bad_calls()


@pytest.mark.parametrize("exc,pattern,op_name,args,kwargs", BAD,
                         ids=[f"{b[2].split('_')[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_rejected_and_nothing_is_written(exc, pattern, op_name, args, kwargs):
    op = opkit.get(op_name)
    raises(exc, pattern, op, *args, **kwargs)
    x = args[0]
    out = np.full(x.shape, 7.0, np.float64)
    raises(exc, pattern, op, *args, **kwargs, out=out)
    assert np.all(out == 7.0)                 # a rejected call writes nothing to out=
    # the backward rejects the same call the same way
    raises(exc, pattern, op.backward, np.ones(x.shape), *args, **kwargs)


def test_bias_layout_decides_the_channel_axis(fused):
    """The same (2, 3, 5, 7) array: C = 3 under NCHW, C = 7 under NHWC."""
    y1 = fused(X_NCHW, np.arange(3.0), layout="NCHW")
    y2 = fused(X_NCHW, np.arange(7.0), layout="NHWC")
    assert_close(y1, fused_ref(X_NCHW, np.arange(3.0), layout="NCHW"), np.float64, "NCHW")
    assert_close(y2, fused_ref(X_NCHW, np.arange(7.0), layout="NHWC"), np.float64, "NHWC")


def test_spatial_alpha_map_with_more_dims_than_x_under_nd(spatial):
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    with pytest.raises(ValueError):
        np.broadcast_to(np.ones((1, 2, 3)), x.shape)
    raises(ValueError, r"alpha_map.*\(1, 2, 3\)", spatial, x, np.full((1, 2, 3), 0.5))


@pytest.mark.parametrize("which", ["fused bias", "conditional b", "conditional w"])
def test_length_one_channel_vectors_are_rejected(fused, cond, which):
    if which == "fused bias":
        raises(ValueError, r"bias \(shape \(1,\)\).*3", fused, X_NCHW, np.ones(1))
    elif which == "conditional b":
        raises(ValueError, r"b \(shape \(1,\)\).*3", cond, X_NCHW, Z, W, np.ones(1))
    else:
        raises(ValueError, r"w \(shape \(4, 1\)\).*3", cond, X_NCHW, Z, np.ones((4, 1)), B)


# ------------------------------------------------------------------------------ opkit's own validation

@pytest.mark.parametrize("op_name", GAN_OPS)
def test_validate_op(op_name):
    report = validate_op(opkit.get(op_name))
    assert report.ok, report.format()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conditional_float16_streams_past_its_float_slopes(cond, layout):
    """A large float16 call: its slopes are a float temp (the compute type), which the float16
    loops read as floats, and given outputs after a head of elements are streamed; the same
    bits for any thread count, and right."""
    rng = np.random.default_rng(12)
    dims = (2, 16, 256, 260)                       # past OPK_STREAM_MIN (2 Mi elements)
    shape = physical(dims, layout)
    x, dy = (rng.uniform(-3, 3, shape).astype(np.float16) for _ in range(2))
    z, w = rng.standard_normal((2, 4)).astype(np.float16), rng.standard_normal((4, 16)).astype(np.float16)
    b = rng.standard_normal(16).astype(np.float16)
    results = []
    for threads, k in ((1, 0), (2, 5)):
        y = np.empty(x.size + 64, np.float16)[k:k + x.size].reshape(shape)
        dx = np.empty(x.size + 64, np.float16)[k + 3:k + 3 + x.size].reshape(shape)
        with opkit.config(num_threads=threads):
            cond(x, z, w, b, layout=layout, out=y)
            grads = cond.backward(dy, x, z, w, b, layout=layout, out=(dx, None, None, None))
        results.append((y, *grads))
    for got, want in zip(results[1], results[0]):
        assert np.array_equal(got, want)
    assert_close(results[0][0], cond_ref(x, z, w, b, layout=layout), np.float16, "y")
    for label, g, r in zip(("dx", "dz", "dw", "db"), results[0][1:], cond_grad_ref(dy, x, z, w, b, layout=layout)):
        assert_close(g, r, np.float16, label)
