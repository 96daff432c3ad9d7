"""The statistics of the GAN comparison (examples/gan/stats.py): Student's t quantile and
Welch's interval against SciPy and published tables, and the verdict on a claimed effect."""
import importlib.util
import math

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("gan_stats", REPO / "examples" / "gan" / "stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)


# two-sided 95% critical values of Student's t (any statistics table)
TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 8: 2.306, 30: 2.042, 1000: 1.962}


@pytest.mark.parametrize("df", sorted(TABLE))
def test_t_quantile_matches_the_table(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(TABLE[df], abs=6e-4)


@pytest.mark.parametrize("p, df", [(0.5, 3), (0.9, 2.5), (0.975, 3.7), (0.995, 1.3), (0.999, 60)])
def test_t_quantile_matches_scipy(p, df):
    t = pytest.importorskip("scipy.stats").t
    assert stats.t_quantile(p, df) == pytest.approx(t.ppf(p, df), rel=1e-7, abs=1e-9)


def test_t_quantile_rejects_what_it_cannot_answer():
    with pytest.raises(ValueError, match="needs 0.5 <= p < 1 and df > 0; got p=0.2, df=3"):
        stats.t_quantile(0.2, 3)
    with pytest.raises(ValueError, match="df > 0; got p=0.9, df=0"):
        stats.t_quantile(0.9, 0)


def test_welch_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    a, b = [31.0, 35.5, 29.8, 40.1, 33.3], [36.2, 38.0, 41.7, 35.9, 44.4, 39.0]
    iv = stats.welch(a, b)
    res = scipy_stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert iv.diff == pytest.approx(sum(a) / 5 - sum(b) / 6)
    assert (iv.lo, iv.hi) == (pytest.approx(ci.low, rel=1e-7), pytest.approx(ci.high, rel=1e-7))
    assert iv.df == pytest.approx(res.df, rel=1e-9)


def test_welch_edge_cases():
    assert stats.welch([2.0, 2.0], [1.0, 1.0]) == (1.0, 1.0, 1.0, math.inf)
    with pytest.raises(ValueError, match="at least 2 values in each sample; got 1 and 3"):
        stats.welch([1.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("lo, hi, claim, said", [
    (-0.12, -0.03, -0.07, "holds"),                  # excludes 0, includes the claim
    (-0.30, -0.20, -0.07, "holds"),                  # beyond the claim
    (-0.04, -0.01, -0.07, "does not hold"),          # real, but smaller than claimed
    (-0.03, 0.05, -0.07, "does not hold"),           # excludes the claim, includes 0
    (0.02, 0.09, -0.07, "does not hold"),            # the other direction
    (-0.10, 0.02, -0.07, "cannot be told apart"),    # includes both
    (0.10, 0.40, 0.23, "holds"),
    (-0.05, 0.10, 0.23, "does not hold"),
])
def test_verdict(lo, hi, claim, said):
    assert stats.verdict(lo, hi, claim) == said


def test_verdict_needs_a_claim():
    with pytest.raises(ValueError, match="the claimed effect must be nonzero"):
        stats.verdict(-1.0, 1.0, 0.0)
