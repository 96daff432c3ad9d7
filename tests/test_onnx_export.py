"""ONNX exports of every bundled and example operator give opkit's results under onnxruntime:
float32 and float16, every layout each declares (NCHW, NHWC, ND), special values included."""
import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opkit  # noqa: E402
import opkit.onnx  # noqa: E402
from opkit.cli import main  # noqa: E402
from opkit.validate.cases import default_attrs, make_cases, smooth  # noqa: E402

from conftest import REPO  # noqa: E402

EXAMPLE_FOLDERS = [p for p in (REPO / "examples" / "user_ops", REPO / "examples" / "activations",
                                 REPO / "examples" / "reductions")
                   if p.is_dir()]


def _names():
    names = [(n, None) for n in sorted(p.stem for p in (REPO / "operators").glob("*.yaml"))]
    for folder in EXAMPLE_FOLDERS:
        names += [(p.stem, folder) for p in sorted(folder.glob("*.yaml"))]
    return names


def _op(name, folder):
    if folder is not None and name not in opkit.list_ops():
        opkit.load(folder)
    return opkit.get(name)


def run(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


TOL = {"float32": dict(rtol=2e-6, atol=2e-6), "float16": dict(rtol=1e-3, atol=1e-3)}


@pytest.mark.parametrize("name, folder", _names(), ids=[n for n, _ in _names()])
def test_export_matches_opkit_under_onnxruntime(name, folder):
    op = _op(name, folder)
    rng = np.random.default_rng(0)
    resamples = any(n.op == "fourier" for n in op.graphs.forward.nodes())
    checked = set()
    for case in _plain_cases(op, rng):
        layout = case.layout
        if resamples:  # a NaN or inf spreads over a whole resampled row, inf as NaN or inf
            case = smooth(case, op.spec, rng)
        for dtype in ("float32", "float16"):
            if dtype not in op.spec.dtypes:
                continue
            arrays = [case.arrays[i.name].astype(dtype) for i in op.spec.inputs]
            _check(op, arrays, {**default_attrs(op.spec), **case.attrs}, layout,
                   f"{case.label} {dtype}")
            checked.add((layout, dtype))
    layouts = {layout for layout in op.spec.layouts}
    assert {layout for layout, _ in checked} == layouts
    assert {dtype for _, dtype in checked} == {"float32", "float16"} & set(op.spec.dtypes)


def _plain_cases(op, rng):
    """The validation cases of contiguous inputs, without the large, empty and 0-d ones."""
    for case in make_cases(op.spec, rng):
        if any(case.views.values()) or case.label.split()[-1] in SKIP:
            continue
        yield case


SKIP = ("threaded", "tile+1", "empty", "0-d", "one", "unit")


def _check(op, arrays, attrs, layout, label):
    """The export of this call run by onnxruntime gives opkit's results."""
    model = op.to_onnx(None, arrays, attrs, layout=layout)
    given = [(i.name, a) for i, a in zip(op.spec.inputs, arrays) if a is not None]
    got = run(model, dict(given))
    want = op(*arrays, layout=layout, **attrs)
    dtype = np.result_type(*[a for _, a in given]).name
    # a convolution sums up to 75 products here, in an order of its own: float32 results differ
    # by a few of their ulps (float16 rounds that away)
    tol = dict(TOL[dtype])
    if dtype == "float32" and any(n.op == "conv2d" for n in op.graphs.forward.nodes()):
        tol = dict(rtol=1e-5, atol=1e-5)
    # a norm divides by a statistic: where a row's values nearly agree, the rounding of its mean
    # moves float32 results by more than a few ulps (onnxruntime's more than opkit's, which
    # sums in float64), within the project's float32 standard
    elif dtype == "float32" and any(a.op == "mean" for n in op.graphs.forward.nodes() for a in n.args):
        tol = dict(rtol=1e-4, atol=1e-4)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and g.shape == w.shape, label
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=label)
        np.testing.assert_allclose(g, w, **tol, err_msg=label)


def _variants():
    return [(n, f) for n, f in _names() if len(_op(n, f).variants) > 1]


@pytest.mark.parametrize("name, folder", _variants(), ids=[n for n, _ in _variants()])
def test_every_variant_exports(name, folder):
    """Each choice of a str attr and each set of optional inputs given exports its own kernel's
    graph; float32 and float16."""
    op = _op(name, folder)
    choices = [[(a.name, c) for c in a.choices] for a in op.spec.attrs if a.type == "str"]
    optional = [i.name for i in op.spec.inputs if i.optional]
    rng = np.random.default_rng(1)
    case = next(_plain_cases(op, rng))
    seen = set()
    for picked in itertools.product(*choices):
        for given in itertools.product((False, True), repeat=len(optional)):
            left_out = {n for n, g in zip(optional, given) if not g}
            for dtype in ("float32", "float16"):
                arrays = [None if i.name in left_out else case.arrays[i.name].astype(dtype)
                          for i in op.spec.inputs]
                _check(op, arrays, {**default_attrs(op.spec), **case.attrs, **dict(picked)}, case.layout,
                       f"{case.label} {dtype} {picked} without {sorted(left_out)}")
            model = opkit.onnx.to_model(op, arrays, dict(picked), layout=case.layout)
            seen.add({p.key: p.value for p in model.metadata_props}["variant"])
    assert len(seen) == len(op.variants)


def test_opkit_export_writes_a_model_onnxruntime_runs(tmp_path, capsys):
    path = tmp_path / "fb.onnx"
    code = main(["export", "fused_bias_leaky_relu", "-o", str(path), "--layout", "NHWC",
                 "--shape", "x=N,4,6,3", "--attr", "alpha=0.1", "--attr", "clamp=0.5"])
    assert code == 0
    assert "opkit.fused_bias_leaky_relu" in capsys.readouterr().out
    model = onnx.load(str(path))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4, 6, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    got, = run(model, {"x": x, "bias": b})
    want = opkit.ops.fused_bias_leaky_relu(x, b, alpha=np.float32(0.1).item(), clamp=0.5,
                                            layout="NHWC")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_opkit_export_failures_are_one_line(tmp_path, capsys):
    assert main(["export", "leaky_relu", "-o", str(tmp_path / "a.onnx"), "--shape", "q=3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opkit export: error: --shape q: leaky_relu has no such input (its inputs: x)"]
    assert main(["export", "freq_leaky_relu", "-o", str(tmp_path / "b.onnx"), "--opset", "16"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opkit export: error: fft_up along the free dim H needs ONNX's DFT, which "
                   "opset 16 lacks: pass opset=17 or newer (opkit export: --opset 17), or give "
                   "that dim a size (--shape x=N,C,64,64)"]
    assert not (tmp_path / "b.onnx").exists()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_convolution_exported_without_shapes_runs_at_any_size(tmp_path, layout):
    """Every dim free (the kernel's too): the outputs' OH and OW are free as well, and one model
    serves images and kernels of any size."""
    path = tmp_path / "conv.onnx"
    assert main(["export", "conv2d_bn_train_leaky_relu", "-o", str(path), "--layout", layout,
                 "--attr", "padding=1"]) == 0
    model = onnx.load(str(path))
    dims = [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == (["N", "O", "OH", "OW"] if layout == "NCHW" else ["N", "OH", "OW", "O"])
    rng = np.random.default_rng(4)
    op = opkit.get("conv2d_bn_train_leaky_relu")
    for n, c, h, w, o, k in ((2, 3, 9, 7, 5, 3), (1, 2, 4, 6, 3, 1)):
        x = rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c)).astype(np.float32)
        args = [x, rng.standard_normal((o, c, k, k)).astype(np.float32),
                rng.standard_normal(o).astype(np.float32), rng.standard_normal(o).astype(np.float32)]
        got = run(model, dict(zip(("x", "w", "gamma", "beta"), args)))
        want = op(*args, padding=1, layout=layout)
        for g, w_ in zip(got, want):
            np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ resampling along free dims

def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _ops(model):
    return {n.op_type for n in model.functions[0].node}


FREE_SIZES = ((2, 3, 8, 6), (1, 2, 7, 5), (3, 1, 1, 9))  # even, odd, a single row (N, C, H, W)


def _image(rng, size, layout, dtype):
    n, c, h, w = size
    return rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c)).astype(dtype)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_resampling_exported_without_shapes_serves_every_size(tmp_path, layout):
    """`opkit export freq_leaky_relu` with no --shape leaves H and W free: ONNX's DFT resamples
    them, and one model, forward or backward, serves even, odd and single-row images."""
    op = opkit.get("freq_leaky_relu")
    models = {}
    for flags in ([], ["--backward"]):
        path = tmp_path / f"f{len(flags)}.onnx"
        assert main(["export", "freq_leaky_relu", "-o", str(path), "--layout", layout] + flags) == 0
        models[bool(flags)] = model = onnx.load(str(path))
        assert "DFT" in _ops(model) and "MatMul" not in _ops(model)
        assert _dims(model.graph.input[0]) == list("NCHW" if layout == "NCHW" else "NHWC")
    rng = np.random.default_rng(5)
    for size in FREE_SIZES:
        x, dy = (_image(rng, size, layout, np.float32) for _ in range(2))
        y, = run(models[False], {"x": x})
        np.testing.assert_allclose(y, op(x, layout=layout), **TOL["float32"], err_msg=str(size))
        dx, = run(models[True], {"x": x, "dy": dy})
        want, = op.backward(dy, x, layout=layout)
        np.testing.assert_allclose(dx, want, **TOL["float32"], err_msg=str(size))


@pytest.mark.parametrize("up", [1, 2, 3, 4])
def test_free_resampling_matches_opkit_for_every_factor(up):
    """Each factor, each layout, float32 and float64: the DFT form gives opkit's results
    (float32 to its rounding: the transforms run in float64)."""
    op = opkit.get("freq_leaky_relu")
    attrs = {"up": up, "alpha": 0.25, "gain": 1.5}  # float32 attributes hold them exactly
    rng = np.random.default_rng(up)
    for layout, dtype in itertools.product(("NCHW", "NHWC"), ("float32", "float64")):
        forward = op.to_onnx(None, None, attrs, layout=layout, dtype=dtype)
        backward = op.to_onnx(None, None, attrs, layout=layout, dtype=dtype, backward=True)
        tol = TOL["float32"] if dtype == "float32" else dict(rtol=1e-11, atol=1e-11)
        for size in FREE_SIZES[:2]:
            x, dy = (_image(rng, size, layout, dtype) for _ in range(2))
            label = f"{layout} {dtype} {size}"
            y, = run(forward, {"x": x})
            assert y.dtype == x.dtype
            np.testing.assert_allclose(y, op(x, layout=layout, **attrs), **tol, err_msg=label)
            dx, = run(backward, {"x": x, "dy": dy})
            want, = op.backward(dy, x, layout=layout, **attrs)
            np.testing.assert_allclose(dx, want, **tol, err_msg=label)


def _fourier_resample(x, axis, m):
    """x resampled to length m along axis by its trigonometric interpolant, from the full
    complex spectrum: frequencies below half the shorter length kept; one at exactly half of
    it (an even length) split between +f and -f going up, its two halves summed going down."""
    n = x.shape[axis]
    spectrum = np.moveaxis(np.fft.fft(x, axis=axis), axis, -1)
    out = np.zeros(spectrum.shape[:-1] + (m,), complex)
    edge = min(n, m) / 2
    for j, f in enumerate(np.fft.fftfreq(n, 1 / n).astype(int)):
        if abs(f) < edge or n > m and abs(f) == edge:
            out[..., f % m] += spectrum[..., j]
        elif abs(f) == edge:
            out[..., f % m] += spectrum[..., j] / 2
            out[..., -f % m] += spectrum[..., j] / 2
    return np.moveaxis(np.fft.ifft(out, axis=-1).real * (m / n), -1, axis)


def _freq_leaky_relu(x, up, alpha, gain):
    """The operator from its definition, by np.fft (NCHW)."""
    u = x
    for axis in (2, 3):
        u = _fourier_resample(u, axis, u.shape[axis] * up)
    a = np.where(u > 0, u, alpha * u)
    for axis in (2, 3):
        a = _fourier_resample(a, axis, a.shape[axis] // up)
    return gain * a


@pytest.mark.parametrize("up", [2, 3])
def test_free_resampling_matches_an_independent_fft(up):
    """float64, against the operator computed by np.fft from its definition; the backward
    against a central difference of that along a random direction."""
    attrs = {"up": up, "alpha": 0.25, "gain": 1.5}
    op = opkit.get("freq_leaky_relu")
    forward = op.to_onnx(None, None, attrs, dtype="float64")
    backward = op.to_onnx(None, None, attrs, dtype="float64", backward=True)
    rng = np.random.default_rng(7)
    for size in ((1, 2, 6, 8), (2, 1, 5, 7)):
        x, dy, v = (rng.standard_normal(size) for _ in range(3))
        y, = run(forward, {"x": x})
        np.testing.assert_allclose(y, _freq_leaky_relu(x, **attrs), rtol=1e-11, atol=1e-11)
        dx, = run(backward, {"x": x, "dy": dy})
        eps = 1e-6
        slope = (_freq_leaky_relu(x + eps * v, **attrs) - _freq_leaky_relu(x - eps * v, **attrs))
        np.testing.assert_allclose(np.sum(dx * v), np.sum(slope * dy) / (2 * eps), rtol=1e-7)


def test_each_opset_spells_the_dft_and_a_given_size_keeps_the_matrix():
    """DFT takes its axis as an attribute before opset 20 and as an input from then on; both
    run. A size given at export resamples with the constant matrix, as before."""
    op = opkit.get("freq_leaky_relu")
    x = np.random.default_rng(8).standard_normal((1, 2, 7, 5)).astype(np.float32)
    want = op(x, up=3)
    for opset in (17, 20, onnx.defs.onnx_opset_version()):
        model = op.to_onnx(None, None, {"up": 3}, opset=opset)
        dft = [n for n in model.functions[0].node if n.op_type == "DFT"]
        assert len(dft) == 8 and all(len(n.input) == (3 if opset >= 20 else 2) for n in dft)
        y, = run(model, {"x": x})
        np.testing.assert_allclose(y, want, **TOL["float32"], err_msg=f"opset {opset}")
    fixed = op.to_onnx(None, [("N", 2, 7, 5)], {"up": 3}, opset=15)
    assert "DFT" not in _ops(fixed) and "MatMul" in _ops(fixed)
    y, = run(fixed, {"x": x})
    np.testing.assert_allclose(y, want, **TOL["float32"])
