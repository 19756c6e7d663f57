"""Helpers the parallelism transforms share: errors, parameters, op localisation, tuples.

``localize_op`` re-adds an op to a builder with new operands whose shapes or
devices differ from the original's (a shard, a microbatch, another device) and
fixes the attributes that spell shapes or sizes: ``Reshape``'s target shape,
the ``denominator`` of ``Loss``/``LossGrad`` (set to the global number of rows,
so that per-shard losses and gradients sum to the global ones) and the
``device`` of ``Constant``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..builder import FunctionBuilder
from ..errors import DistIRError, VerifyError
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..types import DeviceRef, TensorType, TupleType, Type
from ..value import Value
from ..verify import describe_op


class TransformError(DistIRError):
    """A parallelism transform cannot apply to this program with these parameters."""


# -- parameters and batch inputs -------------------------------------------------------

# (op type, operand index) pairs that read a weight in a forward program.
_WEIGHT_OPERANDS = {
    ("MatMul", 1),
    ("MatMulGrad", 1),
    ("Embedding", 0),
    ("LayerNorm", 1),
    ("LayerNorm", 2),
    ("LayerNormGrad", 1),
}


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}


def is_optimizer(op: Op) -> bool:
    """True for SGD, Adam and every op whose record says ``extra["optimizer"]``."""
    return bool(get_op(op.op_type).extra.get("optimizer", False))


def parameter_inputs(f: Function) -> list[Value]:
    """The inputs that are weights (or optimizer state), in input order.

    A training program names them: operand 0 and the state operands of its
    optimizer ops. A forward program: the right operand of a MatMul, the table of
    an Embedding, the scale and shift of a LayerNorm, and an input broadcast against
    a larger operand by an elementwise op (a bias, a position embedding).
    """
    inputs = set(f.inputs)
    found: set[Value] = set()
    optimizers = [op for op in f.ops if is_optimizer(op)]
    if optimizers:
        for op in optimizers:
            found.update(v for i, v in enumerate(op.inputs) if i != 1 and v in inputs)
    else:
        for op in f.ops:
            for i, v in enumerate(op.inputs):
                if v in inputs and ((op.op_type, i) in _WEIGHT_OPERANDS or _broadcast(op, v)):
                    found.add(v)
    return [v for v in f.inputs if v in found]


def _broadcast(op: Op, v: Value) -> bool:
    """``v`` is broadcast against a larger activation by an elementwise op (a bias, a table)."""
    if op.op_type not in _ELEMENTWISE or not isinstance(v.type, TensorType):
        return False
    return v.type.rank < op.outputs[0].type.rank


def batch_inputs(f: Function, names: Sequence[str] | None = None) -> list[Value]:
    """The inputs split along dim 0 (the batch): those named, else the non-weights of rank >= 1.

    Without names, the batch size is dim 0 of the first non-weight input, and every
    non-weight input with that dim 0 is a batch input.
    """
    if names is not None:
        by_name = {v.name: v for v in f.inputs}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise TransformError(
                f"{f.name} has no input(s) {unknown}; its inputs are {list(by_name)}"
            )
        return [by_name[n] for n in names]
    params = set(parameter_inputs(f))
    data = [
        v
        for v in f.inputs
        if v not in params and isinstance(v.type, TensorType) and v.type.rank >= 1
    ]
    if not data:
        return []
    batch = data[0].type.shape[0]
    return [v for v in data if v.type.shape[0] == batch]


def batch_size(f: Function, batch: Sequence[Value]) -> int:
    """The common dim 0 of ``batch``, or a TransformError naming the inputs that differ."""
    sizes = {v.type.shape[0] for v in batch}
    if len(sizes) != 1:
        shown = ", ".join(f"{v.name}: {v.type.shape[0]}" for v in batch)
        raise TransformError(f"{f.name}: batch inputs disagree on the batch size ({shown})")
    return sizes.pop()


def check_degree(what: str, degree: Any, size: int, dim_name: str) -> None:
    """A clear error when ``degree`` is not a positive int no larger than ``size``."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise TransformError(f"{what} must be a positive integer, got {degree!r}")
    if degree > size:
        raise TransformError(
            f"{what} {degree} is larger than the {dim_name} ({size}): some devices would "
            f"get no rows; use at most {size}"
        )


def check_devices(
    devices: Sequence[DeviceRef] | None, degree: int, topology: Any = None, what: str = "degree"
) -> tuple:
    """``devices`` as a tuple of ``degree`` distinct devices present in ``topology``; by
    default the topology's first ``degree`` devices, or ``0..degree-1`` without one."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise TransformError(f"the {what} must be a positive integer, got {degree!r}")
    if devices is None and topology is not None:
        ids = tuple(topology.device_ids)
        if len(ids) < degree:
            raise TransformError(
                f"the {what} is {degree} but the topology has only {len(ids)} devices"
            )
        devices = ids[:degree]
    devices = tuple(range(degree) if devices is None else devices)
    if len(devices) != degree:
        raise TransformError(f"got {len(devices)} devices {list(devices)} for degree {degree}")
    if len(set(devices)) != len(devices):
        raise TransformError(f"devices {list(devices)} name a device twice")
    if topology is not None:
        known = set(topology.device_ids)
        missing = [d for d in devices if d not in known]
        if missing:
            raise TransformError(
                f"devices {missing} are not in the topology (it has {sorted(known)})"
            )
    return devices


# -- localising ops ----------------------------------------------------------------------


def _prefix(shape: Sequence[int], k: int) -> int:
    return math.prod(shape[:k])


def local_reshape(
    global_in: Sequence[int], local_in: Sequence[int], global_out: Sequence[int]
) -> tuple[int, ...] | None:
    """The local target shape of a Reshape whose operand shrank on one axis, or None.

    The shrunk input axis k maps to the output axis j whose leading dims hold the
    same number of elements as input's leading dims before k (a batch axis stays
    the batch axis; hidden H = heads * head_dim splits by heads).
    """
    changed = [i for i, (g, loc) in enumerate(zip(global_in, local_in)) if g != loc]
    if not changed:
        return tuple(global_out)
    if len(changed) > 1:
        return None
    k = changed[0]
    lead = _prefix(global_in, k)
    for j in range(len(global_out)):
        if _prefix(global_out, j) == lead:
            num = global_out[j] * local_in[k]
            if num % global_in[k]:
                return None
            out = list(global_out)
            out[j] = num // global_in[k]
            if math.prod(out) != math.prod(local_in):
                return None
            return tuple(out)
        if _prefix(global_out, j) > lead:
            break
    return None


def loss_rows(y: TensorType, kind: str) -> int:
    """The number of rows a Loss divides by when its denominator is 0 (see ir/ops/loss.py)."""
    if kind == "cross_entropy" or y.rank >= 2:
        return max(math.prod(y.shape[:-1]), 1)
    return max(math.prod(y.shape), 1)


def local_attributes(op: Op, inputs: Sequence[Value], device: DeviceRef) -> dict[str, Any]:
    """``op``'s attributes fitted to new operands (shapes of shards, other devices)."""
    attrs = dict(op.attributes)
    if op.op_type == "Reshape":
        g, loc = op.inputs[0].type, inputs[0].type
        shape = local_reshape(g.shape, loc.shape, op.outputs[0].type.shape)
        if shape is None:
            raise TransformError(
                f"cannot fit Reshape of {g.shape} to {op.outputs[0].type.shape} onto a shard "
                f"of shape {loc.shape}\n  in: {describe_op(op)}"
            )
        attrs["shape"] = shape
    elif (
        op.op_type in ("Loss", "LossGrad")
        and not attrs.get("denominator")
        and inputs[0].type.shape != op.inputs[0].type.shape
    ):
        attrs["denominator"] = loss_rows(op.inputs[0].type, attrs.get("kind", "cross_entropy"))
    elif op.op_type == "Constant":
        attrs["device"] = device
    return attrs


def localize_op(
    builder: FunctionBuilder,
    op: Op,
    inputs: Sequence[Value],
    device: DeviceRef = None,
    suffix: str = "",
) -> tuple[Value, ...]:
    """Re-add ``op`` with ``inputs`` (shards, copies on other devices); return its results."""
    attrs = local_attributes(op, inputs, device)
    try:
        new = builder.add_op(
            op.op_type,
            inputs,
            attrs,
            names=[v.name + suffix for v in op.outputs],
            subfunctions=op.subfunctions,
            op_name=op.name,
        )
    except VerifyError as e:
        raise TransformError(f"{e}\n  while rewriting: {describe_op(op)}") from None
    return new.outputs


# -- tuples -----------------------------------------------------------------------------


def sub_tuple(b: FunctionBuilder, xs: Value, indices: Sequence[int], name: str = "") -> Value:
    """The elements ``indices`` of tuple ``xs`` as a new tuple (``xs`` itself if all, in order)."""
    assert isinstance(xs.type, TupleType)
    if list(indices) == list(range(len(xs.type))):
        return xs
    items = [b.call("TupleGet", xs, index=i, name=f"{xs.name}_{i}") for i in indices]
    return b.call("MakeTuple", *items, name=name or f"{xs.name}_part")


def device_of(t: Type) -> DeviceRef:
    return t.device if isinstance(t, TensorType) else None


class Mover:
    """Sends values between devices once each: ``at(v, device)`` is ``v`` on ``device``."""

    def __init__(self, builder: FunctionBuilder) -> None:
        self.b = builder
        self._copies: dict[tuple[Value, DeviceRef], Value] = {}

    def at(self, v: Value, device: DeviceRef) -> Value:
        if isinstance(v.type, TupleType) or device_of(v.type) == device or device is None:
            return v
        key = (v, device)
        if key not in self._copies:
            self._copies[key] = self.b.call(
                "Send", v, to_device=device, name=f"{v.name}_at{device}"
            )
        return self._copies[key]
