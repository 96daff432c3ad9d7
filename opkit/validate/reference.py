"""The NumPy reference: a graph evaluated node by node in float64, broadcasting by dim name."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ..dsl import named
from ..dsl.graph import Graph
from ..dsl.library import LIBRARY, Context
from ..dsl.primitives import PRIMITIVES

Value = Tuple[np.ndarray, Tuple[str, ...]]


def evaluate(graph: Graph, values: Dict[str, Value], attrs: Dict[str, object],
             masks: Optional[List[np.ndarray]] = None, dtype=np.float64) -> Dict[str, Value]:
    """Outputs of `graph` for inputs `values` (name -> (array, names)) in float64 (or in
    `dtype`: the benchmark's plain-NumPy run of the same formula).

    With `masks`, every true/false intermediate is appended to it (to detect kinks)."""
    env: Dict[int, Value] = {}
    dtype = np.dtype(dtype)
    inputs = {k: (v[0].astype(dtype, copy=False), v[1]) for k, v in values.items()}
    ctx = Context(inputs, accumulate=np.float64 if dtype == np.float64 else None)
    with np.errstate(all="ignore"):
        for n in graph.nodes():
            if n.op == "input":
                env[id(n)] = inputs[n.name]
            elif n.op == "attr":
                v = attrs[n.name]
                env[id(n)] = (np.asarray(v, dtype=bool if n.kind == "bool" else dtype), ())
            elif n.op == "const":
                env[id(n)] = (np.asarray(n.value, dtype=bool if n.kind == "bool" else dtype), ())
            elif n.op in PRIMITIVES:
                args = [env[id(a)] for a in n.args]
                names, _, views = named.align(args, [f"argument {i}" for i in range(len(args))])
                result = np.asarray(PRIMITIVES[n.op].numpy(*views))
                if n.kind == "float":
                    result = result.astype(dtype, copy=False)
                env[id(n)] = (result, names)
                if masks is not None and n.kind == "bool":
                    masks.append(result)
            else:
                env[id(n)] = LIBRARY[n.op].run(ctx, [env[id(a)] for a in n.args], n.params)
    return {name: env[id(node)] for name, node in graph.outputs}


def shaped(value: Value, names: Tuple[str, ...], shape: Tuple[int, ...]) -> np.ndarray:
    """A reference output in the layout of the compiled result."""
    arr, nm = value
    extra = [n for n in nm if n not in names]
    if extra:
        raise ValueError(f"the result has dims {extra} that the output does not have")
    return np.broadcast_to(named.expand_to(arr, nm, names), shape)
