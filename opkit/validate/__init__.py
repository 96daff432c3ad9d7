"""Stage 7: compiled kernels against the NumPy reference; finite-difference gradients.

    cases.py      the inputs: layouts, sizes, stride patterns, special values, attrs
    reference.py  the same graph evaluated with NumPy in float64
    compare.py    the precision standard per dtype, ULP distances, NaN rules
    check.py      every dtype, forward and backward, integer kernels bit for bit
    gradcheck.py  finite differences in float64, away from kinks
    declared.py   a hand-written backward against the derived one, at load
    report.py     what was found
"""
from .check import validate_op
from .declared import check_declared_backward
from .reference import evaluate
from .report import Report

__all__ = ["validate_op", "Report", "evaluate", "check_declared_backward"]
