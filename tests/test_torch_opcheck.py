"""PyTorch's correctness contract for custom operators on every bundled operator:
torch.library.opcheck (schema, autograd registration, fake kernel against the real one, AOT
dispatch with dynamic shapes) on float32, float64 and float16, NCHW and channels_last, broadcast
inputs, every differentiable input requiring grad; torch.autograd.gradcheck in float64."""
import pytest

torch = pytest.importorskip("torch")

import opkit.torch  # noqa: E402,F401  (registers the operators)

from torch_samples import bundled, sample  # noqa: E402

OPCHECK = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("name", bundled())
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_opcheck(name, dtype, channels_last):
    tensors, attrs = sample(name, dtype, channels_last, seed=hash((name, dtype)) % 1000)
    result = torch.library.opcheck(getattr(torch.ops.opkit, name).default, tensors, attrs)
    assert result == {t: "SUCCESS" for t in OPCHECK}


@pytest.mark.parametrize("name", bundled())
def test_opcheck_inputs_of_full_size_and_without_grad(name):
    op = getattr(torch.ops.opkit, name).default
    tensors, attrs = sample(name, broadcast=False)
    torch.library.opcheck(op, tensors, attrs)
    tensors, attrs = sample(name, requires_grad=False)
    torch.library.opcheck(op, tensors, attrs)


@pytest.mark.parametrize("name", [n for n in bundled() if hasattr(torch.ops.opkit, n + "_")])
def test_opcheck_in_place_and_out_variants(name):
    tensors, attrs = sample(name, requires_grad=False)
    torch.library.opcheck(getattr(torch.ops.opkit, name + "_").default, tensors, attrs)
    out = torch.empty_like(tensors[0]).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(getattr(torch.ops.opkit, name + "_out").default, tensors,
                          dict(attrs, out=out))


@pytest.mark.parametrize("name", bundled())
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_gradcheck_float64(name, channels_last):
    tensors, attrs = sample(name, "float64", channels_last, seed=7)
    op = getattr(torch.ops.opkit, name)
    assert torch.autograd.gradcheck(lambda *ts: op(*ts, **attrs), tensors)
