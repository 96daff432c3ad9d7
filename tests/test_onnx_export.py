"""ONNX exports of every bundled and example operator give opkit's results under onnxruntime:
float32 and float16, every layout each declares (NCHW, NHWC, ND), special values included."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opkit  # noqa: E402
from opkit.cli import main  # noqa: E402
from opkit.validate.cases import make_cases, smooth  # noqa: E402

from conftest import REPO  # noqa: E402

EXAMPLE_FOLDERS = [p for p in (REPO / "examples" / "user_ops", REPO / "examples" / "activations")
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
    for case in make_cases(op.spec, rng):
        layout, label = case.label.split()[:2]
        if label not in ("small", "odd", "4-d") or len(case.label.split()) > 2:
            continue
        if resamples:  # a NaN or inf spreads over a whole resampled row, inf as NaN or inf
            case = smooth(case, op.spec, rng)
        for dtype in ("float32", "float16"):
            if dtype not in op.spec.dtypes:
                continue
            arrays = [case.arrays[i.name].astype(dtype) for i in op.spec.inputs]
            model = op.to_onnx(None, arrays, layout=layout)
            got = run(model, {i.name: a for i, a in zip(op.spec.inputs, arrays)})
            want = op(*arrays, layout=layout)
            for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
                assert g.dtype == w.dtype and g.shape == w.shape, (case.label, dtype)
                np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=case.label)
                np.testing.assert_allclose(g, w, **TOL[dtype], err_msg=f"{case.label} {dtype}")
            checked.add((layout, dtype))
    layouts = {layout for layout in op.spec.layouts}
    assert {layout for layout, _ in checked} == layouts
    assert {dtype for _, dtype in checked} == {"float32", "float16"} & set(op.spec.dtypes)


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
    assert main(["export", "freq_leaky_relu", "-o", str(tmp_path / "b.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("opkit export: error: fft_up needs a fixed size along dim H")
    assert not (tmp_path / "b.onnx").exists()
