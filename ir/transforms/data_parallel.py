"""Data parallelism: split the batch over devices, replicate the weights (seed 000).

The result is a steady-state step (DESIGN.md): the batch inputs are per-device
shards (layout ``S(0)``), every other input a per-device replica (``R``); the
per-device part of the program runs in a ``Pmap``, weight gradients (operand 1
of the optimizer ops) are all-reduced, and the optimizer steps run in a second
``Pmap``. Each device's ``Loss``/``LossGrad`` divides by the *global* batch
(``denominator``), so the per-device gradients and losses sum to the
sequential ones; uneven splits work (one pmap per shard shape).

Outputs: batch-shaped ones (``y``) stay split, losses are reduced (sum) onto
the original output's device, and the updated weights and optimizer state are
returned as per-device replicas, the layout they came in (the next step's
inputs). ``inputs="distribute"`` gives the seeds' form instead: whole inputs on
their devices scattered and broadcast by the step, batch-shaped outputs gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..function import Function
from ..op import Op
from ..sharding.errors import PropagationError
from ..sharding.rules import rule_for
from ..types import DeviceRef, TensorType
from ..value import Value
from ..verify import verify
from ._emit import emit
from ._rewrite import (
    TransformError,
    batch_inputs,
    batch_size,
    check_degree,
    check_devices,
    check_spmd_options,
)
from ._rules import data_rule
from ._spmd import Plan as _Plan
from ._spmd import R, S, Shard


def data_plan(
    f: Function,
    degree: int,
    batch: Sequence[str] | None = None,
    var: str = "d",
    what: str = "data-parallel degree",
) -> _Plan:
    """The SPMD plan of data parallelism over ``degree`` devices (see ``data_parallel``)."""
    inputs = batch_inputs(f, batch)
    if not inputs:
        raise TransformError(
            f"{f.name} has no batch input to split (pass batch_inputs=[names of inputs])"
        )
    for v in inputs:
        if not isinstance(v.type, TensorType) or v.type.rank < 1:
            raise TransformError(f"batch input {v.name!r} must be a tensor of rank >= 1")
    rows = batch_size(f, inputs)
    check_degree(what, degree, rows, "batch size")
    rule = partial(data_rule, n=degree)
    states = {v: S(0) for v in inputs}
    plan = _Plan(f, degree, states, rule, var)
    born = batch_broadcasts(plan, rows)
    if not born:
        return plan
    again = _Plan(f, degree, states, rule, var, born=born)
    if len(sliced(again)) < len(sliced(plan)) and len(again.gathers) <= len(plan.gathers):
        return again
    return plan


def sliced(plan: _Plan) -> list[Value]:
    """The replicated values ``plan`` slices where they meet split ones (whole-batch
    values made from no batch input)."""
    return [st.keys[0] for st in plan.steps if st.op is None and st.src == R]


def batch_broadcasts(plan: _Plan, rows: int) -> dict[Op, Shard]:
    """The ops that broadcast a value made from no batch input to the batch (``rows``
    along axis 0: a ViT's class token expanded to the batch, RoBERTa's token type ids)
    where ``plan`` slices what they make: built split, each device (or microbatch)
    broadcasts to its own rows, as torch does when it runs a shard of the batch."""
    producer = plan.f.producers
    found: dict[Op, Shard] = {}
    seen: set[Op] = set()
    todo = sliced(plan)
    while todo:
        op = producer.get(todo.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        if _broadcasts_rows(op, rows):
            found[op] = S(0)
        else:
            todo.extend(op.inputs)
    return found


def _broadcasts_rows(op: Op, rows: int) -> bool:
    """``op``'s one result has ``rows`` along axis 0 that no operand axis gives it (its
    sharding rule names no factor there) and its record fits its attributes to a shard."""
    if len(op.outputs) != 1 or not isinstance(op.outputs[0].type, TensorType):
        return False
    out = op.outputs[0].type
    if not out.rank or out.shape[0] != rows or rows < 2:
        return False
    try:
        rule = rule_for(op)
    except PropagationError:
        return False
    return rule.results[0][0] is None and rule.local_attributes is not None


def data_parallel(
    f: Function,
    degree: int,
    devices: Sequence[DeviceRef] | None = None,
    *,
    batch_inputs: Sequence[str] | None = None,
    topology: Any = None,
    inputs: str = "resident",
    replicated: str = "tuple",
    output_device: DeviceRef | str = "same",
    var: str = "d",
    device_map: dict | None = None,
    inner: Callable[[Function, list], Function] | None = None,
) -> Function:
    """``f`` run data-parallel on ``degree`` devices (``devices``, default 0..degree-1).

    >>> import ir
    >>> from ir.transforms import data_parallel
    >>> b = ir.FunctionBuilder("mlp")
    >>> w = b.input("w", ir.TensorType((4, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> f = b.finish(b.call("MatMul", x, w, name="y"))
    >>> g = data_parallel(f, 2)
    >>> [op.op_type for op in g.ops], g.input_layouts
    (['Pmap'], (('R',), ('S(0)',)))
    >>> [op.op_type for op in data_parallel(f, 2, inputs="distribute").ops]
    ['Broadcast', 'Scatter', 'Pmap', 'Gather']

    ``inputs``: ``"resident"`` (default, a steady-state step whose layouts
    ``ir.distribute`` / ``ir.collect`` read) or ``"distribute"`` (see the module
    docstring). ``batch_inputs`` names the inputs to split (default: the inputs that are not
    weights and share the batch size). ``topology``: check the devices exist.
    ``replicated="send"`` sends the first copy of a replicated output to
    ``output_device`` instead of returning the tuple; ``var``, ``device_map`` and
    ``inner`` (a rewrite of each pmap body) serve the nested compositions.
    """
    check_spmd_options(
        "data_parallel",
        f,
        topology,
        inputs=inputs,
        replicated=replicated,
        output_device=output_device,
        var=var,
        device_map=device_map,
        inner=inner,
    )
    devices = check_devices(devices, degree, topology)
    plan = data_plan(f, degree, batch_inputs, var=var)
    out = emit(
        plan,
        devices,
        inputs=inputs,
        replicated=replicated,
        output_device=output_device,
        device_map=device_map,
        inner=inner,
    )
    return verify(out)


__all__ = ["batch_broadcasts", "data_parallel", "data_plan", "data_rule", "sliced"]
