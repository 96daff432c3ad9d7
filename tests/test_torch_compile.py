"""torch.compile of models built from opkit operators: one graph, no breaks (fullgraph=True), the
same results and gradients as eager, with static and dynamic shapes."""
import textwrap

import pytest

torch = pytest.importorskip("torch")

# Inductor imports TorchScript modules that warn about their own deprecation
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

import opkit  # noqa: E402
import opkit.torch  # noqa: E402
from opkit.torch import nn as onn  # noqa: E402

from conftest import write_op  # noqa: E402
from torch_samples import compile_backend  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.act = onn.FusedBiasLeakyReLU(4, clamp=4.0)
        self.spatial = onn.SpatialLeakyReLU((1, 1, 6, 6))
        self.cond = onn.ConditionalLeakyReLU(5, 4)
        self.freq = onn.FreqLeakyReLU(up=2)

    def forward(self, x, z):
        h = self.spatial(self.act(self.conv(x)))
        h = self.freq(self.cond(h, z))
        return torch.ops.opkit.leaky_relu(h * 2, alpha=0.1)


@pytest.fixture
def inductor_cache(tmp_path, monkeypatch):
    """A private cache for Inductor: compiled graphs of an earlier run are not reused."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(model, x, z):
    for p in model.parameters():
        p.grad = None
    y = model(x, z)
    y.square().sum().backward()
    return y, [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
def test_a_model_of_opkit_operators_compiles_to_one_graph(inductor_cache):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    z = torch.randn(2, 5)
    explained = torch._dynamo.explain(model)(x, z)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    want, want_grads = _run(model, x, z)
    compiled = torch.compile(model, fullgraph=True, backend=compile_backend())
    got, got_grads = _run(compiled, x, z)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want)
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g, e)


RESCALE = textwrap.dedent("""\
    name: torch_compile_rescale
    inputs:
      x: {dtypes: [float32, float64], layouts: [NCHW, NHWC]}
      s: {dtypes: [float32, float64], shape: [C]}
    outputs:
      y: {}
    forward:
      y: where(x > 0, x * s, 0.1 * x)
    """)


def test_dynamic_shapes_and_outputs_shaped_by_dim_names(inductor_cache, tmp_path):
    opkit.load(write_op(tmp_path / "ops", RESCALE))
    op = torch.ops.opkit.torch_compile_rescale

    def f(x, s, b):
        return torch.ops.opkit.fused_bias_leaky_relu(op(x, s), b) + 1

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in [(2, 3, 4, 6), (3, 3, 5, 2), (1, 3, 7, 7)]:
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last).requires_grad_()
        s, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        got = compiled(x, s, b)
        got_grads = torch.autograd.grad(got.sum(), (x, s, b))
        want = f(x, s, b)
        want_grads = torch.autograd.grad(want.sum(), (x, s, b))
        assert got.stride() == want.stride() and want.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got, want)
        for g, e in zip(got_grads, want_grads):
            torch.testing.assert_close(g, e)
