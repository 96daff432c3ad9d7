"""The inputs validation runs on: every layout, sizes around every threshold, stride patterns,
special values, and attrs at their defaults and inside their ranges."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from ..dsl import named
from ..spec.model import LAYOUT_DIMS, LAYOUT_PHYSICAL, DtypeLimit, OpSpec
from ..kinds import AttrType, Op


DIM_SIZES = {"N": 2, "C": 3, "H": 5, "W": 7}


@dataclass
class Case:
    label: str
    layout: str
    arrays: Dict[str, np.ndarray]     # float64 values, cast by the caller
    views: Dict[str, str]             # how each input is laid out: "", "T", "rev", "step"
    attrs: Dict[str, object] = field(default_factory=dict)   # attrs this case sets (a stride)


# Convolutions: (label, N, C, H, W, O, kernel, stride, padding): odd sizes, 1x1, 3x3 and 5x5
# kernels, stride 1 and 2, padding 0, 1 and 2, one image of one pixel, an empty batch, and a
# call large enough to run on every thread.
CONV_CASES = [("3x3 s1 p1", 2, 3, 5, 7, 4, 3, 1, 1), ("1x1 s1 p0 odd", 1, 5, 3, 9, 2, 1, 1, 0),
              ("5x5 s2 p2", 2, 3, 9, 8, 3, 5, 2, 2), ("3x3 s2 p0", 1, 3, 7, 6, 5, 3, 2, 0),
              ("3x3 s1 p2", 1, 2, 4, 5, 3, 3, 1, 2), ("5x5 s1 p0", 1, 2, 6, 7, 2, 5, 1, 0),
              ("1x1 s2 p1", 1, 3, 5, 6, 2, 1, 2, 1), ("unit", 1, 1, 1, 1, 1, 1, 1, 0),
              ("empty", 0, 3, 4, 4, 2, 3, 1, 1), ("threaded", 2, 8, 24, 30, 8, 3, 1, 1)]
_CONV_VIEWS = ("3x3 s1 p1", "5x5 s2 p2")


def _main_input(spec: OpSpec) -> str:
    for o in spec.outputs:
        if o.like:
            return o.like
    return spec.inputs[0].name


def _values(rng, shape, domain, special: bool) -> np.ndarray:
    lo, hi = domain
    arr = rng.uniform(lo, hi, size=shape)
    if special and arr.size >= 16:
        flat = arr.reshape(-1)
        picks = rng.choice(flat.size, size=5, replace=False)
        for p, v in zip(picks, (0.0, -0.0, np.inf, -np.inf, np.nan)):
            flat[p] = v
    return arr


def _full_shapes(spec: OpSpec, layout: str, tile: int, threshold: int) -> List[Tuple[str, Dict[str, int]]]:
    """(label, dim sizes) per case; positional dims are named '@k'."""
    if layout in LAYOUT_DIMS:
        return [("small", dict(DIM_SIZES)),
                ("odd", {"N": 1, "C": 5, "H": 3, "W": 9}),
                ("unit", {"N": 1, "C": 1, "H": 1, "W": 1}),
                ("empty", {"N": 0, "C": 3, "H": 2, "W": 2}),
                ("threaded", {"N": 2, "C": 8, "H": 41, "W": max(threshold // 600, 5)})]
    shapes = [("0-d", ()), ("empty", (0,)), ("one", (1,)), ("odd", (37,)), ("2-d", (5, 7)),
              ("4-d", (2, 3, 4, 5)), ("tile+1", (tile + 1,)), ("threaded", (threshold + 77,))]
    return [(label, dict(zip(named.positional_names(len(s)), s))) for label, s in shapes]


def _conv_shapes(spec: OpSpec) -> List[Tuple[str, Dict[str, int], Dict[str, object]]]:
    """(label, dim sizes, attrs) of the convolution cases, for an operator whose forward pass
    has one conv2d; [] otherwise. A stride or padding written as a number keeps its value."""
    from ..runtime.shapes import shape_rules
    convs = [n for n in shape_rules(spec).calls if n.op == Op.CONV2D]
    if len(convs) != 1:
        return []
    node = convs[0]
    x_dims, w_dims, out_dims = node.params
    out: List[Tuple[str, Dict[str, int], Dict[str, object]]] = []
    for label, n, c, h, w, o, k, stride, pad in CONV_CASES:
        attrs: Dict[str, int] = {}
        for arg, value in zip(node.args[2:], (stride, pad)):
            if arg.op == Op.ATTR:
                attrs[arg.name] = value
        s = attrs.get(node.args[2].name, stride) if node.args[2].op == Op.ATTR else int(node.args[2].value)
        p = attrs.get(node.args[3].name, pad) if node.args[3].op == Op.ATTR else int(node.args[3].value)
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        if oh < 1 or ow < 1:
            continue
        sizes = dict(zip(x_dims, (n, c, h, w)))
        sizes.update({w_dims[0]: o, w_dims[2]: k, w_dims[3]: k, out_dims[2]: oh, out_dims[3]: ow})
        out.append((label, sizes, {**attrs}))
    return out


def make_cases(spec: OpSpec, rng, tile: int = 1024, threshold: int = 32768,
               special: bool = True) -> List[Case]:
    main = _main_input(spec)
    cases = []
    convs = _conv_shapes(spec)
    for layout in spec.layouts:
        anchor = LAYOUT_PHYSICAL.get(layout)
        shapes: List[Tuple[str, Dict[str, int], Dict[str, object]]] = [
            (label, sizes, {}) for label, sizes in _full_shapes(spec, layout, tile, threshold)]
        if convs and layout in LAYOUT_DIMS:
            shapes = convs
        for label, sizes, case_attrs in shapes:
            if anchor is None and any(i.shape for i in spec.inputs) and not sizes:
                continue
            full_names = anchor if anchor else tuple(sorted(sizes, key=lambda n: -int(n[1:])))
            arrays, views = {}, {}
            for k, i in enumerate(spec.inputs):
                if i.shape is not None:
                    shape = tuple(sizes.get(d, 3 + (hash(d) % 3)) for d in i.shape)
                elif (i.layouts_declared and layout in LAYOUT_DIMS) or i.name == main:
                    shape = tuple(sizes[n] for n in full_names)
                else:
                    # a broadcast partner: some dims of size 1, or fewer dims (NumPy rules)
                    full = [sizes[n] for n in full_names]
                    pattern = k % 3
                    if pattern == 1 and full:
                        full = [1 if j % 2 == 0 else s for j, s in enumerate(full)]
                    elif pattern == 2 and len(full) > 1:
                        full = full[1:]
                    shape = tuple(full)
                arrays[i.name] = _values(rng, shape, i.domain, special and i.name == main)
                views[i.name] = ""
            cases.append(Case(f"{layout} {label}", layout, arrays, views, case_attrs))
            if label in ("2-d", "small", "odd", "4-d") + _CONV_VIEWS:
                for view in ("T", "rev", "step"):
                    c = Case(f"{layout} {label} {view}", layout,
                             {k: v.copy() for k, v in arrays.items()}, {k: view for k in arrays},
                             case_attrs)
                    cases.append(c)
    return cases


def smooth(case: Case, spec: OpSpec, rng) -> Case:
    """The case with its special values (0, inf, nan) replaced by ordinary ones."""
    arrays = {}
    for k, v in case.arrays.items():
        lo, hi = spec.input(k).domain
        bad = ~np.isfinite(v) | (v == 0)
        arrays[k] = np.where(bad, rng.uniform(lo, hi, v.shape), v) if bad.any() else v
    return Case(case.label, case.layout, arrays, case.views, case.attrs)


def layout_view(arr: np.ndarray, view: str) -> np.ndarray:
    """The same values in a non-contiguous arrangement (values and shape are unchanged)."""
    if arr.ndim == 0 or view == "":
        return arr
    if view == "T":  # stored transposed: a Fortran-ordered copy
        return np.asfortranarray(arr)
    if view == "rev":  # negative strides along every axis
        buf = np.ascontiguousarray(arr[(slice(None, None, -1),) * arr.ndim])
        return buf[(slice(None, None, -1),) * arr.ndim]
    if view == "step":  # every other element of a bigger buffer
        big = np.zeros(arr.shape[:-1] + (arr.shape[-1] * 2,), dtype=arr.dtype)
        big[..., ::2] = arr
        return big[..., ::2]
    raise ValueError(view)


def case_inputs(case: Case, dtype: str) -> Dict[str, np.ndarray]:
    return {k: layout_view(v.astype(dtype), case.views[k]) for k, v in case.arrays.items()}


def default_attrs(spec: OpSpec) -> Dict[str, object]:
    """A value for every attr: its default (one that depends on the dtype, such as
    `finfo.max`, is left to the call), or one inside its range."""
    out: Dict[str, object] = {}
    for a in spec.attrs:
        if isinstance(a.default, DtypeLimit):
            continue
        if not a.required:
            out[a.name] = a.default
        elif a.type == AttrType.STR:
            out[a.name] = a.choices[0]
        elif a.type == AttrType.BOOL:
            out[a.name] = True
        elif a.range is not None and math.isfinite(a.range.low) and math.isfinite(a.range.high):
            mid = (a.range.low + a.range.high) / 2
            out[a.name] = int(round(mid)) if a.type == AttrType.INT else mid
        else:
            out[a.name] = 1 if a.type == AttrType.INT else 0.5
    return out


def attr_samples(spec: OpSpec, rng, count: int = 2) -> List[Dict[str, object]]:
    """The defaults, then `count` random points inside each attr's range."""
    samples = [default_attrs(spec)]
    for _ in range(count):
        attrs: Dict[str, object] = {}
        for a in spec.attrs:
            lo, hi = (a.range.low, a.range.high) if a.range else (-2.0, 2.0)
            lo, hi = max(lo, -4.0), min(hi, 4.0)
            if a.type == AttrType.BOOL:
                attrs[a.name] = bool(rng.integers(2))
            elif a.type == AttrType.STR:
                attrs[a.name] = a.choices[int(rng.integers(len(a.choices)))]
            elif a.type == AttrType.INT:
                attrs[a.name] = int(rng.integers(int(math.ceil(lo)), int(math.floor(hi)) + 1)) \
                    if math.floor(hi) >= math.ceil(lo) else default_attrs(spec)[a.name]
            else:
                v = float(rng.uniform(lo, hi)) if hi > lo else lo
                attrs[a.name] = v if a.range is None or v in a.range else default_attrs(spec)[a.name]
        samples.append(attrs)
    return samples
