"""Primitives that are not elementwise: they become library calls between fused kernels.

Each has a NumPy implementation over named arrays (shared by the runtime and the reference, since
both run the same NumPy code), a dims rule and a derivative rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from . import named
from .ir import Node


@dataclass(frozen=True)
class LibraryPrimitive:
    name: str
    run: Callable      # (ctx, args: [(ndarray, names)], params) -> (ndarray, names)
    vjp: Optional[Callable]
    tbe: str           # how the listing shows the call
    doc: str = ""


LIBRARY: Dict[str, LibraryPrimitive] = {}


def register(p: LibraryPrimitive) -> LibraryPrimitive:
    LIBRARY[p.name] = p
    return p


class Context:
    """What a library call may look at besides its arguments: the bound inputs of the call."""

    def __init__(self, inputs: Dict[str, Tuple[np.ndarray, Tuple[str, ...]]], accumulate=None):
        self.inputs = inputs
        self.accumulate = accumulate  # dtype for sums (float64 in the reference)


def _run_sum_to(ctx: Context, args, params):
    (arr, names), = args
    target, target_names = ctx.inputs[params[0]]
    out = named.sum_to(arr, names, target_names, target.shape, dtype=ctx.accumulate)
    return out, target_names


def sum_to(value: Node, input_node: Node) -> Node:
    """The gradient `value` reduced over the dims its input was broadcast along."""
    return Node("sum_to", (value,), (input_node.name,), "float", input_node.dims)


register(LibraryPrimitive("sum_to", _run_sum_to, None, "vreduce_sum",
                          "sum a gradient over the dims its input was broadcast along"))
