"""Helpers the parallelism transforms share: errors, parameters, op localisation, tuples.

``localize_op`` re-adds an op to a builder with new operands whose shapes or
devices differ from the original's (a shard, a microbatch, another device) and
fixes the attributes that spell shapes, sizes or devices, as the ops' records
say (``local_attributes`` of their sharding rules: ``Reshape``'s target shape,
the global ``denominator`` of ``Loss``/``LossGrad``, so that per-shard losses
and gradients sum to the global ones; a ``device`` attribute).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..arguments import callable_arg, function_arg, topology_arg
from ..attr_kinds import DEVICE
from ..builder import FunctionBuilder, rebuild_op
from ..errors import DistIRError, VerifyError
from ..function import Function
from ..limits import MAX_DEVICES
from ..op import Op
from ..registry import get_op
from ..sharding.rules import Rule, rule_for
from ..types import DeviceRef, TensorType, TupleType, Type, devices_of
from ..value import Value
from ..verify import describe_op


class TransformError(DistIRError):
    """A parallelism transform cannot apply to this program with these parameters."""


# -- parameters and batch inputs -------------------------------------------------------


def is_optimizer(op: Op) -> bool:
    """True for SGD, Adam and every op whose record says ``extra["optimizer"]``."""
    return bool(get_op(op.op_type).extra.get("optimizer", False))


def starts_backward(op: Op) -> bool:
    """``op`` seeds a backward pass (its record's ``extra["backward_seed"]``: ``LossGrad``)."""
    return bool(get_op(op.op_type).extra.get("backward_seed", False))


def parameter_inputs(f: Function) -> list[Value]:
    """The inputs that are weights (or optimizer state), in input order.

    A training program names them: operand 0 and the state operands of its
    optimizer ops. A forward program: the operands that the ops' records name as
    ``weight_operands`` (the right operand of a MatMul, the table of an Embedding, the
    scale and shift of a LayerNorm), and an input broadcast against a larger operand
    by a ``broadcasting`` op (a bias, a position embedding). Views of an input count as
    the input (imported programs transpose torch's ``(out, in)`` Linear weights first).
    """
    optimized = _optimized_inputs(f)
    return _weight_like(f) if optimized is None else optimized


def _optimized_inputs(f: Function) -> list[Value] | None:
    """The inputs that optimizer ops update or keep state in (every operand but the
    gradient, operand 1), in input order; None when ``f`` has no optimizer op."""
    optimizers = [op for op in f.ops if is_optimizer(op)]
    if not optimizers:
        return None
    inputs = set(f.inputs)
    found: set[Value] = set()
    for op in optimizers:
        found.update(v for i, v in enumerate(op.inputs) if i != 1 and v in inputs)
    return [v for v in f.inputs if v in found]


def _weight_like(f: Function) -> list[Value]:
    """The inputs read where weights are read (see :func:`parameter_inputs`), directly,
    through views, or through arithmetic on vectors of them and constants (an eval-mode
    batch norm's ``rsqrt(var + eps) * weight``, reshaped to a per-channel column)."""
    found: set[Value] = set()
    origin: dict[Value, frozenset[Value]] = {v: frozenset({v}) for v in f.inputs}
    for op in f.ops:
        if not op.inputs:  # a constant: adds no input
            origin.update(dict.fromkeys(op.outputs, frozenset()))
            continue
        if (is_view(op) and op.inputs[0] in origin) or (
            all(v in origin for v in op.inputs) and _vectors(op)
        ):
            origin.update(dict.fromkeys(op.outputs, frozenset().union(*map(origin.get, op.inputs))))
            continue
        weights = get_op(op.op_type).extra.get("weight_operands", ())
        for i, v in enumerate(op.inputs):
            if v in origin and (i in weights or _broadcast(op, v)):
                found |= origin[v]
    return [v for v in f.inputs if v in found]


def _vectors(op: Op) -> bool:
    """Every result of ``op`` is a tensor of rank 1 or less."""
    return all(isinstance(v.type, TensorType) and v.type.rank <= 1 for v in op.outputs)


def is_view(op: Op) -> bool:
    """``op`` only moves or retypes its operand's elements (its record's ``extra["view"]``:
    ``Transpose``, ``Reshape``, ``Cast``, ``Identity``)."""
    return bool(get_op(op.op_type).extra.get("view", False))


def _broadcast(op: Op, v: Value) -> bool:
    """``v`` is broadcast against a larger activation by an elementwise op (a bias, a table)."""
    if not get_op(op.op_type).extra.get("broadcasting") or not isinstance(v.type, TensorType):
        return False
    return v.type.rank < op.outputs[0].type.rank


def batch_inputs(f: Function, names: Sequence[str] | None = None) -> list[Value]:
    """The inputs split along dim 0 (the batch): those named, else the non-weights of rank >= 1
    that the program reads (an imported module's unused buffer is not a batch).

    Without names, the batch size is dim 0 of the first non-weight input whose dim 0 is
    not 1, and every non-weight input with that dim 0 is a batch input.
    """
    if names is not None:
        if isinstance(names, (str, bytes, Mapping)) or not isinstance(names, Sequence):
            raise TransformError(f"batch_inputs must be a list of input names, got {names!r}")
        by_name = {v.name: v for v in f.inputs}
        unknown = [n for n in names if not isinstance(n, str) or n not in by_name]
        if unknown:
            raise TransformError(
                f"{f.name} has no input(s) {unknown}; its inputs are {list(by_name)}"
            )
        return [by_name[n] for n in names]
    return list(f.derived("batch_inputs", _batch_inputs))


def _batch_inputs(f: Function) -> tuple[Value, ...]:
    """:func:`batch_inputs` of ``f`` without names (kept with ``f``: ``Function.derived``)."""
    # a training program's untrained buffers (rotary frequencies) are not batches either
    params = set(_optimized_inputs(f) or ()) | set(_weight_like(f))
    read = {v for op in f.ops for v in op.inputs} | set(f.outputs)
    data = [
        v
        for v in f.inputs
        if v not in params and v in read and isinstance(v.type, TensorType) and v.type.rank >= 1
    ]
    if not data:
        return ()
    batch = _batch_rows(f, data)
    return tuple(v for v in data if v.type.shape[0] == batch)


def _batch_rows(f: Function, data: Sequence[Value]) -> int:
    """The batch size among the leading sizes of ``data`` (non-weight inputs). Where they
    differ (an imported model's index buffers: Swin's relative positions), the rows of
    the labels a ``Loss`` reads, else of the first output that has one of the sizes;
    otherwise the first size that is not 1 (a leading 1 is broadcast, not a batch: a
    ViT's class token, expanded to the batch)."""
    sizes = [v.type.shape[0] for v in data]
    first = next((n for n in sizes if n > 1), sizes[0])
    if len(set(sizes) - {1}) < 2:
        return first
    labels = {  # a loss's labels: the operands its record says carry no gradient
        op.inputs[i]
        for op in f.ops
        if get_op(op.op_type).extra.get("loss") or starts_backward(op)
        for i in get_op(op.op_type).extra.get("nondiff_operands", ())
    }
    for op in reversed(f.ops):  # labels seen through views (reshaped, cast) are the labels
        if is_view(op) and op.outputs[0] in labels:
            labels.add(op.inputs[0])
    for v in data:
        if v in labels and v.type.shape[0] > 1:
            return v.type.shape[0]
    rows = [v.type.shape[0] for v in f.outputs if isinstance(v.type, TensorType) and v.type.rank]
    return next((n for n in rows if n > 1 and n in sizes), first)


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


def check_common(
    where: str, f: Any, topology: Any, name: str = "f", *, sequential: bool = True
) -> None:
    """The arguments every transform takes: ``f`` a Function, ``topology`` one or None
    (an :class:`ir.errors.ArgumentError` naming the transform and the parameter), and,
    unless ``sequential=False``, ``f`` a sequential program (:func:`check_sequential`)."""
    function_arg(where, name, f)
    topology_arg(where, "topology", topology)
    if sequential:
        check_sequential(where, f, name)


def check_sequential(where: str, f: Function, name: str = "f") -> None:
    """A TransformError unless ``f`` is sequential: no communication op, no pmap, every
    value on one device, every input a tensor (a tuple input is a per-device value). The
    parallel transforms rewrite a sequential program; given one that is already
    distributed they would read per-device tuples as tensors."""
    devices = f.devices
    found = next(
        (
            op
            for op in f.ops
            if op.op_type == "Pmap" or get_op(op.op_type).kind.name == "COMMUNICATION"
        ),
        None,
    )
    tupled = next((v for v in f.inputs if isinstance(v.type, TupleType)), None)
    if found is None and tupled is None and len(devices) <= 1:
        return
    if found is not None:
        made = ", ".join(repr(v.name) for v in found.outputs[:3])
        evidence = f"it has {found.op_type} ops (the first makes {made})"
    elif tupled is not None:
        evidence = f"its input {tupled.name!r} is a tuple of per-device parts ({tupled.type})"
    else:
        spread = next(
            v
            for v in (*f.inputs, *(v for op in f.ops for v in op.outputs))
            if any(d != devices[0] for d in devices_of(v.type) if isinstance(d, int))
        )
        evidence = (
            f"its values live on devices {list(devices)[:8]} ({spread.name!r}: {spread.type})"
        )
    raise TransformError(
        f"{where} rewrites a sequential program (every value on one device, no "
        f"communication), but {name} {f.name!r} is already distributed: {evidence}. Apply "
        f"{where} to the sequential program (composed strategies: ir.transforms.parallelize "
        "or nested)"
    )


def check_spmd_options(
    where: str,
    f: Any,
    topology: Any,
    *,
    inputs: Any,
    replicated: Any,
    output_device: Any,
    var: Any,
    device_map: Any,
    inner: Any,
) -> None:
    """The options of ``data_parallel`` and ``horizontal_parallel`` (see the former)."""
    check_common(where, f, topology)
    if not isinstance(inputs, str) or inputs not in ("resident", "distribute"):
        raise TransformError(
            f"{where}: inputs must be one of ('resident', 'distribute'), got {inputs!r}"
        )
    if not isinstance(replicated, str) or replicated not in ("tuple", "send"):
        raise TransformError(f"{where}: replicated must be 'tuple' or 'send', got {replicated!r}")
    if not (isinstance(output_device, str) and output_device == "same"):
        check_device(output_device, f"{where}: output_device ('same' or a device)")
    if not isinstance(var, str) or not var.isidentifier():
        raise TransformError(
            f"{where}: var must be a device variable name such as 'd', got {var!r}"
        )
    if device_map is not None and not isinstance(device_map, Mapping):
        raise TransformError(
            f"{where}: device_map must map devices to lists of sub-devices, got {device_map!r}"
        )
    callable_arg(where, "inner", inner)


def check_device(device: Any, what: str) -> None:
    """A TransformError naming ``what`` unless ``device`` is a device id or a device
    variable (``ir.attr_kinds.DEVICE``, unassigned excluded)."""
    if device is None or not DEVICE.accepts(device):
        raise TransformError(
            f"{what} must be a device id (an integer from 0 to {MAX_DEVICES - 1}) or a device "
            f"variable, got {device!r}"
        )


def check_devices(
    devices: Sequence[DeviceRef] | None, degree: int, topology: Any = None, what: str = "degree"
) -> tuple:
    """``devices`` as a tuple of ``degree`` distinct devices present in ``topology``; by
    default the topology's first ``degree`` devices, or ``0..degree-1`` without one."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise TransformError(f"the {what} must be a positive integer, got {degree!r}")
    if degree > MAX_DEVICES:
        raise TransformError(
            f"the {what} is {degree}, more than the limit of {MAX_DEVICES} devices "
            "(ir.limits.MAX_DEVICES)"
        )
    if devices is None and topology is not None:
        ids = tuple(topology.device_ids)
        if len(ids) < degree:
            raise TransformError(
                f"the {what} is {degree} but the topology has only {len(ids)} devices"
            )
        devices = ids[:degree]
    if devices is not None and (
        not isinstance(devices, Sequence) or isinstance(devices, (str, bytes))
    ):
        raise TransformError(f"devices must be a list of device ids, got {devices!r}")
    devices = tuple(range(degree) if devices is None else devices)
    for i, d in enumerate(devices):
        check_device(d, f"devices[{i}]")
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


def returned_inputs_copied(f: Function) -> Function:
    """``f`` with each output that is one of its inputs (returned unchanged) made by an
    ``Identity``, so that a step computes every output it returns."""
    inputs = set(f.inputs)
    if not any(v in inputs for v in f.outputs):
        return f
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in f.ops:
        env.update(zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])))
    outs = [
        b.call("Identity", env[v], name=f"{v.name}_out") if v in inputs else env[v]
        for v in f.outputs
    ]
    return b.finish(outs)


# -- localising ops ----------------------------------------------------------------------


def _shape(t: Type) -> tuple[int, ...]:
    if isinstance(t, TupleType):
        return _shape(t.elements[0]) if t.elements else ()
    return t.shape


def _local_results(op: Op, rule: Rule, inputs: Sequence[Value]) -> list[Type]:
    """``op``'s result types for the shards ``inputs``: an axis named by a factor shrinks
    in the proportion its operand axes did (factor notation, ``ir/ops/_factors.py``)."""
    ratio: dict[str, tuple[int, int]] = {}
    for v, loc, names in zip(op.inputs, inputs, rule.operands):
        for i, (g, n, name) in enumerate(zip(_shape(v.type), _shape(loc.type), names)):
            if g == n:
                continue
            if name is None:
                raise TransformError(
                    f"cannot fit {op.op_type} onto a shard of shape {_shape(loc.type)}: axis {i} "
                    f"of {v.name!r} (shape {_shape(v.type)}) must stay whole\n"
                    f"  in: {describe_op(op)}"
                )
            ratio[name] = (n, g)
    out: list[Type] = []
    for v, names in zip(op.outputs, rule.results):
        shape = list(_shape(v.type))
        for j, name in enumerate(names):
            if name in ratio:
                n, g = ratio[name]
                if (shape[j] * n) % g:
                    raise TransformError(
                        f"cannot fit {op.op_type} of {_shape(op.inputs[0].type)} to "
                        f"{_shape(v.type)} onto a shard of shape {_shape(inputs[0].type)}\n"
                        f"  in: {describe_op(op)}"
                    )
                shape[j] = shape[j] * n // g
        out.append(v.type.with_shape(tuple(shape)) if isinstance(v.type, TensorType) else v.type)
    return out


def local_attributes(
    op: Op, inputs: Sequence[Value], device: DeviceRef, results: Sequence[Type] | None = None
) -> dict[str, Any]:
    """``op``'s attributes fitted to new operands (shards, microbatches, other devices).

    Both facts come from ``op``'s record: an op with a ``device`` attribute (``Constant``)
    names the new device; an op whose sharding rule has ``local_attributes``
    (``Reshape``'s target shape, ``Loss``'s global denominator) gets them for the new
    shapes: its results' (``results``: given where they do not follow from the operands,
    a broadcast built for one shard of the batch).
    """
    attrs = dict(op.attributes)
    opdef = get_op(op.op_type)
    if any(a.name == "device" for a in opdef.attributes):
        attrs["device"] = device
    changed = any(_shape(v.type) != _shape(x.type) for v, x in zip(op.inputs, inputs))
    if results is not None:
        changed = changed or any(_shape(v.type) != _shape(t) for v, t in zip(op.outputs, results))
    if not changed or opdef.sharding_rule is None:
        return attrs
    rule = rule_for(op)
    if rule.local_attributes is None:
        return attrs
    local_results = list(results) if results is not None else _local_results(op, rule, inputs)
    return dict(rule.local_attributes(attrs, [x.type for x in inputs], local_results))


def localize_op(
    builder: FunctionBuilder,
    op: Op,
    inputs: Sequence[Value],
    device: DeviceRef = None,
    suffix: str = "",
    results: Sequence[Type] | None = None,
) -> tuple[Value, ...]:
    """Re-add ``op`` with ``inputs`` (shards, copies on other devices); return its results
    (of the types ``results`` where given: see :func:`local_attributes`)."""
    attrs = local_attributes(op, inputs, device, results)
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
