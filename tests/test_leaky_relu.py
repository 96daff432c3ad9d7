"""leaky_relu, compiled, against NumPy: every dtype, layout, stride pattern and size class."""
import numpy as np
import pytest

import opkit
from conftest import checked_calls

DTYPES = [np.float16, np.float32, np.float64]
ND_SHAPES = [(), (0,), (1,), (37,), (1023,), (1024,), (1025,), (32767,), (32768,), (32769,),
             (3, 0, 5), (7, 11), (2, 3, 5, 7), (100003,)]
VIEWS = ["c", "fortran", "perm", "neg", "step", "bcast"]


@pytest.fixture(scope="module")
def op():
    return opkit.get("leaky_relu")


def compute_type(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def expected_forward(x, alpha):
    """The same arithmetic, written directly in NumPy: compare and select in the compute type
    (float16 is computed in float32), rounded once to the input's dtype."""
    ct = compute_type(x.dtype)
    xc = x.astype(ct)
    with np.errstate(invalid="ignore"):
        return np.where(xc > 0, xc, ct(alpha) * xc).astype(x.dtype)


def expected_backward(dy, x, alpha):
    ct = compute_type(x.dtype)
    xc, dyc = x.astype(ct), dy.astype(ct)
    return np.where(xc > 0, dyc, ct(alpha) * dyc).astype(x.dtype)


def make(shape, dtype, view, rng, special=True):
    """An array of `shape` with the given memory arrangement and the same values either way."""
    values = rng.uniform(-4, 4, size=shape)
    if special and values.size >= 8:
        flat = values.reshape(-1)
        flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    values = values.astype(dtype)
    if view == "c" or values.ndim == 0:
        return values
    if view == "fortran":
        return np.asfortranarray(values)
    if view == "perm":  # a transposed view: axes stored in another order
        perm = list(range(values.ndim))[::-1]
        return np.ascontiguousarray(values.transpose(perm)).transpose(np.argsort(perm))
    if view == "neg":
        rev = (slice(None, None, -1),) * values.ndim
        return np.ascontiguousarray(values[rev])[rev]
    if view == "step":
        big = np.zeros(values.shape[:-1] + (2 * values.shape[-1],), dtype)
        big[..., ::2] = values
        return big[..., ::2]
    if view == "bcast":  # stride-0 along the first axis, read-only
        return np.broadcast_to(values[:1], values.shape) if values.shape[0] else values
    raise AssertionError(view)


def same(a, b):
    np.testing.assert_array_equal(a, b)
    assert a.dtype == b.dtype and a.shape == b.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", ND_SHAPES, ids=str)
def test_forward_backward_nd_grid(op, dtype, shape):
    rng = np.random.default_rng(hash(shape) % 2**32)
    for view in VIEWS:
        x = make(shape, dtype, view, rng)
        for alpha in (0.2, 0.0, 1.0):
            y = op(x, alpha=alpha)
            same(y, expected_forward(x, alpha))
        dy = make(shape, dtype, "c", rng, special=False)
        dx, = op.backward(dy, x, alpha=0.1)
        same(dx, expected_backward(dy, x, 0.1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dims", [(2, 3, 5, 7), (1, 1, 1, 1), (0, 3, 2, 2), (2, 64, 17, 19)], ids=str)
def test_4d_layouts(op, dtype, layout, dims):
    rng = np.random.default_rng(7)
    n, c, h, w = dims
    physical = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    for view in ("c", "neg", "step"):
        x = make(physical, dtype, view, rng)
        same(op(x, alpha=0.3, layout=layout), expected_forward(x, 0.3))
        dy = make(physical, dtype, "c", rng, special=False)
        dx, = op.backward(dy, x, alpha=0.3, layout=layout)
        same(dx, expected_backward(dy, x, 0.3))
    # an NHWC view of NCHW memory (and the other way round) gives the same values
    x = make((n, c, h, w), dtype, "c", rng)
    view = x.transpose(0, 2, 3, 1) if layout == "NHWC" else x
    same(op(view, layout=layout), expected_forward(view, 0.2))


def test_against_float64_reference_within_standard(op):
    """Independent of the compute-type arithmetic: CANN's precision standard per dtype."""
    rng = np.random.default_rng(3)
    x64 = rng.uniform(-10, 10, 4099)
    for dtype, tol in ((np.float16, 1e-3), (np.float32, 1e-4), (np.float64, 1e-12)):
        x = x64.astype(dtype)
        ref = np.where(x.astype(np.float64) > 0, x.astype(np.float64), 0.2 * x.astype(np.float64))
        err = np.abs(op(x).astype(np.float64) - ref)
        assert np.all(err <= tol + tol * np.abs(ref)), (dtype, err.max())


def test_special_values(op):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 5e-324], np.float64)
    y = op(x, alpha=0.5)
    assert y[0] == 0 and not np.signbit(y[0])
    assert y[1] == 0 and np.signbit(y[1])          # alpha * -0.0 keeps the sign
    assert y[2] == np.inf and y[3] == -np.inf and np.isnan(y[4])
    assert y[5] == -0.5 and y[6] == 5e-324
    assert np.isnan(op(np.array([-np.inf]), alpha=0.0))[0]  # 0 * -inf, as the formula says
    dx, = op.backward(np.ones(3), np.array([0.0, 1e-300, -1e-300]), alpha=0.25)
    np.testing.assert_array_equal(dx, [0.25, 1.0, 0.25])  # x == 0 takes the alpha branch


def test_output_keeps_memory_order(op):
    x = np.random.default_rng(0).standard_normal((6, 5, 4)).astype(np.float32)
    t = x.transpose(2, 0, 1)
    y = op(t)
    assert np.argsort(y.strides).tolist() == np.argsort(t.strides).tolist()
    assert y.flags.c_contiguous is False and y.base is None
    f = np.asfortranarray(x)
    assert op(f).flags.f_contiguous


def test_out_same_and_converted_layout(op):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 64, 17, 19)).astype(np.float32)
    buf = np.empty((2, 17, 19, 64), np.float32)      # NHWC memory
    out = buf.transpose(0, 3, 1, 2)                  # its NCHW-ordered view
    r = op(x, alpha=0.1, out=out)
    assert r is out
    same(out, expected_forward(x, 0.1))
    same(buf, expected_forward(x, 0.1).transpose(0, 2, 3, 1))
    out2 = np.full_like(x, 7.0)
    assert op(x, out=out2) is out2
    same(out2, expected_forward(x, 0.2))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_in_place(op, dtype):
    x = np.random.default_rng(2).standard_normal(50000).astype(dtype)
    want = expected_forward(x, 0.2)
    r = op(x, out=x)
    assert r is x
    same(x, want)


def test_partially_overlapping_out_reads_the_original(op):
    buf = np.linspace(-3, 3, 41)
    x = buf[1:]
    want = expected_forward(x.copy(), 0.2)
    op(x, out=buf[:-1])
    same(buf[:-1], want)
    buf = np.linspace(-3, 3, 41)
    rev = buf[::-1]
    want = expected_forward(rev.copy(), 0.2)
    op(rev, out=buf)                     # same memory, reversed order: not an in-place pattern
    same(buf, want)


def test_unaligned_arrays(op):
    n = 1001
    raw = np.zeros(4 * n + 1, np.uint8)
    x = raw[1:].view(np.float32)
    x[:] = np.random.default_rng(5).standard_normal(n)
    assert not x.flags.aligned
    want = expected_forward(x.copy(), 0.2)
    same(op(x), want)
    out_raw = np.zeros(4 * n + 1, np.uint8)
    out = out_raw[1:].view(np.float32)
    assert op(x, out=out) is out
    same(out, want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("threads", [1, 2])
def test_long_runs_into_out_stream_exactly(op, dtype, threads):
    """Runs of 2**21 elements or more written into out= go out with non-temporal stores (from
    an unaligned start: the head up to a cache line is stored plainly)."""
    n = (1 << 22) + 37
    x = np.random.default_rng(7).standard_normal(n + 3).astype(dtype)[3:]  # not line-aligned
    buf = np.full(n + 5, 9, dtype)
    out = buf[5:]
    with opkit.config(num_threads=threads):
        assert op(x, alpha=0.3, out=out) is out
    same(out, expected_forward(x, 0.3))
    assert (buf[:5] == 9).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [32767, 32768, 32769, 1 << 20 | 13])
def test_thread_count_does_not_change_results(op, dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    dy = rng.standard_normal(n).astype(dtype)
    with opkit.config(num_threads=1):
        y1 = op(x)
        d1, = op.backward(dy, x)
    with opkit.config(num_threads=2):
        y2 = op(x)
        d2, = op.backward(dy, x)
    assert y1.tobytes() == y2.tobytes() and d1.tobytes() == d2.tobytes()
    same(y2, expected_forward(x, 0.2))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_portable_build_matches_native(op, dtype):
    """The portable fallback (no F16C / AVX-512) gives bit-identical results."""
    rng = np.random.default_rng(11)
    x = make((3, 1037), dtype, "step", rng)
    native = op(x)
    with opkit.config(isa="portable"):
        portable = op(x)
        assert op.module().F16_HARDWARE is False
    assert native.tobytes() == portable.tobytes()
    same(portable, expected_forward(x, 0.2))


def test_mixed_dtype_gradient_takes_input_dtype(op):
    x = np.ones(10, np.float16)
    dy = np.linspace(-1, 1, 10).astype(np.float32)
    dx, = op.backward(dy, x)
    assert dx.dtype == np.float16
    same(dx, dy.astype(np.float16))


def test_plain_calls_take_the_direct_path(op, monkeypatch):
    """Contiguous same-shape arrays never reach the Python argument checks; others do, and both
    give the same bits."""
    x = np.random.default_rng(4).standard_normal((33, 65)).astype(np.float32)
    op(x)  # the first call of a process loads (or builds) the module
    slow_calls = checked_calls(op, monkeypatch)
    fast = op(x, alpha=0.3)
    out = np.empty_like(x)
    assert op(x, 0.3, out=out) is out
    y = x.copy()
    assert op(y, alpha=0.3, out=y) is y          # in place, as schedule.inplace allows
    named = op(x=x, alpha=0.3)                    # the input by keyword
    assert slow_calls == []
    slow = op(x.T.copy().T, alpha=0.3)            # Fortran order: the checked path
    wide = op(x, alpha=np.float32(0.3))           # a NumPy scalar attr: the checked path
    assert len(slow_calls) == 2
    for other in (out, y, named, slow, wide):
        assert other.tobytes() == fast.tobytes() or np.array_equal(other, fast)
    same(fast, expected_forward(x, 0.3))
