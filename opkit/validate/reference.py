"""The NumPy reference: a graph evaluated node by node in float64, broadcasting by dim name."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..dsl import named
from ..dsl.graph import Graph
from ..dsl.ir import Node, format_expr, topo_order
from ..dsl.library import LIBRARY, Context, derive_sizes, input_sizes
from ..dsl.primitives import PRIMITIVES
from ..kinds import Op, ValueKind

Value = Tuple[np.ndarray, Tuple[str, ...]]


def evaluate(graph: Graph, values: Dict[str, Value], attrs: Dict[str, object],
             masks: Optional[List[np.ndarray]] = None, dtype=np.float64,
             jitter: Optional[Callable] = None) -> Dict[str, Value]:
    """Outputs of `graph` for inputs `values` (name -> (array, names)) in float64 (or in
    `dtype`: the benchmark's plain-NumPy run of the same formula).

    With `masks`, the values of the graph's kink conditions (graph.kinks) are appended to it.
    `jitter(node, array)` may replace the value of each library call (validation's conditioning
    estimate moves them by a rounding)."""
    env: Dict[int, Value] = {}
    dtype = np.dtype(dtype)
    inputs = {k: (v[0].astype(dtype, copy=False), v[1]) for k, v in values.items()}
    kinks = graph.kinks if masks is not None else ()
    roots = [*graph.output_nodes, *kinks]
    order = topo_order(roots)
    sizes = derive_sizes(order, input_sizes(inputs), lambda n: _number(n, attrs))
    ctx = Context(inputs, accumulate=np.float64 if dtype == np.float64 else None, sizes=sizes)
    # an intermediate is dropped after its last use: a long expression keeps few arrays alive
    uses = Counter(id(a) for n in order for a in n.args)
    keep = {id(n) for n in roots}
    with np.errstate(all="ignore"):
        for n in order:
            env[id(n)] = _value(n, env, inputs, attrs, ctx, dtype)
            if jitter is not None and n.op in LIBRARY:
                env[id(n)] = (jitter(n, env[id(n)][0]), env[id(n)][1])
            for a in n.args:
                uses[id(a)] -= 1
                if not uses[id(a)] and id(a) not in keep:
                    del env[id(a)]
    if masks is not None:
        masks.extend(env[id(k)][0] for k in kinks)
    return {name: env[id(node)] for name, node in graph.outputs}


def _number(n: Node, attrs: Dict[str, object]) -> float:
    """The number a scalar argument of a library call (an attr or a constant) stands for."""
    value = attrs[n.name] if n.op == Op.ATTR else n.value
    if not isinstance(value, (int, float)):
        raise TypeError(f"{format_expr(n)} is {value!r}, not a number")
    return value


def _value(n, env, inputs, attrs, ctx: Context, dtype) -> Value:
    if n.op == Op.INPUT:
        return inputs[n.name]
    if n.op in (Op.ATTR, Op.CONST):
        v = attrs[n.name] if n.op == Op.ATTR else n.value
        return np.asarray(v, dtype=bool if n.kind == ValueKind.BOOL else dtype), ()
    args = [env[id(a)] for a in n.args]
    if n.op not in PRIMITIVES:
        return LIBRARY[n.op].run(ctx, args, n.params)
    names, _, views = named.align(args, [f"argument {i}" for i in range(len(args))])
    result = np.asarray(PRIMITIVES[n.op].numpy(*views))
    if n.kind == ValueKind.FLOAT:
        result = result.astype(dtype, copy=False)
    return result, names


def shaped(value: Value, names: Tuple[str, ...], shape: Tuple[int, ...]) -> np.ndarray:
    """A reference output in the layout of the compiled result."""
    arr, nm = value
    extra = [n for n in nm if n not in names]
    if extra:
        raise ValueError(f"the result has dims {extra} that the output does not have")
    return np.broadcast_to(named.expand_to(arr, nm, names), shape)
