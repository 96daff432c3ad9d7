"""Arrays whose axes carry dim names, and NumPy broadcasting by name.

Inputs declared with a layout or a shape have named dims (N, C, H, W, K ...); layout-agnostic
inputs are named by position from the right ('@0' is the last axis), which makes name-alignment
the same thing as NumPy broadcasting. Both the runtime and the NumPy reference use these helpers.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

Names = Tuple[str, ...]


# a positional dim's name: this mark and its place from the right (no declared dim name has it)
POSITIONAL = "@"


def positional_names(ndim: int) -> Names:
    return tuple(f"{POSITIONAL}{ndim - 1 - i}" for i in range(ndim))


def is_positional(name: str) -> bool:
    return name.startswith(POSITIONAL)


def from_right(name: str) -> int:
    """A positional dim's place from the right: 0 for the last axis."""
    return int(name[len(POSITIONAL):])


def describe(name: str) -> str:
    return f"axis -{from_right(name) + 1}" if is_positional(name) else f"dim {name}"


def union_names(all_names: Sequence[Names]) -> Names:
    """Ordered union: the longest name list first, then names not seen yet, in order."""
    out: List[str] = []
    for names in sorted(all_names, key=len, reverse=True):
        for n in names:
            if n not in out:
                out.append(n)
    # positional names keep NumPy's order (outermost first) even when they come from several arrays
    pos = sorted((n for n in out if is_positional(n)), key=lambda n: -from_right(n))
    it = iter(pos)
    return tuple(next(it) if is_positional(n) else n for n in out)


def dim_sizes(values: Sequence[Tuple[np.ndarray, Names]], labels: Sequence[str],
              exact: Sequence[bool] = ()) -> Dict[str, int]:
    """The size of every dim. A size of 1 broadcasts, except in the values marked exact (inputs
    with declared dims: their sizes are what the declaration says). ValueError names the
    clashing arguments."""
    sizes: Dict[str, int] = {}
    owner: Dict[str, str] = {}
    firm: Dict[str, bool] = {}
    exact = list(exact) + [False] * (len(values) - len(exact))
    for (arr, names), label, strict in zip(values, labels, exact):
        for n, s in zip(names, arr.shape):
            if n not in sizes or (sizes[n] == 1 and not firm[n] and s != 1):
                sizes[n], owner[n], firm[n] = s, label, strict
            elif sizes[n] == s:
                firm[n] = firm[n] or strict
            elif s == 1 and not strict:
                continue
            else:
                rule = "sizes must match" if strict or firm[n] else "sizes must match or be 1"
                raise ValueError(f"{label} has size {s} along {describe(n)} but {owner[n]} has "
                                 f"size {sizes[n]} ({rule})")
    return sizes


def expand_to(arr: np.ndarray, names: Names, target: Names) -> np.ndarray:
    """A view of arr with axes in `target` order; missing dims become size-1 axes."""
    perm = [names.index(n) for n in target if n in names]
    view = arr.transpose(perm) if perm != list(range(arr.ndim)) else arr
    shape = []
    it = iter(view.shape)
    for n in target:
        shape.append(next(it) if n in names else 1)
    return view.reshape(shape)


def align(values: Sequence[Tuple[np.ndarray, Names]], labels: Sequence[str]):
    """Broadcast by name: (names of the result, sizes, views expanded to those names)."""
    target = union_names([n for _, n in values])
    sizes = dim_sizes(values, labels)
    return target, sizes, [expand_to(a, n, target) for a, n in values]


def total(arr: np.ndarray, axis, dtype=None, keepdims: bool = False) -> np.ndarray:
    """arr.sum(axis): inf + -inf is NaN and a float32 sum may pass its largest value, as in a
    kernel, without NumPy's warning."""
    with np.errstate(invalid="ignore", over="ignore"):
        return arr.sum(axis=axis, dtype=dtype, keepdims=keepdims)


def sum_to(arr: np.ndarray, names: Names, target_names: Names, target_shape: Tuple[int, ...],
           dtype=None) -> np.ndarray:
    """Reduce (or expand) a gradient to the shape of the input it belongs to."""
    extra = tuple(i for i, n in enumerate(names) if n not in target_names)
    if extra:
        arr = total(arr, extra, dtype)
        names = tuple(n for n in names if n in target_names)
    keep = tuple(i for i, n in enumerate(names)
                 if arr.shape[i] != 1 and target_shape[target_names.index(n)] == 1)
    if keep:
        arr = total(arr, keep, dtype, keepdims=True)
    out = expand_to(arr, names, target_names)
    if out.shape != tuple(target_shape):
        out = np.broadcast_to(out, target_shape)
    return out
