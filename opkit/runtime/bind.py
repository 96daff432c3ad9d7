"""Check a call's arguments and give every array its dim names; nothing runs before this passes.

Errors name the operator, the argument, what was expected and what was given: TypeError for
dtypes and argument types, ValueError for shapes, layouts, values and `out=`.
"""
from __future__ import annotations

import difflib
import numbers
import operator
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..dsl import named
from ..kinds import AttrType, Layout
from ..spec.model import DTYPES, FLOAT_DTYPES, LAYOUT_DIMS, LAYOUT_PHYSICAL, DtypeLimit, OpSpec
from .shapes import shape_rules

Value = Tuple[np.ndarray, Tuple[str, ...]]
def _known(name: str):
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 without ml_dtypes
        return None


_NAMES = {_known(d): d for d in DTYPES if _known(d) is not None}


def dtype_name(dtype: np.dtype) -> str:
    """dtype.name without its cost (NumPy computes the name anew on each access)."""
    name = _NAMES.get(dtype)
    return name if name is not None else dtype.name


_KIND = {AttrType.FLOAT: "a float", AttrType.INT: "an integer", AttrType.BOOL: "True or False"}
_COMPARE = {"==": operator.eq, ">": operator.gt, ">=": operator.ge, "<": operator.lt,
            "<=": operator.le}


def _or_list(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


@dataclass
class Bound:
    """A checked call: arrays with dim names, dim sizes, attrs and the result dtype."""

    layout: Layout
    values: Dict[str, Value]            # input (or output gradient) name -> (array, names)
    sizes: Dict[str, int]
    attrs: Dict[str, object]            # as the kernels take them (null -> null_means)
    dtype: np.dtype                     # the dtype of results
    outputs: Dict[str, Tuple[Tuple[str, ...], Tuple[int, ...], Optional[np.ndarray]]]


def split_args(spec: OpSpec, leading: Sequence[str], args: tuple, kwargs: dict, where: str,
               keyword_only: Sequence[str] = ()):
    """Match positional and keyword arguments to `leading` names, then the attrs, in order;
    `keyword_only` names are accepted by keyword."""
    order = list(leading) + list(spec.attr_names)
    if len(args) > len(order):
        raise TypeError(f"{where} takes at most {len(order)} positional arguments "
                        f"({', '.join(order)}), got {len(args)}")
    given = dict(zip(order, args))
    for name in keyword_only:
        if name in kwargs:
            given[name] = kwargs[name]
    for key, value in kwargs.items():
        if key in keyword_only:
            continue
        if key not in order:
            close = difflib.get_close_matches(key, order, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(order)}"
            raise TypeError(f"{where} got an unexpected keyword argument {key!r}{hint}")
        if key in given:
            raise TypeError(f"{where} got argument {key!r} twice (by position and by keyword)")
        given[key] = value
    optional = {i.name for i in spec.inputs if i.optional}
    for name in list(leading) + list(keyword_only):
        if name not in given:
            if name in optional:
                given[name] = None  # an optional input left out
                continue
            raise TypeError(f"{where} is missing the argument {name!r}")
    return given


_FINFO: Dict[np.dtype, Dict[str, float]] = {}


def finfo_values(dtype: np.dtype) -> Dict[str, float]:
    """`finfo.max` and its kin for a call's dtype, as the kernels take them."""
    found = _FINFO.get(dtype)
    if found is None:
        found = {}
        if dtype_name(dtype) in FLOAT_DTYPES:
            info = np.finfo(dtype)
            found = {f"finfo.{w}": float(getattr(info, w)) for w in ("max", "min", "eps", "tiny")}
        _FINFO[dtype] = found
    return found


# the largest integer magnitude an attr may be given: a float64 holds every integer up to 2**53
# exactly, and none past its largest finite value
_LIMIT = {AttrType.INT: 2 ** 53, AttrType.FLOAT: int(np.finfo(np.float64).max)}
_LIMIT_TEXT = {AttrType.INT: "2**53", AttrType.FLOAT: "1.8e308 (float64's largest)"}


def check_attrs(spec: OpSpec, given: dict, where: str,
                dtype: Optional[np.dtype] = None) -> Dict[str, object]:
    """The attrs as kernels take them (a null one as its null_means, a `finfo.max` default as
    the call's dtype says; without a dtype it stays as declared); TypeError or ValueError
    naming the attr otherwise."""
    out: Dict[str, object] = dict(finfo_values(dtype)) if dtype is not None else {}
    for a in spec.attrs:
        if a.name not in given:
            if a.required:
                raise TypeError(f"{where} is missing the attribute {a.name!r} ({a.type})")
            v: object = a.default
            if isinstance(v, DtypeLimit):
                if dtype is None:
                    out[a.name] = v
                    continue
                v = out.get(f"finfo.{v.which}", v)
                if isinstance(v, DtypeLimit):
                    raise TypeError(f"{where}: {a.name} defaults to {v!r}, which needs float "
                                    f"data, got {dtype.name}; give {a.name}")
        else:
            v = given[a.name]
        if a.type == AttrType.STR:
            if not isinstance(v, str):
                raise TypeError(f"{where}: {a.name} must be one of the strings "
                                f"{', '.join(map(repr, a.choices))}, got {type(v).__name__} {v!r}")
            if v not in a.choices:
                raise ValueError(f"{where}: {a.name} must be one of {', '.join(map(repr, a.choices))}"
                                 f", got {v!r}")
            out[a.name] = v
            continue
        if v is None:
            if not a.nullable:
                raise TypeError(f"{where}: {a.name} must be {_KIND[a.type]}, got None")
            out[a.name] = a.null_means
            continue
        if a.type == AttrType.BOOL:
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{where}: {a.name} must be {_KIND[AttrType.BOOL]}, got {v!r}")
            out[a.name] = bool(v)
            continue
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise TypeError(f"{where}: {a.name} must be {_KIND[a.type]}, got {type(v).__name__} {v!r}")
        if isinstance(v, numbers.Integral) and not -_LIMIT[a.type] <= int(v) <= _LIMIT[a.type]:
            # kernels take attrs as float64 numbers: exact for integers up to 2**53
            raise ValueError(f"{where}: {a.name} must be {_KIND[a.type]} of magnitude at most "
                             f"{_LIMIT_TEXT[a.type]}, got an integer of {int(v).bit_length()} bits")
        num: float = float(v)
        if a.type == AttrType.INT:
            if not num.is_integer():
                raise TypeError(f"{where}: {a.name} must be an integer, got {v!r}")
            num = int(num)   # exact: an integer of at most 2**53
        for op, bound in a.conditions():
            if not _COMPARE[op](num, num if bound is None else bound):
                if bound is None:
                    raise ValueError(f"{where}: {a.name} must be a number, got nan")
                raise ValueError(f"{where}: {a.name} must be in {a.range}, got {num!r}")
        out[a.name] = num
    return out


def as_array(value, name: str, allowed: Sequence[str], where: str) -> np.ndarray:
    """The argument as a plain ndarray in native byte order, or a TypeError.

    Subclasses (np.matrix, np.memmap ...) are read through a base-class view, so results are
    plain arrays whatever came in; masked arrays are refused, because computing on their data
    would silently drop the mask. Non-native byte order is converted (one copy): kernels read
    native numbers only."""
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{where}: {name} is a masked array; opkit computes on plain arrays and "
                        f"would ignore its mask: pass {name}.filled(value) or np.asarray({name})")
    if isinstance(value, np.ndarray):
        arr = value if type(value) is np.ndarray else value.view(np.ndarray)
    else:
        if value is None or isinstance(value, (str, bytes, dict)):
            raise TypeError(f"{where}: {name} must be an array of {_or_list(allowed)}, got "
                            f"{type(value).__name__}")
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where}: {name} must be an array, got {type(value).__name__} ({exc})") from None
    if dtype_name(arr.dtype) not in allowed:
        raise TypeError(f"{where}: {name} must be an array of {_or_list(allowed)}, got dtype "
                        f"{arr.dtype.name}" + (f"; convert it with .astype(np.{allowed[-1]})"
                                               if arr.dtype.kind in "iubf" else ""))
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="), order="K")
    return arr


def choose_layout(spec: OpSpec, layout: Optional[str], where: str) -> Layout:
    if layout is None:
        return spec.layouts[0]
    if layout not in spec.layouts:
        raise ValueError(f"{where}: layout must be {_or_list([repr(x) for x in spec.layouts])}, "
                         f"got {layout!r}")
    return Layout(layout)


def input_names(spec: OpSpec, arrays: Dict[str, np.ndarray], layout: str, where: str):
    """Dim names of every input array for this layout."""
    anchor = LAYOUT_PHYSICAL.get(layout)
    out = {}
    for i in spec.inputs:
        if i.name not in arrays:
            continue  # an optional input the call leaves out
        arr = arrays[i.name]
        if i.shape is not None:
            if arr.ndim != len(i.shape):
                raise ValueError(f"{where}: {i.name} must have {len(i.shape)} dims "
                                 f"[{', '.join(i.shape)}], got shape {arr.shape}")
            out[i.name] = i.shape
        elif i.layouts_declared and layout in LAYOUT_DIMS:
            if layout not in i.layouts:
                raise ValueError(f"{where}: {i.name} does not support layout {layout!r} "
                                 f"(it supports {', '.join(i.layouts)})")
            if arr.ndim != 4:
                raise ValueError(f"{where}: layout {layout} needs {i.name} with 4 dims "
                                 f"[{', '.join(LAYOUT_PHYSICAL[layout])}], got shape {arr.shape}")
            out[i.name] = LAYOUT_PHYSICAL[layout]
        elif anchor is not None:
            if arr.ndim > len(anchor):
                raise ValueError(f"{where}: {i.name} has {arr.ndim} dims but layout {layout} has "
                                 f"{len(anchor)}; it must broadcast to [{', '.join(anchor)}]")
            out[i.name] = anchor[len(anchor) - arr.ndim:]
        else:
            if i.layouts_declared and layout not in i.layouts:
                raise ValueError(f"{where}: {i.name} does not support layout {layout!r} "
                                 f"(it supports {', '.join(i.layouts)})")
            out[i.name] = named.positional_names(arr.ndim)
    return out


def _label(name: str, arr: np.ndarray) -> str:
    return f"{name} (shape {arr.shape})"


@dataclass(frozen=True)
class Shapes:
    """What a call's shapes and dtypes decide; the same for every call with the same ones."""

    names: Dict[str, Tuple[str, ...]]       # input name -> dim names of its axes
    sizes: Dict[str, int]
    outputs: Dict[str, Tuple[Tuple[str, ...], Tuple[int, ...], Optional[str]]]  # .., like input
    dtype: np.dtype


def _shapes(spec: OpSpec, arrays: Dict[str, np.ndarray], layout: str, where: str,
            extra: Sequence[Tuple[str, np.ndarray, str]], attrs: Dict[str, object]) -> Shapes:
    names = input_names(spec, arrays, layout, where)
    values = {n: (arrays[n], names[n]) for n in arrays}
    labels = [_label(n, arrays[n]) for n in arrays]
    # inputs with declared dims (shape: [...] or a 4-d layout) have exactly those sizes; the
    # layout-agnostic ones broadcast by NumPy's rules
    exact = [not all(named.is_positional(n) for n in names[i.name]) and
             (i.shape is not None or (i.layouts_declared and layout in LAYOUT_DIMS))
             for i in spec.inputs if i.name in arrays]
    try:
        sizes = named.dim_sizes(list(values.values()), labels, exact)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    rules = shape_rules(spec)
    try:
        sizes = rules.derive(sizes, attrs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    own_dims = dict(rules.outputs)
    float_dtypes = [a.dtype for a in arrays.values() if dtype_name(a.dtype) in FLOAT_DTYPES]
    # floats promote as in NumPy; integer-only calls run in the integers' common dtype
    dtype = np.result_type(*(float_dtypes or [a.dtype for a in arrays.values()]))
    if dtype_name(dtype) not in spec.dtypes:
        raise TypeError(f"{where}: the inputs together need dtype {dtype.name}, which this "
                        f"operator does not support ({', '.join(spec.dtypes)})")
    outputs: Dict[str, Tuple[Tuple[str, ...], Tuple[int, ...], Optional[str]]] = {}
    for o in spec.outputs:
        if o.like is not None:
            like_arr, like_names = values[o.like]
            for i in spec.inputs:
                if i.name not in values:
                    continue
                arr, nm = values[i.name]
                for n, s in zip(nm, arr.shape):
                    pos = named.is_positional(n) or i.shape is None
                    if n in like_names:
                        if s not in (1, like_arr.shape[like_names.index(n)]):
                            raise ValueError(
                                f"{where}: {_label(i.name, arr)} does not broadcast to "
                                f"{_label(o.like, like_arr)}: {named.describe(n)} has size {s}, "
                                f"expected {like_arr.shape[like_names.index(n)]} or 1")
                    elif pos:
                        raise ValueError(f"{where}: {_label(i.name, arr)} does not broadcast to "
                                         f"{_label(o.like, like_arr)}: it has more dims")
            outputs[o.name] = (like_names, like_arr.shape, o.like)
        elif o.name in own_dims:  # a conv2d result, per-channel statistics ...
            names = rules.physical(own_dims[o.name], layout)
            outputs[o.name] = (names, tuple(sizes[n] for n in names), None)
        else:
            union = named.union_names([nm for _, nm in values.values()])
            outputs[o.name] = (union, tuple(sizes[n] for n in union), None)
    all_names = {vid: nm for vid, (_, nm) in values.items()}
    for name, arr, like_out in extra:
        out_names, out_shape, _ = outputs[like_out]
        if arr.ndim > len(out_names):
            raise ValueError(f"{where}: {_label(name, arr)} must have the shape of output "
                             f"{like_out} {tuple(out_shape)}")
        nm = out_names[len(out_names) - arr.ndim:]
        for n, s in zip(nm, arr.shape):
            if s not in (1, out_shape[out_names.index(n)]):
                raise ValueError(f"{where}: {_label(name, arr)} must have the shape of output "
                                 f"{like_out} {tuple(out_shape)} (or broadcast to it)")
        all_names[name] = nm
        dtype = np.result_type(dtype, arr.dtype)
    return Shapes(all_names, sizes, outputs, dtype)


_CACHE_LIMIT = 256


def bind(spec: OpSpec, given: dict, layout: Optional[str], where: str,
         extra: Sequence[Tuple[str, object, str]] = (), cache: Optional[dict] = None) -> Bound:
    """Check inputs, attrs and layout. `extra` are (name, value, like-output) cotangent arrays.
    `cache` (one per operator) remembers what the shapes decided for calls with the same ones."""
    layout = choose_layout(spec, layout, where)
    arrays = {i.name: as_array(given[i.name], i.name, i.dtypes, where) for i in spec.inputs
              if not (i.optional and given.get(i.name) is None)}
    extras = [(name, as_array(value, name, FLOAT_DTYPES, where), like) for name, value, like in extra]
    rules = shape_rules(spec)
    # attrs that decide sizes (a conv2d's stride) are checked first; the others after the shapes
    early = check_attrs(spec, given, where) if rules.attrs else None
    key = (layout, tuple((n, a.shape, a.dtype) for n, a in arrays.items()),
           tuple((n, a.shape, a.dtype, like) for n, a, like in extras),
           rules.key(early) if early is not None else ())
    shapes = cache.get(key) if cache is not None else None
    if shapes is None:
        shapes = _shapes(spec, arrays, layout, where, extras, early or {})
        if cache is not None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[key] = shapes
    values = {n: (a, shapes.names[n]) for n, a in arrays.items()}
    for name, arr, _ in extras:
        values[name] = (arr, shapes.names[name])
    outputs = {o: (nm, shape, arrays[like] if like else None)
               for o, (nm, shape, like) in shapes.outputs.items()}
    return Bound(layout, values, shapes.sizes, check_attrs(spec, given, where, shapes.dtype),
                 shapes.dtype, outputs)
