"""The user-style operators in examples/user_ops, loaded and called without touching opkit."""
import numpy as np
import pytest

import opkit
from opkit.validate import validate_op

from conftest import EXAMPLES

TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}


@pytest.fixture(scope="module", autouse=True)
def loaded():
    assert opkit.load(EXAMPLES) == ["clipped_elu", "eq_conv_leaky_relu", "scaled_leaky_relu"]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_clipped_elu(dtype):
    op = opkit.get("clipped_elu")
    rng = np.random.default_rng(0)
    x = rng.uniform(-6, 9, (33, 17)).astype(dtype)
    x[0, :4] = [0.0, 6.0, -0.0, 100.0]
    x64 = x.astype(np.float64)
    alpha, cap = 0.7, 6.0
    want = np.where(x64 > 0, np.minimum(x64, cap), alpha * np.expm1(x64))
    np.testing.assert_allclose(op(x, alpha=alpha, cap=cap).astype(np.float64), want,
                               rtol=TOL[dtype], atol=TOL[dtype])
    dy = rng.uniform(-1, 1, x.shape).astype(dtype)
    dx, = op.backward(dy, x, alpha=alpha, cap=cap)
    # the derivative: 1 on (0, cap), 0 above cap, alpha * e^x below 0; at x == cap min() splits
    # the tie between x and cap, as PyTorch's minimum does
    slope = np.where(x64 > 0, np.where(x64 < cap, 1.0, np.where(x64 == cap, 0.5, 0.0)),
                     alpha * np.exp(x64))
    np.testing.assert_allclose(dx.astype(np.float64), dy.astype(np.float64) * slope,
                               rtol=TOL[dtype], atol=TOL[dtype])
    assert dx.dtype == dtype


@pytest.mark.parametrize("gain_shape", [(4, 5), (1, 5), (5,), (4, 1), ()], ids=str)
def test_scaled_leaky_relu_broadcast_gain(gain_shape):
    op = opkit.get("scaled_leaky_relu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5))
    gain = rng.uniform(0.5, 2.0, gain_shape)
    act = np.where(x > 0, x, 0.3 * x)
    np.testing.assert_allclose(op(x, gain, alpha=0.3), gain * act, rtol=1e-14)
    dy = rng.standard_normal((4, 5))
    dx, dgain = op.backward(dy, x, gain, alpha=0.3)
    np.testing.assert_allclose(dx, dy * gain * np.where(x > 0, 1.0, 0.3), rtol=1e-14)
    assert dgain.shape == gain.shape
    np.testing.assert_allclose(dgain, reduce_to(dy * act, gain_shape), rtol=1e-12)


def reduce_to(full, shape):
    """Sum a full-size gradient back to a broadcast operand's shape (NumPy's rules, reversed)."""
    out = full.sum(axis=tuple(range(full.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(axis=axes, keepdims=True) if axes else out


def test_scaled_leaky_relu_rejects_gain_that_grows_x():
    op = opkit.get("scaled_leaky_relu")
    with pytest.raises(ValueError, match=r"gain \(shape \(3, 4, 5\)\) does not broadcast to x \(shape \(4, 5\)\)"):
        op(np.ones((4, 5)), np.ones((3, 4, 5)))


@pytest.mark.parametrize("name", ["clipped_elu", "scaled_leaky_relu"])
def test_examples_validate(name):
    report = validate_op(opkit.get(name))
    assert report.ok, report.format()
    assert {c.what for c in report.checks} >= {"forward float16", "backward float32", "gradcheck float64"}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_eq_conv_leaky_relu_is_one_fused_step(layout):
    """A user's own conv chain: fused (the file requires it) and equal to a direct NumPy sum."""
    op = opkit.get("eq_conv_leaky_relu")
    assert [type(s).__name__ for s in op.lowered().forward.steps] == ["Fused"]
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((5, 3, 3, 3)), rng.standard_normal(5)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    z = sum(np.einsum("nchw,fc->nfhw", xp[:, :, p:p + 7:2, q:q + 6:2], w[:, :, p, q])
            for p in range(3) for q in range(3)) * 0.25 + b[:, None, None]
    want = np.where(z > 0, z, 0.2 * z) * 1.5
    xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x
    y = op(xl, w, b, stride=2, scale=0.25, gain=1.5, layout=layout)
    y = y.transpose(0, 3, 1, 2) if layout == "NHWC" else y
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
