"""The statistics behind compare.py's sentences: Welch's confidence interval for a difference of
two means, Student's t quantile (no SciPy needed), and the verdict on a claimed effect."""
from __future__ import annotations

import math
import statistics
from typing import NamedTuple, Sequence


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile for 0.5 <= p < 1 and df > 0: the CDF (the density integrated by
    Simpson's rule, which the smooth density makes exact to ~1e-9) solved by bisection."""
    if not 0.5 <= p < 1 or not df > 0:
        raise ValueError(f"t_quantile: needs 0.5 <= p < 1 and df > 0; got p={p}, df={df}")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, n: int = 400) -> float:
        h = t / n
        odd = sum(c * (1 + ((2 * i - 1) * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(1, n // 2 + 1))
        even = sum(c * (1 + (2 * i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(1, n // 2))
        ends = c + c * (1 + t * t / df) ** (-(df + 1) / 2)
        return 0.5 + h / 3 * (ends + 4 * odd + 2 * even)

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


class Interval(NamedTuple):
    """mean(a) - mean(b) and its 95% confidence interval [lo, hi] (Welch)."""
    diff: float
    lo: float
    hi: float
    df: float


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """Welch's interval for mean(a) - mean(b): unequal variances, Satterthwaite's degrees of
    freedom. Needs two values in each sample."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch: needs at least 2 values in each sample; got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    se2 = va + vb
    if se2 == 0:
        return Interval(diff, diff, diff, math.inf)
    df = se2 ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(se2)
    return Interval(diff, diff - half, diff + half, df)


def verdict(lo: float, hi: float, claim: float) -> str:
    """What an interval [lo, hi] of a measured effect says about a claimed effect `claim` (a
    nonzero value on the same scale, its sign the claimed direction):

    - "holds": the interval excludes 0 and includes the claim, or lies beyond it;
    - "does not hold": the interval excludes the claim on the side of 0 (the effect, if any,
      is smaller than claimed, or has the other sign);
    - "cannot be told apart": the interval includes both 0 and the claim."""
    if claim == 0:
        raise ValueError("verdict: the claimed effect must be nonzero")
    s = 1 if claim > 0 else -1
    lo, hi = sorted((s * lo, s * hi))   # the claimed direction made positive
    c = abs(claim)
    if hi < c:
        return "does not hold"
    if lo > 0:
        return "holds"
    return "cannot be told apart"
