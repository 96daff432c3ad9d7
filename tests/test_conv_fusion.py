"""conv2d and mean in the DSL, epilogue fusion, its diagnostics, and the three bundled conv
operators against NumPy references nobody here wrote (np.einsum over explicit windows) and,
when PyTorch is installed, against torch autograd."""
import warnings

import numpy as np
import pytest

import opkit
from opkit import FusionWarning, SpecError
from opkit.lower import Fused
from opkit.runtime import execute
from opkit.spec import parse_spec
from opkit.dsl import build_graphs
from opkit.lower import lower

from conftest import write_op


def conv_numpy(x, w, stride, padding):
    """x[N, C, H, W] (*) w[O, C, KH, KW] by a direct sum over the kernel taps (einsum)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for p in range(kh):
        for q in range(kw):
            tap = xp[:, :, p:p + stride * oh:stride, q:q + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", tap, w[:, :, p, q])
    return out


def leaky(v, alpha=0.2):
    return np.where(v > 0, v, alpha * v)


def to_layout(a, layout):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if layout == "NHWC" else a


def from_layout(a, layout):
    return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a


# unit roundoff of each dtype; float16 is computed in float32
UNIT = {np.dtype(np.float64): 2.0 ** -53, np.dtype(np.float32): 2.0 ** -24,
        np.dtype(np.float16): 2.0 ** -11}


def assert_sums_close(got, ref, absref, dtype, terms):
    """got (dtype) against ref (float64 of the same rounded inputs) within the rounding of a sum
    of `terms` products in the compute type (Higham's gamma_n bound on absref, the same sum of
    the terms' magnitudes) and one rounding to dtype: a bound correct code cannot miss and a
    wrong term cannot meet."""
    dtype = np.dtype(dtype)
    acc = UNIT[np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)]
    gamma = terms * acc / (1 - terms * acc)
    bound = UNIT[dtype] * np.abs(ref) + (1 + UNIT[dtype]) * gamma * absref + 1e-300
    err = np.abs(np.asarray(got, np.float64) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (dtype, worst, err[worst], bound[worst])


CASES = [(1, 1, 3), (2, 0, 3), (2, 2, 5), (1, 0, 1), (1, 2, 3)]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,padding,k", CASES)
def test_conv_bias_leaky_relu_matches_numpy(layout, stride, padding, k):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((4, 3, k, k))
    b = rng.standard_normal(4)
    want = leaky(conv_numpy(x, w, stride, padding) + b[:, None, None])
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-4)):
        y = opkit.ops.conv2d_bias_leaky_relu(to_layout(x, layout).astype(dtype), w.astype(dtype),
                                             b.astype(dtype), stride=stride, padding=padding,
                                             layout=layout)
        assert y.dtype == dtype
        np.testing.assert_allclose(from_layout(y, layout), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_bn_inference_and_float16(layout):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 5, 7, 6)), rng.standard_normal((3, 5, 3, 3)) * 0.3
    g, be, m, v = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3), rng.standard_normal(3), \
        rng.uniform(0.5, 2, 3)
    z = conv_numpy(x, w, 1, 1)
    want = leaky((z - m[:, None, None]) * (g / np.sqrt(v + 1e-5))[:, None, None] + be[:, None, None])
    y = opkit.ops.conv2d_bn_leaky_relu(to_layout(x, layout), w, g, be, m, v, padding=1, layout=layout)
    np.testing.assert_allclose(from_layout(y, layout), want, rtol=1e-12, atol=1e-12)
    h = [a.astype(np.float16) for a in (to_layout(x, layout), w, g, be, m, v)]
    y16 = opkit.ops.conv2d_bn_leaky_relu(*h, padding=1, layout=layout)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(from_layout(y16, layout).astype(float), want, rtol=2e-2, atol=2e-2)


def _bn_train_reference(x, w, g, be, stride, padding, eps=1e-5):
    z = conv_numpy(x, w, stride, padding)
    mean = z.mean(axis=(0, 2, 3))
    var = z.var(axis=(0, 2, 3))
    y = leaky((z - mean[:, None, None]) / np.sqrt(var + eps)[:, None, None] * g[:, None, None]
              + be[:, None, None])
    return y, mean, var


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,padding,k", CASES[:3])
def test_conv_bn_train_forward(layout, stride, padding, k):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 2, 8, 9)), rng.standard_normal((5, 2, k, k))
    g, be = rng.uniform(0.5, 1.5, 5), rng.standard_normal(5)
    want = _bn_train_reference(x, w, g, be, stride, padding)
    got = opkit.ops.conv2d_bn_train_leaky_relu(to_layout(x, layout), w, g, be, stride=stride,
                                               padding=padding, layout=layout)
    np.testing.assert_allclose(from_layout(got[0], layout), want[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_bn_train_backward_matches_torch(layout):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    g, be = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    dy, dm, dv = rng.standard_normal((2, 4, 4, 3)), rng.standard_normal(4), rng.standard_normal(4)
    t = [torch.tensor(a, requires_grad=True) for a in (x, w, g, be)]
    z = F.conv2d(t[0], t[1], stride=2, padding=1)
    y = F.leaky_relu(F.batch_norm(z, None, None, t[2], t[3], training=True, eps=1e-5), 0.2)
    loss = (y * torch.tensor(dy)).sum() + (z.mean((0, 2, 3)) * torch.tensor(dm)).sum() + \
        (z.var((0, 2, 3), unbiased=False) * torch.tensor(dv)).sum()
    loss.backward()
    grads = opkit.ops.conv2d_bn_train_leaky_relu.backward(
        (to_layout(dy, layout), dm, dv), to_layout(x, layout), w, g, be, stride=2, padding=1,
        layout=layout)
    want = [a.grad.numpy() for a in t]
    np.testing.assert_allclose(from_layout(grads[0], layout), want[0], rtol=1e-9, atol=1e-10)
    for got, ref in zip(grads[1:], want[1:]):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-10)


def test_fused_equals_unfused_bitwise_for_any_thread_count(monkeypatch):
    """The fused step and its parts run one after another give the same result (float64), and
    the statistics do not depend on the thread count."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 8, 24, 30)), rng.standard_normal((8, 8, 3, 3))
    g, be = rng.uniform(0.5, 1.5, 8), rng.standard_normal(8)
    op = opkit.ops.conv2d_bn_train_leaky_relu
    with opkit.config(num_threads=1):
        one = op(x, w, g, be, padding=1)
    with opkit.config(num_threads=2):
        two = op(x, w, g, be, padding=1)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(execute.Executor, "_fused", lambda self, step, st: False)
    parts = op(x, w, g, be, padding=1)
    for a, b in zip(one, parts):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_fused_step_runs_in_the_compiled_module(monkeypatch):
    """The bundled operators' forward passes are one fused step, and it really runs fused."""
    calls = []
    real = execute.Executor._fused

    def spy(self, step, st):
        ok = real(self, step, st)
        calls.append(ok)
        return ok
    monkeypatch.setattr(execute.Executor, "_fused", spy)
    x, w, b = np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3)), np.zeros(3)
    y = opkit.ops.conv2d_bias_leaky_relu(x, w, b, padding=1)
    assert calls == [True]
    assert y[0, 0, 2, 2] == 18.0 and y[0, 0, 0, 0] == 8.0
    steps = opkit.ops.conv2d_bias_leaky_relu.lowered().forward.steps
    assert len(steps) == 1 and isinstance(steps[0], Fused) and steps[0].epilogue is not None


def test_conv_call_errors():
    op = opkit.ops.conv2d_bias_leaky_relu
    x, b = np.ones((1, 2, 2, 2)), np.zeros(3)
    with pytest.raises(ValueError, match="kernel is larger than the padded input along H"):
        op(x, np.ones((3, 2, 3, 3)), b)
    with pytest.raises(ValueError, match=r"w \(shape \(3, 4, 1, 1\)\) has size 4 along dim C but x"):
        op(x, np.ones((3, 4, 1, 1)), b)
    with pytest.raises(ValueError, match="stride must be in"):
        op(x, np.ones((3, 2, 1, 1)), b, stride=0)


# ---------------------------------------------------------------- diagnostics (no compiling)

HEAD = """name: t
inputs:
  x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}
  w: {dtypes: [float32, float64], shape: [O, C, KH, KW]}
"""


def _lowered(text, extra_inputs=""):
    spec = parse_spec(HEAD + extra_inputs + text, "t.yaml")
    return lower(spec, build_graphs(spec))


def test_fused_epilogue_note():
    low = _lowered("outputs:\n  y: {}\nforward:\n  z: conv2d(x, w, 1, 0)\n"
                   "  y: where(z > 0, z, 0.1 * z)\n")
    notes = [str(n) for n in low.forward.fusion]
    assert notes == ["gt (t.yaml:9): fused into the conv2d epilogue (kernel fwd0)"]


def test_cannot_fuse_when_the_result_is_needed_elsewhere():
    low = _lowered("outputs:\n  y: {}\n  z: {}\nforward:\n  z: conv2d(x, w, 1, 0)\n"
                   "  y: where(z > 0, z, 0.1 * z)\n")
    (note,) = low.forward.fusion
    assert str(note) == ("Cannot fuse gt with preceding op conv2d (t.yaml:10): the conv2d result is "
                         "needed elsewhere: it is the output z as well")


def test_cannot_fuse_across_a_reduction():
    low = _lowered("outputs:\n  y: {}\nforward:\n  s: sum(conv2d(x, w, 1, 0), OH)\n"
                   "  y: s * 2\n")
    assert any("Cannot fuse sum with preceding op conv2d" in str(n) and
               "a shape transform between the ops: a reduction to [N, O, OW]" in str(n)
               for n in low.forward.fusion)


def test_layout_mismatch_fuses_only_in_the_matching_layout():
    low = _lowered("outputs:\n  y: {}\nforward:\n  y: conv2d(x, w, 1, 1) + r\n",
                   "  r: {dtypes: [float32, float64], shape: [N, O, OH, OW]}\n")
    notes = [str(n) for n in low.forward.fusion]
    assert any(n.startswith("Cannot fuse add with preceding op conv2d (t.yaml:9): memory-layout "
                            "mismatch under NHWC: r is stored [N, O, OH, OW], the conv2d result "
                            "[N, OH, OW, O]") for n in notes)
    (step,) = low.forward.steps
    assert isinstance(step, Fused) and step.layouts == ("NCHW",)


def test_residual_add_runs_in_both_layouts(tmp_path):
    """The fused layout and the mismatched one (its parts one after another) agree."""
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 3))
    r = rng.standard_normal((2, 4, 6, 5))
    text = HEAD.replace("name: t", "name: conv_residual") + \
        "  r: {dtypes: [float32, float64], shape: [N, O, OH, OW]}\n" + \
        "outputs:\n  y: {}\nforward:\n  y: conv2d(x, w, 1, 1) + r\n"
    (name,) = opkit.load(write_op(tmp_path, text))
    op = opkit.get(name)
    want = conv_numpy(x, w, 1, 1) + r
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FusionWarning)  # NHWC runs unfused, as the note says
        for layout in ("NCHW", "NHWC"):
            y = op(to_layout(x, layout), w, r, layout=layout)
            np.testing.assert_allclose(from_layout(y, layout), want, rtol=1e-12, atol=1e-12)


def test_fuse_required_is_a_spec_error(tmp_path):
    text = HEAD + "outputs:\n  y: {}\n  z: {}\nforward:\n  z: conv2d(x, w, 1, 0)\n" \
        "  y: where(z > 0, z, 0.1 * z)\nschedule:\n  fuse: required\n"
    path = write_op(tmp_path, text)
    with pytest.raises(SpecError, match=r"op.yaml:10:.*schedule.fuse is required, but: Cannot fuse "
                                        r"gt with preceding op conv2d"):
        opkit.load(path)


def test_fuse_mode_is_checked():
    with pytest.raises(SpecError, match="schedule.fuse: expected one of auto, required, got 'always'"):
        parse_spec(HEAD + "outputs:\n  y: {}\nforward:\n  y: conv2d(x, w, 1, 0)\n"
                   "schedule:\n  fuse: always\n", "t.yaml")


def test_conv2d_declaration_errors():
    with pytest.raises(SpecError, match="conv2d needs weights declared with shape: \\[O, C, KH, KW\\]"):
        build_graphs(parse_spec("name: t\ninputs:\n  x: {dtypes: [float32], layouts: [NCHW]}\n"
                                "  w: {dtypes: [float32]}\noutputs:\n  y: {}\n"
                                "forward:\n  y: conv2d(x, w, 1, 0)\n", "t.yaml"))
    with pytest.raises(SpecError, match="stride must be a whole number >= 1, got 0.5"):
        build_graphs(parse_spec(HEAD + "outputs:\n  y: {}\nforward:\n  y: conv2d(x, w, 0.5, 0)\n",
                                "t.yaml"))
    with pytest.raises(SpecError, match="second dim of the weights \\(K\\) must be the channel dim"):
        build_graphs(parse_spec("name: t\ninputs:\n  x: {dtypes: [float32], layouts: [NCHW]}\n"
                                "  w: {dtypes: [float32], shape: [O, K, KH, KW]}\noutputs:\n  y: {}\n"
                                "forward:\n  y: conv2d(x, w, 1, 0)\n", "t.yaml"))
    with pytest.raises(SpecError, match="conv_transpose2d: the first dim of the weights \\(O\\) "
                       "must be the channel dim of x \\(C\\): declare the weights with shape: "
                       "\\[C, O, KH, KW\\]"):
        build_graphs(parse_spec(HEAD + "outputs:\n  y: {}\nforward:\n  y: conv_transpose2d(x, w, 2, 0)\n",
                                "t.yaml"))


def test_fusion_warning_at_build(tmp_path):
    text = HEAD + "outputs:\n  y: {}\n  z: {}\nforward:\n  z: conv2d(x, w, 1, 0)\n" \
        "  y: where(z > 0, z, 0.1 * z)\n"
    (name,) = opkit.load(write_op(tmp_path, text.replace("name: t", "name: conv_unfused")))
    op = opkit.get(name)
    with pytest.warns(FusionWarning, match="Cannot fuse gt with preceding op conv2d"):
        op.build()
    x, w = np.ones((1, 2, 3, 3)), np.ones((2, 2, 1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FusionWarning)
        y, z = op(x, w)
    np.testing.assert_array_equal(z, np.full((1, 2, 3, 3), 2.0))
    np.testing.assert_array_equal(y, z)


def test_bundled_conv_operators_fuse_completely():
    for name in ("conv2d_bias_leaky_relu", "conv2d_bn_leaky_relu", "conv2d_bn_train_leaky_relu"):
        op = opkit.get(name)
        assert all(n.fused for n in op.lowered().forward.fusion), name
        assert op.fusion_notes() == ()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bench_cases_time_the_same_computation(layout):
    """What `opkit bench` compares computes one result: fused, unfused chain and PyTorch."""
    from opkit.bench.conv import conv_bn_case, conv_bn_train_case
    fns, _ = conv_bn_case((2, 8, 6, 5), 3, layout, np.random.default_rng(0))
    fused = fns["opkit"]()
    np.testing.assert_allclose(fused, fns["opkit unfused"](), rtol=1e-4, atol=1e-5)
    if "torch" in fns:
        for column in ("torch", "torch CL"):   # a logical NCHW tensor, in either memory order
            got = fns[column]()
            want = got.numpy() if layout == "NCHW" else got.permute(0, 2, 3, 1).numpy()
            np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-4)
        fns, _ = conv_bn_train_case((2, 8, 6, 5), 3, layout, np.random.default_rng(0))
        ours = fns["opkit"]()
        for column in ("torch", "torch CL"):
            theirs = fns[column]()
            dx = theirs[0].numpy() if layout == "NCHW" else theirs[0].permute(0, 2, 3, 1).numpy()
            np.testing.assert_allclose(ours[0], dx, rtol=1e-3, atol=1e-4)
            for a, b in zip(ours[1:], theirs[1:]):
                np.testing.assert_allclose(a, b.numpy(), rtol=1e-3, atol=1e-3)


def test_batch_statistics_of_infinities_are_nan_without_a_warning(monkeypatch):
    """Without a BLAS backend the batch statistics are NumPy means of the convolution: a channel
    holding inf and -inf has a NaN mean, as the fused epilogue gives, and NumPy's "invalid
    value" warning does not leak out of the call (nor out of `opkit build`'s validation)."""
    monkeypatch.setenv("OPKIT_BLAS", "none")
    op = opkit.get("conv2d_bn_train_leaky_relu")
    x = np.random.default_rng(5).standard_normal((2, 1, 4, 4))
    x[0, 0, 0, 0], x[1, 0, 2, 3] = np.inf, -np.inf
    w = np.array([1.0, -2.0]).reshape(2, 1, 1, 1)
    finite = np.random.default_rng(6).standard_normal((2, 1, 4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FusionWarning)   # (no BLAS: the build says so)
        warnings.simplefilter("error", RuntimeWarning)
        y, mean, var = op(x, w, np.ones(2), np.zeros(2))
        _, mean2, var2 = op(finite, w, np.ones(2), np.zeros(2))
    assert np.isnan(mean).all() and np.isnan(var).all() and np.isnan(y).all()
    z = w.reshape(2, 1, 1, 1) * finite[:, 0]                  # the 1 x 1 convolution, [O, N, H, W]
    np.testing.assert_allclose(mean2, z.mean(axis=(1, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(var2, z.var(axis=(1, 2, 3)), rtol=1e-10)


def test_the_gemm_backend_is_chosen_by_opkit_gemm(monkeypatch):
    """By default the fused calls run on opkit's generated micro-kernels (nothing cimports
    SciPy); OPKIT_GEMM=blas renders SciPy's BLAS calls; OPKIT_GEMM=none (or OPKIT_BLAS=none)
    renders no fused calls, and the build warns."""
    op = opkit.get("conv2d_bias_leaky_relu")
    for var in ("OPKIT_GEMM", "OPKIT_BLAS"):
        monkeypatch.delenv(var, raising=False)
    source = op.source()
    assert "cython_blas" not in source and 'GEMM = "opkit"' in source
    assert "extern const opk_ukr_f opk_ukrs_f" in source and "def fwdlib0_f" in source
    monkeypatch.setenv("OPKIT_GEMM", "blas")
    assert "cython_blas" in op.source() and 'GEMM = "blas"' in op.source()
    for var, value in (("OPKIT_GEMM", "none"), ("OPKIT_BLAS", "none")):
        monkeypatch.delenv("OPKIT_GEMM", raising=False)
        monkeypatch.setenv(var, value)
        assert "def fwdlib0_f" not in op.source() and "opk_ukr" not in op.source()
        assert any("no GEMM backend" in n for n in op.fusion_notes())
        monkeypatch.delenv(var)
    monkeypatch.setenv("OPKIT_GEMM", "mkl")
    with pytest.raises(ValueError, match="OPKIT_GEMM must be one of opkit, blas, none, not 'mkl'"):
        op.source()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("o,c,stride,k", [(1, 1, 1, 3), (17, 5, 2, 3), (70, 3, 1, 1), (130, 2, 1, 3)])
def test_generated_gemm_tiles_panels_and_tails(layout, o, c, stride, k):
    """The micro-kernels' edges: output channels that fill no vector (1), a part of one (17),
    more than one panel with a narrow last one (70, 130 on 16-lane vectors), one input channel,
    pixel counts that are no multiple of a tile's rows, stride 2, a view with negative and
    non-unit strides, in every compute type and on one or two threads."""
    rng = np.random.default_rng(o + c)
    xfull = rng.standard_normal((3, c, 11, 14 if layout == "NCHW" else 13))
    x = xfull[:, :, ::-1, ::1]  # rows reversed: a negative stride
    w, b = rng.standard_normal((o, c, k, k)), rng.standard_normal(o)
    xl = x.transpose(0, 2, 3, 1) if layout == "NHWC" else x   # channels last: a strided view
    for dtype in (np.float64, np.float32, np.float16):
        xr, wr, br = (a.astype(dtype).astype(np.float64) for a in (np.ascontiguousarray(x), w, b))
        z = conv_numpy(xr, wr, stride, k // 2) + br[:, None, None]
        absz = conv_numpy(np.abs(xr), np.abs(wr), stride, k // 2) + np.abs(br)[:, None, None]
        for threads in (1, 2):
            with opkit.config(num_threads=threads):
                y = opkit.ops.conv2d_bias_leaky_relu(xl.astype(dtype), w.astype(dtype),
                                                     b.astype(dtype), stride=stride,
                                                     padding=k // 2, layout=layout)
            assert y.dtype == dtype
            # LeakyReLU scales an error by at most 1
            assert_sums_close(from_layout(y, layout), leaky(z), absz, dtype, c * k * k + 1)


def conv_grads_numpy(x, w, g, stride, padding):
    """dx and dw of conv_numpy by the adjoint sums over the explicit windows (float64)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = g.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for p in range(kh):
        for q in range(kw):
            win = (slice(None), slice(None), slice(p, p + stride * oh, stride),
                   slice(q, q + stride * ow, stride))
            dw[:, :, p, q] = np.einsum("nohw,nchw->oc", g, xp[win])
            dxp[win] += np.einsum("nohw,oc->nchw", g, w[:, :, p, q])
    return dxp[:, :, padding:padding + h, padding:padding + wd], dw


@pytest.fixture(scope="module")
def conv_plain(tmp_path_factory):
    """y = conv2d(x, w, s, p): its backward is conv2d_dx and conv2d_dw alone."""
    text = HEAD.replace("name: t", "name: conv_plain").replace(
        "[float32, float64]", "[float16, float32, float64]") + \
        "attrs:\n  s: {type: int, default: 1}\n  p: {type: int, default: 0}\n" + \
        "outputs:\n  y: {}\nforward:\n  y: conv2d(x, w, s, p)\n"
    (name,) = opkit.load(write_op(tmp_path_factory.mktemp("conv_plain"), text))
    return opkit.get(name)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,padding,kh,kw", [(1, 1, 3, 3), (1, 0, 3, 3), (1, 2, 3, 3),
                                                  (2, 1, 4, 4), (1, 1, 3, 2), (1, 0, 1, 1),
                                                  (2, 0, 3, 2), (3, 2, 2, 5)])
def test_conv_gradients_run_compiled(conv_plain, monkeypatch, layout, stride, padding, kh, kw):
    """The weight gradient and the input gradient (one stride-1 convolution per phase of a
    strided one; kernels smaller than the stride leave phases no tap reaches) run on the
    module's micro-kernels; both against the adjoint sums, in float64, float32 and float16, on
    one thread and two (bit for bit the same)."""
    from opkit.runtime import conv_grads
    ran = []
    real = conv_grads.compiled_conv_grad

    def spy(module, prim, *args):
        out = real(module, prim, *args)
        ran.append((str(prim), out is not None))
        return out
    monkeypatch.setattr(execute, "compiled_conv_grad", spy)
    op = conv_plain
    rng = np.random.default_rng(kh * 10 + padding)
    x, w = rng.standard_normal((2, 5, 9, 10)), rng.standard_normal((7, 5, kh, kw))
    oh, ow = (9 + 2 * padding - kh) // stride + 1, (10 + 2 * padding - kw) // stride + 1
    g = rng.standard_normal((2, 7, oh, ow))
    for dtype in (np.float64, np.float32, np.float16):
        xr, wr, gr = (a.astype(dtype).astype(np.float64) for a in (x, w, g))
        want_dx, want_dw = conv_grads_numpy(xr, wr, gr, stride, padding)
        abs_dx, abs_dw = conv_grads_numpy(np.abs(xr), np.abs(wr), np.abs(gr), stride, padding)
        got = []
        for threads in (1, 2):
            with opkit.config(num_threads=threads):
                got.append(op.backward(to_layout(g, layout).astype(dtype), to_layout(x, layout).astype(dtype),
                                       w.astype(dtype), s=stride, p=padding, layout=layout))
        for a, b in zip(*got):
            np.testing.assert_array_equal(a, b)
        dx, dw = got[0]
        assert_sums_close(from_layout(dx, layout), want_dx, abs_dx, dtype, 7 * kh * kw)
        assert_sums_close(dw, want_dw, abs_dw, dtype, 2 * oh * ow)
    assert ("conv2d_dw", True) in ran and ("conv2d_dx", True) in ran
    assert all(ok for _, ok in ran)


@pytest.fixture(scope="module")
def conv_transposed(tmp_path_factory):
    """y = conv_transpose2d(x, w, s, p) + b[O] (a generator's stem, as ConvTranspose2d)."""
    text = """name: conv_transposed
inputs:
  x: {dtypes: [float16, float32, float64], layouts: [NCHW, NHWC]}
  w: {dtypes: [float16, float32, float64], shape: [C, O, KH, KW]}
  b: {dtypes: [float16, float32, float64], shape: [O]}
attrs:
  s: {type: int, default: 1}
  p: {type: int, default: 0}
outputs:
  y: {}
forward:
  y: conv_transpose2d(x, w, s, p) + b
"""
    (name,) = opkit.load(write_op(tmp_path_factory.mktemp("conv_transposed"), text))
    return opkit.get(name)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,padding,k", [(1, 0, 4), (2, 1, 4), (2, 0, 3), (3, 1, 2)])
def test_conv_transpose2d_is_the_adjoint_of_conv2d(conv_transposed, monkeypatch, layout, stride,
                                                  padding, k):
    """<conv_transpose2d(x, w), y> = <x, conv2d(y, w)> for the direct sums of conv_numpy, and
    its backward against finite differences of that identity: dx = conv2d(dy, w), dw the
    correlation; float64, float32 and float16; compiled (the phase convolutions) throughout."""
    from opkit.runtime import conv_grads
    ran = []
    real = conv_grads.compiled_conv_grad
    monkeypatch.setattr(execute, "compiled_conv_grad",
                        lambda module, prim, *a: ran.append(prim) or real(module, prim, *a))
    rng = np.random.default_rng(stride * 10 + k)
    x, w, b = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((3, 6, k, k)), rng.standard_normal(6)
    th, tw = (5 - 1) * stride - 2 * padding + k, (4 - 1) * stride - 2 * padding + k
    g = rng.standard_normal((2, 6, th, tw))
    for dtype in (np.float64, np.float32, np.float16):
        xr, wr, br, gr = (a.astype(dtype).astype(np.float64) for a in (x, w, b, g))
        y = conv_transposed(to_layout(x.astype(dtype), layout), w.astype(dtype), b.astype(dtype),
                            s=stride, p=padding, layout=layout)
        y = from_layout(y, layout)
        assert y.shape == g.shape
        # conv_transpose2d(x, w) is conv2d's input gradient for the output gradient x: the
        # adjoint sums, with <conv_transpose2d(x, w), g> = <x, conv2d(g, w)> for the direct ones
        want = conv_grads_numpy(np.zeros(g.shape), wr, xr, stride, padding)[0]
        absy = conv_grads_numpy(np.zeros(g.shape), np.abs(wr), np.abs(xr), stride, padding)[0]
        assert_sums_close(y, want + br[:, None, None], absy + np.abs(br)[:, None, None], dtype,
                          3 * k * k + 1)
        assert np.isclose(np.sum(want * gr), np.sum(xr * conv_numpy(gr, wr, stride, padding)),
                          rtol=1e-12, atol=1e-12 * np.sum(absy * np.abs(gr)))
        dx, dw, db = conv_transposed.backward(to_layout(g.astype(dtype), layout),
                                              to_layout(x.astype(dtype), layout), w.astype(dtype),
                                              b.astype(dtype), s=stride, p=padding, layout=layout)
        assert_sums_close(from_layout(dx, layout), conv_numpy(gr, wr, stride, padding),
                          conv_numpy(np.abs(gr), np.abs(wr), stride, padding), dtype, 6 * k * k)
        # y = conv2d's input gradient of x: dw is the correlation of dy (as the input) with x
        want_dw, abs_dw = (conv_grads_numpy(a, b_, c_, stride, padding)[1] for a, b_, c_ in
                           ((gr, wr, xr), (np.abs(gr), np.abs(wr), np.abs(xr))))
        assert_sums_close(dw, want_dw, abs_dw, dtype, 2 * 5 * 4)
        assert_sums_close(db, gr.sum((0, 2, 3)), np.abs(gr).sum((0, 2, 3)), dtype, 2 * th * tw)
    assert "conv_transpose2d" in ran and "conv2d_dw" in ran   # the module's kernels ran them


def test_conv_transpose2d_matches_torch(conv_transposed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((4, 5, 4, 4)), rng.standard_normal(5)
    for layout in ("NCHW", "NHWC"):
        y = conv_transposed(to_layout(x, layout), w, b, s=2, p=1, layout=layout)
        want = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w),
                                                    torch.from_numpy(b), 2, 1).numpy()
        np.testing.assert_allclose(from_layout(y, layout), want, rtol=1e-12, atol=1e-12)


def test_conv_transpose2d_refuses_a_padding_that_removes_the_output(conv_transposed):
    x, w, b = np.ones((1, 3, 2, 2)), np.ones((3, 6, 2, 2)), np.ones(6)
    with pytest.raises(ValueError, match=r"conv_transpose2d: the padding removes the whole output "
                       r"along H: \(H - 1\) \* stride \+ KH - 2 \* padding = -1 with H = 2, KH = 2, "
                       r"stride 1, padding 2"):
        conv_transposed(x, w, b, s=1, p=2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_scipys_blas_backend_still_computes_the_convolution(layout, monkeypatch):
    """OPKIT_GEMM=blas: the fused call on SciPy's sgemm/dgemm over each block's unfolded matrix
    (channel-major blocks in NCHW) gives the direct sums, with batch statistics."""
    pytest.importorskip("scipy")
    monkeypatch.setenv("OPKIT_GEMM", "blas")
    op = opkit.ops.conv2d_bn_train_leaky_relu
    assert 'GEMM = "blas"' in op.source()
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((5, 3, 3, 3))
    g, b = rng.uniform(0.5, 1.5, 5), rng.standard_normal(5)
    z = conv_numpy(x, w, 2, 1)
    mean, var = z.mean((0, 2, 3)), z.var((0, 2, 3))
    want = leaky((z - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * g[:, None, None]
                 + b[:, None, None])
    y, m, v = op(to_layout(x, layout), w, g, b, stride=2, padding=1, layout=layout)
    np.testing.assert_allclose(from_layout(y, layout), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(m, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(v, var, rtol=1e-10, atol=1e-12)
