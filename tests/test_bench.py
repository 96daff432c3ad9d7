"""`opkit bench` runs and records what it measured (it asserts no time: the machine is shared)."""
import json

import numpy as np
import pytest

from opkit import bench
from opkit.bench import sweep
from opkit.cli import main


def test_generic_bench_writes_rows(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "leaky_relu", "spatial_leaky_relu", "--sizes", "16,40K", "--dtypes",
                 "float32,float16", "--layouts", "ND,NHWC", "--repeat", "2", "--json", str(out),
                 "--no-compile"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "leaky_relu forward ND 16" in text and "spatial_leaky_relu backward NHWC 40K" in text
    assert "[1/" in captured.err and "spatial_leaky_relu backward NHWC 40K float16" in captured.err
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["numpy"] == np.__version__
    rows = data["rows"]
    assert {r["op"] for r in rows} == {"leaky_relu", "spatial_leaky_relu"}
    assert {r["pass_"] for r in rows} == {"forward", "backward"}
    for r in rows:
        assert r["bytes"] > 0 and r["seconds"]["opkit"] > 0 and r["seconds"]["numpy"] > 0


def test_targets_are_ratios_of_one_run():
    row = bench.Row("case", "op", "forward", "float32", (4,), 32, {"opkit": 1.0, "numpy": 6.0, "copy": 0.5})
    assert row.ratio("numpy") == 6.0 and row.gbps("opkit") == 32e-9 and row.ratio("torch") is None
    met = bench.TargetResult("case", "vs numpy", row.ratio("numpy"), 5.0)
    unknown = bench.TargetResult("case", "vs torch", row.ratio("torch"), 1.0)
    assert met.met and unknown.met is None
    text = bench.format_targets([met, unknown])
    assert "met" in text and ("n/a (torch not installed)" in text or "n/a (no such contender" in text)
    assert "case" in bench.format_rows([row])


def test_elementwise_targets_check_every_contender():
    row = bench.Row("silu forward NCHW 16M", "silu", "forward", "float16", (4,), 32,
                    {"opkit": 1.0, "copy": 0.75, "torch": 1.5, "torch.compile": 0.9})
    checks = {t.check: t for t in bench.elementwise_targets([row])}
    assert checks["vs copy bandwidth"].minimum == 0.7 and checks["vs copy bandwidth"].met   # 0.75x
    assert checks["x torch eager"].ratio == 1.5 and checks["x torch eager"].met
    assert checks["x torch.compile"].ratio == 0.9 and checks["x torch.compile"].met is False


def test_the_torch_compile_column_times_the_compiled_formula(capsys):
    pytest.importorskip("torch")
    assert main(["bench", "leaky_relu", "--sizes", "4K", "--dtypes", "float32", "--layouts", "ND",
                 "--repeat", "2", "--json", "/dev/null", "--check"]) == 0
    out = capsys.readouterr().out
    assert "compile ms" in out and "x torch.compile" in out
    row = next(line for line in out.splitlines() if line.startswith("leaky_relu forward ND 4K"))
    assert row.split()[-1] != "-" and row.split()[-2] != "-"   # compiled, timed, compared


def test_an_attr_chosen_on_the_command_line_reaches_every_call(monkeypatch, capsys):
    import importlib
    bind_mod = importlib.import_module("opkit.runtime.bind")
    seen = []
    real = bind_mod.bind

    def spy(spec, values, *args, **kwargs):
        seen.append(values.get("alpha"))
        return real(spec, values, *args, **kwargs)
    monkeypatch.setattr(bind_mod, "bind", spy)
    assert main(["bench", "leaky_relu", "--attr", "alpha=0.3", "--sizes", "16", "--dtypes",
                 "float32", "--layouts", "ND", "--repeat", "2", "--json", "/dev/null",
                 "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert "leaky_relu[alpha=0.3] forward ND 16" in out and "leaky_relu[alpha=0.3] backward" in out
    assert seen and set(seen) == {0.3}
    assert main(["bench", "leaky_relu", "--attr", "slope=0.3", "--sizes", "16"]) != 0
    assert "none of leaky_relu has the attr 'slope' (their attrs: alpha" in capsys.readouterr().err
    assert main(["bench", "leaky_relu", "--attr", "alpha=much", "--sizes", "16"]) != 0
    assert "--attr alpha: expected a number, got 'much'" in capsys.readouterr().err


def test_timed_takes_medians_of_interleaved_rounds():
    calls = []
    t = bench.timed({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "none": None}, 3)
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
    assert calls[:4] == ["a", "b", "a", "b"]


def _torch_column_case(name, layout, pass_, dtype="float64"):
    """The torch column's call and opkit's result for the same inputs."""
    import opkit
    from opkit.runtime.bind import bind
    from opkit.validate.cases import default_attrs
    op = opkit.get(name)
    rng = np.random.default_rng(7)
    attrs = default_attrs(op.spec)
    shape = (2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3)
    logical = {"N": 2, "C": 3, "H": 4, "W": 5}
    inputs = {i.name: rng.uniform(-2, 2, tuple(d if isinstance(d, int) else logical.get(d, 6)
                                                  for d in i.shape) if i.shape else shape).astype(dtype)
              for i in op.spec.inputs}
    kw = dict(inputs, **attrs, layout=layout)
    if pass_ == "forward":
        b = bind(op.spec, {**inputs, **attrs}, layout, name)
        return sweep._torch_column(op, pass_, b, attrs, None, None, layout), op(**kw)
    dy = rng.standard_normal(bind(op.spec, {**inputs, **attrs}, layout, name).outputs["y"][1])
    dy = dy.astype(dtype)
    b = bind(op.spec, {**inputs, **attrs}, layout, name, [("dy", dy, "y")])
    grads = tuple(np.empty_like(inputs[n]) for n in op.spec.input_names)
    return sweep._torch_column(op, pass_, b, attrs, (dy,), grads, layout), op.backward(dy, **kw)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["leaky_relu", "spatial_leaky_relu", "conditional_leaky_relu",
                                  "fused_bias_leaky_relu"])
def test_the_torch_column_computes_what_opkit_does(name, layout):
    """The bench compares like with like: PyTorch's call gives opkit's numbers."""
    torch = pytest.importorskip("torch")
    fn, expected = _torch_column_case(name, layout, "forward")
    np.testing.assert_allclose(fn().numpy(), expected, rtol=1e-12, atol=1e-14)
    fn, expected = _torch_column_case(name, layout, "backward")
    got = fn()
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    expected = [e for e in expected if e is not None]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy().reshape(e.shape), e, rtol=1e-12, atol=1e-14)


ACTIVATIONS = ["relu", "relu6", "hardtanh", "leakyrelu", "sigmoid", "tanh", "elu", "celu", "selu",
               "gelu", "silu", "mish", "hardswish", "logsigmoid", "softplus"]


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_the_eager_column_writes_what_pytorchs_function_computes(name, repo):
    """The eager torch column calls aten's out= kernels: the same numbers as the torch.nn
    function and its autograd (an attr left at its default would show here)."""
    torch = pytest.importorskip("torch")
    from opkit.bench.torch_columns import torch_pass
    from opkit.spec import parse_spec
    from opkit.validate.cases import default_attrs
    path = repo / "examples" / "activations" / f"{name}.yaml"
    attrs = dict(default_attrs(parse_spec(path.read_text(), str(path))))
    if "alpha" in attrs:  # (away from the defaults, so a dropped attr shows)
        attrs["alpha"] = 0.7
    x = torch.randn(1000, dtype=torch.float64) * 4
    x[:4] = torch.tensor([0.0, -0.0, 6.0, -3.0], dtype=torch.float64)
    dy = torch.randn(1000, dtype=torch.float64)
    out, grad = torch.full_like(x, np.nan), torch.full_like(x, np.nan)
    forward = torch_pass(name, "forward", {"x": x}, attrs, None, None, None, {}, out=out)
    backward = torch_pass(name, "backward", {"x": x}, attrs, dy, [grad], None, {})
    forward()
    got = backward()  # aten's grad_input kernels return `grad`; autograd (mish) a tuple
    got = got[0] if isinstance(got, tuple) else got
    allocating = torch_pass(name, "forward", {"x": x}, attrs, None, None, None, {})
    leaf = x.clone().requires_grad_()
    want = torch_pass(name, "forward", {"x": leaf}, attrs, None, None, None, {})()
    (want_grad,) = torch.autograd.grad(want, leaf, dy)
    if name == "celu":  # (PyTorch's own celu autograd is up to 3e-7 off: the exact slope here)
        want_grad = dy * torch.where(x > 0, 1.0, torch.exp(x / attrs["alpha"]))
    torch.testing.assert_close(out, allocating(), rtol=0, atol=0)
    torch.testing.assert_close(got, want_grad, rtol=1e-14, atol=1e-15)


def test_a_contender_slower_than_a_fifth_of_the_budget_is_timed_once():
    import time
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.03)
    rounds = {}
    t = bench.timed({"fast": fast, "slow": slow}, 7, rounds=rounds, budget=0.1)
    assert calls["slow"] == 2          # one warm-up call, one timed call
    first = bench.timed({"slow": slow, "fast": fast}, 7, budget=0.1)   # the first never is
    assert calls["slow"] == 2 + 3 + 5 and set(first) == {"slow", "fast"}
    assert len(rounds["slow"]) == 1 and len(rounds["fast"]) >= 5 and t["slow"] >= 0.03
    row = bench.Row("c", "op", "forward", "float32", (4,), 32, t, rounds)
    assert row.ratio("slow", "fast") == t["slow"] / t["fast"]   # medians, not rounds


def test_all_goes_on_past_a_refused_case_and_predicts_numpys_time(monkeypatch):
    """A case the operator refuses is noted and left out; NumPy's column is left out where its
    time per element at the smaller size says one call would exceed the budget."""
    real = sweep._generic_row

    def refuse_nhwc(name, layout, *args, **kw):
        if layout == "NHWC":
            raise ValueError("no NHWC today")
        return real(name, layout, *args, **kw)
    monkeypatch.setattr(sweep, "_generic_row", refuse_nhwc)
    notes = []
    monkeypatch.setattr(sweep, "NUMPY_LIMIT", 1e-7)
    rows = bench.generic_rows(["leaky_relu"], [8192, 4096], ["float32"], ["ND", "NHWC"], ["forward"],
                              3, np.random.default_rng(0), budget=0.01, notes=notes)
    assert [r.case for r in rows] == ["leaky_relu forward ND 4K", "leaky_relu forward ND 8K"]
    assert "numpy" in rows[0].seconds and "numpy" not in rows[1].seconds
    assert any(n.startswith("leaky_relu forward ND 8K float32: NumPy's column left out") for n in notes)
    assert "leaky_relu forward NHWC 4K float32: skipped: no NHWC today" in notes


def test_a_generic_row_compares_round_by_round():
    """The generic rows keep their rounds: "vs copy" is the median of each round's ratio (a burst
    of load that slows both sides of one round cancels), the copy's rounds scaled like its
    median to this call's traffic."""
    row = sweep._generic_row("fused_bias_leaky_relu", "NHWC", 4096, "float32", "backward", 7,
                             np.random.default_rng(0), budget=None)
    opk, copy = row.rounds["opkit"], row.rounds["copy"]
    assert len(opk) == len(copy) == 7
    assert row.seconds["copy"] == pytest.approx(float(np.median(copy)))
    assert row.ratio("copy") == pytest.approx(float(np.median(np.array(copy) / np.array(opk))))


REDUCTIONS = ["softmax", "log_softmax", "logsumexp", "rms_norm", "layer_norm", "group_norm",
              "pixel_norm", "minibatch_stddev"]


@pytest.fixture(scope="module")
def reductions(repo):
    import opkit
    opkit.load(repo / "examples" / "reductions")


@pytest.mark.parametrize("name", REDUCTIONS)
def test_the_torch_column_of_the_reductions_computes_what_opkit_does(name, reductions):
    torch = pytest.importorskip("torch")
    import opkit
    layouts = [l for l in ("NCHW", "NHWC") if l in opkit.get(name).spec.layouts] or ["ND"]
    for layout in layouts:
        for pass_ in ("forward", "backward"):
            fn, expected = _torch_column_case(name, layout, pass_)
            got = fn()
            got = [got] if isinstance(got, torch.Tensor) else list(got)
            expected = [expected] if isinstance(expected, np.ndarray) else \
                [e for e in expected if e is not None]
            assert len(got) == len(expected), (name, layout, pass_)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g.numpy().reshape(e.shape), e, rtol=1e-10, atol=1e-12,
                                           err_msg=f"{name} {layout} {pass_}")


def test_named_dims_chosen_on_the_command_line_shape_the_inputs(reductions, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "softmax", "rms_norm", "--dims", "N=3", "--dims", "K=5", "--dims",
                 "C=4", "--dims", "H=2", "--dims", "W=6", "--layouts", "NHWC", "--dtypes",
                 "float32", "--repeat", "2", "--no-compile", "--json", str(out)]) == 0
    assert "softmax forward ND [3,5]" in capsys.readouterr().out
    shapes = {r["op"]: r["shape"] for r in json.loads(out.read_text())["rows"]}
    assert shapes == {"softmax": [3, 5], "rms_norm": [3, 2, 6, 4]}
    assert main(["bench", "softmax", "--dims", "K=many"]) != 0
    assert "--dims 'K=many': expected NAME=SIZE" in capsys.readouterr().err
