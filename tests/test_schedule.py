"""The schedule annotation in each generated module tells the truth about what was built: every
element loop it calls vectorized was vectorized by the compiler at that width, and every loop it
calls scalar was not (the compiler's own report, -fopt-info-vec, recorded at build time)."""
import re

import pytest

import opkit
from opkit.builder import toolchain

from conftest import EXAMPLES


def annotations(source: str):
    """{kernel name: the `loop` line of its annotation}."""
    out, current = {}, None
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        m = re.match(r"# kernel (\w+): ", line)
        if m:
            current = m.group(1)
        m = re.match(r"#   loop     (.*)$", line)
        if m and current:
            out[current] = m.group(1)
    return out


def all_ops():
    """(operator, isa) pairs: every operator natively, and portably all but the reductions
    examples (their many variants' kernels are plain elementwise loops; the portable builds would
    cost a minute of the run)."""
    opkit.load(EXAMPLES)
    reductions = EXAMPLES.parent / "reductions"
    opkit.load(reductions)
    native_only = {p.stem for p in reductions.glob("*.yaml")}
    return [(name, isa) for name in opkit.list_ops() for isa in ("native", "portable")
            if isa == "native" or name not in native_only]


@pytest.mark.skipif(toolchain().family != "gcc", reason="the report is GCC's -fopt-info-vec")
@pytest.mark.parametrize("name, isa", all_ops())
def test_annotation_agrees_with_the_compiler(name, isa):
    op = opkit.get(name)
    result = op.build(isa=isa)
    source = result.source_path.read_text()
    loops = annotations(source)
    report = result.meta["vectorization"]
    assert loops and set(report) == {f"{k}_{t}" for k in loops for t in "fdil"
                                     if f"def {k}_{t}(" in source}
    width = toolchain(isa).target.vector_bytes
    for instance, info in report.items():
        said = loops[instance.rsplit("_", 1)[0]]
        if said.startswith("a copy: "):  # vectorized, or a memcpy as the compiler chooses
            assert not info["vectorized"] or info["bytes"] == width, (instance, said, info)
        elif instance.endswith("_l") and "int64 instance: scalar" in said or \
                instance.endswith("_d") and "double instance: scalar" in said:
            assert not info["vectorized"], (instance, said, info)
        elif said.startswith("vectorized"):
            assert said.startswith(f"vectorized, {width}-byte vectors")
            assert info["vectorized"] and info["bytes"] == width, (instance, said, info)
        else:
            assert said.startswith("scalar (calls ")
            assert not info["vectorized"], (instance, said, info)


def test_portable_and_native_widths_differ_where_the_cpu_has_wide_vectors():
    native, portable = toolchain("native").target, toolchain("portable").target
    assert portable.vector_bytes == 16 and native.vector_bytes >= 16
    assert "-march=native" in toolchain("native").cflags
    assert "-DOPKIT_NO_F16C" in toolchain("portable").cflags


def test_show_prints_the_report(capsys):
    from opkit.cli import main
    assert main(["show", "leaky_relu"]) == 0
    out = capsys.readouterr().out
    assert "element loop on float: vectorized" in out and "#   loop     vectorized" in out


ACTIVATIONS = EXAMPLES.parent / "activations"
# every transcendental of the table among them: erfc (gelu), tanh and softplus (mish), expm1
# (selu), sigmoid (silu), log (logsigmoid)
PORTABLE_TOO = ("gelu", "mish", "selu", "silu", "logsigmoid")


@pytest.mark.skipif(toolchain().family != "gcc", reason="the report is GCC's -fopt-info-vec")
@pytest.mark.parametrize("name", sorted(p.stem for p in ACTIVATIONS.glob("*.yaml")))
def test_every_activation_runs_vectorized_float_loops(name):
    """The activations of examples/activations call exp, tanh, erf ... : each element loop of
    their float32 (and float16) instance is vectorized at the target's width, as the annotation
    says (natively, and for the ones that call each transcendental, on the portable baseline)."""
    from opkit.registry import make_op
    op = make_op(ACTIVATIONS / f"{name}.yaml")
    for isa in ("native", "portable") if name in PORTABLE_TOO else ("native",):
        result = op.build(isa=isa)
        loops = annotations(result.source_path.read_text())
        width = toolchain(isa).target.vector_bytes
        floats = {k: v for k, v in result.meta["vectorization"].items() if k.endswith("_f")}
        assert floats and loops
        for instance, info in floats.items():
            assert loops[instance[:-2]].startswith(f"vectorized, {width}-byte vectors"), (isa, instance)
            assert info["vectorized"] and info["bytes"] == width, (isa, instance, info)
