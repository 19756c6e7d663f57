"""Model-parallel placement: put each op on a device and insert the sends (seed 000).

``assignment`` maps value names to devices: weights (inputs) and/or op results.
An op whose result is named runs there; otherwise an op that reads a weight
runs on that weight's device (an unnamed weight stays on its input's device;
the optimizer step and the weight's gradient go with it); otherwise it
follows the data, running on the device of its most recently produced operand.
An operand on another device is sent once (``Send``) and reused. Inputs stay
where they are, so the placed program takes the same arguments as the original.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..types import DeviceRef
from ..value import Value
from ..verify import verify
from ._rewrite import (
    Mover,
    TransformError,
    check_common,
    check_device,
    check_devices,
    device_of,
    localize_op,
    parameter_inputs,
)


def op_devices(f: Function, assignment: Mapping[str, DeviceRef]) -> dict[Op, DeviceRef]:
    """The device of every op of ``f`` under ``assignment`` (see the module docstring)."""
    names = {v.name for v in f.inputs} | {v.name for op in f.ops for v in op.outputs}
    unknown = sorted(set(assignment) - names)
    if unknown:
        raise TransformError(f"{f.name} has no value(s) named {unknown}; assign inputs or results")
    placed: dict[Value, DeviceRef] = {
        v: assignment.get(v.name, device_of(v.type)) for v in f.inputs
    }
    weights_of = set(parameter_inputs(f)) | {v for v in f.inputs if v.name in assignment}
    order = {v: -1 for v in f.inputs}
    devices: dict[Op, DeviceRef] = {}
    for i, op in enumerate(f.ops):
        named = [assignment[v.name] for v in op.outputs if v.name in assignment]
        weights = [placed[v] for v in op.inputs if v in weights_of]
        if named:
            dev = named[0]
        elif weights:
            dev = weights[0]
        else:
            latest = max(op.inputs, key=lambda v: order.get(v, -1), default=None)
            if latest is not None:
                dev = placed.get(latest, device_of(latest.type))
            else:  # no operand (a Constant): it stays where it was made
                dev = device_of(op.outputs[0].type) if op.outputs else None
        devices[op] = dev
        for v in op.outputs:
            placed[v], order[v] = dev, i
    return devices


def place(f: Function, assignment: Mapping[str, DeviceRef], *, topology: Any = None) -> Function:
    """``f`` with its ops on the devices ``assignment`` implies, and sends between them.

    >>> import ir
    >>> from ir.transforms import place
    >>> b = ir.FunctionBuilder("mlp")
    >>> wa = b.input("wA", ir.TensorType((4, 8), ir.DType.float64, 0))
    >>> wb = b.input("wB", ir.TensorType((8, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> a = b.call("MatMul", x, wa, name="a")
    >>> g = place(b.finish(b.call("MatMul", a, wb, name="y")), {"wB": 1})
    >>> [(op.op_type, op.device) for op in g.ops]
    [('MatMul', 0), ('Send', 1), ('Send', 1), ('MatMul', 1)]
    """
    check_common("place", f, topology, sequential=False)
    if not isinstance(assignment, Mapping):
        raise TransformError(f"assignment must map value names to devices, got {assignment!r}")
    for name, device in assignment.items():
        check_device(device, f"assignment[{name!r}]")
    devices = op_devices(f, assignment)
    used = sorted({d for d in devices.values() if isinstance(d, int)})
    if topology is not None and used:
        check_devices(used, len(used), topology, what="number of devices")
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    move = Mover(b)
    for op in f.ops:
        dev = devices[op]
        ins = [move.at(env[v], dev) for v in op.inputs]
        for v, out in zip(op.outputs, localize_op(b, op, ins, dev)):
            env[v] = out
    return verify(b.finish([env[v] for v in f.outputs]))


__all__ = ["op_devices", "place"]
