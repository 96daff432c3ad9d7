"""Kinks: every non-smooth primitive names the conditions that pick its smooth piece
(Primitive.branch), the forward graph lists them (Graph.kinks), and the finite-difference check
steps around them, so correct operators written with max, min, abs or clamp validate."""
import numpy as np
import pytest

from opkit.dsl import PRIMITIVES, build_graphs
from opkit.registry import make_op
from opkit.runtime.bind import bind
from opkit.spec import parse_spec
from opkit.validate import validate_op
from opkit.validate.reference import evaluate

from conftest import declaration, write_op

NON_SMOOTH = {"where", "min", "max", "abs", "clamp", "floor", "ceil", "round", "sign"}


def test_non_smooth_primitives_declare_their_branches():
    declared = {name for name, p in PRIMITIVES.items() if p.branch is not None}
    assert declared == NON_SMOOTH


def kink_values(forward, x, attrs=None):
    spec = parse_spec(declaration(forward, attrs=attrs), "t.yaml")
    graphs = build_graphs(spec)
    bound = bind(spec, {"x": np.asarray(x, dtype=np.float64)}, None, "t")
    masks = []
    evaluate(graphs.forward, bound.values, bound.attrs, masks=masks)
    return masks


@pytest.mark.parametrize("forward, kink", [
    ("max(0, x)", 0.0),
    ("min(x, 1)", 1.0),
    ("abs(x) * 2", 0.0),
    ("clamp(x, -1, 2)", -1.0),
    ("clamp(x, -1, 2)", 2.0),
    ("x / (1 + abs(x))", 0.0),
    ("max(0, x) + min(0, 0.5 * expm1(x / 0.5))", 0.0),
    ("where(x > 0.5, x, 0)", 0.5),
])
def test_kink_conditions_change_across_the_kink_only(forward, kink):
    h = 1e-7
    below, above = kink_values(forward, [kink - h]), kink_values(forward, [kink + h])
    assert below and len(below) == len(above)
    assert any(not np.array_equal(a, b) for a, b in zip(below, above)), forward
    # on one side of the kink nothing changes
    far, near = kink_values(forward, [kink + 0.3]), kink_values(forward, [kink + h])
    assert all(np.array_equal(a, b) for a, b in zip(far, near)), forward


KINKED = {
    "relu": "max(0, x)",
    "celu": "max(0, x) + min(0, alpha * expm1(x / alpha))",
    "softsign": "x / (1 + abs(x))",
    "hardtanh": "clamp(x, -1, 1)",
    "abs_gap": "abs(x) - min(x, 0.5)",
}


@pytest.fixture(scope="module")
def kinked(tmp_path_factory):
    text = declaration(KINKED, outputs=list(KINKED), name="kinked",
                       attrs={"alpha": "{type: float, default: 1.3, range: \"(0, inf)\"}"})
    return make_op(write_op(tmp_path_factory.mktemp("kinks"), text))


def test_operators_with_kinks_validate(kinked):
    """Validation's inputs include 0: the gradient check must step around the kinks of max, min,
    abs and clamp instead of differencing across them."""
    report = validate_op(kinked)
    assert report.ok, report.format()
    grad = next(c for c in report.checks if c.what == "gradcheck float64")
    assert grad.cases > 0


def test_kinked_gradients_match_numpy(kinked):
    x = np.array([-3.0, -1.0, -0.5, -1e-3, 0.0, 1e-3, 0.25, 0.5, 0.75, 1.0, 3.0])
    dys = tuple(np.full_like(x, k + 1.0) for k in range(len(KINKED)))
    dx, = kinked.backward(dys, x, alpha=1.3)
    # PyTorch's conventions: min and max split a tie (max(0, x) gives x half the gradient at 0,
    # and CELU written with them gets PyTorch's CELU slope, 1, there); clamp keeps its bounds
    half = lambda tie: np.where(tie, 0.5, 0.0)  # noqa: E731
    slopes = [np.where(x > 0, 1.0, 0.0) + half(x == 0),
              np.where(x > 0, 1.0, 0.0) + np.where(x < 0, np.exp(x / 1.3), 0.0) + 2 * half(x == 0),
              1 / (1 + np.abs(x)) ** 2,
              np.where((x >= -1) & (x <= 1), 1.0, 0.0),
              np.sign(x) - np.where(x < 0.5, 1.0, 0.0) - half(x == 0.5)]
    want = sum(dy * s for dy, s in zip(dys, slopes))
    np.testing.assert_allclose(dx, want, rtol=1e-14, atol=1e-15)
