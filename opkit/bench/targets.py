"""The performance targets of `opkit bench` (no operator names): each hand-written case against
what it must beat, as ratios measured in the same run (`TARGETS`, `run_targets`); the targets
of an elementwise operator checked on the generic rows (`elementwise_targets`, `--check`); the
time of a cold and a warm `opkit build` (`build_times`, `--build-times`)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .cases import (conditional_case, conditional_pass_case, freq_case, fused_bias_backward_case,
                    fused_bias_case, layout_conversion_case, leaky_backward_case, leaky_case,
                    leaky_half_case, small_case, spatial_case, spatial_map_backward_case,
                    torch_autograd_case, torch_call_case, view_case)
from .conv import conv_bn_case, conv_bn_train_case
from .harness import Row, timed


M16 = 16 << 20
# A 5% limit needs many rounds: a round's ratio of two 16M calls spreads by about +-8% here
SHUFFLED = {"shuffle": True, "rounds": 61}
# (case name, builder, shape, dtype, pass, target checks[, options: shuffle, at least this many rounds])
# a check is (label, numerator, denominator, minimum): seconds[numerator] / seconds[denominator];
# a builder returns None when what it compares with is not installed (the checks are then n/a)
TARGETS = [
    ("leaky_relu float32, 16M, out=", lambda r: leaky_case((M16,), np.float32, r, True), (M16,),
     "float32", "forward", [("vs copy bandwidth", "copy", "opkit", 0.9), ("vs torch out=", "torch", "opkit", 1.0)]),
    ("leaky_relu float32, 16M, allocating", lambda r: leaky_case((M16,), np.float32, r, False), (M16,),
     "float32", "forward", [("vs torch allocating", "torch", "opkit", 1.0)]),
    ("leaky_relu float16, 16M", lambda r: leaky_case((M16,), np.float16, r, False), (M16,),
     "float16", "forward", [("vs torch float16", "torch", "opkit", 0.9), ("vs numpy float16", "numpy", "opkit", 30.0)]),
    ("leaky_relu float32 backward, 16M", lambda r: leaky_backward_case((M16,), np.float32, r), (M16,),
     "float32", "backward", [("vs torch leaky_relu_backward", "torch", "opkit", 1.0)]),
    ("NCHW [8,64,128,128] into NHWC out=", lambda r: layout_conversion_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs numpy out=view", "numpy", "opkit", 5.0),
                                               ("vs torch .contiguous(channels_last)", "torch", "opkit", 3.0)]),
    ("NHWC view of [8,64,128,128], no out=", lambda r: view_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs the contiguous call", "opkit contiguous", "opkit", 0.9)]),
    ("16-element arrays, per call", lambda r: small_case((16,), np.float32, r), (16,), "float32", "forward",
     [("vs numpy np.maximum(x, alpha * x)", "numpy", "opkit", 1.0)]),
    ("spatial_leaky_relu NHWC [8,128,128,64]", lambda r: spatial_case((8, 128, 128, 64), np.float32, r),
     (8, 128, 128, 64), "float32", "forward", [("vs leaky_relu (time ratio >= 1/1.3)", "opkit leaky_relu", "opkit", 1 / 1.3)]),
    ("conditional_leaky_relu NCHW [8,64,128,128]", lambda r: conditional_case((8, 64, 128, 128), np.float32, r),
     (8, 64, 128, 128), "float32", "forward", [("vs leaky_relu (time ratio >= 1/1.3)", "opkit leaky_relu", "opkit", 1 / 1.3)]),
    ("fused_bias_leaky_relu NHWC [8,128,128,64]", lambda r: fused_bias_case((8, 128, 128, 64), np.float32, r),
     (8, 128, 128, 64), "float32", "forward", [("vs numpy chain", "numpy", "opkit", 3.0), ("vs torch eager chain", "torch", "opkit", 1.5)]),
    ("leaky_relu float16, 16M, out=", lambda r: leaky_half_case((M16,), r, "forward"), (M16,),
     "float16", "forward", [("vs copy bandwidth", "copy", "opkit", 0.85), ("vs torch out=", "torch", "opkit", 1.0)]),
    ("leaky_relu float16 backward, 16M, out=", lambda r: leaky_half_case((M16,), r, "backward"), (M16,),
     "float16", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85),
                             ("vs torch leaky_relu_backward(grad_input=)", "torch", "opkit", 1.0)]),
    ("fused_bias_leaky_relu backward NHWC [8,128,128,64] float32",
     lambda r: fused_bias_backward_case((8, 128, 128, 64), np.float32, r), (8, 128, 128, 64), "float32",
     "backward", [("vs torch autograd (dx, dbias)", "torch", "opkit", 3.0)]),
    ("fused_bias_leaky_relu backward NHWC [8,128,128,64] float16",
     lambda r: fused_bias_backward_case((8, 128, 128, 64), np.float16, r), (8, 128, 128, 64), "float16",
     "backward", [("vs torch autograd (dx, dbias)", "torch", "opkit", 3.0)]),
    ("conditional_leaky_relu forward NCHW [8,64,128,128], out=",
     lambda r: conditional_pass_case((8, 64, 128, 128), np.float32, r, "forward"), (8, 64, 128, 128),
     "float32", "forward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("conditional_leaky_relu backward NCHW [8,64,128,128], out=",
     lambda r: conditional_pass_case((8, 64, 128, 128), np.float32, r, "backward"), (8, 64, 128, 128),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("spatial_leaky_relu backward NCHW [8,64,128,128], map [N,1,H,W], out=",
     lambda r: spatial_map_backward_case((8, 64, 128, 128), "NCHW", np.float32, r), (8, 64, 128, 128),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("spatial_leaky_relu backward NHWC [8,128,128,64], map [N,H,W,1], out=",
     lambda r: spatial_map_backward_case((8, 128, 128, 64), "NHWC", np.float32, r), (8, 128, 128, 64),
     "float32", "backward", [("vs copy bandwidth", "copy", "opkit", 0.85)]),
    ("freq_leaky_relu forward NCHW [8,64,64,64]", lambda r: freq_case((8, 64, 64, 64), r, "forward"),
     (8, 64, 64, 64), "float32", "forward", [("vs the torch.fft pipeline", "torch", "opkit", 1.0)]),
    ("freq_leaky_relu backward NCHW [8,64,64,64]", lambda r: freq_case((8, 64, 64, 64), r, "backward"),
     (8, 64, 64, 64), "float32", "backward", [("vs the torch.fft pipeline (autograd)", "torch", "opkit", 1.0)]),
    ("torch.ops.opkit.leaky_relu float32, 16M", lambda r: torch_call_case(M16, r), (M16,), "float32",
     "forward", [("vs the NumPy-level call (time <= 1.05x)", "opkit numpy", "opkit", 1 / 1.05),
                 ("vs torch F.leaky_relu", "torch", "opkit", 1.0)], SHUFFLED),
    ("torch.ops.opkit.leaky_relu fwd+bwd autograd, 16M", lambda r: torch_autograd_case(M16, r), (M16,),
     "float32", "autograd", [("vs torch nn.LeakyReLU forward+backward", "torch", "opkit", 1.0)], SHUFFLED),
    ("torch.ops.opkit.leaky_relu, 16 elements", lambda r: torch_call_case(16, r), (16,), "float32",
     "forward", [], SHUFFLED),
]


CONV_CASE = (8, 64, 64, 64)
# the fused convolutions (docs/fusion.md): their cases are in conv.py
CONV_TARGETS = []
for _layout in ("NHWC", "NCHW"):
    CONV_TARGETS += [
        (f"conv2d_bn_leaky_relu 3x3 {_layout} [8,64,64,64]",
         (lambda L: lambda r: conv_bn_case(CONV_CASE, 3, L, r, compiled=True))(_layout), CONV_CASE,
         "float32", "forward",
         [("vs torch eager chain, channels_last (>= 1.25x)", "torch CL", "opkit", 1.25),
          ("vs torch.compile with freezing (>= 1x)", "torch.compile freezing", "opkit", 1.0),
          ("epilogue cost (time <= 1.10x conv alone)", "opkit conv", "opkit", 1 / 1.10),
          ("vs opkit conv + BN pass + LeakyReLU pass", "opkit unfused", "opkit", 1.2)]),
        (f"conv2d_bn_leaky_relu 1x1 {_layout} [8,64,64,64]",
         (lambda L: lambda r: conv_bn_case(CONV_CASE, 1, L, r, compiled=True))(_layout), CONV_CASE,
         "float32", "forward",
         [("vs torch eager chain, channels_last (>= 1.25x)", "torch CL", "opkit", 1.25),
          ("vs torch.compile with freezing (>= 1x)", "torch.compile freezing", "opkit", 1.0)]),
        (f"conv2d_bn_train_leaky_relu 3x3 {_layout} fwd+bwd",
         (lambda L: lambda r: conv_bn_train_case(CONV_CASE, 3, L, r))(_layout), CONV_CASE, "float32",
         "forward+backward", [("vs torch autograd, channels_last (>= 1x)", "torch CL", "opkit", 1.0)]),
    ]

TARGETS += CONV_TARGETS


@dataclass
class TargetResult:
    case: str
    check: str
    ratio: Optional[float]
    minimum: float

    @property
    def met(self) -> Optional[bool]:
        return None if self.ratio is None else self.ratio >= self.minimum


def run_targets(repeat: int, rng) -> Tuple[List[Row], List[TargetResult]]:
    rows, results = [], []
    for name, build, shape, dtype, pass_, checks, *options in TARGETS:
        built = build(rng)
        if built is None:
            results += [TargetResult(name, label, None, minimum) for label, _, _, minimum in checks]
            continue
        fns, nbytes = built[0], built[1]
        rounds: Dict[str, List[float]] = {}
        option = options[0] if options else {}
        seconds = timed(fns, max(repeat, option.get("rounds", 0)), rounds=rounds,
                        shuffle=rng if option.get("shuffle") else None)
        if "copy" in seconds and len(built) > 2:
            # the copy moved built[2] bytes: the time it takes for this call's traffic
            seconds["copy"] *= nbytes / built[2]
            rounds["copy"] = [t * nbytes / built[2] for t in rounds["copy"]]
        row = Row(name, name.split()[0], pass_, dtype, shape, nbytes, seconds, rounds)
        rows.append(row)
        for label, num, den, minimum in checks:
            results.append(TargetResult(name, label, row.ratio(num, den), minimum))
        del fns
    return rows, results


# the targets of an elementwise operator at 16M elements (docs/performance.md): the copy of
# the same bytes by dtype, PyTorch eager and torch.compile of the same formula
ELEMENTWISE = {"float32": 0.8, "float16": 0.7}


def elementwise_targets(rows: List[Row]) -> List[TargetResult]:
    """Each row's ratios against the elementwise targets (n/a where a contender is missing)."""
    out = []
    for r in rows:
        name = f"{r.case} {r.dtype}"
        if r.dtype in ELEMENTWISE:
            out.append(TargetResult(name, "vs copy bandwidth", r.ratio("copy"), ELEMENTWISE[r.dtype]))
        out.append(TargetResult(name, "x torch eager", r.ratio("torch"), 1.0))
        out.append(TargetResult(name, "x torch.compile", r.ratio("torch.compile"), 1.0))
    return out


def build_times(jobs: int) -> Tuple[float, float]:
    """`opkit build` of every bundled operator into an empty cache, then again (warm)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, OPKIT_CACHE_DIR=cache)
        env.pop("OPKIT_PATH", None)
        out = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "opkit", "build", "-q", "-j", str(jobs)], env=env,
                           check=True, capture_output=True)
            out.append(time.perf_counter() - t0)
    return out[0], out[1]
