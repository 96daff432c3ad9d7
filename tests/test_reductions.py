"""Reductions in the expression language (sum, mean, max, min, logsumexp over named dims) and the
operators of examples/reductions (softmax, log_softmax, logsumexp, layer, RMS, group and pixel
norm, the minibatch standard deviation): forward against NumPy written here, forward and
backward against PyTorch (float64 to the last bits, special values and ties included), float32
and float16 to the project's standard, every layout and stride pattern; means folded into the
kernel that computes what they average; validation's conditioning allowance."""
import functools

import numpy as np
import pytest

import opkit
from opkit.errors import SpecError
from opkit.registry import make_op
from opkit.validate import validate_op
from opkit.validate.compare import Comparison

from conftest import REPO, declaration, write_op

REDUCTIONS = REPO / "examples" / "reductions"
NAMES = sorted(p.stem for p in REDUCTIONS.glob("*.yaml"))
TOL = {np.float16: 2e-3, np.float32: 2e-5}


@functools.lru_cache(maxsize=None)
def op(name):
    return make_op(REDUCTIONS / f"{name}.yaml")


# ------------------------------------------------------------------ NumPy definitions (forward)

def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _log_softmax(x):
    s = x - x.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def _logsumexp(x):
    m = x.max(-1, keepdims=True)
    return (np.log(np.exp(x - m).sum(-1, keepdims=True)) + m)[..., 0]


def _norm_c(x, axis, center, eps):
    d = x - x.mean(axis, keepdims=True) if center else x
    return d / np.sqrt((d * d).mean(axis, keepdims=True) + eps)


def _group_norm(x, eps):
    d = x - x.mean((2, 3, 4), keepdims=True)
    return d / np.sqrt((d * d).mean((2, 3, 4), keepdims=True) + eps)


def _mbstd(x, eps):
    d = x - x.mean(0)
    return np.sqrt((d * d).mean(0) + eps).mean((1, 2, 3))


def _channel_shape(layout, n=2, c=5, h=3, w=4):
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("k", [1, 7, 16, 129])
def test_softmax_family_matches_numpy(dtype, k):
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((9, k)) * 8).astype(dtype)
    x64 = x.astype(np.float64)
    tol = TOL.get(dtype, 1e-13)
    for name, ref in (("softmax", _softmax), ("log_softmax", _log_softmax), ("logsumexp", _logsumexp)):
        got = op(name)(x)
        assert got.dtype == dtype and got.shape == ref(x64).shape
        np.testing.assert_allclose(got.astype(np.float64), ref(x64), rtol=tol, atol=tol, err_msg=name)


def test_softmax_of_large_logits_has_no_nan():
    """exp(x) / sum(exp(x)) overflows for logits past 88 in float32; the shifted form does not."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 100)) * 40).astype(np.float32)
    y = op("softmax")(x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, _softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y.sum(-1), 1, rtol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("view", ["contiguous", "transposed", "reversed"])
def test_channel_norms_match_numpy(layout, dtype, view):
    rng = np.random.default_rng(1)
    axis = 1 if layout == "NCHW" else 3
    x = rng.uniform(-3, 3, _channel_shape(layout, 3, 6, 5, 7))
    if view == "transposed":  # the same logical array, in the other memory order
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1) if layout == "NCHW"
                                 else x.transpose(0, 3, 1, 2))
        x = x.transpose(0, 3, 1, 2) if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    elif view == "reversed":
        x = np.flip(x, axis=(1, 2))
    x = x.astype(dtype)
    w, b = rng.uniform(-2, 2, 6).astype(dtype), rng.uniform(-2, 2, 6).astype(dtype)
    x64, cs = x.astype(np.float64), [-1 if i == axis else 1 for i in range(4)]
    w64, b64 = w.astype(np.float64).reshape(cs), b.astype(np.float64).reshape(cs)
    tol = TOL.get(dtype, 1e-12)
    cases = [("rms_norm", (x, w), _norm_c(x64, axis, False, 1e-6) * w64, {"eps": 1e-6}),
             ("rms_norm", (x,), _norm_c(x64, axis, False, 1e-6), {"eps": 1e-6}),
             ("layer_norm", (x, w, b), _norm_c(x64, axis, True, 1e-5) * w64 + b64, {}),
             ("layer_norm", (x,), _norm_c(x64, axis, True, 1e-5), {}),
             ("pixel_norm", (x,), _norm_c(x64, axis, False, 1e-8), {})]
    for name, args, want, attrs in cases:
        got = op(name)(*args, layout=layout, **attrs)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol,
                                   err_msg=f"{name} with {len(args)} inputs")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_group_norm_and_minibatch_stddev_match_numpy(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5, 6, 7)).astype(dtype)
    tol = TOL.get(dtype, 1e-12)
    np.testing.assert_allclose(op("group_norm")(x), _group_norm(x.astype(np.float64), 1e-5),
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(op("minibatch_stddev")(x), _mbstd(x.astype(np.float64), 1e-8),
                               rtol=tol, atol=tol)


# ------------------------------------------------------------------ against PyTorch

def _torch_cases():
    import torch.nn.functional as F

    def channel(fn):  # a torch function over the last dim, applied to C of NCHW
        return lambda t, *a: fn(t.permute(0, 2, 3, 1), *a).permute(0, 3, 1, 2)

    return {
        "softmax": (lambda t: t.softmax(-1), {}),
        "log_softmax": (lambda t: t.log_softmax(-1), {}),
        "logsumexp": (lambda t: t.logsumexp(-1), {}),
        "rms_norm": (channel(lambda t, w: F.rms_norm(t, (t.shape[-1],), w, 1e-6)), {"layout": "NCHW"}),
        "layer_norm": (channel(lambda t, w, b: F.layer_norm(t, (t.shape[-1],), w, b, 1e-5)),
                       {"layout": "NCHW"}),
        "pixel_norm": (channel(lambda t: t * (t.square().mean(-1, keepdim=True) + 1e-8).rsqrt()),
                       {"layout": "NCHW"}),
        "group_norm": (lambda t, w, b: F.group_norm(
            t.reshape(t.shape[0], -1, *t.shape[3:]), t.shape[1], w.reshape(-1), b.reshape(-1),
            1e-5).reshape(t.shape), {}),
        "minibatch_stddev": (lambda t: ((t - t.mean(0)).square().mean(0) + 1e-8).sqrt().mean((1, 2, 3)), {}),
    }


def _torch_inputs(name, rng):
    if name in ("softmax", "log_softmax", "logsumexp"):
        x = rng.standard_normal((7, 11)) * 6
        x[1, 3] = x[1, 8] = x[1].max() + 2   # a tie for the max
        x[2, 4] = np.nan                     # NaN spreads over its row
        x[3, :] = -np.inf                    # a row of -inf
        x[4, 0] = np.inf                     # +inf in a row: NaN over it, as PyTorch's
        x[5, :] = 1e30                       # large equal logits
        x[6, 2] = 1e30                       # one large logit
        return [x]
    if name == "group_norm":
        return [rng.standard_normal((2, 3, 4, 5, 6)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]
    if name == "minibatch_stddev":
        return [rng.standard_normal((4, 3, 5, 6, 7))]
    x = rng.standard_normal((2, 5, 3, 4))
    x[1, :, 2, 3] = 0.0  # an all-zero pixel: its norm is eps alone
    extra = {"rms_norm": 1, "layer_norm": 2, "pixel_norm": 0}[name]
    return [x] + [rng.standard_normal(5) for _ in range(extra)]


@pytest.mark.parametrize("name", NAMES)
def test_forward_and_backward_match_pytorch(name):
    torch = pytest.importorskip("torch")
    fn, call = _torch_cases()[name]
    rng = np.random.default_rng(4)
    args = _torch_inputs(name, rng)
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    want = fn(*ts)
    dy = rng.standard_normal(tuple(want.shape))
    want.backward(torch.tensor(dy))
    got = op(name)(*args, **call)
    grads = op(name).backward(dy, *args, **call)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-12, atol=1e-12, equal_nan=True)
    for i, (g, t) in enumerate(zip(grads, ts)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-10, equal_nan=True,
                                   err_msg=f"gradient of argument {i}")


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_torch_ops_pass_gradcheck(name):
    torch = pytest.importorskip("torch")
    import opkit.torch  # noqa: F401
    opkit.load(REDUCTIONS)
    f = getattr(torch.ops.opkit, name)
    rng = np.random.default_rng(5)
    args = [torch.tensor(a, requires_grad=True) for a in _torch_inputs(name, rng)]
    if name == "softmax":
        args[0] = torch.tensor(rng.standard_normal((4, 9)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: f(*a), args)


# ------------------------------------------------------------------ the language

def _op_of(tmp_path, expr, inputs=(("x", "{dtypes: [float16, float32, float64], shape: [N, K]}"),)):
    return make_op(write_op(tmp_path, declaration(expr, inputs=list(inputs), name="red")))


def test_max_over_a_dim_is_the_reduction_and_over_a_value_elementwise(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 6))
    two = (("x", "{dtypes: [float64], shape: [N, K]}"), ("z", "{dtypes: [float64], shape: [N, K]}"))
    for expr, want in (("max(x, K)", x.max(1)), ("amax(x, K)", x.max(1)), ("min(x, N)", x.min(0)),
                       ("amin(amin(x, N), K)", x.min())):
        got = _op_of(tmp_path / expr.replace(" ", "").replace(",", "_"), expr)(x)
        np.testing.assert_array_equal(got, want, err_msg=expr)
    z = rng.standard_normal((4, 6))
    elementwise = _op_of(tmp_path / "pair", "max(x, z)", two)
    np.testing.assert_array_equal(elementwise(x, z), np.maximum(x, z))


def test_a_name_that_is_neither_a_value_nor_a_dim_is_a_located_error(tmp_path):
    with pytest.raises(SpecError, match=r"'Q' is not a dim of its argument nor a value in scope "
                                        r"\(its dims: N, K\)") as e:
        _op_of(tmp_path, "max(x, Q)")
    assert "line" in str(e.value) or ".yaml:" in str(e.value)
    with pytest.raises(SpecError, match="needs a value with named dims"):
        _op_of(tmp_path / "nd", "amax(x, K)", (("x", "{dtypes: [float64]}"),))


def test_reductions_over_nothing_are_their_identities(tmp_path):
    x = np.zeros((3, 0))
    np.testing.assert_array_equal(_op_of(tmp_path / "a", "max(x, K)")(x), np.full(3, -np.inf))
    np.testing.assert_array_equal(_op_of(tmp_path / "b", "min(x, K)")(x), np.full(3, np.inf))
    np.testing.assert_array_equal(op("logsumexp")(x), np.full(3, -np.inf))
    np.testing.assert_array_equal(_op_of(tmp_path / "c", "sum(x, K)")(x), np.zeros(3))


def test_max_and_min_gradients_are_pytorchs_amax_and_amin(tmp_path):
    """Ties share the gradient evenly; a row whose max is NaN gets NaN, as PyTorch's amax."""
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 3.0, 3.0, -2.0], [5.0, 5.0, 5.0, 5.0], [0.0, np.nan, 1.0, 2.0],
                  [-np.inf, -np.inf, -7.0, -np.inf]])
    dy = np.array([1.0, 2.0, 3.0, -4.0])
    for expr, fn in (("max(x, K)", torch.amax), ("min(x, K)", torch.amin)):
        o = _op_of(tmp_path / expr[:3], expr)
        t = torch.tensor(x, requires_grad=True)
        fn(t, 1).backward(torch.tensor(dy))
        np.testing.assert_array_equal(o(x), fn(torch.tensor(x), 1).numpy())
        np.testing.assert_array_equal(o.backward(dy, x)[0], t.grad.numpy(), err_msg=expr)


def test_logsumexp_of_infinite_rows_is_pytorchs(tmp_path):
    torch = pytest.importorskip("torch")
    x = np.array([[np.inf, 0.0], [-np.inf, -np.inf], [np.inf, np.inf], [np.nan, 1.0], [1e300, 1e300]])
    np.testing.assert_array_equal(op("logsumexp")(x), torch.logsumexp(torch.tensor(x), 1).numpy())


def test_nested_maxima_are_one_reduction(tmp_path):
    o = _op_of(tmp_path, "max(max(x, N), K)")
    calls = [s for s in o.lowered(o.variants[0]).forward.steps if hasattr(s, "prim")]
    assert [c.prim for c in calls] == ["amax"]


# ------------------------------------------------------------------ means folded into kernels

@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "pixel_norm", "group_norm"])
def test_means_are_added_up_in_the_kernel_that_computes_their_terms(name):
    o = op(name)
    for variant in o.variants:
        plan = o.lowered(variant).forward
        assert not [s for s in plan.steps if getattr(s, "prim", None) == "mean"], variant
        assert any(c.prim == "mean" for k in plan.kernels for c in k.sums)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_folded_means_do_not_depend_on_the_thread_count(layout, dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(_channel_shape(layout, 8, 24, 33, 65)).astype(dtype)
    w = rng.standard_normal(24).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    results = []
    for n in (1, 2, 3):
        with opkit.config(num_threads=n):
            results.append((op("rms_norm")(x, w, layout=layout),
                            *op("rms_norm").backward(dy, x, w, layout=layout)))
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            assert np.array_equal(a, b)


def test_a_folded_mean_of_nothing_is_nan(tmp_path):
    o = _op_of(tmp_path, "mean(x * x, K)")
    assert any(c.prim == "mean" for k in o.lowered(o.variants[0]).forward.kernels for c in k.sums)
    got = o(np.zeros((3, 0)))
    assert got.shape == (3,) and np.isnan(got).all()


# ------------------------------------------------------------------ validation

@pytest.mark.parametrize("name", NAMES)
def test_each_example_passes_validation(name):
    report = validate_op(op(name))
    assert report.ok, report.summary()


def test_the_conditioning_allowance_widens_the_standard_and_nothing_else():
    c = Comparison()
    e = np.array([1.0, 2.0, 3.0])
    c.add(e + [0.0, 5e-4, 0.0], e, "float32", "y", spread=np.array([0.0, 4e-4, 0.0]))
    assert c.worst <= 1.0
    c.add(e + [0.0, 5e-4, 0.0], e, "float32", "z", spread=np.array([4e-4, 0.0, 4e-4]))
    assert c.worst > 1.0 and c.where.startswith("z")
    nan = Comparison()
    nan.add(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), "float32", "w", spread=np.array([np.inf, 1.0]))
    assert nan.worst == np.inf


class _Off:
    """An operator whose forward results are off by a relative 3e-4 (three times the float32
    standard): validation must see it through the conditioning allowance."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, *args, **kwargs):
        y = self._inner(*args, **kwargs)
        return (y * (1 + 3e-4)).astype(y.dtype) if y.dtype == np.float32 else y


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_validation_still_fails_a_wrong_result_after_a_reduction(name):
    report = validate_op(_Off(op(name)), dtypes=["float32"])
    assert not report.ok


# ------------------------------------------------------------------ max, min, logsumexp compiled

def _views(x):
    """The same values in the memory orders the compiled reductions take (rows, columns) and
    in ones they leave to NumPy (reversed runs, strided ones)."""
    return {"rows": x, "columns": np.asfortranarray(x), "rows reversed": x[::-1],
            "reversed runs": x[:, ::-1], "strided": x[::2, ::3]}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 1), (5, 17), (300, 513), (2, 40000)], ids=str)
def test_compiled_reductions_match_numpy_in_every_memory_order(tmp_path, dtype, shape):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 20).astype(dtype)
    x[0, -1] = np.nan
    x[-1, 0] = np.inf
    ops = {"max": _op_of(tmp_path / "a", "max(x, K)"), "min": _op_of(tmp_path / "b", "min(x, K)"),
           "colmax": _op_of(tmp_path / "c", "max(x, N)")}
    assert hasattr(ops["max"].module(), "opk_reduce")
    for label, v in _views(x).items():
        np.testing.assert_array_equal(ops["max"](v), v.max(1), err_msg=label)
        np.testing.assert_array_equal(ops["min"](v), v.min(1), err_msg=label)
        np.testing.assert_array_equal(ops["colmax"](v), v.max(0), err_msg=label)
        want = torch_free_logsumexp(v.astype(np.float64))
        got = op("logsumexp")(v)
        rtol = {np.float16: 5e-4, np.float32: 2e-7, np.float64: 1e-14}[dtype]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0, err_msg=label)


@pytest.mark.parametrize("order, compiled", [("rows", True), ("columns", True),
                                             ("reversed runs", False), ("strided", False)])
def test_the_module_reduces_the_memory_orders_it_compiles(order, compiled):
    """The runtime's compiled path is taken where the header has a loop for the memory order
    (not only that results agree: NumPy would agree too)."""
    from opkit.runtime.reductions import compiled_reduction
    x = np.random.default_rng(10).standard_normal((40, 70)).astype(np.float32)
    v = _views(x)[order]
    got = compiled_reduction(op("logsumexp").module(), "amax", v, ("N", "K"), ("N",), 2)
    assert (got is not None) == compiled
    if compiled:
        np.testing.assert_array_equal(got, v.max(1))
    assert compiled_reduction(None, "amax", v, ("N", "K"), ("N",), 2) is None


def torch_free_logsumexp(x):
    m = x.max(1, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.log(np.exp(x - m).sum(1, keepdims=True)) + m)[:, 0]


@pytest.mark.parametrize("order", ["rows", "columns"])
def test_compiled_reductions_do_not_depend_on_the_thread_count(order):
    x = np.random.default_rng(9).standard_normal((777, 1001)).astype(np.float32)
    x = x if order == "rows" else np.asfortranarray(x)
    results = []
    for n in (1, 2, 3):
        with opkit.config(num_threads=n):
            results.append((op("logsumexp")(x), op("softmax")(x), op("log_softmax")(x)))
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            assert np.array_equal(a, b)


def test_the_listing_shows_a_folded_mean_added_up_not_stored():
    from opkit.lower import cost, listing
    kernel = op("rms_norm").lowered(op("rms_norm").variants[0]).forward.kernels[0]
    lines = listing(kernel, "float32")
    assert not any(line.startswith("vst") for line in lines), lines
    assert any(line.startswith("vadd     acc.") and "float64 partials" in line for line in lines)
    assert cost(kernel, "float32", 64).bytes_per_element == 4  # x read, nothing written
    assert kernel.describe_writes().endswith("= mean((tmp0, not stored), keep=[N, H, W]) in the same pass")
    # layer_norm's mean of x itself: a kernel that loads x for the sum, shown as x
    first = op("layer_norm").lowered(op("layer_norm").variants[0]).forward.steps[0]
    assert "= mean(x, keep=[N, H, W]) in the same pass" in first.describe_writes()


def test_show_lists_the_compiled_reductions_instructions(capsys):
    from opkit.cli import main
    assert main(["show", str(REDUCTIONS / "softmax.yaml")]) == 0
    out = capsys.readouterr().out
    assert "library call amax(x) -> tmp0 (TBE vreduce_max)\n  compiled (templates/opkit_reduce.h)" in out
    assert "vcmax    tmp0, tmp0.acc" in out
    for kind in ("forward", "backward"):
        assert f"{kind} in slices: a call whose largest input has 16 MiB or more runs the steps " \
               "above on slices of about 4 MiB of it along one of N " in out


# ------------------------------------------------------------------ large calls in slices

def _sliced_cases(rng):
    x2 = rng.standard_normal((37, 29)) * 4
    x4 = rng.uniform(-3, 3, (5, 7, 6, 9))                    # NHWC, C = 9
    x5 = rng.standard_normal((6, 3, 4, 5, 7))
    return [("softmax", (x2,), {}),
            ("logsumexp", (x2,), {}),
            ("layer_norm", (x4, rng.uniform(-2, 2, 9), rng.uniform(-2, 2, 9)), {"layout": "NHWC"}),
            ("rms_norm", (x4.transpose(0, 3, 1, 2), rng.uniform(-2, 2, 9)), {"layout": "NCHW"}),
            ("group_norm", (x5, rng.standard_normal((3, 4)), rng.standard_normal((3, 4))), {})]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_large_calls_run_in_slices_along_a_dim_every_reduction_keeps(monkeypatch, dtype):
    """A call with reductions whose largest input passes 4 * ROW_SLICE_BYTES runs slice by slice
    (forced here on small inputs) along a dim the reductions keep: every output is the whole
    call's, to the bit where it spans that dim; a weight's gradient, summed over it, is added
    up across the slices in float64; the same bits on one thread and on two."""
    from opkit.runtime import execute, schedule
    rng = np.random.default_rng(11)
    sliced = []
    real = execute.Executor._run_sliced

    def spy(self, d, step, threads, *args, **kw):
        sliced.append((self.plan.kind, d, step, threads))
        return real(self, d, step, threads, *args, **kw)
    monkeypatch.setattr(execute.Executor, "_run_sliced", spy)
    for name, args, attrs in _sliced_cases(rng):
        args = [a.astype(dtype) for a in args]
        o = op(name)
        y = o(*args, **attrs)
        dy = rng.standard_normal(y.shape).astype(dtype)
        whole = [y, *o.backward(dy, *args, **attrs)]
        assert not sliced
        monkeypatch.setattr(schedule, "ROW_SLICE_BYTES", args[0].nbytes // 16)
        runs = []
        for n in (1, 2):
            with opkit.config(num_threads=n):
                runs.append([o(*args, **attrs), *o.backward(dy, *args, **attrs)])
        monkeypatch.setattr(schedule, "ROW_SLICE_BYTES", 4 << 20)
        assert [k for k, *_ in sliced] == ["forward", "backward"] * 2, (name, sliced)
        assert all(threads == 0 and step < args[0].shape[0] for *_, step, threads in sliced)
        sliced.clear()
        for a, b in zip(*runs):
            assert np.array_equal(a, b, equal_nan=True), name
        for i, (got, want) in enumerate(zip(runs[0], whole)):
            if got.ndim and got.shape[0] == args[0].shape[0]:
                assert np.array_equal(got, want), (name, i)
            else:   # summed over the slices: another order of the same float64 adds
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


def test_only_plans_of_reductions_and_kernels_may_run_in_slices():
    """The dims a plan runs in slices along: those every reduction keeps and no mean's gradient
    divides by; none for a plan with a library call other than a reduction (convolutions) or
    without reductions."""
    from opkit.runtime import schedule
    want = {"softmax": ("N",), "log_softmax": ("N",), "logsumexp": ("N",),
            "layer_norm": ("H", "N", "W"), "rms_norm": ("H", "N", "W"),
            "pixel_norm": ("H", "N", "W"), "group_norm": ("G", "N"), "minibatch_stddev": ("M",)}
    for name, dims in want.items():
        for variant in op(name).variants:
            for ex in op(name)._run_plans(variant):
                assert ex.facts.row_dims == dims == schedule.row_dims(ex.plan), (name, variant.label(), ex.plan.kind)
    for name in ("leaky_relu", "spatial_leaky_relu", "conv2d_bn_train_leaky_relu"):
        assert all(ex.facts.row_dims == () for ex in opkit.get(name)._run_plans() if ex is not None)


def test_row_loops_take_per_pixel_statistics_beside_a_per_channel_weight():
    """A kernel with more than three inputs that may be per-row gets a row loop per layout's
    set of them (those lacking the walk's innermost dim): LayerNorm's normalization over NHWC
    takes the per-pixel mean and deviation as scalars and reads the weight and bias rows in
    place, over NCHW's rows the weight and bias as scalars."""
    from opkit.codegen.render import _row_variants
    o = op("layer_norm")
    variant = next(v for v in o.variants if set(v.given) == {"weight", "bias"})
    k = o.lowered(variant).forward.kernels[-1]
    per_pixel = sum(1 << i for i, d in enumerate(k.in_dims) if "C" not in d)
    per_channel = sum(1 << i for i, d in enumerate(k.in_dims) if d == ("C",))
    assert bin(per_pixel).count("1") == 2 and bin(per_channel).count("1") == 2, k.in_dims
    rows = _row_variants(k, o.spec, [], "layer_norm.yaml", False, None)
    assert per_pixel in rows and per_channel in rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_a_weight_read_through_a_view_gives_the_bits_of_a_contiguous_one(dtype):
    """The row loop reads a weight repeated on every row in place, or converted once into a
    contiguous row when it is a reversed or strided view: the same bits either way."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 5, 6, 40)).astype(dtype)         # NHWC, C = 40
    wide = rng.standard_normal(80).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    for w in (wide[::-2], wide[::2]):
        b = w[::-1]
        got = [op("layer_norm")(x, w, b, layout="NHWC"),
               *op("layer_norm").backward(dy, x, w, b, layout="NHWC")]
        want = [op("layer_norm")(x, w.copy(), b.copy(), layout="NHWC"),
                *op("layer_norm").backward(dy, x, w.copy(), b.copy(), layout="NHWC")]
        for g, r in zip(got, want):
            assert np.array_equal(g, r)
        np.testing.assert_allclose(want[0], _norm_c(x.astype(np.float64), 3, True, 1e-5) * w + b,
                                   rtol=TOL.get(dtype, 1e-12), atol=TOL.get(dtype, 1e-12))


def test_no_sum_or_mean_of_a_bundled_or_example_operator_runs_in_numpy():
    """Every sum and mean is added up in a compiled kernel: folded into the kernel that computes
    its terms, or a kernel of its own that loads an input or a fused convolution's epilogue
    output (dbias, dbeta and the batch-norm terms of the fused operators' backward); the batch
    statistics of a fused step that runs its parts one after another (no BLAS, another
    layout) too."""
    from opkit.lower import Fused, LibCall
    names = [n for n in opkit.list_ops() if "operators" in str(opkit.get(n).spec.file)]
    assert "conv2d_bias_leaky_relu" in names
    ops = [opkit.get(n) for n in names] + [op(n) for n in NAMES]
    for o in ops:
        for variant in o.variants:
            low = o.lowered(variant)
            for plan in (low.forward, low.backward):
                steps = [p for s in (plan.steps if plan else ())
                         for p in (s.parts if isinstance(s, Fused) else (s,))]
                left = [s.name for s in steps if isinstance(s, LibCall) and s.prim in ("sum", "mean")]
                assert not left, (o.name, variant.label(), plan.kind, left)


def test_a_clipped_backward_runs_in_slices_only_without_sums_across_them(monkeypatch):
    """Gradient clipping clamps each output as it is written: a slice's clamped share of a
    weight's gradient would not add up to the clamped sum, so such a call runs whole; softmax's
    clipped dx (no sum across slices) still runs in slices. Both give the whole call's bits."""
    from opkit.runtime import execute, schedule
    rng = np.random.default_rng(19)
    x = rng.uniform(-3, 3, (6, 5, 4, 9))
    w, b = rng.uniform(-2, 2, 9), rng.uniform(-2, 2, 9)
    x2 = rng.standard_normal((24, 7)) * 4
    dy, dy2 = rng.standard_normal(x.shape) * 5, rng.standard_normal(x2.shape) * 5
    calls = {"layer_norm": lambda: op("layer_norm").backward(dy, x, w, b, layout="NHWC", clip=0.5),
             "softmax": lambda: op("softmax").backward(dy2, x2, clip=0.05)}
    whole = {name: f() for name, f in calls.items()}
    sliced = []
    real = execute.Executor._run_sliced

    def spy(self, *args, **kw):
        sliced.append(self.plan.kind)
        return real(self, *args, **kw)
    monkeypatch.setattr(execute.Executor, "_run_sliced", spy)
    monkeypatch.setattr(schedule, "ROW_SLICE_BYTES", 64)
    for name, f in calls.items():
        got = f()
        assert sliced == ([] if name == "layer_norm" else ["backward"]), (name, sliced)
        sliced.clear()
        for g, r in zip(got, whole[name]):
            assert np.array_equal(g, r), name
        assert np.abs(got[0]).max() <= (0.5 if name == "layer_norm" else 0.05)
