"""Calls that used to give silent wrong results: byte order, alignment, array subclasses, attrs
that do not fit the compute type; and the direct call against the checked call on random input."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opkit
from conftest import checked_calls, examples, write_op


def leaky(x, alpha=0.2):
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x, alpha * x)


def swapped(arr):
    """The same values stored in the other byte order."""
    return arr.astype(arr.dtype.newbyteorder("S"))


def unaligned(arr):
    """The same values at an address that is not a multiple of the item size."""
    buf = np.zeros(arr.nbytes + 1, np.uint8)
    out = buf[1:].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    assert not out.flags.aligned or arr.itemsize == 1
    return out


@pytest.fixture(scope="module")
def lr():
    return opkit.get("leaky_relu")


X = np.array([[1.5, -2.0, 3.0, 0.0], [-0.25, 4.0, -8.0, 0.5]])


# ------------------------------------------------------------------ byte order, alignment


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("view", ["contiguous", "transposed"])
def test_non_native_byte_order_is_computed_right(lr, dtype, view):
    x = swapped(X.astype(dtype))
    assert not x.dtype.isnative
    if view == "transposed":
        x = x.T
    y = lr(x)
    assert y.dtype == np.dtype(dtype) and y.dtype.isnative
    np.testing.assert_array_equal(y, leaky(x).astype(dtype))
    dy = swapped(np.linspace(-1, 1, x.size).reshape(x.shape).astype(dtype))
    dx, = lr.backward(dy, x)
    want = np.where(np.asarray(x, np.float64) > 0, 1.0, 0.2) * np.asarray(dy, np.float64)
    np.testing.assert_array_equal(dx, want.astype(dtype))


@pytest.mark.parametrize("dtype", ["int16", "int32"])
def test_non_native_integers(lr, dtype):
    x = np.array([100, -200, 3, -4096], dtype)
    np.testing.assert_array_equal(lr(swapped(x)), lr(x))
    assert lr(x)[1] == (-200 * 26 + 64) >> 7  # alpha = 26 / 128 in integer kernels


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_non_native_out(lr, dtype):
    x = X.astype(dtype)
    out = swapped(np.full_like(x, 7))
    assert lr(x, out=out) is out
    np.testing.assert_array_equal(out, leaky(x).astype(dtype))
    same = swapped(x.copy())  # in place, through a byte-swapped array
    assert lr(same, out=same) is same
    np.testing.assert_array_equal(same, leaky(x).astype(dtype))


def test_unaligned_inputs_and_outputs(lr):
    x = X.astype(np.float32)
    xu = unaligned(x)
    np.testing.assert_array_equal(lr(xu), leaky(x).astype(np.float32))
    out = unaligned(np.zeros_like(x))
    assert lr(x, out=out) is out
    np.testing.assert_array_equal(out, leaky(x).astype(np.float32))
    dx, = lr.backward(unaligned(np.ones_like(x)), xu)
    np.testing.assert_array_equal(dx, np.where(x > 0, 1, 0.2).astype(np.float32))


# ------------------------------------------------------------------ subclasses


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own warning
def test_matrix_and_memmap_inputs_give_plain_arrays(lr, tmp_path):
    m = np.matrix(X, dtype=np.float32)
    y = lr(m)
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, leaky(X).astype(np.float32))
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=X.shape)
    mm[...] = X
    assert type(lr(mm)) is np.ndarray
    assert lr(mm, out=mm) is mm  # results written through to the file
    mm.flush()
    back = np.fromfile(tmp_path / "x.bin", dtype=np.float32).reshape(X.shape)
    np.testing.assert_array_equal(back, leaky(X).astype(np.float32))


def test_masked_arrays_are_refused(lr):
    ma = np.ma.array(X, mask=X < 0, dtype=np.float32)
    with pytest.raises(TypeError, match=r"x is a masked array.*filled"):
        lr(ma)
    with pytest.raises(TypeError, match=r"dy is a masked array"):
        lr.backward(ma, X.astype(np.float32))


# ------------------------------------------------------------------ attrs and float32

SOFT_CLIP = """name: soft_clip_t
inputs:
  x: {dtypes: [float16, float32, float64]}
attrs:
  limit: {type: float, default: 3.0, range: "(0, inf]"}
outputs:
  y: {like: x}
forward:
  y: limit * tanh(x / limit)
"""

ATTR_PRODUCT = """name: attr_product_t
inputs:
  x: {dtypes: [float16, float32, float64]}
attrs:
  a: {type: float, default: 1.0}
  b: {type: float, default: 1.0}
  c: {type: float, default: 1.0}
outputs:
  y: {like: x}
forward:
  y: x * (a * b / c)
"""


@pytest.fixture(scope="module")
def attr_ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attr_ops")
    write_op(folder, SOFT_CLIP, "soft_clip_t.yaml")
    write_op(folder, ATTR_PRODUCT, "attr_product_t.yaml")
    opkit.load(folder)
    return opkit.get("soft_clip_t"), opkit.get("attr_product_t")


def both_paths(op, *args, **kwargs):
    """The direct call and the checked call (naming the layout skips the direct call)."""
    return [lambda: op(*args, **kwargs), lambda: op(*args, layout="ND", **kwargs)]


@pytest.mark.parametrize("limit, message", [(1e300, r"limit=1e\+300 does not fit float32"),
                                            (1e-300, r"limit=1e-300 rounds to 0 in float32")])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_attrs_that_do_not_fit_float32_are_refused(attr_ops, limit, message, dtype):
    sc, _ = attr_ops
    x = np.array([0.0, 1.0, -2.0], dtype)
    for size in (3, 0):
        for call in both_paths(sc, x[:size], limit=limit):
            with pytest.raises(ValueError, match=message + r".*pass float64 arrays"):
                call()
        out = np.full(size, 5, dtype)
        with pytest.raises(ValueError, match=message):
            sc(x[:size], limit=limit, out=out)
        assert (out == 5).all()  # nothing written
    with pytest.raises(ValueError, match=message):
        sc.backward(np.ones(3, dtype), x, limit=limit)


def test_float64_calls_take_any_limit(attr_ops):
    sc, _ = attr_ops
    x = np.array([0.0, 1.0, -2.0, 1e-200])
    for limit in (1e300, 1e-300):
        want = limit * np.tanh(x / limit)
        assert np.isfinite(want).all()
        for call in both_paths(sc, x, limit=limit):
            np.testing.assert_array_equal(call(), want)


def test_values_computed_from_attrs_alone_are_computed_in_double(attr_ops):
    _, ap = attr_ops
    x = np.array([0.0, 1.0, -2.0], np.float32)
    # 1e30 * 1e30 overflows float32 on the way; in double the factor is 1e30, which fits
    for call in both_paths(ap, x, a=1e30, b=1e30, c=1e30):
        np.testing.assert_array_equal(call(), (x.astype(np.float64) * 1e30).astype(np.float32))
    for call in both_paths(ap, x, a=1e30, b=1e30, c=1.0):
        with pytest.raises(ValueError, match=r"\(\(a \* b\) / c\) .* is 1e\+60 with a=1e\+30, "
                                             r"b=1e\+30, c=1.0, which does not fit float32"):
            call()
    # an attr used only inside such a value may be anything double holds
    for call in both_paths(ap, x, a=1e300, b=1e-300, c=2.0):
        np.testing.assert_array_equal(call(), x * np.float32(0.5))
    # a check that passed is remembered for those attrs only: the refusal comes back after it
    for c in (1e30, 1.0, 1e30, 1.0):
        call = both_paths(ap, x, a=1e30, b=1e30, c=c)[1]
        if c == 1.0:
            with pytest.raises(ValueError, match="which does not fit float32"):
                call()
        else:
            np.testing.assert_array_equal(call(), (x.astype(np.float64) * 1e30).astype(np.float32))


def test_float32_nan_only_where_the_formula_gives_nan(attr_ops):
    sc, _ = attr_ops
    x = np.array([0.0, -0.0, 1e-30, -3.0, 3e38, np.inf, -np.inf], np.float32)
    for limit in (1e-45, 1e-38, 1e-20, 1.0, 1e20, 3e38, np.inf):
        with np.errstate(all="ignore"):  # inf * tanh(x / inf) is inf * 0: NaN in NumPy too
            want = limit * np.tanh(x.astype(np.float64) / limit)
        for call in both_paths(sc, x, limit=limit):
            y = call()
            np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=str(limit))
            close = np.isfinite(want)
            np.testing.assert_allclose(y[close], want[close], rtol=1e-4, atol=1e-4)  # float32 standard


def test_no_warnings_from_a_float16_gradient_sum_past_65504():
    fb = opkit.get("fused_bias_leaky_relu")
    x = np.ones((1, 2, 300, 300), np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, dbias = fb.backward(np.ones_like(x), x, np.zeros(2, np.float16))
    assert np.isinf(dbias).all()  # 90000 * sqrt(2) rounds to inf in float16, as PyTorch's does


# ------------------------------------------------------------------ direct call == checked call

TWO_INPUTS = """name: two_inputs_t
inputs:
  x: {dtypes: [float16, float32, float64]}
  g: {dtypes: [float16, float32, float64]}
attrs:
  k: {type: int, default: 2, range: [-3, 10]}
  flag: {type: bool, default: false}
  s: {type: float, default: null, null_means: 1.5}
outputs:
  y: {like: x}
forward:
  y: where(flag, x * g * s, x + k * g)
schedule:
  inplace: {y: x}
"""


# a str attr: a direct call per variant, picked by the call's value
STR_ATTR = """name: str_attr_t
inputs:
  x: {dtypes: [float16, float32, float64]}
attrs:
  mode: {type: str, choices: [lin, sq], default: lin}
  k: {type: float, default: 2.0, range: [-4, 4]}
outputs:
  y: {like: x}
forward:
  lin: x * k
  sq: x * x * k
  y: sq if mode == "sq" else lin
"""


@pytest.fixture(scope="module")
def fuzz_ops(tmp_path_factory, attr_ops):
    folder = tmp_path_factory.mktemp("fuzz_ops")
    write_op(folder, TWO_INPUTS, "two_inputs_t.yaml")
    write_op(folder, STR_ATTR, "str_attr_t.yaml")
    opkit.load(folder)
    ops = [opkit.get("leaky_relu"), opkit.get("two_inputs_t"), opkit.get("str_attr_t"), *attr_ops]
    for op in ops:
        op.module()  # built once, before hypothesis times anything
    return ops


_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "bool"]
_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-300, 1e300, 1e-45, 3.5e38, np.inf, -np.inf, np.nan,
            np.nan, 255.99, 32767.5 / 128, -32767.5 / 128, 0.2]


def _array(data, shape, dtype, layout):
    values = data.draw(st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.0, 3.0, -1e4, 1e4, np.nan,
                                                 np.inf, -np.inf, 0.25, 100.0]),
                                min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    with np.errstate(all="ignore"):
        arr = np.array(values, dtype=np.float64).reshape(shape)
        if dtype.startswith(("int", "bool")):
            arr = np.nan_to_num(arr, nan=1, posinf=120, neginf=-120)
        arr = np.asarray(arr).astype(dtype)
    if layout == "swapped" and dtype != "bool":
        arr = swapped(arr)
    elif layout == "transposed":
        arr = np.asfortranarray(arr)
    elif layout == "strided" and arr.ndim:
        big = np.zeros(arr.shape[:-1] + (arr.shape[-1] * 2,), arr.dtype)
        big[..., ::2] = arr
        arr = big[..., ::2]
    elif layout == "readonly":
        arr.flags.writeable = False
    elif layout == "unaligned" and arr.size:
        arr = unaligned(arr)
    return arr


def _attr_value(data, attr):
    if attr.type == "str" and data.draw(st.booleans()):
        return data.draw(st.sampled_from([*attr.choices, "bogus", 3, None])), True
    kind = data.draw(st.sampled_from(["default"] * 4 + ["special"] * 4 + ["int", "bool", "str",
                                                                          "np32", "none"]))
    if kind == "default":
        return None, False
    if kind == "special":
        return data.draw(st.sampled_from(_SPECIAL)), True
    if kind == "int":
        return data.draw(st.sampled_from([0, 1, -4, 3, 11, 2 ** 70])), True
    if kind == "bool":
        return data.draw(st.booleans()), True
    if kind == "np32":
        with np.errstate(over="ignore"):
            return np.float32(data.draw(st.sampled_from(_SPECIAL))), True
    if kind == "str":
        return "0.5", True
    return None, True


def _outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = fn()
    except Exception as exc:  # compared by type and message
        return type(exc), str(exc)
    return result


def _same(a, b):
    if isinstance(a, tuple) and a and isinstance(a[0], type):
        return a == b
    if isinstance(b, tuple) and b and isinstance(b[0], type):
        return False
    return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _check_agreement(op, arrays, kwargs, out_kind, positional=None):
    """`positional`: how many inputs are passed by position (default all); the rest go by
    keyword."""
    spec = op.spec
    positional = len(arrays) if positional is None else positional

    def make_out(ins):
        x = ins[0]
        if out_kind == "none":
            return None
        if out_kind == "inplace":
            return ins[0]
        if out_kind == "overlap" and x.ndim and x.size > 1:
            return x[::-1]
        dt = x.dtype if np.dtype(x.dtype).name in spec.dtypes else np.float32
        dt = np.float64 if out_kind == "wrong_dtype" and dt != np.float64 else dt
        shp = x.shape + (1,) if out_kind == "wrong_shape" else x.shape
        out = np.full(shp, 9, dt)
        if out_kind == "readonly":
            out.flags.writeable = False
        return swapped(out) if out_kind == "swapped" else out

    def run(checked):
        ins = [a.copy() if a.flags.writeable else a for a in arrays]
        out = make_out(ins)
        extra = {"layout": spec.layouts[0]} if checked else {}
        extra.update(zip(spec.input_names[positional:], ins[positional:]))
        result = _outcome(lambda: op(*ins[:positional], out=out, **kwargs, **extra)
                          if out is not None else op(*ins[:positional], **kwargs, **extra))
        return result, ins, out

    direct, ins_d, out_d = run(False)
    checked, ins_c, out_c = run(True)
    assert _same(direct, checked), (direct, checked)
    for a, b in zip(ins_d, ins_c):
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if out_d is not None:
        assert np.array_equal(out_d, out_c, equal_nan=out_d.dtype.kind == "f")


_SHAPES = [(), (0,), (1,), (5,), (2, 3), (3, 1, 4)]


@settings(max_examples=examples(500))
@given(data=st.data())
def test_direct_and_checked_calls_agree_on_attrs(fuzz_ops, data):
    """Plain arrays; attrs of every kind: in and out of range, NaN, inf, huge, tiny, wrong types."""
    op = data.draw(st.sampled_from(fuzz_ops))
    shape = data.draw(st.sampled_from(_SHAPES))
    dtype = data.draw(st.sampled_from(op.spec.dtypes))
    arrays = [_array(data, shape, dtype, "contiguous") for _ in op.spec.inputs]
    kwargs = {}
    for a in op.spec.attrs:
        value, give = _attr_value(data, a)
        if give:
            kwargs[a.name] = value
    _check_agreement(op, arrays, kwargs, data.draw(st.sampled_from(["none", "fresh"])))


@settings(max_examples=examples(500))
@given(data=st.data())
def test_direct_and_checked_calls_agree_on_arrays(fuzz_ops, data):
    """Default attrs; arrays of every dtype, byte order, alignment, stride pattern and
    broadcast shape; out= arrays right and wrong; unknown keywords."""
    op = data.draw(st.sampled_from(fuzz_ops))
    shape = data.draw(st.sampled_from(_SHAPES))
    dtype = data.draw(st.sampled_from(_DTYPES[:3] * 3 + _DTYPES[3:]))
    arrays = []
    for i, inp in enumerate(op.spec.inputs):
        s = shape if i == 0 else data.draw(st.sampled_from([shape, shape[1:], (1,) * len(shape)]))
        d = dtype if data.draw(st.booleans()) or i == 0 else data.draw(st.sampled_from(_DTYPES))
        layout = data.draw(st.sampled_from(["contiguous"] * 4 + ["swapped", "transposed",
                                                                 "strided", "readonly",
                                                                 "unaligned"]))
        arrays.append(_array(data, s, d, layout))
    kwargs = {"bogus": 1.0} if data.draw(st.integers(0, 7)) == 0 else {}
    out_kind = data.draw(st.sampled_from(["none"] * 4 + ["fresh"] * 2 + [
        "inplace", "wrong_dtype", "wrong_shape", "readonly", "swapped", "overlap"]))
    positional = data.draw(st.integers(0, len(arrays)))
    _check_agreement(op, arrays, kwargs, out_kind, positional)


def _same_grads(a, b):
    if isinstance(a, tuple) and a and isinstance(a[0], type):  # an error: the same one
        return a == b
    return (type(a) is tuple and type(b) is tuple and len(a) == len(b)
            and all((x is None and y is None) or (x is not None and y is not None and _same(x, y))
                    for x, y in zip(a, b)))


@settings(max_examples=examples(400))
@given(data=st.data())
def test_direct_and_checked_backward_calls_agree(fuzz_ops, data):
    """backward(dy, ...): the direct call (plain same-shape arrays) against the checked call
    (naming the layout), bit for bit: attrs of every kind, arrays of every dtype and stride
    pattern, dy broadcast or of another dtype, gradient clipping, errors by type and message."""
    op = data.draw(st.sampled_from([o for o in fuzz_ops if any(i.differentiable for i in o.spec.inputs)]))
    shape = data.draw(st.sampled_from(_SHAPES))
    dtype = data.draw(st.sampled_from(_DTYPES[:3] * 4 + _DTYPES[3:]))
    plain = data.draw(st.booleans())
    layouts = ["contiguous"] if plain else ["contiguous", "swapped", "transposed", "strided", "unaligned"]
    arrays = [_array(data, shape, dtype, data.draw(st.sampled_from(layouts))) for _ in op.spec.inputs]
    dy_shape = shape if plain else data.draw(st.sampled_from([shape, shape[1:]]))
    dy_dtype = dtype if plain else data.draw(st.sampled_from(_DTYPES[:3]))
    dy = _array(data, dy_shape, dy_dtype, data.draw(st.sampled_from(layouts)))
    kwargs = {}
    for a in op.spec.attrs:
        value, give = _attr_value(data, a)
        if give:
            kwargs[a.name] = value
    if data.draw(st.integers(0, 4)) == 0:
        kwargs["clip"] = data.draw(st.sampled_from([0.5, 2.0, np.inf]))
    positional = data.draw(st.integers(0, len(arrays)))
    out_kind = data.draw(st.sampled_from(["none"] * 3 + ["fresh", "every", "on_dy", "list"]))

    def run(checked):
        d, ins = dy.copy(), [a.copy() for a in arrays]
        out = None
        if out_kind != "none":  # every: an array for a gradient-less input too (an error)
            out = [np.full(a.shape, 7, a.dtype) if i.differentiable or out_kind == "every" else None
                   for i, a in zip(op.spec.inputs, ins)]
            if out_kind == "on_dy" and out[0] is not None and out[0].shape == d.shape \
                    and out[0].dtype == d.dtype:
                out[0] = d  # the gradient overwrites dy
            out = out if out_kind == "list" else tuple(out)
        extra = dict(zip(op.spec.input_names[positional:], ins[positional:]))
        if checked:
            extra["layout"] = op.spec.layouts[0]
        return _outcome(lambda: op.backward(d, *ins[:positional], out=out, **kwargs, **extra))

    direct, checked = run(False), run(True)
    assert _same_grads(direct, checked), (direct, checked)


def test_each_choice_of_a_str_attr_has_its_direct_call(fuzz_ops, monkeypatch):
    """A str attr picks the variant and its direct call, forward and backward; given by
    position it takes the checked path; both give the same bits."""
    op = next(o for o in fuzz_ops if o.name == "str_attr_t")
    x = np.linspace(-3, 3, 101).astype(np.float32)
    dy = np.ones_like(x)
    slow = checked_calls(op, monkeypatch)
    lin, sq = op(x, k=0.5), op(x, mode="sq", k=0.5)
    (dlin,), (dsq,) = op.backward(dy, x, k=0.5), op.backward(dy, x=x, mode="sq", k=0.5)
    assert slow == []
    np.testing.assert_array_equal(lin, x * np.float32(0.5))
    np.testing.assert_array_equal(sq, x * x * np.float32(0.5))
    np.testing.assert_array_equal(dlin, np.full_like(x, 0.5))
    np.testing.assert_allclose(dsq, x, rtol=1e-6)
    assert np.array_equal(op(x, "sq", 0.5), sq) and len(slow) == 1  # by position: checked
    with pytest.raises(ValueError, match="mode must be one of 'lin', 'sq', got 'cube'"):
        op(x, mode="cube")


def test_direct_backward_call_takes_plain_calls_only(lr, monkeypatch):
    """The common backward call skips the checked path; gradients agree with NumPy's
    formula, NaN stays NaN, and clip= (which the direct call leaves to the checked path)
    clamps infinities."""
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1.0, -1.0, 5.0, -5.0], np.float32)
    dy = np.array([1.0, -np.inf, np.inf, 2.0, -3.0, np.nan, 4.0, -6.0, 7.0], np.float32)
    lr.backward(dy, x)  # built and loaded first
    slow_calls = checked_calls(lr, monkeypatch)
    (dx,) = lr.backward(dy, x, alpha=0.3)
    given = np.full_like(x, 7)
    assert lr.backward(dy, x=x, alpha=0.3, out=(given,))[0] is given  # by keyword, into out=
    assert slow_calls == []
    want = np.where(x > 0, dy, np.float32(0.3) * dy)
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(given, want)
    on_dy = dy.copy()
    assert lr.backward(on_dy, x, alpha=0.3, out=(on_dy,))[0] is on_dy  # overlaps dy: checked
    np.testing.assert_array_equal(on_dy, want)
    (clipped,) = lr.backward(dy, x, alpha=0.3, clip=2.0)
    assert len(slow_calls) == 2
    np.testing.assert_array_equal(clipped, np.clip(want, -2.0, 2.0))  # NaN stays NaN


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize("layout", [None, "NHWC"])
def test_in_place_float16_allocates_nothing_the_size_of_the_tensor(lr, layout):
    """The direct and the checked call write in place without a copy of the tensor
    (docs/reliability.md has the 2 GiB measurement)."""
    import tracemalloc
    x = np.random.default_rng(0).standard_normal((1, 64, 64, 1024), np.float32).astype(np.float16)
    want = np.where(x > 0, x, np.float32(0.2) * x.astype(np.float32)).astype(np.float16)
    kwargs = {"layout": layout} if layout else {}
    lr(x[:1, :1, :1, :16].copy(), **kwargs)  # built and loaded first
    tracemalloc.start()
    try:
        assert lr(x, out=x, **kwargs) is x
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 16, peak  # 8 MiB tensor: kilobytes of bookkeeping only
    np.testing.assert_array_equal(x, want)


THREADED = """\
name: trust_threads
inputs:
  x: {dtypes: [float16, float32, float64], layouts: [NCHW, NHWC]}
  b: {dtypes: [float16, float32, float64], shape: [C]}
attrs:
  k: {type: float, default: 0.5}
outputs:
  y: {like: x}
forward:
  y: tanh(x + b) * k
"""


def test_calls_from_many_threads_build_once_and_never_mix(tmp_path, monkeypatch):
    """Eight threads call a new operator at once (its first call builds it: once, the others
    wait), each under a precision setting of its own, through the direct and the checked call,
    with out= and without, forward and backward, while one registers another operator: every
    result is its own call's."""
    import concurrent.futures
    import threading

    from opkit.builder import compile as compile_stage
    builds, real = [], compile_stage._compile
    monkeypatch.setattr(compile_stage, "_compile", lambda name, *a, **k: builds.append(name) or real(name, *a, **k))
    opkit.load(write_op(tmp_path / "ops", THREADED))
    op, lr_op = opkit.ops.trust_threads, opkit.get("leaky_relu")
    start = threading.Barrier(8)

    def work(i):
        rng = np.random.default_rng(i)
        layout = ("NCHW", "NHWC")[i % 2]
        x = rng.standard_normal((2, 3, 5, 4) if layout == "NCHW" else (2, 5, 4, 3))
        b = rng.standard_normal(3)
        bb = b.reshape((1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3))
        mode = ("force_fp16", "must_keep_origin_dtype")[i % 2]
        start.wait()
        if i == 7:  # a declaration registered while the others call
            opkit.load(write_op(tmp_path / "late", THREADED.replace("trust_threads", "trust_threads_late")))
        with opkit.config(precision_mode=mode):
            for _ in range(20):
                y = op(x, b, k=i, layout=layout)
                out = np.empty(x.shape[::-1]).T   # a fused layout conversion into another order
                op(x, b, k=i, layout=layout, out=out, precision_mode="must_keep_origin_dtype")
                dx, db = op.backward(np.ones_like(x), x, b, k=i, layout=layout)
                lr = lr_op(x, alpha=i / 10)
        want = np.tanh(x + bb) * i
        tol = 2e-3 if mode == "force_fp16" else 1e-13
        assert y.dtype == dx.dtype == (np.float16 if mode == "force_fp16" else np.float64)
        np.testing.assert_allclose(y, want, rtol=tol, atol=tol * i)
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13 * i)
        grad = i * (1 - np.tanh(x + bb) ** 2)
        np.testing.assert_allclose(dx, grad, rtol=tol * 10, atol=tol * i)
        np.testing.assert_allclose(db, grad.sum(axis=(0, 2, 3) if layout == "NCHW" else (0, 1, 2)),
                                   rtol=tol * 10, atol=tol * 40 * i)  # (a sum of 40 terms)
        np.testing.assert_allclose(lr, leaky(x, i / 10), rtol=tol)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert "trust_threads" in builds and len(builds) == len(set(builds))  # each built once at most
    assert "trust_threads_late" in opkit.list_ops()
