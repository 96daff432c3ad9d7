"""Train the DCGAN of models.py on scikit-learn's digits with one activation variant.

    python examples/gan/train.py --variant spatial --seed 0 --out runs/spatial-0
    python examples/gan/train.py --variant spatial --alpha-bits 4 --calibrate-every 1000 \\
        --calibrate-clip 0.1 --out runs/spatial-q4-calibrated
    python examples/gan/train.py --variant optimized --quick --out /tmp/gan

Writes DIR/metrics.json (settings, per-step losses and seconds, the digits FID at a few steps
and at the end) and DIR/samples.png (64 samples of the final generator, its averaged weights
when the settings average them; needs matplotlib).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.nn import functional as F
from torch.optim.swa_utils import update_bn

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import digits  # noqa: E402
from models import VARIANTS, Discriminator, Generator  # noqa: E402

# The seed's one configuration (fusion, alpha quantized, NHWC), in float32: training in float16
# is a different experiment, and the performance comparison is float32 against float32.
OPTIMIZE_CONFIG = {"precision_mode": "must_keep_origin_dtype", "leakyrelu_fusion": True,
                   "alpha_quant": True, "layout": "NHWC"}

# what a run varies besides the variant: fixed-point slopes (models.py) and AlphaCalibration
EXPERIMENT = dict(alpha_bits=None, calibrate_every=None, calibrate_clip=None)
# the discriminator sees every image moved by up to this many pixels (translate(); 0: not moved)
AUGMENT_SHIFT = 2
# Converged settings (docs/gan.md): the generator learns at 4x the discriminator's rate (at equal
# rates the discriminator wins and the FID settles near 50 instead of 28 after 2500 steps); both
# rates fall linearly to 0 over the last `lr_decay` of the steps, and 4000 steps leave the FID
# curve flat over the last quarter (after 2500 it still fell by 12% there); every variant trains
# in channels_last, which PyTorch's convolutions run 1.5x as fast as NCHW on these shapes (the
# NCHW speed comparison is compare.py's timing section)
FULL = dict(batch_size=64, width=16, z_dim=32, eval_samples=500, lr=4e-4, lr_d=1e-4, beta1=0.5,
            beta2=0.999, lr_decay=0.4, ema=0.999, channels_last=True,
            augment_shift=AUGMENT_SHIFT, **EXPERIMENT)
FULL_STEPS = 4000
QUICK = dict(batch_size=32, width=16, z_dim=32, eval_samples=500, lr=2e-4, lr_d=None, beta1=0.5,
             beta2=0.999, lr_decay=0.0, ema=0.0, channels_last=False, steps=60,
             augment_shift=AUGMENT_SHIFT, **EXPERIMENT)


class Unavailable(RuntimeError):
    """A variant that cannot run in this installation (the message says why)."""


def optimize(model: torch.nn.Module, example: torch.Tensor, config: dict):
    """opkit.torch.optimize(model, config, example) -> (model, report)."""
    import opkit.torch
    fn = getattr(opkit.torch, "optimize", None)
    if fn is None:
        raise Unavailable("variant 'optimized' needs opkit.torch.optimize, which this opkit does "
                          "not have; update opkit, or run another variant")
    return fn(model, config=config, example_input=example)


def build(variant: str, z_dim: int, width: int, batch_size: int, alpha_bits=None,
          channels_last: bool = False):
    """(G, D, reports, channels_last): the models of `variant`, optimized for `optimized`,
    in channels_last when asked (and for `optimized` when its configuration says NHWC)."""
    G = Generator(variant, z_dim=z_dim, width=width, alpha_bits=alpha_bits)
    D = Discriminator(variant, width=width, alpha_bits=alpha_bits)
    if variant != "optimized":
        if channels_last:
            G, D = G.to(memory_format=torch.channels_last), D.to(memory_format=torch.channels_last)
        return G, D, {}, channels_last
    config = OPTIMIZE_CONFIG
    nhwc = config.get("layout") == "NHWC"
    z = torch.randn(batch_size, z_dim, generator=torch.Generator().manual_seed(0))
    img = torch.zeros(batch_size, 1, 32, 32)
    if nhwc:
        img = img.contiguous(memory_format=torch.channels_last)
    G, g_report = optimize(G.train(), z, config)
    D, d_report = optimize(D.train(), img, config)
    return G, D, {"generator": [str(e) for e in g_report],
                  "discriminator": [str(e) for e in d_report]}, nhwc


def calibrate(settings: dict, G, D) -> dict:
    """{"generator"/"discriminator": AlphaCalibration} for each network with slopes, when the
    settings ask for calibration (every `calibrate_every` steps, to `alpha_bits` bits, default
    7, gradients clipped to `calibrate_clip`)."""
    every, clip = settings["calibrate_every"], settings["calibrate_clip"]
    if every is None:
        if clip is not None:
            raise ValueError("calibrate_clip needs calibrate_every (the steps between "
                             "re-quantizations); got calibrate_every=None")
        return {}
    from opkit.torch import AlphaCalibration
    from opkit.torch.calibrate import slopes
    bits = settings["alpha_bits"] or 7
    return {name: AlphaCalibration(net, every=every, bits=bits, clip=clip)
            for name, net in (("generator", G), ("discriminator", D)) if slopes(net)}


def settings_for(quick: bool = False, **overrides) -> dict:
    """A run's settings: QUICK's or FULL's (without the step count) with `overrides`."""
    settings = dict(QUICK if quick else FULL)
    settings.pop("steps", None)
    unknown = set(overrides) - set(settings)
    if unknown:
        raise TypeError(f"train: unknown settings {sorted(unknown)}; it takes {sorted(settings)}")
    words = {k: v for k, v in overrides.items()
             if v is not None and not isinstance(v, (bool, int, float))}
    if words:
        raise TypeError(f"train: every setting is a number, a bool or None; got "
                        f"{', '.join(f'{k}={v!r}' for k, v in sorted(words.items()))}")
    settings.update(overrides)
    return settings


def train(variant: str, steps: int, seed: int, out: Optional[Path] = None, quick: bool = False,
          log: Callable[[str], None] = print, eval_every: Optional[int] = None,
          cache_dir: Optional[Path] = None, threads: Optional[int] = None, **overrides) -> dict:
    """Train and return the metrics (written to out/metrics.json when `out` is given).
    threads: PyTorch's and opkit's thread count (default: as they are)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}")
    settings = settings_for(quick, **overrides)
    bs, z_dim = settings["batch_size"], settings["z_dim"]

    if threads is not None:
        set_threads(threads)
    scorer = digits.Scorer(cache_dir, log)
    real = scorer.real
    torch.manual_seed(seed)
    G, D, reports, nhwc = build(variant, z_dim, settings["width"], bs, settings["alpha_bits"],
                                settings["channels_last"])
    calibrations = calibrate(settings, G, D)
    data_gen = torch.Generator().manual_seed(seed + 1)   # batches, noise, shifts: fixed per seed
    noise_gen = torch.Generator().manual_seed(seed + 2)
    shift_gen = torch.Generator().manual_seed(seed + 3)
    augment = (lambda t: translate(t, settings["augment_shift"], shift_gen)
               ) if settings["augment_shift"] else (lambda t: t)
    fixed_z = torch.randn(max(settings["eval_samples"], 64), z_dim,
                          generator=torch.Generator().manual_seed(10_000 + seed))
    opt_g, opt_d = optimizers(G, D, settings)
    ones, zeros = torch.ones(bs), torch.zeros(bs)
    average = Average(G, settings["ema"]) if settings["ema"] else None
    as_input = (lambda t: t.contiguous(memory_format=torch.channels_last)) if nhwc else (lambda t: t)

    eval_every = eval_every or max(steps // 4, 1)
    losses_d, losses_g, seconds, scores, nyquist = [], [], [], [], []
    for step in range(1, steps + 1):
        xb = real[torch.randint(0, len(real), (bs,), generator=data_gen)]
        z = torch.randn(bs, z_dim, generator=noise_gen)
        for opt in (opt_g, opt_d):
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_factor(step, steps, settings["lr_decay"])
        t0 = time.perf_counter()
        loss_d, loss_g = train_step(G, D, opt_g, opt_d, xb, z, ones, zeros, as_input, augment)
        seconds.append(time.perf_counter() - t0)
        for c in calibrations.values():
            c.step()
        if average is not None:
            average.update(G, step)
        losses_d.append(loss_d.item())
        losses_g.append(loss_g.item())
        if not (math.isfinite(losses_d[-1]) and math.isfinite(losses_g[-1])):
            raise FloatingPointError(f"{variant}: the losses are not finite at step {step} "
                                     f"(D {losses_d[-1]}, G {losses_g[-1]})")
        if step % eval_every == 0 or step == steps:
            shown = average.calibrated(bs, z_dim, seed) if average is not None else G
            fake = sample(shown, fixed_z[:settings["eval_samples"]])
            scores.append([step, scorer(fake)])
            nyquist.append([step, digits.nyquist_share(fake)])
            log(f"{variant} seed {seed} step {step}/{steps}: D {losses_d[-1]:.3f} "
                f"G {losses_g[-1]:.3f}, {median(seconds) * 1e3:.1f} ms/step, "
                f"digits FID {scores[-1][1]:.2f}")

    metrics = {
        "variant": variant, "seed": seed, "steps": steps, "quick": quick, "settings": settings,
        "optimize_config": dict(OPTIMIZE_CONFIG) if variant == "optimized" else None,
        "optimize_report": reports or None,
        "losses": {"discriminator": losses_d, "generator": losses_g},
        "seconds_per_step": seconds, "median_seconds_per_step": median(seconds),
        "scores": scores, "score": scores[-1][1], "score_name": "digits FID",
        "nyquist": nyquist, "real_nyquist": scorer.real_nyquist,
        "calibration": {n: c.history for n, c in calibrations.items()} or None,
        "classifier_accuracy": scorer.accuracy,
        "real_floor": scorer.real_floor(settings["eval_samples"]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "opkit_threads": opkit_threads(),
                    "processor": platform.processor()},
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        save_grid(sample(shown, fixed_z[:64]), out / "samples.png", f"{variant}, seed {seed}", log)
    return metrics


def optimizers(G: torch.nn.Module, D: torch.nn.Module, settings: dict):
    """(Adam for G, Adam for D) with the settings' learning rates (`lr`, `d_rate`) and betas,
    each group's starting rate kept as "initial_lr" for the decay."""
    betas = (settings["beta1"], settings["beta2"])
    return tuple(torch.optim.Adam([{"params": net.parameters(), "initial_lr": lr}], lr=lr,
                                  betas=betas)
                 for net, lr in ((G, settings["lr"]), (D, d_rate(settings))))


def d_rate(settings: dict) -> float:
    """The discriminator's learning rate: `lr_d`, or the generator's `lr` when it is None."""
    return settings["lr"] if settings["lr_d"] is None else settings["lr_d"]


def train_step(G, D, opt_g, opt_d, xb, z, ones, zeros, as_input=lambda t: t,
               augment=lambda t: t):
    """One step of the non-saturating GAN loss: D on real and generated images, then G through
    D, every image D sees passed through `augment` (differentiably) and then `as_input`.
    Returns both losses (tensors)."""
    fake = G(z)
    seen = lambda t: as_input(augment(t))  # noqa: E731
    loss_d = (F.binary_cross_entropy_with_logits(D(seen(xb)), ones)
              + F.binary_cross_entropy_with_logits(D(seen(fake.detach())), zeros))
    opt_d.zero_grad(set_to_none=True)
    loss_d.backward()
    opt_d.step()
    loss_g = F.binary_cross_entropy_with_logits(D(seen(fake)), ones)
    opt_g.zero_grad(set_to_none=True)
    loss_g.backward()
    opt_g.step()
    return loss_d, loss_g


class Average:
    """The generator's weights averaged over training (an exponential moving average with
    `beta`, warming up as (1 + t) / (10 + t) so the start's weights fade fast), the samples
    and scores coming from it: one step's weights are one point of an orbit, the average sits
    near its middle. Batch norm's running statistics belong to the weights that made them, so
    `calibrated` measures them again for the averaged weights (torch.optim.swa_utils.update_bn,
    as for SWA)."""

    def __init__(self, G: torch.nn.Module, beta: float):
        import copy
        if not 0 < beta < 1:
            raise ValueError(f"ema must be in (0, 1) (or 0: no average); got {beta}")
        self.model, self.beta = copy.deepcopy(G), beta

    @torch.no_grad()
    def update(self, G: torch.nn.Module, step: int) -> None:
        beta = min(self.beta, (1 + step) / (10 + step))
        for mine, theirs in zip(self.model.parameters(), G.parameters()):
            mine.lerp_(theirs, 1 - beta)

    @torch.no_grad()
    def calibrated(self, batch: int, z_dim: int, seed: int, batches: int = 8) -> torch.nn.Module:
        """The averaged generator with its batch norms' statistics measured on `batches`
        batches of fresh z (the same z for each evaluation)."""
        gen = torch.Generator().manual_seed(20_000 + seed)
        update_bn([torch.randn(batch, z_dim, generator=gen) for _ in range(batches)], self.model)
        return self.model


def lr_factor(step: int, steps: int, decay: float) -> float:
    """The learning rate's share at step 1..steps: 1, then falling linearly over the last
    `decay` of the run to 1 / (its length) at the last step."""
    length = int(round(decay * steps))
    return min(1.0, (steps - step + 1) / length) if length else 1.0


def translate(x: torch.Tensor, shift: int, gen: torch.Generator) -> torch.Tensor:
    """Each image moved by a random whole number of pixels in [-shift, shift] along each axis,
    the background (-1) filling in: the translation of DiffAugment (Zhao et al., 2020), applied to
    real and generated images alike so the discriminator cannot memorize the 1797 digits, and
    differentiable, so the generator learns the digits unmoved."""
    n, c, h, w = x.shape
    dy, dx = torch.randint(-shift, shift + 1, (2, n, 1), generator=gen)
    padded = F.pad(x, (shift, shift, shift, shift), value=-1.0)
    rows = (torch.arange(h) + shift + dy)[:, None, :, None]     # [N, 1, H, 1]
    cols = (torch.arange(w) + shift + dx)[:, None, None, :]     # [N, 1, 1, W]
    return padded[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None],
                  rows, cols]


def set_threads(n: int) -> None:
    """The same number of threads for PyTorch's operators and opkit's kernels."""
    import opkit
    torch.set_num_threads(n)
    opkit.configure(num_threads=n)


def sample(G: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Images from the generator in eval mode (batch norm with its running statistics)."""
    G.eval()
    with torch.no_grad():
        x = torch.cat([G(zb) for zb in z.split(256)])
    G.train()
    return x.contiguous()


def opkit_threads() -> int:
    from opkit.config import get
    return get("num_threads")


def median(xs) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def save_grid(x: torch.Tensor, path: Path, title: str, log: Callable[[str], None] = print) -> bool:
    """An 8-column grid of images in [-1, 1] as a PNG; False (and a message) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"not writing {path}: the sample grid needs matplotlib (pip install matplotlib)")
        return False
    n = x.shape[0]
    cols = 8
    rows = (n + cols - 1) // cols
    h, w = x.shape[2:]
    grid = torch.ones(rows * (h + 2), cols * (w + 2))
    for i in range(n):
        r, c = divmod(i, cols)
        grid[r * (h + 2) + 1:r * (h + 2) + 1 + h, c * (w + 2) + 1:c * (w + 2) + 1 + w] = x[i, 0]
    fig, ax = plt.subplots(figsize=(cols * 0.45, rows * 0.45 + 0.3), dpi=100)
    ax.imshow(grid.numpy(), cmap="gray_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_axis_off()
    ax.set_title(title, fontsize=8)
    fig.tight_layout(pad=0.1)
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default {FULL_STEPS}; {QUICK['steps']} with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="folder for metrics.json and samples.png")
    p.add_argument("--quick", action="store_true",
                   help="a small model, batch and evaluation, for a run of a minute or so")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for PyTorch and opkit (default: their own defaults)")
    p.add_argument("--alpha-bits", type=int, default=None, metavar="B",
                   help="store every slope as m / 2**B (a learnable map is rounded in each "
                        "forward and learns in float)")
    p.add_argument("--calibrate-every", type=int, default=None, metavar="N",
                   help="opkit.torch.AlphaCalibration: snap the slopes to the grid every N steps")
    p.add_argument("--calibrate-clip", type=float, default=None, metavar="C",
                   help="with --calibrate-every: clip the activations' gradients to [-C, C]")
    a = p.parse_args(argv)
    steps = a.steps if a.steps is not None else (QUICK["steps"] if a.quick else FULL_STEPS)
    try:
        m = train(a.variant, steps, a.seed, a.out, quick=a.quick, threads=a.threads,
                  alpha_bits=a.alpha_bits, calibrate_every=a.calibrate_every,
                  calibrate_clip=a.calibrate_clip)
    except Unavailable as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    print(f"{a.variant}: digits FID {m['score']:.2f} after {steps} steps, "
          f"{m['median_seconds_per_step'] * 1e3:.1f} ms/step (median); wrote {a.out}/metrics.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
