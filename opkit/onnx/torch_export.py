"""`torch.onnx.export` of models that call `torch.ops.opkit.*`: each call becomes the operator's
ONNX lowering, standard operators inlined into the model (the walk of opkit/onnx/lowering.py
with PyTorch's graph builder as the emitter).

`import opkit.torch` registers a symbolic function for every operator it makes a PyTorch
operator, for PyTorch's TorchScript-based exporter (`torch.onnx.export(..., dynamo=False)`).
The call's attrs are fixed at their traced values; a dim the export leaves dynamic stays free.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .export import MIN_OPSET, Stand, Typed, default_shape, lower_outputs, prepare
from .lowering import Emitter, ExportError
from ..kinds import AttrType, ValueKind

# torch's scalar type names (Value.type().scalarType()) -> opkit's dtype names
_DTYPES = {"Half": "float16", "Float": "float32", "Double": "float64", "BFloat16": "bfloat16"}
# an attr's type -> the letter torch.onnx.symbolic_helper reads a constant of that type by
_TORCH_SCALARS = {AttrType.FLOAT: "f", AttrType.INT: "i", AttrType.BOOL: "b", AttrType.STR: "s"}


class TorchEmitter(Emitter):
    """Nodes of the graph PyTorch's exporter is building; attrs are constants of the call."""

    def __init__(self, ctx, stand: Stand, g, inputs):
        super().__init__(ctx)
        self.g, self.stand, self.inputs = g, stand, inputs
        self.cast_inputs: Dict[str, object] = {}  # input name -> its value in the compute dtype

    def op(self, op_type: str, *inputs, **attributes):
        return self.g.op(op_type, *inputs, **{_suffixed(k, v): v for k, v in attributes.items()})

    def const(self, array: np.ndarray):
        import torch
        return self.g.op("Constant", value_t=torch.from_numpy(np.array(array)))

    def input_raw(self, name: str):
        return self.inputs[name]

    def input(self, name: str):
        if name not in self.cast_inputs:
            arr = self.stand.bound.values[name][0]
            raw = self.inputs[name]
            self.cast_inputs[name] = raw if arr.dtype == self.ctx.compute else self.cast(raw)
        return self.cast_inputs[name]

    def attr(self, name: str, kind: str):
        from ..runtime.bind import finfo_values
        value = finfo_values(self.stand.bound.dtype)[name] if name.startswith("finfo.") \
            else self.stand.bound.attrs[name]
        return self.const(np.array(value, dtype=bool if kind == ValueKind.BOOL else self.ctx.compute))


def _suffixed(key: str, value) -> str:
    """PyTorch's graph builder names an attribute's type in its keyword: perm_i, alpha_f ..."""
    first = value[0] if isinstance(value, (list, tuple)) and value else value
    if isinstance(first, str):
        return f"{key}_s"
    if isinstance(first, float):
        return f"{key}_f"
    return f"{key}_i"


def _shape(op, inp, value, layout: Optional[str]) -> Typed:
    """An input of the traced call as a shape (a dynamic dim by its declared name) and dtype."""
    from torch.onnx import symbolic_helper as sh
    sizes = sh._get_tensor_sizes(value)
    kind = value.type().scalarType() if sizes is not None else None
    if sizes is None or kind not in _DTYPES:
        raise ExportError(f"torch.ops.opkit.{op.name}: the exporter does not know the shape and "
                          f"float dtype of input {inp.name} (got {kind}); trace the model with "
                          "example tensors")
    declared = default_shape(op.spec, inp, layout) or ()
    names = declared if len(declared) == len(sizes) else \
        tuple(f"{inp.name}_{k}" for k in range(len(sizes)))
    return Typed(tuple(names[k] if s is None else int(s) for k, s in enumerate(sizes)),
                 _DTYPES[kind])


def symbolic(op):
    """The symbolic function of torch.ops.opkit.<name> for the TorchScript-based exporter."""
    from torch.onnx import symbolic_helper as sh
    spec = op.spec
    # tensors reach the exporter in their logical order (N, C, H, W)
    layout = "NCHW" if "NCHW" in spec.layouts else None

    def emit(g, *args):
        n = len(spec.inputs)
        inputs = {i.name: v for i, v in zip(spec.inputs, args[:n]) if not sh._is_none(v)}
        shapes = [_shape(op, i, inputs[i.name], layout) if i.name in inputs else None
                  for i in spec.inputs]
        attrs = {}
        for a, v in zip(spec.attrs, args[n:]):
            if sh._is_none(v):
                continue
            value = sh._maybe_get_const(v, _TORCH_SCALARS[a.type])
            if sh._is_value(value):
                raise ExportError(f"torch.ops.opkit.{op.name}: attr {a.name} must be a constant "
                                  "of the traced call, got a value computed in the model")
            attrs[a.name] = bool(value) if a.type == AttrType.BOOL else value
        stand = Stand(op, shapes, attrs, layout, "float32", False)
        graph, ctx, names = prepare(op, stand, opset=g.opset)
        ctx.static = dict(stand.bound.attrs)
        em = TorchEmitter(ctx, stand, g, inputs)
        refs = [ref for _, ref in lower_outputs(graph, em, stand, ctx, names)]
        return refs[0] if len(refs) == 1 else tuple(refs)
    return emit


def register(op) -> None:
    """Let torch.onnx.export (dynamo=False) export calls of torch.ops.opkit.<op.name>."""
    from torch.onnx import register_custom_op_symbolic
    # registered for the lowest opset the lowerings need: PyTorch uses it for every newer one
    register_custom_op_symbolic(f"opkit::{op.name}", symbolic(op), MIN_OPSET)
