"""`opkit bench`: kernels timed side by side with the copy bandwidth, NumPy and PyTorch.

Every number is a median over interleaved repetitions (opkit, copy, NumPy, PyTorch, opkit, ...),
so a noisy neighbour slows all contenders alike, and every target is a ratio measured in the
same run. PyTorch is optional: without it its columns stay empty.

The modules, each importing only those above it:

    harness        timed, Row, torch_modules, machine
    torch_columns  PyTorch's computation of each operator (the generic sweep's torch column)
    cases, conv    the hand-written cases of the targets; the fused convolutions' cases
    targets        TARGETS, run_targets, elementwise_targets, build_times
    sweep          generic_rows: every operator by size, dtype, layout and pass
    report         format_rows, format_targets, torch_notes, plot
    command        add_parser and main: the `opkit bench` command (opkit.cli adds it)
"""
from .command import add_parser, main
from .harness import Row, machine, timed, torch_modules
from .report import format_rows, format_targets, plot, torch_notes
from .sweep import generic_rows
from .targets import (CONV_TARGETS, ELEMENTWISE, TARGETS, TargetResult, build_times,
                      elementwise_targets, run_targets)

__all__ = ["CONV_TARGETS", "ELEMENTWISE", "Row", "TARGETS", "TargetResult", "add_parser",
           "build_times", "elementwise_targets", "format_rows", "format_targets", "generic_rows",
           "machine", "main", "plot", "run_targets", "timed", "torch_modules", "torch_notes"]
