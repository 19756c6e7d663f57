"""The top-level walk: each op runs once, so its timing is resolved once per op signature.

A top-level op's device, duration, cost and output sizes depend only on its
type, device, attributes and operand and result types. A propagated program
shares type objects and attribute mappings between its layers' (and devices')
copies, so ops are first looked up by the identity of those objects (the
function, alive all run, keeps them from being reused); on a miss, by their
structure (shapes, dtype names, devices, attribute values), and only a
structural miss prepares the op (cost rule, comm rule, device lookups).

The walk itself does what :meth:`Engine._run_ops` does for an op in a pmap body,
with the per-op data already resolved into a record::

    (kind, where, dur, cost, size, out, channels)

``where`` is the compute device index (int) or the participants (tuple); ``size``
and ``out`` are the bytes and device index of a single tensor result, or ``size``
is None and ``out`` lists the resolved output templates (see :func:`_resolved`);
``channels`` are a communication op's channels (see :meth:`Engine._channels`),
None for a compute op.
"""

from __future__ import annotations

from typing import Any

from ..op import Op
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import describe_op
from .engine import (
    _COMPUTE_KIND,
    _CONTROL_KIND,
    Engine,
    SimulationError,
    _leaves,
    _Scope,
    _tuple_get,
    _UnknownDeviceError,
)


class _FlatTuple(tuple):
    """A resolved tuple template whose elements are all tensors: (bytes..., devices...)."""


def run_top_level(
    engine: Engine, ops: tuple[Op, ...], env: dict[Value, Any], scope: _Scope
) -> None:
    """Walk the top-level ``ops`` of a function, appending to ``engine``'s columns."""
    records = engine._records_by_identity
    structural = engine._structural_by_type
    slot_ready = engine.slot_ready
    new_ready, new_bytes = slot_ready.append, engine.slot_bytes.append
    new_device, new_producer = engine.slot_device.append, engine.slot_producer.append
    inst_op = engine.inst_op
    add_op, add_where = inst_op.append, engine.inst_where.append
    add_start, add_dur, add_cost = (
        engine.inst_start.append,
        engine.inst_dur.append,
        engine.inst_cost.append,
    )
    add_count, add_uses = engine.use_count.append, engine.use_slots.extend
    compute_free, comm_free = engine.compute_free, engine.comm_free
    ready_of, value_of = slot_ready.__getitem__, env.__getitem__
    compute_kind, tuple_get, flat_tuple = _COMPUTE_KIND, _tuple_get, _FlatTuple
    produced, slots = len(inst_op), len(slot_ready)  # kept in step with the columns
    for op in ops:
        try:
            op_type = op.op_type
            handler = structural.get(op_type)
            if handler is not None:
                if handler is tuple_get:  # the most common structural op, inlined
                    env[op.outputs[0]] = value_of(op.inputs[0])[op.attributes["index"]]
                else:
                    handler(engine, op, env, scope)
                    produced, slots = len(inst_op), len(slot_ready)
                continue
            ins, outs = op.inputs, op.outputs
            # the identity key: no hashing of shapes or attribute values
            n = len(ins)
            if n == 2 and len(outs) == 1:
                key = (
                    op_type,
                    op.device,
                    id(op.attributes),
                    id(ins[0].type),
                    id(ins[1].type),
                    id(outs[0].type),
                )
            elif n == 1 and len(outs) == 1:
                key = (op_type, op.device, id(op.attributes), id(ins[0].type), id(outs[0].type))
            elif n == 3 and len(outs) == 1:  # LayerNorm
                key = (
                    op_type,
                    op.device,
                    id(op.attributes),
                    id(ins[0].type),
                    id(ins[1].type),
                    id(ins[2].type),
                    id(outs[0].type),
                )
            else:
                key = (
                    op_type,
                    op.device,
                    id(op.attributes),
                    None,
                    tuple([id(v.type) for v in ins]),
                    tuple([id(v.type) for v in outs]),
                )
            record = records.get(key)
            if record is None:
                record = _record(engine, op, scope)
                if record.__class__ is not tuple:  # a structural op: run it, dispatch by type
                    structural[op_type] = record
                    record(engine, op, env, scope)
                    produced, slots = len(inst_op), len(slot_ready)
                    continue
                records[key] = record
            uses = [*map(value_of, ins)]
            try:
                if n == 1:
                    ready = slot_ready[uses[0]]
                elif n == 2:  # max() of two, inlined: the first unless the second is larger
                    ready, other = slot_ready[uses[0]], slot_ready[uses[1]]
                    if other > ready:
                        ready = other
                else:
                    ready = max(map(ready_of, uses)) if n else 0.0
            except TypeError:  # a tuple operand (a collective's, Concat's)
                uses = _leaves(uses)
                ready = max(map(ready_of, uses)) if uses else 0.0
                n = len(uses)
            kind, where, dur, cost, size, out, channels = record
            if kind is compute_kind:
                start = compute_free[where]
                if ready > start:
                    start = ready
                end = start + dur
                compute_free[where] = end
            else:
                start = max([ready, *[comm_free[c] for c in channels]])
                end = start + dur
                for c in channels:
                    comm_free[c] = end
                engine.comm_instances.append(produced)
                engine.comm_channels.append(channels)
            producer = produced
            produced += 1
            add_op(op)
            add_where(where)
            add_start(start)
            add_dur(dur)
            add_cost(cost)
            add_count(n)
            add_uses(uses)
            if size is not None:  # the common case: one tensor result
                env[outs[0]] = slots
                slots += 1
                new_ready(end)
                new_bytes(size)
                new_device(out)
                new_producer(producer)
                continue
            for v, template in zip(outs, out):
                if template.__class__ is flat_tuple:  # a tuple of tensors (a collective's)
                    n = len(template) // 2
                    env[v] = engine.flat_slots(template[:n], template[n:], end, producer)
                else:
                    env[v] = _allocate(engine, template, end, producer)
            slots = len(slot_ready)
        except _UnknownDeviceError as e:
            raise engine._device_error(op, e.ref) from None


def _record(engine: Engine, op: Op, scope: _Scope) -> Any:
    """The op's resolved record, shared by structure; a structural op's handler instead."""
    descriptors = engine._type_descriptors
    ins = [descriptors.get(id(v.type)) or _describe(engine, v.type) for v in op.inputs]
    outs = [descriptors.get(id(v.type)) or _describe(engine, v.type) for v in op.outputs]
    key = (op.op_type, op.device, engine._attributes_of(op), tuple(ins), tuple(outs))
    record = engine._records_by_structure.get(key)
    if record is not None:
        return record
    prep = engine._prepare(op)
    kind = prep[0]
    if kind is _CONTROL_KIND:
        return prep[1]
    if kind is _COMPUTE_KIND:
        _, cost, dev_ref, templates, size, out_ref = prep
        where = scope[dev_ref]
        if engine.rep_of[where] != where:
            raise SimulationError(
                f"{op.op_type} runs on device {engine.topology.device_ids[where]} alone, but "
                "the program declares that device's rank class identical to device "
                f"{engine.topology.device_ids[engine.rep_of[where]]} (rank_classes): a "
                "transform that declares classes must give every member the same work\n"
                f"  in: {describe_op(op)}"
            )
        dur = cost[2][where]
        if size is not None:
            record = (kind, where, dur, cost, size, scope[out_ref], None)
        else:
            out = [_resolved(t, scope) for t in templates]
            record = (kind, where, dur, cost, None, out, None)
    else:
        # the structural key fixes the types and attributes: the comm rule's answer too
        where, dur, cost, channels = engine._collective(op, scope, prep, key)
        out = [_resolved(t, scope) for t in prep[1]]
        if len(out) == 1 and out[0].__class__ is tuple:
            record = (kind, where, dur, cost, out[0][0], out[0][1], channels)
        else:
            record = (kind, where, dur, cost, None, out, channels)
    engine._records_by_structure[key] = record
    return record


def _describe(engine: Engine, t: Type) -> Any:
    """A hashable stand-in for ``t`` equal for equal types (enum hashes run Python code)."""
    if t.__class__ is TensorType:
        found: Any = (t.shape, t.dtype._name_, t.device)
    elif t.__class__ is TupleType:
        found = ("tuple", *[_describe(engine, e) for e in t.elements])
    else:
        found = (t,)
    engine._type_descriptors[id(t)] = found
    return found


def _resolved(template: Any, scope: _Scope) -> Any:
    """A template with device refs replaced by topology indices (tuples of tensors flat)."""
    if template.__class__ is tuple:
        return (template[0], scope[template[1]])
    elements = [_resolved(t, scope) for t in template]
    if all(e.__class__ is tuple for e in elements):
        return _FlatTuple([*[e[0] for e in elements], *[e[1] for e in elements]])
    return elements


def _allocate(engine: Engine, template: Any, ready: float, producer: int) -> Any:
    """Slots for a value of a resolved template's structure."""
    if template.__class__ is tuple:
        engine.slot_ready.append(ready)
        engine.slot_bytes.append(template[0])
        engine.slot_device.append(template[1])
        engine.slot_producer.append(producer)
        return len(engine.slot_ready) - 1
    if template.__class__ is _FlatTuple:
        n = len(template) // 2
        return engine.flat_slots(template[:n], template[n:], ready, producer)
    return tuple(_allocate(engine, t, ready, producer) for t in template)
