"""ONNX export: an operator's forward (or backward) graph as standard ONNX operators.

    import opkit
    opkit.ops.leaky_relu.to_onnx("leaky_relu.onnx", [("N", 3, 64, 64)], {"alpha": 0.1})
    # opkit export leaky_relu -o leaky_relu.onnx

Needs the onnx package (`pip install "opkit[onnx]"`); docs/deploy.md describes the models.
"""
from .export import DEFAULT_OPSET, DOMAIN, MIN_OPSET, export, to_model
from .lowering import LOWERINGS, ExportError, onnx_lowering

__all__ = ["export", "to_model", "onnx_lowering", "LOWERINGS", "ExportError", "DOMAIN",
           "DEFAULT_OPSET", "MIN_OPSET"]
