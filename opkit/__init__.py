"""opkit: declare neural-network operators in YAML, get validated, compiled kernels.

    import opkit
    y = opkit.get("leaky_relu")(x, alpha=0.2)
    dx, = opkit.ops.leaky_relu.backward(dy, x, alpha=0.2)
"""
from ._version import __version__

from types import ModuleType as _ModuleType
from typing import List as _List

from .config import PRECISION_MODES, config, configure
from .errors import BuildError, FusionWarning, SpecError
from .quantize import quantize_alpha
from .registry import REGISTRY as _REGISTRY
from .registry import load_defaults as _load_defaults
from .runtime import Op


def list_ops() -> _List[str]:
    """The sorted names of every registered operator."""
    return _REGISTRY.names()


def get(name: str) -> Op:
    """The operator called `name`; KeyError (with close matches) if there is none."""
    return _REGISTRY.get(name)


def load(path) -> _List[str]:
    """Register every YAML operator in a folder (or one file); returns their names."""
    return _REGISTRY.load(path)


class _Ops(_ModuleType):
    """`opkit.ops.leaky_relu` is `opkit.get("leaky_relu")`."""

    def __getattr__(self, name: str) -> Op:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return _REGISTRY.get(name)
        except KeyError as exc:
            raise AttributeError(exc.args[0]) from None

    def __dir__(self):
        return _REGISTRY.names()


ops = _Ops("opkit.ops", "Every registered operator, as an attribute.")

_load_defaults()

__all__ = ["list_ops", "get", "load", "ops", "Op", "SpecError", "BuildError", "FusionWarning",
           "configure", "config", "quantize_alpha", "PRECISION_MODES", "__version__"]
