"""Kernel plans → Cython source, rendered from templates/module.pyx.j2.

No text from a declaration reaches the source except identifiers that passed the spec checks and
numbers re-rendered from parsed values; file names are reduced to printable characters and
expressions are re-printed from the graph, never copied.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Dict, List

import jinja2
import numpy as np

from .. import __version__
from .._paths import templates_dir
from ..dsl.graph import OpGraphs
from ..dsl.primitives import PRIMITIVES
from ..lower import Kernel, Lowered, compute_dtype, cost, display, listing, quantized
from ..lower.integer import fixed_point_factor
from ..spec.model import OpSpec
from ..target import Target


@dataclass(frozen=True)
class ComputeType:
    tag: str        # suffix of generated functions
    type: str       # C type
    ptr: str
    cptr: str
    code: str       # storage code of this type (opkit_kernel.h)
    libm: str       # libm suffix: expf vs exp
    storage: str    # the storage dtypes it serves, as a C condition on `dcode`

    @property
    def integer(self) -> bool:
        return self.type.startswith("int")


COMPUTE = {
    "float32": ComputeType("f", "float", "opk_fp", "opk_cfp", "OPK_F32", "f",
                           "dcode == OPK_F32 or dcode == OPK_F16"),
    "float64": ComputeType("d", "double", "opk_dp", "opk_cdp", "OPK_F64", "", "dcode == OPK_F64"),
    "int32": ComputeType("i", "int32_t", "opk_ip", "opk_cip", "OPK_I32", "",
                         "dcode == OPK_I8 or dcode == OPK_I16"),
    "int64": ComputeType("l", "int64_t", "opk_lp", "opk_clp", "OPK_I64", "", "dcode == OPK_I32"),
}
DTYPE_CODES = {"float16": 1, "float32": 2, "float64": 3, "int8": 4, "int16": 5, "int32": 6, "int64": 7}
TAG_CODES = {ct.tag: DTYPE_CODES[dt] for dt, ct in COMPUTE.items()}


def instance_tag(dtype: str) -> str:
    return COMPUTE[compute_dtype(dtype)].tag


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c not in "\"'\\" else "?" for c in text)


def _constant(value, ct: ComputeType) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if ct.integer:
        return f"(<{ct.type}>{int(value)})"
    return f"(<{ct.type}>{_number(value)})"


def _instances(dtypes) -> List[ComputeType]:
    out: List[ComputeType] = []
    for dt in dtypes:
        ct = COMPUTE[compute_dtype(dt)]
        if ct not in out:
            out.append(ct)
    return out


def _operand(arg: str, ct: ComputeType) -> str:
    if arg.startswith("@"):
        return "a_" + arg[1:]
    if arg.startswith("#"):
        text = arg[1:]
        return _constant(True if text == "True" else False if text == "False" else float(text), ct)
    return arg


def _hoisted(kernel: Kernel, ct: ComputeType):
    """The prologue a float instance computes once per call (none for integer instances)."""
    return () if ct.integer else kernel.prologue


def body_lines(kernel: Kernel, ct: ComputeType, file_name: str, clip: bool = False,
               quant: Dict[str, int] = None) -> List[str]:
    lines = []
    hoisted = set(_hoisted(kernel, ct))
    for ins in kernel.body:
        if ins in hoisted:
            continue
        if ins.op == "load":
            lines.append(f"{ins.dst} = p{ins.args[0]}[j]")
            continue
        args = [_operand(a, ct) for a in ins.args]
        where = f"  # {file_name}:{ins.loc.line}" if ins.loc else ""
        k = fixed_point_factor(ins, quant or {}) if ct.integer else None
        if k is not None:  # x * (m / 2**bits): integer multiply, round, arithmetic shift
            bits = quant[ins.args[1 - k][1:]]
            lines.append(f"{ins.dst} = opk_qmul_{ct.tag}({args[k]}, {args[1 - k]}, {bits}){where}")
            continue
        if ct.integer and ins.op == "abs":
            lines.append(f"{ins.dst} = ({args[0]} if {args[0]} >= 0 else -{args[0]}){where}")
            continue
        form = PRIMITIVES[ins.op].cython
        if "{d}" in form:  # statements of their own
            for statement in form.split("\n"):
                lines.append(statement.format(*args, f=ct.libm, d=ins.dst, t=ins.dst + "_t") + where)
            continue
        lines.append(f"{ins.dst} = {form.format(*args, f=ct.libm)}{where}")
    for i, res in enumerate(kernel.results):
        r = _operand(res, ct)
        if clip:  # gradient clipping on store: clamp to [lo, hi], NaN stays NaN (two selects each)
            lines += [f"c{i} = ({r} if {r} >= lo{i} else lo{i})", f"c{i} = ({r} if {r} != {r} else c{i})",
                      f"d{i} = (c{i} if c{i} <= hi{i} else hi{i})", f"q{i}[j] = (c{i} if c{i} != c{i} else d{i})"]
        else:
            lines.append(f"q{i}[j] = {r}")
    return lines


_DOUBLE = COMPUTE["float64"]


def _prologue_operand(arg: str) -> str:
    if arg.startswith("@"):
        return "attr_" + arg[1:]
    if arg.startswith("#"):
        return _operand(arg, _DOUBLE)
    return "sv_" + arg


def init_context(kernel: Kernel, spec: OpSpec, ct: ComputeType, quant: Dict[str, int]) -> Dict:
    """The kernel context's initialization from the call's attrs: attr fields rounded to the
    compute type, prologue steps computed in double first, and the values whose rounding to
    float would overflow (or, for a nonzero attr, vanish): the runtime refuses those calls
    (runtime/scalars.py applies the same rule before anything runs)."""
    hoisted = _hoisted(kernel, ct)
    crossing = kernel.prologue_results if hoisted else ()
    lines, stores, temps, checks = [], [], [], []
    for ins in hoisted:
        args = [_prologue_operand(a) for a in ins.args]
        d = "sv_" + ins.dst
        temps.append(("bint" if ins.kind == "bool" else "double", d))
        form = PRIMITIVES[ins.op].cython
        if "{d}" in form:
            temps.append(("double", d + "_t"))
            lines += [st.format(*args, f="", d=d, t=d + "_t") for st in form.split("\n")]
        else:
            lines.append(f"{d} = {form.format(*args, f='')}")
        if ins.dst not in crossing:
            continue
        cast = "" if ins.kind == "bool" else f"<{ct.type}>"
        stores.append(f"ctx.s_{ins.dst} = {cast}{d}")
        if ct.tag == "f" and ins.kind == "float":
            checks.append(f"opk_overflows_f({d})")
    if ct.tag == "f":
        checks = [f"opk_overflows_f(attr_{a}) or opk_vanishes_f(attr_{a})"
                  for a in kernel.loop_attrs if spec.attr(a).type == "float"] + checks
    # checked before any rounding, so no conversion is ever out of range
    stores = [f"ctx.a_{name} = {init}" for _, name, init in _loop_fields(kernel, spec, ct, quant)]\
        + stores
    return {"temps": temps, "lines": lines, "checks": checks, "stores": stores,
            "fields": [("bint" if i.kind == "bool" else ct.type, "s_" + i.dst) for i in hoisted
                       if i.dst in crossing],
            "loads": [f"{d} = ctx.s_{d}" for d in crossing]}


def _schedule_text(kernel: Kernel) -> str:
    s = kernel.schedule
    threads = f"up to {s.max_threads}" if s.max_threads else "all"
    return (f"tile {s.tile} elements; 1 thread below {s.parallel_threshold} elements, {threads} "
            f"threads above (static split of the flat range); {s.vector_bytes}-byte vectors "
            f"({s.lanes(4)} x float32, {s.lanes(8)} x float64); isa {s.isa}")


def loop_text(kernel: Kernel, instances: List[ComputeType], features) -> str:
    """What the element loop compiles to; tests compare it with the compiler's report."""
    calls = kernel.scalar_calls
    if calls:
        return (f"scalar (calls {', '.join(calls)}: libm functions the C compiler does not "
                "vectorize without -ffast-math)")
    text = f"vectorized, {kernel.schedule.vector_bytes}-byte vectors"
    # GCC multiplies 64-bit lanes with AVX-512DQ, or emulates it from 32-bit multiplies with
    # AVX2 / AVX-512F; the baseline SSE2 target keeps that loop scalar
    if any(ct.tag == "l" for ct in instances) and \
            not {"avx2", "avx512f", "avx512dq"} & set(features) and \
            any(i.op == "mul" for i in kernel.body):
        text += "; int64 instance: scalar (a 64-bit vector multiply needs AVX2 or AVX-512)"
    return text


def _passes(graphs: OpGraphs) -> List[str]:
    out = ["forward:"] + ["  " + line for line in graphs.forward.format().splitlines()]
    if graphs.differentiable:
        how = "declared, checked against the derivation" if graphs.declared else "derived"
        out += [f"backward ({how}):"]
        out += ["  " + line for line in graphs.backward.format().splitlines()]
    return out


def _attr_fields(kernel: Kernel, spec: OpSpec, ct: ComputeType, quant: Dict[str, int]):
    """(C type, name, initial value from the Python argument attr_<name>) per attr the body
    uses; an integer instance takes a quantized attr as its multiplier m."""
    fields = []
    for name in kernel.attrs:
        a = spec.attr(name)
        if a.type == "bool":
            fields.append(("bint", name, f"attr_{name}"))
        elif ct.integer and name in quant:
            fields.append((ct.type, name, f"<{ct.type}>lrint(attr_{name} * {float(1 << quant[name])!r})"))
        else:
            fields.append((ct.type, name, f"<{ct.type}>attr_{name}"))
    return fields


def _loop_fields(kernel: Kernel, spec: OpSpec, ct: ComputeType, quant: Dict[str, int]):
    """The attr fields of the context: those the element loop reads (float instances read
    the others only through the prologue)."""
    loop = kernel.loop_attrs if _hoisted(kernel, ct) else kernel.attrs
    return [f for f in _attr_fields(kernel, spec, ct, quant) if f[1] in loop]


def kernel_context(kernel: Kernel, role: str, spec: OpSpec, file_name: str,
                   clip: bool = False, features=()) -> Dict:
    quant = quantized(spec)
    dtypes = spec.float_dtypes if role.startswith("backward") else spec.dtypes
    instances = _instances(dtypes)
    floats = [i.dst for i in kernel.body if i.kind == "float"]
    floats += [i.dst + "_t" for i in kernel.body if i.op in PRIMITIVES and "{t}" in PRIMITIVES[i.op].cython]
    if clip:
        floats += [f"{v}{i}" for i in range(len(kernel.outputs)) for v in ("c", "d")]
    bools = [i.dst for i in kernel.body if i.kind == "bool"]
    return {
        "name": kernel.name,
        "role": role,
        "lines": sorted({loc.line for loc in kernel.locs}),
        "reads": [display(v) for v in kernel.inputs],
        "writes": [display(v) for v in kernel.outputs],
        "schedule": _schedule_text(kernel),
        "loop": loop_text(kernel, instances, features),
        "dtypes": [{"name": dt, "cost": str(cost(kernel, dt)), "listing": listing(kernel, dt, quant)}
                   for dt in dtypes],
        "instances": instances,
        "attrs": [spec.attr(a) for a in kernel.attrs],
        "n_in": len(kernel.inputs),
        "n_out": len(kernel.outputs),
        "n_ops": len(kernel.operands),
        "tile": kernel.schedule.tile,
        "float_vars": floats,
        "bool_vars": bools,
        "body": {ct.tag: body_lines(kernel, ct, file_name, clip and not ct.integer, quant)
                 for ct in instances},
        "fields": {ct.tag: _loop_fields(kernel, spec, ct, quant) for ct in instances},
        "init": {ct.tag: init_context(kernel, spec, ct, quant) for ct in instances},
        "clip": clip,
        "rows": _row_variants(kernel, instances, file_name, clip, quant),
    }


def _row_variants(kernel: Kernel, instances, file_name: str, clip: bool, quant) -> Dict:
    """For kernels of up to 3 inputs: one 2-D row loop per set of inputs that hold one value
    per row (a per-pixel slope over NHWC channels), taking those as scalars."""
    n_in = len(kernel.inputs)
    if not 1 <= n_in <= 3 or len(kernel.outputs) > 4:
        return {}
    variants = {}
    for mask in range(1, 1 << n_in):
        scalars = [i for i in range(n_in) if mask >> i & 1]
        body = {}
        for ct in instances:
            lines = body_lines(kernel, ct, file_name, clip and not ct.integer, quant)
            for i in scalars:
                lines = [re.sub(rf"^(v\d+) = p{i}\[j\]$", rf"\1 = s{i}", line) for line in lines]
            body[ct.tag] = lines
        variants[mask] = {"scalars": scalars, "body": body}
    return variants


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def template_digest() -> str:
    """sha256 over every template file: part of the build cache key."""
    h = hashlib.sha256()
    for p in sorted(templates_dir().iterdir()):
        if p.is_file() and p.suffix in (".j2", ".h"):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


# NumPy's type numbers (its C ABI; the NumPy version is part of the build cache key)
_NPY = {dt: (np.dtype(dt).num, f"OPK_{code}") for dt, code in
        (("float16", "F16"), ("float32", "F32"), ("float64", "F64"), ("int8", "I8"), ("int16", "I16"),
         ("int32", "I32"))}


def _number(value: float) -> str:
    """A Python/Cython literal for a parsed number (never text from the declaration)."""
    if value != value:
        return "NAN"
    if value in (float("inf"), float("-inf")):
        return "INFINITY" if value > 0 else "-INFINITY"
    text = repr(float(value))
    assert re.fullmatch(r"-?[0-9.e+-]+", text), text
    return text


def _attr_checks(a) -> List[str]:
    checks = []
    if a.range is not None:
        if a.range.low != float("-inf") or a.range.low_open:
            checks.append(f"{'>' if a.range.low_open else '>='} {_number(a.range.low)}")
        if a.range.high != float("inf") or a.range.high_open:
            checks.append(f"{'<' if a.range.high_open else '<='} {_number(a.range.high)}")
    if a.type == "float":
        checks.append("== x_" + a.name)  # not NaN
    if a.quantize is not None:  # its fixed-point multiplier fits 16 bits (opkit.quantize):
        # |round(v * 2**bits)| <= 32767, with 32767.5 itself rounding (to even) past it
        checks.append(f"* {float(1 << a.quantize)!r} < 32767.5")
        checks.append(f"* {float(1 << a.quantize)!r} > -32767.5")
    return checks


def fast_context(spec: OpSpec, lowered: Lowered) -> Dict:
    """What the direct call needs, or None when the forward pass is not one plain kernel over
    layout-agnostic inputs (those calls always take the checked path)."""
    steps = lowered.forward.steps
    if len(steps) != 1 or not isinstance(steps[0], Kernel):
        return None
    k = steps[0]
    if not all(v.startswith("in:") for v in k.inputs) or not all(v.startswith("out:") for v in k.outputs):
        return None
    if spec.layouts[0] != "ND" or any(i.shape or (i.layouts_declared and "ND" not in i.layouts)
                                       for i in spec.inputs):
        return None
    ins, outs = list(spec.input_names), list(spec.output_names)
    attrs = []
    for a in spec.attrs:
        default = None if a.required else ("True" if a.default is True else "False" if a.default is False
                                           else "None" if a.default is None else _number(a.default))
        attrs.append({"name": a.name, "type": a.type, "required": a.required, "default": default,
                      "nullable": a.nullable,
                      "null_means": _number(a.null_means) if a.nullable else None,
                      "checks": _attr_checks(a) if a.type != "bool" else []})
    instances = _instances(spec.dtypes)
    quant = quantized(spec)
    inplace = tuple(ins.index(i) for o, i in spec.schedule.inplace) if len(outs) == 1 else ()
    return {
        "kernel": k.name, "n_inputs": len(ins), "n_outputs": len(outs), "n_in": len(k.inputs),
        "n_ops": len(k.operands), "attrs": attrs,
        "kernel_inputs": [ins.index(v[3:]) for v in k.inputs],
        "kernel_outputs": [outs.index(v[4:]) for v in k.outputs],
        "kernel_attrs": list(k.attrs),
        "fields": {ct.tag: _attr_fields(k, spec, ct, quant) for ct in instances},
        "dtypes": [{"npy": _NPY[dt][0], "code": _NPY[dt][1]} for dt in spec.dtypes],
        "instances": instances, "inplace": repr(inplace),
        "threshold": k.schedule.parallel_threshold, "max_threads": k.schedule.max_threads,
    }


def render(spec: OpSpec, graphs: OpGraphs, lowered: Lowered, target: Target) -> str:
    """The Cython source of the operator's kernel module."""
    file_name = _printable(os.path.basename(spec.file))
    kernels = []
    for plan in (lowered.forward, lowered.backward):
        if plan is None:
            continue
        for k in plan.kernels:
            role = f"{plan.kind}, writes {', '.join(display(v) for v in k.outputs)}"
            kernels.append(kernel_context(k, role, spec, file_name, clip=plan.kind == "backward",
                                          features=target.features))
    op = {"name": spec.name, "file": _printable(spec.file), "file_name": file_name,
          "dtypes": spec.dtypes, "passes": _passes(graphs)}
    return _environment().get_template("module.pyx.j2").render(
        version=__version__, op=op, target=_printable(target.describe()), kernels=kernels,
        fast=fast_context(spec, lowered))
