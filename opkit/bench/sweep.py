"""`opkit bench NAME...`: the generic sweep. Each operator on inputs shaped like its first input,
in every size, dtype, layout and pass asked for, against the copy of the same bytes, NumPy
running the same graph and PyTorch's own computation (torch_columns.py), eager and compiled."""
from __future__ import annotations

import math
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._options import attr_option
from .harness import Row, timed, torch_modules
from .torch_columns import torch_pass


def _shape_for(size: int, layout: str) -> Tuple[int, ...]:
    """About `size` elements (at most): two images of 64 channels, or (small sizes) one image
    of one channel, at least 3 x 3 (a convolution's kernel fits)."""
    if layout == "ND":
        return (size,)
    n, c = (2, 64) if size >= 4096 else (1, 1)
    side = max(int(math.sqrt(size / (n * c))), 3)
    if side >= 32:  # a multiple of 16: no prime sides for the FFTs of freq_leaky_relu
        side -= side % 16
    return (n, c, side, side) if layout == "NCHW" else (n, side, side, c)


NUMPY_LIMIT = 1.0  # seconds per call beyond which the generic cases leave NumPy's column out


def generic_rows(names: List[str], sizes: List[int], dtypes: List[str], layouts: List[str],
                 passes: List[str], repeat: int, rng, budget: float = 1.0,
                 progress=None, notes: Optional[List[str]] = None,
                 compiled: bool = True, attrs: Sequence[str] = (),
                 dims: Optional[Dict[str, int]] = None) -> List[Row]:
    """Each operator on inputs shaped like its first input, against the copy of the same bytes,
    NumPy running the same graph in the same dtype and PyTorch's own kernels where PyTorch has
    the computation (torch_columns.py). Every side writes into memory it has written before
    (opkit and the copy through out=), so page faults are nobody's. Each case takes about
    `budget` seconds (see timed); `progress(text)` hears of each case as it starts.
    A case the operator does not take (a convolution's kernel larger than the image) is left
    out, and NumPy's column where one call would take longer than NUMPY_LIMIT seconds (predicted
    from the case's smaller size: its float16 convolutions take half a minute at 16M); `notes`
    hears of both. `compiled`: a torch.compile column beside PyTorch's eager one (each case
    compiles its formula first). `attrs`: NAME=VALUE texts, each set on the operators that have
    the attr (the others keep their defaults; an attr none of them has is an error). `dims`:
    sizes of named dims (a softmax's K); with any of N, C, H, W they shape the 4-d inputs, and
    `sizes` is not used."""
    import opkit
    chosen = {name: _chosen_attrs(opkit.get(name), attrs) for name in names}
    unused = [t for t in attrs if not any(t.partition("=")[0] in c for c in chosen.values())]
    if unused:
        have = sorted({a.name for n in names for a in opkit.get(n).spec.attrs})
        raise ValueError(f"--attr {unused[0]!r}: none of {', '.join(names)} has the attr "
                         f"{unused[0].partition('=')[0]!r} (their attrs: {', '.join(have) or 'none'})")
    dims = dims or {}
    if any(d in dims for d in "NCHW"):
        sizes = [0]  # (the dims give the shape)
    cases = [(name, layout, size, dtype, pass_)
             for name in names for layout in _layouts_of(opkit.get(name), layouts)
             for size in sorted(sizes) for dtype in dtypes if dtype in opkit.get(name).spec.dtypes
             for pass_ in passes]
    rows, numpy_rate = [], {}
    notes = notes if notes is not None else []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # (FusionWarning at build: `opkit show` tells it)
        start = time.perf_counter()
        for i, case in enumerate(cases):
            label = f"{_named(case[0], chosen[case[0]])} {case[4]} {case[1]} " \
                f"{_size_text(case[2]) if case[2] else _dims_text(dims)} {case[3]}"
            if progress is not None:
                elapsed = int(time.perf_counter() - start)
                progress(f"[{i + 1}/{len(cases)} {elapsed // 60}:{elapsed % 60:02d}] {label}")
            key = case[:2] + case[3:]
            predicted = numpy_rate.get(key, 0.0) * case[2]
            if predicted > NUMPY_LIMIT:
                notes.append(f"{label}: NumPy's column left out (about {predicted:.2g} s a call)")
            try:
                row = _generic_row(*case, repeat, rng, budget, numpy=predicted <= NUMPY_LIMIT,
                                   compiled=compiled, chosen=chosen[case[0]], dims=dims)
            except ValueError as exc:  # (SpecError too) opkit refuses these shapes; it says why
                notes.append(f"{label}: skipped: {exc}")
                continue
            if row is not None:
                rows.append(row)
                if "numpy" in row.seconds and case[2] >= 4096:  # (per element, not per call)
                    numpy_rate[key] = row.seconds["numpy"] / case[2]
    return rows


def _layouts_of(op, layouts: List[str]) -> List[str]:
    return [l for l in layouts if l in op.spec.layouts] or [op.spec.layouts[0]]


def _dims_text(dims: Dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def _size_text(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else \
        f"{n >> 10}K" if n >= 1 << 10 and n % (1 << 10) == 0 else str(n)


# sizes of the dims an operator's other inputs have beyond N, C, H, W (a conv's kernel, a z)
_OTHER_DIMS = {"KH": 3, "KW": 3, "R": 3, "S": 3}


def _chosen_attrs(op, texts: Sequence[str]) -> Dict[str, object]:
    """The NAME=VALUE texts naming an attr of `op`, read as its declared types."""
    names = {a.name for a in op.spec.attrs}
    return dict(attr_option(op, t) for t in texts if t.partition("=")[0] in names)


def _named(name: str, chosen: Dict[str, object]) -> str:
    """gelu, or gelu[approximate=tanh] where attrs were chosen."""
    return name + (f"[{','.join(f'{k}={v}' for k, v in chosen.items())}]" if chosen else "")


def _generic_row(name, layout, size, dtype, pass_, repeat, rng, budget,
                 numpy: bool = True, compiled: bool = True,
                 chosen: Optional[Dict[str, object]] = None,
                 dims: Optional[Dict[str, int]] = None) -> Optional[Row]:
    import opkit
    from ..runtime.bind import bind
    from ..validate.cases import default_attrs
    from ..validate.reference import evaluate
    op = opkit.get(name)
    if pass_ == "backward" and not op.graphs.differentiable:
        return None
    attrs = dict(default_attrs(op.spec), **(chosen or {}))
    shape = _shape_for(size or 4096, layout)
    logical = dict(zip(("N", "C", "H", "W"), shape if layout != "NHWC" else
                       (shape[0], shape[3], shape[1], shape[2])))
    logical.update(dims or {})
    if layout in ("NCHW", "NHWC"):
        shape = tuple(logical[d] for d in layout)
    inputs = {}
    for i in op.spec.inputs:
        s = tuple(d if isinstance(d, int) else logical.get(d, _OTHER_DIMS.get(d, 16))
                  for d in i.shape) if i.shape else shape
        lo, hi = i.domain
        lo, hi = max(lo, -4.0), min(hi, 4.0)   # (float32 draws: a 16M case sets up fast)
        inputs[i.name] = (rng.random(s, dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)).astype(dtype)
    main = inputs[op.spec.inputs[0].name]
    shape, size = main.shape, size or main.size
    kw = dict(inputs, **attrs)
    if op.spec.layouts[0] != "ND":
        kw["layout"] = layout
    bound = bind(op.spec, {**inputs, **attrs}, layout, name)
    if pass_ == "forward":
        outs = tuple(np.empty(bound.outputs[o.name][1], dtype) for o in op.spec.outputs)
        fn = lambda: op(**kw, out=outs if len(outs) > 1 else outs[0])
        nbytes = sum(a.nbytes for a in inputs.values()) + sum(o.nbytes for o in outs)
        graph, values = op.graphs.forward, dict(bound.values)
        dys, grads = None, None
    else:
        dys = tuple(rng.standard_normal(bound.outputs[o.name][1], dtype=np.float32).astype(dtype)
                    for o in op.spec.outputs)
        extra = [(f"d{o.name}", d, o.name) for o, d in zip(op.spec.outputs, dys)]
        bound = bind(op.spec, {**inputs, **attrs}, layout, name, extra)
        takes = op.graphs.differentiable
        grads = tuple(np.empty_like(inputs[n]) if n in takes else None for n in op.spec.input_names)
        dy = dys if len(dys) > 1 else dys[0]
        fn = lambda: op.backward(dy, **kw, out=grads)
        nbytes = (sum(a.nbytes for a in inputs.values()) + sum(d.nbytes for d in dys)
                  + sum(g.nbytes for g in grads if g is not None))
        graph, values = op.graphs.backward, dict(bound.values)
    dst = np.empty_like(main)
    fns = {"opkit": fn, "copy": lambda: np.copyto(dst, main),
           "numpy": (lambda: evaluate(graph, values, bound.attrs, dtype=np.dtype(dtype))) if numpy else None}
    fns["torch"] = _torch_column(op, pass_, bound, attrs, dys, grads, layout)
    if compiled and fns["torch"] is not None:
        fns["torch.compile"] = _torch_column(op, pass_, bound, attrs, dys, grads, layout, compiled=True)
    rounds: Dict[str, List[float]] = {}
    t = timed(fns, repeat, budget=budget, rounds=rounds)
    # the copy moves one input's bytes twice (read, write); scale it to this call's traffic
    t["copy"] *= nbytes / (2 * main.nbytes)
    rounds["copy"] = [c * nbytes / (2 * main.nbytes) for c in rounds["copy"]]
    # (the rounds are kept: "vs copy" and "x torch" are medians of round-by-round ratios, so a
    # burst of load on the machine that slows both sides of one round cancels out)
    where = _size_text(size) if not dims else "[" + ",".join(map(str, shape)) + "]"
    return Row(f"{_named(name, chosen or {})} {pass_} {layout} {where}", name, pass_,
               dtype, shape, nbytes, t, rounds)


def _torch_column(op, pass_, bound, attrs, dys, grads, layout, compiled: bool = False):
    """PyTorch's computation of the same call over the same memory, or None; `compiled`: the
    same formula through torch.compile."""
    torch, _ = torch_modules()
    if torch is None or (dys is not None and len(dys) != 1):
        return None
    from ..dsl import named
    x_arr, x_names = bound.values[op.spec.inputs[0].name]
    tensors, raw = {}, {}
    for name, (arr, names) in bound.values.items():
        if name not in op.spec.input_names:
            continue  # an output gradient
        raw[name] = torch.from_numpy(arr)
        shaped = bool(op.spec.input(name).shape) and all(n in x_names for n in names)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(
            named.expand_to(arr, names, x_names) if shaped else arr))

    def aligned(t, dims):
        order = [d for d in x_names if d in dims]
        t = t.permute(*[dims.index(d) for d in order])
        return t.reshape([t.shape[order.index(d)] if d in order else 1 for d in x_names])

    dy = torch.from_numpy(dys[0]) if dys is not None else None
    gouts = [torch.from_numpy(g) for g in grads if g is not None] if grads is not None else None
    # (written once here, so its pages are mapped before the timing, as opkit's out= are)
    out = torch.zeros_like(tensors[op.spec.inputs[0].name]) if pass_ == "forward" else None
    return torch_pass(op.name, pass_, tensors, dict(attrs, _layout=layout), dy, gouts, aligned,
                      raw, compiled, out)
