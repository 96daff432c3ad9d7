"""The integer reference: a forward graph evaluated in exact integers, as integer kernels mean it.

Values are NumPy int64 (exact for int8, int16 and int32 data and the products the kernels allow);
a quantized attr multiplies as ``(x * m + 2**(bits - 1)) >> bits``; results saturate to the
output dtype's range. Integer kernels must match this bit for bit.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ..dsl import named
from ..dsl.graph import Graph
from ..dsl.primitives import PRIMITIVES
from ..quantize import fixed_point
from ..spec.model import OpSpec
from ..kinds import Op, ValueKind

_INT_NUMPY = {Op.ABS: np.abs}


def evaluate_int(spec: OpSpec, graph: Graph, values: Dict[str, tuple], attrs: Dict[str, object]):
    quant = {a.name: a.quantize for a in spec.attrs if a.quantize is not None}
    env: Dict[int, tuple] = {}
    fixed: Dict[int, Tuple[int, int]] = {}  # node id of a quantized attr -> (m, bits)
    for n in graph.nodes():
        if n.op == Op.INPUT:
            arr, nm = values[n.name]
            env[id(n)] = (arr.astype(np.int64), nm)
        elif n.op == Op.ATTR:
            v = attrs[n.name]
            if n.name in quant:
                if not isinstance(v, (int, float)):
                    raise TypeError(f"{n.name} is quantized: it takes a number, got {v!r}")
                m, bits, _ = fixed_point(v, quant[n.name])
                fixed[id(n)] = (m, bits)
                env[id(n)] = (np.asarray(m, np.int64), ())
            else:
                env[id(n)] = (np.asarray(v, dtype=bool if n.kind == ValueKind.BOOL else np.int64), ())
        elif n.op == Op.CONST:
            env[id(n)] = (np.asarray(n.value, dtype=bool if n.kind == ValueKind.BOOL else np.int64), ())
        else:
            args = [env[id(a)] for a in n.args]
            names, _, views = named.align(args, [f"argument {i}" for i in range(len(args))])
            q = [fixed.get(id(a)) for a in n.args]
            factor = (q[1] or q[0]) if n.op == Op.MUL else None  # a fixed-point attr's (m, bits)
            if factor is not None:
                k = 0 if q[1] else 1  # the value multiplied by the fixed-point attr
                m, bits = factor
                result = (views[k] * m + (1 << (bits - 1))) >> bits
            else:
                result = _INT_NUMPY.get(n.op, PRIMITIVES[n.op].numpy)(*views)
            env[id(n)] = (np.asarray(result), names)
    return {name: env[id(node)] for name, node in graph.outputs}


def saturate(arr: np.ndarray, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(arr, info.min, info.max).astype(dtype)
