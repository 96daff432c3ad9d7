"""The load-time check of a hand-written backward passes its arguments in a dtype the operator
declares (and compares in float64), and any failure in it is a SpecError naming file and line."""
import numpy as np
import pytest

from opkit.errors import SpecError
from opkit.registry import make_op
from opkit.validate import declared

from conftest import declaration, write_op

BACKWARD = "backward:\n  x: where(x > 0, dy, dy * {slope})\n"


def leaky(dtypes, slope=0.25, name="declared"):
    return declaration("where(x > 0, x, x * 0.25)", inputs=[("x", f"{{dtypes: [{dtypes}]}}")],
                       name=name) + BACKWARD.format(slope=slope)


@pytest.mark.parametrize("dtypes", ["float32", "float16", "float16, float32"])
def test_operator_without_float64_loads(tmp_path, dtypes):
    op = make_op(write_op(tmp_path, leaky(dtypes)))
    assert op.graphs.declared


def test_wrong_backward_without_float64_is_a_spec_error(tmp_path):
    path = write_op(tmp_path, leaky("float32", slope=0.5))
    with pytest.raises(SpecError, match=r"op\.yaml:9:6: backward\.x: the hand-written gradient "
                                        r"disagrees") as info:
        make_op(path)
    assert info.value.loc.line == 9


def test_any_failure_of_the_check_is_a_spec_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("no such dtype")

    monkeypatch.setattr(declared, "bind", broken)
    with pytest.raises(SpecError, match=r"op\.yaml:9:3: backward: the hand-written gradients could "
                                        r"not be checked against the derived ones: no such dtype"):
        make_op(write_op(tmp_path, leaky("float64")))


def test_the_check_passes_arguments_in_a_declared_dtype(tmp_path, monkeypatch):
    seen = []
    real = declared.bind

    def spy(spec, given, *args, **kwargs):
        seen.extend(np.asarray(v).dtype.name for k, v in given.items() if k == "x")
        return real(spec, given, *args, **kwargs)

    monkeypatch.setattr(declared, "bind", spy)
    make_op(write_op(tmp_path, leaky("float16, float32")))
    assert seen and set(seen) == {"float32"}
