"""`opkit.torch.doctor(model, example_input)`: the performance checklist for a PyTorch model, as a
table of ✔/✘ rows with one line of advice each (docs/torch.md, "Tuning a model"); `opkit doctor
FILE.py:Factory --input N,C,H,W` prints it from the command line.

    α quantized        every slope on the m/128 grid (alpha_quant)
    input              contiguous, and in which layout
    each LeakyReLU     fused, fusible (optimize would fuse it), or why it cannot fuse
    each upsampling    nearest upsampling before a convolution that optimize would fold into it
    float16/float32    measured: time per forward and the largest deviation of the output
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import List, NamedTuple

import torch
from torch import nn

from .calibrate import slopes
from .fused import FusedConvLeakyReLU
from .optimize import ALPHA_BITS, Report, optimize

FP16_TOLERANCE = 1e-3  # the float16 precision standard (relative to the output's scale)


class Row(NamedTuple):
    ok: bool
    check: str
    advice: str
    actionable: bool

    @property
    def mark(self) -> str:
        return "✔" if self.ok else "✘"


class Checkup(list):
    """The rows (ok, check, advice, actionable); printing gives the table. `.actionable` is
    True when a row asks for a change (the CLI then exits with 1)."""

    @property
    def actionable(self) -> bool:
        return any(r.actionable for r in self)

    def __str__(self) -> str:
        width = max((len(r.check) for r in self), default=0)
        return "\n".join(f"{r.mark}  {r.check.ljust(width)}  {r.advice}" for r in self)


def _on_grid(value, bits: int) -> bool:
    scale = 2.0 ** bits
    if isinstance(value, torch.Tensor):
        v = value.double() * scale
        return bool(torch.equal(v, torch.round(v)))
    return float(value) * scale == round(float(value) * scale)


def _alpha_row(model: nn.Module) -> Row:
    found = slopes(model)
    if not found:
        return Row(True, "α quantized", "no LeakyReLU slopes in the model", False)
    off = [s.name for s in found if not _on_grid(s.value(), ALPHA_BITS)]
    if not off:
        return Row(True, "α quantized", f"all {len(found)} slopes are m/128", False)
    names = ", ".join(off[:4]) + (", ..." if len(off) > 4 else "")
    return Row(False, "α quantized", f"{len(off)} of {len(found)} slopes are not m/128 ({names}): "
               "optimize with alpha_quant=True, or AlphaCalibration while training", True)


def _layout_of(x: torch.Tensor) -> str:
    if x.dim() != 4:
        return f"{x.dim()}-d"
    if x.is_contiguous():
        return "NCHW"
    if x.is_contiguous(memory_format=torch.channels_last):
        return "NHWC (channels_last)"
    return "strided"


def _input_row(inputs) -> Row:
    bad = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
           and not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last))]
    layouts = ", ".join(_layout_of(x) for x in inputs if isinstance(x, torch.Tensor))
    if bad:
        return Row(False, "input contiguous", f"input {bad[0]} is neither NCHW nor NHWC in memory "
                   f"(strides {tuple(inputs[bad[0]].stride())}): pass x.contiguous()", True)
    tip = "; layout='NHWC' in optimize converts it to channels_last" if layouts == "NCHW" else ""
    return Row(True, "input contiguous", f"yes, {layouts}{tip}", False)


def _fusion_rows(model: nn.Module, report: Report) -> List[Row]:
    rows = [Row(True, f"fused {name}", f"{m.operator} ({m.conv_name}"
                + (f" -> {m.bn_name}" if m.bn_name else "") + " -> LeakyReLU)", False)
            for name, m in model.named_modules() if isinstance(m, FusedConvLeakyReLU)]
    for e in report:
        if e.fused:
            rows.append(Row(False, f"fusible {e.node}", f"{' -> '.join(e.chain)} -> LeakyReLU: "
                            "optimize(model, {'leakyrelu_fusion': True}) fuses it", True))
        elif e.reason.startswith("the preceding op is"):  # nothing here to fuse with
            rows.append(Row(False, f"not fusible {e.node}", f"after {e.producer}: {e.reason}; it "
                            "runs unfused", False))
        else:
            rows.append(Row(False, f"not fusible {e.node}", f"after {e.producer}: {e.reason}", True))
    return rows


def _fold_rows(report: Report) -> List[Row]:
    rows = []
    for f in report.folds:
        if f.reason:
            rows.append(Row(False, f"not foldable {f.upsample}", f"into {f.conv}: {f.reason}", False))
        else:
            rows.append(Row(False, f"foldable {f.upsample}", f"nearest x{f.r} -> {f.conv}: optimize "
                            f"folds it into {f.r * f.r} phase convolutions over the image before "
                            "upsampling (fewer multiply-adds, no upsampled image)", True))
    return rows


def _time(model: nn.Module, inputs, repeat: int) -> List[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        model(*inputs)
        times.append(time.perf_counter() - t)
    return times


def _precision_row(model: nn.Module, inputs, repeat: int) -> Row:
    """Time per forward and output deviation of the opkit operators in float16 against
    float32 (the model in eval mode, alternating runs)."""
    fp32, _ = optimize(model, {"conv": "opkit"})
    if not any(isinstance(m, FusedConvLeakyReLU) for m in fp32.modules()):
        return Row(True, "float16 vs float32", "no fusible convolution runs through opkit: "
                   "precision_mode has nothing to change", False)
    fp16, _ = optimize(model, {"conv": "opkit", "precision_mode": "force_fp16"})
    fp32.eval(), fp16.eval()
    with torch.no_grad():
        y32, y16 = fp32(*inputs), fp16(*inputs)  # the first calls also build the operators
        t32, t16 = [], []
        for _ in range(repeat):
            t32 += _time(fp32, inputs, 1)
            t16 += _time(fp16, inputs, 1)
    scale = float(y32.abs().max()) or 1.0
    dev = float((y16.float() - y32.float()).abs().max()) / scale
    m32, m16 = statistics.median(t32) * 1e3, statistics.median(t16) * 1e3
    text = (f"float16 {m16:.1f} ms, float32 {m32:.1f} ms per forward; float16 output deviates "
            f"by {dev:.2g} of its scale")
    if m16 < m32 and dev <= FP16_TOLERANCE:
        return Row(False, "float16 vs float32", text + ": precision_mode='force_fp16' is faster "
                   "within 1e-3", True)
    why = "slower" if m16 >= m32 else f"deviates more than {FP16_TOLERANCE:g}"
    return Row(True, "float16 vs float32", f"{text}: keep float32 (float16 is {why})", False)


def doctor(model: nn.Module, example_input, repeat: int = 5) -> Checkup:
    """The checklist for `model` on `example_input` (a tensor or a tuple of them); the model
    itself is not changed (the measurements run on copies, in eval mode)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"opkit.torch.doctor: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise TypeError("opkit.torch.doctor: example_input must be a tensor or a tuple of tensors")
    probe = copy.deepcopy(model).eval()
    _, report = optimize(probe, None, inputs)
    rows = Checkup([_alpha_row(probe), _input_row(inputs)])
    rows += _fusion_rows(probe, report)
    rows += _fold_rows(report)
    rows.append(_precision_row(probe, inputs, repeat))
    return rows
