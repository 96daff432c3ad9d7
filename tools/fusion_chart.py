"""Draw docs/fusion.svg from an `opkit bench --json` file: milliseconds per call of each
convolution case, opkit fused / opkit conv alone / opkit unfused chain / PyTorch eager (in x's
layout and channels_last) / torch.compile with freezing, where the run has them.

    opkit bench --json bench.json && python tools/fusion_chart.py bench.json docs/fusion.svg

Plain SVG written by hand: no plotting library needed."""
import json
import sys
from html import escape

WHO = [("opkit", "opkit fused", "#1f77b4"), ("opkit conv", "opkit conv alone", "#9ecae1"),
       ("opkit unfused", "opkit conv + BN + LeakyReLU passes", "#ff7f0e"),
       ("torch", "PyTorch eager", "#7f7f7f"), ("torch CL", "PyTorch eager, channels_last", "#bdbdbd"),
       ("torch.compile freezing", "torch.compile with freezing", "#2ca02c")]


def chart(rows, width=900) -> str:
    rows = [r for r in rows if r["case"].startswith("conv2d_")]
    top = max(v for r in rows for v in r["seconds"].values()) * 1e3
    bar, gap, label_w, left = 12, 14, 330, 10
    y, parts = 58, []
    scale = (width - label_w - 80) / top
    for r in rows:
        who = [w for w in WHO if w[0] in r["seconds"]]
        parts.append(f'<text x="{left}" y="{y + bar * len(who) / 2 + 4}" font-size="12">'
                     f'{escape(r["case"])}</text>')
        for key, _, color in who:
            ms = r["seconds"][key] * 1e3
            parts.append(f'<rect x="{label_w}" y="{y}" width="{ms * scale:.1f}" height="{bar - 2}" '
                         f'fill="{color}"/>')
            parts.append(f'<text x="{label_w + ms * scale + 4:.1f}" y="{y + bar - 3}" '
                         f'font-size="10">{ms:.1f} ms</text>')
            y += bar
        y += gap
    # three entries a row
    legend = "".join(f'<rect x="{label_w + i % 3 * 190}" y="{10 + i // 3 * 16}" width="10" height="10" fill="{c}"/>'
                     f'<text x="{label_w + i % 3 * 190 + 14}" y="{19 + i // 3 * 16}" font-size="10">{escape(n)}</text>'
                     for i, (_, n, c) in enumerate(WHO))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
            f'{legend}{"".join(parts)}</svg>\n')


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        data = json.load(fh)
    with open(sys.argv[2], "w") as fh:
        fh.write(chart(data["rows"]))
