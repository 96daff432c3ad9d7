"""Iteration geometry for a kernel call: the shape and byte strides of every operand.

Dims of size 1 are dropped, the rest ordered by the output's strides (outermost first, as NumPy's
order "K"), and neighbours that are contiguous for every operand are merged, so a contiguous or
uniformly transposed call becomes one flat loop and the kernel's inner dim is the one that moves
fastest in memory.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from ..abi import GEOMETRY_HEAD


# A transposing walk pays off when an input runs against the output's order for a while.
_MIN_TRANSPOSE = 8


def walk_dims(shape: Sequence[int], strides: Sequence[Sequence[int]], lead: int,
              nkey: int) -> List[int]:
    """The dims a walk goes over, outermost first: those of more than one element, in operand
    `lead`'s memory order, ties broken by the others' among the first `nkey` operands."""
    order = [lead] + [k for k in range(nkey) if k != lead]
    dims = [d for d, n in enumerate(shape) if n != 1]
    dims.sort(key=lambda d: tuple(-abs(strides[k][d]) for k in order))
    return dims


def geometry(shape: Sequence[int], strides: Sequence[Sequence[int]], codes: Sequence[int],
             itemsizes: Sequence[int], nout: int, ccode: int, transpose: bool = True,
             nsums: int = 0) -> np.ndarray:
    """The intp array opk_walk reads (templates/opkit_kernel.h): the fields of GEOMETRY_HEAD
    (opkit/abi.py), then shape..., strides[op][dim]..., codes....

    The outputs are the last `nout` operands; the first of them leads: the iteration follows
    its memory order. When an input is contiguous along another dim than the output (an NCHW
    array written into NHWC memory), `tdim` names that dim and the kernel walks in blocks,
    transposing through a buffer, so both sides are read and written in their own order.
    The last `nsums` operands (folded sums' partials) do not steer the order: how they are laid
    out depends on it (Executor._lanes)."""
    nops = len(strides)
    lead = nops - nout
    dims = walk_dims(shape, strides, lead, nops - nsums)
    out_shape: List[int] = []
    out_strides: List[List[int]] = [[] for _ in range(nops)]
    for d in dims:
        n = shape[d]
        if out_shape and all(out_strides[k][-1] == strides[k][d] * n for k in range(nops)):
            out_shape[-1] *= n
            for k in range(nops):
                out_strides[k][-1] = strides[k][d]
        else:
            out_shape.append(n)
            for k in range(nops):
                out_strides[k].append(strides[k][d])
    if not out_shape:
        out_shape = [1]
        out_strides = [[0] for _ in range(nops)]
    tdim = _transposed_dim(out_shape, out_strides, itemsizes, lead) if transpose else -1
    head = {"ndim": len(out_shape), "nops": nops, "nout": nout, "tdim": tdim, "ccode": ccode}
    flat = [head[f] for f in GEOMETRY_HEAD] + out_shape
    for s in out_strides:
        flat.extend(s)
    flat.extend(codes)
    return np.array(flat, dtype=np.intp)


def _transposed_dim(shape: List[int], strides: List[List[int]], itemsizes: Sequence[int],
                    lead: int) -> int:
    """The dim an input is contiguous along when that is not the output's inner dim, or -1."""
    inner = len(shape) - 1
    if inner < 1 or shape[inner] < _MIN_TRANSPOSE or strides[lead][inner] != itemsizes[lead]:
        return -1
    for k in range(lead):
        if abs(strides[k][inner]) <= 4 * itemsizes[k]:
            continue  # near enough to contiguous (or broadcast) along the output's order
        for d in range(inner):
            if strides[k][d] == itemsizes[k] and shape[d] >= _MIN_TRANSPOSE:
                return d
    return -1


def operand_strides(arr: np.ndarray, names: Tuple[str, ...], iter_names: Tuple[str, ...],
                    iter_shape: Tuple[int, ...]) -> List[int]:
    """Byte strides of arr over the iteration dims; 0 where it is broadcast."""
    out = []
    for n, size in zip(iter_names, iter_shape):
        if n in names:
            axis = names.index(n)
            out.append(0 if arr.shape[axis] == 1 else arr.strides[axis])
        else:
            out.append(0)
    return out
