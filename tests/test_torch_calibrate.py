"""opkit.torch.AlphaCalibration: re-quantizing slopes every N steps, the recorded drift, and
gradient clipping of the activations (checked against the operators' own clip=)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opkit  # noqa: E402
import opkit.torch  # noqa: E402
from opkit.torch import AlphaCalibration  # noqa: E402


def model():
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.LeakyReLU(0.2),
                         nn.Conv2d(3, 3, 3, padding=1), nn.PReLU(1, init=0.25),
                         nn.Conv2d(3, 3, 3, padding=1), nn.PReLU(3, init=0.3),
                         opkit.torch.nn.SpatialLeakyReLU((1, 1, 4, 4), init=0.1))


def test_every_n_steps_each_kind_of_slope_is_snapped_and_its_drift_recorded():
    m = model()
    calib = AlphaCalibration(m, every=3, bits=7)
    assert [(s.name, s.kind, s.learnable) for s in calib.slopes] == [
        ("1", "fixed", False), ("3", "scalar", True), ("5", "map", True), ("6", "map", True)]
    with torch.no_grad():   # training moved the learnable slopes off the grid
        m[3].weight.fill_(0.2541)
        m[6].alpha_map.normal_(0.1, 0.01)
    assert calib.step() is None and calib.step() is None and m[1].negative_slope == 0.2
    changes = calib.step()
    assert m[1].negative_slope == 26 / 128
    assert float(m[3].weight.detach()) == 33 / 128     # round(0.2541 * 128) = 33
    assert torch.equal(m[5].weight, torch.full((3,), 38 / 128))
    grid = m[6].alpha_map.detach() * 128
    assert torch.equal(grid, torch.round(grid))
    assert [c.name for c in changes] == ["1", "3", "5", "6"]
    drift = calib.history[0]["drift"]
    assert calib.history[0]["step"] == 3
    assert drift["1"] == pytest.approx(26 / 128 - 0.2)
    assert drift["3"] == pytest.approx(33 / 128 - 0.2541, rel=1e-5)
    assert 0 < drift["6"] <= 0.5 / 128 + 1e-7
    for _ in range(3):
        calib.step()
    assert [h["step"] for h in calib.history] == [3, 6]
    assert calib.history[1]["drift"]["1"] == 0      # already on the grid


def test_bits_choose_the_grid():
    m = nn.Sequential(nn.LeakyReLU(0.2))
    AlphaCalibration(m, every=1, bits=3).step()
    assert m[0].negative_slope == 0.25              # round(0.2 * 8) / 8


def test_clip_clamps_the_activation_gradient_as_the_operator_does():
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    dy = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    act = opkit.torch.nn.LeakyReLU(0.25)
    calib = AlphaCalibration(nn.Sequential(act), every=10, clip=0.1)
    xg = x.clone().requires_grad_()
    act(xg).backward(dy)
    dx, = opkit.ops.leaky_relu.backward(dy.numpy(), x.numpy(), alpha=0.25, clip=0.1)
    np.testing.assert_array_equal(xg.grad.numpy(), dx)
    assert xg.grad.abs().max() == 0.1
    calib.remove()
    xg = x.clone().requires_grad_()
    act(xg).backward(dy)
    assert xg.grad.abs().max() > 1


def test_clip_only_clamps_the_activations_share_of_a_gradient():
    act = nn.LeakyReLU(0.2, inplace=True)
    AlphaCalibration(nn.Sequential(act), clip=0.1)
    x = torch.full((5,), -1.0, requires_grad=True)
    y = x * 2
    (act(y.clone()).sum() * 10 + y.sum()).backward()    # activation path: 10*0.2 -> 0.1
    torch.testing.assert_close(x.grad, torch.full((5,), 2 * (0.1 + 1.0)))


def test_clip_clamps_a_learnable_slope_gradient():
    prelu = nn.PReLU(3)
    AlphaCalibration(nn.Sequential(prelu), clip=0.1)
    x = torch.full((2, 3, 4, 4), -5.0)
    prelu(x).sum().backward()                          # unclipped: -5 * 32 per channel
    torch.testing.assert_close(prelu.weight.grad, torch.full((3,), -0.1))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"every": 0}, ValueError, r"every must be a positive integer .*got 0"),
    ({"bits": 16}, ValueError, r"bits must be in 1..15, got 16"),
    ({"clip": -1}, ValueError, r"clip must be > 0, got -1.0"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        AlphaCalibration(model(), **kwargs)


def test_a_model_without_slopes_is_refused():
    with pytest.raises(ValueError, match="has no LeakyReLU slopes to calibrate"):
        AlphaCalibration(nn.Sequential(nn.ReLU()))


def test_fused_convolutions_are_calibrated_too():
    opt, _ = opkit.torch.optimize(nn.Sequential(nn.Conv2d(1, 2, 3), nn.LeakyReLU(0.3)))
    AlphaCalibration(opt, every=1).step()
    fused = [m for m in opt.modules() if isinstance(m, opkit.torch.FusedConvLeakyReLU)]
    assert [f.alpha for f in fused] == [38 / 128]
