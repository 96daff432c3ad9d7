"""What `opkit bench` prints and draws: the table of rows, the targets met or not, the notes on
the calls through torch.ops, and the chart (matplotlib)."""
from __future__ import annotations

from typing import List, Optional

from .harness import Row, torch_modules
from .targets import TargetResult


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_rows(rows: List[Row]) -> str:
    head = ["case", "dtype", "opkit ms", "GB/s", "copy GB/s", "vs copy", "numpy ms", "x numpy",
            "torch ms", "x torch", "compile ms", "x compile"]
    table = []
    for r in rows:
        s = r.seconds
        ms = lambda who: _fmt(s.get(who) and s[who] * 1e3, ".4g")  # noqa: E731
        table.append([r.case, r.dtype, ms("opkit"), _fmt(r.gbps("opkit"), ".1f"),
                      _fmt(r.gbps("copy"), ".1f"), _fmt(r.ratio("copy"), ".2f"),
                      ms("numpy"), _fmt(r.ratio("numpy"), ".2f"), ms("torch"), _fmt(r.ratio("torch"), ".2f"),
                      ms("torch.compile"), _fmt(r.ratio("torch.compile"), ".2f")])
    widths = [max(len(str(x[i])) for x in table + [head]) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(t) for t in table])


def format_targets(results: List[TargetResult]) -> str:
    out = []
    for t in results:
        state = ("n/a (torch not installed)" if torch_modules()[0] is None else "n/a (no such contender here)") \
            if t.met is None else ("met" if t.met else "NOT MET")
        out.append(f"{t.case:<44} {t.check:<40} {_fmt(t.ratio, '7.2f')}x  (>= {t.minimum:.2f}x)  {state}")
    return "\n".join(out)


def torch_notes(rows: List[Row]) -> List[str]:
    """The calls through torch.ops next to the NumPy-level call of the same kernel."""
    out = []
    for r in rows:
        s = r.seconds
        if not r.case.startswith("torch.ops") or "opkit" not in s:
            continue
        unit, scale = ("us", 1e6) if s["opkit"] < 1e-4 else ("ms", 1e3)
        parts = [f"{s['opkit'] * scale:.3g} {unit} through torch.ops"]
        if "opkit numpy" in s:
            parts.append(f"{s['opkit numpy'] * scale:.3g} {unit} NumPy-level "
                         f"(+{(s['opkit'] - s['opkit numpy']) * scale:.3g} {unit}, "
                         f"{1 / r.ratio('opkit numpy'):.3f}x)")
        if "torch" in s:
            parts.append(f"PyTorch {s['torch'] * scale:.3g} {unit}")
        out.append(f"{r.case}: " + "; ".join(parts))
    return out


def plot(rows: List[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    who = ["opkit", "copy", "numpy", "torch"]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.5))
    height = 0.2
    for k, name in enumerate(who):
        vals = [r.gbps(name) or 0 for r in rows]
        ax.barh([i + k * height for i in range(len(rows))], vals, height, label=name)
    ax.set_yticks([i + 1.5 * height for i in range(len(rows))])
    ax.set_yticklabels([f"{r.case} ({r.dtype})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (bytes read + written per call / median time)")
    ax.legend(loc="lower right")
    ax.set_title("opkit bench")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
