"""float16 storage: every half value loads exactly, and float32 values round to nearest even on
store, through the hardware conversion instructions and through the portable fallback."""
import numpy as np
import pytest

import opkit

ISAS = ["native", "portable"]


@pytest.fixture(scope="module")
def op():
    return opkit.get("leaky_relu")


@pytest.mark.parametrize("isa", ISAS)
def test_every_half_value_round_trips(op, isa):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16)
    with opkit.config(isa=isa):
        y = op(x, alpha=1.0)            # alpha = 1: y = x for every value
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(y), nan)
    assert np.array_equal(y.view(np.uint16)[~nan], bits[~nan])   # exact, signed zeros included


def _store_cases():
    rng = np.random.default_rng(0)
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = f16[np.isfinite(f16)].astype(np.float32)
    with np.errstate(over="ignore"):   # the spacing above 65504 is infinite
        spacing = np.spacing(np.abs(f16[np.isfinite(f16)])).astype(np.float32)
    ties = finite + spacing / 2           # exactly halfway: round to even
    near = finite + spacing * 0.49
    values = np.concatenate([
        finite, ties, near, -ties,
        np.float32([65504.0, 65519.996, 65520.0, 70000.0, -65520.0, 6.0e-8, 2.98e-8, 2.9802322e-08,
                    5.9604645e-08, 1e-10, -1e-10, 0.0, -0.0, np.inf, -np.inf, np.nan]),
        rng.standard_normal(100000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 100000),
    ]).astype(np.float32)
    return values


@pytest.mark.parametrize("isa", ISAS)
def test_float32_to_half_rounds_to_nearest_even(op, isa):
    """The backward of leaky_relu with x > 0 stores dy (float32) into dx (x's dtype, float16)."""
    dy = _store_cases()
    x = np.ones(dy.shape, np.float16)
    with opkit.config(isa=isa):
        dx, = op.backward(dy, x)
    with np.errstate(over="ignore"):
        want = dy.astype(np.float16)      # NumPy rounds to nearest even; beyond 65504 is inf
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(dx), nan)
    assert np.array_equal(dx.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("isa", ISAS)
def test_half_strided_and_converted_paths(op, isa):
    """Gathered (strided) float16 loads and scattered stores use the scalar conversions."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((64, 96)).astype(np.float16)
    view = base[::-1, ::3]
    with opkit.config(isa=isa):
        y = op(view, alpha=0.5)
        out = np.empty((96, 64), np.float16).T[:, ::3]
        op(view, alpha=0.5, out=out)
    want = np.where(view > 0, view, (np.float32(0.5) * view.astype(np.float32)).astype(np.float16))
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(out, want)
