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

    def over_c(fn):  # fn over the last dim, applied to the channel dim of NCHW or NHWC
        def run(t, a):
            x = t["x"] if a["_layout"] == "NHWC" else t["x"].permute(0, 2, 3, 1)
            vec = {k: v.reshape(-1) for k, v in t.items() if k != "x"}
            y = fn(x, vec, a)
            return y if a["_layout"] == "NHWC" else y.permute(0, 3, 1, 2)
        return run

    def group_norm(t, a):
        x = t["x"]
        n, g = x.shape[:2]
        w, b = (t[k].reshape(-1) if k in t else None for k in ("weight", "bias"))
        return F.group_norm(x.reshape(n, -1, *x.shape[3:]), g, w, b, a["eps"]).reshape(x.shape)

    return {
        "softmax": lambda t, a: torch.softmax(t["x"], -1),
        "log_softmax": lambda t, a: torch.log_softmax(t["x"], -1),
        "logsumexp": lambda t, a: torch.logsumexp(t["x"], -1),
        "rms_norm": over_c(lambda x, v, a: F.rms_norm(x, x.shape[-1:], v.get("weight"), a["eps"])),
        "layer_norm": over_c(lambda x, v, a: F.layer_norm(x, x.shape[-1:], v.get("weight"),
                                                          v.get("bias"), a["eps"])),
        "pixel_norm": over_c(lambda x, v, a: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + a["eps"])),
        "group_norm": group_norm,
        "minibatch_stddev": lambda t, a: ((t["x"] - t["x"].mean(0)).square().mean(0)
                                          + a["eps"]).sqrt().mean((1, 2, 3)),
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


# SELU's constants, as PyTorch has them (torch.nn.SELU)
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _elu_args(name: str, a) -> Optional[tuple]:
    """(alpha, scale, input_scale) of aten's elu for the ELU family (CELU is ELU with input
    scale 1 / alpha, as PyTorch computes it)."""
    if name == "elu":
        return a["alpha"], 1.0, 1.0
    if name == "celu":
        return a["alpha"], 1.0, 1.0 / a["alpha"]
    return (_SELU_ALPHA, _SELU_SCALE, 1.0) if name == "selu" else None


def _forward_out(torch, name: str, a) -> Optional[Expr]:
    """PyTorch's kernel for `name` writing into a given tensor (aten's out= overloads), so the
    eager column allocates nothing, as opkit's out= does not; None where aten has none."""
    A = torch.ops.aten
    elu = _elu_args(name, a)
    if elu is not None:
        return lambda x, out: A.elu.out(x, *elu, out=out)
    table = {
        "relu": lambda x, out: A.clamp_min.out(x, 0, out=out),
        "relu6": lambda x, out: A.hardtanh.out(x, 0.0, 6.0, out=out),
        "hardtanh": lambda x, out: A.hardtanh.out(x, a.get("min_val"), a.get("max_val"), out=out),
        "leaky_relu": lambda x, out: A.leaky_relu.out(x, a.get("alpha"), out=out),
        "leakyrelu": lambda x, out: A.leaky_relu.out(x, a.get("alpha"), out=out),
        "sigmoid": lambda x, out: A.sigmoid.out(x, out=out),
        "tanh": lambda x, out: A.tanh.out(x, out=out),
        "gelu": lambda x, out: A.gelu.out(x, approximate=a.get("approximate"), out=out),
        "silu": lambda x, out: A.silu.out(x, out=out),
        "mish": lambda x, out: A.mish.out(x, out=out),
        "hardswish": lambda x, out: A.hardswish.out(x, out=out),
        "logsigmoid": lambda x, out: A.log_sigmoid.out(x, out=out),
        "softplus": lambda x, out: A.softplus.out(x, a.get("beta"), a.get("threshold"), out=out),
    }
    return table.get(name)


def _backward_out(torch, name: str, a, x) -> Optional[Expr]:
    """aten's backward kernel of `name` writing the gradient into a given tensor (what autograd
    calls, without its allocations), as a function of (dy, out); None where aten has none.
    Kernels that take the forward's result or buffer get it computed once, here."""
    A = torch.ops.aten
    elu = _elu_args(name, a)
    if elu is not None:
        return lambda dy, out: A.elu_backward.grad_input(dy, *elu, False, x, grad_input=out)
    if name in ("sigmoid", "tanh"):
        y = getattr(torch, name)(x)
        kernel = getattr(A, f"{name}_backward").grad_input
        return lambda dy, out: kernel(dy, y, grad_input=out)
    if name == "logsigmoid":
        _, buffer = A.log_sigmoid_forward(x)
        return lambda dy, out: A.log_sigmoid_backward.grad_input(dy, x, buffer, grad_input=out)
    table = {
        "relu": lambda dy, out: A.threshold_backward.grad_input(dy, x, 0, grad_input=out),
        "relu6": lambda dy, out: A.hardtanh_backward.grad_input(dy, x, 0.0, 6.0, grad_input=out),
        "hardtanh": lambda dy, out: A.hardtanh_backward.grad_input(
            dy, x, a.get("min_val"), a.get("max_val"), grad_input=out),
        "leakyrelu": lambda dy, out: A.leaky_relu_backward.grad_input(
            dy, x, a.get("alpha"), False, grad_input=out),
        "gelu": lambda dy, out: A.gelu_backward.grad_input(
            dy, x, approximate=a.get("approximate"), grad_input=out),
        "silu": lambda dy, out: A.silu_backward.grad_input(dy, x, grad_input=out),
        "hardswish": lambda dy, out: A.hardswish_backward.out(dy, x, out=out),
        "softplus": lambda dy, out: A.softplus_backward.grad_input(
            dy, x, a.get("beta"), a.get("threshold"), grad_input=out),
    }
    return table.get(name)


def torch_pass(name: str, pass_: str, tensors: Dict[str, object], attrs: Dict[str, object],
               dy, grads_out, aligned, raw: Dict[str, object],
               compiled: bool = False, out=None) -> Optional[Callable[[], object]]:
    """A call of PyTorch doing what opkit's `name` does in `pass_` (forward, or backward with
    the output gradient `dy`), or None when PyTorch has no such computation here.
    `grads_out`: tensors the backward may write into (aten's leaky_relu_backward does);
    `aligned(tensor, dims)` shapes a tensor over named dims to broadcast against x; `raw` are
    the inputs as given (a matmul's operands). `compiled`: the same formula through
    torch.compile (inductor, default mode; its backward is the compiled graph's): compiled and
    run once here, None where that fails (no working compiler). `out`: a tensor the eager
    forward may write into. Eager PyTorch writes into `out` / `grads_out` wherever aten has the
    kernel with an out= form (opkit is timed with out=); torch.compile allocates, as it does."""
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
    single = set(tensors) == {"x"}  # the activations: x alone
    if pass_ == "forward":
        kernel = _forward_out(torch, name, attrs) if single and out is not None else None
        if kernel is not None:
            x = tensors["x"]
            return lambda: kernel(x, out)
        return lambda: call(tensors)
    if name == "leaky_relu" and grads_out is not None:
        op = torch.ops.aten.leaky_relu_backward.grad_input
        x, gout = tensors["x"], grads_out[0]
        return lambda: op(dy, x, attrs["alpha"], False, grad_input=gout)
    kernel = _backward_out(torch, name, attrs, tensors["x"]) if single and grads_out else None
    if kernel is not None:
        gout = grads_out[0]
        return lambda: kernel(dy, gout)
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
