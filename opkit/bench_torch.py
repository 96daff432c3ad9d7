"""PyTorch's own computation of the bundled and catalogue operators: the bench's torch column.

Each entry takes the call's tensors (every per-element input already shaped to broadcast against
the first input, in its memory order) and attrs, and returns the result with PyTorch's kernels.
The backward is PyTorch autograd through the same expression (or aten's own backward kernel
where PyTorch has one that writes into a given tensor, as opkit does with out=).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

Expr = Callable[..., object]


def _table(torch, F) -> Dict[str, Expr]:
    def fused_bias(t, a):
        y = F.leaky_relu(t["x"] + t["bias"], a["alpha"]) * a["gain"]
        return y if a["clamp"] is None else y.clamp(-a["clamp"], a["clamp"])

    def conditional(t, a, aligned):
        s = torch.sigmoid(t["z"] @ t["w"] + t["b"])
        alpha = aligned(a["alpha_min"] + (a["alpha_max"] - a["alpha_min"]) * s, ("N", "C"))
        return torch.where(t["x"] > 0, t["x"], alpha * t["x"])

    return {
        "leaky_relu": lambda t, a: F.leaky_relu(t["x"], a["alpha"]),
        "leakyrelu": lambda t, a: F.leaky_relu(t["x"], a["alpha"]),
        "spatial_leaky_relu": lambda t, a: torch.where(t["x"] > 0, t["x"], t["alpha_map"] * t["x"]),
        "conditional_leaky_relu": conditional,
        "fused_bias_leaky_relu": fused_bias,
        "relu": lambda t, a: F.relu(t["x"]),
        "relu6": lambda t, a: F.relu6(t["x"]),
        "sigmoid": lambda t, a: torch.sigmoid(t["x"]),
        "tanh": lambda t, a: torch.tanh(t["x"]),
        "elu": lambda t, a: F.elu(t["x"], a["alpha"]),
        "celu": lambda t, a: F.celu(t["x"], a["alpha"]),
        "selu": lambda t, a: F.selu(t["x"]),
        "gelu": lambda t, a: F.gelu(t["x"], approximate=a["approximate"]),
        "mish": lambda t, a: F.mish(t["x"]),
        "silu": lambda t, a: F.silu(t["x"]),
        "logsigmoid": lambda t, a: F.logsigmoid(t["x"]),
        "hardswish": lambda t, a: F.hardswish(t["x"]),
        "softsign": lambda t, a: F.softsign(t["x"]),
        "softplus": lambda t, a: F.softplus(t["x"], a["beta"], a["threshold"]),
        "hardtanh": lambda t, a: F.hardtanh(t["x"], a["min_val"], a["max_val"]),
        "prelu": lambda t, a: torch.where(t["x"] > 0, t["x"], t["slope"] * t["x"]),
    }


def torch_pass(name: str, pass_: str, tensors: Dict[str, object], attrs: Dict[str, object],
               dy, grads_out, aligned, raw: Dict[str, object],
               compiled: bool = False) -> Optional[Callable[[], object]]:
    """A call of PyTorch doing what opkit's `name` does in `pass_` (forward, or backward with
    the output gradient `dy`), or None when PyTorch has no such computation here.
    `grads_out`: tensors the backward may write into (aten's leaky_relu_backward does);
    `aligned(tensor, dims)` shapes a tensor over named dims to broadcast against x; `raw` are
    the inputs as given (a matmul's operands). `compiled`: the same formula through
    torch.compile (inductor, default mode; its backward is the compiled graph's): compiled and
    run once here, None where that fails (no working compiler)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    expr = _table(torch, F).get(name)
    if expr is None:
        return None
    if name == "conditional_leaky_relu":  # its z, w, b enter a matmul as they are
        tensors = {**raw, "x": tensors["x"]}
        call = lambda t: expr(t, attrs, aligned)
    else:
        call = lambda t: expr(t, attrs)
    if compiled:
        return _compiled(torch, call, pass_, tensors, dy)
    if pass_ == "forward":
        return lambda: call(tensors)
    if name == "leaky_relu" and grads_out is not None:
        op = torch.ops.aten.leaky_relu_backward.grad_input
        x, out = tensors["x"], grads_out[0]
        return lambda: op(dy, x, attrs["alpha"], False, grad_input=out)
    leaves = {k: (v.detach().clone().requires_grad_() if v.is_floating_point() else v)
              for k, v in tensors.items()}
    y = call(leaves)
    wrt = [v for v in leaves.values() if v.requires_grad]
    return lambda: torch.autograd.grad(y, wrt, dy, retain_graph=True)


def _compiled(torch, call, pass_, tensors, dy) -> Optional[Callable[[], object]]:
    """`call` through torch.compile, warmed up (compiled) once; None if compiling fails."""
    fn = torch.compile(call)
    try:
        if pass_ == "forward":
            fn(tensors)
            return lambda: fn(tensors)
        leaves = {k: (v.detach().clone().requires_grad_() if v.is_floating_point() else v)
                  for k, v in tensors.items()}
        wrt = [v for v in leaves.values() if v.requires_grad]

        def step():  # the compiled forward and its compiled backward, as training runs them
            return torch.autograd.grad(fn(leaves), wrt, dy)
        step()
        return step
    except Exception:  # noqa: BLE001 - inductor's failures are many kinds; the column stays empty
        return None
