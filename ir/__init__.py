"""DistIR: a small IR for distributed neural-network programs.

Public entry points: ``FunctionBuilder`` to build programs, ``parse`` and
``format`` for the text format, ``execute`` for the numpy reference executor,
``Topology`` for hardware (``calibrate`` measures this machine), ``ir.models``
for ready-made models, ``ir.search.search`` to rank parallel strategies,
``ir.inference`` for serving (prefill and decode steps with the KV cache, their metrics),
``from_torch`` to import a PyTorch module, and ``to_onnx``/``from_onnx`` for ONNX
files with seed 001's annotations.
"""

from __future__ import annotations

from . import (  # `import ir` is enough for ir.models.mlp(...)
    hardware,
    inference,
    models,
    search,
    sharding,
    transforms,
)
from .builder import FunctionBuilder
from .calibration import Calibration
from .calibration import calibrate as _calibrate_machine
from .device import Device, Topology, TopologyError
from .errors import (
    ArgumentError,
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
from .sim.fit import EfficiencyFit, Measurement, fit_efficiency
from .text import format_function as format
from .text import parse
from .types import DeviceVar, DType, TensorType, TupleType, Type
from .value import Value
from .verify import verify


def calibrate(measurements=None, /, *args, preset=None, **kwargs):
    """Fit the simulator to reality, two ways.

    * ``ir.calibrate()`` (or with :class:`ir.calibration.CalibrationOptions`) measures
      *this machine* (matmuls, memory copies, gloo transfers) and returns a
      :class:`Calibration` whose ``topology(n)`` is this machine in the simulator's terms
      (``ir.calibration.calibrate``).
    * ``ir.calibrate(measurements, preset="a100-hgx")`` fits the efficiency model of a GPU
      preset to step times you measured (a list of :class:`Measurement`: the program
      that ran and its time) and returns an :class:`EfficiencyFit`: the fitted factors,
      ``topology(n)`` to use everywhere else, and each measurement's error unscaled,
      fitted (in sample) and held out (leave-one-out). Keyword arguments go to
      :func:`ir.sim.fit.fit_efficiency` (``factors=``, ``prior=``).
    """
    if measurements is not None and not isinstance(measurements, _calibration_options()):
        if preset is None:
            raise ArgumentError(
                "calibrate(measurements, preset=...): name the preset whose efficiency model "
                f"to fit (one of {', '.join(Topology.presets())})"
            )
        return fit_efficiency(measurements, preset, *args, **kwargs)
    if preset is not None:
        raise ArgumentError("calibrate: preset= goes with a list of measurements")
    return _calibrate_machine(measurements, *args, **kwargs)


def _calibration_options():
    from .calibration import CalibrationOptions

    return CalibrationOptions


__all__ = [
    "Attr",
    "Calibration",
    "Cost",
    "DType",
    "Device",
    "DeviceVar",
    "DistIRError",
    "EfficiencyFit",
    "ExecutionError",
    "Function",
    "FunctionBuilder",
    "LayoutError",
    "Measurement",
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
    "hardware",
    "inference",
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
