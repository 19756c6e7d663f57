"""One op of a propagated program as one ``Pmap`` over the mesh: the symmetric case.

Propagation decides, per op of the sequential program, the local op every mesh
device runs (its attributes and operand and result types). Where every device
runs the same local op on operands of the same shapes (even shards, replicas,
partial sums), the op is one ``Pmap`` over the mesh's per-device tuples whose
body holds that local op once, on device variable ``e``, so a program does not
grow a copy of every op per device, and the simulator walks the body once per
rank class. Repeated layers, which share their decision, share the body too.
Devices that differ (uneven shards, halo exchanges, an op whose attributes name
its device) keep one op per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..types import DeviceVar, TensorType, Type

VAR = "e"  # the device variable of propagation's pmaps
_ON_VAR = DeviceVar(VAR)


def _on_var(types: Sequence[Type]) -> list[TensorType] | None:
    if not all(type(t) is TensorType for t in types):
        return None
    return [t.with_device(_ON_VAR) for t in types]  # type: ignore[union-attr]


def symmetric_body(
    op: Op,
    in_types: Sequence[Sequence[Type]],
    local_ops: Sequence[tuple[Mapping[str, Any], Sequence[Type]]],
) -> Function | None:
    """The body every mesh device runs for ``op``, or None if the devices differ.

    ``in_types[i]`` are device ``i``'s operand types and ``local_ops[i]`` its local
    op's (attributes, result types). The devices agree when their attributes are
    equal and their operand and result types equal but for the device; the body
    takes and returns tensors on ``e``.
    """
    if not op.inputs or not local_ops:
        return None
    attributes, results = local_ops[0]
    ins, outs = _on_var(in_types[0]), _on_var(results)
    if ins is None or outs is None:
        return None
    for types, (attrs, res) in zip(in_types[1:], local_ops[1:]):
        if attrs != attributes or _on_var(types) != ins or _on_var(res) != outs:
            return None
    opdef = get_op(op.op_type)
    b = FunctionBuilder(f"{opdef.name}_body")
    # the record's own operand and result names: a body shared by repeated layers reads
    # the same whichever layer made it (the pmap's operands and results carry the names)
    xs = [b.input(n, t) for n, t in zip(_names(opdef.operands, len(ins), "x"), ins)]
    names = _names(opdef.results, len(op.outputs), "y")
    new = b.add_op(op.op_type, xs, dict(attributes), names=names)
    return b.finish(list(new.outputs))


def _names(declared: Sequence[str], n: int, stem: str) -> list[str]:
    if len(declared) == n:
        return list(declared)
    return [f"{stem}{i}" for i in range(n)]


def pmap(b: FunctionBuilder, body: Function, operands: Sequence, names: Sequence[str]) -> Op:
    """Append the ``Pmap`` of ``body`` over the per-device tuples ``operands``."""
    return b.add_op("Pmap", list(operands), {"device_var": VAR}, names=names, subfunctions=[body])
