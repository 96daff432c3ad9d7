"""Train every variant with several seeds, time torch / torch channels_last / optimized side by
side, and write the results into docs/gan.md.

    python examples/gan/compare.py                       # 7 variants x 3 seeds, 300 steps
    python examples/gan/compare.py --steps 100 --variants torch,spatial --seeds 2

Training runs go to `--jobs` worker processes (`--threads` threads each), one run after another;
the timing section runs in this process on `--bench-threads` threads. The page's generated part
lies between the two `compare.py` markers in the doc; the text around them is kept.
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from models import VARIANTS  # noqa: E402

BEGIN = "<!-- compare.py: begin (generated, do not edit by hand) -->"
END = "<!-- compare.py: end -->"


# ----------------------------------------------------------------------------- training runs

def reusable(path: Path, steps: int, quick: bool) -> Optional[dict]:
    """The metrics a finished run left at `path`, if it ran with these settings."""
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return m if m.get("steps") == steps and m.get("quick") == quick else None


def run_one(variant: str, seed: int, steps: int, quick: bool, threads: int, runs: Path,
            reuse: bool = False) -> dict:
    """Train one variant with one seed (in a worker process): its metrics, or
    {"variant", "seed", "error"} when it cannot run. reuse: take a finished run's metrics."""
    import train
    found = reusable(runs / f"{variant}-{seed}" / "metrics.json", steps, quick) if reuse else None
    if found is not None:
        print(f"  {variant} seed {seed}: reused {runs / f'{variant}-{seed}'}", flush=True)
        return found
    t0 = time.perf_counter()
    try:
        m = train.train(variant, steps, seed, runs / f"{variant}-{seed}", quick=quick,
                        threads=threads, log=lambda line: None)
    except train.Unavailable as exc:
        print(f"  {variant} seed {seed}: not run: {exc}", flush=True)
        return {"variant": variant, "seed": seed, "error": str(exc)}
    print(f"  {variant} seed {seed}: digits FID {m['score']:.1f}, "
          f"{m['median_seconds_per_step'] * 1e3:.0f} ms/step ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    return m


# the slowest first, so that the last runs to finish are short ones
COST = {"fused": 0, "freq": 1, "optimized": 2, "conditional": 3}


def run_all(args, runs: Path) -> List[dict]:
    jobs = sorted(((v, s) for s in range(args.seeds) for v in args.variants),
                  key=lambda vs: (COST.get(vs[0], 9), vs[1]))
    # worker processes (started fresh: PyTorch's OpenMP does not survive a fork) that import
    # PyTorch and opkit once and train one run after another
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(run_one, *zip(*[(v, s, args.steps, args.quick, args.threads, runs,
                                               args.reuse) for v, s in jobs])))
    return sorted(done, key=lambda m: (VARIANTS.index(m["variant"]), m["seed"]))


# ----------------------------------------------------------------------------- timing

def contenders(settings: dict, variants=()):
    """{name: (G, D, as_input)}: the same `torch` model as is, in channels_last, and optimized
    (when opkit.torch.optimize exists), and optimized with each config change in `variants`
    (named by it); one more entry, "optimized_error", says why not."""
    import torch
    import train
    from models import Discriminator, Generator
    batch = settings["batch_size"]
    torch.manual_seed(0)
    G, D = Generator("torch", settings["z_dim"], settings["width"]), Discriminator("torch", settings["width"])
    state_g, state_d = G.state_dict(), D.state_dict()

    def copy(variant):
        g = Generator(variant, settings["z_dim"], settings["width"])
        d = Discriminator(variant, settings["width"])
        g.load_state_dict(state_g)
        d.load_state_dict(state_d)
        return g, d

    cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    out = {"torch": (G, D, lambda t: t)}
    g, d = copy("torch")
    out["torch channels_last"] = (g.to(memory_format=torch.channels_last),
                                  d.to(memory_format=torch.channels_last), cl)
    z = torch.randn(batch, settings["z_dim"])
    for name, change in [("optimized", {})] + [(f"optimized {k}={v}", {k: v}) for k, v in variants]:
        g, d = copy("torch")
        config = dict(train.OPTIMIZE_CONFIG, **change)
        try:
            g, _ = train.optimize(g.train(), z, config)
            d, _ = train.optimize(d.train(), cl(torch.zeros(batch, 1, 32, 32)), config)
        except train.Unavailable as exc:
            out["optimized_error"] = str(exc)
            break
        out[name] = (g, d, cl if config.get("layout") == "NHWC" else (lambda t: t))
    return out


def bench(settings: dict, rounds: int, threads: int, variants=()) -> dict:
    """Eval forward D(G(z)) and one training step for each contender, in alternating rounds
    (a new random order each round); ratios are medians of round-by-round ratios to `torch`."""
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
    opts = {n: (torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999)))
            for n, (G, D, _) in found.items()}

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
        x = as_input(xb)
        t0 = time.perf_counter()
        for _ in range(calls):
            train.train_step(G, D, *opts[name], x, z, ones, zeros, as_input)
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
        base = times["torch"]
        result[what] = {n: {"ms": statistics.median(t) * 1e3,
                            "speedup": statistics.median(b / x for b, x in zip(base, t))}
                        for n, t in times.items()}
    return result


# ----------------------------------------------------------------------------- summary

def summarize(metrics: List[dict]) -> Dict[str, dict]:
    by: Dict[str, dict] = {}
    for m in metrics:
        e = by.setdefault(m["variant"], {"runs": [], "errors": []})
        (e["errors"] if "error" in m else e["runs"]).append(m)
    for v, e in by.items():
        runs = e["runs"]
        if not runs:
            continue
        scores = [m["score"] for m in runs]
        secs = [m["median_seconds_per_step"] for m in runs]
        e.update(score=statistics.mean(scores),
                 score_std=statistics.stdev(scores) if len(scores) > 1 else 0.0,
                 seconds=statistics.mean(secs),
                 seconds_std=statistics.stdev(secs) if len(secs) > 1 else 0.0)
    return by


def pm(mean: float, std: float, fmt: str) -> str:
    return f"{mean:{fmt}} ± {std:{fmt}}"


def spatial_sentence(s: Dict[str, dict]) -> str:
    base, sp = s.get("plain", {}), s.get("spatial", {})
    if "score" not in base or "score" not in sp:
        return "The spatial α was not compared: the `plain` or `spatial` runs are missing."
    n = min(len(base["runs"]), len(sp["runs"]))
    gain = (base["score"] - sp["score"]) / base["score"]
    cost = sp["seconds"] / base["seconds"] - 1
    # the difference of two means against its standard error
    se = (base["score_std"] ** 2 / len(base["runs"]) + sp["score_std"] ** 2 / len(sp["runs"])) ** 0.5
    noise = abs(base["score"] - sp["score"]) <= 2 * se
    verdict = ("so the seeds' spread covers the difference; at this length of training this does "
               "not show an improvement either way"
               if noise else ("an improvement beyond the seeds' spread" if gain > 0
                              else "worse, beyond the seeds' spread"))
    claim = ("close to" if 0.03 <= gain <= 0.11 and 0.05 <= cost <= 0.25 and not noise
             else "not")
    return (f"**Spatial α:** {'lowered' if gain > 0 else 'raised'} the digits FID by "
            f"{abs(gain):.1%} against plain LeakyReLU ({pm(sp['score'], sp['score_std'], '.1f')} "
            f"against {pm(base['score'], base['score_std'], '.1f')}, {n} seeds; twice the standard "
            f"error of the difference is {2 * se:.1f}, {verdict}) at {cost:+.0%} time per "
            f"training step: this is {claim} the ~7% better at ~15% more compute of the "
            f"reference article.")


def optimized_sentence(s: Dict[str, dict], b: Optional[dict]) -> str:
    if b is None or b.get("optimized_error") or "optimized" not in b.get("eval", {}):
        why = (b or {}).get("optimized_error") or "the timing section did not run"
        return f"**optimized vs torch:** not measured in this run: {why}."
    ev, tr = b["eval"]["optimized"]["speedup"], b["train"]["optimized"]["speedup"]
    cl_ev, cl_tr = (b["eval"]["torch channels_last"]["speedup"],
                    b["train"]["torch channels_last"]["speedup"])
    text = (f"**optimized vs torch:** the `optimized` model ran the eval forward (D + G) "
            f"{ev:.2f}× as fast as `torch` and a training step {tr:.2f}× as fast "
            f"({ev / cl_ev:.2f}× and {tr / cl_tr:.2f}× against `torch` in channels_last); the "
            f"reference article reports 23% faster training (1.23×).")
    if "optimized" in s and "score" in s["optimized"] and "torch" in s and "score" in s["torch"]:
        text += (f" In the training runs its median step took "
                 f"{s['optimized']['seconds'] / s['torch']['seconds']:.2f}× the time of "
                 f"`torch`'s.")
    return text


# ----------------------------------------------------------------------------- plots

def plot_curves(metrics: List[dict], path: Path, window: int = 20) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"not writing {path}: plots need matplotlib (pip install matplotlib)")
        return False
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=90)
    for v in VARIANTS:
        runs = [m for m in metrics if m["variant"] == v and "error" not in m]
        if not runs:
            continue
        for ax, key in zip(axes[:2], ("discriminator", "generator")):
            curve = np.mean([m["losses"][key] for m in runs], axis=0)
            k = min(window, len(curve))
            smooth = np.convolve(curve, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(k, len(curve) + 1), smooth, label=v, lw=1.2)
        steps = [s for s, _ in runs[0]["scores"]]
        axes[2].plot(steps, np.mean([[x for _, x in m["scores"]] for m in runs], axis=0),
                     marker="o", ms=3, label=v, lw=1.2)
    axes[0].set_title(f"discriminator loss (mean of seeds, {window}-step average)", fontsize=9)
    axes[1].set_title(f"generator loss (mean of seeds, {window}-step average)", fontsize=9)
    axes[2].set_title("digits FID (mean of seeds; lower is better)", fontsize=9)
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- the page

def asset(doc: Path, name: str) -> Path:
    """docs/gan.md's images: docs/gan-<name>.png, next to the page."""
    return doc.parent / f"{doc.stem}-{name}.png"


def page(args, metrics: List[dict], b: Optional[dict], doc: Path) -> str:
    s = summarize(metrics)
    first = next(m for m in metrics if "error" not in m)
    st = first["settings"]
    lines = [BEGIN, "",
             f"Settings: {args.steps} training steps, {args.seeds} seeds (0–{args.seeds - 1}) per "
             f"variant, batch {st['batch_size']}, width {st['width']} (channels "
             f"{st['width']}/{2 * st['width']}/{4 * st['width']}), z of {st['z_dim']}, Adam "
             f"{st['lr']:g} (β 0.5, 0.999); digits FID of {st['eval_samples']} samples against "
             f"the 1797 real digits. Each run on {args.threads} thread(s) for PyTorch and opkit, "
             f"{args.jobs} runs at a time. Machine: {cpu_name()}, {os.cpu_count()} cores, "
             f"Python {first['machine']['python']}, PyTorch {first['machine']['torch']}. "
             f"Command: `python examples/gan/compare.py {' '.join(args.argv)}`.",
             "",
             f"The classifier behind the score: {first['classifier_accuracy']:.1%} accuracy on "
             f"its 360 held-out digits. {st['eval_samples']} real digits drawn at random score "
             f"{first['real_floor']:.1f}: the floor at this sample size.",
             "",
             "| variant | seconds per step | vs torch | digits FID (mean ± std) | runs |",
             "| --- | --- | --- | --- | --- |"]
    base = s.get("torch", {}).get("seconds")
    for v in VARIANTS:
        e = s.get(v)
        if e is None:
            continue
        if "score" not in e:
            lines.append(f"| `{v}` | — | — | not run: {e['errors'][0]['error']} | 0 |")
            continue
        rel_t = f"{e['seconds'] / base:.2f}×" if base else "—"
        lines.append(f"| `{v}` | {pm(e['seconds'], e['seconds_std'], '.3f')} | {rel_t} | "
                     f"{pm(e['score'], e['score_std'], '.1f')} | {len(e['runs'])} |")
    left_out = [f"`{v}`" for v in VARIANTS if v not in args.variants]
    if left_out:
        lines += ["", f"Not in this comparison (left out with `--variants`): {', '.join(left_out)}."]
    lines += ["", "Seconds per step: the median step of each run, mean ± std over the seeds. "
              "The machine is shared, so absolute times move between runs; the timing section "
              "below compares side by side.", "",
              spatial_sentence(s), "", optimized_sentence(s, b), ""]
    if b is not None:
        lines += ["### Side by side: eval forward and training step", "",
                  f"The `torch` model (batch {b['settings']['batch_size']}, width "
                  f"{b['settings']['width']}), as it is, converted to channels_last, and "
                  f"through `opkit.torch.optimize` with {config_text()}; {b['threads']} threads "
                  f"for PyTorch and opkit; {b['rounds']} rounds in a new random order each, "
                  "medians of the round-by-round ratios to `torch`.", "",
                  "| model | eval forward D(G(z)), ms | speed-up | training step, ms | speed-up |",
                  "| --- | --- | --- | --- | --- |"]
        for n in b["eval"]:
            e, t = b["eval"][n], b["train"][n]
            lines.append(f"| {n} | {e['ms']:.2f} | {e['speedup']:.2f}× | {t['ms']:.1f} | "
                         f"{t['speedup']:.2f}× |")
        if b.get("optimized_error"):
            lines += ["", f"`optimized` is missing: {b['optimized_error']}."]
        lines.append("")
    lines += ["### Training curves", "", f"![training curves]({asset(doc, 'curves').name})", "",
              "### Samples (seed 0, final generator, eval mode)", ""]
    cells = [f"![{v}]({asset(doc, 'samples-' + v).name})" for v in VARIANTS
             if asset(doc, "samples-" + v).exists()]
    lines += [" ".join(cells), "", END]
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


def _config_change(p, text: str):
    """'conv=opkit' -> ("conv", "opkit"); True/False/None and numbers as Python reads them."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        p.error(f"--bench-config: expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--quick", action="store_true", help="train.py's small model and batch")
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
                   help="folder for each run's metrics.json and samples.png")
    p.add_argument("--reuse", action="store_true",
                   help="take the metrics of runs already in --runs with the same steps and "
                        "--quick instead of training them again (to finish an interrupted "
                        "comparison, or add variants to one)")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "gan.md")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.bench_config = [_config_change(p, c) for c in args.bench_config]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    args.runs.mkdir(parents=True, exist_ok=True)

    print(f"training {len(args.variants)} variants x {args.seeds} seeds, {args.steps} steps",
          flush=True)
    metrics = run_all(args, args.runs)
    if not any("error" not in m for m in metrics):
        print("compare.py: every run failed; not writing the page", file=sys.stderr)
        return 1
    b = None
    if args.bench_rounds > 0:
        print("timing torch / torch channels_last / optimized side by side", flush=True)
        import train
        quick = args.quick if args.bench_size == "runs" else args.bench_size == "quick"
        b = bench(train.QUICK if quick else train.FULL, args.bench_rounds, args.bench_threads,
                  args.bench_config)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    plot_curves(metrics, asset(args.doc, "curves"))
    for v in args.variants:
        src = args.runs / f"{v}-0" / "samples.png"
        if src.exists():
            shutil.copyfile(src, asset(args.doc, "samples-" + v))
    (args.runs / "summary.json").write_text(json.dumps({"bench": b, "runs": [
        {k: m.get(k) for k in ("variant", "seed", "score", "median_seconds_per_step", "error")}
        for m in metrics]}, indent=1) + "\n")
    write_doc(args.doc, page(args, metrics, b, args.doc))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
