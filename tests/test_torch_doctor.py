"""opkit.torch.doctor and `opkit doctor FILE.py:NAME --input ...`: the checklist table, its
advice and the exit code."""
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opkit.torch  # noqa: E402
from opkit.cli import main  # noqa: E402

MODELS = textwrap.dedent("""\
    import torch
    from torch import nn

    class Discriminator(nn.Sequential):
        def __init__(self):
            super().__init__(nn.Conv2d(1, 4, 4, 2, 1), nn.LeakyReLU(0.2),
                             nn.Conv2d(4, 8, 4, 2, 1, bias=False), nn.BatchNorm2d(8),
                             nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(8 * 4 * 4, 1))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.act = nn.LeakyReLU(0.25)

        def forward(self, x):
            return self.act(self.fc(x.flatten(1)))

    def optimized():
        import opkit.torch
        return opkit.torch.optimize(Discriminator(), {"alpha_quant": True})[0]

    def not_a_model():
        return 3
    """)


def rows(checkup):
    return {r.check: r for r in checkup}


def test_a_plain_model_gets_actionable_advice():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.LeakyReLU(0.2), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 3), nn.LeakyReLU(0.2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    checkup = opkit.torch.doctor(model, torch.randn(2, 1, 8, 8), repeat=2)
    r = rows(checkup)
    assert not r["α quantized"].ok and r["α quantized"].actionable
    assert "2 of 2 slopes are not m/128 (1, 4)" in r["α quantized"].advice
    assert r["input contiguous"].ok and r["input contiguous"].advice.startswith("yes, NCHW")
    assert not r["fusible 1"].ok and r["fusible 1"].actionable
    assert "0 -> LeakyReLU: optimize(model, {'leakyrelu_fusion': True}) fuses it" in r["fusible 1"].advice
    linear = r["not fusible 4"]
    assert not linear.ok and not linear.actionable and "(Linear); it runs unfused" in linear.advice
    precision = r["float16 vs float32"]
    assert "ms per forward; float16 output deviates by" in precision.advice
    assert checkup.actionable
    table = str(checkup).splitlines()
    assert len(table) == len(checkup) == 5
    assert table[0].startswith("✘  α quantized") and table[1].startswith("✔  input contiguous")
    assert all(k in model.state_dict() and torch.equal(v, model.state_dict()[k])
               for k, v in before.items())                      # the model is left alone


def test_an_optimized_model_has_nothing_to_do():
    model, _ = opkit.torch.optimize(nn.Sequential(nn.Conv2d(1, 4, 3), nn.LeakyReLU(0.25)))
    x = torch.randn(2, 1, 8, 8).contiguous(memory_format=torch.channels_last)
    r = rows(opkit.torch.doctor(model, x, repeat=2))
    assert r["α quantized"].ok and r["α quantized"].advice == "all 1 slopes are m/128"
    assert r["fused opkit_fused.0"].ok
    assert r["fused opkit_fused.0"].advice == "conv2d + leaky_relu (0 -> LeakyReLU)"
    # (C = 1: a channels_last tensor is contiguous both ways, so it reads as NCHW)
    assert r["input contiguous"].ok


def test_a_strided_input_and_a_blocked_chain_are_actionable():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.act = nn.LeakyReLU(0.25)

        def forward(self, x):
            return self.act(self.conv(x).flatten(1))
    x = torch.randn(2, 8, 8, 3).permute(0, 3, 2, 1)
    r = rows(opkit.torch.doctor(Net(), x, repeat=2))
    assert not r["input contiguous"].ok and r["input contiguous"].actionable
    assert "pass x.contiguous()" in r["input contiguous"].advice
    blocked = r["not fusible act"]
    assert blocked.actionable and blocked.advice == (
        "after conv: a shape transform between them (.flatten(), flatten)")


def test_cli_exit_code_and_table(tmp_path, capsys):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    assert main(["doctor", f"{path}:Discriminator", "--input", "4,1,16,16", "--repeat", "2"]) == 1
    out = capsys.readouterr().out
    assert "✘  fusible 1" in out and "✘  α quantized" in out and "float16 vs float32" in out
    code = main(["doctor", f"{path}:optimized", "--input", "4,1,16,16", "--repeat", "2"])
    out = capsys.readouterr().out.splitlines()
    assert "✔  fused opkit_fused.0" in "\n".join(out)
    assert all(line.startswith("✔") for line in out if "float16 vs float32" not in line)
    precision, = [line for line in out if "float16 vs float32" in line]
    assert code == (1 if precision.startswith("✘") else 0)   # the one measured row decides
    assert "deviates by 0 " not in precision                  # float16 really ran


@pytest.mark.parametrize("target, args, message", [
    ("{path}:Discrim", ["--input", "1,1,16,16"], "has no 'Discrim'; did you mean 'Discriminator'?"),
    ("{path}", ["--input", "1,1,16,16"], "expected FILE.py:NAME"),
    ("{tmp}/missing.py:Model", ["--input", "1,1,16,16"], "missing.py does not exist"),
    ("{path}:not_a_model", ["--input", "1,1,16,16"], "gave a int, not a torch.nn.Module"),
    ("{path}:Discriminator", ["--input", "64,x"], "--input must be positive sizes separated by commas"),
])
def test_cli_errors(tmp_path, capsys, target, args, message):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    target = target.format(path=path, tmp=tmp_path)
    assert main(["doctor", target] + args) == 1
    err = capsys.readouterr().err
    assert err.startswith("opkit doctor: error: ") and message in err


def test_upsampling_before_a_convolution_is_foldable_advice():
    model = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(2, 4, 3, 1, 1), nn.Tanh(),
                          nn.Upsample(scale_factor=2), nn.Conv2d(4, 4, 3, stride=2, padding=1))
    rows = opkit.torch.doctor(model, torch.randn(2, 2, 5, 5), repeat=1)
    folds = [(r.check, r.advice, r.actionable) for r in rows if "foldable" in r.check]
    assert folds == [
        ("foldable 0", "nearest x2 -> 1: optimize folds it into 4 phase convolutions over the image "
                       "before upsampling (fewer multiply-adds, no upsampled image)", True),
        ("not foldable 3", "into 4: stride=(2, 2) (1 needed)", False)]
    assert rows.actionable
    optimized, _ = opkit.torch.optimize(model, None, torch.randn(2, 2, 5, 5))
    assert not [r for r in opkit.torch.doctor(optimized, torch.randn(2, 2, 5, 5), repeat=1)
                if r.check.startswith("foldable")]
