"""max, min and logsumexp by the operator's module (templates/opkit_reduce.h, `opk_reduce`).

The library records (dsl/library.py) keep the meaning of these reductions in NumPy, which the
reference runs; the runtime first offers a call to the module, which reduces an array whose
reduced dims are one evenly spaced run and whose kept dims are another, one of the two
contiguous (a softmax's rows, a max over C of NCHW), in float16, float32 or float64.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ..lower.reduce import COMPILED_REDUCTIONS


def _run(arr: np.ndarray, axes) -> Optional[Tuple[int, int]]:
    """(size, stride in bytes) of `axes` walked as one run (the largest stride first), or None
    where they are not evenly spaced in memory."""
    axes = sorted((a for a in axes if arr.shape[a] != 1), key=lambda a: -abs(arr.strides[a]))
    size, stride = 1, arr.itemsize
    for i, a in enumerate(axes):
        if i + 1 < len(axes) and arr.strides[a] != arr.strides[axes[i + 1]] * arr.shape[axes[i + 1]]:
            return None
        size, stride = size * arr.shape[a], arr.strides[a]
    return size, stride


def compiled_reduction(module, prim: str, arr: np.ndarray, names: Tuple[str, ...],
                       keep: Tuple[str, ...], threads: int) -> Optional[np.ndarray]:
    """`prim` of `arr` over the dims not in `keep`, by the module, its result's dims in the
    order `names` has them (float32 for float16 data); None where the module cannot take the
    call (none compiled, another dtype, a memory order it lacks, nothing to reduce)."""
    fn = getattr(module, "opk_reduce", None)
    if fn is None or prim not in COMPILED_REDUCTIONS or \
            arr.dtype not in (np.float16, np.float32, np.float64):
        return None
    kept = [i for i, n in enumerate(names) if n in keep]
    rows, runs = _run(arr, kept), _run(arr, [i for i, n in enumerate(names) if n not in keep])
    if rows is None or runs is None or not rows[0] or not runs[0] or len(kept) == arr.ndim:
        return None
    # kept dims in memory order, so that they are one run of outputs; then put back in order
    order = sorted(kept, key=lambda a: -abs(arr.strides[a]))
    out = np.empty([arr.shape[a] for a in order], np.float32 if arr.dtype == np.float16 else arr.dtype)
    # runs start at the array's first element (index 0 along every dim)
    if not fn(arr, rows[0], rows[1], runs[0], runs[1], out, COMPILED_REDUCTIONS[prim], threads):
        return None
    return out.transpose([order.index(a) for a in kept])
