"""backward(out=...): gradients written into arrays the caller gives, one entry per input."""
import numpy as np
import pytest

import opkit


def _args(rng, dtype=np.float32):
    x = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    return x, rng.standard_normal(3).astype(dtype), rng.standard_normal(x.shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_gradients_land_in_the_given_arrays(dtype):
    op = opkit.get("fused_bias_leaky_relu")
    x, b, dy = _args(np.random.default_rng(1), dtype)
    dx0, db0 = op.backward(dy, x, b)
    dx, db = np.full_like(x, np.nan), np.full_like(b, np.nan)
    got = op.backward(dy, x, b, out=(dx, db))
    assert got[0] is dx and got[1] is db
    np.testing.assert_array_equal(dx, dx0)
    np.testing.assert_array_equal(db, db0)
    # some given, some allocated
    db2 = np.empty_like(b)
    got = op.backward(dy, x, b, out=(None, db2))
    assert got[1] is db2 and np.array_equal(got[0], dx0) and np.array_equal(db2, db0)


def test_strided_views_and_overlap_with_an_input():
    op = opkit.get("leaky_relu")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    dy = rng.standard_normal((6, 8)).astype(np.float32)
    expected = np.where(x > 0, dy, np.float32(0.2) * dy)
    buf = np.zeros((6, 16), np.float32)
    view = buf[:, ::2]
    assert op.backward(dy, x, out=(view,))[0] is view
    np.testing.assert_array_equal(view, expected)
    assert not buf[:, 1::2].any()
    d = dy.copy()  # the gradient written over dy itself
    assert op.backward(d, x, out=(d,))[0] is d
    np.testing.assert_array_equal(d, expected)


def test_bad_out_is_refused_and_nothing_is_written():
    op = opkit.get("fused_bias_leaky_relu")
    x, b, dy = _args(np.random.default_rng(3))
    dx = np.zeros_like(x)
    cases = [((dx,), TypeError, "out must be a tuple of 2 entries"),
             (dx, TypeError, "out must be a tuple of 2 entries"),
             ((dx.astype(np.float64), None), TypeError, "out[dx] must have dtype float32"),
             ((dx[:1], None), ValueError, "out[dx] must have shape (2, 3, 4, 5)"),
             ((None, [0.0, 0.0, 0.0]), TypeError, "out[dbias] must be a NumPy array or None"),
             ((dx, dx[0, 0, 0, :3]), ValueError, "out[dx] and out[dbias] overlap")]
    for out, err, text in cases:
        with pytest.raises(err, match=text.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            op.backward(dy, x, b, out=out)
        assert not dx.any()
    ro = np.zeros_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        op.backward(dy, x, b, out=(ro, None))


def test_an_input_without_gradient_takes_none():
    op = opkit.get("conditional_leaky_relu")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 5))
    z, w, b = rng.standard_normal((2, 2)), rng.standard_normal((2, 3)), rng.standard_normal(3)
    outs = tuple(np.empty_like(a) for a in (x, z, w, b))
    got = op.backward(np.ones_like(x), x, z, w, b, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    lr = opkit.get("clip") if "clip" in opkit.list_ops() else None
    if lr is not None:  # optional tensor inputs that were not given take no gradient
        with pytest.raises(ValueError, match="must be None"):
            lr.backward(np.ones(3), np.ones(3), out=(None, np.ones(3), None))


def test_a_gradient_into_a_given_array_is_written_as_into_warm_memory(monkeypatch):
    """dx = sum_to(tmp, x) is an identity here: the kernel writes the caller's array itself, so
    it is told so (long runs are then streamed, not read for ownership first)."""
    from opkit.runtime.execute import Executor
    seen = []
    original = Executor._kernel

    def spy(self, k, env, bound, module, tag, warm, *rest, **kw):
        seen.append(warm)
        return original(self, k, env, bound, module, tag, warm, *rest, **kw)

    monkeypatch.setattr(Executor, "_kernel", spy)
    op = opkit.get("leaky_relu")
    x = np.random.default_rng(3).standard_normal(100).astype(np.float16)
    op.backward(x, x, layout="ND")  # (a layout named: the checked path, not the direct call)
    assert seen == [False]
    dx = np.empty_like(x)
    op.backward(x, x, out=(dx,), layout="ND")
    assert seen == [False, True]
    np.testing.assert_array_equal(dx, op.backward(x, x)[0])
