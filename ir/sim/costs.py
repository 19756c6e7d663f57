"""Measured op times that the simulator uses in place of its cost models: :class:`OpCosts`.

The simulator's own models are a roofline per compute op (``launch + max(flops / peak,
bytes / bandwidth)``) and an alpha-beta ring per collective. They know nothing of what a
real backend adds: Python dispatch, a loss that is ten kernels, gloo's all-reduce
algorithm. A *profiled* cost table holds what each distinct op took when a backend ran it
alone (``ir.backends.profile.profile_ops`` measures one with the torch backend), so the
simulation composes measured op times: what it then predicts is the step's arrangement
(dependencies, overlap, waiting, pipeline bubbles), which is what a strategy choice turns
on. ``ir.simulate(program, topology, costs=table)`` looks each op up here first and falls
back to the topology's models for ops the table lacks (:meth:`OpCosts.missing` lists them).

Keys: a compute op by its type, attributes, and operand and result shapes and element
types (:func:`compute_key`, the simulator's own memo key: ops alike in these cost the
same); a communication op by its collective kind, its size in bytes (as its
``comm_rule`` gives it) and the number of devices in its group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..function import Function
from ..op import Op
from ..types import TensorType


def _attributes(op: Op) -> Any:
    """An op's attributes as a hashable key, but for the device it runs on (a constant's
    ``device``: a pmap body's op and each device's copy cost the same); the op itself
    when they do not hash."""
    if not op.attributes:
        return ()
    try:
        key = tuple(sorted((k, v) for k, v in op.attributes.items() if k != "device"))
        hash(key)
        return key
    except TypeError:
        return op  # unhashable attributes: cost this op on its own


def compute_key(op_type: str, op: Op) -> tuple:
    """What a compute op's cost depends on: its type, attributes, and the shape and element
    type of every operand and result (a tuple-typed value by its elements' shapes and
    element types). Never the devices: a pmap body's op (on its device variable) and
    each device's copy of it share one key."""
    key: list[Any] = [op_type, _attributes(op)]
    for v in (*op.inputs, *op.outputs):
        t = v.type
        if t.__class__ is TensorType:
            key.append(t.shape)
            key.append(t.dtype)
        else:
            key.append(_elements_key(t))
    return tuple(key)


def _elements_key(t: Any) -> tuple:
    """A tuple type's ``(shape, dtype)`` per element, nested as the type nests."""
    return tuple(
        (e.shape, e.dtype) if e.__class__ is TensorType else _elements_key(e) for e in t.elements
    )


@dataclass
class OpCosts:
    """Measured seconds per compute op (:func:`compute_key`) and per communication
    ``(kind, size_bytes, group_size)``; ``processes``: how many processes ran at once while
    they were measured (ops slow down when processes share cores); ``notes``: how."""

    compute: dict[tuple, float] = field(default_factory=dict)
    communication: dict[tuple[str, float, int], float] = field(default_factory=dict)
    processes: int = 1
    notes: tuple[str, ...] = ()

    def communication_time_s(self, kind: str, size_bytes: float, group_size: int) -> float | None:
        return self.communication.get((kind, float(size_bytes), int(group_size)))

    def __len__(self) -> int:
        return len(self.compute) + len(self.communication)

    def missing(self, program: Function) -> list[str]:
        """The ops of ``program`` (pmap bodies included) the table has no time for, one line
        each, as printed; the simulator costs those with the topology's models."""
        from ..verify import describe_op

        flat = unrolled(program)
        out = [describe_op(op) for key, op in compute_ops(flat) if key not in self.compute]
        out += [
            f"{kind} of {size:.0f} bytes over {n} devices"
            for kind, size, n in communication_keys(flat)
            if (kind, size, n) not in self.communication
        ]
        return out

    def updated(self, other: OpCosts) -> OpCosts:
        """A table with ``other``'s entries over this one's."""
        if other.processes != self.processes:
            raise ValueError(
                f"cannot merge cost tables measured with {self.processes} and "
                f"{other.processes} processes at once"
            )
        return OpCosts(
            {**self.compute, **other.compute},
            {**self.communication, **other.communication},
            self.processes,
            tuple(dict.fromkeys((*self.notes, *other.notes))),
        )

    def summary(self) -> str:
        """One line per kind of op: how many entries and their total time."""
        by: dict[str, list[float]] = {}
        for key, t in self.compute.items():
            by.setdefault(key[0], []).append(t)
        for (kind, _, n), t in self.communication.items():
            by.setdefault(f"{kind} ({n} devices)", []).append(t)
        return "\n".join(
            f"{name}: {len(ts)} measured, {min(ts) * 1e6:.1f}-{max(ts) * 1e6:.1f} us"
            for name, ts in sorted(by.items())
        )


def unrolled(program: Function) -> Function:
    """``program`` with every pmap unrolled (each device's copy, its types bound); itself
    when it has none. The table's keys are those of the unrolled ops."""
    if any(op.subfunctions for op in program.ops):  # pmaps and tasks
        from ..transforms import unroll_pmap

        return unroll_pmap(program)
    return program


def compute_ops(program: Function) -> list[tuple[tuple, Op]]:
    """One ``(compute_key, op)`` per distinct compute op of ``program``, in program order."""
    from ..registry import OpKind, get_op

    seen: dict[tuple, Op] = {}
    for op in unrolled(program).ops:
        if get_op(op.op_type).kind is OpKind.COMPUTE:
            seen.setdefault(compute_key(op.op_type, op), op)
    return list(seen.items())


def communication_keys(program: Function) -> list[tuple[str, float, int]]:
    """One ``(kind, size_bytes, group_size)`` per distinct transfer of ``program``."""
    from ..registry import CostContext, OpKind, get_op

    seen: dict[tuple[str, float, int], None] = {}
    for op in unrolled(program).ops:
        opdef = get_op(op.op_type)
        if opdef.kind is not OpKind.COMMUNICATION or opdef.comm_rule is None:
            continue
        c = opdef.comm_rule(
            CostContext(
                tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs), op.attributes
            )
        )
        if c.kind != "local":
            seen[(c.kind, float(c.size_bytes), len(c.devices))] = None
    return list(seen)
