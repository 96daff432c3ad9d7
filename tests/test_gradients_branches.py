"""A derived gradient flows only through the branch taken: the derivative of a branch that is not
taken never reaches the result, not even as 0 * inf or 0 * NaN.

Each case is checked against its derivative written by hand in NumPy (np.where picks the branch, so
the untaken side's inf and NaN are dropped), at the extremes: ±inf, ±1000, 0 and ordinary values,
in the float64 reference and in the compiled kernels (float32 and float64).
"""
import re

import numpy as np
import pytest

from opkit.dsl import build_graphs
from opkit.registry import make_op
from opkit.spec import parse_spec

from conftest import declaration, write_op
from test_dsl import run_backward

EXTREMES = np.array([-np.inf, -1000.0, -4.0, -1.0, -0.5, 0.0, 0.5, 1.0, 4.0, 1000.0, np.inf])
# no value where log(x) is within rounding of the clamp bounds (the branch there is a coin flip)
NON_NEGATIVE = np.array([0.0, np.exp(-2.0), 0.25, 0.5, 1.0, 2.0, 4.0, 1000.0, np.inf])
# expm1(x) / x overflows to inf / inf past x = 709 (the taken branch itself is NaN there), and
# its derivative cancels badly near 0
MODERATE = np.array([-np.inf, -1000.0, -4.0, -1.0, 0.0, 1.0, 4.0, 30.0])


def pick(cond, a, b):
    """The hand-derived gradient's select: NumPy evaluates both sides; quietly."""
    return np.where(cond, a, b)


def _sigmoid(x):
    return pick(x > 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x)))


# (id, forward, the derivative dy/dx as a NumPy function, the values of x)
CASES = [
    ("sqrt-untaken", "where(x > 0, sqrt(x), 0)",
     lambda x: pick(x > 0, 0.5 / np.sqrt(x), 0.0), EXTREMES),
    ("stable-softplus", "where(x > 0, x + log1p(exp(-x)), log1p(exp(x)))", _sigmoid, EXTREMES),
    ("log-untaken", "where(x > 0, log(x), 0)", lambda x: pick(x > 0, 1 / x, 0.0), EXTREMES),
    ("reciprocal-if-else", "1 / x if x < 0 else x", lambda x: pick(x < 0, -1 / x ** 2, 1.0),
     EXTREMES),
    ("division-by-untaken-zero", "where(x > 1, 2 / log(x), 0)",
     lambda x: pick(x > 1, -2 / (x * np.log(x) ** 2), 0.0), EXTREMES),
    ("expm1-over-x", "where(x != 0, expm1(x) / x, 1)",
     lambda x: pick(x != 0, (np.exp(x) - np.expm1(x) / x) / x, 0.0), MODERATE),
    ("same-condition-sum", "where(x > 0, log(x), 0) + where(x > 0, sqrt(x), 0)",
     lambda x: pick(x > 0, 1 / x + 0.5 / np.sqrt(x), 0.0), EXTREMES),
    ("different-conditions-sum", "where(x > 0, log(x), 0) + where(x > 1, sqrt(x - 1), 0)",
     lambda x: pick(x > 0, 1 / x, 0.0) + pick(x > 1, 0.5 / np.sqrt(x - 1), 0.0), EXTREMES),
    ("nested", "where(x > 0, where(x > 1, log(x - 1), sqrt(x)), log1p(-x))",
     lambda x: pick(x > 0, pick(x > 1, 1 / (x - 1), 0.5 / np.sqrt(x)), -1 / (1 - x)), EXTREMES),
    ("max-then-sqrt", "sqrt(max(x, 0))",  # at 0 the tie picks x: sqrt's own infinite slope
     lambda x: pick(x >= 0, 0.5 / np.sqrt(x), 0.0), EXTREMES),
    ("min-of-reciprocal", "min(1 / x, 1)",  # a tie (x == 1) splits the gradient in half
     lambda x: pick(1 / x < 1, -1 / x ** 2, pick(1 / x == 1, -0.5 / x ** 2, 0.0)), EXTREMES),
    ("abs-of-sqrt", "abs(sqrt(x))",  # abs has no slope at 0, nor at NaN
     lambda x: pick(x > 0, 0.5 / np.sqrt(x), 0.0), EXTREMES),
    ("clamp-of-log", "clamp(log(x), -1, 1)",
     lambda x: pick((np.log(x) >= -1) & (np.log(x) <= 1), 1 / x, 0.0), NON_NEGATIVE),
]
IDS = [c[0] for c in CASES]


def expected(derivative, x, dy):
    with np.errstate(all="ignore"):
        return dy * derivative(x)


def dys_for(x, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 2.0, x.shape) * rng.choice([-1.0, 1.0], x.shape)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reference_gradient_ignores_the_untaken_branch(case):
    _, forward, derivative, x = case
    spec = parse_spec(declaration(forward), "t.yaml")
    graphs = build_graphs(spec)
    dy = dys_for(x)
    got = run_backward(spec, graphs, {"x": x}, {"y": dy})["x"]
    np.testing.assert_allclose(got, expected(derivative, x, dy), rtol=1e-13, atol=0,
                               err_msg=f"{forward}: {graphs.derived.format()}")


def test_branch_derivatives_are_inside_the_select():
    """The leak is structural: the untaken derivative is computed inside the branch, not
    multiplied onto a masked gradient."""
    spec = parse_spec(declaration("where(x > 0, sqrt(x), 0)"), "t.yaml")
    assert build_graphs(spec).derived.format() == "dx = sum_to(where(x > 0, dy * 0.5 / sqrt(x), 0), x)"


# ------------------------------------------------------------------------------ compiled kernels

def _rename(cases):
    """y<k>: the k-th case's forward, of x<k>: one operator (one compile) for several cases."""
    return {f"y{k}": re.sub(r"\bx\b", f"x{k}", f) for k, (_, f, _, _) in enumerate(cases)}


GROUPS = {"a": CASES[:7], "b": CASES[7:]}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("branches")
    ops = {}
    for key, cases in GROUPS.items():
        text = declaration(_rename(cases), inputs=[f"x{k}" for k in range(len(cases))],
                           outputs=[f"y{k}" for k in range(len(cases))], name=f"branches_{key}")
        ops[key] = make_op(write_op(folder, text, f"{key}.yaml"))
    return ops


@pytest.mark.parametrize("key", sorted(GROUPS))
@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-13), ("float32", 2e-6)])
def test_compiled_gradient_ignores_the_untaken_branch(compiled, key, dtype, rtol):
    cases = GROUPS[key]
    size = max(len(c[3]) for c in cases)
    xs = [np.resize(c[3], size).astype(dtype) for c in cases]
    dys = [dys_for(x, seed=k).astype(dtype) for k, x in enumerate(xs)]
    grads = compiled[key].backward(tuple(dys), *xs)
    for (case_id, forward, derivative, _), x, dy, got in zip(cases, xs, dys, grads):
        assert got.dtype == np.dtype(dtype)
        want = expected(derivative, x.astype(np.float64), dy.astype(np.float64))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=0,
                                   err_msg=f"{case_id}: {forward} in {dtype}")
