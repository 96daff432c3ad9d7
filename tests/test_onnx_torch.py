"""torch.onnx.export of a PyTorch model that calls torch.ops.opkit.* operators: onnxruntime runs
the exported model and gives the model's results (float32 and float16, a dynamic batch)."""
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opkit  # noqa: E402
import opkit.torch  # noqa: E402,F401

from conftest import REPO  # noqa: E402

ACTIVATIONS = REPO / "examples" / "activations"


@pytest.fixture(scope="module", autouse=True)
def example_ops():
    for name in ("gelu", "clip"):  # a str attr; optional inputs
        if name not in opkit.list_ops():
            opkit.load(ACTIVATIONS / f"{name}.yaml")


class Net(torch.nn.Module):
    """A convolution with bias and LeakyReLU, a fused bias, the tanh GELU, a one-sided clip."""

    def __init__(self, dtype):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3, generator=g, dtype=dtype) * 0.3)
        self.b = torch.nn.Parameter(torch.randn(4, generator=g, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.randn(4, generator=g, dtype=dtype))
        self.register_buffer("low", torch.full((4, 1, 1), -0.05, dtype=dtype))

    def forward(self, x):
        ops = torch.ops.opkit
        y = ops.conv2d_bias_leaky_relu(x, self.w, self.b, stride=2, padding=1, alpha=0.1)
        y = ops.fused_bias_leaky_relu(y, self.bias, alpha=0.2, clamp=2.0)
        y = ops.gelu(y * 0.5, approximate="tanh")
        return ops.leaky_relu(ops.clip(y, self.low, None), alpha=0.3)


def _export(model, example) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        # PyTorch 2.13 calls its TorchScript-based exporter legacy; the dynamo one needs onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (example,), f, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    return f.getvalue()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_a_model_calling_opkit_operators_exports_and_runs_under_onnxruntime(dtype, tol):
    model = Net(dtype).eval()
    example = torch.randn(2, 3, 9, 8, dtype=dtype)
    if dtype == torch.float32:  # channels_last calls run as NHWC; the export is the same
        example = example.contiguous(memory_format=torch.channels_last)
    exported = _export(model, example)
    session = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    x = torch.randn(5, 3, 9, 8, dtype=dtype, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    got, = session.run(None, {"x": x.numpy()})
    assert got.dtype == want.dtype and got.shape == want.shape == (5, 4, 5, 4)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    # every call was inlined as standard operators
    nodes = onnx.load_from_string(exported).graph.node
    assert {n.domain for n in nodes} == {""} and "Conv" in {n.op_type for n in nodes}


def test_a_channels_last_convolution_gives_its_logical_result():
    """The result of a conv2d, on dims of its own, comes back in logical order (N, O, OH, OW)
    from a channels_last input, as from a contiguous one."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 9, 8, generator=g)
    w, b = torch.randn(4, 3, 3, 3, generator=g), torch.randn(4, generator=g)
    want = torch.ops.opkit.conv2d_bias_leaky_relu(x, w, b, stride=2, padding=1)
    got = torch.ops.opkit.conv2d_bias_leaky_relu(x.contiguous(memory_format=torch.channels_last),
                                                  w, b, stride=2, padding=1)
    assert got.shape == want.shape == (2, 4, 5, 4)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
