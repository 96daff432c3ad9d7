"""Stage 7: compiled kernels against the NumPy reference; finite-difference gradients."""
from .check import Report, check_declared_backward, validate_op
from .reference import evaluate

__all__ = ["validate_op", "Report", "evaluate", "check_declared_backward"]
