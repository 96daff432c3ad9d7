"""NaN and inf in validation: a NaN matches a NaN only where the forward result itself is NaN; a
non-finite gradient where the forward is finite fails the backward check, the finite-difference
check and the check of a hand-written backward."""
import numpy as np
import pytest

from opkit.dsl import build_graphs
from opkit.errors import SpecError
from opkit.registry import make_op
from opkit.runtime.bind import bind
from opkit.spec import parse_spec
from opkit.validate import validate_op
from opkit.validate.compare import Comparison, forward_nan

from conftest import declaration, write_op

F64 = "{dtypes: [float64]}"


def test_nan_in_both_counts_as_equal_only_where_allowed():
    got = np.array([1.0, np.nan, 3.0])
    allowed, refused = Comparison(), Comparison()
    allowed.add(got, got.copy(), "float64", "a", nan_ok=np.array([False, True, False]))
    refused.add(got, got.copy(), "float64", "b", nan_ok=np.array([True, False, True]))
    assert allowed.worst == 0.0
    assert refused.worst == np.inf and "NaN at (1,) where the forward result is finite" in refused.where
    forward = Comparison()  # a forward result: NaN against NaN is equal
    forward.add(got, got.copy(), "float64", "y")
    assert forward.worst == 0.0


@pytest.mark.parametrize("got, want", [([1.0, np.nan], [1.0, 2.0]), ([1.0, 2.0], [1.0, np.nan]),
                                       ([np.inf, 2.0], [1.0, 2.0]), ([1.0, 2.0], [-np.inf, 2.0])])
def test_non_finite_against_finite_fails(got, want):
    c = Comparison()
    c.add(np.array(got), np.array(want), "float64", "g", nan_ok=np.ones(2, bool))
    assert c.worst == np.inf


def test_forward_nan_follows_broadcasting():
    """A NaN gradient is allowed at the elements that reach a NaN forward result: for a broadcast
    input, every element whose row or column holds one."""
    spec = parse_spec(declaration("log(x) * b", inputs=("x", "b")), "t.yaml")
    graphs = build_graphs(spec)
    x = np.array([[1.0, -1.0, 2.0], [3.0, 4.0, 5.0]])
    b = np.array([[0.5], [2.0]])
    bound = bind(spec, {"x": x, "b": b}, None, "t", [("dy", np.ones_like(x), "y")])
    allowed = forward_nan(spec, graphs, bound)
    np.testing.assert_array_equal(allowed["x"], x < 0)
    np.testing.assert_array_equal(allowed["b"], [[True], [False]])


@pytest.fixture(scope="module")
def nan_gradient(tmp_path_factory):
    """tanh(x / 0) is finite (±1) for every x but 0; its derived gradient is NaN everywhere."""
    text = declaration("tanh(x / 0)", inputs=[("x", F64)], name="nan_gradient")
    return make_op(write_op(tmp_path_factory.mktemp("nan"), text))


def test_nan_gradient_fails_validation(nan_gradient):
    report = validate_op(nan_gradient)
    failed = {c.what: c.detail for c in report.checks if not c.passed}
    assert not report.ok and report.summary().startswith("FAIL")
    assert "where the forward result is finite" in failed["backward float64"]
    assert "nan" in failed["gradcheck float64"]
    assert [c.passed for c in report.checks if c.what == "forward float64"] == [True]


def test_nan_in_a_hand_written_backward_where_the_forward_is_finite_is_refused(tmp_path):
    text = declaration("tanh(x / 0)", inputs=[("x", F64)], name="nan_declared")
    text += "backward:\n  x: dy * (1 - y * y) / 0\n"
    with pytest.raises(SpecError, match=r"op\.yaml:\d+:\d+: backward\.x: the gradient is NaN where "
                                        r"the forward result is finite"):
        make_op(write_op(tmp_path, text))


def test_the_summary_says_which_criterion_passed_and_ulps_only_where_they_mean_something():
    from opkit.validate.check import _check
    from opkit.validate.report import Check, Report
    near_zero = Comparison()   # below float32's absolute floor (1e-4): millions of its tiny ulps
    near_zero.add(np.array([3e-8, -2e-9], np.float32), np.array([1e-30, 0.0]), "float32", "y")
    assert near_zero.max_ulp is None and 0 < near_zero.worst < 1
    ordinary = Comparison()    # two float64 ulps off at 1.5; a value near zero has no say
    ordinary.add(np.array([1.5 + 2 * 2.0 ** -52, 1e-20]), np.array([1.5, 1e-30]), "float64", "y")
    assert ordinary.max_ulp == 2
    report = Report("t", [_check("forward float32", 2, near_zero), _check("forward float64", 2, ordinary),
                          _check("backward float64", 2, Comparison()),
                          Check("gradcheck float64", 3, 0.01, 1e-9, None, True)])
    summary = report.summary()
    assert summary == (f"pass (f32 fwd {near_zero.worst:.2g} of tol; f64 fwd 2 ulp, bwd exact; "
                       "grad rel err 1.0e-09)"), summary
