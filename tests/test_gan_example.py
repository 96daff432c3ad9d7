"""The GAN example (examples/gan): every variant trains, writes its metrics, is reproducible for
a seed, and the opkit variants compute what PyTorch's own layers compute; the digits FID's
Fréchet distance against SciPy's matrix square root."""
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
                                         "conditional, freq, fused, optimized; got 'spacial'"):
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


def run(variant, seed, score, seconds):
    return {"variant": variant, "seed": seed, "score": score, "median_seconds_per_step": seconds}


def test_compare_summary_and_sentences():
    metrics = [run("plain", s, x, 0.10) for s, x in enumerate([100.0, 104.0, 96.0])]
    metrics += [run("spatial", s, x, 0.115) for s, x in enumerate([92.0, 94.0, 93.0])]
    metrics.append({"variant": "optimized", "seed": 0, "error": "needs opkit.torch.optimize"})
    s = compare.summarize(metrics)
    assert s["plain"]["score"] == 100.0 and s["plain"]["score_std"] == 4.0
    assert s["spatial"]["seconds"] == pytest.approx(0.115)
    assert s["optimized"]["errors"] and "score" not in s["optimized"]
    text = compare.spatial_sentence(s)
    assert "lowered the digits FID by 7.0%" in text and "+15% time" in text
    assert "this is close to the ~7% better" in text
    # the same means with a spread that covers the difference: not a finding
    noisy = [run("plain", s, x, 0.1) for s, x in enumerate([80.0, 120.0, 100.0])]
    noisy += [run("spatial", s, x, 0.115) for s, x in enumerate([70.0, 110.0, 99.0])]
    assert "does not show an improvement either way" in compare.spatial_sentence(compare.summarize(noisy))
    assert "this is not" in compare.spatial_sentence(compare.summarize(noisy))
    bench = {"optimized_error": "needs opkit.torch.optimize", "eval": {}, "train": {}}
    assert compare.optimized_sentence(s, bench) == (
        "**optimized vs torch:** not measured in this run: needs opkit.torch.optimize.")
    bench = {"optimized_error": None,
             "eval": {"torch": {"speedup": 1.0}, "torch channels_last": {"speedup": 1.2},
                      "optimized": {"speedup": 1.5}},
             "train": {"torch": {"speedup": 1.0}, "torch channels_last": {"speedup": 1.1},
                       "optimized": {"speedup": 1.21}}}
    text = compare.optimized_sentence(s, bench)
    assert "1.50× as fast as `torch` and a training step 1.21× as fast" in text
    assert "(1.25× and 1.10× against `torch` in channels_last)" in text


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


def test_compare_reuses_only_runs_with_the_same_settings(tmp_path):
    path = tmp_path / "metrics.json"
    assert compare.reusable(path, 80, True) is None
    path.write_text(json.dumps({"steps": 80, "quick": True, "score": 1.0}))
    assert compare.reusable(path, 80, True)["score"] == 1.0
    assert compare.reusable(path, 100, True) is None and compare.reusable(path, 80, False) is None
    path.write_text('{"steps": 80, "qu')  # an interrupted write
    assert compare.reusable(path, 80, True) is None
