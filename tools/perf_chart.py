"""Draw docs/performance.svg, and print the activation table of docs/performance.md, from the
JSON files that `opkit bench NAME... --check --json FILE` writes.

    python tools/perf_chart.py docs/bench/activations.json docs/bench/gelu-tanh.json \
        --svg docs/performance.svg --table

Ratios are the bench's own: with --check, the JSON's "targets" hold each row's median of
round-by-round ratios (vs copy, x torch eager, x torch.compile); without it they are computed
from the medians in "rows" (seconds of the other side / opkit's). Nothing is timed here.
"""
import argparse
import json
import math
from typing import Dict, List, Optional

CHECKS = {"copy": "vs copy bandwidth", "torch": "x torch eager", "torch.compile": "x torch.compile"}
DTYPES = ("float32", "float16")
PASSES = ("forward", "backward")


def load(paths: List[str]) -> List[dict]:
    """The rows of every file, each with its ratios (None where a side did not run) and its
    file's machine."""
    rows = []
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        checks = {(t["case"], t["check"]): t["ratio"] for t in data.get("targets", [])}
        for r in data["rows"]:
            s, key = r["seconds"], f"{r['case']} {r['dtype']}"
            ratios = {}
            for who, label in CHECKS.items():
                ratio = checks.get((key, label))
                if ratio is None and s.get(who) and s.get("opkit"):
                    ratio = s[who] / s["opkit"]
                ratios[who] = ratio
            rows.append(dict(r, name=r["case"].split()[0], ratios=ratios,
                             machine=data["machine"]))
    return rows


def caption(rows: List[dict]) -> str:
    """The machine and date of the first row, as `opkit bench` recorded them."""
    m, n = rows[0]["machine"], math.prod(rows[0]["shape"])
    isa = "AVX-512" if "avx512f" in m["target"] else "AVX2" if "avx2" in m["target"] else "SSE2"
    size = f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" if n >= 1 << 10 else str(n)
    return (f"opkit against PyTorch {m['torch']}, {size} elements: {m['cpu']} ({isa}), "
            f"{m['cores']} cores, {m['threads']} threads, {m['date'][:10]}")


def grid(rows: List[dict]) -> Dict[str, Dict[tuple, dict]]:
    """{operator: {(dtype, pass): ratios}}, by name (gelu[approximate=tanh] after gelu)."""
    out: Dict[str, Dict[tuple, dict]] = {}
    for r in rows:
        out.setdefault(r["name"], {})[(r["dtype"], r["pass_"])] = r["ratios"]
    return dict(sorted(out.items()))


def _cell(cells: Dict[tuple, dict], dtype: str, who: str) -> str:
    def one(pass_) -> str:
        v: Optional[float] = cells.get((dtype, pass_), {}).get(who)
        return "–" if v is None else f"{v:.2f}"
    return f"{one('forward')} / {one('backward')}"


def table(rows: List[dict]) -> str:
    head = ["operator"] + [f"{dt} {label}" for dt in DTYPES
                           for label in ("vs copy", "× eager", "× compile")]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, cells in grid(rows).items():
        lines.append("| " + " | ".join([name] + [_cell(cells, dt, who) for dt in DTYPES
                                                 for who in CHECKS]) + " |")
    return "\n".join(lines)


def chart(rows: List[dict], path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"   # text as text: a small file
    matplotlib.rcParams["svg.hashsalt"] = "opkit"  # the same file from the same data
    import matplotlib.pyplot as plt

    cells = {n: c for n, c in grid(rows).items()
             if any(v.get("torch") for v in c.values())}   # operators PyTorch has
    names = list(cells)
    bars = [("torch", "float32", "× eager, float32", "#1f5fa8"),
            ("torch", "float16", "× eager, float16", "#8fb8e6"),
            ("torch.compile", "float32", "× torch.compile, float32", "#d0661a"),
            ("torch.compile", "float16", "× torch.compile, float16", "#f3b37f")]
    h = 0.2
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.34 * len(names) + 1.6), sharey=True)
    for ax, pass_ in zip(axes, PASSES):
        for k, (who, dtype, label, color) in enumerate(bars):
            vals = [cells[n].get((dtype, pass_), {}).get(who) or 0 for n in names]
            ax.barh([i + (k - 1.5) * h for i in range(len(names))], vals, h, color=color,
                    label=label)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlim(0.3, 100)
        ax.set_title(pass_, fontsize=10)
        ax.grid(axis="x", which="major", linewidth=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_yticks(range(len(names)))
    axes[0].set_yticklabels(names, fontsize=8)
    axes[0].invert_yaxis()
    fig.supxlabel("times faster than PyTorch (log scale; left of 1: slower)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=4,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, metadata={"Date": None})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="files written by opkit bench --json")
    p.add_argument("--svg", help="draw the chart here (needs matplotlib)")
    p.add_argument("--table", action="store_true", help="print the Markdown table")
    args = p.parse_args()
    rows = load(args.json)
    if args.table:
        print(table(rows))
    if args.svg:
        chart(rows, args.svg, caption(rows))


if __name__ == "__main__":
    main()
