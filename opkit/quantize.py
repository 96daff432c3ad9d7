"""Fixed-point slopes: alpha stored as m / 2**bits, so the negative branch of LeakyReLU is an
integer multiply and a shift (as on accelerators such as Ascend)."""
from __future__ import annotations

import math
import numbers
from typing import Tuple

MAX_BITS = 15
# m is the multiplier of a 16-bit multiply: |m| must fit a signed 16-bit integer
M_LIMIT = 2 ** 15 - 1


def fixed_point(alpha: float, bits: int) -> Tuple[int, int, float]:
    """(m, bits, m / 2**bits) with m = round(alpha * 2**bits); ValueError says what to change."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral):
        raise TypeError(f"bits must be an integer in 1..{MAX_BITS}, got {bits!r}")
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in 1..{MAX_BITS}, got {bits}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    m = round(float(alpha) * 2 ** bits)   # Python's round: to nearest, ties to even
    if abs(m) > M_LIMIT:
        raise ValueError(f"alpha {alpha!r} with {bits} bits needs m = {m}, which does not fit a "
                         f"signed 16-bit multiplier (|m| <= {M_LIMIT}); use fewer bits")
    return m, int(bits), m / 2 ** bits


def quantize_alpha(alpha: float, bits: int = 7) -> Tuple[int, int, float]:
    """The fixed-point form of a slope: ``quantize_alpha(0.2) == (26, 7, 0.203125)``.

    m = round(alpha * 2**bits) and value = m / 2**bits; bits must be in 1..15 and m must fit a
    signed 16-bit multiplier."""
    return fixed_point(alpha, bits)
