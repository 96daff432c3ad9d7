"""The expression language: parsing, graph construction, derived gradients, named dims, digests.

Everything here works on specs and graphs and evaluates them with the NumPy reference
(opkit.validate.reference.evaluate, float64); nothing is compiled.
"""
import functools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opkit.dsl import build_graphs, format_expr
from opkit.errors import SpecError
from opkit.runtime.bind import bind
from opkit.spec import parse_spec
from opkit.validate.reference import evaluate, shaped

from conftest import declaration

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------ helpers

decl = declaration  # YAML text of a small operator (conftest.py)


def graphs_of(forward, **kw):
    spec = parse_spec(decl(forward, **kw), "t.yaml")
    return spec, build_graphs(spec)


def expr(text, inputs=("a", "b", "c", "x")):
    """The forward node of `y: text` and the input nodes by name."""
    _, g = graphs_of(text, inputs=inputs)
    return g.forward.outputs[0][1], dict(zip(g.forward.inputs, g.forward.input_nodes))


def exprs(*texts, inputs=("a", "b", "c", "x")):
    """The nodes of several expressions written in one declaration (outputs y0, y1 ...)."""
    forward = {f"y{k}": t for k, t in enumerate(texts)}
    _, g = graphs_of(forward, inputs=inputs, outputs=list(forward))
    return [n for _, n in g.forward.outputs]


def same(*texts, inputs=("a", "b", "c", "x")):
    """The expressions, written in one declaration, are one node object."""
    nodes = exprs(*texts, inputs=inputs)
    return all(n is nodes[0] for n in nodes)


def run_forward(spec, graphs, inputs, attrs=None, layout=None):
    bound = bind(spec, {**inputs, **(attrs or {})}, layout, "test")
    ref = evaluate(graphs.forward, bound.values, bound.attrs)
    out = {}
    for o in spec.outputs:
        names, shape, _ = bound.outputs[o.name]
        out[o.name] = np.array(shaped(ref[o.name], names, shape))
    return out, bound


def run_backward(spec, graphs, inputs, dys, attrs=None, layout=None):
    """Gradients of every differentiable input, each in its input's shape (as check.py binds)."""
    extra = [(f"d{o}", d, o) for o, d in dys.items()]
    bound = bind(spec, {**inputs, **(attrs or {})}, layout, "test", extra)
    ref = evaluate(graphs.backward, bound.values, bound.attrs)
    out = {}
    for name in graphs.differentiable:
        arr, names = bound.values[name]
        out[name] = np.array(shaped(ref[name], names, arr.shape))
    return out


def finite_differences(spec, graphs, inputs, dys, attrs=None, h=1e-6, layout=None):
    """d/d(input element) of sum(dy * forward) by central differences, one element at a time."""
    base, _ = run_forward(spec, graphs, inputs, attrs, layout)
    out = {}
    for name in graphs.differentiable:
        x = inputs[name]
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            moved = {}
            for sign in (1.0, -1.0):
                xs = x.copy()
                xs[i] += sign * h
                moved[sign], _ = run_forward(spec, graphs, {**inputs, name: xs}, attrs, layout)
            # subtract before summing: elements the perturbation does not reach cancel exactly
            fd[i] = sum(np.sum(dys[o] * (moved[1.0][o] - moved[-1.0][o])) for o in dys) / (2 * h)
        out[name] = fd
    return out


def gradient_check(forward, samples, inputs=("x",), attrs=None, attr_values=None, outputs=None,
                   seed=0, rtol=1e-6, atol=1e-9):
    spec, g = graphs_of(forward, inputs=inputs, attrs=attrs, outputs=outputs)
    rng = np.random.default_rng(seed)
    values = samples(rng)
    fwd, bound = run_forward(spec, g, values, attr_values)
    dys = {o: rng.uniform(0.5, 1.5, fwd[o].shape) * rng.choice([-1.0, 1.0], fwd[o].shape)
           for o in fwd}
    analytic = run_backward(spec, g, values, dys, attr_values)
    numeric = finite_differences(spec, g, values, dys, attr_values)
    assert set(analytic) == set(g.differentiable) == set(numeric)
    for name in analytic:
        assert analytic[name].shape == values[name].shape
        assert np.all(np.isfinite(analytic[name]))
        np.testing.assert_allclose(analytic[name], numeric[name], rtol=rtol, atol=atol,
                                   err_msg=f"d{name} of {forward!r}")
    return spec, g


def away_from_zero(rng, shape=(3, 7), low=0.1, high=2.0):
    return rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


def positive(low=0.1, high=3.0, shape=(3, 7)):
    return lambda rng: {"x": rng.uniform(low, high, shape)}


def one(rng):
    return {"x": away_from_zero(rng)}


def two(rng):
    return {"x": away_from_zero(rng), "w": away_from_zero(rng)}


def apart(rng):
    """x and w with |x - w| >= 0.1: away from the ties of min, max and comparisons."""
    x = away_from_zero(rng)
    return {"x": x, "w": x + away_from_zero(rng)}


# ------------------------------------------------------------------------------------ parsing

def test_subtraction_and_division_associate_left():
    n, i = expr("a - b - c")
    assert n.op == "sub" and n.args[1] is i["c"]
    assert n.args[0].op == "sub" and n.args[0].args == (i["a"], i["b"])
    assert same("a - b - c", "(a - b) - c")
    assert expr("a - (b - c)")[0].digest != n.digest

    n, i = expr("a / b * c")
    assert n.op == "mul" and n.args[1] is i["c"]
    assert n.args[0].op == "div" and n.args[0].args == (i["a"], i["b"])
    assert expr("a / (b * c)")[0].op == "div"


def test_multiplication_binds_tighter_than_addition():
    n, i = expr("a + b * c")
    assert n.op == "add" and n.args[0] is i["a"]
    assert n.args[1].op == "mul" and n.args[1].args == (i["b"], i["c"])
    n, i = expr("a * b + c")
    assert n.op == "add" and n.args[0].op == "mul" and n.args[1] is i["c"]


def test_unary_minus():
    n, i = expr("-a * b")
    assert n.op == "mul" and n.args[0].op == "neg" and n.args[0].args == (i["a"],)
    # ** binds tighter than unary minus, as in Python
    n, i = expr("-a ** 4")
    assert n.op == "neg" and n.args[0].op == "pow" and n.args[0].args[0] is i["a"]
    # a negated constant is a constant; -1 * a is a negation; - - a is a
    n, i = expr("-2 * a")
    assert n.op == "mul" and n.args[0].is_const and n.args[0].value == -2.0
    assert same("-1 * a", "-a")
    assert same("-(-a)", "a")


def test_power_with_constant_exponent():
    n, i = expr("a ** 4")
    assert n.op == "pow" and n.args[0] is i["a"]
    assert n.args[1].is_const and n.args[1].value == 4.0
    # x ** 3 and x ** -1 as PyTorch computes them: multiplies, a division
    assert same("a ** 3", "a * a * a") and same("a ** -1", "1 / a")
    n, _ = expr("a ** -1.5")
    assert n.op == "pow" and n.args[1].value == -1.5
    # ** is right-associative: a ** 2 ** 3 is a ** 8
    n, _ = expr("a ** 2 ** 3")
    assert n.op == "pow" and n.args[1].value == 8.0
    n, i = expr("(a ** 2) ** 4")
    assert n.op == "pow" and n.args[0].op == "mul" and n.args[1].value == 4.0


def test_square_becomes_a_multiply():
    n, i = expr("x ** 2")
    assert n.op == "mul" and n.args == (i["x"], i["x"])
    assert same("x ** 2", "x * x")
    n, i = expr("(a + b) ** 2")
    assert n.op == "mul" and n.args[0] is n.args[1] and n.args[0].op == "add"


@pytest.mark.parametrize("text", ["a ** b", "2 ** a", "pow(a, b)"])
def test_power_takes_tensor_exponents(text):
    n, i = expr(text)
    assert n.op == "pow" and not n.args[1].is_const
    assert same(text.replace("pow(a, b)", "a ** b"), text)


def test_power_exponent_must_be_a_number():
    with pytest.raises(SpecError, match="the exponent of \\*\\* must be a number"):
        expr("a ** (x > 0)")


def test_chained_comparison_is_an_and_of_comparisons():
    n, i = expr("where(0 < x < 1, x, a)")
    c = n.args[0]
    assert c.op == "and" and c.kind == "bool"
    left, right = c.args
    assert left.op == "lt" and left.args[0].value == 0.0 and left.args[1] is i["x"]
    assert right.op == "lt" and right.args == (i["x"], right.args[1]) and right.args[1].value == 1.0
    assert same("where(0 < x < 1, x, a)", "where((0 < x) & (x < 1), x, a)",
                "where(0 < x and x < 1, x, a)")
    # three links: ((a < b) & (b < c)) & (c < x)
    n3, i3 = expr("where(a < b < c < x, x, a)")
    c3 = n3.args[0]
    assert c3.op == "and" and c3.args[0].op == "and" and c3.args[1].op == "lt"
    assert c3.args[1].args == (i3["c"], i3["x"])
    assert c3.args[0].args[1].args == (i3["b"], i3["c"])


def test_conditional_expression_is_where():
    n, i = expr("a if x > 0 else b")
    assert n.op == "where" and n.args[1:] == (i["a"], i["b"])
    assert n.args[0].op == "gt" and n.args[0].args[0] is i["x"]
    assert same("a if x > 0 else b", "where(x > 0, a, b)")
    # nested: a if c1 else (b if c2 else c)
    n2, i2 = expr("a if x > 0 else b if x < -1 else c")
    assert n2.op == "where" and n2.args[1] is i2["a"]
    assert n2.args[2].op == "where" and n2.args[2].args[1:] == (i2["b"], i2["c"])


def test_bitwise_and_boolean_operators():
    n, _ = expr("where((x > 0) & (a > 0), x, a)")
    assert n.args[0].op == "and"
    n, _ = expr("where((x > 0) | (a > 0), x, a)")
    assert n.args[0].op == "or"
    n, _ = expr("where(~(x > 0), x, a)")
    assert n.args[0].op == "not" and n.args[0].args[0].op == "gt"
    assert same("where(x > 0 or a > 0, x, a)", "where((x > 0) | (a > 0), x, a)")
    assert same("where(not x > 0, x, a)", "where(~(x > 0), x, a)")
    # `and` binds tighter than `or`
    c = expr("where(x > 0 or a > 0 and b > 0, x, a)")[0].args[0]
    assert c.op == "or" and c.args[1].op == "and"


@pytest.mark.parametrize("text", [
    "where(x > 0 & x < 1, x, a)",   # & binds tighter than > (Python): 0 & x is not a condition
    "where(x, a, b)",               # a number is not a condition
    "(x > 0) + 1",                  # a condition is not a number
    "~x",
    "x if a else b",
])
def test_kinds_are_checked(text):
    with pytest.raises(SpecError):
        expr(text)


def test_constants_pi_e_inf():
    n, i = expr("pi * x")
    assert n.op == "mul" and n.args[0].is_const and n.args[0].value == math.pi
    n, _ = expr("e * x")
    assert n.args[0].value == math.e
    n, _ = expr("min(x, inf)")
    assert n.op == "min" and n.args[1].value == math.inf
    n, _ = expr("max(x, -inf)")
    assert n.op == "max" and n.args[1].value == -math.inf


def test_constant_folding():
    n, i = expr("sqrt(4.0) * x")
    assert n.op == "mul" and n.args[0].is_const and n.args[0].value == 2.0 and n.args[1] is i["x"]
    assert same("sqrt(4.0) * x", "2 * x", "(1 + 1) * x")
    n, _ = expr("(exp(0) + 2 * pi) * x")
    assert n.args[0].is_const and n.args[0].value == pytest.approx(1 + 2 * math.pi, rel=1e-15)
    # exact identities disappear
    assert same("x * 1 + 0", "x")
    assert same("x / 1 - 0", "x")
    assert same("where(x > 0, a, a)", "a")
    assert same("where(1 > 0, a, b)", "a")


def test_hash_consing_shares_equal_subexpressions():
    n, i = expr("exp(x * a) + exp(x * a)")
    assert n.op == "add" and n.args[0] is n.args[1]
    spec, g = graphs_of({"t": "sigmoid(x) * 3", "y": "sigmoid(x) * 3 + t"})
    y = g.forward.outputs[0][1]
    assert y.op == "add" and y.args[0] is y.args[1]
    # two lines of one declaration that compute the same thing give one node
    n1, n2 = exprs("tanh(a) - b * 2", "tanh(a) - b * 2")
    assert n1 is n2
    # ... while different expressions do not
    n1, n2 = exprs("tanh(a) - b * 2", "tanh(a) - b * 3")
    assert n1 is not n2 and n1.args[0] is n2.args[0]


def test_clamp_is_a_primitive_with_the_value_of_min_of_max():
    # its own primitive: PyTorch gives x the whole gradient at the bounds, where min and max
    # would split it
    n, i = expr("clamp(x, a, b)")
    assert n.op == "clamp" and n.args == (i["x"], i["a"], i["b"])
    assert not same("clamp(x, a, b)", "min(max(x, a), b)")


def test_format_shows_shared_subexpressions_once():
    _, g = graphs_of({"t": "x * 2", "u": "exp(t)", "y": "u + t"})
    assert g.forward.format() == "t0 = x * 2\ny = exp(t0) + t0"


# Round trip: the text a graph formats to (shown in `opkit show`, in generated headers and in the
# "derived gradient is ..." error) parses back to the same node.
ROUND_TRIP = [
    "a - (b - c)", "a / (b * c)", "(a + b) * c", "-(a + b)", "a * -b", "where(x > 0, a, b)",
    "where(~(x > 0), a, -a)", "min(max(x, a), b)", "exp(-x) / (1 + exp(-x))",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_format_round_trips(text):
    n, _ = expr(text)
    assert same(text, format_expr(n))


@pytest.mark.parametrize("text", ["where((x > 0) & (a < 1), x, a)", "where((x > 0) | ~(a < 1), x, a)",
                                  "where((x > 0) & (a < 1) | (x < -1), x, a)"])
def test_format_round_trips_conditions(text):
    # & and | bind tighter than comparisons in Python: the printed form keeps the parentheses
    assert same(text, format_expr(expr(text)[0]))


def test_format_of_power():
    n, _ = expr("a ** 4")
    assert format_expr(n) == "a ** 4"
    assert format_expr(expr("(a + 1) ** 4")[0]) == "(a + 1) ** 4"
    assert format_expr(expr("a ** 3")[0]) == "a * a * a"
    assert format_expr(expr("a ** 1")[0]) == "a"
    assert format_expr(expr("a ** 0")[0]) == "1"


# ------------------------------------------------------------------------------------ gradients

GRADIENT_CASES = [
    # (id, forward, inputs, sampler)
    ("add", "x + w", ("x", "w"), two),
    ("sub", "x - w", ("x", "w"), two),
    ("mul", "x * w", ("x", "w"), two),
    ("div", "x / w", ("x", "w"), two),
    ("neg", "-x", ("x",), one),
    ("square", "x ** 2", ("x",), one),
    ("cube", "x ** 3", ("x",), one),
    ("pow-half", "x ** 0.5", ("x",), positive()),
    ("pow-negative", "x ** -1.5", ("x",), positive(0.5, 3.0)),
    ("min", "min(x, w)", ("x", "w"), apart),
    ("max", "max(x, w)", ("x", "w"), apart),
    ("clamp-const", "clamp(x, -0.5, 0.7)",
     ("x",), lambda rng: {"x": np.concatenate([rng.uniform(-2, -0.6, 7), rng.uniform(-0.4, 0.6, 7),
                                               rng.uniform(0.8, 2, 7)])}),
    ("clamp-inputs", "clamp(x, w, w + 1)", ("x", "w"),
     lambda rng: {"x": np.array([-1.0, 0.2, 0.5, 1.9, 3.0, -0.3]),
                  "w": np.array([0.0, -0.5, 0.0, 0.5, 1.0, 0.4])}),
    ("where", "where(x > w, x * w, x - w)", ("x", "w"), apart),
    ("exp", "exp(x)", ("x",), one),
    ("expm1", "expm1(x)", ("x",), one),
    ("log", "log(x)", ("x",), positive()),
    ("log1p", "log1p(x)", ("x",), positive(-0.9, 3.0)),
    ("sqrt", "sqrt(x)", ("x",), positive()),
    ("abs", "abs(x)", ("x",), one),
    ("sigmoid", "sigmoid(x)", ("x",), lambda rng: {"x": rng.uniform(-4, 4, (3, 7))}),
    ("tanh", "tanh(x)", ("x",), lambda rng: {"x": rng.uniform(-3, 3, (3, 7))}),
    ("elu", "where(x > 0, x, 1.3 * expm1(x))", ("x",), one),
    ("swish", "x * sigmoid(x)", ("x",), lambda rng: {"x": rng.uniform(-4, 4, (3, 7))}),
    ("log1p-expm1", "where(x > 0, log1p(x), expm1(x))", ("x",), one),
    ("softplus", "log1p(exp(x))", ("x",), lambda rng: {"x": rng.uniform(-4, 4, (3, 7))}),
    ("rational", "(x * w - 1) / (x * x + w * w + 1)", ("x", "w"), two),
    ("shared", "exp(x * w) * tanh(x * w) - x / (w * w + 1)", ("x", "w"), two),
    ("abs-min", "abs(min(x, w)) * max(x, w)", ("x", "w"), apart),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=[c[0] for c in GRADIENT_CASES])
def test_derived_gradient_matches_finite_differences(case):
    _, forward, inputs, samples = case
    gradient_check(forward, samples, inputs=inputs)


def test_gradient_of_leaky_relu_with_attr():
    attrs = {"alpha": "{type: float, default: 0.2, range: [0.0, 1.0]}"}
    for alpha in (0.2, 0.01, 0.75):
        gradient_check("where(x > 0, x, alpha * x)", one, attrs=attrs, attr_values={"alpha": alpha})


def test_gradient_of_elu_with_attr():
    attrs = {"alpha": "{type: float, default: 1.0}"}
    gradient_check("where(x > 0, x, alpha * expm1(x))", one, attrs=attrs,
                   attr_values={"alpha": 1.7})


def test_gradient_with_temporaries_and_two_outputs():
    forward = {"s": "sigmoid(x * w)", "u": "s * x - w", "v": "exp(s) + u * u"}
    gradient_check(forward, two, inputs=("x", "w"), outputs=["u", "v"])


def test_gradient_of_leaky_relu_at_zero_is_alpha_dy():
    spec, g = graphs_of("where(x > 0, x, alpha * x)",
                        attrs={"alpha": "{type: float, default: 0.2}"})
    x = np.array([0.0, -0.0, 1e-300, -1e-300])
    dy = np.array([1.0, 2.0, 3.0, 4.0])
    grads = run_backward(spec, g, {"x": x}, {"y": dy}, {"alpha": 0.25})
    np.testing.assert_array_equal(grads["x"], [0.25, 0.5, 3.0, 1.0])


def test_gradient_of_abs_at_zero_is_zero():
    spec, g = graphs_of("abs(x)")
    grads = run_backward(spec, g, {"x": np.array([0.0, -2.0, 3.0])}, {"y": np.array([5.0, 5.0, 5.0])})
    np.testing.assert_array_equal(grads["x"], [0.0, -5.0, 5.0])


# ------------------------------------------------------------------------------------ broadcasting

@pytest.mark.parametrize("x_shape, b_shape, axes", [
    ((4, 5), (1, 5), (0,)),
    ((4, 5), (4, 1), (1,)),
    ((3, 4, 5), (5,), (0, 1)),
    ((3, 4, 5), (4, 1), (0, 2)),
    ((2, 3), (), None),
])
def test_gradient_of_broadcast_input_is_summed_to_its_shape(x_shape, b_shape, axes):
    spec, g = graphs_of("x * b + exp(b)", inputs=("x", "b"))
    rng = np.random.default_rng(1)
    x, b = rng.standard_normal(x_shape), rng.standard_normal(b_shape)
    dy = rng.standard_normal(x_shape)
    grads = run_backward(spec, g, {"x": x, "b": b}, {"y": dy})
    assert grads["x"].shape == x_shape and grads["b"].shape == b_shape
    np.testing.assert_allclose(grads["x"], dy * b, rtol=1e-14)
    full = dy * (x + np.exp(b))
    expected = full.sum() if axes is None else full.sum(axis=axes).reshape(b_shape)
    np.testing.assert_allclose(grads["b"], expected, rtol=1e-12)
    # and against finite differences
    numeric = finite_differences(spec, g, {"x": x, "b": b}, {"y": dy})
    np.testing.assert_allclose(grads["b"], numeric["b"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("layout, x_shape, axes", [
    ("NCHW", (2, 3, 4, 5), (2, 3)),
    ("NHWC", (2, 4, 5, 3), (1, 2)),
])
def test_gradient_of_per_channel_input_sums_over_the_other_dims(layout, x_shape, axes):
    spec, g = graphs_of("where(x > 0, x, b * x)", inputs=(
        ("x", "{dtypes: [float32, float64], layouts: [NCHW, NHWC]}"),
        ("b", "{dtypes: [float32, float64], shape: [N, C]}")))
    rng = np.random.default_rng(2)
    x, b = away_from_zero(rng, x_shape), rng.uniform(0, 1, (2, 3))
    dy = rng.standard_normal(x_shape)
    grads = run_backward(spec, g, {"x": x, "b": b}, {"y": dy}, layout=layout)
    assert grads["b"].shape == (2, 3)
    expected = np.where(x > 0, 0.0, dy * x).sum(axis=axes)
    np.testing.assert_allclose(grads["b"], expected, rtol=1e-12)
    bb = b.reshape(2, 3, 1, 1) if layout == "NCHW" else b.reshape(2, 1, 1, 3)
    np.testing.assert_allclose(grads["x"], np.where(x > 0, dy, dy * bb), rtol=1e-14)


@pytest.mark.parametrize("text", ["where(x > 0, log(c), 0)", "where(x > s, log(c), 0)",
                                  "clamp(x, pi / z, s + 1 / c)", "clamp(x - z, log(c), s)"])
def test_a_broadcast_branch_not_taken_sends_no_infinite_slope(text):
    """A branch of a per-channel (c) or positionally broadcast (s) value, not taken anywhere in
    a channel: its infinite slope (log at 0, pi / z at 0) never reaches the gradient, not even
    as a sum of zeros times inf (the flow is applied per element, then summed)."""
    spec, g = graphs_of(text, inputs=(
        ("x", "{dtypes: [float64], layouts: [NCHW, NHWC]}"),
        ("z", "{dtypes: [float64], layouts: [NCHW, NHWC]}"),
        ("c", "{dtypes: [float64], shape: [C]}"), ("s", "{dtypes: [float64]}")))
    x = np.array([-1.0, -2.0, -0.5, -3.0]).reshape(1, 2, 2, 1)   # NHWC, C = 1
    z = np.array([0.0, 0.0, 1.0, 2.0]).reshape(1, 2, 2, 1)
    c, s = np.array([0.0]), np.array(2.0)
    dy = np.array([1.0, -2.0, 0.5, 3.0]).reshape(1, 2, 2, 1)
    with np.errstate(all="ignore"):
        y, _ = run_forward(spec, g, {"x": x, "z": z, "c": c, "s": s}, layout="NHWC")
        grads = run_backward(spec, g, {"x": x, "z": z, "c": c, "s": s}, {"y": dy}, layout="NHWC")
    torch = pytest.importorskip("torch")
    t = {k: torch.tensor(v, requires_grad=True) for k, v in (("x", x), ("z", z), ("c", c), ("s", s))}
    # PyTorch's value; its gradients with the branch not taken cut off by hand (PyTorch's
    # own give 0 * inf = nan there)
    ref = {"where(x > 0, log(c), 0)": lambda: torch.where(t["x"] > 0, torch.log(t["c"]), 0.0),
           "where(x > s, log(c), 0)": lambda: torch.where(t["x"] > t["s"], torch.log(t["c"]), 0.0),
           "clamp(x, pi / z, s + 1 / c)": lambda: torch.clamp(t["x"], math.pi / t["z"], t["s"] + 1 / t["c"]),
           "clamp(x - z, log(c), s)": lambda: torch.clamp(t["x"] - t["z"], torch.log(t["c"]), t["s"])}[text]()
    np.testing.assert_array_equal(y["y"], ref.detach().numpy())
    for name, grad in grads.items():
        assert np.isfinite(grad).all(), (name, grad)
    np.testing.assert_array_equal(grads["c"], [0.0])   # no branch of c is taken anywhere


# ------------------------------------------------------------------------------------ simplification

def test_leaky_relu_backward_simplifies():
    path = REPO / "operators" / "leaky_relu.yaml"
    spec = parse_spec(path.read_text(), str(path))
    g = build_graphs(spec)
    assert not g.declared
    assert g.differentiable == ("x",)
    assert g.forward.format() == "y = where(x > 0, x, alpha * x)"
    assert g.backward.format() == "dx = sum_to(where(x > 0, dy, dy * alpha), x)"
    assert g.backward is g.derived


def test_expm1_gradient_is_exp_unless_expm1_is_read_anyway():
    # elu's backward computes e ** x (cheaper than expm1(x) + 1); celu's min compares
    # expm1(x / w), so its backward reuses that value rather than calling both
    _, g = graphs_of("where(x > 0, x, 1.3 * expm1(x))", inputs=("x",))
    text = g.backward.format()
    assert "exp(x)" in text and "expm1" not in text, text
    _, g = graphs_of("max(0, x) + min(0, 1.3 * expm1(x / 1.3))", inputs=("x",))
    text = g.backward.format()
    assert "expm1" in text and "exp(" not in text.replace("expm1(", ""), text


def test_unused_inputs_get_zero_gradients():
    spec, g = graphs_of("where(z > 0, x * 2, x)", inputs=("x", "w", "z"))
    text = g.backward.format()
    assert "dw = sum_to(0, w)" in text.splitlines()
    assert "dz = sum_to(0, z)" in text.splitlines()
    rng = np.random.default_rng(3)
    x, w, z = rng.standard_normal((3, 4)), rng.standard_normal((4,)), away_from_zero(rng, (3, 4))
    dy = rng.standard_normal((3, 4))
    grads = run_backward(spec, g, {"x": x, "w": w, "z": z}, {"y": dy})
    np.testing.assert_array_equal(grads["w"], np.zeros(4))
    np.testing.assert_array_equal(grads["z"], np.zeros((3, 4)))
    np.testing.assert_array_equal(grads["x"], np.where(z > 0, 2 * dy, dy))


def test_forward_rewrites_keep_nan_and_inf_semantics():
    spec, g = graphs_of("x * where(x > 0, 1, 0)")
    out, _ = run_forward(spec, g, {"x": np.array([np.nan, -np.inf, np.inf, 2.0, -2.0])})
    # NaN * 0 and -inf * 0 are NaN
    np.testing.assert_array_equal(out["y"], [np.nan, np.nan, np.inf, 2.0, -0.0])


def test_non_differentiable_input_gets_no_gradient():
    spec, g = graphs_of("where(m > 0, x, -x)", inputs=(
        "x", ("m", "{dtypes: [float32, float64], differentiable: false}")))
    assert g.differentiable == ("x",)
    assert [n for n, _ in g.backward.outputs] == ["x"]


# ------------------------------------------------------------------------------------ min / max

def _minmax(op, x, y, dy=None):
    spec, g = graphs_of(f"{op}(x, w)", inputs=("x", "w"))
    x, y = np.array(x, dtype=np.float64), np.array(y, dtype=np.float64)
    out, _ = run_forward(spec, g, {"x": x, "w": y})
    grads = None
    if dy is not None:
        grads = run_backward(spec, g, {"x": x, "w": y}, {"y": np.array(dy, dtype=np.float64)})
    return out["y"], grads


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_ties_select_the_first_argument(op):
    y, _ = _minmax(op, [0.0, -0.0, 2.0], [-0.0, 0.0, 2.0])
    np.testing.assert_array_equal(np.signbit(y), [False, True, False])


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_nan_propagates(op):
    nan = np.nan
    y, _ = _minmax(op, [nan, 1.0, nan, -np.inf], [1.0, nan, nan, np.inf])
    assert np.isnan(y[:3]).all()
    assert y[3] == (-np.inf if op == "min" else np.inf)


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_gradient_splits_ties_and_gives_nan_to_both(op):
    # PyTorch's minimum/maximum: half each on a tie; both take it where the pair is unordered
    x = [1.5, -2.0, np.nan, 1.0, 3.0, 0.0]
    w = [1.5, -2.0, 0.0, 3.0, 1.0, np.nan]
    dy = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    _, grads = _minmax(op, x, w, dy)
    picked = [0.5, 0.5, 1.0, float(op == "min"), float(op == "max"), 1.0]
    other = [0.5, 0.5, 1.0, float(op == "max"), float(op == "min"), 1.0]
    np.testing.assert_array_equal(grads["x"], np.multiply(picked, dy))
    np.testing.assert_array_equal(grads["w"], np.multiply(other, dy))


def test_clamp_propagates_nan_and_maps_infinities():
    spec, g = graphs_of("clamp(x, -1, 2)")
    out, _ = run_forward(spec, g, {"x": np.array([np.nan, np.inf, -np.inf, 0.5])})
    np.testing.assert_array_equal(out["y"], [np.nan, 2.0, -1.0, 0.5])


# ------------------------------------------------------------------------------------ named dims

def test_named_and_positional_inputs_need_a_layout():
    with pytest.raises(SpecError, match=r"dims \['N', 'K'\].*any rank") as info:
        graphs_of("a * p", inputs=(("a", "{dtypes: [float32], shape: [N, K]}"), "p"))
    assert isinstance(info.value, ValueError)
    assert info.value.loc is not None and info.value.loc.line == 8  # the forward line
    # also when the meeting happens through a temporary
    with pytest.raises(SpecError, match="any rank"):
        graphs_of({"s": "exp(a)", "y": "s + p"},
                  inputs=(("a", "{dtypes: [float32], shape: [N, K]}"), "p"))


def test_named_inputs_alone_or_with_constants_are_fine():
    _, g = graphs_of("a * b + 2", inputs=(("a", "{dtypes: [float32], shape: [N, K]}"),
                                           ("b", "{dtypes: [float32], shape: [K]}")))
    assert g.forward.outputs[0][1].dims == ("N", "K")


def test_named_and_positional_inputs_with_a_layout_are_accepted():
    spec, g = graphs_of("a * p + x", inputs=(
        ("a", "{dtypes: [float32, float64], shape: [N, C]}"), "p",
        ("x", "{dtypes: [float32, float64], layouts: [NCHW, NHWC]}")))
    assert spec.layouts == ("NCHW", "NHWC")
    y = g.forward.outputs[0][1]
    assert y.op == "add" and y.dims is None
    rng = np.random.default_rng(4)
    a, p, x = rng.standard_normal((2, 3)), rng.standard_normal((5,)), rng.standard_normal((2, 3, 4, 5))
    out, _ = run_forward(spec, g, {"a": a, "p": p, "x": x}, layout="NCHW")
    np.testing.assert_allclose(out["y"], a[:, :, None, None] * p + x, rtol=1e-14)


# ------------------------------------------------------------------------------------ digests

def test_digest_is_stable_across_declarations():
    text = "where(x > 0, x, alpha * expm1(x)) + clamp(x, -1, 1) * 0.25"
    attrs = {"alpha": "{type: float, default: 1.0}"}
    _, g1 = graphs_of(text, attrs=attrs, name="first")
    _, g2 = graphs_of(text, attrs=attrs, name="second")
    n1, n2 = g1.forward.outputs[0][1], g2.forward.outputs[0][1]
    assert len(n1.digest) == 64 and int(n1.digest, 16) >= 0
    assert n1.digest == n2.digest
    assert g1.forward.digest == g2.forward.digest


def test_digest_is_stable_across_processes():
    text = decl("where(x > 0, x, 0.2 * x) + sigmoid(x) ** 3")
    code = ("import sys; from opkit.spec import parse_spec; from opkit.dsl import build_graphs; "
            "g = build_graphs(parse_spec(sys.stdin.read(), 'other.yaml')); "
            "print(g.forward.outputs[0][1].digest)")
    res = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True,
                         check=True, cwd=str(REPO))
    _, g = graphs_of("where(x > 0, x, 0.2 * x) + sigmoid(x) ** 3")
    assert res.stdout.strip() == g.forward.outputs[0][1].digest


def test_digest_changes_with_constants_and_structure():
    base = expr("where(x > 0, x, 0.2 * x)")[0].digest
    assert expr("where(x > 0, x, 0.3 * x)")[0].digest != base
    assert expr("where(x > 0, x, 0.2 * a)")[0].digest != base
    assert expr("where(x >= 0, x, 0.2 * x)")[0].digest != base
    assert expr("where(x > 0, 0.2 * x, x)")[0].digest != base
    assert expr("where(x > 0, x, 0.2 * x)")[0].digest == base


# ------------------------------------------------------------------------------------ long expressions

def test_a_sum_and_a_product_of_a_thousand_terms():
    rng = np.random.default_rng(5)
    x, dy = rng.uniform(0.99, 1.01, 7), rng.uniform(-1, 1, 7)
    for op, fold, slope in ((" + ", np.add, lambda x: np.full_like(x, 1000.0)),
                            (" * ", np.multiply, lambda x: 1000 * x ** 999)):
        spec, g = graphs_of(op.join(["x"] * 1000))
        assert spec.canonical()["forward"][0][0] == "y"  # the cache key's text of it: no recursion
        out, _ = run_forward(spec, g, {"x": x})
        np.testing.assert_array_equal(out["y"], functools.reduce(fold, [x] * 1000))
        grads = run_backward(spec, g, {"x": x}, {"y": dy})
        np.testing.assert_allclose(grads["x"], dy * slope(x), rtol=1e-12)


@pytest.mark.parametrize("text", [" + ".join(["x"] * 10_000), " * ".join(["x"] * 5_000),
                                  " + ".join(["max(x, 1)"] * 2_000)])
def test_an_expression_past_the_operator_limit_is_a_located_error(text):
    with pytest.raises(SpecError, match=r"^t\.yaml:7:\d+: forward\.y: the expression has more than "
                                        r"1000 operators \(the limit for one expression\); compute "
                                        r"parts of it on earlier lines") as info:
        graphs_of(text)
    excerpt, caret = str(info.value).splitlines()[-2:]
    assert len(excerpt) < 120 and caret.strip() == "^"
    assert excerpt[len(caret) - 1] in "+*"  # the caret is under the operator past the limit


def test_deep_nesting_is_a_located_error():
    with pytest.raises(SpecError, match=r"t\.yaml:7:\d+: forward\.y: syntax error: too many nested "
                                        r"parentheses"):
        graphs_of("max(" * 300 + "x" + ", 1)" * 300)


@pytest.mark.slow
def test_ten_thousand_lines_of_selects():
    """A chain through 10,000 temporaries: parse, derive, print, hash and evaluate without
    recursion, against a forward-mode derivative computed by a NumPy loop."""
    n = 10_000
    forward = {}
    for k in range(n):
        prev = f"t{k - 1}" if k else "x"
        if k % 3 == 0:
            forward[f"t{k}"] = f"where({prev} > 0, {prev} * 1.0002, {prev} * 0.9997)"
        elif k % 3 == 1:
            forward[f"t{k}"] = f"max({prev}, -1.5)"
        else:
            forward[f"t{k}"] = f"min({prev}, 1.6)"
    forward["y"] = f"t{n - 1} * 2"
    spec, g = graphs_of(forward)
    printed = len(g.forward.format()) + len(g.derived.format())
    assert printed > 30 * n and len(g.forward.digest) == len(g.derived.digest) == 64
    x = np.array([-2.0, -1.4, -0.3, 0.0, 0.2, 1.1, 1.7])
    t, d = x.copy(), np.ones_like(x)
    for k in range(n):
        if k % 3 == 0:
            d = d * np.where(t > 0, 1.0002, 0.9997)
            t = np.where(t > 0, t * 1.0002, t * 0.9997)
        elif k % 3 == 1:
            d, t = np.where(t >= -1.5, d, 0.0), np.maximum(t, -1.5)
        else:
            d, t = np.where(t <= 1.6, d, 0.0), np.minimum(t, 1.6)
    out, _ = run_forward(spec, g, {"x": x})
    np.testing.assert_array_equal(out["y"], t * 2)
    dy = np.linspace(-1, 1, x.size)
    np.testing.assert_allclose(run_backward(spec, g, {"x": x}, {"y": dy})["x"], dy * d * 2,
                               rtol=1e-12)
