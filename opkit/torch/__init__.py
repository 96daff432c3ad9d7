"""opkit operators as PyTorch operators: `import opkit.torch` registers every registered
operator (and every one registered later, by opkit.load or OPKIT_PATH) as torch.ops.opkit.<name>,
with autograd through opkit's own backward pass, fake kernels for torch.compile, an out= form
torch.ops.opkit.<name>_out and, where the declaration allows it, an in-place form
torch.ops.opkit.<name>_ (docs/torch.md).

    import torch, opkit.torch
    y = torch.ops.opkit.leaky_relu(x, alpha=0.2)
    act = opkit.torch.nn.LeakyReLU(0.2)

Needs PyTorch (`pip install "opkit[torch]"`); the rest of opkit works without it.
"""
try:
    import torch as _torch
except ImportError as _exc:
    raise ImportError("opkit.torch needs PyTorch: pip install 'opkit[torch]' (or torch==2.13.0)") from _exc

from ..registry import REGISTRY as _REGISTRY
from . import library as _library
from ..onnx import torch_export as _torch_export


def op(name: str):
    """The PyTorch operator of opkit operator `name`: torch.ops.opkit.<name> (call it, or take
    its .default overload)."""
    if name not in _library.names():
        why = _library.failure(name)
        if why:
            raise KeyError(f"operator {name} is not available in PyTorch: {why}")
        raise KeyError(_REGISTRY.unknown(name, "opkit.torch.op takes the names opkit.list_ops() "
                                               "lists; load yours with opkit.load(PATH) first"))
    return getattr(_torch.ops.opkit, name)


_REGISTRY.subscribe(_library.register)
# torch.onnx.export(..., dynamo=False) inlines each call's ONNX lowering (docs/deploy.md)
_REGISTRY.subscribe(_torch_export.register)

from . import nn  # noqa: E402
from .calibrate import AlphaCalibration  # noqa: E402
from .doctor import doctor  # noqa: E402
from .fused import FusedConvLeakyReLU  # noqa: E402
from .optimize import optimize  # noqa: E402

__all__ = ["op", "nn", "optimize", "doctor", "AlphaCalibration", "FusedConvLeakyReLU"]
