"""A long operator (thousands of operations over many lines) builds into one SSA kernel per pass,
runs, and validates against the reference."""
import numpy as np
import pytest

from opkit.registry import make_op
from opkit.validate import validate_op

from conftest import declaration, write_op

LINES, TERMS, CHAIN = 3, 400, 300


def long_forward():
    """LINES * TERMS terms summed (TERMS per line, under the per-expression operator limit), then
    CHAIN lines of where, max and min."""
    forward = {}
    for k in range(LINES):
        terms = [f"x * {j % 7 + 1}" if j % 2 else "x" for j in range(TERMS)]
        forward[f"s{k}"] = " + ".join(([f"s{k - 1}"] if k else []) + terms)
    prev = f"s{LINES - 1} / {LINES * TERMS}"
    for k in range(CHAIN):
        step = ("where({p} > 0, {p} * 1.01, {p} * 0.99)", "max({p}, -2.5)", "min({p}, 2.6)")[k % 3]
        forward[f"t{k}"] = step.format(p=prev)
        prev = f"t{k}"
    forward["y"] = prev
    return forward


def long_numpy(x):
    s = x.copy() * 0
    for _ in range(LINES):
        for j in range(TERMS):
            s = s + (x * (j % 7 + 1) if j % 2 else x)
    t = s / (LINES * TERMS)
    for k in range(CHAIN):
        t = (np.where(t > 0, t * 1.01, t * 0.99), np.maximum(t, -2.5), np.minimum(t, 2.6))[k % 3]
    return t


@pytest.fixture(scope="module")
def long_op(tmp_path_factory):
    text = declaration(long_forward(), inputs=[("x", "{dtypes: [float64]}")], name="long_op")
    return make_op(write_op(tmp_path_factory.mktemp("long"), text))


@pytest.mark.slow
def test_long_operator_builds_runs_and_validates(long_op):
    x = np.linspace(-3, 3, 101)
    np.testing.assert_allclose(long_op(x), long_numpy(x), rtol=1e-12)
    report = validate_op(long_op)
    assert report.ok, report.format()
    assert len(long_op.lowered().forward.steps) == 1  # one fused kernel
