"""The `opkit bench` command: its options (`add_parser`, which opkit.cli calls) and its run
(`main`): the targets without operator names, the generic sweep with them; the table, the
targets, the JSON record and the chart."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Dict, List, Sequence

import numpy as np

from .._options import add_path_option
from .harness import machine, torch_modules
from .report import format_rows, format_targets, plot, torch_notes
from .sweep import generic_rows
from .targets import TargetResult, build_times, elementwise_targets, run_targets


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def _dims_option(texts: Sequence[str]) -> Dict[str, int]:
    """--dims NAME=SIZE texts as {name: size}; ValueError for a malformed one."""
    out = {}
    for t in texts:
        name, _, value = t.partition("=")
        if not name.isidentifier() or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--dims {t!r}: expected NAME=SIZE with a positive whole size, "
                             "e.g. K=4096")
        out[name] = int(value)
    return out


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time kernels against the copy bandwidth, NumPy and PyTorch")
    b.add_argument("names", nargs="*", help="operators to time (default: the performance targets)")
    b.add_argument("--all", action="store_true", help="time every registered operator")
    add_path_option(b)
    b.add_argument("--sizes", default="16,64K,4M",
                   help="elements per input, e.g. 16,64K,16M (16M: beyond every cache)")
    b.add_argument("--dtypes", default="float32,float16", help="comma-separated dtypes")
    b.add_argument("--layouts", default="ND,NCHW,NHWC", help="layouts to try where an operator has them")
    b.add_argument("--passes", default="forward,backward")
    b.add_argument("--threads", type=int, help="kernel threads (default: all cores); torch uses the same")
    b.add_argument("--repeat", type=int, default=15, help="interleaved rounds per case (median)")
    b.add_argument("--budget", type=float, default=0.3, metavar="SECONDS",
                   help="with operator names: about this long timing each case (at least 5 rounds)")
    b.add_argument("--build-times", action="store_true", help="also time a cold and a warm `opkit build`")
    b.add_argument("--no-compile", action="store_true",
                   help="with operator names: leave out torch.compile's column (it compiles each case first)")
    b.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                   help="with operator names: set this attr where an operator has it (repeatable), "
                        "e.g. --attr approximate=tanh for gelu's tanh form")
    b.add_argument("--dims", action="append", default=[], metavar="NAME=SIZE",
                   help="with operator names: the size of a named dim (repeatable), e.g. --dims "
                        "N=4096 --dims K=4096 for a softmax over [N, K]; N, C, H and W also shape "
                        "4-d inputs (then --sizes is not used)")
    b.add_argument("--check", action="store_true",
                   help="with operator names: check every row against the elementwise targets "
                        "(vs copy >= 0.8 float32 / 0.7 float16, x torch >= 1, x torch.compile >= 1)")
    b.add_argument("--json", default="", help="write the results here (default: bench-<date>.json)")
    b.add_argument("--plot", default="", metavar="PNG", help="draw a chart (needs matplotlib)")
    b.set_defaults(func=main)


def _progress(text: str) -> None:
    """One line per case on stderr (overwritten in place on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
    else:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def main(args) -> int:
    import opkit
    if args.threads:
        opkit.configure(num_threads=args.threads)
    torch, _ = torch_modules()
    if torch is not None:
        from ..config import get
        torch.set_num_threads(get("num_threads"))
    rng = np.random.default_rng(0)
    info = machine()
    print(f"# {info['cpu']}, {info['cores']} cores, {info['threads']} threads; {info['target']}")
    print(f"# numpy {info['numpy']}, torch {info['torch'] or 'not installed'}, opkit {info['opkit']}")
    results: List[TargetResult] = []
    if args.names or args.all:
        names = list(args.names) + (opkit.list_ops() if args.all else [])
        notes: List[str] = []
        rows = generic_rows(list(dict.fromkeys(names)), [_parse_size(s) for s in args.sizes.split(",")],
                            args.dtypes.split(","), args.layouts.split(","), args.passes.split(","),
                            args.repeat, rng, budget=args.budget, progress=_progress, notes=notes,
                            compiled=not args.no_compile, attrs=args.attr,
                            dims=_dims_option(args.dims))
        if args.check:
            results = elementwise_targets(rows)
    else:
        rows, results = run_targets(args.repeat, rng)
    if (args.names or args.all) and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    print(format_rows(rows))
    if args.names or args.all:
        for line in notes:
            print(line)
    notes = torch_notes(rows)
    if notes:
        print()
        print("\n".join(notes))
    builds = None
    if args.build_times:
        from ..config import get
        builds = build_times(get("num_threads"))
        for label, seconds, limit in (("cold", builds[0], 90.0), ("warm", builds[1], 2.0)):
            results.append(TargetResult(f"opkit build, {label} cache", "seconds (limit)", limit / seconds, 1.0))
            print(f"opkit build, {label} cache: {seconds:.1f} s (target <= {limit:.0f} s)")
    if results:
        print()
        print(format_targets(results))
    path = args.json or f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path, "w") as fh:
        json.dump({"machine": info, "command": " ".join(sys.argv),
                   "rows": [{k: v for k, v in asdict(r).items() if k != "rounds"} for r in rows],
                   "targets": [dict(asdict(t), met=t.met) for t in results], "notes": notes,
                   "build_seconds": builds}, fh, indent=1, default=str)
    print(f"\nwrote {path}")
    if args.plot:
        try:
            plot(rows, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("opkit bench: --plot needs matplotlib (pip install 'opkit[plot]')", file=sys.stderr)
            return 1
    return 0
