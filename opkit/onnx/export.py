"""`opkit export` and `op.to_onnx`: an operator as an ONNX model and an ONNX function.

The model holds one node, `opkit.<name>`, and the function that defines it: a FunctionProto in
the domain `opkit` whose body uses standard operators only, so any runtime can inline it. The
export fixes what a compiled module fixes per call: the variant (str attrs and optional inputs),
the layout (NCHW or NHWC: the order of the model's axes), the dtypes and the inputs' ranks.
Float, int and bool attrs stay attributes of the function, with the declaration's defaults,
except those that shape the model (a resampling factor): the export fixes those.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from .. import abi
from ..dsl.variants import pick
from ..runtime.bind import bind, dtype_name, finfo_values, split_args
from ..spec.model import FLOAT_DTYPES, LAYOUT_PHYSICAL, DtypeLimit
from . import ops  # noqa: F401  (registers the lowerings)
from .lowering import Context, Emitter, ExportError, align, lower_graph
from ..kinds import AttrType, Op, ValueKind

DOMAIN = "opkit"
DEFAULT_OPSET = 18
MIN_OPSET = 15  # Shape(start, end), CastLike and the axes-as-input forms

Shape = Tuple[Union[int, str], ...]


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError("ONNX export needs the onnx package: pip install 'opkit[onnx]'") from None
    return onnx


def compute_dtype(result: str) -> str:
    """float16 and bfloat16 compute in float32, rounded once on the way out, as opkit does."""
    if result not in FLOAT_DTYPES:
        raise ExportError(f"ONNX export covers float calls ({', '.join(FLOAT_DTYPES)}), not "
                          f"{result}: opkit's integer kernels use fixed-point slopes that ONNX "
                          "operators do not spell")
    return abi.compute_dtype(result)


class Typed(NamedTuple):
    """An input given as a shape with a dtype of its own (PyTorch's exporter knows both)."""
    shape: Shape
    dtype: str


class Stand:
    """The call an export describes: shapes with names for free dims, checked as a call."""

    def __init__(self, op, inputs, attrs: Mapping, layout: Optional[str], dtype: str,
                 backward: bool):
        self.op, self.spec = op, op.spec
        where = f"{op.name}.to_onnx()"
        if isinstance(inputs, Mapping):
            given = {k: v for k, v in inputs.items()}
            unknown = set(given) - set(self.spec.input_names)
            if unknown:
                raise TypeError(f"{where}: no input named {sorted(unknown)[0]!r}; the inputs are "
                                f"{', '.join(self.spec.input_names)}")
            inputs = [given.get(n) for n in self.spec.input_names]
        inputs = list(inputs or [])
        if not inputs:
            inputs = default_shapes(self.spec, {}, layout)
        # a dim given by name stands at a size no dim is given, while the call is checked
        self.free: Dict[int, str] = {}      # stand-in size -> its name
        self.fixed = {int(s) for v in inputs if isinstance(v, (tuple, list, Typed))
                      for s in (v.shape if isinstance(v, Typed) else v) if not isinstance(s, str)}
        self.fixed |= {s for v in inputs if isinstance(v, np.ndarray) for s in v.shape}
        # the H and W axes of inputs in a 4-d layout: their free dims stand at sizes far above
        # the others', so a kernel whose size is free too fits in them
        from ..runtime.bind import choose_layout
        physical = LAYOUT_PHYSICAL.get(choose_layout(self.spec, layout, where), ())
        self.spatial = {k: {physical.index("H"), physical.index("W")}
                        for k, i in enumerate(self.spec.inputs) if physical and i.shape is None}
        arrays = [self._stand_in(v, dtype, where, k) for k, v in enumerate(inputs)]
        args = split_args(self.spec, self.spec.input_names, tuple(arrays), dict(attrs or {}), where)
        outputs = self.spec.outputs
        extra = []
        if backward:
            probe = bind(self.spec, args, layout, where)
            for o in outputs:
                _, shape, _ = probe.outputs[o.name]
                extra.append((f"d{o.name}", np.broadcast_to(np.zeros((), probe.dtype), shape), o.name))
        self.bound = bind(self.spec, args, layout, where, extra)
        self.created = self._free_created()
        self.given = args
        given_optional = tuple(i.name for i in self.spec.inputs
                               if i.optional and i.name in self.bound.values)
        self.variant = pick(op.variants, self.bound.attrs, given_optional)
        self.result = dtype_name(self.bound.dtype)
        self.compute = compute_dtype(self.result)

    def _stand_in(self, value, dtype: str, where: str, k: int):
        if value is None:
            return None
        if isinstance(value, Typed):
            value, dtype = value.shape, value.dtype
        if isinstance(value, np.ndarray) or hasattr(value, "__array_interface__"):
            arr = np.asarray(value)
            return np.broadcast_to(np.zeros((), arr.dtype), arr.shape)
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{where}: input {self.spec.input_names[k]} must be an example array "
                            f"or a shape (a tuple of sizes and names), got {type(value).__name__}")
        shape = []
        spatial = self.spatial.get(k, ()) if len(value) == 4 else ()
        for axis, s in enumerate(value):
            if isinstance(s, str):
                if s not in self.free.values():
                    self.free[self._size(axis in spatial)] = s
                shape.append(next(n for n, sym in self.free.items() if sym == s))
            elif isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0:
                shape.append(int(s))
            else:
                raise TypeError(f"{where}: a shape holds sizes (ints >= 0) and names of free dims "
                                f"(strings), got {s!r} in input {self.spec.input_names[k]}")
        return np.broadcast_to(np.zeros((), np.dtype(_np_dtype(dtype))), tuple(shape))

    def _free_created(self) -> set:
        """The dims a call creates (a conv2d's OH) from free dims: their sizes move when the
        free dims' stand-ins do."""
        from ..runtime.shapes import shape_rules
        sizes = self.bound.sizes
        moved = {d: 2 * s if s in self.free else s for d, s in sizes.items()}
        try:
            other = shape_rules(self.spec).derive(moved, self.bound.attrs)
        except ValueError:
            return set()
        rules = shape_rules(self.spec)
        created = {d for n in rules.calls for d in n.dims or ()}
        return {d for d in created if d in sizes and d in other and other[d] != sizes[d]}

    def _size(self, spatial: bool) -> int:
        """A stand-in size no given or free dim has: small ones in order, 1001, 2001 ... for
        the spatial dims (conv2d results of them fall between)."""
        taken = self.fixed | set(self.free)
        size = max([1, *(t for t in taken if t < 1000)]) + 1 if not spatial else 1001
        while size in taken:
            size += 1000 if spatial else 1
        return size

    def shape(self, arr: np.ndarray) -> Tuple[Optional[int], ...]:
        return tuple(None if s in self.free else s for s in arr.shape)

    def dims(self, arr: np.ndarray) -> Shape:
        return tuple(self.free[s] if s in self.free else s for s in arr.shape)


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def default_shapes(spec, given: Mapping[str, Shape], layout: Optional[str]) -> list:
    """The shape of every input: those `given`, and for the others their declared dims (free
    by name, or the size a given shape fixes for that dim)."""
    from ..runtime.bind import choose_layout, input_names
    layout = choose_layout(spec, layout, f"{spec.name}.to_onnx()")
    stand = {n: np.empty([s if isinstance(s, int) else 2 for s in shape], np.float32)
             for n, shape in given.items()}
    known: Dict[str, int] = {}
    for name, names in input_names(spec, stand, layout, f"{spec.name}.to_onnx()").items():
        known.update((d, s) for d, s in zip(names, given[name]) if isinstance(s, int))
    out = []
    for i in spec.inputs:
        shape = given.get(i.name) or default_shape(spec, i, layout)
        out.append(None if shape is None else tuple(known.get(d, d) if isinstance(d, str) else d
                                                     for d in shape))
    return out


def default_shape(spec, inp, layout: Optional[str]) -> Optional[Shape]:
    """The shape `opkit export` gives an input when none is named: its declared dims (4-d for
    a layout), free by name; a layout-agnostic input is 4-d (N, C, H, W)."""
    if inp.optional:
        return None
    if inp.shape is not None:
        return tuple(inp.shape)
    from ..spec.model import LAYOUT_PHYSICAL
    return tuple(LAYOUT_PHYSICAL.get(layout or spec.layouts[0], ("N", "C", "H", "W")))


class ProtoEmitter(Emitter):
    """Nodes of an ONNX FunctionProto body; attrs are references to the function's attributes."""

    def __init__(self, ctx: Context, stand: Stand, attr_types: Dict[str, AttrType]):
        super().__init__(ctx)
        self.onnx = _onnx()
        self.nodes: List[object] = []  # onnx NodeProtos, in order
        self.stand = stand
        self.attr_types = attr_types
        self.taken = set(stand.bound.values)
        self.cast_inputs: Dict[str, str] = {}
        self.count = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.count += 1
            name = f"{hint}_{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def op(self, op_type: str, *inputs, **attributes):
        out = self.fresh(op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [out], **attributes))
        return out

    def const(self, array: np.ndarray):
        out = self.fresh("const")
        tensor = self.onnx.numpy_helper.from_array(np.asarray(array), out)
        self.nodes.append(self.onnx.helper.make_node("Constant", [], [out], value=tensor))
        return out

    def input_raw(self, name: str):
        return name

    def input(self, name: str):
        if name not in self.cast_inputs:
            arr = self.stand.bound.values[name][0]
            ref = name if dtype_name(arr.dtype) == self.ctx.compute.name else self.cast(name)
            self.cast_inputs[name] = ref
        return self.cast_inputs[name]

    def attr(self, name: str, kind: str):
        if name in self.ctx.static or name.startswith("finfo."):
            value = (finfo_values(self.stand.bound.dtype)[name] if name.startswith("finfo.")
                     else self.ctx.static[name])
            return self.const(np.array(value, dtype=bool if kind == ValueKind.BOOL else self.ctx.compute))
        onnx = self.onnx
        typ = self.attr_types[name]
        out = self.fresh(name)
        node = onnx.helper.make_node("Constant", [], [out])
        field = "value_float" if typ == AttrType.FLOAT else "value_int"
        node.attribute.append(onnx.AttributeProto(
            name=field, ref_attr_name=name,
            type=onnx.AttributeProto.FLOAT if typ == AttrType.FLOAT else onnx.AttributeProto.INT))
        self.nodes.append(node)
        return self.cast(out, "bool" if kind == ValueKind.BOOL else None)


def _static_attrs(graph, stand: Stand) -> Dict[str, object]:
    """The attrs a lowering needs as numbers (a resampling factor, a convolution's stride and
    padding): the scalar arguments of library calls that are attrs."""
    from ..dsl.ir import topo_order
    from ..dsl.library import LIBRARY
    static = {}
    for node in topo_order(graph.output_nodes):
        for k in (LIBRARY[node.op].scalar_args if node.op in LIBRARY else ()):
            if node.args[k].op == Op.ATTR:
                static[node.args[k].name] = stand.bound.attrs[node.args[k].name]
    return static


def _attr_default(a, stand: Stand):
    if a.required:
        return None
    v = a.default
    if isinstance(v, DtypeLimit):
        return finfo_values(stand.bound.dtype)[f"finfo.{v.which}"]
    if v is None:
        return a.null_means
    return v


def _attribute(onnx, name: str, typ: AttrType, value):
    if typ == AttrType.FLOAT:
        return onnx.helper.make_attribute(name, float(value))
    return onnx.helper.make_attribute(name, int(value))


def prepare(op, stand: Stand, backward: bool = False, opset: int = DEFAULT_OPSET):
    """The graph an export lowers, its Context and each input's dim names."""
    graphs = op.graphs_of(stand.variant)
    graph = graphs.backward if backward else graphs.forward
    if backward and not graphs.differentiable:
        raise ExportError(f"{op.name} has no differentiable inputs: it has no backward pass")
    bound = stand.bound
    names = {n: nm for n, (_, nm) in bound.values.items()}
    shapes = {n: stand.shape(arr) for n, (arr, _) in bound.values.items()}
    sizes = {d: (None if s in stand.free else s) for d, s in bound.sizes.items()}
    for o, (nm, shape, _) in bound.outputs.items():
        for d, s in zip(nm, shape):
            sizes.setdefault(d, None if s in stand.free else s)
    sizes.update((d, None) for d in stand.created)
    ctx = Context(sizes, dict(bound.attrs), np.dtype(stand.compute), names, shapes, opset=opset)
    ctx.static = _static_attrs(graph, stand)
    return graph, ctx, names


def lower_outputs(graph, em, stand: Stand, ctx: Context, names, backward: bool = False):
    """The lowered results as (output name, ref): each in its output's axes and shape, in the
    call's result dtype (an input's for a gradient)."""
    bound = stand.bound
    out = []
    for name, val in lower_graph(graph, em, names, ctx).items():
        if backward:
            target = names[name]
            shape = stand.shape(bound.values[name][0])
            dtype = dtype_name(bound.values[name][0].dtype)
        else:
            target, out_shape, _ = bound.outputs[name]
            shape = tuple(None if s in stand.free or d in stand.created else s
                          for d, s in zip(target, out_shape))
            dtype = stand.result
        ref = em.expand(align(em, val, target), target, shape, val.names)
        if dtype != stand.compute:
            ref = em.cast(ref, dtype)
        out.append((("d" + name) if backward else name, ref))
    return out


def build_function(op, stand: Stand, backward: bool = False, opset: int = DEFAULT_OPSET):
    """The FunctionProto `opkit.<name>` (or `<name>_backward`) and the attrs its caller sets."""
    onnx = _onnx()
    graph, ctx, names = prepare(op, stand, backward, opset)
    bound = stand.bound
    attrs = [a for a in op.spec.attrs if a.type != AttrType.STR and a.name not in ctx.static]
    # ONNX attributes are floats or ints: a bool attr is an int
    types = {a.name: AttrType.FLOAT if a.type == AttrType.FLOAT else AttrType.INT for a in attrs}
    em = ProtoEmitter(ctx, stand, types)
    outputs = []
    for out_name, ref in lower_outputs(graph, em, stand, ctx, names, backward):
        em.nodes.append(onnx.helper.make_node("Identity", [ref], [out_name]))
        outputs.append(out_name)
    fn_name = f"{op.name}_backward" if backward else op.name
    function = onnx.helper.make_function(
        DOMAIN, fn_name, list(graph.inputs), outputs, em.nodes,
        [onnx.helper.make_opsetid("", opset)], attributes=[],
        doc_string=f"opkit operator {op.name}: {op.spec.summary}")
    defaults = {}
    for a in attrs:
        d = _attr_default(a, stand)
        if d is not None:
            function.attribute_proto.append(_attribute(onnx, a.name, types[a.name], d))
        else:
            function.attribute.append(a.name)
        defaults[a.name] = bound.attrs[a.name]
    call_attrs = {n: _attribute(onnx, n, types[n], v) for n, v in defaults.items()}
    return function, call_attrs, outputs, ctx.static


def to_model(op, inputs=None, attrs: Optional[Mapping] = None, *, layout: Optional[str] = None,
             dtype: str = "float32", opset: int = DEFAULT_OPSET, backward: bool = False):
    """The ONNX ModelProto of operator `op` (see `export`)."""
    onnx = _onnx()
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ExportError(f"opset must be between {MIN_OPSET} and "
                          f"{onnx.defs.onnx_opset_version()} (this onnx's newest), got {opset!r}")
    stand = Stand(op, inputs, attrs or {}, layout, dtype, backward)
    function, call_attrs, outputs, static = build_function(op, stand, backward, opset)
    bound = stand.bound
    helper = onnx.helper

    def info(name: str, arr_dtype, dims):
        code = helper.np_dtype_to_tensor_dtype(np.dtype(arr_dtype)) \
            if dtype_name(np.dtype(arr_dtype)) != "bfloat16" else onnx.TensorProto.BFLOAT16
        return helper.make_tensor_value_info(name, code, list(dims))

    graph_inputs = list(function.input)
    ins = [info(n, bound.values[n][0].dtype, stand.dims(bound.values[n][0])) for n in graph_inputs]
    outs = []
    for name in outputs:
        if backward:
            arr = bound.values[name[1:]][0]
            outs.append(info(name, arr.dtype, stand.dims(arr)))
        else:
            dims, shape, _ = bound.outputs[name]
            outs.append(info(name, bound.dtype, tuple(d if d in stand.created else stand.free.get(s, s)
                                                      for d, s in zip(dims, shape))))
    node = helper.make_node(function.name, graph_inputs, outputs, domain=DOMAIN)
    node.attribute.extend(call_attrs.values())
    graph = helper.make_graph([node], f"opkit_{function.name}", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(DOMAIN, 1)],
                              functions=[function], producer_name="opkit",
                              ir_version=min(onnx.IR_VERSION, 10))
    described = {"operator": op.name, "pass": "backward" if backward else "forward",
                 "layout": bound.layout, "dtype": stand.result,
                 "variant": stand.variant.label() or "-",
                 "fixed attrs": ", ".join(f"{k}={v!r}" for k, v in static.items()) or "-"}
    helper.set_model_props(model, described)
    onnx.checker.check_model(model, full_check=True)
    return model


def export(op, path=None, inputs=None, attrs: Optional[Mapping] = None, *,
           layout: Optional[str] = None, dtype: str = "float32", opset: int = DEFAULT_OPSET,
           backward: bool = False):
    """Export operator `op` to ONNX; write it to `path` (when given) and return the ModelProto.

    `inputs`: per input (in order, or a dict by name) an example array, a shape (sizes, and
    strings naming free dims: ("N", 3, 64, 64)) or None (an optional input left out); without
    them every input gets its declared dims, free by name. `attrs`: attr values (defaults
    otherwise; str attrs choose the variant). `layout`: the layout of 4-d inputs; `dtype`: of
    the inputs given as shapes. `backward=True` exports the backward pass instead
    (`<name>_backward`: the inputs, then the output gradients; one gradient per
    differentiable input)."""
    model = to_model(op, inputs, attrs, layout=layout, dtype=dtype, opset=opset, backward=backward)
    if path is not None:
        _onnx().save(model, str(path))
    return model
