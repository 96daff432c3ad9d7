"""The DSL's breadth: the catalogue functions, str attrs with choices, optional inputs, dtype
limits, PyTorch's conventions at ties and kinks. Derived graphs are evaluated with the NumPy
reference (nothing compiles here); torch.autograd, where installed, is the other reference."""
import math

import numpy as np
import pytest

from opkit.dsl import build_graphs
from opkit.dsl.variants import MAX_VARIANTS, variants
from opkit.errors import SpecError
from opkit.runtime.bind import bind
from opkit.spec import parse_spec
from opkit.validate.reference import evaluate

from conftest import declaration

X = np.array([-1e4, -1000.0, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.5, 3.0, 1000.0, 1e4])


def graphs(forward, inputs=("x",), attrs=None, variant=0):
    spec = parse_spec(declaration(forward, inputs=inputs, attrs=attrs), "t.yaml")
    return spec, build_graphs(spec, variants(spec)[variant])


def run(spec, g, arrays, attrs=None, dy=None):
    """Forward (and, with dy, backward) of the graphs in float64."""
    given = {**arrays, **(attrs or {})}
    bound = bind(spec, given, None, "t")
    y = evaluate(g.forward, bound.values, bound.attrs)["y"][0]
    if dy is None:
        return y
    extra = [("dy", np.broadcast_to(dy, y.shape), "y")]
    bbound = bind(spec, given, None, "t", extra)
    grads = evaluate(g.backward, bbound.values, bbound.attrs)
    return y, {n: v[0] for n, v in grads.items()}


# ------------------------------------------------------------------ functions: NumPy meanings

@pytest.mark.parametrize("text, numpy", [
    ("erf(x)", lambda x: np.array([math.erf(v) for v in x])),
    ("erfc(x)", lambda x: np.array([math.erfc(v) for v in x])),
    ("floor(x)", np.floor), ("ceil(x)", np.ceil), ("round(x)", np.round),
    ("sign(x)", np.sign), ("sin(x)", np.sin), ("cos(x)", np.cos),
    ("softplus(x)", lambda x: np.logaddexp(0, x)),
    ("where(isnan(x) | isinf(x), 7, x)", lambda x: np.where(np.isnan(x) | np.isinf(x), 7, x)),
    ("minimum(x, 0.5) + maximum(x, -0.5)", lambda x: np.minimum(x, 0.5) + np.maximum(x, -0.5)),
    ("pow(abs(x) + 1, 0.5)", lambda x: np.power(np.abs(x) + 1, 0.5)),
])
def test_functions_mean_what_numpy_means(text, numpy):
    x = np.concatenate([X, [np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, 1.5]])
    spec, g = graphs(text)
    with np.errstate(all="ignore"):  # (SciPy's erf and the math module's differ by an ulp)
        np.testing.assert_allclose(run(spec, g, {"x": x}), numpy(x), rtol=4e-16, atol=0)


def test_sign_of_minus_zero_is_plus_zero_and_of_nan_is_nan():
    spec, g = graphs("sign(x)")
    y = run(spec, g, {"x": np.array([-0.0, np.nan])})
    assert y[0] == 0 and not np.signbit(y[0]) and np.isnan(y[1])


def test_round_takes_ties_to_even():
    spec, g = graphs("round(x)")
    np.testing.assert_array_equal(run(spec, g, {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5])}),
                                  [0.0, 2.0, 2.0, -0.0, -2.0])


@pytest.mark.parametrize("step", ["floor", "ceil", "round", "sign"])
def test_a_step_functions_gradient_reaches_nothing_upstream(step):
    """Gradient 0, not 0 times the slope upstream: exp(x) at inf, 1 / x at 0 (0 * inf = NaN)."""
    spec, g = graphs(f"{step}(exp(x)) + {step}(1 / x) * x")
    x = np.array([np.inf, 800.0, 0.0, -0.0, 1.0, -2.5])
    with np.errstate(all="ignore"):
        _, grads = run(spec, g, {"x": x}, dy=np.ones_like(x))
        want = getattr(np, "rint" if step == "round" else step)(1 / x)
    np.testing.assert_array_equal(grads["x"], want)   # d/dx of step(1/x) * x: step(1/x) alone


def test_softplus_does_not_overflow():
    spec, g = graphs("softplus(x)")
    y, grads = run(spec, g, {"x": np.array([-1e4, -1000.0, 0.0, 1000.0, 1e4])}, dy=1.0)
    np.testing.assert_array_equal(y, [0.0, 0.0, math.log(2), 1000.0, 1e4])
    np.testing.assert_array_equal(grads["x"], [0.0, 0.0, 0.5, 1.0, 1.0])


@pytest.mark.parametrize("text, slope", [
    ("erf(x)", lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)),
    ("erfc(x)", lambda x: -2 / math.sqrt(math.pi) * np.exp(-x * x)),
    ("sin(x)", np.cos), ("cos(x)", lambda x: -np.sin(x)),
    ("softplus(x)", lambda x: 1 / (1 + np.exp(-x))),
    ("floor(x) + ceil(x) + round(x) + sign(x)", lambda x: 0 * x),
])
def test_derivatives(text, slope):
    x = np.array([-3.0, -1.2, -0.3, 0.4, 1.1, 2.7])
    spec, g = graphs(text)
    _, grads = run(spec, g, {"x": x}, dy=1.5)
    np.testing.assert_allclose(grads["x"], 1.5 * slope(x), rtol=1e-13, atol=1e-300)


def test_pow_gradients_follow_pytorch_at_zero():
    spec, g = graphs("pow(x, w)", inputs=("x", "w"))
    x = np.array([0.0, 0.0, 2.0, 0.0, 3.0])
    w = np.array([0.0, 2.0, 0.5, 0.5, 0.0])
    _, grads = run(spec, g, {"x": x, "w": w}, dy=1.0)
    # no gradient to the base where the exponent is 0, none to the exponent at base 0, e >= 0
    np.testing.assert_array_equal(grads["x"], [0.0, 0.0, 0.5 * 2 ** -0.5, np.inf, 0.0])
    np.testing.assert_array_equal(grads["w"], [0.0, 0.0, math.sqrt(2) * math.log(2), 0.0,
                                               math.log(3)])


# ------------------------------------------------------------------ PyTorch's ties and kinks

TIES = {
    "maximum": ("maximum(x, w)", lambda t, x, w: t.maximum(x, w)),
    "minimum": ("minimum(x, w)", lambda t, x, w: t.minimum(x, w)),
    "clamp": ("clamp(x, w, w + 1)", lambda t, x, w: t.clamp(x, w, w + 1)),
    "abs": ("abs(x) * w", lambda t, x, w: t.abs(x) * w),
    "relu": ("where(x > 0, x, 0) * w", lambda t, x, w: t.relu(x) * w),
    "celu": ("max(0, x) + min(0, w * expm1(x / w))",
             lambda t, x, w: t.maximum(t.zeros_like(x), x) + t.minimum(t.zeros_like(x),
                                                                      w * t.expm1(x / w))),
}
XT = np.array([-2.0, -1.0, 0.0, 0.0, 1.0, 1.0, 2.0, np.nan])
WT = np.array([-1.0, -1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("name", sorted(TIES))
def test_ties_and_kinks_match_torch_autograd(name):
    torch = pytest.importorskip("torch")
    text, fn = TIES[name]
    spec, g = graphs(text, inputs=("x", "w"))
    with np.errstate(all="ignore"):
        y, grads = run(spec, g, {"x": XT, "w": WT}, dy=1.0)
    tx = torch.tensor(XT, requires_grad=True)
    tw = torch.tensor(WT, requires_grad=True)
    ty = fn(torch, tx, tw)
    ty.backward(torch.ones_like(ty))
    # (torch.relu passes NaN on, where where(x > 0, x, 0) picks 0: the formula's own meaning)
    keep = ~np.isnan(XT) if name == "relu" else np.ones(len(XT), bool)
    same = dict(rtol=1e-15, atol=0)  # exact but for an ulp of expm1
    np.testing.assert_allclose(y[keep], ty.detach().numpy()[keep], **same)
    np.testing.assert_allclose(grads["x"][keep], tx.grad.numpy()[keep], **same)
    if name in ("maximum", "minimum", "clamp"):
        np.testing.assert_allclose(grads["w"], tw.grad.numpy(), **same)


KNOWN = [  # (expression, x, gradient to x) at the kinks, PyTorch's values
    ("max(0, x)", [0.0, 1.0, -1.0], [0.5, 1.0, 0.0]),
    ("where(x > 0, x, 0)", [0.0, 1.0, -1.0], [0.0, 1.0, 0.0]),           # relu'(0) = 0
    ("clamp(x, -1, 1)", [-1.0, 1.0, 1.5, -1.5], [1.0, 1.0, 0.0, 0.0]),  # bounds included
    ("abs(x)", [0.0, -2.0, 2.0], [0.0, -1.0, 1.0]),
    ("max(0, x) + min(0, expm1(x))", [0.0], [1.0]),                     # CELU's slope at 0
]


@pytest.mark.parametrize("text, x, want", KNOWN, ids=[k[0] for k in KNOWN])
def test_kink_gradients_are_pytorchs(text, x, want):
    spec, g = graphs(text)
    _, grads = run(spec, g, {"x": np.array(x)}, dy=1.0)
    np.testing.assert_array_equal(grads["x"], want)


# ------------------------------------------------------------------ str attrs with choices

GELU = {"exact": "0.5 * x * (1 + erf(x / sqrt(2)))",
        "approx": "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))",
        "y": 'approx if approximate == "tanh" else exact'}
APPROXIMATE = {"approximate": "{type: str, choices: [none, tanh], default: none}"}


def test_a_str_attr_makes_a_variant_per_choice_folded_at_compile_time():
    spec, g0 = graphs(GELU, attrs=APPROXIMATE)
    _, g1 = graphs(GELU, attrs=APPROXIMATE, variant=1)
    assert [v.choices for v in variants(spec)] == [(("approximate", "none"),),
                                                  (("approximate", "tanh"),)]
    ops0 = {n.op for n in g0.forward.nodes()}
    ops1 = {n.op for n in g1.forward.nodes()}
    assert "erf" in ops0 and "tanh" not in ops0 and "tanh" in ops1 and "erf" not in ops1
    assert "approximate" not in g0.forward.attrs  # no string reaches a kernel
    x = np.linspace(-4, 4, 17)
    exact = 0.5 * x * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    np.testing.assert_allclose(run(spec, g0, {"x": x}, {"approximate": "none"}), exact, rtol=1e-15)


@pytest.mark.parametrize("text, message", [
    ('x if approximate == "fast" else x', r"'fast' is not a choice of approximate \('none', 'tanh'\)"),
    ("x * approximate", "approximate is a str attr: compare it with one of its choices"),
    ('x if x == "tanh" else x', "a string can only be compared with a str attr"),
    ('x * "a"', "a string such as 'a' can only be compared with a str attr"),
    ('x if approximate < "tanh" else x', "a string can only be compared once, with == or !="),
])
def test_str_attr_mistakes_are_located(text, message):
    with pytest.raises(SpecError, match=message) as info:
        graphs(text, attrs=APPROXIMATE)
    assert info.value.loc is not None and info.value.loc.line > 1


@pytest.mark.parametrize("attr, message", [
    ("{type: str, default: none}", "a str attr needs `choices"),
    ("{type: str, choices: [none, tanh], default: fast}", "expected one of the choices 'none', 'tanh'"),
    ("{type: str, choices: [none, none]}", "'none' is listed twice"),
    ("{type: str, choices: [1, 2]}", "1 is not allowed; a choice is a name"),
    ("{type: str, choices: [a], range: [0, 1]}", "a str attr takes no range"),
    ("{type: float, choices: [a]}", "only str attrs take choices"),
    ("{type: float, default: finfo.huge}", "finfo.huge is not known"),
    ("{type: float, default: finfo.max, quantize: 7}", "a quantized attr needs a number"),
])
def test_declaration_mistakes_of_the_new_attrs(attr, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(declaration("x * 1", attrs={"a": attr}), "t.yaml")


def test_too_many_variants_is_an_error():
    attrs = {f"s{k}": "{type: str, choices: [a, b, c]}" for k in range(3)}
    spec = parse_spec(declaration("x", attrs=attrs), "t.yaml")
    with pytest.raises(SpecError, match=f"27 variants.*at most {MAX_VARIANTS}"):
        variants(spec)


# ------------------------------------------------------------------ optional inputs, finfo

CLIP = {"lo": "min if is_given(min) else finfo.min",
        "hi": "max if is_given(max) else finfo.max", "y": "clamp(x, lo, hi)"}
OPTIONAL = ("x", ("min", "{dtypes: [float32, float64], optional: true}"),
            ("max", "{dtypes: [float32, float64], optional: true}"))


def test_optional_inputs_fold_per_variant_and_take_dtype_limits():
    spec, _ = graphs(CLIP, inputs=OPTIONAL)
    labels = [v.label() for v in variants(spec)]
    assert labels == ["min not given, max not given", "min not given, max given",
                      "min given, max not given", "min given, max given"]
    x = np.array([-1e300, -2.0, 0.5, 3.0, 1e300])
    for k, v in enumerate(variants(spec)):
        _, g = graphs(CLIP, inputs=OPTIONAL, variant=k)
        assert g.forward.inputs == ("x",) + v.given
        arrays = {"x": x, **{n: np.array(b) for n, b in (("min", -1.0), ("max", 2.0)) if n in v.given}}
        lo = -1.0 if "min" in v.given else np.finfo(np.float64).min
        hi = 2.0 if "max" in v.given else np.finfo(np.float64).max
        np.testing.assert_array_equal(run(spec, g, arrays), np.clip(x, lo, hi))
    # float32 calls take float32's limits
    _, g = graphs(CLIP, inputs=OPTIONAL)
    y = run(spec, g, {"x": np.array([-np.inf, np.inf], np.float32)})
    np.testing.assert_array_equal(y, [np.finfo(np.float32).min, np.finfo(np.float32).max])


@pytest.mark.parametrize("forward, message", [
    ("x + min", "the optional input 'min' is used where a call may not give it"),
    ("x + (min if is_given(x) else 0)", r"is_given\(x\): x is an input that is not optional"),
    ("x + (1 if is_given(y) else 0)", r"is_given\(y\): y is not an optional input"),
])
def test_optional_input_mistakes(forward, message):
    with pytest.raises(SpecError, match=message):
        graphs(forward, inputs=OPTIONAL[:2])


@pytest.mark.parametrize("inputs, message", [
    ((("x", "{dtypes: [float32], optional: true}"),), "the first input cannot be optional"),
    (("x", ("m", "{dtypes: [float32], optional: true}"), "w"), "comes after the optional input 'm'"),
])
def test_optional_input_order(inputs, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(declaration("x", inputs=inputs), "t.yaml")


def test_finfo_is_a_dtype_limit_everywhere():
    spec, g = graphs("min(x, finfo.max) + finfo.eps * 0")
    for dtype in (np.float32, np.float64):
        bound = bind(spec, {"x": np.zeros(1, dtype)}, None, "t")
        assert bound.attrs["finfo.max"] == float(np.finfo(dtype).max)
    with pytest.raises(SpecError, match="finfo.largest is not known"):
        graphs("x + finfo.largest")


# ------------------------------------------------------------------ hints

@pytest.mark.parametrize("attr", ["{type: float, default: 0.5, range: [0, 1)}",
                                  "{type: float, default: 0.5, range: (0, 1]}",
                                  "{type: float, default: 0.5, range: (0, inf)}"])
def test_an_unquoted_open_interval_is_explained(attr):
    with pytest.raises(SpecError, match=r"an interval with an open end must be quoted, as in "
                                        r"range: \"[\[(]0, (1|inf)[\])]\""):
        parse_spec(declaration("x * a", attrs={"a": attr}), "t.yaml")


def test_a_quoted_interval_needs_no_hint():
    spec = parse_spec(declaration("x * a", attrs={"a": '{type: float, default: 0.5, range: "(0, 1]"}'}),
                      "t.yaml")
    assert str(spec.attr("a").range) == "(0.0, 1.0]"


# ------------------------------------------------------------------ the reference page

def test_the_function_table_of_the_spec_page_is_the_generated_one(repo):
    """docs/spec.md lists the functions from the primitive records: one place says each."""
    from opkit.codegen.function_table import section
    page = (repo / "docs" / "spec.md").read_text()
    assert section() in page, "run `python -m opkit.codegen.function_table` and paste the table"


def test_every_function_the_parser_knows_is_documented(repo):
    from opkit.dsl.parse import _FUNCTIONS
    page = (repo / "docs" / "spec.md").read_text()
    for name in _FUNCTIONS:
        assert f"`{name}(" in page or f"`{name}`" in page, name
