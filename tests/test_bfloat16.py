"""bfloat16 where ml_dtypes (the NumPy dtype package of JAX and TensorFlow) is installed: computed
in float32 and rounded once, like float16."""
import numpy as np
import pytest

import opkit
from opkit.validate import validate_op

from conftest import declaration, write_op

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
TYPES = "{dtypes: [float16, float32, float64, bfloat16]}"


@pytest.fixture(scope="module")
def elu(tmp_path_factory):
    text = declaration("where(x > 0, x, w * expm1(x))", inputs=(("x", TYPES), ("w", TYPES)),
                       name="elu_bf16")
    opkit.load(write_op(tmp_path_factory.mktemp("bf16"), text))
    return opkit.get("elu_bf16")


def reference(x, w):
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    return np.where(x > 0, x, w * np.expm1(x))


def test_forward_is_float32_rounded_once_to_bfloat16(elu):
    x = np.array([-1000, -2, -0.5, -0.0, 0, 1e-30, 1.5, 3.25, 3e38, np.nan, np.inf, -np.inf],
                 dtype=BF16)
    w = np.array(0.7, dtype=BF16)
    with np.errstate(all="ignore"):
        want = reference(x, w).astype(BF16)
    for call in (lambda: elu(x, w), lambda: elu(x, w, layout="ND")):
        y = call()
        assert y.dtype == BF16
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))  # bit for bit


def test_backward_and_the_reduced_gradient(elu):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (7, 9)).astype(BF16)
    w = np.full((1, 9), 0.5, BF16)
    dy = rng.uniform(-1, 1, (7, 9)).astype(BF16)
    dx, dw = elu.backward(dy, x, w)
    assert dx.dtype == dw.dtype == BF16 and dw.shape == (1, 9)
    x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
    want_dx = (dy32 * np.where(x32 > 0, 1, 0.5 * np.exp(x32))).astype(BF16)
    np.testing.assert_array_equal(dx.view(np.uint16), want_dx.view(np.uint16))
    want_dw = (dy32 * np.where(x32 > 0, 0, np.expm1(x32))).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(dw.astype(np.float32), want_dw, rtol=8e-3)


def test_mixed_with_float32_and_in_place(elu):
    x = np.linspace(-2, 2, 9).astype(BF16)
    y = elu(x, np.float32(0.25))
    assert y.dtype == np.float32  # NumPy's promotion (ml_dtypes): float32 wins
    np.testing.assert_allclose(y, reference(x, 0.25), rtol=1e-6)
    out = np.empty_like(x)
    assert elu(x, np.array(0.25, BF16), out=out) is out
    np.testing.assert_array_equal(out.view(np.uint16),
                                  reference(x, 0.25).astype(BF16).view(np.uint16))


def test_validation_covers_bfloat16(elu):
    report = validate_op(elu)
    assert report.ok, report.format()
    assert any(c.what == "forward bfloat16" and c.max_ulp == 0 for c in report.checks)
