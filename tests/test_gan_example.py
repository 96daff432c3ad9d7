"""The GAN example (examples/gan): every variant trains, writes its metrics, is reproducible for
a seed, and the opkit variants compute what PyTorch's own layers compute; the digits FID's
Fréchet distance against SciPy's matrix square root."""
import argparse
import importlib
import importlib.util
import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn", reason="the GAN example trains on scikit-learn's digits")

from conftest import REPO  # noqa: E402

GAN = REPO / "examples" / "gan"
sys.path.insert(0, str(GAN))
digits = importlib.import_module("digits")
models = importlib.import_module("models")
train = importlib.import_module("train")

TINY = dict(quick=True, threads=1, width=8, batch_size=8, eval_samples=64)
SILENT = dict(log=lambda line: None)
TRAINABLE = [v for v in models.VARIANTS if v != "optimized"]


def has_optimize() -> bool:
    import opkit.torch
    return hasattr(opkit.torch, "optimize")


# ----------------------------------------------------------------------------- the score

def scipy_frechet(mu1, s1, mu2, s2):
    """The usual FID formula, with SciPy's general matrix square root."""
    linalg = pytest.importorskip("scipy.linalg")
    covmean = linalg.sqrtm(s1 @ s2)
    return float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1) + np.trace(s2)
                 - 2 * np.trace(np.real(covmean)))


def random_cov(rng, d, rank=None):
    a = rng.standard_normal((d, rank or d))
    return a @ a.T / d + (0 if rank else 0.1) * np.eye(d)


@pytest.mark.parametrize("d", [1, 3, 16, 64])
def test_frechet_distance_matches_scipy_sqrtm(d):
    rng = np.random.default_rng(d)
    mu1, mu2 = rng.standard_normal(d), rng.standard_normal(d)
    s1, s2 = random_cov(rng, d), random_cov(rng, d)
    assert digits.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(
        scipy_frechet(mu1, s1, mu2, s2), rel=1e-9, abs=1e-9)


def test_frechet_distance_of_known_gaussians():
    # diagonal covariances: FD = |mu1 - mu2|^2 + sum (sqrt(a) - sqrt(b))^2
    a, b = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([3.0, 1.0, -2.0])
    want = 9 + 16 + (1 - 3) ** 2 + (2 - 1) ** 2
    assert digits.frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(want, rel=1e-12)
    # a Gaussian against itself, with a singular covariance (its zero eigenvalues come out of
    # eigh as about 1e-16, whose square roots are 1e-8: the precision of any square root there)
    rng = np.random.default_rng(0)
    s = random_cov(rng, 8, rank=3)
    assert digits.frechet_distance(mu1[:1].repeat(8), s, mu1[:1].repeat(8), s) == pytest.approx(0, abs=1e-6)
    s = random_cov(rng, 8)
    assert digits.frechet_distance(np.zeros(8), s, np.full(8, 0.5), s) == pytest.approx(2.0, rel=1e-9)


def test_frechet_distance_rejects_mismatched_gaussians():
    with pytest.raises(ValueError, match=r"means \(3,\), \(3,\) and covariances \(3, 3\), \(2, 2\)"):
        digits.frechet_distance(np.zeros(3), np.eye(3), np.zeros(3), np.eye(2))


def test_classifier_is_trained_once_then_loaded(tmp_path, monkeypatch):
    calls = []

    def fake_training(log=print):
        calls.append(1)
        torch.manual_seed(3)
        return digits.Classifier(), 0.5

    monkeypatch.setattr(digits, "train_classifier", fake_training)
    first, acc = digits.classifier(tmp_path, **SILENT)
    path = digits.cache_path(tmp_path)
    assert calls == [1] and path.is_file() and acc == 0.5
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    second, acc2 = digits.classifier(tmp_path, **SILENT)
    assert calls == [1] and acc2 == 0.5
    for (k, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), k
    assert not any(p.requires_grad for p in second.parameters()) and not second.training


@pytest.mark.slow
def test_the_digits_classifier_separates_the_digits():
    model, acc = digits.classifier(**SILENT)  # the run's cache: trained at most once per cache
    assert acc > 0.9
    x, y = digits.images()
    assert x.shape == (1797, 1, 32, 32) and x.min() >= -1 and x.max() <= 1
    with torch.no_grad():
        assert model.features(x[:10]).shape == (10, digits.FEATURES)


def test_nyquist_share_finds_the_checkerboard():
    board = torch.ones(3, 1, 8, 8)
    board[..., ::2, 1::2] = -1
    board[..., 1::2, ::2] = -1
    assert digits.nyquist_share(board + 5.0) == pytest.approx(1.0)   # the mean does not count
    stripes = torch.zeros(2, 1, 8, 8)
    stripes[..., ::2] = 1.0                  # alternating columns: the Nyquist column only
    assert digits.nyquist_share(stripes) == pytest.approx(1.0)
    # nearest 2x upsampling cannot make a pattern that alternates from pixel to pixel
    up = torch.nn.functional.interpolate(torch.randn(4, 1, 8, 8), scale_factor=2)
    assert digits.nyquist_share(up) == pytest.approx(0.0, abs=1e-12)
    # white noise: the Nyquist row and column hold (2n - 1) of the n * n - 1 non-constant bins
    noise = torch.randn(4000, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert digits.nyquist_share(noise) == pytest.approx(15 / 63, rel=0.03)
    assert digits.nyquist_share(torch.zeros(2, 1, 4, 4)) == 0.0
    with pytest.raises(ValueError, match=r"even H and W; got \[2, 1, 5, 4\]"):
        digits.nyquist_share(torch.zeros(2, 1, 5, 4))


def test_real_digits_score_far_better_than_noise():
    scorer = digits.Scorer(**SILENT)
    noise = torch.rand(500, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    floor = scorer.real_floor(500)
    assert 0 <= floor < scorer(noise) / 10


# ----------------------------------------------------------------------------- the models

def test_fused_block_is_conv_batchnorm_leakyrelu():
    """Training mode: the same output, batch statistics folded into the running ones exactly as
    nn.BatchNorm2d does (momentum, unbiased variance, the batch counter); eval mode: the
    running statistics."""
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(4, 6, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(6, momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.5, 0.5)
    ref = torch.nn.Sequential(conv, bn, torch.nn.LeakyReLU(models.ALPHA))
    import copy
    fused = models.FusedBlock(copy.deepcopy(conv), copy.deepcopy(bn))
    x = torch.randn(5, 4, 10, 10)
    for _ in range(2):
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.bn.running_mean, bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.bn.running_var, bn.running_var, rtol=1e-5, atol=1e-6)
    assert int(fused.bn.num_batches_tracked) == int(bn.num_batches_tracked) == 2
    fused.eval(), ref.eval()
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)


def test_fixed_point_slopes():
    """alpha_bits: a fixed slope is rounded once; a learnable map is rounded in each forward,
    its gradient reaching the float map unchanged; `tuned` is 0.25."""
    def negative_slopes(model):
        return {round(m.negative_slope, 6) for m in model.modules()
                if isinstance(m, torch.nn.LeakyReLU)}
    assert negative_slopes(models.Generator("torch", alpha_bits=4)) == {0.1875}   # 3/16
    assert negative_slopes(models.Discriminator("torch", alpha_bits=7)) == {0.203125}
    assert {m.alpha for m in models.Generator("tuned").modules()
            if isinstance(m, models.onn.LeakyReLU)} == {0.25}
    act = models.FixedPointSpatialLeakyReLU((1, 1, 2, 3), init=0.2, bits=4)
    with torch.no_grad():
        act.alpha_map.copy_(torch.tensor([[0.2, 0.26, 0.34], [0.03, 0.5, 0.9]]))
    x = -torch.rand(2, 1, 2, 3, dtype=torch.float32) - 0.5          # the negative branch
    x.requires_grad_(True)
    y = act(x)
    rounded = torch.tensor([[3, 4, 5], [0, 8, 14]]) / 16.0
    torch.testing.assert_close(y, x * rounded, rtol=0, atol=1e-7)
    y.sum().backward()
    torch.testing.assert_close(act.alpha_map.grad, x.detach().sum(0, keepdim=True))
    torch.testing.assert_close(x.grad, rounded.expand(2, 1, 2, 3))
    with pytest.raises(ValueError, match="bits must be in 1..15, got 0"):
        models.FixedPointSpatialLeakyReLU((1, 1, 2, 2), init=0.2, bits=0)


def test_every_variant_starts_from_the_same_weights():
    def shared(model):
        return {k: v for k, v in model.state_dict().items()
                if k.endswith(("conv.weight", "bn.weight", "head.weight", "out.1.weight"))}

    torch.manual_seed(5)
    want_g, want_d = shared(models.Generator("torch")), shared(models.Discriminator("torch"))
    for v in TRAINABLE:
        torch.manual_seed(5)
        g, d = shared(models.Generator(v)), shared(models.Discriminator(v))
        assert g.keys() == want_g.keys() and d.keys() == want_d.keys()
        assert all(torch.equal(g[k], want_g[k]) for k in g), v
        assert all(torch.equal(d[k], want_d[k]) for k in d), v


def test_unknown_variant_names_the_choices():
    with pytest.raises(ValueError, match="variant must be one of torch, plain, spatial, "
                                         "conditional, freq, fused, optimized, tuned; got "
                                         "'spacial'"):
        models.Generator("spacial")


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("variant", TRAINABLE)
def test_variant_trains_and_writes_its_metrics(variant, tmp_path):
    m = train.train(variant, 3, 0, tmp_path, eval_every=2, **TINY, **SILENT)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved == json.loads(json.dumps(m))
    assert saved["variant"] == variant and saved["seed"] == 0 and saved["steps"] == 3
    for key in ("discriminator", "generator"):
        assert len(saved["losses"][key]) == 3 and all(map(math.isfinite, saved["losses"][key]))
    assert len(saved["seconds_per_step"]) == 3 and all(s > 0 for s in saved["seconds_per_step"])
    assert saved["median_seconds_per_step"] == sorted(saved["seconds_per_step"])[1]
    assert [s for s, _ in saved["scores"]] == [2, 3]
    assert saved["score"] == saved["scores"][-1][1] and saved["score"] > 0
    want = {k: v for k, v in train.QUICK.items() if k != "steps"}
    want.update(width=8, batch_size=8, eval_samples=64)
    assert saved["settings"] == want
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_translate_moves_each_image_and_passes_gradients_back():
    x = torch.randn(6, 2, 5, 7, requires_grad=True)
    y = train.translate(x, 2, torch.Generator().manual_seed(3))
    dy, dx = torch.randint(-2, 3, (2, 6, 1), generator=torch.Generator().manual_seed(3))
    padded = torch.nn.functional.pad(x.detach(), (2, 2, 2, 2), value=-1.0)
    for i in range(6):
        want = torch.roll(padded[i], (-int(dy[i]), -int(dx[i])), dims=(1, 2))[:, 2:7, 2:9]
        torch.testing.assert_close(y[i], want, rtol=0, atol=0)
    w = torch.randn_like(y)
    (y * w).sum().backward()   # the adjoint: each input pixel gets the weight where it landed
    moved_back = torch.zeros(6, 2, 9, 11)
    for i in range(6):
        moved_back[i] = torch.roll(torch.nn.functional.pad(w[i], (2, 2, 2, 2)),
                                   (int(dy[i]), int(dx[i])), dims=(1, 2))
    torch.testing.assert_close(x.grad, moved_back[:, :, 2:7, 2:9])


def test_calibrated_run_snaps_the_slope_maps(tmp_path):
    # with the full settings' averaged generator, decay and channels_last too
    m = train.train("spatial", 4, 0, tmp_path, alpha_bits=4, calibrate_every=2,
                    calibrate_clip=0.1, ema=0.9, lr_decay=0.5, channels_last=True,
                    **TINY, **SILENT)
    assert [h["step"] for h in m["calibration"]["generator"]] == [2, 4]
    assert set(m["calibration"]) == {"generator", "discriminator"}
    assert m["settings"]["alpha_bits"] == 4 and len(m["nyquist"]) == len(m["scores"])
    assert 0 < m["real_nyquist"] < 0.01
    with pytest.raises(ValueError, match="calibrate_clip needs calibrate_every"):
        train.train("spatial", 1, 0, calibrate_clip=0.1, **TINY, **SILENT)


def test_learning_rate_decay_and_the_averaged_generator():
    assert [train.lr_factor(st, 10, 0.4) for st in range(1, 11)] == [1.0] * 6 + [1.0, 0.75, 0.5, 0.25]
    assert [train.lr_factor(st, 4, 0.0) for st in range(1, 5)] == [1.0] * 4
    torch.manual_seed(0)
    G = models.Generator("torch", width=4)
    avg = train.Average(G, 0.9)
    start = [p.detach().clone() for p in G.parameters()]
    want = [p.clone() for p in start]
    for step in (1, 2, 3):
        with torch.no_grad():
            for p in G.parameters():
                p.add_(0.5)
        avg.update(G, step)
        beta = min(0.9, (1 + step) / (10 + step))
        want = [beta * w + (1 - beta) * p.detach() for w, p in zip(want, G.parameters())]
    for got, w in zip(avg.model.parameters(), want):
        torch.testing.assert_close(got.detach(), w)
    # its batch norms measure their statistics again, for its own weights, over fresh z
    model = avg.calibrated(16, models.Z_DIM, seed=3, batches=2)
    gen = torch.Generator().manual_seed(20_000 + 3)
    zs = [torch.randn(16, models.Z_DIM, generator=gen) for _ in range(2)]
    stem_in = [model.stem.conv(z[:, :, None, None]).detach() for z in zs]
    mean = torch.stack([f.mean(dim=(0, 2, 3)) for f in stem_in]).mean(0)
    torch.testing.assert_close(model.stem.bn.running_mean, mean, rtol=1e-5, atol=1e-6)
    assert int(model.stem.bn.num_batches_tracked) == 2 and model.stem.bn.momentum == 0.1
    with pytest.raises(ValueError, match=r"ema must be in \(0, 1\) \(or 0: no average\); got 1.0"):
        train.Average(G, 1.0)


def test_each_network_learns_at_its_own_rate(monkeypatch):
    def one_step(**rates):
        torch.manual_seed(0)
        G, D, _, _ = train.build("torch", 8, 4, 8)
        opt_g, opt_d = train.optimizers(G, D, train.settings_for(**rates))
        before = [[p.detach().clone() for p in net.parameters()] for net in (G, D)]
        gen = torch.Generator().manual_seed(1)
        train.train_step(G, D, opt_g, opt_d, torch.rand(8, 1, 32, 32, generator=gen) * 2 - 1,
                         torch.randn(8, 8, generator=gen), torch.ones(8), torch.zeros(8))
        return [any(not torch.equal(a, p) for a, p in zip(old, net.parameters()))
                for old, net in zip(before, (G, D))]

    assert one_step(lr=0.0, lr_d=1e-3) == [False, True]   # a rate of 0 is 0, not "the same"
    assert one_step(lr=1e-3, lr_d=0.0) == [True, False]
    assert train.d_rate(train.settings_for(lr=3e-4, lr_d=None)) == 3e-4
    assert train.d_rate(train.settings_for()) == train.FULL["lr_d"] < train.FULL["lr"]

    # the decay scales each network's own rate: at the last of 4 steps, half of it (decay 0.5)
    made = []
    real = train.optimizers

    def recorded(*args):
        made.extend(real(*args))
        return tuple(made)

    monkeypatch.setattr(train, "optimizers", recorded)
    train.train("torch", 4, 0, lr=4e-3, lr_d=1e-3, lr_decay=0.5, beta1=0.0, beta2=0.99,
                **TINY, **SILENT)
    assert [(o.param_groups[0]["lr"], o.param_groups[0]["betas"]) for o in made] == [
        (2e-3, (0.0, 0.99)), (5e-4, (0.0, 0.99))]


def test_same_seed_same_run_other_seed_other_run():
    a = train.train("plain", 3, 7, **TINY, **SILENT)
    b = train.train("plain", 3, 7, **TINY, **SILENT)
    c = train.train("plain", 3, 8, **TINY, **SILENT)
    assert a["losses"] == b["losses"] and a["score"] == b["score"]
    assert a["losses"] != c["losses"]


def test_opkit_variants_train_as_pytorch_does():
    """opkit's LeakyReLU is PyTorch's to the bit; the fused operators agree to float32 rounding
    (a different summation order), through three Adam steps of both networks."""
    ref = train.train("torch", 3, 1, **TINY, **SILENT)
    plain = train.train("plain", 3, 1, **TINY, **SILENT)
    fused = train.train("fused", 3, 1, **TINY, **SILENT)
    assert plain["losses"] == ref["losses"] and plain["score"] == ref["score"]
    for key in ("discriminator", "generator"):
        np.testing.assert_allclose(fused["losses"][key], ref["losses"][key], rtol=1e-4)
    assert fused["score"] == pytest.approx(ref["score"], rel=1e-3)


def test_optimized_variant(tmp_path, capsys):
    if has_optimize():
        m = train.train("optimized", 2, 0, tmp_path, **TINY, **SILENT)
        assert m["optimize_config"] == train.OPTIMIZE_CONFIG and m["optimize_report"]
        return
    # without opkit.torch.optimize the variant fails and says why, instead of training
    # something else under its name
    with pytest.raises(train.Unavailable, match="needs opkit.torch.optimize"):
        train.train("optimized", 2, 0, tmp_path, **TINY, **SILENT)
    assert train.main(["--variant", "optimized", "--steps", "2", "--out", str(tmp_path)]) == 2
    assert "needs opkit.torch.optimize" in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()


def test_command_line(tmp_path, capsys):
    assert train.main(["--variant", "plain", "--steps", "2", "--seed", "3", "--quick",
                       "--threads", "1", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["quick"] and m["steps"] == 2 and m["seed"] == 3 and m["machine"]["threads"] == 1
    assert "digits FID" in capsys.readouterr().out


def test_bad_settings_are_named():
    with pytest.raises(TypeError, match=r"unknown settings \['widht'\]"):
        train.train("plain", 1, 0, widht=8, **SILENT)
    with pytest.raises(TypeError, match=r"every setting is a number, a bool or None; got "
                                        r"lr='fast', width='8'"):
        train.settings_for(width="8", lr="fast", ema=0.5)
    with pytest.raises(ValueError, match="steps must be at least 1; got 0"):
        train.train("plain", 0, 0, **SILENT)


def test_sample_grid_without_matplotlib_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    said = []
    assert not train.save_grid(torch.zeros(4, 1, 8, 8), tmp_path / "s.png", "t", said.append)
    assert said == [f"not writing {tmp_path / 's.png'}: the sample grid needs matplotlib "
                    "(pip install matplotlib)"]
    assert not (tmp_path / "s.png").exists()


# ----------------------------------------------------------------------------- compare.py

compare = importlib.import_module("compare")


def run(variant, seed, late_scores, seconds, group="variants", config="", nyquist=None):
    """A finished run's metrics as compare.py reads them: 8 steps, evaluations at 2, 4, 6 and
    8 (the last quarter: 6 and 8)."""
    scores = [[2, 500.0], [4, 300.0]] + [[st, x] for st, x in zip((6, 8), late_scores)]
    m = {"variant": variant, "seed": seed, "steps": 8, "scores": scores, "score": scores[-1][1],
         "median_seconds_per_step": seconds, "group": group, "config": config,
         "name": f"{variant}-{seed}"}
    if nyquist is not None:
        m["nyquist"] = [[st, nyquist] for st, _ in scores]
    return m


def test_compare_names_a_bad_setting_before_it_trains(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compare.main(["--set", "lr=fast", "--runs", str(tmp_path)])
    assert "--set: train: every setting is a number, a bool or None; got lr='fast'" in \
        capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_compare_summary_scores_the_last_quarter():
    metrics = [run("plain", s, (x - 1, x + 1), 0.10) for s, x in enumerate([100.0, 104.0, 96.0])]
    metrics.append({"variant": "optimized", "seed": 0, "error": "needs opkit.torch.optimize",
                    "group": "variants", "config": ""})
    metrics.append(run("spatial", 0, (1.0, 1.0), 0.1, group="checker", config="q4"))
    s = compare.summarize(metrics)
    assert s["plain"]["scores"] == [100.0, 104.0, 96.0]
    assert s["plain"]["score"] == 100.0 and s["plain"]["score_std"] == 4.0
    assert s["plain"]["seconds"] == pytest.approx(0.10)
    assert s["optimized"]["errors"] and "score" not in s["optimized"]
    assert "spatial" not in s   # a checkerboard run is not a variant's run
    assert compare.summarize(metrics, "checker")["q4"]["score"] == 1.0


def test_compare_sentences_follow_the_intervals():
    plain = [run("plain", s, (x, x), 0.10) for s, x in enumerate([100.0, 101.0, 99.0, 100.5, 99.5])]
    better = [run("spatial", s, (x, x), 0.115) for s, x in enumerate([92.0, 93.0, 91.0, 92.5, 91.5])]
    text = compare.spatial_sentence(compare.summarize(plain + better))
    assert "**holds**" in text and "-8.0% [" in text and "+15% time per training step" in text
    same = [run("spatial", s, (x, x), 0.115) for s, x in enumerate([101.0, 99.0, 100.0, 100.5, 99.5])]
    assert "**does not hold**" in compare.spatial_sentence(compare.summarize(plain + same))
    wide = [run("spatial", s, (x, x), 0.115) for s, x in enumerate([80.0, 110.0, 95.0, 70.0, 105.0])]
    assert "**cannot be told apart** at this many seeds" in compare.spatial_sentence(
        compare.summarize(plain + wide))
    bench = {"train": {"plain": {"ms": 10.0}, "spatial": {"ms": 12.5}}}
    assert "+25% time per training step" in compare.spatial_sentence(
        compare.summarize(plain + better), bench)

    assert compare.speed_sentence({"optimized_error": "needs opkit.torch.optimize"}) == (
        "**DCGAN tuning** (claimed: 23% faster training): not measured: needs "
        "opkit.torch.optimize.")
    row = lambda x, cl: {"speedup": x, "vs_cl": cl}  # noqa: E731
    bench = {"eval": {compare.TUNED_ALL: row(1.5, 1.1)},
             "train": {"torch α 0.25": row(1.0, 0.8), "fusion": row(1.1, 0.9),
                       "NHWC": row(1.2, 1.0), compare.TUNED_ALL: row(1.3, 1.05)}}
    text = compare.speed_sentence(bench)
    assert "**holds** against PyTorch in NCHW: together the three trained 1.30×" in text
    assert "(each alone: α 0.25 1.00×, fusion 1.10×, NHWC 1.20×), and 1.05×" in text
    bench["train"][compare.TUNED_ALL] = row(1.2, 0.95)
    assert "**does not hold**" in compare.speed_sentence(bench)

    checker = [run("spatial", s, (1.0, 1.0), 0.1, "checker", cfg, ny)
               for cfg, values in (("float", (1.0, 1.1, 0.9)), ("q7", (1.0, 1.2, 0.8)),
                                   ("q4", (3.0, 3.1, 2.9)), ("q4-calibrated", (1.0, 1.1, 0.9)))
               for s, ny in enumerate(values)]
    text = compare.checker_sentence(compare.summarize(checker, "checker"), 0.5)
    assert "over float slopes **holds** (+4.00× real [" in text
    assert "for 7-bit slopes, **cannot be told apart**" in text
    assert "against 4-bit slopes **holds** (-4.00× real [" in text


def test_compare_plans_every_run_and_reuses_only_finished_ones(tmp_path):
    args = argparse.Namespace(
        variants=["torch", "freq"], seeds=2, steps=10, checker_steps=20, checker_seeds=1,
        settings={"width": 8})
    plan = compare.planned(args)
    assert len(plan) == 2 * 2 + len(compare.CHECKER)
    assert plan[0].variant == "freq" and plan[-1].variant == "torch"   # the longest first
    cal = next(r for r in plan if r.config == "q4-calibrated")
    assert cal.overrides == {"width": 8, "alpha_bits": 4, "calibrate_every": 10,
                             "calibrate_clip": 0.1}   # a short run still calibrates
    run_ = next(r for r in plan if r.name == "torch-1")
    path = tmp_path / "metrics.json"
    assert compare.reusable(path, run_, True) is None
    m = {"variant": "torch", "seed": 1, "steps": 10, "quick": True,
         "settings": train.settings_for(True, width=8), "score": 1.0}
    path.write_text(json.dumps(m))
    assert compare.reusable(path, run_, True)["score"] == 1.0
    assert compare.reusable(path, run_, False) is None
    assert compare.reusable(path, run_._replace(steps=11), True) is None
    assert compare.reusable(path, run_._replace(overrides={"width": 16}), True) is None
    path.write_text('{"steps": 10, "qu')  # an interrupted write
    assert compare.reusable(path, run_, True) is None


def test_compare_progress_says_how_far_and_how_long(capsys, monkeypatch):
    runs = [compare.Run(f"torch-{s}", "variants", "torch", s, 100, {}) for s in range(3)]
    progress = compare.Progress(runs)
    clock = iter([10.0, 30.0, 40.0])
    progress.t0 = 0.0
    monkeypatch.setattr(compare.time, "perf_counter", lambda: next(clock))
    progress(runs[0], {"score": 50.0, "median_seconds_per_step": 0.05})
    progress(runs[1], {"score": 40.0, "median_seconds_per_step": 0.05, "reused": True})
    progress(runs[2], {"error": "needs opkit.torch.optimize"})
    monkeypatch.undo()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[1/3] torch-0: digits FID 50.0, 50 ms/step | 0:10 so far, about 0:20 left"
    assert out[1] == ("[2/3] torch-1: digits FID 40.0, 50 ms/step (reused) | 0:30 so far, "
                      "about 0:30 left")
    assert out[2] == "[3/3] torch-2: not run: needs opkit.torch.optimize | 0:40 so far"


def test_compare_keeps_the_hand_written_page(tmp_path):
    doc = tmp_path / "gan.md"
    doc.write_text(f"# Title\n\nabove\n\n{compare.BEGIN}\nold\n{compare.END}\n\nbelow\n")
    compare.write_doc(doc, f"{compare.BEGIN}\nnew\n{compare.END}")
    assert doc.read_text() == f"# Title\n\nabove\n\n{compare.BEGIN}\nnew\n{compare.END}\n\nbelow\n"
    fresh = tmp_path / "fresh.md"
    compare.write_doc(fresh, f"{compare.BEGIN}\nnew\n{compare.END}")
    assert fresh.read_text().endswith(f"{compare.BEGIN}\nnew\n{compare.END}\n")


def test_the_page_says_what_the_score_is():
    page = (REPO / "docs" / "gan.md").read_text()
    assert "not of Inception-v3" in page and "digits-specific FID" in page
    assert page.count(compare.BEGIN) == 1 and page.count(compare.END) == 1


def test_the_timed_models_compute_what_they_stand_for():
    """The timing section's contenders: each part of the tuning, alone and together, gives the
    `torch` model's outputs (α 0.25's, for the models with α 0.25), in eval and in a training
    step's losses; the parts that need opkit.torch.optimize are left out, with the reason,
    without it."""
    found = compare.contenders(train.settings_for(True, width=8, batch_size=4))
    if not has_optimize():
        assert "needs opkit.torch.optimize" in found.pop("optimized_error")
    z = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    x = torch.rand(4, 1, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1

    def run(name):  # on copies: a training step moves the batch norms' running statistics
        import copy
        G, D, as_input = copy.deepcopy(found[name])
        G.eval(), D.eval()
        with torch.no_grad():
            out = D(as_input(G(z)))
        G.train(), D.train()
        opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (G, D)]
        losses = train.train_step(G, D, *opts, x, z, torch.ones(4), torch.zeros(4), as_input)
        return out, torch.stack(losses).detach()

    ref, ref25 = run("torch"), run("torch α 0.25")
    assert not torch.allclose(ref[0], ref25[0])   # the slope matters to the outputs
    for name in found:
        want = ref25 if "0.25" in name else ref
        got = run(name)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5, msg=name)
    expected = {"torch", "torch channels_last", "torch α 0.25", "plain", "spatial"}
    if has_optimize():
        expected |= set(compare.PARTS) | {"optimized"}
    assert set(found) == expected


def test_compare_runs_end_to_end_and_goes_on_where_it_stopped(tmp_path, capsys):
    """The command as CI can run it: two variants and the checkerboard experiment, tiny, in
    one worker; the page is written between the markers; a second call reuses every run."""
    doc = tmp_path / "gan.md"
    doc.write_text(f"# GAN\n\n{compare.BEGIN}\n{compare.END}\n")
    argv = ["--quick", "--variants", "torch,plain", "--steps", "2", "--checker-steps", "2",
            "--jobs", "1", "--bench-rounds", "0", "--set", "width=8", "--set", "batch_size=8",
            "--set", "eval_samples=64", "--runs", str(tmp_path / "runs"), "--doc", str(doc)]
    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    n = 2 * 2 + 2 * len(compare.CHECKER)
    assert f"[{n}/{n}]" in out and "left" in out and "(reused)" not in out
    page = doc.read_text()
    assert page.startswith("# GAN\n\n" + compare.BEGIN) and page.rstrip().endswith(compare.END)
    assert "### The checkerboard experiment" in page and "| 4-bit α (m/16) |" in page
    assert "**Spatial α** (claimed" in page and "### The `torch` baseline" in page
    # torch and plain train to the bit alike: the table says so rather than print an interval
    assert "| `torch` |" in page and "the same scores, run by run" in page
    cal = json.loads((tmp_path / "runs" / "checker-q4-calibrated-1" / "metrics.json").read_text())
    assert cal["settings"]["calibrate_every"] == 1 and cal["calibration"]["generator"]
    assert compare.main(argv) == 0
    assert capsys.readouterr().out.count("(reused)") == n
