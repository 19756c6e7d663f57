"""Models from elsewhere: PyTorch modules (``torch.export``) in, ONNX in and out.

The importers need the optional dependencies of the ``importers`` extra (torch,
onnx, onnxruntime); they are imported when an importer runs, not with ``ir``.
"""

from __future__ import annotations

from .onnx import OnnxAnnotationError, OnnxConversionWarning, OnnxError, from_onnx, to_onnx
from .torch_export import TorchImportError, UnsupportedOpsError, from_torch, weight_name

__all__ = [
    "OnnxAnnotationError",
    "OnnxConversionWarning",
    "OnnxError",
    "TorchImportError",
    "UnsupportedOpsError",
    "from_onnx",
    "from_torch",
    "to_onnx",
    "weight_name",
]
