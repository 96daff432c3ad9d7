"""Bad calls: a clear error naming the argument, what was expected and what was given; nothing written."""
import re

import numpy as np
import pytest

import opkit


@pytest.fixture(scope="module")
def op():
    return opkit.get("leaky_relu")


x32 = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


def raises(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert re.search(pattern, str(info.value)), str(info.value)
    return info.value


def test_dtype_errors(op):
    raises(TypeError, r"leaky_relu\(\): x must be an array of float16, float32, float64, int8, int16 "
           r"or int32, got dtype int64", op, np.arange(4, dtype=np.int64))
    raises(TypeError, r"x must be an array of .*got dtype complex128", op, np.ones(3, complex))
    raises(TypeError, r"x must be an array of .*got str", op, "abc")
    raises(TypeError, r"x must be an array of .*got NoneType", op, None)
    raises(TypeError, r"convert it with \.astype", op, np.ones(3, np.uint8))
    sp = opkit.get("spatial_leaky_relu")
    raises(TypeError, r"x must be an array of float16, float32 or float64, got dtype int8",
           sp, np.ones(3, np.int8), np.ones(3, np.int8))


def test_python_sequences_are_accepted(op):
    np.testing.assert_allclose(op([-1.0, 2.0]), [-0.2, 2.0])
    assert op(-5.0).shape == ()


def test_attr_errors(op):
    raises(ValueError, r"alpha must be in \[0\.0, 1\.0\], got 1\.5", op, x32, alpha=1.5)
    raises(ValueError, r"alpha must be in \[0\.0, 1\.0\], got -0\.1", op, x32, alpha=-0.1)
    raises(TypeError, r"alpha must be a float, got str 'big'", op, x32, alpha="big")
    raises(TypeError, r"alpha must be a float, got bool", op, x32, alpha=True)
    raises(TypeError, r"alpha must be a float, got None", op, x32, alpha=None)
    raises(ValueError, r"alpha must be in .* got nan", op, x32, alpha=float("nan"))
    # an integer past what a float64 holds: the attr's name, not an OverflowError
    raises(ValueError, r"leaky_relu\(\): alpha must be a float of magnitude at most 1\.8e308 .*"
           r"got an integer of 1031 bits", op, x32, alpha=2 ** 1030)
    raises(ValueError, r"alpha must be in \[0\.0, 1\.0\], got 1\.152921504606847e\+18",
           op, x32, alpha=2 ** 60)
    conv = opkit.get("conv2d_bias_leaky_relu")
    w = np.ones((1, 1, 1, 1), np.float32)
    raises(ValueError, r"stride must be an integer of magnitude at most 2\*\*53, got an integer of 71 bits",
           conv, np.ones((1, 1, 2, 2), np.float32), w, np.ones(1, np.float32), stride=2 ** 70)
    assert op(x32, alpha=np.float32(0.5)).dtype == np.float32
    assert op(x32, 0.5)[0, 0] == np.float32(-1.0)  # attrs may also be given by position


def test_argument_binding_errors(op):
    raises(TypeError, r"unexpected keyword argument 'alpah'; did you mean 'alpha'\?", op, x32, alpah=0.1)
    raises(TypeError, r"missing the argument 'x'", op)
    raises(TypeError, r"takes at most 2 positional arguments \(x, alpha\), got 3", op, x32, 0.1, 0.2)
    raises(TypeError, r"got argument 'alpha' twice", op, x32, 0.1, alpha=0.2)


def test_layout_errors(op):
    raises(ValueError, r"layout must be 'ND', 'NCHW' or 'NHWC', got 'NCWH'", op, x32, layout="NCWH")
    raises(ValueError, r"layout NHWC needs x with 4 dims \[N, H, W, C\], got shape \(3, 4\)",
           op, x32, layout="NHWC")


def test_out_errors_write_nothing(op):
    out = np.full((3, 4), 9.0, np.float32)
    raises(TypeError, r"out must have dtype float32 \(the result's dtype\), got float64",
           op, x32, out=np.zeros((3, 4)))
    raises(ValueError, r"out must have shape \(3, 4\), got \(4, 3\)", op, x32, out=np.zeros((4, 3), np.float32))
    raises(TypeError, r"out must be a NumPy array, got list", op, x32, out=[0.0] * 12)
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    raises(ValueError, r"out is read-only", op, x32, out=ro)
    raises(ValueError, r"alpha must be in", op, x32, alpha=2.0, out=out)
    assert np.all(out == 9.0)  # a rejected call writes nothing
    raises(ValueError, r"out must hold 1 array\(s\), got 2", op, x32, out=(out, out))


def test_backward_errors(op):
    raises(ValueError, r"dy \(shape \(5,\)\) must have the shape of output y \(3, 4\)",
           op.backward, np.ones(5, np.float32), x32)
    raises(TypeError, r"dy must be an array of .*got dtype int64", op.backward, np.ones((3, 4), int), x32)
    raises(ValueError, r"expected 1 output gradient\(s\), got 2", op.backward, (x32, x32), x32)
    raises(ValueError, r"alpha must be in", op.backward, x32, x32, alpha=3.0)
    # a scalar gradient broadcasts to the output's shape
    dx, = op.backward(np.float32(1.0), x32)
    np.testing.assert_array_equal(dx, np.where(x32 > 0, 1.0, np.float32(0.2)).astype(np.float32))


def test_unknown_operator():
    e = raises(KeyError, r"no operator named 'leaky_rel'; did you mean 'leaky_relu'", opkit.get, "leaky_rel")
    assert "opkit.list_ops()" in str(e)
    with pytest.raises(AttributeError, match="leaky_relu"):
        opkit.ops.leaky_rlu


def test_a_kernel_entry_refusing_its_attrs_names_the_operator_and_the_values():
    """The kernels' own check (opk_fits), behind the checked call's: called directly, an entry
    given an attr float32 cannot hold names the operator, the kernel, the attr and its value."""
    mod = opkit.get("leaky_relu").module()
    with pytest.raises(ValueError, match=r"leaky_relu \(kernel fwd0\): alpha=1e\+39, .*does not fit float"):
        mod.fwd0_f(np.zeros(1, np.intp), (), 1e39, 1)
