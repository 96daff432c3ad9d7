"""opkit operators as PyTorch operators (opkit.torch): registration and schemas, results equal
to the NumPy-level calls and to PyTorch's own formulas, zero-copy views both ways, channels_last
as layout NHWC, dtypes, the in-place and out= variants, operators loaded later, and errors."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import opkit  # noqa: E402
import opkit.torch  # noqa: E402
from opkit.runtime import Op  # noqa: E402

from conftest import write_op  # noqa: E402
from torch_samples import bundled, numpy_call, sample  # noqa: E402


def ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture
def calls(monkeypatch):
    """Every NumPy-level forward and backward call made underneath: (kind, args, kwargs, result)."""
    seen = []
    forward, backward = Op.__call__, Op.backward

    def spy_forward(self, *args, **kwargs):
        result = forward(self, *args, **kwargs)
        seen.append(("forward", args, kwargs, result))
        return result

    def spy_backward(self, dy, *args, **kwargs):
        result = backward(self, dy, *args, **kwargs)
        seen.append(("backward", (dy,) + args, kwargs, result))
        return result
    monkeypatch.setattr(Op, "__call__", spy_forward)
    monkeypatch.setattr(Op, "backward", spy_backward)
    return seen


# ----------------------------------------------------------------------------- registration

def test_every_registered_operator_is_a_torch_operator():
    assert set(bundled()) <= set(opkit.list_ops())
    for name in opkit.list_ops():
        packet = opkit.torch.op(name)
        assert packet is getattr(torch.ops.opkit, name)
        assert hasattr(torch.ops.opkit, f"{name}_out")
    with pytest.raises(KeyError, match="did you mean 'leaky_relu'"):
        opkit.torch.op("leaky_rlu")


def test_schemas_carry_the_declared_attrs_and_defaults():
    s = str(torch.ops.opkit.fused_bias_leaky_relu.default._schema)
    assert s.startswith("opkit::fused_bias_leaky_relu(Tensor x, Tensor bias, float alpha=0.2")
    assert "float gain=1.4142135623730951" in s and "float? clamp=None" in s and s.endswith("-> Tensor")
    assert "int up=2" in str(torch.ops.opkit.freq_leaky_relu.default._schema)
    assert str(torch.ops.opkit.leaky_relu_.default._schema).startswith(
        "opkit::leaky_relu_(Tensor(a!) x, float alpha=0.2")
    assert str(torch.ops.opkit.leaky_relu_out.default._schema).endswith(
        "*, Tensor(a!) out) -> Tensor(a!)")
    assert torch.Tag.inplace in torch.ops.opkit.leaky_relu_.default.tags
    assert torch.Tag.out in torch.ops.opkit.leaky_relu_out.default.tags
    # freq_leaky_relu declares no schedule.inplace: it cannot overwrite its input
    assert not hasattr(torch.ops.opkit, "freq_leaky_relu_")


# ----------------------------------------------------------------------------- results

@pytest.mark.parametrize("name", bundled())
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_results_equal_the_numpy_level_call(name, channels_last):
    tensors, attrs = sample(name, channels_last=channels_last, requires_grad=False)
    ys = getattr(torch.ops.opkit, name)(*tensors, **attrs)
    wants = numpy_call(name, tensors, attrs)
    ys, wants = (ys, wants) if isinstance(ys, tuple) else ((ys,), (wants,))
    assert len(ys) == len(wants)
    # a convolution's result has shapes of its own, and channels_last runs it as NHWC, whose
    # products are summed in another order than NCHW's: equal to float32's rounding
    conv = any(n.op == "conv2d" for n in opkit.get(name).graphs.forward.nodes())
    for y, want in zip(ys, wants):
        if conv and channels_last:
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(y.numpy(), want)
        assert y.dtype == torch.float32 and y.shape == want.shape
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert ys[0].is_contiguous(memory_format=fmt)


def test_results_agree_with_pytorch_formulas():
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(torch.ops.opkit.leaky_relu(x, 0.1), F.leaky_relu(x, 0.1), rtol=0, atol=0)
    a = torch.rand(1, 1, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(torch.ops.opkit.spatial_leaky_relu(x, a), torch.where(x > 0, x, a * x))
    z, w, b = torch.randn(2, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64), \
        torch.randn(3, dtype=torch.float64)
    alpha = 0.1 + 0.2 * torch.sigmoid(z @ w + b)
    torch.testing.assert_close(torch.ops.opkit.conditional_leaky_relu(x, z, w, b),
                               torch.where(x > 0, x, alpha[:, :, None, None] * x))
    v = x + b[:, None, None]
    torch.testing.assert_close(torch.ops.opkit.fused_bias_leaky_relu(x, b, clamp=0.5),
                               (F.leaky_relu(v, 0.2) * 2 ** 0.5).clamp(-0.5, 0.5))


def test_gradients_arrive_in_each_inputs_own_shape():
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64, requires_grad=True)
    a = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)   # one slope per pixel
    z = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    cases = [
        (lambda: torch.ops.opkit.spatial_leaky_relu(x, a), lambda: torch.where(x > 0, x, a * x), (x, a)),
        (lambda: torch.ops.opkit.conditional_leaky_relu(x, z, w, b),
         lambda: torch.where(x > 0, x, (0.1 + 0.2 * torch.sigmoid(z @ w + b))[:, :, None, None] * x),
         (x, z, w, b)),
        (lambda: torch.ops.opkit.fused_bias_leaky_relu(x, b, 0.2, 1.5),
         lambda: F.leaky_relu(x + b[:, None, None], 0.2) * 1.5, (x, b)),
    ]
    for ours, theirs, inputs in cases:
        got = torch.autograd.grad(ours(), inputs, dy)
        want = torch.autograd.grad(theirs(), inputs, dy)
        for g, e, t in zip(got, want, inputs):
            assert g.shape == t.shape and g.dtype == t.dtype
            torch.testing.assert_close(g, e)


def test_only_the_inputs_that_need_gradients_get_them():
    x = torch.randn(2, 3, 4, 6, requires_grad=True)
    b = torch.randn(3)
    y = torch.ops.opkit.fused_bias_leaky_relu(x, b)
    y.sum().backward()
    assert x.grad is not None and b.grad is None
    with torch.no_grad():
        assert torch.ops.opkit.leaky_relu(x).grad_fn is None


# ----------------------------------------------------------------------------- no copies

def test_contiguous_tensors_reach_the_kernels_as_views_and_come_back_as_views(calls):
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    y = torch.ops.opkit.leaky_relu(x, 0.1)
    (kind, args, kwargs, result), = calls
    assert kind == "forward" and ptr(args[0]) == x.data_ptr() and args[0].shape == (4, 8, 16, 16)
    assert y.data_ptr() == ptr(result)
    dy = torch.randn_like(y)
    y.backward(dy)
    kind, args, _, grads = calls[1]
    assert kind == "backward" and ptr(args[0]) == dy.data_ptr() and ptr(args[1]) == x.data_ptr()
    assert x.grad.data_ptr() == ptr(grads[0])  # autograd keeps the gradient it is given


def test_channels_last_is_passed_as_nhwc_and_comes_back_channels_last(calls):
    x = torch.randn(2, 3, 4, 6).contiguous(memory_format=torch.channels_last).requires_grad_()
    b = torch.randn(3, requires_grad=True)
    y = torch.ops.opkit.fused_bias_leaky_relu(x, b, clamp=2.0)
    (_, args, kwargs, result), = calls
    assert kwargs["layout"] == "NHWC"
    assert args[0].shape == (2, 4, 6, 3) and args[0].flags.c_contiguous and ptr(args[0]) == x.data_ptr()
    assert ptr(args[1]) == b.data_ptr()
    assert y.shape == (2, 3, 4, 6) and y.is_contiguous(memory_format=torch.channels_last)
    assert y.data_ptr() == ptr(result)
    # the same values as the NCHW call, element for element
    expected = torch.ops.opkit.fused_bias_leaky_relu(x.contiguous(), b, clamp=2.0)
    assert torch.equal(y, expected)
    y.backward(torch.ones_like(y))
    assert x.grad.is_contiguous(memory_format=torch.channels_last) and b.grad.shape == (3,)
    assert x.grad.data_ptr() == ptr(calls[-1][3][0])


def test_layout_agnostic_operators_take_channels_last_memory_as_it_is(calls):
    x = torch.randn(2, 3, 4, 6).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = torch.ops.opkit.leaky_relu(x, 0.3)
    (_, args, kwargs, result), = calls
    # the common call: the memory in its own order (N, H, W, C), no layout named, no copy
    assert "layout" not in kwargs and args[0].shape == (2, 4, 6, 3) and args[0].flags.c_contiguous
    assert ptr(args[0]) == x.data_ptr()
    assert y.stride() == x.stride() and y.data_ptr() == ptr(result)
    torch.testing.assert_close(y, F.leaky_relu(x, 0.3), rtol=0, atol=0)
    dy = torch.randn(2, 3, 4, 6).contiguous(memory_format=torch.channels_last)
    y.backward(dy)
    kind, args, kwargs, grads = calls[1]
    assert kind == "backward" and "layout" not in kwargs and ptr(args[0]) == dy.data_ptr()
    assert x.grad.stride() == x.stride() and x.grad.data_ptr() == ptr(grads[0])
    torch.testing.assert_close(x.grad, torch.where(x > 0, dy, 0.3 * dy), rtol=0, atol=0)
    # a channels_last tensor with a broadcast one in another order: still the right values
    a = torch.rand(1, 1, 4, 6)
    torch.testing.assert_close(torch.ops.opkit.spatial_leaky_relu(x.detach(), a),
                               torch.where(x > 0, x, a * x).detach(), rtol=0, atol=0)


def test_non_dense_inputs_give_pytorchs_memory_order():
    base = torch.randn(2, 3, 8, 6)
    for x in (base[:, :, ::2], base.transpose(1, 3), torch.randn(3, 1, 6).expand(3, 4, 6)):
        y = torch.ops.opkit.leaky_relu(x, 0.3)
        assert y.stride() == torch.empty_like(x).stride()
        torch.testing.assert_close(y, F.leaky_relu(x, 0.3), rtol=0, atol=0)


def test_mixed_dtypes_follow_numpy_promotion():
    x = torch.randn(2, 3, 4, 6, dtype=torch.float16, requires_grad=True)
    a = torch.rand(1, 1, 4, 6, dtype=torch.float32, requires_grad=True)
    y = torch.ops.opkit.spatial_leaky_relu(x, a)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.float16 and a.grad.dtype == torch.float32


def test_integer_tensors():
    x = torch.arange(-64, 64, dtype=torch.int16)
    np.testing.assert_array_equal(torch.ops.opkit.leaky_relu(x, 0.25).numpy(),
                                  opkit.ops.leaky_relu(x.numpy(), alpha=0.25))


def test_opkits_precision_setting_leaves_torch_dtypes_alone():
    x = torch.randn(16)
    with opkit.config(precision_mode="force_fp16"):
        assert opkit.ops.leaky_relu(x.numpy()).dtype == np.float16
        y = torch.ops.opkit.leaky_relu(x)
    assert y.dtype == torch.float32 and torch.equal(y, F.leaky_relu(x, 0.2))


# ----------------------------------------------------------------------------- in place and out=

def test_in_place_variant_overwrites_its_first_input():
    x = torch.randn(2, 3, 4, 6).contiguous(memory_format=torch.channels_last)
    expected = F.leaky_relu(x, 0.1)
    ptr0, version = x.data_ptr(), x._version
    with torch.no_grad():
        r = torch.ops.opkit.leaky_relu_(x, 0.1)
    assert r is x and x.data_ptr() == ptr0 and x._version > version and torch.equal(x, expected)
    b = torch.randn(3)
    expected = torch.ops.opkit.fused_bias_leaky_relu(x, b)
    torch.ops.opkit.fused_bias_leaky_relu_(x, b)
    assert torch.equal(x, expected) and x.is_contiguous(memory_format=torch.channels_last)


def test_in_place_variant_refuses_to_run_while_autograd_records():
    x = torch.randn(8, requires_grad=True)
    for t in (x, x * 2):
        with pytest.raises(RuntimeError, match=r"leaky_relu_ overwrites x, which the gradient needs"):
            torch.ops.opkit.leaky_relu_(t)
    with torch.no_grad():
        torch.ops.opkit.leaky_relu_(x)  # fine where nothing is recorded


def test_out_variant_writes_the_buffer_it_is_given(calls):
    x = torch.randn(2, 3, 4, 6)
    b = torch.randn(3)
    out = torch.empty(2, 3, 4, 6).contiguous(memory_format=torch.channels_last)
    r = torch.ops.opkit.fused_bias_leaky_relu_out(x, b, 0.1, out=out)
    assert r is out and out.is_contiguous(memory_format=torch.channels_last)
    assert ptr(calls[0][2]["out"]) == out.data_ptr()
    assert torch.equal(out, torch.ops.opkit.fused_bias_leaky_relu(x, b, 0.1))
    with pytest.raises(TypeError, match="out must have dtype float32"):
        torch.ops.opkit.leaky_relu_out(x, out=torch.empty(2, 3, 4, 6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        torch.ops.opkit.leaky_relu_out(x.requires_grad_(), out=out)


# ----------------------------------------------------------------------------- errors

def test_bad_tensors_are_refused_with_what_to_do():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with pytest.raises(TypeError, match=r"x must be a tensor of torch.float16.*got torch.bfloat16; "
                                        r"convert it first, e.g. x.to\(torch.float32\)"):
        torch.ops.opkit.leaky_relu(torch.randn(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="alpha_map must be a tensor of .*got torch.int64"):
        torch.ops.opkit.spatial_leaky_relu(torch.randn(4), torch.ones(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"has layout torch.sparse_coo; .* x.to_dense\(\)"):
        torch.ops.opkit.leaky_relu(torch.randn(4).to_sparse())
    with FakeTensorMode():  # a CUDA tensor's metadata, without a GPU
        cuda = torch.empty(4, device="cuda")
        with pytest.raises(TypeError, match=r"x is on device cuda:0, but opkit kernels run on the "
                                            r"CPU: pass x.cpu\(\)"):
            torch.ops.opkit.leaky_relu(cuda)
    with pytest.raises(ValueError, match=r"alpha must be in \[0.0, 1.0\], got 2.0"):
        torch.ops.opkit.leaky_relu(torch.randn(4), 2.0)
    with pytest.raises(ValueError, match="bias .* has size 4 along dim C but x .* has size 3"):
        torch.ops.opkit.fused_bias_leaky_relu(torch.randn(2, 3, 4, 4), torch.randn(4))


# ----------------------------------------------------------------------------- operators loaded later

SCALE = textwrap.dedent("""\
    name: {name}
    inputs:
      x: {{dtypes: [float32, float64], layouts: [NCHW, NHWC]}}
      s: {{dtypes: [float32, float64], shape: [C]}}
    attrs:
      k: {{type: float, default: 2.0}}
    outputs:
      y: {{}}
    forward:
      y: k * x * s + s
    """)


def test_operators_loaded_later_register_too(tmp_path):
    path = write_op(tmp_path / "ops", SCALE.format(name="torch_scale_shift"))
    assert opkit.load(path) == ["torch_scale_shift"]
    op = opkit.torch.op("torch_scale_shift")
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    s = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = op(x, s, k=3.0)  # an output like no input: its memory order comes from its dim names
    torch.testing.assert_close(y, 3 * x * s[:, None, None] + s[:, None, None])
    assert y.is_contiguous(memory_format=torch.channels_last)
    y.sum().backward()
    torch.testing.assert_close(s.grad, (3 * x + 1).sum((0, 2, 3)))
    torch.library.opcheck(op.default, (x, s), {"k": 0.5})
    assert opkit.load(path) == ["torch_scale_shift"]  # loaded again: registered again, still works
    torch.testing.assert_close(opkit.torch.op("torch_scale_shift")(x, s), y * 2 / 3 + s[:, None, None] / 3)


def test_operators_on_opkit_path_register_at_import(tmp_path):
    write_op(tmp_path / "ops", SCALE.format(name="torch_path_op"))
    code = ("import torch, opkit.torch; x = torch.ones(1, 2, 1, 1); "
            "print(torch.ops.opkit.torch_path_op(x, torch.tensor([1.0, 2.0])).flatten().tolist())")
    env = dict(os.environ, OPKIT_PATH=str(tmp_path / "ops"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "[3.0, 6.0]"


TWICE = textwrap.dedent("""\
    name: {name}
    inputs:
      x: {{dtypes: [float32, float64]}}
    attrs:
      k: {{type: float, default: {k}}}
    outputs:
      y: {{like: x}}
    forward:
      y: k * x
    {schedule}
    """)


def _twice(folder, name, k=2.0, inplace=True):
    schedule = "schedule:\n  inplace: {y: x}" if inplace else ""
    return write_op(folder, TWICE.format(name=name, k=k, schedule=schedule), f"{name}.yaml")


@pytest.mark.slow
def test_an_operators_own_name_wins_over_another_operators_variants(tmp_path):
    x = torch.ones(3)
    # the variants' owner first, then operators called like its variants ...
    opkit.load(_twice(tmp_path / "a", "torch_clash_a"))
    assert torch.ops.opkit.torch_clash_a_(x.clone()).tolist() == [2.0] * 3
    opkit.load(_twice(tmp_path / "a", "torch_clash_a_", k=3.0))
    opkit.load(_twice(tmp_path / "a", "torch_clash_a_out", k=4.0))
    # ... or the other way round
    opkit.load(_twice(tmp_path / "b", "torch_clash_b_", k=3.0))
    opkit.load(_twice(tmp_path / "b", "torch_clash_b_out", k=4.0))
    opkit.load(_twice(tmp_path / "b", "torch_clash_b"))
    for owner in ("torch_clash_a", "torch_clash_b"):
        assert getattr(torch.ops.opkit, owner + "_")(x).tolist() == [3.0] * 3  # the operator
        assert getattr(torch.ops.opkit, owner)(x).tolist() == [2.0] * 3
        assert getattr(torch.ops.opkit, owner + "_out")(x).tolist() == [4.0] * 3
        assert getattr(torch.ops.opkit, owner + "_").default._schema.arguments[0].alias_info is None


def test_a_changed_declaration_loaded_again_replaces_the_operators(tmp_path):
    path = _twice(tmp_path, "torch_reloaded")
    opkit.load(path)
    x = torch.ones(3)
    assert torch.ops.opkit.torch_reloaded(x).tolist() == [2.0] * 3
    assert hasattr(torch.ops.opkit, "torch_reloaded_")
    _twice(tmp_path, "torch_reloaded", k=5.0, inplace=False)
    opkit.load(path)
    assert torch.ops.opkit.torch_reloaded(x).tolist() == [5.0] * 3
    assert torch.ops.opkit.torch_reloaded.default._schema.arguments[1].default_value == 5.0
    assert not hasattr(torch.ops.opkit, "torch_reloaded_")
    out = torch.empty(3)
    torch.ops.opkit.torch_reloaded_out(x, out=out)
    assert out.tolist() == [5.0] * 3


def test_a_gradient_of_a_gradient_is_refused_clearly():
    x = torch.randn(3, 4, requires_grad=True)
    g, = torch.autograd.grad(torch.ops.opkit.leaky_relu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="leaky_relu has a first derivative only"):
        g.sum().backward()


def test_an_attr_defaulting_to_infinity(tmp_path):
    opkit.load(write_op(tmp_path, textwrap.dedent("""\
        name: torch_inf_default
        inputs:
          x: {dtypes: [float32, float64]}
        attrs:
          limit: {type: float, default: inf, range: "(0, inf]"}
        outputs:
          y: {like: x}
        forward:
          y: min(x, limit)
        """)))
    op = opkit.torch.op("torch_inf_default")
    assert str(op.default._schema) == "opkit::torch_inf_default(Tensor x, float? limit=None) -> Tensor"
    x = torch.tensor([1e30, -2.0], dtype=torch.float64)
    assert op(x).tolist() == [1e30, -2.0] and op(x, None).tolist() == [1e30, -2.0]
    assert op(x, 3.0).tolist() == [3.0, -2.0]
    torch.library.opcheck(op.default, (x.requires_grad_(),))


def test_writes_into_tensors_that_cannot_take_them_are_refused():
    expanded = torch.randn(3, 1).expand(3, 4)
    with pytest.raises(ValueError, match=r"leaky_relu_: x has elements that share memory .* "
                                         r"x.clone\(\)"):
        torch.ops.opkit.leaky_relu_(expanded)
    with pytest.raises(ValueError, match=r"leaky_relu_out: out has elements that share memory"):
        torch.ops.opkit.leaky_relu_out(torch.randn(3, 4), out=torch.empty(3, 1).expand(3, 4))
    half = torch.randn(2, 3, 4, 6, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"spatial_leaky_relu_: the result is float32 .* which x "
                                        r"\(float16\) cannot hold"):
        torch.ops.opkit.spatial_leaky_relu_(half, torch.rand(4, 6))
    torch.ops.opkit.spatial_leaky_relu_(half, torch.rand(4, 6, dtype=torch.float16))


def test_an_operator_pytorch_refuses_is_reported_and_opkit_goes_on(tmp_path, monkeypatch):
    from opkit.torch import library

    def refuse(self, taken):
        raise RuntimeError("refused for the test")
    monkeypatch.setattr(library.Entry, "register", refuse)
    with pytest.warns(UserWarning, match=r"operator torch_refused .* is not available as "
                                         r"torch.ops.opkit.torch_refused: RuntimeError: refused"):
        assert opkit.load(_twice(tmp_path, "torch_refused")) == ["torch_refused"]
    np.testing.assert_array_equal(opkit.ops.torch_refused(np.ones(2)), [2.0, 2.0])
    with pytest.raises(KeyError, match="torch_refused is not available in PyTorch: RuntimeError"):
        opkit.torch.op("torch_refused")


# ----------------------------------------------------------------------------- the direct call

def test_modules_skip_the_dispatcher_only_when_eager():
    from torch.utils._python_dispatch import TorchDispatchMode
    act = opkit.torch.nn.LeakyReLU(0.3)
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    y = act(x)
    assert type(y.grad_fn).__name__ == "_DirectBackward"
    torch.testing.assert_close(y, F.leaky_relu(x, 0.3), rtol=0, atol=0)
    dy = torch.randn_like(y)
    (g,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(g, torch.where(x > 0, dy, 0.3 * dy), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="has a first derivative only"):
        (g,) = torch.autograd.grad(act(x), x, dy, create_graph=True)
        g.sum().backward()
    # traced, or seen by a dispatch mode: the registered operator is what runs
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(act))
    assert torch.ops.opkit.leaky_relu.default in [n.target for n in gm.graph.nodes] or \
        torch.ops.opkit.leaky_relu in [n.target for n in gm.graph.nodes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace is deprecated
        assert "opkit::leaky_relu" in str(torch.jit.trace(act, x.detach()).graph)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))
    with Seen() as seen:
        act(x.detach())
    assert any("opkit.leaky_relu" in n or "opkit::leaky_relu" in n for n in seen.names), seen.names


def test_in_place_direct_call_only_where_autograd_does_not_record():
    from opkit.torch.library import call_
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    expected = F.leaky_relu(x, 0.25)
    assert call_("leaky_relu", x, alpha=0.25) is x
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="overwrites x, which the gradient needs"):
        call_("leaky_relu", w * 2, alpha=0.25)
