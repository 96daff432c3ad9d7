"""Calls whose output is laid out differently from an input: the blocked, transposing walk.

An NCHW array written into NHWC memory (and the reverse) goes through blocks transposed in
registers (float32/float64 with AVX-512) or through scalar scatters (other dtypes and strides);
every block edge and every path must give exactly what the contiguous call gives."""
import numpy as np
import pytest

import opkit
from opkit.runtime.geometry import geometry

DTYPES = [np.float16, np.float32, np.float64]
# (N, C, H, W): C and H*W around the block sizes (16 x 512) and their ragged edges
SHAPES = [(2, 64, 17, 19), (1, 16, 32, 16), (2, 37, 5, 111), (1, 5, 7, 9), (1, 17, 1, 513), (3, 33, 16, 33)]


def nhwc_out(shape, dtype, fill=7.0):
    n, c, h, w = shape
    buf = np.full((n, h, w, c), fill, dtype)
    return buf, buf.transpose(0, 3, 1, 2)


@pytest.fixture(scope="module")
def op():
    return opkit.get("leaky_relu")


@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_nchw_into_nhwc_and_back(op, shape, dtype, isa):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype)
    with opkit.config(isa=isa):
        want = op(x, alpha=0.3)                      # contiguous in, contiguous out
        buf, view = nhwc_out(shape, dtype)
        assert op(x, alpha=0.3, out=view) is view
        np.testing.assert_array_equal(view, want)
        np.testing.assert_array_equal(buf, want.transpose(0, 2, 3, 1))
        # NHWC memory read, NCHW memory written
        src = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        out = np.full(shape, 7.0, dtype)
        op(src, alpha=0.3, out=out)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_split_of_blocks(op, threads):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 48, 40, 40)).astype(np.float32)
    with opkit.config(num_threads=threads):
        buf, view = nhwc_out(x.shape, np.float32)
        op(x, out=view)
    np.testing.assert_array_equal(view, op(x))


def test_two_outputs_and_a_broadcast_operand():
    """spatial_leaky_relu's backward writes dx and a temporary; its slope map is stride 0 along C."""
    sp = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 40, 21, 23)).astype(np.float32)        # NCHW memory ...
    view = np.ascontiguousarray(x.transpose(0, 2, 3, 1))               # ... and NHWC memory
    amap = rng.uniform(0, 1, (2, 21, 23, 1)).astype(np.float32)
    buf, out = nhwc_out(x.shape, np.float32)
    sp(x.transpose(0, 2, 3, 1), amap, layout="NHWC", out=out.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(out.transpose(0, 2, 3, 1), sp(view, amap, layout="NHWC"))
    dy = rng.standard_normal(view.shape).astype(np.float32)
    dx, da = sp.backward(dy, x.transpose(0, 2, 3, 1), amap, layout="NHWC")
    dx2, da2 = sp.backward(dy, view, amap, layout="NHWC")
    np.testing.assert_array_equal(dx, dx2)
    np.testing.assert_allclose(da, da2, rtol=1e-6)


def test_geometry_picks_the_transposing_walk_only_when_it_helps():
    f4 = [4, 4]
    # x contiguous along W*H (stride 4), output contiguous along C: transposed, tdim = the HW dim
    g = geometry((8, 64, 16384), [(64 * 16384 * 4, 16384 * 4, 4), (64 * 16384 * 4, 4, 256)],
                 [2, 2], f4, 1, 2)
    ndim, nops, nout, tdim, ccode = g[:5]
    assert (ndim, nops, nout, ccode) == (3, 2, 1, 2) and tdim >= 0
    assert list(g[5:5 + ndim]) == [8, 16384, 64] and tdim == 1
    # both contiguous: one flat run
    g = geometry((8, 64), [(256, 4), (256, 4)], [2, 2], f4, 1, 2)
    assert list(g[:6]) == [1, 2, 1, -1, 2, 512]
    # a broadcast input (stride 0) never asks for a transposition
    g = geometry((64, 300), [(0, 0), (4, 256)], [2, 2], f4, 1, 2)
    assert g[3] == -1
    # too short along the output's inner dim to be worth blocks
    g = geometry((4, 300), [(4, 16), (1200, 4)], [2, 2], f4, 1, 2)
    assert g[3] == -1


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("c", [1, 3, 64, 600])
@pytest.mark.parametrize("threads", [1, 2])
def test_short_rows_with_a_value_per_row(dtype, c, threads):
    """NHWC with a slope per pixel: rows of C elements are grouped, the slope spread per row;
    thread ranges start and end inside rows."""
    sp = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(c)
    x = rng.standard_normal((3, 37, 41, c)).astype(dtype)
    amap = rng.uniform(0, 1, (3, 37, 41, 1)).astype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    want = np.where(x > 0, x, (amap.astype(ct) * x.astype(ct)).astype(dtype))
    with opkit.config(num_threads=threads):
        np.testing.assert_array_equal(sp(x, amap, layout="NHWC"), want)
        out = np.empty_like(x)
        sp(x, amap, layout="NHWC", out=out)
        np.testing.assert_array_equal(out, want)
        # the same map one level up: one value per image row, broadcast over W and C
        rows = rng.uniform(0, 1, (3, 37, 1, 1)).astype(dtype)
        want = np.where(x > 0, x, (rows.astype(ct) * x.astype(ct)).astype(dtype))
        np.testing.assert_array_equal(sp(x, rows, layout="NHWC"), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("hw", [(1, 7), (13, 17), (300, 301)])
@pytest.mark.parametrize("threads", [1, 2])
def test_long_rows_with_a_value_per_row(dtype, hw, threads):
    """NCHW with a slope per channel: one value per row of H x W, taken as a scalar by the row
    loop over the whole run (in place, also into given memory large enough to be streamed);
    thread ranges start and end inside rows."""
    sp = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(hw[0])
    x = rng.standard_normal((2, 3) + hw).astype(dtype)
    amap = rng.uniform(0, 1, (2, 3, 1, 1)).astype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    want = np.where(x > 0, x, (amap.astype(ct) * x.astype(ct)).astype(dtype))
    with opkit.config(num_threads=threads):
        np.testing.assert_array_equal(sp(x, amap, layout="NCHW"), want)
        out = np.full_like(x, np.nan)
        sp(x, amap, layout="NCHW", out=out)
        np.testing.assert_array_equal(out, want)
        buf = np.full((2, 3) + (hw[0], 2 * hw[1]), np.nan, dtype)   # strided rows: tiles
        sp(x, amap, layout="NCHW", out=buf[..., ::2])
        np.testing.assert_array_equal(buf[..., ::2], want)
        assert np.isnan(buf[..., 1::2]).all()
