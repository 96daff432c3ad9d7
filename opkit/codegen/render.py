"""Kernel plans → Cython source, rendered from templates/module.pyx.j2.

No text from a declaration reaches the source except identifiers that passed the spec checks and
numbers re-rendered from parsed values; file names are reduced to printable characters and
expressions are re-printed from the graph, never copied. The target (vector width, CPU
features) enters here: the plans themselves do not depend on the machine.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, cast

from .._paths import templates_dir
from ..abi import COMPUTE, DTYPE_CODES, ComputeType, ConvProblem, c_defines
from .._version import __version__
from ..dsl.graph import OpGraphs
from ..dsl.variants import Variant
from .c_ops import C as C_OPS, LIBM, MATH_FUNCTIONS, declaration, form as c_form, scalar_calls
from ..backend import gemm
from .gemm import GEMM_TABLES, gemm_declarations, gemm_definitions
from ..lower import (LOAD, Attr, Const, Fused, Instr, Kernel, Kind, LibCall, Lowered, Reg,
                     Schedule, compute_dtype, cost, listing, quantized)
from ..lower.plan import Step
from ..lower.fuse import MAX_OPERANDS
from ..lower.reduce import COMPILED_REDUCTIONS, LANE_BYTES, MAX_SUMS, SUM_CHUNK
from ..lower.integer import fixed_point_factor
from ..quantize import M_LIMIT
from ..spec.model import DtypeLimit, OpSpec
from ..target import Target
from ..kinds import AttrType, Layout, Op, Pass, ValueKind


_DOUBLE = COMPUTE["float64"]
_COMPARE_C = {"==": "==", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


def instance_tag(dtype: str) -> str:
    return COMPUTE[compute_dtype(dtype)].tag


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c not in "\"'\\" else "?" for c in text)


def _number(value: float) -> str:
    """A Python/Cython literal for a parsed number (never text from the declaration)."""
    if value != value:
        return "NAN"
    if value in (float("inf"), float("-inf")):
        return "INFINITY" if value > 0 else "-INFINITY"
    text = repr(float(value))
    assert re.fullmatch(r"-?[0-9.e+-]+", text), text
    return text


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


# ------------------------------------------------------------------------------ element loops

def cname(attr: str) -> str:
    """An attr's name in generated code. The dtype limits (`finfo.max`) become `_finfo_max`:
    declared names start with a letter, so `a_<name>` never meets `a__finfo_max`."""
    return "_finfo_" + attr[6:] if attr.startswith("finfo.") else attr


@dataclass(frozen=True)
class AttrDecl:
    """An attr as the generated functions take it."""

    name: str       # its name in generated code
    type: str       # float | int | bool


def _decls(spec: OpSpec, attrs) -> List[AttrDecl]:
    return [AttrDecl(cname(a), spec.attr_type(a)) for a in attrs]


def _operand(arg, ct: ComputeType) -> str:
    """An operand in the element loop: a register, an attr field, a constant."""
    if isinstance(arg, Attr):
        return "a_" + cname(arg.name)
    if isinstance(arg, Const):
        return _constant(arg.value, ct)
    return str(arg)


def _never_nan(arg, made: Dict) -> bool:
    """A value that cannot be NaN: a number, an attr (every call's float attr is checked not
    to be NaN), or a negation or absolute value of one computed once per call."""
    if isinstance(arg, Const):
        return arg.value == arg.value
    if isinstance(arg, Attr):
        return True
    ins = made.get(arg)
    return ins is not None and ins.op in (Op.NEG, Op.ABS) and _never_nan(ins.args[0], made)


def _statements(ins: Instr, args: Sequence[str], ct: ComputeType, dst: str,
                prologue: Optional[Dict] = None) -> List[str]:
    """The Cython statements that compute one primitive into `dst` in compute type `ct`, as
    the C table writes it (c_ops.py); `prologue` (the values computed once per call, by
    register) tells which bounds cannot be NaN (then the primitive's `bounded` form)."""
    cf = c_form(ins.op, ct.tag)
    form = cf.text
    if cf.bounded and prologue is not None and all(_never_nan(b, prologue) for b in ins.args[1:]):
        form = cf.bounded
    if "{d}" in form:  # statements of their own, with a temporary {t}
        return [st.format(*args, f=ct.libm, d=dst, t=dst + "_t") for st in form.split("\n")]
    return [f"{dst} = {form.format(*args, f=ct.libm)}"]


def _select(cond, x: str, y: str, made: Dict, ct: ComputeType, depth: int = 8) -> str:
    """`x if cond else y`, with a condition built from &, | and ~ in the same loop spelled as
    nested selects: GCC vectorizes those, while a select on a value such as `a & b` of two
    comparisons can keep a whole loop scalar."""
    ins = made.get(cond)
    if depth and ins is not None and ins.op in (Op.AND, Op.OR, Op.NOT):
        a = ins.args[0]
        if ins.op == Op.NOT:
            return _select(a, y, x, made, ct, depth - 1)
        b = ins.args[1]
        if ins.op == Op.AND:
            return _select(a, _select(b, x, y, made, ct, depth - 1), y, made, ct, depth - 1)
        return _select(a, x, _select(b, x, y, made, ct, depth - 1), made, ct, depth - 1)
    return f"({x} if {_operand(cond, ct)} else {y})"


def _hoisted(kernel: Kernel, ct: ComputeType):
    """The prologue a float instance computes once per call (none for integer instances)."""
    return () if ct.integer else kernel.prologue


def body_lines(kernel: Kernel, ct: ComputeType, file_name: str, clip: bool = False,
               quant: Optional[Dict[str, int]] = None, scalars: Sequence[int] = ()) -> List[str]:
    """The element loop's body; inputs in `scalars` are one value per row (s<slot>)."""
    quant = quant or {}
    lines = []
    hoisted = set(_hoisted(kernel, ct))
    once = {i.dst: i for i in hoisted}  # what the prologue computes, by register
    for ins in kernel.body:
        if ins in hoisted:
            continue
        if ins.op == LOAD:
            src = f"s{ins.slot}" if ins.slot in scalars else f"p{ins.slot}[j]"
            lines.append(f"{ins.dst} = {src}")
            continue
        args = [_operand(a, ct) for a in ins.args]
        where = f"  # {file_name}:{ins.loc.line}" if ins.loc else ""
        k = fixed_point_factor(ins, quant) if ct.integer else None
        if k is not None:  # x * (m / 2**bits): integer multiply, round, arithmetic shift
            factor = ins.args[1 - k]
            assert isinstance(factor, Attr)   # (fixed_point_factor finds a quantized attr)
            bits = quant[factor.name]
            lines.append(f"{ins.dst} = opk_qmul_{ct.tag}({args[k]}, {args[1 - k]}, {bits}){where}")
        elif ins.op == Op.WHERE and isinstance(ins.args[0], Reg):
            made = {i.dst: i for i in kernel.body if i not in hoisted}
            lines.append(f"{ins.dst} = {_select(ins.args[0], args[1], args[2], made, ct)}{where}")
        else:
            lines += [line + where for line in _statements(ins, args, ct, str(ins.dst), once)]
    for i, res in enumerate(kernel.results):
        r = _operand(res, ct)
        if clip:
            # gradient clipping on store: clamp to [lo, hi] (never NaN), one select each. An
            # ordered comparison is false for NaN, so NaN stays NaN; gcc compiles each select
            # to one max or min (tests of x != x made it a chain of a dozen ops per vector)
            lines += [f"c{i} = (lo{i} if {r} < lo{i} else {r})", f"q{i}[j] = (hi{i} if c{i} > hi{i} else c{i})"]
        else:
            lines.append(f"q{i}[j] = {r}")
    return lines


# ------------------------------------------------------------------------------ the context

def _attr_fields(kernel: Kernel, spec: OpSpec, ct: ComputeType, quant: Dict[str, int]):
    """(C type, name, initial value from the argument attr_<name>) per attr the element loop
    reads (float instances read the others only through the prologue); an integer instance
    takes a quantized attr as its multiplier m."""
    fields = []
    for name in (kernel.attrs if not _hoisted(kernel, ct) else kernel.loop_attrs):
        c = cname(name)
        if spec.attr_type(name) == AttrType.BOOL:
            fields.append(("bint", c, f"attr_{c}"))
        elif ct.integer and name in quant:
            fields.append((ct.type, c, f"<{ct.type}>lrint(attr_{c} * {float(1 << quant[name])!r})"))
        else:
            fields.append((ct.type, c, f"<{ct.type}>attr_{c}"))
    return fields


def _prologue_operand(arg) -> str:
    if isinstance(arg, Attr):
        return "attr_" + cname(arg.name)
    if isinstance(arg, Const):
        return _constant(arg.value, _DOUBLE)
    return f"s_{arg}"


def init_context(kernel: Kernel, spec: OpSpec, ct: ComputeType, quant: Dict[str, int],
                 clip: bool = False) -> Dict:
    """The kernel context's initialization from the call's attrs: the prologue computed in
    double, the values whose rounding to float would overflow (or, for a nonzero attr, vanish)
    refused, then everything rounded once to the compute type. runtime/scalars.py applies the
    same rule to the checked call before anything runs."""
    hoisted = _hoisted(kernel, ct)
    crossing = kernel.prologue_results if hoisted else ()
    fields = _attr_fields(kernel, spec, ct, quant)
    lines, temps, checks = [], [], []
    for ins in hoisted:
        d = f"s_{ins.dst}"
        temps.append(("bint" if ins.kind == ValueKind.BOOL else "double", d))
        if _uses_temp(ins.op):
            temps.append(("double", d + "_t"))
        lines += _statements(ins, [_prologue_operand(a) for a in ins.args], _DOUBLE, d)
    if ct.tag == "f":
        checks = [f"opk_overflows_f(attr_{cname(a)}) or opk_vanishes_f(attr_{cname(a)})"
                  for a in kernel.loop_attrs if spec.attr_type(a) == AttrType.FLOAT]
        checks += [f"opk_overflows_f(s_{r})" for r in crossing
                   if next(i for i in hoisted if i.dst == r).kind == ValueKind.FLOAT]
    stores = [f"ctx.a_{name} = {init}" for _, name, init in fields]
    stores += [f"ctx.s_{r} = {'' if _kind(hoisted, r) == ValueKind.BOOL else f'<{ct.type}>'}s_{r}"
               for r in crossing]
    return {"temps": temps, "lines": lines, "checks": checks, "stores": stores,
            "fields": [(ctype, f"a_{name}") for ctype, name, _ in fields]
            + [("bint" if _kind(hoisted, r) == ValueKind.BOOL else ct.type, f"s_{r}") for r in crossing],
            "locals": [f"cdef {ctype} a_{name} = ctx.a_{name}" for ctype, name, _ in fields]
            + [f"cdef {ct.type} lo{i} = ctx.lo[{i}], hi{i} = ctx.hi[{i}]"
               for i in range(len(kernel.outputs)) if clip],
            "loads": [f"{r} = ctx.s_{r}" for r in crossing]}


def _uses_temp(op: str) -> bool:
    """Whether a primitive's C form needs a temporary ({t}) in either compute type."""
    return op in C_OPS and any("{t}" in c_form(op, tag).text for tag in ("f", "d"))


def _kind(instrs, reg: Reg) -> ValueKind:
    return next(i.kind for i in instrs if i.dst == reg)


# ------------------------------------------------------------------------------ annotations

def _schedule_text(schedule: Schedule, target: Target) -> str:
    threads = f"up to {schedule.max_threads}" if schedule.max_threads else "all"
    lanes = lambda size: max(target.vector_bytes // size, 1)  # noqa: E731
    return (f"tile {schedule.tile} elements; 1 thread below {schedule.parallel_threshold} "
            f"elements, {threads} threads above (static split of the flat range); "
            f"{target.vector_bytes}-byte vectors ({lanes(4)} x float32, {lanes(8)} x float64); "
            f"isa {target.isa}")


def loop_text(kernel: Kernel, instances: List[ComputeType], target: Target) -> str:
    """What the element loop compiles to; tests compare it with the compiler's report."""
    floats = [ct for ct in instances if not ct.integer]
    calls = {ct.tag: scalar_calls(kernel.ops, ct.tag, target.features) for ct in floats}
    if floats and all(calls[ct.tag] for ct in floats):
        names = sorted({c for ct in floats for c in calls[ct.tag]})
        return (f"scalar (calls {', '.join(names)}: functions the C compiler does not "
                "vectorize for this target without -ffast-math)")
    if all(i.op == LOAD for i in kernel.body):
        # values a folded sum adds up as they are (a sum of an input): the compiler may turn
        # the plain copy into a call of memcpy instead of vectorizing it
        return f"a copy: vectorized, {target.vector_bytes}-byte vectors, or a call of memcpy"
    text = f"vectorized, {target.vector_bytes}-byte vectors"
    for ct in floats:  # float64 keeps libm for the functions opkit_math.h has no vector form of
        if calls[ct.tag]:
            text += (f"; {ct.type} instance: scalar (calls {', '.join(calls[ct.tag])}: libm, "
                     "no vector form)")
    # GCC multiplies 64-bit lanes with AVX-512DQ, or emulates it from 32-bit multiplies with
    # AVX2 / AVX-512F; the baseline SSE2 target keeps that loop scalar
    if any(ct.tag == "l" for ct in instances) and \
            not {"avx2", "avx512f", "avx512dq"} & set(target.features) and \
            any(i.op == Op.MUL for i in kernel.body):
        text += "; int64 instance: scalar (a 64-bit vector multiply needs AVX2 or AVX-512)"
    return text


def _passes(graphs: OpGraphs) -> List[str]:
    out = ["forward:"] + ["  " + line for line in graphs.forward.format().splitlines()]
    if graphs.differentiable:
        how = "declared, checked against the derivation" if graphs.declared else "derived"
        out += [f"backward ({how}):"]
        out += ["  " + line for line in graphs.backward.format().splitlines()]
    return out


# ------------------------------------------------------------------------------ kernels

def _per_row_candidates(kernel: Kernel, spec: OpSpec) -> List[int]:
    """Slots of the inputs that may hold one value per row of the iteration space: not the
    input the outputs take their shape from, nor an output gradient (both run the full shape);
    the row loops take such inputs as scalars."""
    full = {o.like for o in spec.outputs if o.like} | {"d" + o.name for o in spec.outputs}
    return [i for i, v in enumerate(kernel.inputs)
            if not (v.kind is Kind.INPUT and v.name in full)]


def _row_variants(kernel: Kernel, spec: OpSpec, instances, file_name: str, clip: bool,
                  quant) -> Dict:
    """One 2-D row loop per set of per-row inputs: every such set where at most three inputs
    may be per-row (a per-pixel slope over NHWC channels), else the sets a layout makes per-row,
    those lacking the walk's innermost dim D, for each dim D (per-pixel statistics over NHWC's
    channels beside a per-channel weight; the weight over NCHW's rows)."""
    slots = _per_row_candidates(kernel, spec)
    if not slots or len(kernel.outputs) > 4:
        return {}
    if len(slots) <= 3:
        picks = [[s for i, s in enumerate(slots) if pick >> i & 1]
                 for pick in range(1, 1 << len(slots))]
    else:
        picks = []
        for d in kernel.dims or ():
            pick = [s for s in slots if (dims := kernel.in_dims[s]) is not None and d not in dims]
            if pick and pick not in picks:
                picks.append(pick)
    variants = {}
    for scalars in picks:
        variants[sum(1 << s for s in scalars)] = {
            "scalars": scalars,
            "body": {ct.tag: body_lines(kernel, ct, file_name, clip and not ct.integer, quant,
                                        scalars) for ct in instances}}
    return variants


def _listings(kernel: Kernel, dtypes: Sequence[str], target: Target, quant) -> List[Dict]:
    """Per dtype its cost and listing; `same`: an earlier dtype whose listing it is (float64's
    is often float32's), written once."""
    out: List[Dict] = []
    for dt in dtypes:
        lines = listing(kernel, dt, quant)
        same = next((o["name"] for o in out if o["listing"] == lines), None)
        out.append({"name": dt, "cost": str(cost(kernel, dt, target.vector_bytes)),
                    "listing": lines, "same": same})
    return out


def kernel_context(kernel: Kernel, role: str, spec: OpSpec, schedule: Schedule, file_name: str,
                   target: Target, pass_: Pass, clip: bool = False) -> Dict:
    quant = quantized(spec)
    dtypes = spec.float_dtypes if pass_ is Pass.BACKWARD else spec.dtypes
    instances = _instances(dtypes)
    floats = [str(i.dst) for i in kernel.body if i.kind == ValueKind.FLOAT]
    floats += [f"{i.dst}_t" for i in kernel.body if _uses_temp(i.op)]
    if clip:
        floats += [f"c{i}" for i in range(len(kernel.outputs))]
    rows = _row_variants(kernel, spec, instances, file_name, clip, quant)
    return {
        "name": kernel.name,
        "role": role,
        "lines": sorted({loc.line for loc in kernel.locs}),
        "reads": [str(v) for v in kernel.inputs],
        "writes": [str(v) for v in kernel.outputs],
        "schedule": _schedule_text(schedule, target),
        "loop": loop_text(kernel, instances, target),
        "dtypes": _listings(kernel, dtypes, target, quant),
        "instances": instances,
        "attrs": _decls(spec, kernel.attrs),
        "n_in": len(kernel.inputs),
        # the inputs a float16 call passes as floats: its temps, in the compute type
        "float_inputs": sum(1 << i for i, v in enumerate(kernel.inputs) if v.kind is Kind.TEMP),
        "n_out": len(kernel.outputs),
        "tile": schedule.tile,
        "threshold": {ct.tag: schedule.threshold(ct.size) for ct in instances},
        "max_threads": schedule.max_threads or 0,
        "float_vars": floats,
        "bool_vars": [str(i.dst) for i in kernel.body if i.kind == ValueKind.BOOL],
        "body": {ct.tag: body_lines(kernel, ct, file_name, clip and not ct.integer, quant)
                 for ct in instances},
        # the float16 loops' element loop (float compute) without the clip: they clamp blocks
        "body_free": body_lines(kernel, COMPUTE["float32"], file_name, False, quant) if clip else [],
        "init": {ct.tag: init_context(kernel, spec, ct, quant, clip and not ct.integer)
                 for ct in instances},
        "clip": clip,
        "rows": rows,
        # sums folded into its pass (the runtime passes them only to such a kernel): the float
        # loop that adds them up (htile_f) and the entry's sum arguments
        "sums": bool(kernel.sums),
    }


# ------------------------------------------------------------------------------ the direct call

def _attr_checks(a) -> List[str]:
    """The direct call's tests of an attr: the declaration's conditions (the same the checked
    call applies), and, for a quantized attr, that its fixed-point multiplier fits 16 bits
    (|round(v * 2**bits)| <= M_LIMIT: from M_LIMIT + 0.5 on, v rounds past it); calls that fail
    take the checked path."""
    checks = [f"{_COMPARE_C[op]} {'x_' + a.name if bound is None else _number(bound)}"
              for op, bound in a.conditions()]
    if a.quantize is not None:
        limit = (M_LIMIT + 0.5) / (1 << a.quantize)
        checks += [f"< {_number(limit)}", f"> {_number(-limit)}"]
    return checks


def _direct_kernel(plan) -> Optional[Tuple[Kernel, List[str]]]:
    """(the pass's one kernel, the names of the results it writes), when that kernel is all the
    pass does on same-shape arrays: it reads the pass's inputs and writes its outputs. A sum_to
    folded into it (a gradient reduced to its input's shape) is the identity there."""
    steps: Tuple[Step, ...] = plan.steps if plan is not None else ()
    if len(steps) != 1 or not isinstance(steps[0], Kernel):
        return None
    k = steps[0]
    if not all(v.kind is Kind.INPUT for v in k.inputs):
        return None
    if any(a.startswith("finfo.") for a in k.attrs):
        return None  # the dtype limits come with the call's dtype: the checked path passes them
    reduced = {}
    for s in k.sums:
        if s.prim != Op.SUM_TO or len(s.args) != 1 or s.result.kind is not Kind.OUTPUT:
            return None
        reduced[s.args[0]] = s.result.name
    names = []
    for v in k.outputs:
        if v.kind is Kind.OUTPUT:
            names.append(v.name)
        elif v in reduced:
            names.append(reduced.pop(v))
        else:
            return None
    return (k, names) if not reduced else None


def _direct_attrs(spec: OpSpec) -> List[Dict]:
    attrs = []
    for a in spec.attrs:
        if a.type == AttrType.STR:
            continue  # a str attr picks the variant, and so the direct call (runtime/op.py)
        # a `finfo.max` default follows the call's dtype: the checked path resolves it
        by_dtype = isinstance(a.default, DtypeLimit)
        default = None if a.required or by_dtype else (
            "True" if a.default is True else "False" if a.default is False
            else "None" if a.default is None else _number(cast(float, a.default)))
        attrs.append({"name": a.name, "type": a.type, "required": a.required or by_dtype,
                      "default": default,
                      "nullable": a.nullable,
                      "null_means": _number(cast(float, a.null_means)) if a.nullable else None,
                      "checks": _attr_checks(a) if a.type != AttrType.BOOL else []})
    return attrs


def fast_contexts(spec: OpSpec, lowered: Lowered, kernels: Sequence[Dict],
                  variant: Optional[Variant] = None) -> List[Dict]:
    """What the direct calls need: `fast_forward` when the forward pass is one plain kernel over
    layout-agnostic inputs, `fast_backward` when the backward pass is too (and gives every
    differentiable input its gradient). Other calls always take the checked path. `variant`:
    the one these are for, in a module of several (an operator with str attrs has a pair per
    variant, named by `Variant.direct`)."""
    def named(fn: str) -> str:
        return variant.direct(fn) if variant is not None else fn
    if any(i.optional for i in spec.inputs):
        return []
    if spec.layouts[0] != Layout.ND or any(i.shape or (i.layouts_declared and Layout.ND not in i.layouts)
                                       for i in spec.inputs):
        return []
    ins, outs = list(spec.input_names), list(spec.output_names)
    common = {
        "attrs": _direct_attrs(spec),
        # the dtype codes of the dtypes it takes (bit <code>; opk_dcode maps NumPy's, and
        # bfloat16's calls take the checked path)
        "codes": sum(1 << DTYPE_CODES[dt] for dt in spec.dtypes if dt != "bfloat16"),
    }
    directs = []
    found = _direct_kernel(lowered.forward)
    if found is not None:
        k, written = found
        # the inputs out= may be (bit i: input i itself), where the op computes in place
        inplace = sum(1 << ins.index(i) for o, i in spec.schedule.inplace) if len(outs) == 1 else 0
        directs.append(dict(
            common, fn=named("fast_forward"), kernel=next(c for c in kernels if c["name"] == k.name),
            # out=: the one output's array (an op with more outputs takes none)
            n_inputs=len(ins), n_outputs=len(outs), takes_out=len(outs) == 1, inplace=inplace,
            grad_out=None,
            kernel_inputs=[ins.index(v.name) for v in k.inputs],
            kernel_outputs=[outs.index(v) for v in written], kernel_attrs=list(k.attrs),
            returns="outputs"))
    found = _direct_kernel(lowered.backward)
    grads = [f"d{i.name}" for i in spec.inputs if i.differentiable]
    if found is not None and len(outs) == 1 and sorted(found[1]) == sorted(grads):
        k, written = found
        # backward(dy, *inputs): one gradient per input, None where it takes none
        args = [f"d{outs[0]}"] + ins
        per_input = [f"outputs[{grads.index('d' + i)}]" if "d" + i in grads else "None" for i in ins]
        grad_out = [grads.index("d" + i) if "d" + i in grads else None for i in ins]
        directs.append(dict(
            common, fn=named("fast_backward"), kernel=next(c for c in kernels if c["name"] == k.name),
            n_inputs=len(args), n_outputs=len(grads), takes_out=False, inplace=0,
            # out=: per input, the gradient its entry receives (None: it must be None); the
            # gradients follow the inputs' order, so the inputs that take one say which
            grad_out=grad_out, grad_mask=sum(1 << j for j, g in enumerate(grad_out) if g is not None),
            kernel_inputs=[args.index(v.name) for v in k.inputs],
            kernel_outputs=[grads.index(v) for v in written], kernel_attrs=list(k.attrs),
            returns="(" + ", ".join(per_input) + ",)"))
    return directs


# ------------------------------------------------------------------------------ the module

@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2  # only rendering needs it (a call whose module is built does not)
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False, trim_blocks=True, lstrip_blocks=True)


def template_digest() -> str:
    """sha256 over every template file: part of the build cache key."""
    h = hashlib.sha256()
    for p in sorted(templates_dir().iterdir()):
        if p.is_file() and p.suffix in (".j2", ".h", ".pxd"):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def render(spec: OpSpec, graphs: OpGraphs, lowered: Lowered, target: Target,
           others: Sequence = ()) -> str:
    """The Cython source of the operator's kernel module for `target`. `others` are the
    (variant, graphs, lowered) of the operator's other variants (str attrs' choices, optional
    inputs given or not): their kernels join the module under names of their own."""
    file_name = _printable(os.path.basename(spec.file))
    kernels, passes = [], []
    for variant, g, low in [(graphs.variant, graphs, lowered), *others]:
        if others:
            passes.append(f"variant {variant.index}: {variant.label() or 'the defaults'}")
        passes += [("  " if others else "") + line for line in _passes(g)]
        for plan in (low.forward, low.backward):
            if plan is None:
                continue
            for k in plan.kernels:
                role = f"{plan.kind}, writes {k.describe_writes()}"
                if others:
                    role += f" (variant {variant.index})"
                kernels.append(kernel_context(k, role, spec, low.schedule, file_name, target,
                                              plan.kind, clip=plan.kind is Pass.BACKWARD))
    op = {"name": spec.name, "file_name": file_name, "dtypes": spec.dtypes, "passes": passes}
    directs = fast_contexts(spec, lowered, kernels) if not others else [
        d for variant, _, low in [(graphs.variant, graphs, lowered), *others]
        for d in fast_contexts(spec, low, kernels, variant)]
    lib = gemm()
    fused = [f for low in [lowered, *(o[2] for o in others)]
             for f in fused_contexts(low, kernels)] if lib is not None else []
    # conv2d's gradients and conv_transpose2d run on the same micro-kernels (runtime/conv_grads.py)
    conv_grads = lib is not None and lib.name == "opkit" and any(
        isinstance(s, LibCall) and s.prim in (Op.CONV2D_DX, Op.CONV2D_DW, Op.CONV_TRANSPOSE2D)
        for low in [lowered, *(o[2] for o in others)]
        for plan in (low.forward, low.backward) if plan is not None for s in plan.steps)
    gemm_context = {} if lib is None or not (fused or conv_grads) else {
        "name": lib.name, "describe": _printable(lib.describe(target.vector_bytes)),
        "source": gemm_declarations(target.vector_bytes) if lib.name == "opkit" else ""}
    reduces = any(isinstance(s, LibCall) and s.prim in COMPILED_REDUCTIONS
                  for low in [lowered, *(o[2] for o in others)]
                  for plan in (low.forward, low.backward) if plan is not None for s in plan.steps)
    return _environment().get_template("module.pyx.j2").render(
        version=__version__, op=op, target=_printable(target.describe()), kernels=kernels,
        directs=directs, defines=header_defines(), fused=fused, reduces=reduces,
        conv_fields=", ".join(f"cv.{f}" for f in ConvProblem._fields), libm=LIBM,
        math_functions=[declaration(f) for f in _math_functions(kernels)], gemm=gemm_context)


def _math_functions(kernels: Sequence[Dict]) -> List[str]:
    """The opkit_math.h functions the kernels' code calls (the module declares only those)."""
    lines = [line for k in kernels for c in k["instances"]
             for line in [*k["body"][c.tag], *k["init"][c.tag]["lines"],
                          *(line for v in k["rows"].values() for line in v["body"][c.tag])]]
    lines += [line for k in kernels for line in k["body_free"]]
    called = set(re.findall(r"\b(opk_\w+)\(", "\n".join(lines)))
    return [f for f in MATH_FUNCTIONS if f in called]


def header_defines() -> List[str]:
    """The constants templates/opkit_kernel.h takes from opkit, as C #define lines: the same in
    every module and in the runtime they link."""
    return c_defines(dict(OPK_MAXOPS=MAX_OPERANDS, OPK_MAXACC=MAX_SUMS, OPK_ACC_CHUNK=SUM_CHUNK,
                          OPK_LANE_BYTES=LANE_BYTES))


def runtime_source(vector_bytes: int) -> str:
    """The C source of the kernel runtime (templates/opkit_kernel.h with OPK_RUNTIME);
    vector_bytes is the target's (the same signature as gemm_source)."""
    return "\n".join([f"/* opkit {__version__}: the kernel runtime every module links */",
                      *header_defines(), "#define OPK_RUNTIME 1", '#include "opkit_kernel.h"', ""])


def gemm_source(vector_bytes: int) -> str:
    """The C source of the GEMM micro-kernels for the target's vectors (codegen/gemm.py): an
    object of its own, linked only by the modules whose fused calls or convolution gradients
    run on them (uses_gemm), so that the many modules without them do not pay for compiling
    it."""
    return "\n".join([f"/* opkit {__version__}: the GEMM micro-kernels the fused calls link */",
                      "#include <Python.h>", gemm_declarations(vector_bytes),
                      gemm_definitions(vector_bytes), ""])


def uses_gemm(source: str) -> bool:
    """Whether a module's source calls the GEMM micro-kernels (it carries their declarations)."""
    return GEMM_TABLES in source


# ------------------------------------------------------------------------------ fused calls

def fused_contexts(lowered: Lowered, kernels: Sequence[Dict]) -> List[Dict]:
    """What the template needs for each fused step: its epilogue's and statistics' kernel
    contexts (their element loops run on the call's output blocks); float instances only."""
    by_name = {k["name"]: k for k in kernels}
    out = []
    for plan in (lowered.forward, lowered.backward):
        if plan is None:
            continue
        for step in plan.steps:
            if not isinstance(step, Fused):
                continue
            epi = by_name[step.epilogue.name] if step.epilogue is not None else None
            stats = [by_name[st.kernel.name] if st.kernel is not None else None for st in step.stats]
            pieces = [k for k in [epi, *stats] if k is not None]
            instances = [c for c in _instances(("float32", "float64"))
                         if all(c in k["instances"] for k in pieces)]
            out.append({"name": step.name, "epi": epi, "stats": stats, "instances": instances,
                        "producer": step.call.prim})
    return out
