"""An operator's graph as standard ONNX operators: the registry of lowerings and the walk.

Every primitive has a lowering registered under its name with `@onnx_lowering(name)`, in the
manner of its derivative rule: an elementwise one takes the emitted values of its arguments,
already broadcast against each other by dim name, and returns the emitted result; a library
one (`einsum`, `fourier` ...) takes the node, its arguments with their dim names and the
export's `Context`, and returns a `Val`. A primitive added to opkit/dsl registers its lowering
beside its definition (or in opkit/onnx/ops.py); tests/test_onnx_export.py checks that none is
missing.

The walk is the same for every emitter: the ONNX protos of `opkit export` (opkit/onnx/proto.py)
and the graph builders of PyTorch's exporters (opkit/onnx/torch_export.py) only say how one
ONNX node, constant or attr is made. Nothing here imports onnx.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..dsl import named
from ..dsl.ir import topo_order
from ..dsl.library import LIBRARY
from ..dsl.primitives import PRIMITIVES
from ..kinds import Op, ValueKind

LOWERINGS: Dict[str, Callable] = {}


def onnx_lowering(name: str):
    """Register the ONNX lowering of primitive `name` (a decorator)."""
    def register(fn: Callable) -> Callable:
        LOWERINGS[name] = fn
        return fn
    return register


class ExportError(ValueError):
    """An operator, a call or an option that cannot be exported to ONNX."""


@dataclass
class Val:
    """An emitted value and the dim names of its axes (() for a scalar)."""

    ref: object
    names: Tuple[str, ...]
    resized: Dict[str, int] = field(default_factory=dict)  # dims a resampling made longer/shorter
    # free dims a resampling scaled: their length as a multiple of the dim's size (downsampling
    # by u needs a multiple of u, which a size left free does not promise)
    scaled: Dict[str, int] = field(default_factory=dict)


@dataclass
class Context:
    """What the export fixes: dim sizes (None where the model leaves a dim free), the values of
    attrs that must be constants (a resampling factor shapes the model), the compute dtype and
    the opset (which operators, in which version, the lowerings may emit)."""

    sizes: Dict[str, Optional[int]]
    attrs: Dict[str, object]
    compute: np.dtype
    names: Dict[str, Tuple[str, ...]]               # input -> dim names of its axes
    shapes: Dict[str, Tuple[Optional[int], ...]]    # input -> its sizes (None: left free)
    opset: int
    static: Dict[str, object] = field(default_factory=dict)  # attrs a lowering fixed

    def size(self, dim: str, why: str) -> int:
        n = self.sizes.get(dim)
        if n is None:
            raise ExportError(f"{why} needs a fixed size along {named.describe(dim)}: give the "
                              "inputs' shapes with a size, not a name, for that dim (opkit "
                              "export: --shape x=N,C,64,64)")
        return n

    def constant(self, node, why: str) -> float:
        """The value of a scalar argument that must be known at export: a number, or an attr
        that the export then fixes (it is no attribute of the ONNX function)."""
        if node.op == Op.CONST:
            return node.value
        if node.op == Op.ATTR and node.name in self.attrs:
            value = self.attrs[node.name]
            if not isinstance(value, (int, float)):
                raise ExportError(f"{why} needs a number, got {node.name} = {value!r}")
            self.static[node.name] = value
            return value
        raise ExportError(f"{why} needs a value known at export, got an expression")


# TensorProto data types (onnx.TensorProto.FLOAT ...), without importing onnx
ONNX_TYPES = {"float32": 1, "bool": 9, "float16": 10, "float64": 11, "int64": 7, "bfloat16": 16}


class Emitter:
    """How ONNX nodes are made; the lowerings call these. A subclass provides `op(op_type,
    *inputs, **attributes)` (one output), `const(array)`, `input_raw(name)` (an input as
    given), `input(name)` (an input in the compute dtype) and `attr(name, kind)` (an attr as
    a scalar of the compute dtype, or a bool)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def op(self, op_type: str, *inputs, **attributes):
        raise NotImplementedError

    def const(self, array: np.ndarray):
        raise NotImplementedError

    def input_raw(self, name: str):
        raise NotImplementedError

    def input(self, name: str):
        raise NotImplementedError

    def attr(self, name: str, kind: str):
        raise NotImplementedError

    def scalar(self, value: float):
        return self.const(np.array(value, dtype=self.ctx.compute))

    def ints(self, values):
        return self.const(np.array(list(values), dtype=np.int64))

    def cast(self, ref, dtype=None):
        """`ref` converted to `dtype` (default: the compute dtype)."""
        name = dtype if isinstance(dtype, str) else np.dtype(dtype or self.ctx.compute).name
        return self.op("Cast", ref, to=ONNX_TYPES[name])

    def expand(self, ref, names: Tuple[str, ...], shape: Tuple[Optional[int], ...],
               have: Tuple[str, ...] = ()):
        """`ref` (laid out for `names`) broadcast to `shape`, unless it has every dim that is
        not 1 already (`have`: its dims before it was laid out)."""
        if all(n in have or s == 1 for n, s in zip(names, shape)):
            return ref
        parts = [self.ints([s]) if s is not None else self.dim_size(n) for n, s in zip(names, shape)]
        return self.op("Expand", ref, self.op("Concat", *parts, axis=0) if parts else self.ints([]))

    def dim_size(self, dim: str):
        """The size of `dim` at run time, as a 1-element int64 tensor: read off an input."""
        for name, names in self.ctx.names.items():
            if dim in names:
                axis = names.index(dim)
                return self.op("Shape", self.input_raw(name), start=axis, end=axis + 1)
        raise ExportError(f"no input has {dim}")


def align(em, val: Val, target: Tuple[str, ...]):
    """`val` laid out to broadcast against `target` by ONNX's (NumPy's) rules: its axes in
    target order, with size-1 axes where it lacks a dim, unless those are all leading."""
    ref, names = val.ref, val.names
    if names == target or not names:
        return ref
    present = [n for n in target if n in names]
    perm = [names.index(n) for n in present]
    if perm != list(range(len(names))):
        ref = em.op("Transpose", ref, perm=perm)
    if tuple(present) != target[len(target) - len(present):]:
        axes = [i for i, n in enumerate(target) if n not in names]
        ref = em.op("Unsqueeze", ref, em.ints(axes))
    return ref


def lower_graph(graph, em, names: Dict[str, Tuple[str, ...]], ctx: Context) -> Dict[str, Val]:
    """Emit `graph`'s outputs: `names` gives each input's dim names (in axis order)."""
    done: Dict[int, Val] = {}
    for node in topo_order(graph.output_nodes):
        done[id(node)] = _lower(node, em, names, ctx, done)
    return {name: done[id(node)] for name, node in graph.outputs}


def _lower(node, em, names, ctx: Context, done) -> Val:
    if node.op == Op.INPUT:
        return Val(em.input(node.name), names[node.name])
    if node.op == Op.ATTR:
        return Val(em.attr(node.name, node.kind), ())
    if node.op == Op.CONST:
        if node.kind == ValueKind.BOOL:
            return Val(em.const(np.array(bool(node.value))), ())
        return Val(em.scalar(node.value), ())
    args = [done[id(a)] for a in node.args]
    lowering = LOWERINGS.get(node.op)
    if lowering is None:
        raise ExportError(f"the primitive {node.op!r} has no ONNX lowering (register one with "
                          "opkit.onnx.onnx_lowering)")
    if node.op in LIBRARY:
        return lowering(em, node, args, ctx)
    target = named.union_names([a.names for a in args])
    resized = {d: n for a in args for d, n in a.resized.items()}
    scaled = {d: r for a in args for d, r in a.scaled.items()}
    return Val(lowering(em, *[align(em, a, target) for a in args]), target, resized, scaled)


def missing() -> List[str]:
    """The primitives without a lowering (none, or the export of an operator using one fails)."""
    return sorted((set(PRIMITIVES) | set(LIBRARY)) - set(LOWERINGS))
