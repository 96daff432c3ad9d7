"""The timing harness of `opkit bench`: interleaved medians (`timed`), one measured case
(`Row`), PyTorch where it is installed (`torch_modules`) and the machine a run was made on
(`machine`). It imports nothing else from opkit.bench: the other modules build on it.

Every number is a median over interleaved repetitions (opkit, copy, NumPy, PyTorch, opkit, ...),
so a noisy neighbour slows all contenders alike.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .._version import __version__

Fn = Callable[[], object]


def torch_modules():
    """(torch, torch.nn.functional), or (None, None) where PyTorch is not installed."""
    try:
        import torch
        import torch.nn.functional as F
        return torch, F
    except ImportError:
        return None, None


def timed(fns: Dict[str, Optional[Fn]], repeat: int, warmup: int = 2,
          rounds: Optional[Dict[str, List[float]]] = None, shuffle=None,
          budget: Optional[float] = None) -> Dict[str, float]:
    """Median seconds per call of each function, the functions interleaved round by round
    (each round's times are appended to `rounds` when it is given). `shuffle`: a NumPy
    Generator that orders each round anew, so no function always runs right after the same
    other one (PyTorch's worker threads keep spinning for a while after its own calls).
    `budget`: fewer rounds (at least 5) where `repeat` of them would take longer (seconds); a
    contender after the first that takes more than a fifth of it per call (NumPy's float16
    arithmetic on millions of elements, say) is warmed up once and timed once, outside the
    rounds."""
    fns = {k: f for k, f in fns.items() if f is not None}
    slow, warm = set(), set()  # (a call longer than the budget is warm after one call)
    for i in range(warmup):
        for j, (k, f) in enumerate(fns.items()):
            if k in slow or k in warm:
                continue
            t0 = time.perf_counter()
            f()
            dt = time.perf_counter() - t0
            if budget is not None and i == 0 and j > 0 and dt > budget / 5:
                slow.add(k)
            if budget is not None and dt > budget:
                warm.add(k)
    times: Dict[str, List[float]] = {k: [] for k in fns}
    # tiny calls are timed in batches so the clock's resolution does not matter
    inner, per_round = {}, 0.0
    for k, f in fns.items():
        t0 = time.perf_counter()
        f()
        dt = time.perf_counter() - t0
        inner[k] = max(1, min(10000, int(2e-3 / max(dt, 1e-9))))
        if k in slow:
            times[k].append(dt)
        else:
            per_round += dt * inner[k]
    if budget is not None:  # (3 rounds where one alone takes longer than the budget)
        repeat = max(3 if per_round > budget else 5, min(repeat, int(budget / max(per_round, 1e-9))))
    for _ in range(repeat):
        order = [k for k in fns if k not in slow]
        if shuffle is not None:
            order = [order[i] for i in shuffle.permutation(len(order))]
        for k in order:
            f, n = fns[k], inner[k]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[k].append((time.perf_counter() - t0) / n)
    if rounds is not None:
        rounds.update(times)
    return {k: float(np.median(v)) for k, v in times.items()}


@dataclass
class Row:
    case: str
    op: str
    pass_: str
    dtype: str
    shape: Tuple[int, ...]
    bytes: int                        # memory traffic of one call: inputs read + outputs written
    seconds: Dict[str, float] = field(default_factory=dict)
    rounds: Dict[str, List[float]] = field(default_factory=dict, repr=False)

    def gbps(self, who: str) -> Optional[float]:
        t = self.seconds.get(who)
        return self.bytes / t / 1e9 if t else None

    def ratio(self, slower: str, faster: str = "opkit") -> Optional[float]:
        """How many times faster `faster` is: the median of the round-by-round ratios when the
        rounds were kept (a drifting load on the machine cancels out), else of the medians."""
        a, b = self.rounds.get(slower), self.rounds.get(faster)
        if a and b and len(a) == len(b):
            return float(np.median([x / y for x, y in zip(a, b)]))
        a, b = self.seconds.get(slower), self.seconds.get(faster)
        return a / b if a and b else None


def machine() -> Dict[str, object]:
    from ..target import current
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    torch, _ = torch_modules()
    from ..config import get
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": get("num_threads"),
            "target": current().describe(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
            "opkit": __version__, "date": time.strftime("%Y-%m-%d %H:%M")}
