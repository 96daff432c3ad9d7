"""opkit.torch.optimize: the configuration, the fusion report, alpha_quant, and the optimized
model against the original in eval and for one training step."""
import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import opkit.torch  # noqa: E402
from opkit.torch import FusedConvLeakyReLU, optimize  # noqa: E402


def discriminator(bias_before_bn=False, momentum=0.1):
    """DCGAN's discriminator for 1 x 16 x 16 images, small enough for tests."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(8, 16, 4, 2, 1, bias=bias_before_bn), nn.BatchNorm2d(16, momentum=momentum),
        nn.LeakyReLU(0.2),
        nn.Conv2d(16, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16, momentum=momentum),
        nn.LeakyReLU(0.2),
        nn.Conv2d(16, 1, 4, 1, 0), nn.Flatten())


def with_statistics(model):
    """Running statistics far from their initial values, so eval-mode batch norm matters."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


def assert_rel(actual, expected, tol):
    """max |actual - expected| within tol of the output's scale."""
    scale = expected.abs().max().item()
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * scale, f"max deviation {err:.3g} > {tol} x {scale:.3g}"


@pytest.fixture
def x():
    return torch.randn(6, 1, 16, 16, generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("config, match", [
    ({"precision": "force_fp16"}, r"unknown config key 'precision' \(did you mean 'precision_mode'\?\); "
                                  r"valid keys: precision_mode, leakyrelu_fusion, alpha_quant, layout, conv"),
    ({"precision_mode": "fp16"}, r"config\['precision_mode'\] must be one of 'must_keep_origin_dtype', "
                                 r"'force_fp16', 'force_fp32', 'allow_fp32_to_fp16', 'allow_mix_precision'; got 'fp16'"),
    ({"layout": "nhwc"}, r"config\['layout'\] must be one of 'NHWC', 'NCHW', None; got 'nhwc'"),
    ({"leakyrelu_fusion": 1}, r"config\['leakyrelu_fusion'\] must be one of True, False; got 1"),
    ({"alpha_quant": "yes"}, r"config\['alpha_quant'\] must be one of True, False; got 'yes'"),
    ({"conv": "mkl"}, r"config\['conv'\] must be one of 'auto', 'opkit', 'torch'; got 'mkl'"),
])
def test_bad_config_lists_the_valid_keys_and_values(config, match):
    with pytest.raises(ValueError, match=match):
        optimize(discriminator(), config)


def test_not_a_dict_or_not_a_module():
    with pytest.raises(TypeError, match="config must be a dict"):
        optimize(discriminator(), [("layout", "NHWC")])
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        optimize(lambda t: t)


def test_untraceable_model_says_why():
    class Branchy(nn.Module):
        def forward(self, t):
            return t if t.sum() > 0 else -t
    with pytest.raises(ValueError, match="torch.fx cannot trace Branchy.*Data-dependent"):
        optimize(Branchy())


# ----------------------------------------------------------------------------- the report

def test_report_fuses_the_three_chains_and_keeps_the_state_dict(x):
    model = discriminator()
    opt, report = optimize(model, {"conv": "torch"}, x)
    assert [(e.node, e.fused, e.chain) for e in report] == [
        ("1", True, ("0",)), ("4", True, ("2", "3")), ("7", True, ("5", "6"))]
    # conv="torch": PyTorch's convolution, opkit's slope; the report says so
    assert str(report).splitlines() == [
        "1: fused 0 -> LeakyReLU into conv2d + leaky_relu",
        "4: fused 2 -> 3 -> LeakyReLU into conv2d (batch norm folded in) + leaky_relu (training: "
        "conv2d + batch_norm + leaky_relu)",
        "7: fused 5 -> 6 -> LeakyReLU into conv2d (batch norm folded in) + leaky_relu (training: "
        "conv2d + batch_norm + leaky_relu)"]
    _, on_opkit = optimize(model, {"conv": "opkit"}, x)
    assert [e.operator for e in on_opkit] == [
        "conv2d_bias_leaky_relu",
        "conv2d_bn_leaky_relu (training: conv2d_bn_train_leaky_relu)",
        "conv2d_bn_leaky_relu (training: conv2d_bn_train_leaky_relu)"]
    assert sum(isinstance(m, FusedConvLeakyReLU) for m in opt.modules()) == 3
    called = [n.target for n in opt.graph.nodes if n.op == "call_module"]
    assert not any(isinstance(opt.get_submodule(t), (nn.Conv2d, nn.LeakyReLU, nn.BatchNorm2d))
                   for t in called[:3])
    assert list(opt.state_dict()) == list(model.state_dict())
    assert isinstance(model[1], nn.LeakyReLU)   # the original is left as it was
    twin = copy.deepcopy(opt)                   # a copy's fused modules read the copy's weights
    fused = twin.get_submodule("opkit_fused.2")
    assert fused.conv is twin.get_submodule("2") and fused.bn is twin.get_submodule("3")


class Net(nn.Module):
    """One LeakyReLU per reason it cannot fuse."""

    def __init__(self):
        super().__init__()
        self.conv_flat = nn.Conv2d(3, 4, 3, padding=1)
        self.act_flat = nn.LeakyReLU(0.2)
        self.conv_perm = nn.Conv2d(3, 4, 3, padding=1)
        self.conv_mem = nn.Conv2d(3, 4, 3, padding=1)
        self.act_mem = nn.LeakyReLU(0.2)
        self.conv_two = nn.Conv2d(3, 4, 3, padding=1)
        self.act_two = nn.LeakyReLU(0.2)
        self.linear = nn.Linear(4, 4)
        self.act_linear = nn.LeakyReLU(0.2)
        self.up = nn.AvgPool2d(1)
        self.bn_up = nn.BatchNorm2d(3)
        self.act_up = nn.LeakyReLU(0.2)
        self.conv_groups = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.act_groups = nn.LeakyReLU(0.2)
        self.conv_dil = nn.Conv2d(3, 4, 3, padding=2, dilation=2)
        self.act_dil = nn.LeakyReLU(0.2)
        self.conv_reflect = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.act_reflect = nn.LeakyReLU(0.2)
        self.conv_stride = nn.Conv2d(3, 4, 3, stride=(1, 2), padding=1)
        self.act_stride = nn.LeakyReLU(0.2)
        self.conv_ok = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        a = self.act_flat(self.conv_flat(x).flatten(1))
        b = F.leaky_relu(self.conv_perm(x).permute(0, 2, 3, 1), 0.1)
        c = self.act_mem(self.conv_mem(x).contiguous(memory_format=torch.channels_last))
        t = self.conv_two(x)
        d = self.act_two(t) + t
        e = self.act_linear(self.linear(a[:, :4]))
        f = self.act_up(self.bn_up(self.up(x)))
        g = self.act_groups(self.conv_groups(c))
        h = self.act_dil(self.conv_dil(x))
        i = self.act_reflect(self.conv_reflect(x))
        j = self.act_stride(self.conv_stride(x))
        k = F.leaky_relu(self.conv_ok(x), 0.3)
        return a, b, c, d, e, f, g, h, i, j, k


def test_every_reason_a_leaky_relu_cannot_fuse():
    _, report = optimize(Net(), {"conv": "torch"}, torch.randn(2, 3, 8, 8))
    lines = str(report).splitlines()
    assert len(lines) == len(report) == 11
    expect = {
        "act_flat": ("conv_flat", "a shape transform between them (.flatten(), flatten)"),
        "leaky_relu": ("conv_perm", "a shape transform between them (.permute(), permute)"),
        "act_mem": ("conv_mem", "memory-layout mismatch: .contiguous() (contiguous) converts the "
                                "memory format between them"),
        "act_two": ("conv_two", "its output is also used by add, which needs the value before "
                                "the LeakyReLU"),
        "act_linear": ("linear", "the preceding op is not a convolution or batch norm (Linear)"),
        "act_up": ("bn_up", "the preceding op is a batch norm whose input is not a convolution "
                            "(AvgPool2d)"),
        "act_groups": ("conv_groups", "unsupported convolution: groups=2 (the fused operators "
                                      "take groups=1)"),
        "act_dil": ("conv_dil", "unsupported convolution: dilation=(2, 2) (the fused operators "
                                "take dilation=1)"),
        "act_reflect": ("conv_reflect", "unsupported convolution: padding_mode='reflect' (the "
                                        "fused operators pad with zeros)"),
        "act_stride": ("conv_stride", "unsupported convolution: stride=(1, 2) (the fused "
                                      "operators take one stride for both axes)"),
    }
    for e in report.not_fused:
        producer, reason = expect.pop(e.node)
        assert (e.producer, e.reason) == (producer, reason)
        assert f"{e.node}: Cannot fuse LeakyReLU with preceding op {producer}: {reason}" in lines
    assert not expect
    assert [e.node for e in report.fused] == ["leaky_relu_1"]


def test_layout_mismatch_seen_in_the_example_input():
    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.act = nn.LeakyReLU(0.2)

        def forward(self, x):
            return self.act(self.conv(x))
    x = torch.randn(2, 8, 8, 3).permute(0, 3, 2, 1)   # neither NCHW nor NHWC in memory
    _, report = optimize(Transposed(), None, x)
    assert not report[0].fused
    assert report[0].reason.startswith("memory-layout mismatch: the convolution's input is "
                                       "neither NCHW nor NHWC (channels_last) in memory (strides")
    _, report = optimize(Transposed(), None, x.contiguous())
    assert report[0].fused


def test_fusion_off_leaves_the_graph_alone(x):
    opt, report = optimize(discriminator(), {"leakyrelu_fusion": False}, x)
    assert list(report) == [] and not any(isinstance(m, FusedConvLeakyReLU) for m in opt.modules())


# ----------------------------------------------------------------------------- alpha_quant

def test_alpha_quant_snaps_every_slope_and_reports_it(x):
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.act = nn.LeakyReLU(0.2)
            self.prelu = nn.PReLU(4, init=0.3)
            self.spatial = opkit.torch.nn.SpatialLeakyReLU((1, 1, 16, 16), init=0.1)

        def forward(self, x):
            y = self.act(self.conv(x))
            return self.spatial(F.leaky_relu(self.prelu(y), 0.01))
    model = Mixed()
    opt, report = optimize(model, {"alpha_quant": True}, x)
    got = {c.name: (c.old, c.new) for c in report.alphas if c.kind != "map"}
    assert got == {"leaky_relu": (0.01, 1 / 128), "opkit_fused.conv": (0.2, 26 / 128)}
    maps = {c.name: c for c in report.alphas if c.kind == "map"}
    assert set(maps) == {"prelu", "spatial"}
    assert torch.equal(opt.prelu.weight, torch.full((4,), 38 / 128))      # round(0.3 * 128) = 38
    assert torch.equal(opt.spatial.alpha_map, torch.full((1, 1, 16, 16), 13 / 128))
    assert maps["prelu"].drift == pytest.approx(abs(38 / 128 - 0.3), rel=1e-5)  # 0.3 in float32
    assert "leaky_relu: alpha 0.01 -> 1/128 = 0.0078125" in str(report).splitlines()
    # the model computes with the snapped slopes
    ref = copy.deepcopy(model)
    ref.act.negative_slope = 26 / 128
    with torch.no_grad():
        ref.prelu.weight.fill_(38 / 128)
        ref.spatial.alpha_map.fill_(13 / 128)
    expected = F.leaky_relu(ref.prelu(ref.act(ref.conv(x))), 1 / 128)
    expected = torch.ops.opkit.spatial_leaky_relu(expected, ref.spatial.alpha_map)
    with torch.no_grad():
        assert_rel(opt(x), expected, 1e-5)
    assert model.act.negative_slope == 0.2 and float(model.prelu.weight.detach()[0]) == pytest.approx(0.3)


# ----------------------------------------------------------------------------- equivalence

CONFIGS = [
    ({}, 1e-4),
    ({"layout": "NHWC"}, 1e-4),
    ({"conv": "opkit", "layout": "NCHW"}, 1e-4),
    ({"conv": "torch", "layout": "NHWC"}, 1e-4),
    ({"precision_mode": "force_fp16", "conv": "opkit"}, 1e-3),
    ({"precision_mode": "force_fp16", "conv": "torch", "layout": "NHWC"}, 1e-3),
]


@pytest.mark.parametrize("config, tol", CONFIGS, ids=lambda c: str(c))
def test_eval_matches_the_original(config, tol, x):
    torch.manual_seed(0)
    model = with_statistics(discriminator(bias_before_bn=True)).eval()
    if tol == 1e-3:  # float16: compare the fused layers' own output, before the last conv's
        model = model[:-2].eval()  # sum of 16 x 16 terms cancels to a few percent of its scale
    opt, _ = optimize(model, config, x)
    with torch.no_grad():
        expected = model(x)
        assert_rel(opt(x), expected, tol)
        assert_rel(opt(x.contiguous(memory_format=torch.channels_last)), expected, tol)


def test_each_module_keeps_its_own_mode(x):
    model = with_statistics(discriminator()).train()
    model[3].eval()                    # a frozen batch norm in a model that trains
    opt, _ = optimize(model, {"conv": "opkit"})
    assert opt.training and not opt.get_submodule("3").training and opt.get_submodule("6").training
    with torch.no_grad():
        assert_rel(opt(x), model(x), 1e-4)


def test_force_fp16_really_runs_the_fused_operators_in_float16(x):
    model = with_statistics(discriminator()).eval()
    opt, _ = optimize(model, {"precision_mode": "force_fp16", "conv": "opkit"})
    ref, _ = optimize(model, {"conv": "opkit"})
    with torch.no_grad():
        y16, y32 = opt(x), ref(x)
    assert y16.dtype == torch.float32
    assert 0 < (y16 - y32).abs().max() <= 1e-3 * y32.abs().max()


def one_step(model, x, steps=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        F.binary_cross_entropy_with_logits(out, torch.ones_like(out)).backward()
        opt.step()
    return model


@pytest.mark.parametrize("config", [
    {"conv": "opkit"}, {"conv": "opkit", "layout": "NHWC"}, {"conv": "torch"}, {},
], ids=lambda c: str(c))
@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_steps_match_the_original(config, momentum, x):
    model = with_statistics(discriminator(bias_before_bn=True, momentum=momentum)).train()
    opt, _ = optimize(model, config, x)
    assert dict(opt.named_buffers())["3.num_batches_tracked"] == 0   # the probe run left no trace
    one_step(model, x, steps=2)
    one_step(opt, x, steps=2)
    got, expected = opt.state_dict(), model.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        if key.endswith("num_batches_tracked"):
            assert got[key] == value == 2
        else:
            torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_training_batch_of_one_pixel_per_channel_is_refused():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.LeakyReLU(0.2))
    opt, _ = optimize(model, {"conv": "opkit"})
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        opt(torch.randn(1, 1, 1, 1))


def test_fused_conv_keeps_the_logical_shape_for_channels_last():
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    y = torch.ops.opkit.conv2d_bias_leaky_relu(x, w, b, stride=1, padding=1, alpha=0.2)
    assert y.shape == (2, 4, 6, 5) and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, F.leaky_relu(F.conv2d(x, w, b, 1, 1), 0.2), rtol=1e-5, atol=1e-5)


def test_the_optimized_model_compiles_with_dynamic_shapes():
    torch.manual_seed(0)
    model = with_statistics(discriminator()).eval()[:-2].eval()
    opt, _ = optimize(model, {"conv": "opkit", "layout": "NHWC"})
    compiled = torch.compile(opt, backend="aot_eager", dynamic=True, fullgraph=True)
    for n, size in [(2, 16), (3, 20)]:   # the fake kernels size OH, OW from the input's
        x = torch.randn(n, 1, size, size)
        with torch.no_grad():
            y = compiled(x)
            assert_rel(y, model(x), 1e-4)
        assert y.shape == (n, 16, size // 4, size // 4)


def test_optimizing_again_applies_the_new_config(x):
    model = with_statistics(discriminator()).eval()[:-2].eval()
    once, _ = optimize(model, {"conv": "opkit"})
    twice, report = optimize(once, {"precision_mode": "force_fp16", "conv": "torch"})
    assert list(report) == []                       # nothing left to fuse
    fused = [m for m in twice.modules() if isinstance(m, FusedConvLeakyReLU)]
    assert [(f.precision_mode, f.eval_conv) for f in fused] == [("force_fp16", "torch")] * 3
    with torch.no_grad():
        y32, y16 = once(x), twice(x)
    assert 0 < (y16 - y32).abs().max() <= 1e-3 * y32.abs().max()


def generator_block():
    """Upsample -> conv -> batch norm -> LeakyReLU twice, then upsample -> conv -> tanh:
    optimize folds each upsampling into its convolution, each batch norm and slope into a fused
    module, the last pair into a ResizeConv2d (each caching its eval weights)."""
    return with_statistics(nn.Sequential(
        nn.Upsample(scale_factor=2), nn.Conv2d(2, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4),
        nn.LeakyReLU(0.2),
        nn.Upsample(scale_factor=2), nn.Conv2d(4, 3, 3, 1, 1), nn.BatchNorm2d(3), nn.LeakyReLU(0.2),
        nn.Upsample(scale_factor=2), nn.Conv2d(3, 1, 3, 1, 1), nn.Tanh()))


@pytest.mark.parametrize("conv", ["auto", "opkit"])
@pytest.mark.parametrize("eager_first", [True, False], ids=["eager-then-compile", "compile-first"])
def test_the_optimized_model_compiles_to_one_graph_after_eager_calls(conv, eager_first):
    """The sanity check everyone runs (the model in eval, under no_grad) before or after
    torch.compile(fullgraph=True): neither order breaks the graph, the results agree."""
    torch.manual_seed(0)
    model = generator_block().eval()
    opt, _ = optimize(model, {"conv": conv, "layout": "NHWC"})
    opt.eval()
    x = torch.randn(2, 2, 5, 5)
    torch._dynamo.reset()
    compiled = torch.compile(opt, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        want = model(x)
        calls = [opt, compiled, opt, compiled] if eager_first else [compiled, opt, compiled]
        for f in calls:
            assert_rel(f(x), want, 1e-4)
        # the weights change: neither path serves the eval weights made from the old ones
        for m in {id(m): m for m in (model, opt)}.values():
            m.get_parameter("1.weight").mul_(0.5)
        want = model(x)
        for f in (opt, compiled):
            assert_rel(f(x), want, 1e-4)
    explained = torch._dynamo.explain(opt)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()


def test_auto_conv_times_both_choices_and_leaves_the_model_as_it_was(monkeypatch):
    """conv="auto" with an example input: each chain's convolution runs where its measured
    medians say (report.notes names both), the choice is what the medians say whichever way
    they go, and measuring changes no running statistic, gradient or mode of the model."""
    import re
    from opkit.torch import choose
    model = with_statistics(discriminator()).train()
    x = torch.randn(4, 1, 16, 16)
    model(x).sum().backward()            # gradients the measurement must not touch
    grads = [p.grad.clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt, report = optimize(model, {"conv": "auto"}, x)
    lines = [n for n in report.notes if n.startswith("conv='auto'")]
    chains = [m for m in opt.modules() if isinstance(m, FusedConvLeakyReLU)]
    assert len(lines) == len(chains) == 3
    for line, m in zip(lines, chains):
        assert f"for {m.conv_name}:" in line
        for mode, attr in (("eval", "eval_conv"), ("training", "train_conv")):
            choice, ours, theirs = re.search(
                mode + r" (\w+) \(([\d.]+) ms opkit, ([\d.]+) ms torch\)", line).groups()
            faster = float(ours) < choose.MARGIN * float(theirs)
            assert choice == getattr(m, attr) == ("opkit" if faster else "torch")
    for entry in report.fused:
        assert entry.operator == next(m for m in chains if m.conv_name == entry.chain[0]).describe()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert all(torch.equal(state[k], v) for k, v in opt.state_dict().items() if k in state)
    assert opt.training and all(m.training for m in opt.modules())
    # the choice a forced measurement makes is the one the module takes
    monkeypatch.setattr(choose, "measure", lambda model, m, x, training: {"opkit": 1.0, "torch": 2.0})
    opt, report = optimize(model, {"conv": "auto"}, x)
    assert all(m.eval_conv == m.train_conv == "opkit" for m in opt.modules()
               if isinstance(m, FusedConvLeakyReLU))
    y, want = opt(x), model(x)
    assert_rel(y, want, 1e-4)


def assert_same_step(opt, ref, x):
    """One forward and backward of each: outputs, input and parameter gradients, and buffers
    (running statistics) agree."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = opt(xa), ref(xb)
    assert_rel(ya, yb, 1e-5)
    g = torch.randn_like(yb)
    ya.backward(g), yb.backward(g)
    assert_rel(xa.grad, xb.grad, 1e-5)
    for p, q in zip(opt.parameters(), ref.parameters()):
        assert_rel(p.grad, q.grad, 1e-5)
    for (name, b), c in zip(opt.named_buffers(), ref.buffers()):
        assert torch.allclose(b.float(), c.float(), rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("bias,stride,padding,output_padding", [(False, 1, 0, 0), (True, 2, 1, 1)])
def test_a_transposed_convolution_chain_fuses_and_matches(bias, stride, padding, output_padding):
    """ConvTranspose2d -> BatchNorm2d -> LeakyReLU (a DCGAN generator's stem) runs as one
    chain: PyTorch's transposed convolution with the batch norm folded in and opkit's slope in
    eval, with the batch norm in training, whatever conv asks for; outputs, gradients and running
    statistics as the original's."""
    torch.manual_seed(0)
    model = with_statistics(nn.Sequential(
        nn.ConvTranspose2d(6, 5, 4, stride, padding, output_padding, bias=bias),
        nn.BatchNorm2d(5), nn.LeakyReLU(0.2)))
    x = torch.randn(3, 6, 4, 4)
    for conv in ("auto", "opkit", "torch"):
        ref = copy.deepcopy(model)
        opt, report = optimize(copy.deepcopy(model), {"conv": conv}, x)
        assert [e.fused for e in report] == [True]
        assert report[0].operator == ("conv_transpose2d (batch norm folded in) + leaky_relu "
                                      "(training: conv_transpose2d + batch_norm + leaky_relu)")
        ref.eval(), opt.eval()
        with torch.no_grad():
            assert_rel(opt(x), ref(x), 1e-5)
        ref.train(), opt.train()
        assert_same_step(opt, ref, x)
    grouped = nn.Sequential(nn.ConvTranspose2d(6, 4, 4, 2, 1, groups=2), nn.BatchNorm2d(4),
                            nn.LeakyReLU(0.2))
    _, report = optimize(grouped, None, x)
    assert not report[0].fused and report[0].reason.startswith(
        "unsupported transposed convolution: groups=2")


class ResidualBlock(nn.Module):
    """A ResNet-style discriminator block: LeakyReLU(bn(conv(x)) + x), and one whose residual
    broadcasts (a per-channel tensor) and one added on the left, without a batch norm."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.act1 = nn.LeakyReLU(0.2)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(1, 4, 1, 1))

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)) + x)
        y = F.leaky_relu(self.bias + self.conv2(y), 0.1)
        return F.leaky_relu(torch.add(self.conv2(y), y), 0.2)


@pytest.mark.parametrize("layout", [None, "NHWC"])
def test_a_residual_add_before_the_slope_joins_the_chain(layout):
    """conv [-> bn] + r -> LeakyReLU fuses (eval: the batch norm folded, the residual added and
    the slope applied in place over the convolution's output); outputs, gradients and running
    statistics as the original's in eval and in training, whichever side the residual is on and
    whether or not it broadcasts."""
    torch.manual_seed(0)
    model = with_statistics(ResidualBlock())
    x = torch.randn(2, 4, 6, 6)
    opt, report = optimize(copy.deepcopy(model), {"layout": layout}, x)
    assert [(e.fused, e.chain) for e in report] == [
        (True, ("conv1", "bn1", "add")), (True, ("conv2", "add_1")), (True, ("conv2", "add_2"))]
    assert report[0].operator == ("conv2d (batch norm folded in) + add + leaky_relu (training: "
                                  "conv2d + batch_norm + add + leaky_relu)")
    assert not any(n.target in (torch.add,) or "add" in str(n.target) for n in opt.graph.nodes
                   if n.op in ("call_function", "call_method"))
    for mode in ("eval", "train"):
        ref, got = copy.deepcopy(model), copy.deepcopy(opt)
        getattr(ref, mode)(), getattr(got, mode)()
        assert_same_step(got, ref, x)
        with torch.no_grad():   # nothing records: the in-place path
            assert_rel(got(x), ref(x), 1e-5)
