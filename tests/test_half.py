"""float16 storage: every half value loads exactly, and float32 values round to nearest even on
store, through the hardware conversion instructions and through the portable fallback."""
import numpy as np
import pytest

import opkit
from opkit.target import runs_here

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


def _half_forward(x, alpha):
    """leaky_relu of float16 as the kernel computes it: in float32, rounded once on store."""
    xf = x.astype(np.float32)
    return np.where(xf > 0, xf, np.float32(alpha) * xf).astype(np.float16)


def _half_backward(dy, x, alpha, clip=None):
    xf, g = x.astype(np.float32), dy.astype(np.float32)
    dx = np.where(xf > 0, g, g * np.float32(alpha))
    if clip is not None:  # NaN stays NaN
        dx = np.where(dx < -clip, np.float32(-clip), np.where(dx > clip, np.float32(clip), dx))
    return dx.astype(np.float16)


def _assert_same_bits(got, want):
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def _aligned_at(n, offset):
    """A float16 array of n elements starting `offset` elements after a 64-byte line: its
    first whole line comes after a head of elements."""
    raw = np.zeros(2 * n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + 2 * offset
    return raw[start:start + 2 * n].view(np.float16)


# whole blocks of 64, the partial last one; calls that stream (OPK_STREAM_MIN, 2 Mi elements or
# more, into memory the caller gave) after a head, ending in a partial block
STREAM_MIN = 1 << 21
BLOCK_SIZES = [1, 63, 64, 65, 127, 128, 129, 1000]
STREAM_SIZES = [STREAM_MIN + 37, STREAM_MIN + 3 * 64]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", BLOCK_SIZES + STREAM_SIZES)
def test_half_blocks_and_streamed_runs_are_exact(op, isa, n):
    """Every float16 element loop path gives the float32 result rounded once: whole and partial
    blocks, outputs streamed from their first whole 64-byte line on (a head of 0, 1, 31 or 32
    elements before it), on one thread and two."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float16)
    dy = (rng.standard_normal(n) * 4).astype(np.float16)
    if n >= 5:
        x[:3] = [0.0, -0.0, np.nan]
        dy[-2:] = [np.inf, -np.inf]
    want_y, want_dx = _half_forward(x, 0.3), _half_backward(dy, x, 0.3)
    want_clipped = _half_backward(dy, x, 0.3, clip=0.5)
    for threads in (1, 2):
        with opkit.config(isa=isa, num_threads=threads):
            _assert_same_bits(op(x, alpha=0.3), want_y)
            _assert_same_bits(op.backward(dy, x, alpha=0.3)[0], want_dx)
            for offset in (0, 1, 31, 32):
                y, dx = _aligned_at(n, offset), _aligned_at(n, offset)
                op(x, alpha=0.3, out=y)
                _assert_same_bits(y, want_y)
                op.backward(dy, x, alpha=0.3, out=(dx,))
                _assert_same_bits(dx, want_dx)
                op.backward(dy, x, alpha=0.3, clip=0.5, out=(dx,))
                _assert_same_bits(dx, want_clipped)


@pytest.mark.parametrize("n", [65, STREAM_MIN + 37])
def test_half_outputs_on_odd_addresses(op, n):
    """An output that cannot be streamed (its elements are not 2-byte aligned) is written as is."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n).astype(np.float16)
    raw = np.zeros(2 * n + 1, np.uint8)
    y = np.frombuffer(raw.data, np.float16, n, offset=1)
    assert not y.flags.aligned
    op(x, alpha=0.3, out=y)
    _assert_same_bits(y, _half_forward(x, 0.3))


@pytest.mark.parametrize("n", [63, 64, 65, STREAM_MIN + 37])
def test_half_strided_inputs_into_a_streamed_output(op, n):
    """Non-contiguous float16 inputs are converted in tiles; the output still takes every value."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(3 * n).astype(np.float16)[::3]
    dy = rng.standard_normal((n, 2)).astype(np.float16)[:, 1]
    dx = _aligned_at(n, 5)
    op.backward(dy, x, alpha=0.3, out=(dx,))
    _assert_same_bits(dx, _half_backward(dy, x, 0.3))


@pytest.mark.parametrize("name", ["leaky_relu", "fused_bias_leaky_relu", "spatial_leaky_relu",
                                  "conditional_leaky_relu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float16_gradient_clip_is_the_clamp_of_every_gradient(name, layout):
    """backward(clip=c) in float16 is every unclipped gradient clamped to [-c, c] (NaN kept),
    bit for bit: for the gradients the float16 loops store and for those a folded sum adds up
    (clamped after the sum)."""
    op = opkit.get(name)
    rng = np.random.default_rng(3)
    shape = (2, 16, 45, 47) if layout == "NCHW" else (2, 45, 47, 16)
    x = rng.standard_normal(shape).astype(np.float16)
    dy = (rng.standard_normal(shape) * 3).astype(np.float16)
    x.flat[:3] = [0.0, np.nan, -0.0]
    extra = {"leaky_relu": (),
             "fused_bias_leaky_relu": (rng.standard_normal(16).astype(np.float16),),
             "spatial_leaky_relu": (rng.uniform(0.1, 0.3, shape[:1] + (1,) + shape[2:]
                                                if layout == "NCHW" else shape[:3] + (1,))
                                    .astype(np.float16),),
             "conditional_leaky_relu": (rng.standard_normal((2, 8)).astype(np.float16),
                                        rng.standard_normal((8, 16)).astype(np.float16),
                                        rng.standard_normal(16).astype(np.float16))}[name]
    for threads in (1, 2):
        with opkit.config(num_threads=threads):
            free = op.backward(dy, x, *extra, layout=layout)
            clipped = op.backward(dy, x, *extra, layout=layout, clip=0.75)
        for f, c in zip(free, clipped):
            assert np.any(np.abs(f) > 0.75)   # the data tells clipped from not
            want = np.clip(f, np.float16(-0.75), np.float16(0.75))
            _assert_same_bits(c, want)


def _bias_views(c, rng):
    """The same float16 bias three ways: contiguous, every other element of a longer array,
    and reversed (negative stride)."""
    b = (rng.standard_normal(c) * 2).astype(np.float16)
    every_other = np.zeros(2 * c, np.float16)
    every_other[::2] = b
    reversed_ = np.ascontiguousarray(b[::-1])[::-1]
    return b, [b, every_other[::2], reversed_]


@pytest.mark.parametrize("isa, layout, shape", [
    ("native", "NCHW", (2, 5, 33, 37)),        # the bias constant along each row of H x W
    ("native", "NHWC", (2, 33, 37, 5)),        # the bias row repeated on every pixel (groups)
    ("native", "NCHW", (1, 4, 600, 900)),      # long rows, into memory the call streams
    ("native", "NHWC", (1, 600, 900, 4)),      # a large call in groups of short rows
    ("native", "NHWC", (1, 200, 170, 64)),     # rows of one block: column sums in registers
    ("x86-64-v3", "NCHW", (1, 4, 600, 900)),   # AVX2: the writer and sums without AVX-512
    ("x86-64-v3", "NHWC", (1, 200, 170, 64)),
])
def test_a_float16_bias_along_the_run_is_read_as_float16(isa, layout, shape):
    """fused_bias_leaky_relu in float16 with its bias broadcast along the run (constant along
    NCHW's rows, repeated across NHWC's pixels): the float16 loops read it as float16, filled or
    spread from any stride. y and dx are NumPy's float32 computation rounded once, bit for bit;
    dbias is the float64 sum of the unrounded float32 gradients within float16's rounding; the
    strided and reversed biases give the contiguous one's bits, on one thread and two. The large
    calls stream their float16 results whole lines at a time from inside a line (NumPy's data
    starts 16 bytes into a page), and rows of 64 channels add dbias in registers."""
    if not runs_here(isa):
        pytest.skip(f"this CPU does not run {isa} builds")
    op = opkit.get("fused_bias_leaky_relu")
    rng = np.random.default_rng(7)
    c = shape[1] if layout == "NCHW" else shape[3]
    x = rng.standard_normal(shape).astype(np.float16)
    dy = (rng.standard_normal(shape) * 3).astype(np.float16)
    x.flat[:4] = [0.0, -0.0, np.nan, np.inf]
    b, views = _bias_views(c, rng)
    bshape = (1, c, 1, 1) if layout == "NCHW" else (1, 1, 1, c)
    alpha, gain = np.float32(0.2), np.float32(np.sqrt(2.0))
    v = x.astype(np.float32) + b.astype(np.float32).reshape(bshape)
    want_y = (np.where(v > 0, v, alpha * v) * gain).astype(np.float16)
    g = dy.astype(np.float32) * gain
    t2 = np.where(v > 0, v, alpha * v) * gain
    grad = np.where(np.abs(t2) <= np.inf, np.where(v > 0, g, g * alpha), np.float32(0))
    want_dx = grad.astype(np.float16)
    axes = (0, 2, 3) if layout == "NCHW" else (0, 1, 2)
    want_db = grad.astype(np.float64).sum(axis=axes)
    scale = np.abs(grad.astype(np.float64)).sum(axis=axes)   # cancellation in the sums
    first = None
    for threads in (1, 2):
        for bias in views:
            y, dx, db = np.empty_like(x), np.empty_like(x), np.empty_like(b)
            with opkit.config(isa=isa, num_threads=threads):   # given memory: large calls stream
                op(x, bias, layout=layout, out=y)
                op.backward(dy, x, bias, layout=layout, out=(dx, db))
            _assert_same_bits(y, want_y)
            _assert_same_bits(dx, want_dx)
            err = np.abs(db.astype(np.float64) - want_db)
            assert np.all(err <= 2e-3 * np.abs(want_db) + 1e-6 * scale), (db, want_db)
            if first is None:
                first = db
            _assert_same_bits(db, first)
