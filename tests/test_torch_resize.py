"""Nearest upsampling folded into the convolution after it (opkit/torch/resize.py), against
PyTorch's own Upsample -> Conv2d, forward and backward, in float64 and through optimize()."""
import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from opkit.torch import optimize  # noqa: E402
from opkit.torch.resize import ResizeConv2d, fold_problem, scale_factor  # noqa: E402

CASES = [  # channels in, out, kernel, r, H, W
    (3, 5, 3, 2, 4, 5),
    (3, 20, 3, 2, 1, 3),    # one pixel high: every tap of a phase lands in the padding but one
    (4, 4, 1, 2, 3, 3),     # 1 x 1: upsampling after the convolution
    (2, 3, 5, 3, 4, 2),
    (4, 17, 3, 3, 3, 4),
    (3, 2, 3, 2, 6, 6),
    (2, 2, 3, 3, 2, 3),     # r = 3: phases of one and two taps in one window
    (2, 3, (3, 5), 2, 5, 4),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_upsample_then_conv_forward_and_backward(case, channels_last, bias):
    c, o, k, r, h, w = case
    ks = k if isinstance(k, tuple) else (k, k)
    torch.manual_seed(0)
    conv = nn.Conv2d(c, o, ks, padding=(ks[0] // 2, ks[1] // 2), bias=bias).double()
    x = torch.randn(2, c, h, w, dtype=torch.float64)
    if channels_last:
        conv, x = conv.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    expected = conv(F.interpolate(x, scale_factor=r, mode="nearest"))
    got = ResizeConv2d(conv, r)(x)
    assert got.shape == expected.shape
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(expected)
    params = [x, conv.weight] + ([conv.bias] if bias else [])
    for g, e in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(expected, params, dy)):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_finite_difference_gradients():
    torch.manual_seed(1)
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    plan = ResizeConv2d(conv, 2).plan
    assert torch.autograd.gradcheck(plan.convolve, (x, conv.weight, conv.bias))


@pytest.mark.parametrize("conv, reason", [
    (nn.Conv2d(2, 2, 3, stride=2, padding=1), r"stride=\(2, 2\) \(1 needed\)"),
    (nn.Conv2d(2, 2, 3, padding=1, dilation=2), r"dilation=\(2, 2\)"),
    (nn.Conv2d(2, 2, 3, padding=1, groups=2), r"groups=2"),
    (nn.Conv2d(2, 2, 3, padding=0), r"padding=\(0, 0\) with kernel_size=\(3, 3\)"),
    (nn.Conv2d(2, 2, 2, padding=1), r"padding=\(1, 1\) with kernel_size=\(2, 2\)"),
    (nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), r"padding_mode='reflect'"),
    (nn.ConvTranspose2d(2, 2, 3), r"the consumer is a ConvTranspose2d, not an nn.Conv2d"),
])
def test_what_cannot_be_folded_says_why(conv, reason):
    with pytest.raises(ValueError, match=reason):
        ResizeConv2d(conv, 2, "up.conv")
    assert fold_problem(conv) is not None


@pytest.mark.parametrize("up, r", [
    (nn.Upsample(scale_factor=2, mode="nearest"), 2), (nn.Upsample(scale_factor=3.0), 3),
    (nn.Upsample(scale_factor=(2, 2)), 2), (nn.Upsample(scale_factor=(2, 3)), None),
    (nn.Upsample(scale_factor=1.5), None), (nn.Upsample(scale_factor=2, mode="bilinear"), None),
    (nn.Upsample(size=(8, 8)), None), (nn.Identity(), None),
])
def test_scale_factor(up, r):
    assert scale_factor(up) == r


# ----------------------------------------------------------------------------- in optimize()

def generator(bn_momentum=0.1):
    """upsampling + conv + batch norm + LeakyReLU twice, then upsampling + conv + tanh."""
    return nn.Sequential(
        nn.Upsample(scale_factor=2), nn.Conv2d(8, 16, 3, 1, 1, bias=False),
        nn.BatchNorm2d(16, momentum=bn_momentum), nn.LeakyReLU(0.2),
        nn.Upsample(scale_factor=2), nn.Conv2d(16, 4, 3, 1, 1, bias=False),
        nn.BatchNorm2d(4, momentum=bn_momentum), nn.LeakyReLU(0.2),
        nn.Upsample(scale_factor=2), nn.Conv2d(4, 1, 3, 1, 1), nn.Tanh())


def with_statistics(model):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
                m.weight.normal_(1, 0.3, generator=g)
                m.bias.normal_(0, 0.3, generator=g)
    return model


@pytest.fixture
def z():
    return torch.randn(4, 8, 3, 3, generator=torch.Generator().manual_seed(2))


def test_report_names_each_folded_upsampling(z):
    torch.manual_seed(0)
    opt, report = optimize(generator(), {"layout": "NHWC"}, z)
    assert [str(f) for f in report.folds] == [
        f"upsampling {u} (nearest x2) folded into {c}: 4 phase convolutions over the image before "
        "upsampling" for u, c in (("0", "1"), ("4", "5"), ("8", "9"))]
    assert all(f.reason == "" and f.r == 2 for f in report.folds)
    assert str(report.folds[0]) in str(report).splitlines()
    assert not any(n.op == "call_module" and isinstance(opt.get_submodule(n.target), nn.Upsample)
                   for n in opt.graph.nodes)
    off, report = optimize(generator(), {"layout": "NHWC", "fold_upsampling": False}, z)
    assert report.folds == []
    assert sum(n.op == "call_module" and isinstance(off.get_submodule(n.target), nn.Upsample)
               for n in off.graph.nodes) == 3


def test_an_upsampling_read_twice_stays():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.conv = nn.Upsample(scale_factor=2), nn.Conv2d(2, 2, 3, 1, 1)

        def forward(self, x):
            u = self.up(x)
            return self.conv(u) + u
    model = Two()
    opt, report = optimize(model)
    assert report.folds == []
    assert any(n.target == "up" for n in opt.graph.nodes if n.op == "call_module")
    x = torch.randn(1, 2, 3, 3)
    torch.testing.assert_close(opt(x), model(x), rtol=0, atol=0)


def test_an_unfoldable_convolution_is_reported():
    model = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(2, 2, 3, stride=2, padding=1))
    _, report = optimize(model)
    assert [str(f) for f in report.folds] == ["upsampling 0 not folded into 1: stride=(2, 2) (1 needed)"]
    # a fused chain on opkit's own convolution takes the upsampled image as it is
    _, report = optimize(generator(), {"conv": "opkit"})
    assert [f.reason for f in report.folds][:2] == [
        "its fused chain runs opkit's convolution (conv='opkit'), which takes the upsampled image"] * 2
    assert report.folds[2].reason == ""  # the last convolution is not fused: folded


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("conv", ["auto", "opkit"])
def test_eval_matches_the_original(z, layout, conv):
    torch.manual_seed(0)
    model = with_statistics(generator()).eval()
    opt, _ = optimize(model, {"layout": layout, "conv": conv}, z)
    with torch.no_grad():
        expected = model(z)
        got = opt(z)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_steps_match_the_original(z, momentum):
    torch.manual_seed(0)
    model = with_statistics(generator(momentum)).train()
    opt, _ = optimize(copy.deepcopy(model), {"layout": "NHWC"}, z)
    target = torch.rand(4, 1, 24, 24, generator=torch.Generator().manual_seed(5))
    for m in (model, opt):
        sgd = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            sgd.zero_grad()
            F.mse_loss(m(z), target).backward()
            sgd.step()
    got, expected = opt.state_dict(), model.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_eval_weights_made_once_follow_every_change_of_the_parameters(z):
    """In eval the folded weights are kept between calls: an in-place change of any parameter
    or running statistic, a load_state_dict or a new dtype makes them again."""
    torch.manual_seed(0)
    model = with_statistics(generator()).eval()
    opt, _ = optimize(model, {"layout": "NHWC"}, z)
    opt.eval()

    def check():
        with torch.no_grad():
            expected = model(z)
            got = opt(z)
        assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    check()
    check()  # the kept weights
    with torch.no_grad():
        for src in (model, opt):  # the same change in both
            src.get_submodule("1").weight.mul_(1.5)
            src.get_submodule("9").bias.add_(0.25)
            src.get_submodule("2").running_var.mul_(2.0)
    check()
    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    opt.load_state_dict(state)
    check()
    model.double(), opt.double()
    with torch.no_grad():
        torch.testing.assert_close(opt(z.double()), model(z.double()), rtol=1e-9, atol=1e-9)
