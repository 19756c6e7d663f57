"""DistIR: a small IR for distributed neural-network programs.

Public entry points: ``FunctionBuilder`` to build programs, ``parse`` and
``format`` for the text format, ``execute`` for the numpy reference executor,
``Topology`` for hardware (``calibrate`` measures this machine), ``ir.models``
for ready-made models, ``ir.search.search`` to rank parallel strategies,
``from_torch`` to import a PyTorch module, and ``to_onnx``/``from_onnx`` for ONNX
files with seed 001's annotations.
"""

from __future__ import annotations

from . import (  # `import ir` is enough for ir.models.mlp(...)
    models,
    search,
    sharding,
    transforms,
)
from .builder import FunctionBuilder
from .calibration import Calibration, calibrate
from .device import Device, Topology, TopologyError
from .errors import (
    DistIRError,
    ExecutionError,
    ParseError,
    RegistryError,
    TypeRuleError,
    UnknownOpError,
    VerifyError,
)
from .execute import execute, execute_step, random_inputs
from .function import Function
from .importers import from_onnx, from_torch, to_onnx
from .layout import LayoutError, collect, distribute
from .op import Op
from .registry import Attr, Cost, OpDef, OpKind, all_ops, get_op, register_op
from .sim import SimResult, simulate
from .text import format_function as format
from .text import parse
from .types import DeviceVar, DType, TensorType, TupleType, Type
from .value import Value
from .verify import verify

__all__ = [
    "Attr",
    "Calibration",
    "Cost",
    "DType",
    "Device",
    "DeviceVar",
    "DistIRError",
    "ExecutionError",
    "Function",
    "FunctionBuilder",
    "LayoutError",
    "Op",
    "OpDef",
    "OpKind",
    "ParseError",
    "RegistryError",
    "SimResult",
    "TensorType",
    "Topology",
    "TopologyError",
    "TupleType",
    "Type",
    "TypeRuleError",
    "UnknownOpError",
    "Value",
    "VerifyError",
    "all_ops",
    "calibrate",
    "collect",
    "distribute",
    "execute",
    "execute_step",
    "format",
    "from_onnx",
    "from_torch",
    "get_op",
    "models",
    "parse",
    "random_inputs",
    "register_op",
    "search",
    "sharding",
    "simulate",
    "to_onnx",
    "transforms",
    "verify",
]
