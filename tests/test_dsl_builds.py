"""Declarations the documentation allows, built and run: forms that once parsed and checked but
generated code that did not compile, or calls that raised or warned where the docs promise a
result. NumPy is the reference."""
import warnings

import numpy as np
import pytest

import opkit

from conftest import write_op

# One operator for the forms that can share a module: a finfo default that reaches the
# kernel's argument parsing, conditions on a per-channel input joined with & / and, and an
# output computed from the per-channel input alone (the broadcast shape of all inputs).
SHARED = """\
name: dsl_builds_shared
inputs:
  x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}
  c: {dtypes: [float32, float64], shape: [C]}
attrs:
  lo: {type: float, default: finfo.min}
outputs:
  clamped: {like: x}
  both: {like: x}
  either: {like: x}
  chan: {}
forward:
  clamped: clamp(x, lo, 1.0)
  both: "where((c > 0) & (x > 0), x, 0)"
  either: "x if c > 0 or not x > 0 else 2 * x"
  chan: c * 2
"""

# a finfo default on the direct path (one layout-agnostic kernel, attrs parsed in Cython)
DIRECT = """\
name: dsl_builds_direct
inputs:
  x: {dtypes: [float32, float64]}
attrs:
  lo: {type: float, default: finfo.min}
outputs:
  y: {like: x}
forward:
  y: clamp(x, lo, 1.0)
"""

# `x ** 0` is 1: a kernel with no float temporaries at all
POWER_ZERO = """\
name: dsl_builds_power_zero
inputs:
  x: {dtypes: [float32, float64]}
outputs:
  y: {like: x}
forward:
  y: x ** 0
"""

# a float32 gradient summed over a broadcast input past float32's range
SUMS = """\
name: dsl_builds_sums
inputs:
  x: {dtypes: [float32], layouts: [NCHW, NHWC]}
  s: {dtypes: [float32]}
  c: {dtypes: [float32], shape: [C]}
outputs:
  y: {like: x}
forward:
  y: x * s * c
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsl_builds")
    for i, text in enumerate((SHARED, DIRECT, POWER_ZERO, SUMS)):
        write_op(folder, text, f"op{i}.yaml")
    opkit.load(str(folder))
    return opkit.ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_finfo_default_and_per_channel_conditions(ops, dtype, layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3)).astype(dtype)
    x.flat[:4] = [0.0, -0.0, 3.0, -np.finfo(dtype).max]
    c = np.array([1.0, -1.0, 0.0], dtype)
    cb = c.reshape((1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # opkit's calls warn of nothing
        clamped, both, either, chan = ops.dsl_builds_shared(x, c, layout=layout)
        clipped = ops.dsl_builds_shared(x, c, lo=-0.5, layout=layout)[0]
        dx, dc = ops.dsl_builds_shared.backward((np.ones_like(x),) * 4, x, c, layout=layout)
    np.testing.assert_array_equal(clamped, np.minimum(x, 1.0))   # lo: the dtype's lowest
    np.testing.assert_array_equal(both, np.where((cb > 0) & (x > 0), x, 0))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(either, np.where((cb > 0) | ~(x > 0), x, 2 * x))
    np.testing.assert_array_equal(clipped, np.clip(x, -0.5, 1.0))
    np.testing.assert_array_equal(chan, np.broadcast_to(cb * 2, x.shape))
    assert dc.shape == c.shape
    np.testing.assert_array_equal(dc, np.full(3, 2.0 * x.size / 3))  # only `chan` sends c a gradient
    want = ((x <= 1.0) & (x >= np.finfo(dtype).min)).astype(float) + ((cb > 0) & (x > 0)) \
        + np.where((cb > 0) | ~(x > 0), 1.0, 2.0)
    np.testing.assert_array_equal(dx, want.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finfo_default_on_the_direct_path(ops, dtype):
    lowest = np.finfo(dtype).min
    x = np.array([lowest, -3.0, 0.5, 2.0, np.inf, -np.inf], dtype)
    np.testing.assert_array_equal(ops.dsl_builds_direct(x), np.clip(x, lowest, 1.0))
    np.testing.assert_array_equal(ops.dsl_builds_direct(x, lo=-1.0), np.clip(x, -1.0, 1.0))
    dx, = ops.dsl_builds_direct.backward(np.ones_like(x), x)
    np.testing.assert_array_equal(dx, [1, 1, 1, 0, 0, 0])  # both bounds included


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_power_zero_is_one(ops, dtype):
    x = np.array([[-2.0, 0.0, np.inf], [np.nan, 1e-30, 5.0]], dtype)
    np.testing.assert_array_equal(ops.dsl_builds_power_zero(x), np.ones_like(x))  # NumPy: 0**0 = nan**0 = 1
    dx, = ops.dsl_builds_power_zero.backward(np.ones_like(x), x)
    np.testing.assert_array_equal(dx, np.zeros_like(x))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_gradient_summed_past_float32s_range_is_inf_without_a_warning(ops, layout):
    x = np.full((2, 3, 4, 5), 1e38, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 sums cast to float32: no overflow warning leaks
        _, ds, dc = ops.dsl_builds_sums.backward(np.ones_like(x), x, np.float32(1),
                                                 np.ones(x.shape[1 if layout == "NCHW" else 3], np.float32),
                                                 layout=layout)
    assert ds == np.inf and ds.dtype == np.float32 and np.all(dc == np.inf)
