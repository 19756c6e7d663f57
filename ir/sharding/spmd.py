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
from dataclasses import replace
from typing import Any

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..types import DeviceVar, TensorType, Type
from ..value import Value

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


def fuse_pmaps(g: Function) -> Function:
    """``g`` with each run of consecutive propagation Pmaps over the same devices fused
    into one Pmap, whose body holds the run's ops in order: what runs between two
    collectives is one body, as a transform writes it (the compact text to read;
    :func:`ir.sharding.propagate` keeps one pmap per op, which the graph view draws as
    one node per logical op).

    >>> import ir
    >>> from ir.sharding import Mesh, S, propagate
    >>> g, _ = propagate(ir.models.mlp(8, 4, 6, 4), {"wA": (Mesh((2,)), [S(1)])})
    >>> [op.op_type for op in g.ops]
    ['Pmap', 'Pmap', 'Pmap', 'AllReduce', 'Pmap']
    >>> [op.op_type for op in fuse_pmaps(g).ops]
    ['Pmap', 'AllReduce', 'Pmap']

    Each device runs the same ops in the same order as before, so the step computes and
    times the same; the fused body's values are named after the pmaps' operands and
    results. A fused pmap returns what ops after the run, or the step, read.
    """
    ops = g.ops
    last_use: dict[Value, int] = {}
    for i, op in enumerate(ops):
        for v in op.inputs:
            last_use[v] = i
    for v in g.outputs:
        last_use[v] = len(ops)
    b = FunctionBuilder(g.name)
    env = {v: b.input(v.name, v.type) for v in g.inputs}
    i = 0
    while i < len(ops):
        j = i + 1
        if _fusable(ops[i]):
            devices = ops[i].inputs[0].type.devices
            while j < len(ops) and _fusable(ops[j]) and ops[j].inputs[0].type.devices == devices:
                j += 1
        if j - i == 1:
            _copy(b, ops[i], env)
        else:
            _fuse(b, ops[i:j], env, last_use, j)
        i = j
    fused = b.finish([env[v] for v in g.outputs])
    return replace(
        fused,
        input_layouts=g.input_layouts,
        output_layouts=g.output_layouts,
        rank_classes=g.rank_classes,
    )


def _fusable(op: Op) -> bool:
    a = op.attributes
    if op.op_type != "Pmap" or a.get("device_var") != VAR or a.get("device_map") is not None:
        return False
    if not op.inputs:
        return False
    return all(not inner.subfunctions for inner in op.subfunctions[0].ops)


def _copy(b: FunctionBuilder, op: Op, env: dict[Value, Value]) -> None:
    ins = [env[v] for v in op.inputs]
    names = [v.name for v in op.outputs]
    if op.subfunctions:
        new = b.add_op(op.op_type, ins, op.attributes, names=names, subfunctions=op.subfunctions)
    else:  # the same op on the same operand types: its attributes and types hold
        new = b.add_inferred(op.op_type, ins, op.attributes, [v.type for v in op.outputs], names)
    env.update(zip(op.outputs, new.outputs))


def _fuse(
    b: FunctionBuilder,
    run: Sequence[Op],
    env: dict[Value, Value],
    last_use: Mapping[Value, int],
    end: int,
) -> None:
    body_b = FunctionBuilder(f"{run[0].outputs[0].name}_body")
    inner: dict[Value, Value] = {}  # an outer value -> its value in the fused body
    operands: list[Value] = []
    for op in run:
        body = op.subfunctions[0]
        local: dict[Value, Value] = {}
        for param, outer in zip(body.inputs, op.inputs):
            if outer not in inner:  # read from outside the run: a new body input
                inner[outer] = body_b.input(outer.name, param.type)
                operands.append(outer)
            local[param] = inner[outer]
        results = dict(zip(body.outputs, op.outputs))
        for x in body.ops:
            names = [results[v].name if v in results else v.name for v in x.outputs]
            new = body_b.add_inferred(
                x.op_type, [local[v] for v in x.inputs], x.attributes,
                [v.type for v in x.outputs], names,
            )  # fmt: skip
            local.update(zip(x.outputs, new.outputs))
        for param_out, outer in results.items():
            inner[outer] = local[param_out]
    kept = [v for op in run for v in op.outputs if last_use.get(v, -1) >= end]
    if not kept:  # nothing reads the run's results: keep its work (and its time) anyway
        kept = list(run[-1].outputs)
    fused = body_b.finish([inner[v] for v in kept])
    new = pmap(b, fused, [env[v] for v in operands], [v.name for v in kept])
    env.update(zip(kept, new.outputs))
