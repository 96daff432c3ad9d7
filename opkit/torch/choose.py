"""optimize's conv="auto" with an example input: each fused chain's convolution runs where it
measured faster on this machine, opkit's fused operator or PyTorch's convolution with opkit's
slope (opkit's only where at least 5% faster), in eval and in training, on the tensor the
example gives that chain. The measurement leaves the model as it found it: modes, running
statistics and gradients."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .fused import FusedConvLeakyReLU

ROUNDS = 5            # alternating timed rounds per choice (median), after one warm-up call each
MARGIN = 0.95         # opkit's operator is taken where its median is below this share of
                      # PyTorch's: a tie within a shared machine's noise keeps PyTorch's path


def inputs_of(model: nn.Module, modules: Dict[str, FusedConvLeakyReLU],
              example: tuple) -> Dict[str, torch.Tensor]:
    """The tensor each fused chain gets from one eval run of the model on the example."""
    seen: Dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, name=name: seen.setdefault(name, args[0].detach()))
        for name, m in modules.items()]
    try:
        with _kept(model), torch.no_grad():
            model.eval()
            model(*example)
    finally:
        for h in hooks:
            h.remove()
    return seen


@contextlib.contextmanager
def _kept(module: nn.Module):
    """Every submodule's mode, buffer and gradient as they were before."""
    modes = [(m, m.training) for m in module.modules()]
    buffers = {k: v.clone() for k, v in module.state_dict().items()}
    grads = [(p, None if p.grad is None else p.grad.clone()) for p in module.parameters()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        module.load_state_dict(buffers)
        for p, g in grads:
            p.grad = g


def _timer(module: FusedConvLeakyReLU, x: torch.Tensor, training: bool) -> Callable[[], None]:
    if not training:
        def run():
            with torch.no_grad():
                module(x)
        return run
    leaf = x.detach().clone().requires_grad_()

    def step():
        module(leaf).sum().backward()
    return step


def measure(model: nn.Module, module: FusedConvLeakyReLU, x: torch.Tensor, training: bool
            ) -> Optional[Dict[str, float]]:
    """Median ms per call of each choice, alternating rounds; None if a choice fails. (The
    chain's convolution and batch norm are the model's modules: the model is kept.)"""
    times: Dict[str, List[float]] = {"torch": [], "opkit": []}
    attr = "train_conv" if training else "eval_conv"
    with _kept(model):
        module.train(training)
        if module.bn is not None:
            module.bn.train(training)
        try:
            for rnd in range(ROUNDS + 1):
                for choice in times:
                    setattr(module, attr, choice)
                    run = _timer(module, x, training)
                    t0 = time.perf_counter()
                    run()
                    if rnd:  # the first round warms up (and builds opkit's operator)
                        times[choice].append((time.perf_counter() - t0) * 1e3)
        except Exception:  # noqa: BLE001  (a choice that cannot run here is not taken)
            return None
    return {c: statistics.median(v) for c, v in times.items()}


def choose(model: nn.Module, example: tuple) -> List[str]:
    """Set each fused chain's eval_conv and train_conv to the faster choice; a line per chain."""
    modules = {name: m for name, m in model.named_modules()
               if isinstance(m, FusedConvLeakyReLU) and m.up == 1 and not m.transposed
               and not m.residual}
    if not modules:
        return []
    seen = inputs_of(model, modules, example)
    lines = []
    for name, m in modules.items():
        if name not in seen:
            continue
        picked: List[Tuple[str, Dict[str, float]]] = []
        for training in (False, True):
            ms = measure(model, m, seen[name], training)
            choice = "opkit" if ms is not None and ms["opkit"] < MARGIN * ms["torch"] else "torch"
            setattr(m, "train_conv" if training else "eval_conv", choice)
            picked.append((choice, ms or {}))
        lines.append(f"conv='auto' for {m.conv_name}: " + "; ".join(
            f"{mode} {choice}" + (f" ({ms['opkit']:.2f} ms opkit, {ms['torch']:.2f} ms torch)"
                                  if ms else " (opkit's operator did not run)")
            for mode, (choice, ms) in zip(("eval", "training"), picked)))
    return lines
