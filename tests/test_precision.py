"""Fixed-point slopes, integer kernels, precision modes and gradient clipping."""
import sys
import textwrap

import numpy as np
import pytest

import opkit
from opkit.registry import make_op
from opkit.spec import parse_spec

from conftest import write_op

cfg = sys.modules["opkit.config"]  # the module (opkit.config is the context manager)


@pytest.fixture(autouse=True)
def default_settings():
    opkit.configure(precision_mode="must_keep_origin_dtype", alpha_quant=False)
    yield
    opkit.configure(precision_mode="must_keep_origin_dtype", alpha_quant=False)


@pytest.fixture(scope="module")
def lr():
    return opkit.get("leaky_relu")


# ------------------------------------------------------------------------------ quantize_alpha

@pytest.mark.parametrize("alpha, bits, want", [
    (0.2, 7, (26, 7, 0.203125)), (0.25, 7, (32, 7, 0.25)), (0.1, 7, (13, 7, 0.1015625)),
    (0.3, 7, (38, 7, 0.296875)), (1.0, 7, (128, 7, 1.0)), (0.0, 7, (0, 7, 0.0)),
    (0.2, 1, (0, 1, 0.0)), (0.75, 1, (2, 1, 1.0)), (0.2, 15, (6554, 15, 6554 / 32768)),
    (0.99, 15, (32440, 15, 32440 / 32768)), (-0.5, 4, (-8, 4, -0.5)),
])
def test_quantize_alpha(alpha, bits, want):
    assert opkit.quantize_alpha(alpha, bits) == want
    m, b, value = want
    assert value == m / 2 ** b and abs(value - alpha) <= 2 ** -(b + 1)


def test_quantize_alpha_default_bits_and_errors():
    assert opkit.quantize_alpha(0.2) == (26, 7, 0.203125)
    for bits in (0, 16, -3):
        with pytest.raises(ValueError, match=rf"bits must be in 1\.\.15, got {bits}"):
            opkit.quantize_alpha(0.2, bits)
    with pytest.raises(TypeError, match="bits must be an integer"):
        opkit.quantize_alpha(0.2, 2.5)
    with pytest.raises(TypeError, match="bits must be an integer"):
        opkit.quantize_alpha(0.2, True)
    with pytest.raises(ValueError, match=r"needs m = 32768, which does not fit a signed 16-bit "
                                         r"multiplier \(\|m\| <= 32767\); use fewer bits"):
        opkit.quantize_alpha(1.0, 15)
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        opkit.quantize_alpha(float("nan"))


SPEC = textwrap.dedent("""\
    name: q
    inputs:
      x: {dtypes: [float32, int8]}
    attrs:
      alpha: ALPHA
    outputs:
      y: {like: x}
    forward:
      y: where(x > 0, x, alpha * x)
    """)


@pytest.mark.parametrize("alpha, message", [
    ("{type: int, default: 1, quantize: 7}", r"q\.yaml:5:\d+: attrs\.alpha\.quantize: only float attrs"),
    ("{type: float, default: 0.2, quantize: 0}", r"q\.yaml:5:\d+: attrs\.alpha\.quantize: expected a "
                                                 r"number of bits in 1\.\.15, got 0"),
    ("{type: float, default: 0.2, quantize: 16}", r"expected a number of bits in 1\.\.15, got 16"),
    ("{type: float, default: 2.0, quantize: 15}", r"q\.yaml:5:\d+: attrs\.alpha\.default: alpha 2\.0 with "
                                                  r"15 bits needs m = 65536"),
    ("{type: float, default: 0.2}", r"q\.yaml:9:\d+: forward: int8 declared, but the float attr alpha is "
                                    r"used in mul; declare it `quantize: 7`"),
])
def test_quantize_declaration_errors(alpha, message):
    with pytest.raises(opkit.SpecError, match=message):
        make_op_text(SPEC.replace("ALPHA", alpha))


def make_op_text(text, tmp=None):
    """An operator as registration makes it: lowering checks what integer kernels can do."""
    spec = parse_spec(text, "q.yaml")
    from opkit.dsl import build_graphs
    from opkit.lower import lower
    from opkit.runtime import Op
    graphs = build_graphs(spec)
    return Op(spec, graphs, lower(spec, graphs))


# ------------------------------------------------------------------------------ integer kernels

def python_leaky(values, m, bits, lo, hi):
    """The pure-Python integer reference: y = x for x > 0, else (x*m + 2**(bits-1)) >> bits."""
    out = []
    for v in values:
        r = v if v > 0 else (v * m + (1 << (bits - 1))) >> bits
        out.append(min(max(r, lo), hi))
    return out


@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.99, 1.0])
def test_integer_leaky_relu_over_the_whole_range(lr, dtype, alpha, isa):
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1, dtype=np.int64).astype(dtype)
    m, bits, _ = opkit.quantize_alpha(alpha, 7)
    want = np.array(python_leaky(x.tolist(), m, bits, info.min, info.max), dtype=dtype)
    with opkit.config(isa=isa):
        y = lr(x, alpha=alpha)                                 # contiguous: the direct call
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, want)
        rev = x[::-1]                                          # negative stride: checked path
        np.testing.assert_array_equal(lr(rev, alpha=alpha), want[::-1])
        grid = x[: (x.size // 64) * 64].reshape(-1, 8, 8)[:, ::2, 1::3]
        np.testing.assert_array_equal(lr(grid, alpha=alpha),
                                      want[: (x.size // 64) * 64].reshape(-1, 8, 8)[:, ::2, 1::3])


def test_int32_edges_and_random(lr):
    info = np.iinfo(np.int32)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.array([info.min, info.min + 1, -129, -128, -65, -64, -63, -1, 0, 1,
                                  info.max], np.int64),
                        rng.integers(info.min, info.max, 50000, endpoint=True)]).astype(np.int32)
    for alpha in (0.2, 0.5, 1.0):
        m, bits, _ = opkit.quantize_alpha(alpha, 7)
        want = np.array(python_leaky(x.tolist(), m, bits, info.min, info.max), dtype=np.int32)
        np.testing.assert_array_equal(lr(x, alpha=alpha), want)
        with opkit.config(num_threads=1):
            np.testing.assert_array_equal(lr(x, alpha=alpha), want)


def test_integer_layouts_out_and_in_place(lr):
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (2, 8, 5, 7)).astype(np.int8)
    m, bits, _ = opkit.quantize_alpha(0.2, 7)
    want = np.array(python_leaky(x.ravel().tolist(), m, bits, -128, 127), np.int8).reshape(x.shape)
    np.testing.assert_array_equal(lr(x, layout="NCHW"), want)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(lr(nhwc, layout="NHWC"), want.transpose(0, 2, 3, 1))
    buf = np.zeros((2, 5, 7, 8), np.int8)
    lr(x, out=buf.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(buf, want.transpose(0, 2, 3, 1))
    y = x.copy()
    assert lr(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    with pytest.raises(TypeError, match=r"out must have dtype int8 \(the result's dtype\), got int16"):
        lr(x, out=np.zeros(x.shape, np.int16))


def test_integer_results_saturate(tmp_path):
    op = make_op(write_op(tmp_path, textwrap.dedent("""\
        name: int_double
        inputs:
          x: {dtypes: [int8, int16, float32]}
        outputs:
          y: {like: x}
        forward:
          y: x + x
        """)))
    x = np.array([-128, -100, -64, -1, 0, 1, 63, 64, 100, 127], np.int8)
    np.testing.assert_array_equal(op(x), [-128, -128, -128, -2, 0, 2, 126, 127, 127, 127])
    x16 = np.array([-32768, -20000, 20000, 32767], np.int16)
    np.testing.assert_array_equal(op(x16), [-32768, -32768, 32767, 32767])


def test_integer_calls_have_no_gradient(lr):
    with pytest.raises(TypeError, match=r"integer calls have no gradient \(x is an integer array\)"):
        lr.backward(np.ones(4, np.float32), np.ones(4, np.int8))
    with pytest.raises(TypeError, match=r"dy must be an array of float16, float32, float64 or bfloat16, "
                                        r"got dtype int8"):
        lr.backward(np.ones(4, np.int8), np.ones(4, np.int8))


def test_integer_listing_and_validation(lr, capsys):
    from opkit.cli import main
    assert main(["show", "leaky_relu"]) == 0
    out = capsys.readouterr().out
    assert "alpha: 7 bits; default 0.2 is m = 26, 26/2**7 = 0.203125 (error +0.00312)" in out
    for line in ("vconv_s82s32 x, x", "vmuls    v2, x, alpha.m", "vadds    v2, v2, #64",
                 "vshrs    v2, v2, #7", "vsel     v3, v1, x, v2", "vconv_s322s8 v3, v3     ; saturate"):
        assert line in out, line
    from opkit.validate import validate_op
    report = validate_op(lr, ["int8", "int16", "int32"])
    assert report.ok and [c.what for c in report.checks] == ["forward int8", "forward int16", "forward int32"]


# ------------------------------------------------------------------------------ precision modes

def f16_leaky(x, alpha=0.2):
    """float16 semantics: the input rounded to float16, computed in float32, rounded once."""
    x = np.asarray(x, np.float16).astype(np.float32)
    return np.where(x > 0, x, np.float32(alpha) * x).astype(np.float16)


def test_modes_change_dtypes_as_documented(lr):
    x32 = np.linspace(-3, 3, 101).astype(np.float32)
    x16, x64 = x32.astype(np.float16), x32.astype(np.float64)
    assert lr(x16).dtype == np.float16 and lr(x32).dtype == np.float32       # must_keep_origin_dtype
    y = lr(x32, precision_mode="force_fp16")
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, f16_leaky(x32))
    assert lr(x64, precision_mode="force_fp16").dtype == np.float16
    y = lr(x16, precision_mode="force_fp32")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.where(x16 > 0, x16.astype(np.float32),
                                              np.float32(0.2) * x16.astype(np.float32)))
    assert lr(x64, precision_mode="force_fp32").dtype == np.float64
    assert lr(x32, precision_mode="force_fp32").dtype == np.float32
    # leaky_relu has float32 kernels: allow_fp32_to_fp16 leaves it; it opts in to mixed precision
    assert lr(x32, precision_mode="allow_fp32_to_fp16").dtype == np.float32
    np.testing.assert_array_equal(lr(x32, precision_mode="allow_mix_precision"), f16_leaky(x32))
    sp = opkit.get("spatial_leaky_relu")                                   # precision_reduce: false
    assert sp(x32, np.float32(0.3), precision_mode="allow_mix_precision").dtype == np.float32
    # integers are never cast
    assert lr(np.arange(-3, 3, dtype=np.int8), precision_mode="force_fp16").dtype == np.int8


def test_allow_fp32_to_fp16_for_an_operator_without_float32(tmp_path):
    op = make_op(write_op(tmp_path, SPEC.replace("x: {dtypes: [float32, int8]}", "x: {dtypes: [float16, float64]}")
                          .replace("ALPHA", "{type: float, default: 0.2}").replace("name: q", "name: half_only")))
    x32 = np.linspace(-2, 2, 9).astype(np.float32)
    with pytest.raises(TypeError, match=r"x must be an array of float16 or float64, got dtype float32"):
        op(x32)
    y = op(x32, precision_mode="allow_fp32_to_fp16")
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, f16_leaky(x32))
    with pytest.raises(TypeError, match=r"precision_mode 'force_fp32' runs x \(float16\) in float32, "
                                        r"which this operator has no kernels for"):
        op(x32.astype(np.float16), precision_mode="force_fp32")


def test_precedence_call_over_context_over_global(lr):
    x = np.linspace(-1, 1, 8).astype(np.float32)
    opkit.configure(precision_mode="force_fp16")
    assert lr(x).dtype == np.float16
    with opkit.config(precision_mode="must_keep_origin_dtype"):
        assert lr(x).dtype == np.float32
        assert lr(x, precision_mode="force_fp16").dtype == np.float16
        with opkit.config(precision_mode="force_fp16"):
            assert lr(x).dtype == np.float16
        assert lr(x).dtype == np.float32
    assert lr(x).dtype == np.float16
    assert lr(x, precision_mode="must_keep_origin_dtype").dtype == np.float32
    assert cfg.current()["precision_mode"] == "force_fp16"


def test_configuration_dict_and_alpha_quant(lr):
    x = np.array([-1.0, -0.5, 2.0])
    np.testing.assert_array_equal(lr(x), [-0.2, -0.1, 2.0])
    opkit.configure({"precision_mode": "force_fp16", "alpha_quant": True})
    y = lr(x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.float16([-0.203125, -0.1015625, 2.0]))
    opkit.configure({"precision_mode": "must_keep_origin_dtype", "alpha_quant": False})
    with opkit.config({"alpha_quant": True}):
        np.testing.assert_array_equal(lr(x), [-0.203125, -0.1015625, 2.0])       # 26 / 128
        dx, = lr.backward(np.ones(3), x)
        np.testing.assert_array_equal(dx, [0.203125, 0.203125, 1.0])
    np.testing.assert_array_equal(lr(x), [-0.2, -0.1, 2.0])


def test_unknown_modes_and_keys_list_the_valid_ones(lr):
    valid = "must_keep_origin_dtype, force_fp16, force_fp32, allow_fp32_to_fp16, allow_mix_precision"
    for call in (lambda: opkit.configure(precision_mode="fast"),
                 lambda: opkit.config(precision_mode="fast").__enter__(),
                 lambda: lr(np.ones(3), precision_mode="fast")):
        with pytest.raises(ValueError, match=f"precision_mode must be one of {valid}; got 'fast'"):
            call()
    with pytest.raises(ValueError, match=r"unknown opkit setting 'alpha_qant' \(did you mean "
                                         r"'alpha_quant'\?\); the settings are: alpha_quant, isa, "
                                         r"num_threads, precision_mode"):
        opkit.configure({"alpha_qant": True})
    with pytest.raises(ValueError, match="alpha_quant must be True or False"):
        opkit.configure(alpha_quant=1)


# ------------------------------------------------------------------------------ clipping

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_clip_leaky_relu_in_the_same_pass(lr, dtype, monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(70001).astype(dtype)
    dy = (rng.standard_normal(70001) * 3).astype(dtype)
    dy[:3] = [np.nan, np.inf, -np.inf]
    full, = lr.backward(dy, x)
    # no separate clipping pass: the kernel clamps as it stores
    monkeypatch.setattr(np, "clip", lambda *a, **k: pytest.fail("a second pass over the gradient"))
    clipped, = lr.backward(dy, x, clip=0.1)
    monkeypatch.undo()
    assert np.isnan(clipped[0]) and clipped[1] == dtype(0.1) and clipped[2] == dtype(-0.1)
    np.testing.assert_array_equal(clipped, np.clip(full, dtype(-0.1), dtype(0.1)))
    assert clipped.dtype == dtype
    # the forward pass is untouched by clipping
    np.testing.assert_array_equal(lr(x), lr(x))


def test_clip_reduced_gradients_after_the_reduction():
    sp = opkit.get("spatial_leaky_relu")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    amap = rng.uniform(0, 1, (6, 1)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx, da = sp.backward(dy, x, amap)
    cdx, cda = sp.backward(dy, x, amap, clip=0.5)
    np.testing.assert_array_equal(cdx, np.clip(dx, -0.5, 0.5))
    np.testing.assert_array_equal(cda, np.clip(da, -0.5, 0.5))   # the sum is clipped, not its terms
    assert np.abs(da).max() > 0.5 and cda.shape == amap.shape
    cond = opkit.get("conditional_leaky_relu")
    X = rng.standard_normal((2, 3, 4, 5))
    args = (X, rng.standard_normal((2, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3))
    grads = cond.backward(np.ones_like(X) * 5, *args)
    for g, c in zip(grads, cond.backward(np.ones_like(X) * 5, *args, clip=0.25)):
        np.testing.assert_array_equal(c, np.clip(g, -0.25, 0.25))


def test_clip_errors(lr):
    x = np.ones(3)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=r"leaky_relu\.backward\(\): clip must be > 0"):
            lr.backward(x, x, clip=bad)
    with pytest.raises(TypeError, match="clip must be a positive number or None, got str"):
        lr.backward(x, x, clip="0.1")
    np.testing.assert_array_equal(lr.backward(x, x, clip=None)[0], np.ones(3))
