"""The activation catalogue in examples/activations."""
import math

import numpy as np

from opkit.registry import make_op

from conftest import declaration, write_op

INF, NAN = math.inf, math.nan


# ---------------------------------------------------------------- what the primitives get right

def test_sign_of_infinities(tmp_path):
    """sign(+-inf) is +-1, as NumPy's: Shrink's x - bias * sign(x) stays infinite at +-inf."""
    o = make_op(write_op(tmp_path, declaration("sign(x)")))
    x = np.array([INF, -INF, NAN, 0.0, -0.0, 2.5, -1e-300])
    for dtype in (np.float32, np.float64):
        np.testing.assert_array_equal(o(x.astype(dtype)), np.sign(x.astype(dtype)))
