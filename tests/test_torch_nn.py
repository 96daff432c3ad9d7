"""opkit.torch.nn: each module computes its operator, trains its parameters, prints a useful
repr, round-trips through a state_dict and follows .double() / .half()."""
import copy
import io
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import opkit.torch  # noqa: E402,F401  (registers the operators)
from opkit.torch import nn as onn  # noqa: E402


def x4(dtype=torch.float32, channels_last=False):
    x = torch.randn(2, 3, 4, 6, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def modules():
    """(module, its inputs besides x, the PyTorch formula it computes)."""
    torch.manual_seed(0)
    z = torch.randn(2, 5)
    cond = onn.ConditionalLeakyReLU(5, 3, alpha_min=0.05, alpha_max=0.4)
    with torch.no_grad():
        cond.b.uniform_(-1, 1)
    spatial = onn.SpatialLeakyReLU((1, 1, 4, 6), init=0.25)
    fused = onn.FusedBiasLeakyReLU(3, alpha=0.1, clamp=2.0)
    with torch.no_grad():
        spatial.alpha_map.uniform_(0, 1)
        fused.bias.uniform_(-1, 1)
    return [
        (onn.LeakyReLU(0.1), (), lambda x: F.leaky_relu(x, 0.1)),
        (spatial, (), lambda x: torch.where(x > 0, x, spatial.alpha_map * x)),
        (cond, (z,), lambda x, z: torch.where(
            x > 0, x, (0.05 + 0.35 * torch.sigmoid(z @ cond.w + cond.b))[:, :, None, None] * x)),
        (fused, (), lambda x: (F.leaky_relu(x + fused.bias[:, None, None], 0.1) * math.sqrt(2)).clamp(-2, 2)),
        (onn.Op("fused_bias_leaky_relu", gain=1.0), (torch.zeros(3),), lambda x, b: F.leaky_relu(x, 0.2)),
    ]


def test_modules_compute_their_operator_and_train_their_parameters():
    for module, extra, formula in modules():
        for channels_last in (False, True):
            x = x4(channels_last=channels_last)
            torch.testing.assert_close(module(x, *extra), formula(x, *extra))
        params = list(module.parameters())
        if params:
            module(x4(), *extra).square().sum().backward()
            for p in params:
                assert p.grad is not None and p.grad.shape == p.shape and p.grad.abs().sum() > 0


def test_freq_module_matches_its_operator():
    m = onn.FreqLeakyReLU(alpha=0.1, up=4, gain=2.0)
    x = x4()
    assert torch.equal(m(x), torch.ops.opkit.freq_leaky_relu(x, 0.1, 4, 2.0))


def test_reprs_show_the_hyperparameters():
    assert repr(onn.LeakyReLU()) == "LeakyReLU(alpha=0.2)"
    assert repr(onn.SpatialLeakyReLU((1, 1, 8, 8), learnable=False)) == \
        "SpatialLeakyReLU(map_shape=(1, 1, 8, 8), learnable=False)"
    assert repr(onn.ConditionalLeakyReLU(16, 8)) == \
        "ConditionalLeakyReLU(z_dim=16, channels=8, alpha_min=0.1, alpha_max=0.3)"
    assert repr(onn.FreqLeakyReLU(up=4)) == "FreqLeakyReLU(alpha=0.2, up=4, gain=1)"
    assert repr(onn.FusedBiasLeakyReLU(8, clamp=256.0)) == \
        "FusedBiasLeakyReLU(channels=8, alpha=0.2, gain=1.41421, clamp=256)"
    assert repr(onn.Op("leaky_relu", alpha=0.3)) == "Op('leaky_relu', alpha=0.3)"


def test_state_dicts_round_trip():
    for module, extra, _ in modules():
        buf = io.BytesIO()
        torch.save(module.state_dict(), buf)
        buf.seek(0)
        fresh = type(module)(**_ctor_args(module))
        fresh.load_state_dict(torch.load(buf))
        x = x4()
        assert torch.equal(fresh(x, *extra), module(x, *extra))
    frozen = onn.SpatialLeakyReLU((4, 6), learnable=False)
    assert list(frozen.state_dict()) == ["alpha_map"] and not list(frozen.parameters())


def _ctor_args(module):
    if isinstance(module, onn.SpatialLeakyReLU):
        return {"map_shape": module.map_shape}
    if isinstance(module, onn.ConditionalLeakyReLU):
        return {"z_dim": module.z_dim, "channels": module.channels,
                "alpha_min": module.alpha_min, "alpha_max": module.alpha_max}
    if isinstance(module, onn.FusedBiasLeakyReLU):
        return {"channels": module.channels, "alpha": module.alpha, "clamp": module.clamp}
    if isinstance(module, onn.Op):
        return {"name": module.name, **module.attrs}
    return {"alpha": module.alpha}


@pytest.mark.parametrize("convert, dtype", [("double", torch.float64), ("half", torch.float16)])
def test_double_and_half(convert, dtype):
    for module, extra, formula in modules():
        getattr(module, convert)()
        assert all(p.dtype == dtype for p in module.parameters())
        x = x4(dtype)
        extra = tuple(e.to(dtype) for e in extra)
        y = module(x, *extra)
        assert y.dtype == dtype
        if dtype == torch.float64:
            torch.testing.assert_close(y, formula(x, *extra))
        else:  # float16 computes in float32 and rounds once: the float32 module, rounded
            want = copy.deepcopy(module).float()(x.float(), *(e.float() for e in extra))
            torch.testing.assert_close(y, want.half(), rtol=1e-3, atol=1e-3)


def test_bad_settings_fail_when_the_module_is_built():
    with pytest.raises(ValueError, match=r"alpha must be in \[0.0, 1.0\], got 1.5"):
        onn.LeakyReLU(1.5)
    with pytest.raises(TypeError, match="up must be an integer"):
        onn.FreqLeakyReLU(up=2.5)
    with pytest.raises(TypeError, match="fused_bias_leaky_relu has no attr 'clip'; did you mean 'clamp'"):
        onn.Op("fused_bias_leaky_relu", clip=1.0)
    with pytest.raises(KeyError, match="did you mean 'leaky_relu'"):
        onn.Op("leaky_rel")
