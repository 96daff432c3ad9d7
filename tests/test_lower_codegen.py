"""Lowering (fused kernels, library calls, listings, costs) and Cython rendering, at source level.

Nothing here compiles: the tests look at kernel plans and at the generated text.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opkit.codegen import render, template_digest
from opkit.dsl import build_graphs
from opkit.errors import SpecError
from opkit.lower import Const, Kernel, Kind, LibCall, Value, cost, listing, lower
from opkit.spec import load_spec, parse_spec
from opkit.target import current

from conftest import declaration

REPO = Path(__file__).resolve().parent.parent
LEAKY = REPO / "operators" / "leaky_relu.yaml"
HEX64 = re.compile(r"[0-9a-f]{64}\Z")


decl = declaration  # YAML text of a small operator (conftest.py)


def pipeline(text, file="t.yaml", isa=""):
    spec = parse_spec(text, file)
    graphs = build_graphs(spec)
    target = current(isa)
    return spec, graphs, lower(spec, graphs), target


def build(forward, isa="", **kw):
    return pipeline(decl(forward, **kw), isa=isa)


def leaky(isa=""):
    return pipeline(LEAKY.read_text(), str(LEAKY), isa)


def source(spec, graphs, lowered, target):
    return render(spec, graphs, lowered, target)


def ops(kernel):
    """The computing instructions of a kernel body (loads left out)."""
    return [i.op for i in kernel.body if i.op != "load"]


def starts(lines, mnemonic):
    return [line for line in lines if line.split()[0] == mnemonic]


def header(src):
    """The annotation header: every line before the first line of code."""
    lines = src.splitlines()
    end = lines.index("# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True")
    return lines[:end]


# ------------------------------------------------------------------------------------ leaky_relu

@pytest.mark.parametrize("isa", ["", "portable"])
def test_leaky_relu_forward_is_one_kernel(isa):
    spec, graphs, lowered, target = leaky(isa)
    fwd = lowered.forward
    assert len(fwd.steps) == 1
    (k,) = fwd.steps
    assert isinstance(k, Kernel)
    assert k.inputs == (Value.input("x"),) and k.outputs == (Value.output("y"),)
    assert k.attrs == ("alpha",)
    assert ops(k) == ["gt", "mul", "where"]
    assert [i.op for i in k.body].count("load") == 1
    assert fwd.outputs == (("y", Value.output("y")),)
    assert target.isa == (isa or target.isa)
    if isa == "portable":
        assert target.vector_bytes == 16 and cost(k, "float32", target.vector_bytes).lanes == 4


def test_plans_do_not_depend_on_the_target():
    """Lowering is a pure function of the declaration; the machine enters at codegen."""
    _, _, native, _ = leaky("")
    _, _, portable, _ = leaky("portable")
    assert native == portable
    assert "target" not in lower.__code__.co_varnames


@pytest.mark.parametrize("isa", ["", "portable"])
def test_leaky_relu_backward_is_one_kernel_and_a_sum_to(isa):
    _, _, lowered, _ = leaky(isa)
    bwd = lowered.backward
    assert [type(s) for s in bwd.steps] == [Kernel]
    k, = bwd.steps
    assert set(k.inputs) == {Value.input("x"), Value.input("dy")}
    assert ops(k) == ["gt", "mul", "where"]
    call, = k.sums  # folded into the kernel: dx itself where the shapes match, else summed
    assert call.prim == "sum_to" and call.params == ("x",)
    assert call.args == k.outputs and call.result == Value.output("dx")
    assert bwd.outputs == (("dx", Value.output("dx")),)
    assert lowered.kernels == (lowered.forward.steps[0], k)


@pytest.mark.parametrize("isa", ["", "portable"])
def test_leaky_relu_listing(isa):
    _, _, lowered, _ = leaky(isa)
    k = lowered.forward.kernels[0]
    f32 = listing(k, "float32")
    assert f32[0].split() == ["vld", "x,", "gm.x"]
    assert len(starts(f32, "vcmpgt")) == 1 and starts(f32, "vcmpgt")[0].endswith("x, #0.0")
    assert len(starts(f32, "vmuls")) == 1 and "alpha" in starts(f32, "vmuls")[0]
    assert len(starts(f32, "vsel")) == 1
    assert f32[-1].startswith("vst") and "gm.y" in f32[-1]
    assert not any(line.startswith("vconv") for line in f32)
    assert listing(k, "float64") == f32

    f16 = listing(k, "float16")
    assert starts(f16, "vconv_f162f32") and starts(f16, "vconv_f322f16")
    # converted once after the load and once before the store
    assert f16.index(starts(f16, "vconv_f162f32")[0]) == 1
    assert f16.index(starts(f16, "vconv_f322f16")[0]) == len(f16) - 2
    assert f16[0].startswith("vld      x, gm.x") and f16[0].endswith("; f16")
    assert starts(f16, "vcmpgt") == starts(f32, "vcmpgt") and starts(f16, "vsel") == starts(f32, "vsel")

    b32 = listing(lowered.backward.kernels[0], "float32")
    assert starts(b32, "vcmpgt") and starts(b32, "vmuls") and starts(b32, "vsel")
    assert len(starts(b32, "vld")) == 2


@pytest.mark.parametrize("isa", ["", "portable"])
def test_leaky_relu_cost_is_memory_bound(isa):
    _, _, lowered, target = leaky(isa)
    k = lowered.forward.kernels[0]
    c32 = cost(k, "float32", target.vector_bytes)
    assert c32.bound() == "memory"
    assert "memory-bound" in str(c32)
    assert c32.bytes_per_element == 8  # read x, write y
    assert c32.lanes == target.vector_bytes // 4
    assert c32.vector_ops == 3
    c16 = cost(k, "float16", target.vector_bytes)
    assert c16.bytes_per_element == 4 and c16.vector_ops > c32.vector_ops
    assert cost(k, "float64", target.vector_bytes).bytes_per_element == 16


def test_cost_of_heavy_math_is_compute_bound():
    _, _, lowered, _ = build("tanh(sigmoid(x) * exp(x)) / sqrt(x * x + 1)")
    assert cost(lowered.forward.kernels[0], "float32", 64).bound() == "compute"


# ------------------------------------------------------------------------------------ fusion

def test_temporaries_fuse_into_one_kernel():
    spec, graphs, lowered, _ = build({"t": "x * 2", "u": "exp(t) - w", "y": "u * t + w"},
                                     inputs=("x", "w"))
    assert len(lowered.forward.steps) == 1
    (k,) = lowered.forward.steps
    assert set(k.inputs) == {Value.input("x"), Value.input("w")} and k.outputs == (Value.output("y"),)
    # t is computed once though used twice
    assert ops(k).count("mul") == 2 and ops(k).count("exp") == 1
    assert lowered.forward.temps == ()


def test_shared_subexpression_of_two_outputs_is_computed_once():
    spec, graphs, lowered, _ = build({"y1": "exp(x) + 1", "y2": "exp(x) * 2"},
                                     outputs=["y1", "y2"])
    assert len(lowered.forward.steps) == 1
    (k,) = lowered.forward.steps
    assert k.outputs == (Value.output("y1"), Value.output("y2")) and len(k.results) == 2
    assert ops(k).count("exp") == 1
    assert sorted(ops(k)) == ["add", "exp", "mul"]
    lines = listing(k, "float32")
    assert len(starts(lines, "vexp")) == 1 and len(starts(lines, "vst")) == 2


def test_output_that_is_an_input_is_a_copy_kernel():
    spec, graphs, lowered, _ = build({"z": "exp(x)", "y": "x"}, outputs=["z", "y"])
    kernels = lowered.forward.kernels
    copy = [k for k in kernels if k.outputs == (Value.output("y"),)]
    assert len(copy) == 1
    (c,) = copy
    assert c.inputs == (Value.input("x"),) and ops(c) == []
    assert [i.op for i in c.body] == ["load"] and c.results == (c.body[0].dst,)
    assert listing(c, "float32") == ["vld      x, gm.x", "vst      gm.y, x"]
    # alone, too
    _, _, lowered, _ = build("x")
    (k,) = lowered.forward.steps
    assert k.inputs == (Value.input("x"),) and k.outputs == (Value.output("y"),) and ops(k) == []


def test_value_on_fewer_dims_is_materialized_first():
    spec, graphs, lowered, _ = build(
        {"s": "sigmoid(b)", "y": "where(x > 0, x, s * x)"},
        inputs=(("x", "{dtypes: [float32, float64], layouts: [NCHW, NHWC]}"),
                ("b", "{dtypes: [float32, float64], shape: [N, C]}")))
    steps = lowered.forward.steps
    assert len(steps) == 2 and all(isinstance(s, Kernel) for s in steps)
    small, big = steps
    assert small.inputs == (Value.input("b"),) and ops(small) == ["sigmoid"]
    assert len(small.outputs) == 1 and small.outputs[0].kind is Kind.TEMP
    assert set(big.inputs) == {Value.input("x"), small.outputs[0]} and big.outputs == (Value.output("y"),)
    assert "sigmoid" not in ops(big) and ops(big) == ["gt", "mul", "where"]
    assert lowered.forward.temps == small.outputs
    # the backward sums the per-channel gradient back: b's over H and W right where it was
    # broadcast (in the pass of the kernel that computes it), then to b's shape
    folded = [c for s in lowered.backward.steps if isinstance(s, Kernel) for c in s.sums]
    calls = [s for s in lowered.backward.steps if isinstance(s, LibCall)] + folded
    assert sorted(c.params for c in calls if c.prim == "sum_to") == [("b",), ("x",)]
    assert [c.params for c in calls if c.prim == "sum"] == [(("N", "C"),)]
    assert [c.params for c in folded if c.prim == "sum"] == [(("N", "C"),)]


def test_value_on_the_same_dims_is_not_materialized():
    spec, graphs, lowered, _ = build(
        "where(x > 0, x, sigmoid(b) * x)",
        inputs=(("x", "{dtypes: [float32, float64], layouts: [NCHW, NHWC]}"),
                ("b", "{dtypes: [float32, float64], layouts: [NCHW, NHWC]}")))
    assert len(lowered.forward.steps) == 1
    assert "sigmoid" in ops(lowered.forward.steps[0])


def test_lowering_an_op_with_an_unused_input():
    spec, graphs, lowered, _ = build("x * 2", inputs=("x", "w"))
    assert [n for n, _ in lowered.backward.outputs] == ["dx", "dw"]
    # the zero gradient of w is a filled array reduced (expanded) to w's shape
    fills = [k for k in lowered.backward.kernels if not k.inputs]
    assert len(fills) == 1 and fills[0].results == (Const(0.0),)


# ------------------------------------------------------------------------------------ codegen

def test_source_header_and_passes():
    spec, graphs, lowered, target = leaky()
    src = source(spec, graphs, lowered, target)
    assert src.startswith("# @generated from templates/module.pyx.j2")
    assert "do not edit" in src.splitlines()[0]
    head = header(src)
    assert "# forward:" in head
    assert "#   y = where(x > 0, x, alpha * x)" in head
    assert "# backward (derived):" in head
    assert "#   dx = sum_to(where(x > 0, dy, dy * alpha), x)" in head
    assert any(line.startswith("# target    ") and target.describe() in line for line in head)


@pytest.mark.parametrize("isa", ["", "portable"])
def test_source_has_listing_and_schedule_of_every_kernel(isa):
    spec, graphs, lowered, target = leaky(isa)
    src = source(spec, graphs, lowered, target)
    head = header(src)
    assert len(lowered.kernels) == 2
    schedules = [line for line in head if line.startswith("#   schedule ")]
    assert len(schedules) == len(lowered.kernels)
    for k in lowered.kernels:
        assert any(line.startswith(f"# kernel {k.name}: ") for line in head)
        block = head[next(i for i, line in enumerate(head) if line.startswith(f"# kernel {k.name}: ")):]
        sched = next(line for line in block if line.startswith("#   schedule "))
        assert f"tile {lowered.schedule.tile} elements" in sched
        assert f"{target.vector_bytes}-byte vectors" in sched and f"isa {target.isa}" in sched
        # integer kernels exist for the forward pass only; they take alpha as fixed point
        dtypes = spec.dtypes if k.name.startswith("fwd") else spec.float_dtypes
        for dt in dtypes:
            lines = listing(k, dt, {"alpha": 7})
            assert f"#   {dt}: {cost(k, dt, target.vector_bytes)}" in head
            for line in lines:
                assert f"#     {line}" in head, (k.name, dt, line)
    assert "#     vshrs    v2, v2, #7         ; arithmetic shift" in head


def test_source_defines_kernel_functions_per_compute_type():
    spec, graphs, lowered, target = leaky()
    src = source(spec, graphs, lowered, target)
    defs = re.findall(r"^def (\w+)\(", src, re.M)
    # one entry per kernel and compute type (int32 for int8/int16 data, int64 for int32 data;
    # no integer backward), and the direct calls of the one-kernel passes
    assert defs == ["fwd0_f", "fwd0_d", "fwd0_i", "fwd0_l", "bwd0_f", "bwd0_d",
                    "fast_forward", "fast_backward"]
    assert 'KERNELS = ("fwd0_f", "fwd0_d", "fwd0_i", "fwd0_l", "bwd0_f", "bwd0_d", )' in src
    assert re.search(r"^cdef inline void fwd0_f_tile\(.*\) noexcept nogil:$", src, re.M)
    assert "cdef float a_alpha = ctx.a_alpha" in src
    assert "cdef double a_alpha = ctx.a_alpha" in src


@pytest.mark.parametrize("isa", ["", "portable"])
def test_leaky_relu_module_is_short(isa):
    """The generic work lives in templates/opkit_kernel.h and .pxd: the module holds what is
    the operator's own (it was 940 lines, two thirds of them the same for every operator)."""
    src = source(*leaky(isa))
    assert len(src.splitlines()) < 500
    # the forward kernel folds no sum: no float16 sum loop, no sum arguments
    assert "fwd0_f_htile_f" not in src and "def fwd0_f(" in src
    fwd0 = next(line for line in src.splitlines() if line.startswith("def fwd0_f("))
    assert "sums" not in fwd0
    # its backward folds dx = sum_to(...): it keeps both
    assert re.search(r"^cdef void bwd0_f_htile_f\(", src, re.M)
    assert re.search(r"^def bwd0_f\(.*tuple sums=None.*\):$", src, re.M)


@pytest.mark.parametrize("example", ["softmax", "layer_norm"])
def test_kernels_with_folded_sums_keep_their_sum_loops(example):
    """Only a kernel that folds sums gets the float16 loop that adds them up (htile_f) and an
    entry that takes them: a reduction's kernels still render theirs, every variant's."""
    from opkit.runtime.op import Op
    spec = load_spec(REPO / "examples" / "reductions" / f"{example}.yaml")
    op = Op(spec, build_graphs(spec))
    src = op.source()
    summed = unsummed = 0
    for v in op.variants:
        for k in op.lowered(v).kernels:  # (named after the variant: v1fwd0 ...)
            name = f"{k.name}_f"
            entry = next(line for line in src.splitlines() if line.startswith(f"def {name}("))
            assert (f"cdef void {name}_htile_f(" in src) == bool(k.sums), name
            assert ("tuple sums=None" in entry) == bool(k.sums), name
            assert f"cdef void {name}_htile(" in src  # every float kernel has its float16 loop
            summed += bool(k.sums)
            unsummed += not k.sums
    assert summed >= 3 and unsummed >= 1


@pytest.mark.parametrize("dtypes, defs", [
    ("[float16]", ["fwd0_f", "bwd0_f"]),
    ("[float16, float32]", ["fwd0_f", "bwd0_f"]),
    ("[float64]", ["fwd0_d", "bwd0_d"]),
])
def test_functions_follow_the_dtypes(dtypes, defs):
    spec, graphs, lowered, target = build("where(x > 0, x, 0.5 * x)",
                                          inputs=(("x", f"{{dtypes: {dtypes}}}"),))
    src = source(spec, graphs, lowered, target)
    assert re.findall(r"^def (\w+)\(", src, re.M) == defs + ["fast_forward", "fast_backward"]
    # the direct call runs the forward kernel's instances (each one's init makes the kernel)
    assert re.findall(r"= (fwd0_\w)_init\(&kern, ", src) == defs[:1]


def test_no_direct_call_when_the_forward_pass_is_not_one_plain_kernel():
    # a per-channel bias makes shapes differ by design: every call takes the checked path
    spec, graphs, lowered, target = build(
        "where(x + b > 0, x + b, 0.2 * (x + b))",
        inputs=(("x", "{dtypes: [float32], layouts: [NCHW, NHWC]}"), ("b", "{dtypes: [float32], shape: [C]}")))
    assert "def fast_forward(" not in source(spec, graphs, lowered, target)


def test_rendering_is_deterministic():
    a = source(*leaky())
    b = source(*leaky())
    assert a == b
    spec, graphs, lowered, target = leaky()
    assert source(spec, graphs, lowered, target) == source(spec, graphs, lowered, target)


def test_rendering_is_the_same_in_another_process():
    code = ("import sys; from opkit.spec import load_spec; from opkit.dsl import build_graphs; "
            "from opkit.lower import lower; from opkit.target import current; "
            "from opkit.codegen import render; s = load_spec(sys.argv[1]); g = build_graphs(s); "
            "t = current('portable'); sys.stdout.write(render(s, g, lower(s, g), t))")
    res = subprocess.run([sys.executable, "-c", code, str(LEAKY)], capture_output=True, text=True,
                         check=True, cwd=str(REPO))
    assert res.stdout == source(*leaky("portable"))


def test_changed_expression_changes_the_source():
    base = source(*build("where(x > 0, x, 0.2 * x)"))
    changed = source(*build("where(x > 0, x, 0.3 * x)"))
    assert base != changed
    assert "(<float>0.3)" in changed and "(<float>0.3)" not in base
    assert source(*build("where(x >= 0, x, 0.2 * x)")) != base
    assert source(*build("where(x > 0, x, 0.2 * x)")) == base


def test_yaml_comments_and_free_text_never_reach_the_source():
    text = (
        "# import os\n"
        "name: t\n"
        "summary: '\"\"\"; import os; os.system(\"echo pwned\") #'\n"
        "inputs:\n"
        "  x: {dtypes: [float32, float64]}   # import os\n"
        "outputs:\n"
        "  y: {}\n"
        "forward:\n"
        "  # __import__('os').system('true')\n"
        "  y: where(x>0,x,0.25*x)   # import os\n"
    )
    spec, graphs, lowered, target = pipeline(text)
    src = source(spec, graphs, lowered, target)
    assert "import os" not in src
    assert "os.system" not in src and "pwned" not in src and "__import__" not in src
    # the expression is re-printed from the graph, not copied
    assert "x>0" not in src and "#   y = where(x > 0, x, 0.25 * x)" in header(src)


ODD_NAMES = [
    'we"ird\nname\'s\\op.yaml',
    "tab\there\rcr\u2028ls\u0085nel\u202eltr.yaml",
    "'''\n\"\"\"\nimport os\n.yaml",
]


def _check_printable_header(src, spec):
    head = header(src)
    assert head[-1] == ""
    for line in head[:-1]:
        assert line.startswith("#"), line
        assert line.isprintable(), repr(line)
        assert not set(line) & set("\"'\\"), repr(line)
    declared = next(line for line in head if line.startswith("# operator "))
    assert declared.startswith("# operator  t  declared in ")
    # comments after code lines name the file too
    for line in src.splitlines():
        if "  # " in line and not line.lstrip().startswith("#"):
            tail = line.split("  # ", 1)[1]
            assert tail.isprintable() and not set(tail) & set("\"'\\"), repr(line)
    # the body still has the code it should have
    # four kernels and the direct calls
    assert len(re.findall(r"^def \w+\(", src, re.M)) == 6


@pytest.mark.parametrize("odd", ODD_NAMES)
def test_odd_file_names_are_made_printable(odd, tmp_path):
    text = decl("where(x > 0, x, 0.5 * x)")
    try:
        path = tmp_path / odd
        path.write_text(text)
    except (OSError, ValueError):
        pytest.skip("the file system does not allow this name")
    spec = load_spec(path)
    assert spec.file == str(path)
    graphs = build_graphs(spec)
    target = current()
    src = render(spec, graphs, lower(spec, graphs), target)
    _check_printable_header(src, spec)
    # each odd character stands as a "?"; the rest of the name is kept
    # (only the file's name: the generated source, and so the cache key, is the same wherever
    # the file lives)
    shown = "".join(c if c.isprintable() and c not in "\"'\\" else "?" for c in path.name)
    assert f"# operator  t  declared in {shown}" in header(src)
    assert shown.count("?") >= 3


@pytest.mark.parametrize("odd", ODD_NAMES)
def test_odd_spec_names_are_made_printable(odd):
    spec, graphs, lowered, target = pipeline(decl("where(x > 0, x, 0.5 * x)"), file=odd)
    _check_printable_header(source(spec, graphs, lowered, target), spec)


def test_constants_render_typed():
    spec, graphs, lowered, target = build("where(x > 0, x, 0.2 * x)")
    src = source(spec, graphs, lowered, target)
    assert "(<float>0.2)" in src and "(<double>0.2)" in src
    assert "(<float>0.0)" in src
    body = [line for line in src.splitlines() if line.startswith("        v")]
    assert any(re.search(r"\(<float>0\.2\)", line) for line in body)
    # numbers appear typed wherever they are code
    assert not any(re.search(r"[^>\w.]0\.2\b", line.split("  #")[0]) for line in body)


def test_infinity_renders_as_INFINITY():
    spec, graphs, lowered, target = build("min(x, inf) + max(x, -inf)")
    src = source(spec, graphs, lowered, target)
    assert "(<float>INFINITY)" in src and "(<double>INFINITY)" in src
    assert "(<float>-INFINITY)" in src and "(<double>-INFINITY)" in src
    code = [line.split("  #")[0] for line in src.splitlines() if line.startswith("        v")]
    assert not any(re.search(r"\binf\b", line) for line in code)


def test_nan_constant_renders_as_NAN():
    spec, graphs, lowered, target = build("x + (inf - inf)")
    src = source(spec, graphs, lowered, target)
    assert "(<float>NAN)" in src and "(<double>NAN)" in src


def test_body_lines_point_at_the_declaration_lines():
    first = decl("exp(x) * 3")
    # the same expression three lines further down in another declaration
    second = first.replace("forward:\n", "forward:\n\n\n\n")
    spec1, graphs1, lowered1, target = pipeline(first, file="first.yaml")
    spec2, graphs2, lowered2, _ = pipeline(second, file="second.yaml")
    line1 = spec1.forward[0].loc.line
    line2 = spec2.forward[0].loc.line
    assert line2 == line1 + 3
    src1 = source(spec1, graphs1, lowered1, target)
    src2 = source(spec2, graphs2, lowered2, target)
    assert f"# kernel fwd0: forward, writes y  (from first.yaml line {line1})" in src1
    assert f"# kernel fwd0: forward, writes y  (from second.yaml line {line2})" in src2
    assert f"  # second.yaml:{line2}" in src2 and f"  # second.yaml:{line1}" not in src2


def test_template_digest():
    d = template_digest()
    assert HEX64.match(d)
    assert template_digest() == d
    res = subprocess.run([sys.executable, "-c",
                          "from opkit.codegen import template_digest; print(template_digest())"],
                         capture_output=True, text=True, check=True, cwd=str(REPO))
    assert res.stdout.strip() == d


# ------------------------------------------------------------------------------------ known bugs

def test_render_of_a_power():
    spec, graphs, lowered, target = build("x ** 2.5")
    src = source(spec, graphs, lowered, target)
    # float: opkit_math.h's vector form; double: libm's (no vector form)
    assert "opk_powf(v0, (<float>2.5))" in src and "pow(v0, (<double>2.5))" in src
    cube = source(*build("x ** 3"))  # as PyTorch computes it: multiplies
    assert "pow(v0" not in cube and "powf(v0" not in cube and "(v0 * v0)" in cube


def test_integer_kernels_refuse_what_has_no_integer_form():
    with pytest.raises(SpecError, match=r"t\.yaml:7:\d+: forward: int32 declared, but the constant 0\.5 "
                                        r"is not an integer"):
        build("where(x > 0, x, 0.5 * x)", inputs=(("x", "{dtypes: [float32, int32]}"),))
    with pytest.raises(SpecError, match=r"int8 declared, but exp has no integer form"):
        build("exp(x)", inputs=(("x", "{dtypes: [float32, int8]}"),))
    with pytest.raises(SpecError, match=r"the float attr g is used in mul; declare it `quantize: 7`"):
        build("g * x", inputs=(("x", "{dtypes: [int16]}"),), attrs={"g": "{type: float, default: 1.5}"})


def test_integer_kernel_uses_the_fixed_point_multiply():
    spec, graphs, lowered, target = build(
        "where(x > 0, x, g * x)", inputs=(("x", "{dtypes: [int8, float32]}"),),
        attrs={"g": "{type: float, default: 0.25, quantize: 5}"})
    src = source(spec, graphs, lowered, target)
    assert "v2 = opk_qmul_i(v0, a_g, 5)" in src
    assert "ctx.a_g = <int32_t>lrint(attr_g * 32.0)" in src


@pytest.mark.parametrize("text, right", [
    ("1 - x", "vsub     v1, #1.0, x"),
    ("2 / x", "vdiv     v1, #2.0, x"),
    ("where(0 < x, x, 0)", "vcmpgt   v1, x, #0.0"),   # 0 < x is x > 0
    ("x - 1", "vadds    v1, x, #-1.0"),
    ("3 * x", "vmuls    v1, x, #3.0"),
])
def test_listing_of_scalar_operands(text, right):
    _, _, lowered, _ = build(text)
    assert right in listing(lowered.forward.kernels[0], "float32")


def test_every_vector_function_has_its_listing_sequence():
    """Each function the C kernels compute with an opkit_math.h form has a TBE sequence of the
    length its cost says, printed indented under the function's line."""
    from opkit.codegen.c_ops import C
    from opkit.lower.tbe import SEQUENCES, TBE
    vector = sorted(p for p, f in C.items() if f.text.startswith("opk_"))
    assert vector and all(TBE[p].vector in SEQUENCES for p in vector), vector
    _, _, lowered, _ = build("softplus(x) + erf(x)")
    text = listing(lowered.forward.kernels[0], "float32")
    for prim in ("softplus", "erf"):
        head = next(line for line in text if line.startswith(TBE[prim].vector + " "))
        assert f"; {TBE[prim].cost:g} vector instructions:" in head
        steps = text[text.index(head) + 1:text.index(head) + 1 + len(SEQUENCES[TBE[prim].vector])]
        assert all(line.startswith("  ") for line in steps), steps


def test_the_kernel_abi_is_written_once_in_python():
    """opkit/abi.py is the one source of the dtype codes, the compute sizes, the geometry
    array's fields and the float32 bounds: the headers define none of them themselves, and
    every module and the runtime get them from c_defines."""
    import re

    import numpy as np
    from opkit import abi
    from opkit._paths import templates_dir
    from opkit.codegen.render import header_defines, runtime_source
    defined = re.findall(r"#define (\w+)|\b(OPK_G_\w+)", "\n".join(abi.c_defines({})))
    defined = [a or b for a, b in defined]
    assert {"OPK_F16", "OPK_BF16", "OPK_CSIZE", "OPK_G_SHAPE", "OPK_F32_OVERFLOW"} <= set(defined)
    for header in Path(templates_dir()).glob("*.h"):
        text = header.read_text()
        for name in defined:
            assert not re.search(rf"#define\s+{name}\b|enum\s*{{[^}}]*\b{name}\b", text), (header.name, name)
    assert all(line in runtime_source(64) for line in header_defines())
    # DESIGN.md §3: half floats compute in float32, small integers in int32, int32 in int64
    assert {d: abi.compute_dtype(d) for d in abi.DTYPE_CODES} == {
        "float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64",
        "int8": "int32", "int16": "int32", "int32": "int64", "int64": "int64"}
    for dt, ct in abi.COMPUTE.items():
        assert ct.size == np.dtype(dt).itemsize
    # the C (and so the cache key) the same whether ml_dtypes, which numbers bfloat16 when it
    # loads, was imported or not: two fresh processes
    pytest.importorskip("ml_dtypes")
    code = "import sys; {}from opkit import abi; sys.stdout.write(chr(10).join(abi.c_defines({{}})))"
    runs = [subprocess.run([sys.executable, "-c", code.format(first)], capture_output=True,
                           text=True, check=True, cwd=str(REPO)).stdout
            for first in ("", "import ml_dtypes; ")]
    assert runs[0] == runs[1] and "OPK_DCODE_OF" in runs[0]
    with np.errstate(over="ignore"):   # (the bound is where float32 rounds to infinity)
        assert float(np.float32(abi.FLOAT32_OVERFLOW)) == np.inf
    assert float(np.float32(np.nextafter(abi.FLOAT32_OVERFLOW, 0))) < np.inf
    assert np.float32(abi.FLOAT32_VANISH) == 0 and np.float32(np.nextafter(abi.FLOAT32_VANISH, 1)) > 0


def test_every_target_table_covers_every_primitive_it_renders():
    """Each target renders from its own table (C: codegen/c_ops.py with per-compute-type
    overrides; TBE: lower/tbe.py; ONNX: onnx/lowering.py): every elementwise primitive has a C
    form and a TBE instruction, every library call a TBE instruction, and an override names only
    primitives the C table has."""
    from opkit.codegen import c_ops
    from opkit.dsl import LIBRARY, PRIMITIVES
    from opkit.lower import tbe
    assert set(PRIMITIVES) <= set(c_ops.C) and set(PRIMITIVES) <= set(tbe.TBE)
    assert set(LIBRARY) <= set(tbe.CALLS)
    for table in c_ops.OVERRIDES.values():
        assert set(table) <= set(c_ops.C)
    assert c_ops.form("abs", "i").text != c_ops.form("abs", "f").text
    assert c_ops.form("erf", "d").scalar and not c_ops.form("erf", "f").scalar
