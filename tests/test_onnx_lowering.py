"""ONNX lowering of every primitive against the NumPy reference, run by onnxruntime. Nothing
compiles here: the reference is the same graph evaluated in float64 (opkit/validate)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opkit  # noqa: E402
from opkit.dsl import PRIMITIVES, build_graphs  # noqa: E402
from opkit.onnx import ExportError, export  # noqa: E402
from opkit.onnx.lowering import missing  # noqa: E402
from opkit.runtime import Op  # noqa: E402
from opkit.runtime.bind import bind, split_args  # noqa: E402
from opkit.spec import parse_spec  # noqa: E402
from opkit.validate.reference import evaluate, shaped  # noqa: E402

from conftest import declaration  # noqa: E402

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-6, -1e-6, 1e-3, -0.7, 0.5,
           1.5, 2.5, -2.5, 3.0, 88.0, -88.0, 700.0, -700.0, 1e30, -1e30]


def run(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def reference(op, arrays, attrs=None, layout=None, backward=False, dy=None):
    """The graph in float64 by NumPy (attrs as given), shaped as the operator's results."""
    spec = op.spec
    given = split_args(spec, spec.input_names, tuple(arrays), dict(attrs or {}), "t")
    bound = bind(spec, given, layout, "t")
    graphs = op.graphs_of(op.variants[0])
    if not backward:
        out = evaluate(graphs.forward, bound.values, bound.attrs)
        return [shaped(out[o.name], *bound.outputs[o.name][:2]) for o in spec.outputs]
    extra = [(f"d{o.name}", d, o.name) for o, d in zip(spec.outputs, dy)]
    bound = bind(spec, {**given, **{n: d for n, d, _ in extra}}, layout, "t", extra)
    out = evaluate(graphs.backward, bound.values, bound.attrs)
    return [shaped(out[n], bound.values[n][1], bound.values[n][0].shape)
            for n in graphs.differentiable]


def make(forward, inputs=("x",), attrs=None):
    spec = parse_spec(declaration(forward, inputs=inputs, attrs=attrs), "t.yaml")
    return Op(spec, build_graphs(spec))


# every primitive, as an expression that reaches it (a condition through where)
CASES = {
    "add": ("a + b", 2), "sub": ("a - b", 2), "mul": ("a * b", 2), "div": ("a / b", 2),
    "neg": ("-a", 1), "pow": ("pow(a, b)", 2),
    "gt": ("where(a > b, 1.0, 0.0)", 2), "ge": ("where(a >= b, 1.0, 0.0)", 2),
    "lt": ("where(a < b, 1.0, 0.0)", 2), "le": ("where(a <= b, 1.0, 0.0)", 2),
    "eq": ("where(a == b, 1.0, 0.0)", 2), "ne": ("where(a != b, 1.0, 0.0)", 2),
    "and": ("where((a > 0) & (b > 0), a, b)", 2), "or": ("where((a > 0) | (b > 0), a, b)", 2),
    "not": ("where(~(a > b), a, b)", 2), "where": ("where(a > 0.5, a, b)", 2),
    "min": ("min(a, b)", 2), "max": ("max(a, b)", 2), "clamp": ("clamp(a, b, c)", 3),
    "abs": ("abs(a)", 1), "exp": ("exp(a)", 1), "expm1": ("expm1(a)", 1),
    "log1p": ("log1p(a)", 1), "log": ("log(a)", 1), "sqrt": ("sqrt(a)", 1),
    "sigmoid": ("sigmoid(a)", 1), "tanh": ("tanh(a)", 1), "erf": ("erf(a)", 1),
    "erfc": ("erfc(a)", 1), "floor": ("floor(a)", 1), "ceil": ("ceil(a)", 1),
    "round": ("round(a)", 1), "sign": ("sign(a)", 1), "sin": ("sin(a)", 1), "cos": ("cos(a)", 1),
    "softplus": ("softplus(a)", 1), "isnan": ("where(isnan(a), 1.0, a)", 1),
    "isinf": ("where(isinf(a), 1.0, a)", 1),
}
# onnxruntime's float64 kernels are libm's or close to it: a few ulps
RTOL64 = {"sin": 1e-13, "cos": 1e-13, "sigmoid": 4e-15, "tanh": 1e-14}
# onnxruntime has no float64 Erf: erf and erfc compute in float32 (absolute errors of its eps)
ATOL = {("float64", "erf"): 1.2e-7, ("float64", "erfc"): 1.2e-7, ("float32", "erfc"): 1.2e-7}


def test_every_primitive_has_a_lowering():
    assert missing() == []
    assert set(CASES) == set(PRIMITIVES), "add a case for each new primitive"


def _arguments(arity: int, rng):
    grid = np.array(SPECIAL + list(rng.standard_normal(20) * 3))
    if arity == 1:
        return [grid]
    a, b = np.meshgrid(grid, grid, indexing="ij")
    args = [a.ravel(), b.ravel()]
    if arity == 3:
        args.append(b.ravel() + np.abs(rng.standard_normal(b.size)))
    return args


@pytest.mark.parametrize("prim", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_elementwise_primitives_mean_what_numpy_means(prim, dtype):
    text, arity = CASES[prim]
    op = make(text, inputs=("a", "b", "c")[:arity])
    args = [a.astype(dtype) for a in _arguments(arity, np.random.default_rng(0))]
    model = export(op, None, args)
    got, = run(model, {n: a for n, a in zip("abc", args)})
    with np.errstate(all="ignore"):
        want, = reference(op, [a.astype(np.float64) for a in args])
        want = want.astype(dtype)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    rtol = RTOL64.get(prim, 4e-16) if dtype == "float64" else 4e-7
    atol = ATOL.get((dtype, prim), 1e-300 if dtype == "float64" else 1e-37)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


def test_expm1_and_log1p_stay_exact_near_zero():
    """e ** x - 1 and log(1 + x) would lose every digit at 1e-10: Kahan's forms keep them."""
    op = make("expm1(x) * 1e10 + log1p(x) * 1e10")
    x = np.array([1e-10, -1e-10, 3e-9, 1e-20], np.float32)
    got, = run(export(op, None, [x]), {"x": x})
    np.testing.assert_allclose(got, (np.expm1(x.astype(np.float64)) + np.log1p(x)) * 1e10,
                               rtol=1e-6)


def _bundled(name):
    return opkit.get(name)


LIBRARY_CASES = {  # operators whose graphs reach each library primitive
    "einsum": ("conditional_leaky_relu", [(2, 3, 4, 5), (2, 6), (6, 3), (3,)]),
    "fourier": ("freq_leaky_relu", [(2, 3, 8, 6)]),
    "sum": ("fused_bias_leaky_relu", [(2, 3, 4, 5), (3,)]),       # d bias
    "sum_to": ("spatial_leaky_relu", [(2, 3, 4, 5), (1, 1, 4, 5)]),  # d alpha_map
    # stride 2 and padding 1 on a 7 x 6 image: the transposed convolution's rows no window reached
    "conv2d": ("conv2d_bias_leaky_relu", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)],
               {"stride": 2, "padding": 1}),
    "conv2d_dx": ("conv2d_bias_leaky_relu", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)],
                  {"stride": 2, "padding": 1}),
    "conv2d_dw": ("conv2d_bias_leaky_relu", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)],
                  {"stride": 2, "padding": 1}),
    "mean": ("conv2d_bn_train_leaky_relu", [(2, 3, 5, 4), (4, 3, 3, 3), (4,), (4,)],
             {"padding": 1}),
    "share": ("conv2d_bn_train_leaky_relu", [(2, 3, 5, 4), (4, 3, 3, 3), (4,), (4,)],
              {"padding": 1}),
}


# onnxruntime's CPU provider has no float64 Conv or ConvTranspose: the operators with a
# convolution are run in float32, against the float64 reference of the float32 inputs
FLOAT32 = {"conv2d", "conv2d_dx", "conv2d_dw", "mean", "share"}


@pytest.mark.parametrize("prim", sorted(LIBRARY_CASES))
def test_library_primitives_forward_and_backward(prim):
    name, shapes, *given = LIBRARY_CASES[prim]
    given = given[0] if given else {}
    op = _bundled(name)
    rng = np.random.default_rng(1)
    dtype = np.float32 if prim in FLOAT32 else np.float64
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    for backward in (False, True):
        graphs = op.graphs_of(op.variants[0])
        used = {n.op for n in (graphs.backward if backward else graphs.forward).nodes()}
        if prim not in used:
            continue
        ys = reference(op, args, given)
        dys = [rng.standard_normal(y.shape).astype(dtype) for y in ys]
        model = export(op, None, args, given, backward=backward)
        feed = {i.name: a for i, a in zip(op.spec.inputs, args)}
        feed.update({f"d{o.name}": d for o, d in zip(op.spec.outputs, dys)} if backward else {})
        got = run(model, feed)
        # ONNX float attributes are 32-bit: the reference takes the attrs the model holds
        attrs = {a.name: float(np.float32(a.default)) for a in op.spec.attrs
                 if a.type == "float" and a.default is not None}
        attrs.update(given)
        want = reference(op, args, attrs, backward=backward, dy=dys)
        tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, **tol)
        break
    else:
        pytest.fail(f"{name} does not use {prim}")


def test_each_resampling_along_a_free_dim_against_the_reference():
    """Up by 4 along a free H, down by 2 twice, and the backward (their adjoints): ONNX's DFT
    form at several sizes, even, odd and a single row, against the NumPy reference. An odd
    number of transforms, and sin between them: neither a transform that came out mirrored
    nor one scaled by the ratio of the lengths could cancel out."""
    op = make("fft_down(fft_down(sin(fft_up(x, H, 4)), H, 2), H, 2)",
              inputs=[("x", "{dtypes: [float64], layouts: [NCHW]}")])
    forward = export(op, None, [("N", "C", "H", "W")], dtype="float64")
    backward = export(op, None, [("N", "C", "H", "W")], dtype="float64", backward=True)
    assert "DFT" in {n.op_type for n in forward.functions[0].node}
    rng = np.random.default_rng(3)
    for size in ((1, 2, 6, 3), (2, 1, 7, 4), (1, 1, 1, 2)):
        x, dy = rng.standard_normal(size), rng.standard_normal(size)
        got, = run(forward, {"x": x})
        np.testing.assert_allclose(got, reference(op, [x])[0], rtol=1e-11, atol=1e-11)
        got, = run(backward, {"x": x, "dy": dy})
        want, = reference(op, [x], backward=True, dy=[dy])
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_free_dims_and_the_function_attributes():
    """A batch dim given by name is free at run time; the model's node sets the function's
    attributes, and the function carries the declaration's defaults."""
    op = _bundled("fused_bias_leaky_relu")
    model = export(op, None, [("batch", 3, 4, 5), (3,)], {"alpha": 0.25}, layout="NCHW")
    fn = model.functions[0]
    assert (fn.domain, fn.name) == ("opkit", "fused_bias_leaky_relu")
    assert {n.domain for n in fn.node} == {""}, "the body uses standard operators only"
    defaults = {a.name: onnx.helper.get_attribute_value(a) for a in fn.attribute_proto}
    assert defaults["alpha"] == pytest.approx(0.2) and defaults["clamp"] == np.inf
    node = model.graph.node[0]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["alpha"] == \
        pytest.approx(0.25)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 4, 5]
    rng = np.random.default_rng(2)
    for n in (1, 7):
        x, b = rng.standard_normal((n, 3, 4, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        got, = run(model, {"x": x, "bias": b})
        want, = reference(op, [x.astype(np.float64), b.astype(np.float64)],
                          {"alpha": float(np.float32(0.25))})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # the same function called with other attributes
    del node.attribute[:]
    node.attribute.extend([onnx.helper.make_attribute("alpha", 0.5),
                           onnx.helper.make_attribute("clamp", 0.1)])
    got, = run(model, {"x": x, "bias": b})
    want, = reference(op, [x.astype(np.float64), b.astype(np.float64)], {"alpha": 0.5, "clamp": 0.1})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_str_attr_and_an_optional_input_pick_the_exported_variant():
    op = make("(x * 2 if mode == 'double' else x * 3) + (lo if is_given(lo) else 0)",
              inputs=("x", ("lo", "{dtypes: [float32, float64], optional: true}")),
              attrs={"mode": "{type: str, choices: [double, triple], default: double}"})
    x = np.array([1.0, -2.0], np.float32)
    y, = run(export(op, None, [x, None], {"mode": "triple"}), {"x": x})
    np.testing.assert_array_equal(y, x * 3)
    model = export(op, None, [x, x])
    assert [i.name for i in model.graph.input] == ["x", "lo"]
    y, = run(model, {"x": x, "lo": x})
    np.testing.assert_array_equal(y, x * 3)


@pytest.mark.parametrize("call, error, message", [
    (lambda: export(opkit.get("leaky_relu"), None, [np.zeros(3, np.int8)]), ExportError,
     "covers float calls"),
    (lambda: export(opkit.get("leaky_relu"), None, opset=12), ExportError, "opset must be between"),
    (lambda: export(opkit.get("freq_leaky_relu"), None, [("N", 3, "H", 8)], opset=16),
     ExportError, "fft_up along the free dim H needs ONNX's DFT, which opset 16 lacks: pass "
     "opset=17"),
    (lambda: export(make("fft_down(x, H, 2)", inputs=[("x", "{dtypes: [float32], layouts: [NCHW]}")]),
                    None, [(1, 3, 5, 8)]), ExportError, "divisible by 2 along H"),
    # a free H may be odd: downsampling it needs a size
    (lambda: export(make("fft_down(x, H, 2)", inputs=[("x", "{dtypes: [float32], layouts: [NCHW]}")]),
                    None, [(1, 3, "H", 8)]), ExportError,
     "fft_down by 2 along the free dim H needs a length divisible by 2, which a free size does "
     "not promise: give that dim a size divisible by 2"),
    (lambda: export(opkit.get("leaky_relu"), None, {"y": (3,)}), TypeError, "no input named 'y'"),
    (lambda: export(opkit.get("leaky_relu"), None, [(3, 2.5)]), TypeError, "sizes (ints >= 0)"),
    (lambda: export(opkit.get("leaky_relu"), None, [(3,)], {"alpha": 3.0}), ValueError,
     "alpha must be in [0.0, 1.0]"),
])
def test_export_errors_say_what_to_do(call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        call()


def test_a_primitive_without_a_lowering_is_named(monkeypatch):
    """An operator using a primitive that has no ONNX form fails to export, naming it."""
    from opkit.onnx import LOWERINGS
    monkeypatch.delitem(LOWERINGS, "erf")
    with pytest.raises(ExportError, match="the primitive 'erf' has no ONNX lowering"):
        export(make("erf(x) + 1"), None, [np.zeros(3, np.float32)])


def test_a_convolution_fixes_its_stride_and_padding():
    """Conv's strides and pads are attributes of its own: the export fixes stride and padding
    (the function has no attributes for them, the model says what they were)."""
    model = export(_bundled("conv2d_bias_leaky_relu"), None,
                   [(1, 3, 8, 8), (4, 3, 3, 3), (4,)], {"stride": 2, "padding": 1})
    fn = model.functions[0]
    names = set(fn.attribute) | {a.name for a in fn.attribute_proto}
    assert names == {"alpha"}
    conv = next(n for n in fn.node if n.op_type == "Conv")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["strides"] == [2, 2] and attrs["pads"] == [1, 1, 1, 1]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["fixed attrs"] == "stride=2, padding=1"


def test_conv_transpose2d_exports_as_conv_transpose(tmp_path):
    """conv_transpose2d becomes ONNX's ConvTranspose; forward and backward (conv2d and the
    weight correlation) against the float64 reference, in float32 (onnxruntime's CPU provider
    has no float64 ConvTranspose)."""
    from conftest import write_op
    text = """name: conv_transposed_onnx
inputs:
  x: {dtypes: [float32], layouts: [NCHW, NHWC]}
  w: {dtypes: [float32], shape: [C, O, KH, KW]}
attrs:
  s: {type: int, default: 2}
  p: {type: int, default: 1}
outputs:
  y: {}
forward:
  y: conv_transpose2d(x, w, s, p)
"""
    (name,) = opkit.load(write_op(tmp_path, text))
    op = opkit.get(name)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 5, 4), (3, 4, 4, 4))]
    (want,) = reference(op, args)
    dy = rng.standard_normal(want.shape).astype(np.float32)
    (got,) = run(export(op, None, args), {"x": args[0], "w": args[1]})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got = run(export(op, None, args, backward=True), {"x": args[0], "w": args[1], "dy": dy})
    for g, w in zip(got, reference(op, args, backward=True, dy=[dy])):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
