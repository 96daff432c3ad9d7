"""Train every variant with five seeds until it converges, run the checkerboard experiment,
time the reference article's DCGAN tuning in its parts side by side, and write the results
into docs/gan.md.

    python examples/gan/compare.py                # everything: about 1.5 h on 2 cores
    python examples/gan/compare.py --quick        # a check that everything runs (CI)
    python examples/gan/compare.py --variants torch,spatial --seeds 3 --checker-seeds 0

Training runs go to `--jobs` worker processes (`--threads` threads each), the longest first;
each finished run stays in `--runs` and is reused by the next call with the same settings, so
an interrupted comparison goes on where it stopped. A line per finished run says how far the
comparison is and about how long it has left. The timing section runs in this process on
`--bench-threads` threads. The page's generated part lies between the two `compare.py` markers
in the doc; the text around them is kept.
"""
from __future__ import annotations

import argparse
import ast
import json
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import stats  # noqa: E402
from models import VARIANTS  # noqa: E402

BEGIN = "<!-- compare.py: begin (generated, do not edit by hand) -->"
END = "<!-- compare.py: end -->"


# ----------------------------------------------------------------------------- training runs

# the checkerboard experiment: the `spatial` variant (learnable slope maps, the slopes a
# quantization error could build up in) with float slopes, slopes computed as m / 2**bits, and
# 4-bit slopes re-snapped by AlphaCalibration every 1000 steps with gradients clipped to 0.1
CHECKER = {"float": {}, "q7": {"alpha_bits": 7}, "q4": {"alpha_bits": 4},
           "q4-calibrated": {"alpha_bits": 4, "calibrate_every": 1000, "calibrate_clip": 0.1}}
CHECKER_LABELS = {"float": "float α", "q7": "7-bit α (m/128)", "q4": "4-bit α (m/16)",
                  "q4-calibrated": "4-bit α, AlphaCalibration(every=1000, clip=0.1)"}
CHECKER_VARIANT = "spatial"

# relative cost of a training step (torch = 1; measured at the full settings on an AMD EPYC),
# to order the runs and estimate the time left
COST = {"freq": 5.0, "fused": 2.0, "spatial": 1.25, "conditional": 1.1, "optimized": 0.85}


class Run(NamedTuple):
    """One training run: `name` is its folder under --runs."""
    name: str
    group: str          # "variants" or "checker"
    variant: str
    seed: int
    steps: int
    overrides: dict     # settings beyond train.py's defaults
    config: str = ""    # the checkerboard configuration (CHECKER's key)

    @property
    def cost(self) -> float:
        return self.steps * COST.get(self.variant, 1.0)


def planned(args) -> List[Run]:
    """Every run the comparison needs, the longest first (so the last to finish are short)."""
    base = getattr(args, "settings", {})
    runs = [Run(f"{v}-{s}", "variants", v, s, args.steps, dict(base))
            for v in args.variants for s in range(args.seeds)]
    for cfg, change in CHECKER.items():
        if not change and shares_float(args):
            continue   # the float configuration is the variant's own runs
        change = dict(base, **change)
        if "calibrate_every" in change:  # a quick run calibrates at least once
            change["calibrate_every"] = min(change["calibrate_every"], max(args.checker_steps // 2, 1))
        runs += [Run(f"checker-{cfg}-{s}", "checker", CHECKER_VARIANT, s, args.checker_steps,
                     change, cfg) for s in range(args.checker_seeds)]
    return sorted(runs, key=lambda r: -r.cost)


def shares_float(args) -> bool:
    """Whether the checkerboard experiment's float runs are the `spatial` variant's runs (the
    same steps: the same runs), seeds and all."""
    return args.checker_steps == args.steps and CHECKER_VARIANT in args.variants


def with_float_runs(args, metrics: List[dict]) -> List[dict]:
    """The metrics with the `spatial` variant's runs also counted as the checkerboard
    experiment's float configuration, when they are the same runs."""
    if not args.checker_seeds or not shares_float(args):
        return metrics
    return metrics + [dict(m, group="checker", config="float") for m in metrics
                      if m["group"] == "variants" and m["variant"] == CHECKER_VARIANT]


def reusable(path: Path, run: Run, quick: bool) -> Optional[dict]:
    """The metrics a finished run left at `path`, if it ran as `run` would."""
    import train
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    want = dict(variant=run.variant, seed=run.seed, steps=run.steps, quick=quick,
                settings=train.settings_for(quick, **run.overrides))
    return m if all(m.get(k) == v for k, v in want.items()) else None


def run_one(run: Run, quick: bool, threads: int, runs: Path) -> dict:
    """Train one run (in a worker process): its metrics, tagged with the run's name, group and
    configuration, or {..., "error"} when the variant cannot run here."""
    import train
    tag = {"name": run.name, "group": run.group, "config": run.config}
    try:
        m = train.train(run.variant, run.steps, run.seed, runs / run.name, quick=quick,
                        threads=threads, log=lambda line: None,
                        eval_every=max(run.steps // EVALS, 1), **run.overrides)
    except train.Unavailable as exc:
        return {"variant": run.variant, "seed": run.seed, "error": str(exc), **tag}
    return dict(m, reused=False, **tag)


EVALS = 12  # digits FID evaluations per run (the curves' points)
QUICK_STEPS = 40


class Progress:
    """One line per finished run: what it scored, how far the comparison is, the time left
    (the remaining runs' cost at the rate of the runs trained so far)."""

    def __init__(self, todo: List[Run], out=None):
        self.total, self.left = len(todo), sum(r.cost for r in todo)
        self.out, self.t0 = out, time.perf_counter()
        self.done, self.trained_cost = 0, 0.0

    def __call__(self, run: Run, m: dict) -> None:
        self.done += 1
        self.left -= run.cost
        elapsed = time.perf_counter() - self.t0
        if "error" in m:
            what = f"not run: {m['error']}"
        else:
            what = (f"digits FID {m['score']:.1f}, {m['median_seconds_per_step'] * 1e3:.0f} ms/step"
                    + (" (reused)" if m.get("reused") else ""))
            if not m.get("reused"):
                self.trained_cost += run.cost
        eta = (f", about {clock(self.left * elapsed / self.trained_cost)} left"
               if self.trained_cost and self.left > 0 else "")
        print(f"[{self.done}/{self.total}] {run.name}: {what} | {clock(elapsed)} so far{eta}",
              file=self.out or sys.stdout, flush=True)


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def run_all(args, runs: Path) -> List[dict]:
    """Every planned run's metrics: finished ones reused (unless --fresh), the others trained
    by --jobs worker processes."""
    todo = planned(args)
    progress = Progress(todo)
    done, train = [], []
    for r in todo:
        found = None if args.fresh else reusable(runs / r.name / "metrics.json", r, args.quick)
        if found is None:
            train.append(r)
            continue
        found = dict(found, reused=True, name=r.name, group=r.group, config=r.config)
        progress(r, found)
        done.append(found)
    if train:
        # worker processes (started fresh: PyTorch's OpenMP does not survive a fork) that
        # import PyTorch and opkit once and train one run after another
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_one, r, args.quick, args.threads, runs): r for r in train}
            for f in as_completed(futures):
                m = f.result()
                progress(futures[f], m)
                done.append(m)
    configs = list(CHECKER)
    return sorted(done, key=lambda m: (m["group"] != "variants", VARIANTS.index(m["variant"]),
                                       configs.index(m["config"]) if m["config"] else -1,
                                       m["seed"]))


# ----------------------------------------------------------------------------- timing

# The reference article's DCGAN tuning in its three parts (alpha 0.2 -> 0.25, LeakyReLU fused
# with the convolution before it, NHWC), each alone and together, as opkit.torch.optimize
# configurations of the `torch` model (fold_upsampling off: the folding is opkit's own addition,
# timed separately as `optimized`, the configuration the `optimized` variant trains with).
PARTS = {"fusion": {"leakyrelu_fusion": True, "alpha_quant": False, "layout": None},
         "NHWC": {"leakyrelu_fusion": False, "alpha_quant": False, "layout": "NHWC"},
         "α 0.25 + fusion + NHWC": {"leakyrelu_fusion": True, "alpha_quant": True,
                                    "layout": "NHWC"}}
TUNED_ALL = "α 0.25 + fusion + NHWC"


def set_slopes(model, alpha: float):
    """The model with every nn.LeakyReLU's slope set to alpha."""
    import torch
    for m in model.modules():
        if isinstance(m, torch.nn.LeakyReLU):
            m.negative_slope = alpha
    return model


def contenders(settings: dict, variants=()):
    """{name: (G, D, as_input)}: the same `torch` model as is, in channels_last, with α 0.25,
    through optimize for each of the tuning's parts (PARTS) and with the `optimized` variant's
    configuration (and each change in `variants`, named by it); the `plain` and `spatial`
    variants with the same weights. When opkit.torch.optimize is missing, one more entry,
    "optimized_error", says so and the optimized models are left out."""
    import torch
    import train
    from models import TUNED_ALPHA, Discriminator, Generator
    batch, z_dim, width = settings["batch_size"], settings["z_dim"], settings["width"]
    torch.manual_seed(0)
    G, D = Generator("torch", z_dim, width), Discriminator("torch", width)
    state_g, state_d = G.state_dict(), D.state_dict()

    def copy(variant="torch"):
        g, d = Generator(variant, z_dim, width), Discriminator(variant, width)
        g.load_state_dict(state_g, strict=False)
        d.load_state_dict(state_d, strict=False)
        return g, d

    cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    out = {"torch": (G, D, lambda t: t)}
    g, d = copy()
    out["torch channels_last"] = (g.to(memory_format=torch.channels_last),
                                  d.to(memory_format=torch.channels_last), cl)
    g, d = copy()
    out["torch α 0.25"] = (set_slopes(g, TUNED_ALPHA), set_slopes(d, TUNED_ALPHA), lambda t: t)
    for v in ("plain", "spatial"):
        g, d = copy(v)
        out[v] = (g, d, lambda t: t)
    z = torch.randn(batch, z_dim)
    configs = [(name, dict(change, fold_upsampling=False)) for name, change in PARTS.items()]
    configs += [("optimized", dict(train.OPTIMIZE_CONFIG))]
    configs += [(f"optimized {k}={v}", dict(train.OPTIMIZE_CONFIG, **{k: v})) for k, v in variants]
    for name, config in configs:
        g, d = copy()
        if name == TUNED_ALL:
            set_slopes(g, TUNED_ALPHA), set_slopes(d, TUNED_ALPHA)
        as_input = cl if config.get("layout") == "NHWC" else (lambda t: t)
        try:
            g, _ = train.optimize(g.train(), z, config)
            d, _ = train.optimize(d.train(), as_input(torch.zeros(batch, 1, 32, 32)), config)
        except train.Unavailable as exc:
            out["optimized_error"] = str(exc)
            break
        out[name] = (g, d, as_input)
    return out


def bench(settings: dict, rounds: int, threads: int, variants=()) -> dict:
    """Eval forward D(G(z)) and one training step for each contender, in alternating rounds
    (a new random order each round); ratios are medians of round-by-round ratios to `torch`
    and to `torch channels_last`."""
    import torch
    import train
    train.set_threads(threads)
    batch = settings["batch_size"]
    found = contenders(settings, variants)
    error = found.pop("optimized_error", None)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(batch, settings["z_dim"], generator=gen)
    xb = torch.rand(batch, 1, 32, 32, generator=gen) * 2 - 1
    ones, zeros = torch.ones(batch), torch.zeros(batch)
    opts = {n: train.optimizers(G, D, settings) for n, (G, D, _) in found.items()}

    def eval_forward(name, calls=5):
        G, D, as_input = found[name]
        G.eval(), D.eval()
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(calls):
                D(as_input(G(z)))
            return (time.perf_counter() - t0) / calls

    def train_step(name, calls=3):
        G, D, as_input = found[name]
        G.train(), D.train()
        t0 = time.perf_counter()
        for _ in range(calls):
            train.train_step(G, D, *opts[name], xb, z, ones, zeros, as_input)
        return (time.perf_counter() - t0) / calls

    result = {"settings": settings, "threads": threads, "rounds": rounds, "optimized_error": error}
    rng = random.Random(0)
    for what, fn in (("eval", eval_forward), ("train", train_step)):
        names = list(found)
        for n in names:  # warm up: first calls compile, allocate, pick algorithms
            fn(n, 2)
        times: Dict[str, List[float]] = {n: [] for n in names}
        for _ in range(rounds):
            rng.shuffle(names)
            for n in names:
                times[n].append(fn(n))
        base, cl = times["torch"], times["torch channels_last"]
        result[what] = {n: {"ms": statistics.median(t) * 1e3,
                            "speedup": statistics.median(b / x for b, x in zip(base, t)),
                            "vs_cl": statistics.median(b / x for b, x in zip(cl, t))}
                        for n, t in times.items()}
    return result


# ----------------------------------------------------------------------------- summary

LATE = 0.75  # a run's score: the mean of its evaluations at or after this share of its steps


def late_mean(curve: List[list], steps: int) -> float:
    """The mean of a [step, value] curve's points at or after LATE of the run: one evaluation
    is noisy (a GAN's samples move from one evaluation to the next), the last quarter's mean
    less so."""
    late = [x for step, x in curve if step >= LATE * steps]
    return statistics.fmean(late or [curve[-1][1]])


def summarize(metrics: List[dict], group: str = "variants") -> Dict[str, dict]:
    """{variant (or checkerboard configuration): runs, errors, and per run and over the seeds
    the late digits FID, the late Nyquist share and the median seconds per step}."""
    by: Dict[str, dict] = {}
    for m in metrics:
        if m.get("group", "variants") != group:
            continue
        e = by.setdefault(m["config"] if group == "checker" else m["variant"],
                          {"runs": [], "errors": []})
        (e["errors"] if "error" in m else e["runs"]).append(m)
    for e in by.values():
        runs = e["runs"]
        if not runs:
            continue
        e["scores"] = [late_mean(m["scores"], m["steps"]) for m in runs]
        e["nyquists"] = [late_mean(m["nyquist"], m["steps"]) for m in runs if m.get("nyquist")]
        e["secs"] = [m["median_seconds_per_step"] for m in runs]
        for key, values in (("score", e["scores"]), ("nyquist", e["nyquists"]),
                            ("seconds", e["secs"])):
            if values:
                e[key] = statistics.fmean(values)
                e[key + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return by


def pm(mean: float, std: float, fmt: str) -> str:
    return f"{mean:{fmt}} ± {std:{fmt}}"


def against(s: Dict[str, dict], name: str, base: str, key: str = "scores"):
    """Welch's interval of mean(name) - mean(base) over the seeds, or None (fewer than two
    runs on either side)."""
    a, b = s.get(name, {}).get(key, []), s.get(base, {}).get(key, [])
    return stats.welch(a, b) if len(a) > 1 and len(b) > 1 else None


def ci_text(iv, scale: float = 1.0, fmt: str = "+.1f", unit: str = "") -> str:
    return (f"{iv.diff * scale:{fmt}}{unit} [{iv.lo * scale:{fmt}}{unit}, "
            f"{iv.hi * scale:{fmt}}{unit}]")


def direction(iv, sign: int) -> str:
    """A claim with a direction and no size (sign: +1 'higher', -1 'lower') against an
    interval: holds / does not hold (the other direction) / cannot be told apart."""
    lo, hi = sorted((sign * iv.lo, sign * iv.hi))
    return "holds" if lo > 0 else "does not hold" if hi < 0 else "cannot be told apart"


def time_ratio(b: Optional[dict], name: str, base: str) -> Optional[float]:
    """The side-by-side training step of `name` over `base`'s (bench medians)."""
    t = (b or {}).get("train", {})
    return t[name]["ms"] / t[base]["ms"] if name in t and base in t else None


CHECKERBOARD = 1.5  # Nyquist energy up to this many times the real digits' is no checkerboard
SPATIAL_CLAIM = -0.07  # the reference article: spatially adaptive slopes, about 7% lower FID


def spatial_sentence(s: Dict[str, dict], b: Optional[dict] = None) -> str:
    iv = against(s, "spatial", "plain")
    if iv is None:
        return ("**Spatial α** (claimed: about 7% better FID for about 15% more compute): not "
                "compared, for want of two `plain` and two `spatial` runs.")
    base = s["plain"]["score"]
    rel = stats.Interval(iv.diff / base, iv.lo / base, iv.hi / base, iv.df)
    cost = time_ratio(b, "spatial", "plain")
    if cost is None:
        cost = s["spatial"]["seconds"] / s["plain"]["seconds"]
    said = stats.verdict(rel.lo, rel.hi, SPATIAL_CLAIM)
    return (f"**Spatial α** (claimed: about 7% better FID for about 15% more compute): "
            f"**{said}**{' at this many seeds' if said == 'cannot be told apart' else ''}. Its "
            f"digits FID was {pm(s['spatial']['score'], s['spatial']['score_std'], '.1f')} against "
            f"plain's {pm(base, s['plain']['score_std'], '.1f')}, a change of "
            f"{ci_text(rel, 100, '+.1f', '%')} (95% interval, Welch, "
            f"{len(s['spatial']['scores'])} and {len(s['plain']['scores'])} seeds), at "
            f"{cost - 1:+.0%} time per training step.")


SPEED_CLAIM = 1.23  # the reference article: the DCGAN tuning trains 23% faster


def speed_sentence(b: Optional[dict]) -> str:
    if b is None or TUNED_ALL not in b.get("train", {}):
        why = (b or {}).get("optimized_error") or "the timing section did not run"
        return f"**DCGAN tuning** (claimed: 23% faster training): not measured: {why}."
    t, e = b["train"], b["eval"]
    parts = ", ".join(f"{name} {t[key]['speedup']:.2f}×" for name, key in
                      (("α 0.25", "torch α 0.25"), ("fusion", "fusion"), ("NHWC", "NHWC"))
                      if key in t)
    x, x_cl = t[TUNED_ALL]["speedup"], t[TUNED_ALL]["vs_cl"]
    said = "holds" if x >= SPEED_CLAIM else "does not hold"
    return (f"**DCGAN tuning** (claimed: α 0.2 → 0.25, fusion and NHWC train 23% faster): "
            f"**{said}** against PyTorch in NCHW: together the three trained {x:.2f}× as fast "
            f"as `torch` (each alone: {parts}), and {x_cl:.2f}× as fast as `torch` in "
            f"channels_last, PyTorch's own NHWC; in eval, {e[TUNED_ALL]['speedup']:.2f}× and "
            f"{e[TUNED_ALL]['vs_cl']:.2f}×.")


def checker_sentence(c: Dict[str, dict], real_nyquist: float) -> str:
    q, flt, cal = (against(c, "q4", "float", "nyquists"), against(c, "q7", "float", "nyquists"),
                   against(c, "q4-calibrated", "q4", "nyquists"))
    if q is None or flt is None or cal is None:
        return ("**Checkerboard from quantized α** (claimed: quantization error builds up into "
                "checkerboard artifacts, and AlphaCalibration(every=1000, clip=0.1) cures them): "
                "not measured, for want of two runs of each configuration.")
    scale = 1 / real_nyquist if real_nyquist > 0 else 1.0
    unit = "× real" if real_nyquist > 0 else ""
    levels = [c[k]["nyquist"] * scale for k in CHECKER if "nyquist" in c.get(k, {})]
    seen = (f" In every configuration the samples carry {min(levels):.2f}–{max(levels):.2f}× the "
            f"real digits' energy on the Nyquist frequencies: no checkerboard appears, so there "
            f"is none to build up or to cure at this length of training."
            if real_nyquist > 0 and max(levels) <= CHECKERBOARD else
            f" The configurations' samples carry {min(levels):.2f}–{max(levels):.2f}× the real "
            f"digits' energy on the Nyquist frequencies.")
    return (f"**Checkerboard from quantized α** (claimed: quantization error builds up into "
            f"checkerboard artifacts late in training, and AlphaCalibration(every=1000, "
            f"clip=0.1) cures them): that 4-bit slopes raise the Nyquist energy over float "
            f"slopes **{direction(q, +1)}** ({ci_text(q, scale, '+.2f', unit)}); for 7-bit "
            f"slopes, **{direction(flt, +1)}** ({ci_text(flt, scale, '+.2f', unit)}); that "
            f"calibration lowers it against 4-bit slopes **{direction(cal, -1)}** "
            f"({ci_text(cal, scale, '+.2f', unit)}). Differences of the late Nyquist share, in "
            f"units of the real digits' share, with 95% intervals (Welch).{seen}")


# ----------------------------------------------------------------------------- plots

def pyplot():
    """matplotlib's pyplot without a display, or None (and a message) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("not drawing the plots: they need matplotlib (pip install matplotlib)")
        return None
    return plt


def save(plt, fig, axes, path: Path, legends=()) -> bool:
    """Label the step axes, add the legends, write the figure to `path` and close it."""
    for ax in axes:
        ax.set_xlabel("training step", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in legends:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def mean_curve(runs: List[dict], key: str):
    """(steps, mean over the runs) of a [step, value] curve the runs share."""
    import numpy as np
    steps = [st for st, _ in runs[0][key]]
    same = [m for m in runs if [st for st, _ in m[key]] == steps]
    return steps, np.mean([[x for _, x in m[key]] for m in same], axis=0)


def plot_baseline(runs: List[dict], floor: float, path: Path) -> bool:
    """The `torch` variant's digits FID over training: each seed, their mean, the floor of real
    digits and three times the floor."""
    plt = pyplot()
    if plt is None or not runs:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=90)
    for m in runs:
        ax.plot(*zip(*m["scores"]), color="0.7", lw=0.8)
    steps, mean = mean_curve(runs, "scores")
    ax.plot(steps, mean, color="C0", lw=2, marker="o", ms=3, label=f"mean of {len(runs)} seeds")
    ax.axhline(floor, color="C2", ls="--", lw=1, label=f"real digits (floor) {floor:.1f}")
    ax.axhline(3 * floor, color="C3", ls=":", lw=1, label=f"3 × floor {3 * floor:.1f}")
    ax.axvspan(LATE * runs[0]["steps"], runs[0]["steps"], color="0.93", zorder=0,
               label="last quarter (the score)")
    ax.set_yscale("log")
    ax.set_title("`torch` variant: digits FID over training (gray: each seed)", fontsize=9)
    return save(plt, fig, [ax], path, legends=[ax])


def plot_curves(metrics: List[dict], path: Path, window: int = 50) -> bool:
    """Every variant's losses (smoothed) and digits FID over training, means of the seeds."""
    plt = pyplot()
    if plt is None:
        return False
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=90)
    for v in VARIANTS:
        runs = [m for m in metrics if m["variant"] == v and "error" not in m
                and m.get("group", "variants") == "variants"]
        if not runs:
            continue
        for ax, key in zip(axes[:2], ("discriminator", "generator")):
            curve = np.mean([m["losses"][key] for m in runs], axis=0)
            k = min(window, len(curve))
            smooth = np.convolve(curve, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(k, len(curve) + 1), smooth, label=v, lw=1.2)
        axes[2].plot(*mean_curve(runs, "scores"), marker="o", ms=3, label=v, lw=1.2)
    axes[0].set_title(f"discriminator loss (mean of seeds, {window}-step average)", fontsize=9)
    axes[1].set_title(f"generator loss (mean of seeds, {window}-step average)", fontsize=9)
    axes[2].set_title("digits FID (mean of seeds; lower is better)", fontsize=9)
    axes[2].set_yscale("log")
    return save(plt, fig, axes, path, legends=[axes[2]])


def plot_checker(metrics: List[dict], real_nyquist: float, path: Path) -> bool:
    """The checkerboard runs: the Nyquist share of the samples (in units of the real digits')
    and the digits FID over training, means of the seeds per configuration."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), dpi=90)
    scale = 1 / real_nyquist if real_nyquist > 0 else 1.0
    for cfg in CHECKER:
        runs = [m for m in metrics if m.get("group") == "checker" and m["config"] == cfg
                and "error" not in m]
        if not runs:
            continue
        steps, ny = mean_curve(runs, "nyquist")
        axes[0].plot(steps, ny * scale, marker="o", ms=3, lw=1.2, label=CHECKER_LABELS[cfg])
        axes[1].plot(*mean_curve(runs, "scores"), marker="o", ms=3, lw=1.2,
                     label=CHECKER_LABELS[cfg])
    axes[0].set_title("energy on the Nyquist frequencies (× real digits'; mean of seeds)",
                      fontsize=9)
    axes[1].set_title("digits FID (mean of seeds)", fontsize=9)
    axes[1].set_yscale("log")
    return save(plt, fig, axes, path, legends=axes)


# ----------------------------------------------------------------------------- the page

def asset(doc: Path, name: str) -> Path:
    """docs/gan.md's images: docs/gan-<name>.png, next to the page."""
    return doc.parent / f"{doc.stem}-{name}.png"


def flatness(runs: List[dict]):
    """(change over the last quarter, level there) of the mean FID curve: the least-squares
    line through its points at or after LATE of the run, its rise over a quarter of the run."""
    import numpy as np
    steps, mean = mean_curve(runs, "scores")
    total = runs[0]["steps"]
    late = [(st, x) for st, x in zip(steps, mean) if st >= LATE * total]
    if len(late) < 2:
        return 0.0, float(mean[-1])
    x, y = np.array(late).T
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (1 - LATE) * total), float(y.mean())


def baseline_lines(s: Dict[str, dict], floor: float, doc: Path) -> List[str]:
    e = s.get("torch", {})
    if "score" not in e:
        return ["The `torch` variant did not run: no baseline.", ""]
    change, level = flatness(e["runs"])
    ratio = e["score"] / floor
    flat = abs(change) <= 0.1 * level
    return [f"The `torch` variant's digits FID, the mean of each run's last quarter, is "
            f"{pm(e['score'], e['score_std'], '.1f')} over {len(e['runs'])} seeds: "
            f"**{ratio:.2f}× the floor** of real digits ({floor:.1f}): "
            f"{'within' if ratio <= 3 else 'not within'} the 3× this configuration aims at. "
            f"Over the last quarter of training the mean curve moves by {change:+.1f} "
            f"({change / level:+.0%} of its level, a least-squares line through the last "
            f"quarter's evaluations): {'flat' if flat else 'not flat'} by the ±10% measure.", "",
            f"![the torch variant's digits FID over training]({asset(doc, 'baseline').name})",
            f"![torch samples]({asset(doc, 'samples-torch').name})", ""]


def variant_lines(args, s: Dict[str, dict], floor: float) -> List[str]:
    lines = ["| variant | digits FID (mean ± std) | × floor | vs `plain`: difference [95% interval] "
             "| median step, ms (mean ± std) | runs |", "| --- | --- | --- | --- | --- | --- |"]
    for v in VARIANTS:
        e = s.get(v)
        if e is None:
            continue
        if "score" not in e:
            lines.append(f"| `{v}` | not run: {e['errors'][0]['error']} | | | | 0 |")
            continue
        iv = against(s, v, "plain") if v != "plain" else None
        same = v != "plain" and e["scores"] == s.get("plain", {}).get("scores")
        vs = "the same scores, run by run" if same else ci_text(iv) if iv else "—"
        lines.append(f"| `{v}` | {pm(e['score'], e['score_std'], '.1f')} | "
                     f"{e['score'] / floor:.2f}× | {vs} | "
                     f"{pm(e['seconds'] * 1e3, e['seconds_std'] * 1e3, '.0f')} | "
                     f"{len(e['runs'])} |")
    left_out = [f"`{v}`" for v in VARIANTS if v not in args.variants]
    if left_out:
        lines += ["", f"Not in this comparison (left out with `--variants`): {', '.join(left_out)}."]
    return lines + [""]


def bench_lines(b: dict) -> List[str]:
    lines = [f"The `torch` model (batch {b['settings']['batch_size']}, width "
             f"{b['settings']['width']}) as it is (NCHW), in channels_last, with α 0.25, through "
             f"`opkit.torch.optimize` for each part of the tuning alone and for all three "
             f"(`fold_upsampling` off in these), and with the `optimized` variant's configuration "
             f"{config_text()} (which also folds the upsampling into the convolutions); the "
             f"`plain` and `spatial` variants with the same weights. {b['threads']} threads for "
             f"PyTorch and opkit; {b['rounds']} rounds in a new random order each; medians of "
             f"the round-by-round ratios.", "",
             "| model | eval D(G(z)), ms | × torch | × channels_last | training step, ms | "
             "× torch | × channels_last |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for n in b["eval"]:
        e, t = b["eval"][n], b["train"][n]
        lines.append(f"| {n} | {e['ms']:.2f} | {e['speedup']:.2f}× | {e['vs_cl']:.2f}× | "
                     f"{t['ms']:.1f} | {t['speedup']:.2f}× | {t['vs_cl']:.2f}× |")
    if b.get("optimized_error"):
        lines += ["", f"The optimized models are missing: {b['optimized_error']}."]
    return lines + [""]


def checker_lines(args, c: Dict[str, dict], real_nyquist: float, doc: Path) -> List[str]:
    scale = 1 / real_nyquist if real_nyquist > 0 else 1.0
    shared = (" (the float runs are the `spatial` variant's own, with all its seeds)"
              if shares_float(args) else "")
    lines = [f"The `spatial` variant (a learnable slope map per layer) trained for "
             f"{args.checker_steps} steps, {args.checker_seeds} seeds per configuration{shared}. A slope "
             f"map learns in float; with m/2^b slopes its rounding is what every forward "
             f"computes with. The measure: the share of the samples' spectral energy (each "
             f"image's mean removed) on the Nyquist row and column of the 2-D spectrum, where a "
             f"pattern alternates from pixel to pixel, in units of the real digits' share "
             f"({real_nyquist:.2e}); the mean of each run's last quarter.", "",
             "| slopes | digits FID | Nyquist share (× real) | vs float: difference [95% interval] | runs |",
             "| --- | --- | --- | --- | --- |"]
    for cfg in CHECKER:
        e = c.get(cfg)
        if e is None or "score" not in e:
            continue
        iv = against(c, cfg, "float", "nyquists") if cfg != "float" else None
        lines.append(f"| {CHECKER_LABELS[cfg]} | {pm(e['score'], e['score_std'], '.1f')} | "
                     f"{pm(e['nyquist'] * scale, e['nyquist_std'] * scale, '.2f')} | "
                     f"{ci_text(iv, scale, '+.2f') if iv else '—'} | {len(e['runs'])} |")
    lines += ["", f"![Nyquist energy and FID over training]({asset(doc, 'checker').name})", "",
              "Samples (seed 0, the generator's final averaged weights): " + " ".join(
                  f"![{CHECKER_LABELS[cfg]}]({asset(doc, 'checker-' + cfg).name})"
                  for cfg in CHECKER if asset(doc, "checker-" + cfg).exists()), ""]
    return lines


def page(args, metrics: List[dict], b: Optional[dict], doc: Path, seconds: float) -> str:
    import train
    s, c = summarize(metrics), summarize(metrics, "checker")
    first = next(m for m in metrics if "error" not in m)
    st, floor = first["settings"], first["real_floor"]
    runs = {m["name"]: m for m in metrics if "error" not in m}.values()
    stepping = sum(sum(m["seconds_per_step"]) for m in runs)
    reused = sum(1 for m in runs if m.get("reused"))
    lines = [BEGIN, "",
             f"Settings: {args.steps} training steps, {args.seeds} seeds (0–{args.seeds - 1}) per "
             f"variant, batch {st['batch_size']}, width {st['width']} (channels "
             f"{st['width']}/{2 * st['width']}/{4 * st['width']}), z of {st['z_dim']}, Adam "
             f"(β {st['beta1']:g}, {st['beta2']:g}) at {st['lr']:g} for the generator and "
             f"{train.d_rate(st):g} for the discriminator, falling to 0 over the last "
             f"{st['lr_decay']:.0%} of the steps, the discriminator's images moved by up to "
             f"{st['augment_shift']} pixels, "
             f"{'channels_last' if st['channels_last'] else 'NCHW'}, samples from "
             + (f"the generator's average (β {st['ema']:g})" if st["ema"] else "the generator")
             + f"; digits FID of {st['eval_samples']} samples against "
             f"the 1797 real digits, {EVALS} times per run, a run's score the mean of its "
             f"evaluations in the last quarter. Each run on {args.threads} thread(s) for PyTorch "
             f"and opkit, {args.jobs} runs at a time. The {len(runs)} runs' training steps took "
             f"{clock(stepping)} (their evaluations not counted); this call took {clock(seconds)}"
             f"{f', reusing {reused} finished runs' if reused else ''}. Machine: "
             f"{cpu_name()}, {os.cpu_count()} cores, Python {first['machine']['python']}, "
             f"PyTorch {first['machine']['torch']}. Command: "
             f"`python examples/gan/compare.py {' '.join(args.argv)}`.", "",
             f"The classifier behind the score: {first['classifier_accuracy']:.1%} accuracy on "
             f"its 360 held-out digits. {st['eval_samples']} real digits drawn at random score "
             f"{floor:.1f}: the floor at this sample size.", "",
             "### The seed's claims, as measured", "",
             spatial_sentence(s, b), "", speed_sentence(b), "",
             checker_sentence(c, first["real_nyquist"]), "",
             "### The `torch` baseline", ""]
    lines += baseline_lines(s, floor, doc)
    lines += ["### The variants", ""] + variant_lines(args, s, floor)
    lines += ["Median step: each run's median training step while the other runs trained "
              "beside it; the side-by-side timing below is the one to compare speeds by.", "",
              f"![training curves]({asset(doc, 'curves').name})", "",
              "Samples (seed 0, the generator's final averaged weights): " + " ".join(
                  f"![{v}]({asset(doc, 'samples-' + v).name})" for v in VARIANTS
                  if v != "torch" and asset(doc, "samples-" + v).exists()), ""]
    if b is not None:
        lines += ["### Speed: the tuning in its parts, side by side", ""] + bench_lines(b)
    if c:
        lines += ["### The checkerboard experiment", ""] + checker_lines(args, c, first["real_nyquist"], doc)
    lines.append(END)
    return "\n".join(lines)


def config_text() -> str:
    import train
    return "`" + json.dumps(train.OPTIMIZE_CONFIG) + "`"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write_doc(doc: Path, generated: str) -> None:
    """Replace the generated part between the markers (or append it)."""
    text = doc.read_text() if doc.exists() else "# GAN example\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated + tail
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    doc.write_text(text)


def _config_change(p, text: str, option: str):
    """'conv=opkit' -> ("conv", "opkit"); True/False/None and numbers as Python reads them."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        p.error(f"{option}: expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main(argv=None) -> int:
    import train
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps of each variant's runs (default {train.FULL_STEPS}; "
                        f"{QUICK_STEPS} with --quick)")
    p.add_argument("--seeds", type=int, default=None,
                   help="runs per variant, seeds 0, 1, ... (default 5; 2 with --quick)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--checker-steps", type=int, default=None,
                   help="steps of the checkerboard experiment's runs (default: --steps; then "
                        "its float runs are the `spatial` variant's)")
    p.add_argument("--checker-seeds", type=int, default=None,
                   help="runs per checkerboard configuration (default 3; 2 with --quick; 0: no "
                        "checkerboard experiment)")
    p.add_argument("--quick", action="store_true",
                   help=f"train.py's small model and batch, {QUICK_STEPS} steps, 2 seeds: a "
                        "check that everything runs (for CI), not a comparison")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a training setting for every run, e.g. width=8 (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="training runs at a time")
    p.add_argument("--threads", type=int, default=1, help="threads of each training run")
    p.add_argument("--bench-threads", type=int, default=2)
    p.add_argument("--bench-rounds", type=int, default=15, help="0: no timing section")
    p.add_argument("--bench-config", action="append", default=[], metavar="KEY=VALUE",
                   help="also time the optimized model with this change to its config, e.g. "
                        "conv=opkit or fold_upsampling=False (repeatable)")
    p.add_argument("--bench-size", choices=("runs", "quick", "full"), default="runs",
                   help="the model the timing section times: the runs' (default), or train.py's "
                        "small or full-size one")
    p.add_argument("--runs", type=Path, default=Path(tempfile.gettempdir()) / "opkit-gan-runs",
                   help="folder for each run's metrics.json and samples.png; runs finished there "
                        "with the same settings are reused, so an interrupted comparison goes on "
                        "where it stopped")
    p.add_argument("--fresh", action="store_true", help="train every run again")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "gan.md")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    args.bench_config = [_config_change(p, c, "--bench-config") for c in args.bench_config]
    args.settings = dict(_config_change(p, c, "--set") for c in args.set)
    try:
        train.settings_for(args.quick, **args.settings)
    except TypeError as exc:
        p.error(f"--set: {exc}")
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else train.FULL_STEPS
    if args.checker_steps is None:
        args.checker_steps = args.steps
    if args.seeds is None:
        args.seeds = 2 if args.quick else 5
    if args.checker_seeds is None:
        args.checker_seeds = 2 if args.quick else 3
    if args.checker_seeds < 0:
        p.error(f"--checker-seeds must be 0 or more; got {args.checker_seeds}")
    for name in ("steps", "seeds", "checker_steps", "jobs", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    args.runs.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    todo = planned(args)
    configs = len(CHECKER) - (1 if shares_float(args) else 0)
    print(f"{len(todo)} training runs ({len(args.variants)} variants x {args.seeds} seeds, "
          f"{args.steps} steps; {configs} checkerboard configurations x {args.checker_seeds} "
          f"seeds, {args.checker_steps} steps"
          f"{', the float one the spatial variant' if configs < len(CHECKER) else ''}) in "
          f"{args.runs}", flush=True)
    metrics = with_float_runs(args, run_all(args, args.runs))
    if not any("error" not in m for m in metrics):
        print("compare.py: every run failed; not writing the page", file=sys.stderr)
        return 1
    b = None
    if args.bench_rounds > 0:
        print("timing the models side by side", flush=True)
        quick = args.quick if args.bench_size == "runs" else args.bench_size == "quick"
        size = train.settings_for(quick, **(args.settings if args.bench_size == "runs" else {}))
        b = bench(size, args.bench_rounds, args.bench_threads, args.bench_config)
    write_assets(args, metrics)
    (args.runs / "summary.json").write_text(json.dumps({"bench": b, "runs": [
        {k: m.get(k) for k in ("name", "variant", "seed", "config", "score", "nyquist",
                               "median_seconds_per_step", "error")}
        for m in metrics]}, indent=1) + "\n")
    write_doc(args.doc, page(args, metrics, b, args.doc, time.perf_counter() - t0))
    print(f"wrote {args.doc} ({clock(time.perf_counter() - t0)})")
    return 0


def write_assets(args, metrics: List[dict]) -> None:
    """The page's pictures, next to it: the curves, and the samples of each seed-0 run."""
    doc = args.doc
    doc.parent.mkdir(parents=True, exist_ok=True)
    ok = [m for m in metrics if "error" not in m]
    torch_runs = [m for m in ok if m["group"] == "variants" and m["variant"] == "torch"]
    if torch_runs:
        plot_baseline(torch_runs, torch_runs[0]["real_floor"], asset(doc, "baseline"))
    plot_curves(ok, asset(doc, "curves"))
    if any(m["group"] == "checker" for m in ok):
        plot_checker(ok, ok[0]["real_nyquist"], asset(doc, "checker"))
    for m in ok:
        src = args.runs / m["name"] / "samples.png"
        if m["seed"] == 0 and src.exists():
            name = ("checker-" + m["config"]) if m["group"] == "checker" else "samples-" + m["variant"]
            shutil.copyfile(src, asset(doc, name))


if __name__ == "__main__":
    sys.exit(main())
