"""Sums folded into the kernel that computes what they add up (opkit/lower/reduce.py): the
backward of a broadcast input (dbias over N, H, W) is summed in the same pass that writes dx,
into float64 partial sums per chunk of the walk, so the result does not depend on the thread count."""
import numpy as np
import pytest

import opkit
from opkit.lower import Kernel, LibCall
from opkit.lower.reduce import MAX_SUMS, SUM_CHUNK
from opkit.target import runs_here

from conftest import write_op

SQRT2 = np.sqrt(2.0)


def _fused_bias_reference(x, b, dy, layout, alpha=0.2, gain=SQRT2, clamp=np.inf):
    """dx and dbias of clamp(leaky_relu(x + b) * gain) in float64, written out by hand."""
    shape = (1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1)
    v = x.astype(np.float64) + b.astype(np.float64).reshape(shape)
    y = np.where(v > 0, v, alpha * v) * gain
    g = np.where(np.abs(y) <= clamp, np.where(v > 0, 1.0, alpha) * gain, 0.0) * dy.astype(np.float64)
    axes = (0, 2, 3) if layout == "NCHW" else (0, 1, 2)
    return g, g.sum(axis=axes)


def _image(n_elements, c, layout):
    """A 4-d shape of about n_elements with c channels (odd H and W where possible)."""
    hw = max(n_elements // (2 * c), 0)
    h = max(int(np.sqrt(hw)), 1) if hw else 0
    w = hw // h if h else 0
    return (2, c, h, w) if layout == "NCHW" else (2, h, w, c)


def test_the_bias_gradient_is_summed_in_the_kernel_that_writes_dx():
    low = opkit.get("fused_bias_leaky_relu").lowered()
    steps = low.backward.steps
    assert not any(isinstance(s, LibCall) and s.prim == "sum" for s in steps)
    (k,) = [s for s in steps if isinstance(s, Kernel)]
    assert not any(isinstance(s, LibCall) and s.prim == "sum_to" and str(s.result) == "dx" for s in steps)
    assert [(s.prim, s.params[0]) for s in k.sums] == [("sum_to", "x"), ("sum", ("C",))]
    assert "sum(tmp0, keep=[C]) in the same pass" in k.describe_writes()


def test_calls_that_take_turns_in_memory_order_keep_their_own_sums():
    """What a call decides from its layout alone (the iteration space, whether a sum is kept as
    lanes, the geometry) is remembered per layout: the same logical shape stored NCHW, NHWC and
    as reversed views, called in turns, each sums along its own memory order."""
    op = opkit.get("fused_bias_leaky_relu")
    rng = np.random.default_rng(5)
    c, shape = 5, (2, 5, 37, 41)
    x64 = rng.standard_normal(shape)
    dy64 = rng.standard_normal(shape)
    b = rng.standard_normal(c)
    g, gb = _fused_bias_reference(x64, b, dy64, "NCHW")
    stores = [lambda a: a, lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
              lambda a: np.ascontiguousarray(a[:, :, ::-1, ::-1])[:, :, ::-1, ::-1]]
    for _ in range(2):
        for store in stores:
            dx, db = op.backward(store(dy64), store(x64), b)
            np.testing.assert_allclose(db, gb, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(dx, g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-12), ("float32", 1e-5), ("float16", 3e-3)])
@pytest.mark.parametrize("size", [0, 1, 7 * 3, SUM_CHUNK - 6, SUM_CHUNK, SUM_CHUNK + 6, 3 * SUM_CHUNK + 10])
def test_fused_bias_backward_matches_numpy(layout, dtype, rtol, size):
    op = opkit.get("fused_bias_leaky_relu")
    c = 3
    shape = _image(size, c, layout)
    rng = np.random.default_rng(size)
    x = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    dx, db = op.backward(dy, x, b, layout=layout)
    g, gb = _fused_bias_reference(x, b, dy, layout)
    assert db.dtype == np.dtype(dtype) and db.shape == (c,)
    # dbias rounds once, to its dtype, from a sum of many terms
    np.testing.assert_allclose(db, gb, rtol=rtol, atol=rtol * np.sqrt(max(x.size, 1)))
    np.testing.assert_allclose(dx, g, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_folded_sums_do_not_depend_on_the_thread_count(layout, dtype):
    op = opkit.get("fused_bias_leaky_relu")
    shape = _image(5 * SUM_CHUNK + 123, 5, layout)
    rng = np.random.default_rng(3)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    b = rng.standard_normal(5).astype(dtype)
    results = []
    for n in (1, 2, 3):
        with opkit.config(num_threads=n):
            results.append(op.backward(dy, x, b, layout=layout))
    for dx, db in results[1:]:
        assert np.array_equal(dx, results[0][0]) and np.array_equal(db, results[0][1])


def test_strided_and_transposed_inputs():
    """Views that are not contiguous take the walk's gathering path; the sums are the same."""
    op = opkit.get("fused_bias_leaky_relu")
    rng = np.random.default_rng(4)
    big = rng.standard_normal((2, 6, 40, 34)).astype(np.float32)
    x = big[:, ::2, :, ::2]                                   # NCHW, strided
    dy = np.ascontiguousarray(rng.standard_normal((2, 40, 17, 3)).astype(np.float32)).transpose(0, 3, 1, 2)
    b = rng.standard_normal(6).astype(np.float32)[::2]
    dx, db = op.backward(dy, x, b, layout="NCHW")
    g, gb = _fused_bias_reference(x, b, dy, "NCHW")
    np.testing.assert_allclose(db, gb, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, g, rtol=1e-6, atol=1e-7)


def test_clipping_clamps_the_sum_not_its_terms():
    """backward(clip=c) clamps each gradient once it is computed: dbias is the clamped sum of
    the unclamped terms, as when the sum ran after the kernel."""
    op = opkit.get("fused_bias_leaky_relu")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 20, 20))
    dy = rng.standard_normal((2, 3, 20, 20))
    b = np.array([0.5, -0.5, 0.0])
    dx, db = op.backward(dy, x, b, layout="NCHW", clip=0.3)
    g, gb = _fused_bias_reference(x, b, dy, "NCHW")
    np.testing.assert_allclose(dx, np.clip(g, -0.3, 0.3), rtol=1e-14)
    np.testing.assert_allclose(db, np.clip(gb, -0.3, 0.3), rtol=1e-12)
    # the data tells the two apart: the sum of clamped terms is another number
    assert not np.allclose(np.clip(g, -0.3, 0.3).sum(axis=(0, 2, 3)), np.clip(gb, -0.3, 0.3))


def test_a_forward_sum_into_an_output(tmp_path):
    """Sums that land in outputs (here forward ones) fold too, up to MAX_SUMS into one kernel."""
    lines = ["name: folded_sums_probe",
             "inputs:",
             "  x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}",
             "outputs:"]
    forward = []
    for i in range(MAX_SUMS + 1):
        lines.append(f"  s{i}: {{}}")
        forward.append(f"  s{i}: sum(x * {i + 1}.5, C)")
    path = write_op(tmp_path, "\n".join(lines + ["forward:"] + forward) + "\n")
    opkit.load(path)
    op = opkit.get("folded_sums_probe")
    kernels = [s for s in op.lowered().forward.steps if isinstance(s, Kernel)]
    assert [len(k.sums) for k in kernels] == [MAX_SUMS]   # the one more stays a library call
    assert [s.prim for s in op.lowered().forward.steps if isinstance(s, LibCall)].count("sum") == 1
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 50, 70))
    outs = op(x, layout="NCHW")
    for i, s in enumerate(outs):
        np.testing.assert_allclose(s, (x * (i + 1.5)).sum(axis=1), rtol=1e-13)


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-13), ("float32", 1e-6), ("float16", 2e-3)])
@pytest.mark.parametrize("c", [1, 3, 64, 300, 700])
def test_rows_of_a_repeated_channel_vector_are_grouped_alike(dtype, rtol, c):
    """NHWC with a per-channel bias: rows of C grouped into long runs (the bias row repeated,
    as float16 where it is float16), against NumPy, with strided views on both sides."""
    op = opkit.get("fused_bias_leaky_relu")
    rng = np.random.default_rng(c)
    x = rng.standard_normal((2, 5, 7, c)).astype(dtype)
    xs = rng.standard_normal((2, 5, 14, c)).astype(dtype)[:, :, ::2]      # strided pixels
    bias = rng.standard_normal(2 * c).astype(dtype)[::2]                    # a strided bias
    for xin in (x, xs):
        y = op(xin, bias, layout="NHWC")
        v = xin.astype(np.float64) + bias.astype(np.float64)
        expected = np.where(v > 0, v, 0.2 * v) * SQRT2
        np.testing.assert_allclose(y, expected, rtol=rtol, atol=rtol)
        dy = rng.standard_normal(xin.shape).astype(dtype)
        dx, db = op.backward(dy, xin, bias, layout="NHWC")
        g, gb = _fused_bias_reference(xin, bias, dy, "NHWC")
        np.testing.assert_allclose(dx, g, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(db, gb, rtol=rtol, atol=rtol * np.sqrt(xin.size))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_per_pixel_slope_over_channels(dtype):
    """NHWC with a slope per pixel (broadcast over C): a scalar per row in the kernel's row loop
    (float32), spread into tiles (float16, kept as float16)."""
    op = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(9)
    for c in (3, 64, 600):
        x = rng.standard_normal((2, 6, 5, c)).astype(dtype)
        amap = rng.uniform(0.1, 0.3, (2, 6, 5, 1)).astype(dtype)
        y = op(x, amap, layout="NHWC")
        xd, ad = x.astype(np.float64), amap.astype(np.float64)
        tol = 2e-3 if dtype == "float16" else 1e-6   # (float16's subnormals: atol)
        np.testing.assert_allclose(y, np.where(xd > 0, xd, ad * xd), rtol=tol, atol=tol * 1e-3)
        dy = rng.standard_normal(x.shape).astype(dtype)
        dx, da = op.backward(dy, x, amap, layout="NHWC")
        dyd = dy.astype(np.float64)
        np.testing.assert_allclose(dx, np.where(xd > 0, dyd, ad * dyd), rtol=2e-3, atol=2e-3)
        expected = np.where(xd > 0, 0.0, dyd * xd).sum(axis=3, keepdims=True)
        np.testing.assert_allclose(da, expected, rtol=5e-3, atol=5e-3 * np.sqrt(c))


def _offset(like, k):
    """An array like `like`, k elements into a bigger buffer: its runs start k elements past
    NumPy's usual 16 bytes into a line, so the streamed lines begin after a head of elements
    stored plainly."""
    raw = np.empty(like.size + 64, like.dtype)
    return raw[k:k + like.size].reshape(like.shape)


@pytest.mark.parametrize("layout, c", [("NCHW", 3), ("NCHW", 64), ("NHWC", 64), ("NHWC", 70), ("NHWC", 5)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_vectorized_sums_add_the_same_numbers_as_the_portable_build(layout, c, dtype):
    """The sums the native build adds in vector registers (eight lanes, rows of channels kept in
    registers across rows) are bitwise those of the portable build's plain C loops, for any
    thread count, with the gradient streamed into given arrays after a head of elements."""
    op = opkit.get("fused_bias_leaky_relu")
    shape = _image(3 * SUM_CHUNK + 4321, c, layout)
    rng = np.random.default_rng(c)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    b = rng.standard_normal(c).astype(dtype)
    results = []
    for isa, threads, k in (("portable", 1, 0), ("native", 1, 0), ("native", 2, 3), ("native", 3, 17)):
        out = (_offset(x, k), np.empty_like(b))
        with opkit.config(isa=isa, num_threads=threads):
            results.append(op.backward(dy, x, b, layout=layout, out=out))
    for dx, db in results[1:]:
        assert np.array_equal(dx, results[0][0]) and np.array_equal(db, results[0][1])
    g, gb = _fused_bias_reference(x, b, dy, layout)
    tol = 3e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(results[0][1], gb, rtol=tol, atol=tol * np.sqrt(x.size))
    np.testing.assert_allclose(results[0][0], g, rtol=tol, atol=tol)


@pytest.mark.parametrize("isa", ["native", "x86-64-v3"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float32_runs_stream_into_given_memory(layout, isa):
    """A large float32 call into given memory streams each run, an NCHW row or a group of NHWC
    rows, whole lines from its first aligned one, the lines it shares with the runs beside it
    stored plainly. dx, dbias and y are bitwise those of the same call into fresh arrays (which
    does not stream), wherever the given memory starts, on one thread and two; and dx and dbias
    are NumPy's float64 gradient within float32's rounding. The x86-64-v3 build (AVX2) streams
    whole lines too, two 32-byte stores each."""
    if not runs_here(isa):
        pytest.skip(f"this CPU does not run {isa} builds")
    op = opkit.get("fused_bias_leaky_relu")
    shape = (1, 64, 180, 190) if layout == "NCHW" else (1, 180, 190, 64)  # 2.19M: calls stream
    rng = np.random.default_rng(11)
    x, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(64).astype(np.float32)
    with opkit.config(isa=isa):
        dx0, db0 = op.backward(dy, x, b, layout=layout)
        y0 = op(x, b, layout=layout)
    g, gb = _fused_bias_reference(x, b, dy, layout)
    np.testing.assert_allclose(dx0, g, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(db0, gb, rtol=1e-5, atol=1e-4)
    for threads in (1, 2):
        for k in (0, 1, 5):   # dx 0, 4 and 20 bytes past NumPy's usual start
            dx, db, y = _offset(x, k), np.empty_like(b), _offset(x, k + 3)
            with opkit.config(isa=isa, num_threads=threads):
                op.backward(dy, x, b, layout=layout, out=(dx, db))
                op(x, b, layout=layout, out=y)
            assert np.array_equal(dx, dx0) and np.array_equal(db, db0), (threads, k)
            assert np.array_equal(y, y0), (threads, k)


@pytest.mark.parametrize("isa", ["native", "x86-64-v3"])
@pytest.mark.parametrize("c", [64, 600])
def test_rows_with_sums_stream_from_their_batches(c, isa):
    """A large float32 call whose rows take a per-row value as a scalar and fold a sum (a
    per-pixel slope over NHWC's channels) computes each batch of rows into a buffer and
    streams the gradient from it. dx and the map's gradient are bitwise those of the call into
    fresh arrays (which does not stream), wherever the given memory starts, on one thread and
    two, and within float32's rounding of NumPy's float64 gradient."""
    if not runs_here(isa):
        pytest.skip(f"this CPU does not run {isa} builds")
    op = opkit.get("spatial_leaky_relu")
    shape = (1, 180, 190, 64) if c == 64 else (1, 60, 61, 600)       # over 2M: calls stream
    rng = np.random.default_rng(c)
    x, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    amap = rng.uniform(0.1, 0.3, shape[:3] + (1,)).astype(np.float32)
    with opkit.config(isa=isa):
        dx0, da0 = op.backward(dy, x, amap, layout="NHWC")
    xd, ad, dyd = (a.astype(np.float64) for a in (x, amap, dy))
    np.testing.assert_allclose(dx0, np.where(xd > 0, dyd, ad * dyd), rtol=1e-6, atol=1e-6)
    expected = np.where(xd > 0, 0.0, dyd * xd).sum(axis=3, keepdims=True)
    np.testing.assert_allclose(da0, expected, rtol=1e-5, atol=1e-5 * np.sqrt(c))
    for threads in (1, 2):
        for k in (0, 1, 5):
            dx, da = _offset(x, k), _offset(amap, k + 2)
            with opkit.config(isa=isa, num_threads=threads):
                op.backward(dy, x, amap, layout="NHWC", out=(dx, da))
            assert np.array_equal(dx, dx0) and np.array_equal(da, da0), (threads, k)


def test_sums_of_different_sizes_in_one_kernel(tmp_path):
    """Each folded sum's partials move on by their own chunk stride: a sum over C and one over H
    of the same terms fold into one kernel, and both are right."""
    path = write_op(tmp_path, "name: folded_sizes_probe\n"
                              "inputs:\n  x: {dtypes: [float32, float64], layouts: [NCHW]}\n"
                              "outputs:\n  s0: {}\n  s1: {}\n"
                              "forward:\n  s0: sum(x * 1.5, C)\n  s1: sum(x * 2.5, H)\n")
    opkit.load(path)
    op = opkit.get("folded_sizes_probe")
    assert [len(k.sums) for k in op.lowered().forward.steps if isinstance(k, Kernel)] == [2]
    x = np.random.default_rng(7).standard_normal((3, 4, 130, 170))   # several chunks
    for threads in (1, 2):
        with opkit.config(num_threads=threads):
            s0, s1 = op(x, layout="NCHW")
        np.testing.assert_allclose(s0, (x * 1.5).sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(s1, (x * 2.5).sum(axis=2), rtol=1e-12)


@pytest.mark.parametrize("c", [8, 64])
def test_partials_start_at_zero_call_after_call(c):
    """Each chunk zeroes the partials it keeps (a few channels' worth, or a sum per pixel's
    span of pixels) as it starts: the same sums on every call, several chunks each."""
    op = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(c)
    x = rng.standard_normal((2, 64, 64, c))
    dy = rng.standard_normal(x.shape)
    amap = rng.uniform(0.1, 0.3, (2, 64, 64, 1))
    fb = opkit.get("fused_bias_leaky_relu")
    b = rng.standard_normal(c)
    first = op.backward(dy, x, amap, layout="NHWC"), fb.backward(dy, x, b, layout="NHWC")
    for _ in range(3):
        again = op.backward(dy, x, amap, layout="NHWC"), fb.backward(dy, x, b, layout="NHWC")
        for got, want in zip(again, first):
            assert all(np.array_equal(g, w) for g, w in zip(got, want))
    expected = np.where(x > 0, 0.0, dy * x).sum(axis=3, keepdims=True)
    np.testing.assert_allclose(first[0][1], expected, rtol=1e-12, atol=1e-12)
    g, gb = _fused_bias_reference(x, b, dy, "NHWC")
    np.testing.assert_allclose(first[1][1], gb, rtol=1e-12)


@pytest.fixture(scope="module")
def span_probe(tmp_path_factory):
    path = write_op(tmp_path_factory.mktemp("span"),
                    "name: chunk_span_probe\n"
                    "inputs:\n  x: {dtypes: [float16, float32, float64], layouts: [NCHW, NHWC]}\n"
                    "outputs:\n  s0: {}\n  s1: {}\n  s2: {}\n  s3: {}\n"
                    "forward:\n  s0: sum(x * 1.5, H)\n  s1: sum(x * 2.5, C)\n"
                    "  s2: sum(sum(sum(x * 0.5, N), H), W)\n"
                    "  s3: sum(x * 0.25, W)\n")
    opkit.load(path)
    return opkit.get("chunk_span_probe")


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-12), ("float32", 1e-5)])
@pytest.mark.parametrize("n, c, hw", [(2, 8, 128), (1, 3, 200), (3, 5, 97)])
def test_a_per_pixel_slope_map_over_nchw_sums_over_the_channels(dtype, rtol, n, c, hw):
    """A slope map [N, 1, H, W] over NCHW: its gradient sums over C, the slowest dim of each
    image, so a chunk of the walk touches as many of its elements as it has terms; chunks then
    grow (the same size for any number of threads) until their partials are small. NumPy's
    float64 sums, and the same bits for 1, 2 and 3 threads."""
    op = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(hw)
    x = rng.standard_normal((n, c, hw, hw)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    amap = rng.uniform(0.1, 0.3, (n, 1, hw, hw)).astype(dtype)
    results = []
    for threads in (1, 2, 3):
        with opkit.config(num_threads=threads):
            results.append(op.backward(dy, x, amap, layout="NCHW"))
    x64, dy64, a64 = (v.astype(np.float64) for v in (x, dy, amap))
    want = np.where(x64 > 0, 0.0, dy64 * x64).sum(axis=1, keepdims=True)
    dx, dmap = results[0]
    np.testing.assert_allclose(dmap, want, rtol=rtol, atol=rtol * np.sqrt(c))
    np.testing.assert_allclose(dx, np.where(x64 > 0, dy64, a64 * dy64), rtol=rtol, atol=rtol)
    for got in results[1:]:
        assert all(np.array_equal(g, w) for g, w in zip(got, results[0]))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("c", [5, 70, 300])
def test_a_per_pixel_slope_map_over_nhwc_adds_each_row_as_it_goes(dtype, c):
    """A slope map [N, H, W, 1] over NHWC: its gradient sums each pixel's row of C channels,
    and the rows next to each other go into different elements. Each row is added up as it
    goes (lanes kept from tile to tile: rows of 70 and 300 are cut by the tiles, which the
    float16 loops and the portable build cut elsewhere, and by chunks) and then into its
    element. Each row holds terms of +1024 and -1024 among small ones, so that float16's float32
    lanes round the small terms they add after a large one and the result shows which terms
    were added together. NumPy's float64 sums within the rounding of the lanes, and the same
    bits for 1, 2 and 3 threads, the portable build, and x strided along C (float32 and
    float64 then spread the map into tiles instead of the kernel's row loop taking it as a
    scalar per row)."""
    op = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(c)
    n, h, w = 2, 23, 3 * SUM_CHUNK // (2 * 23 * c) + 1      # several chunks
    x = rng.uniform(-0.05, 0.05, (n, h, w, c))
    dy = rng.standard_normal(x.shape)
    pos = rng.permuted(np.broadcast_to(np.arange(c), (n, h, w, c)), axis=3)[..., :4]
    i0, i1, i2 = np.indices((n, h, w))
    for k in range(4 if c >= 4 else 0):      # terms dy * x of -1024, +1024, -1024, +1024
        x[i0, i1, i2, pos[..., k]] = -1024.0
        dy[i0, i1, i2, pos[..., k]] = 1.0 if k % 2 == 0 else -1.0
    x, dy = x.astype(dtype), dy.astype(dtype)
    amap = rng.uniform(0.1, 0.3, (n, h, w, 1)).astype(dtype)
    strided = np.empty(x.shape[:3] + (2 * c,), dtype)[..., ::2]
    strided[...] = x
    runs = [("native", 1, x), ("native", 2, x), ("native", 3, x), ("portable", 1, x), ("native", 2, strided)]
    results = []
    for isa, threads, xin in runs:
        with opkit.config(isa=isa, num_threads=threads):
            results.append(op.backward(dy, xin, amap, layout="NHWC"))
    x64, dy64, a64 = (v.astype(np.float64) for v in (x, dy, amap))
    terms = np.where(x64 > 0, 0.0, dy64 * x64)
    want, size = terms.sum(axis=3, keepdims=True), np.abs(terms).sum(axis=3, keepdims=True)
    eps = {"float64": 2.0 ** -52, "float32": 2.0 ** -24, "float16": 2.0 ** -11}[dtype]
    # float16's terms are exact in float32 and add in float32 lanes of up to eight terms first;
    # float32's terms round once and add in float64; the result rounds once to the dtype (to
    # its subnormals' spacing near zero)
    lanes = 7 * 2.0 ** -24 if dtype == "float16" else (2.0 ** -24 if dtype == "float32" else 64 * eps)
    bound = eps * np.abs(want) + lanes * size + float(np.finfo(dtype).smallest_subnormal) / 2
    dx, dmap = results[0]
    assert np.all(np.abs(dmap.astype(np.float64) - want) <= bound)
    np.testing.assert_allclose(dx, np.where(x64 > 0, dy64, a64 * dy64), rtol=eps, atol=eps)
    for (isa, threads, xin), got in zip(runs[1:], results[1:]):
        assert all(np.array_equal(g, r) for g, r in zip(got, results[0])), (isa, threads, xin.strides)


def test_row_sums_keep_a_double_per_row():
    """The partials of a sum whose consecutive rows go to different elements take a double per
    row (a chunk's span of them), not a set of lanes per row (192 bytes): the call allocates
    less than 48 bytes a row beyond its result."""
    import tracemalloc
    op = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 128, 128, 8))
    dy = rng.standard_normal(x.shape)
    amap = rng.uniform(0.1, 0.3, x.shape[:3] + (1,))
    out = (np.empty_like(x), np.empty_like(amap))
    op.backward(dy, x, amap, layout="NHWC", out=out)
    rows = x.size // x.shape[3]
    tracemalloc.start()
    try:
        for threads in (1, 2):
            with opkit.config(num_threads=threads):
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                op.backward(dy, x, amap, layout="NHWC", out=out)
                peak = tracemalloc.get_traced_memory()[1] - before
            assert peak < 48 * rows, (threads, peak, rows)
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(out[1], np.where(x > 0, 0.0, dy * x).sum(axis=3, keepdims=True),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("c", [5, 21, 64])
def test_float16_column_sums_add_blocks_of_rows_however_tiles_cut_them(span_probe, c):
    """Over NHWC, a sum over W (or over N, H and W) adds rows of C columns that all go into the
    same sums: on float16 data each column adds blocks of eight rows in float32 first. The
    terms here cancel (+1024 and -1024 in every column, among small ones), so a block that
    holds one of the large terms rounds the small ones and the result shows which rows were
    added together. The blocks count rows from where the walk's run starts, whatever the
    tiles: the float16 loops (four times as many elements a tile) and the portable build's
    loops cut rows in other places, and 1, 2 or 3 threads run the same runs; every result is
    the same bits, and within the float32 blocks' rounding of NumPy's float64 sums."""
    rng = np.random.default_rng(c)
    n, h, w = 2, 37, 131                                     # several chunks, rows cut by tiles
    x = rng.uniform(-0.05, 0.05, (n, h, w, c))
    # three pairs in each column: rows of the same (n, h) and channel
    pos = rng.permuted(np.broadcast_to(np.arange(w), (n, h, c, w)), axis=3)[..., :6]
    i0, i1, i2 = np.indices((n, h, c))
    for k in range(6):
        x[i0, i1, pos[..., k], i2] = 1024.0 if k % 2 == 0 else -1024.0
    x = x.astype(np.float16)
    runs = [("native", 1), ("native", 2), ("native", 3), ("portable", 1)]
    results = []
    for isa, threads in runs:
        with opkit.config(isa=isa, num_threads=threads):
            results.append(span_probe(x, layout="NHWC"))
    x64 = x.astype(np.float64).transpose(0, 3, 1, 2)
    sums = {2: lambda a: (a * 0.5).sum(axis=(0, 2, 3)), 3: lambda a: (a * 0.25).sum(axis=3)}
    for i, s in sums.items():
        want = s(x64)
        bound = 2.0 ** -11 * np.abs(want) + 7 * 2.0 ** -24 * s(np.abs(x64))
        for (isa, threads), got in zip(runs, results):
            assert np.all(np.abs(got[i].astype(np.float64) - want) <= bound), (i, isa, threads)
            assert np.array_equal(got[i], results[0][i]), (i, isa, threads)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("view", ["plain", "reversed", "strided"])
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_each_chunk_keeps_the_span_of_sums_it_touches(span_probe, layout, view, dtype):
    """A chunk keeps partials only for the span of each sum's elements it touches: sums over a
    dim that is not the innermost (the partials' inner stride is not one element), over N
    (folded; H and W are then summed after the pass), and over the innermost dim (W in NCHW, C
    in NHWC: runs add into one sum, kept as lanes), in both layouts and through reversed and
    strided views (the walk goes through memory backwards or in steps), many chunks whose spans
    cross rows and images: NumPy's sums, and the same bits for 1, 2 and 3 threads and (float16,
    whose float32 lanes add blocks of 128 that 131-element rows start and end inside) for the
    portable build."""
    op = span_probe
    rng = np.random.default_rng(11)
    nchw = (3, 5, 97, 131)                                   # 5.8 chunks, odd everything
    base = rng.standard_normal((3, 5, 97, 2 * 131) if view == "strided" else nchw).astype(dtype)
    x = {"plain": base, "reversed": base[:, ::-1, ::-1], "strided": base[..., ::2]}[view]
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    arg = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    runs = [("native", 1), ("native", 2), ("native", 3)]
    runs += [("portable", 1)] if dtype == "float16" else []
    results = []
    for isa, threads in runs:
        with opkit.config(isa=isa, num_threads=threads):
            results.append(op(arg, layout=layout))
    x64 = x.astype(np.float64)
    sums = [lambda a: (a * 1.5).sum(axis=2), lambda a: (a * 2.5).sum(axis=1),
            lambda a: (a * 0.5).sum(axis=(0, 2, 3)), lambda a: (a * 0.25).sum(axis=3)]
    for got in results:
        for g, s in zip(got, sums):   # (sums come in the dims' logical order)
            w = s(x64)
            if dtype == "float16":
                # the terms exact in float32; float32 lanes of eight terms (7 roundings of at
                # most 2^-24 of the terms' magnitudes), then the sum rounded once to float16
                bound = 2.0 ** -11 * np.abs(w) + 7 * 2.0 ** -24 * s(np.abs(x64))
                assert np.all(np.abs(g.astype(np.float64) - w) <= bound)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)
        assert all(np.array_equal(a, b) for a, b in zip(got, results[0]))
