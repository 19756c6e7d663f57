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
from ..types import DeviceRef, TensorType
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
from ._spmd import S


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
    check_degree(what, degree, batch_size(f, inputs), "batch size")
    rule = partial(data_rule, n=degree)
    return _Plan(f, degree, {v: S(0) for v in inputs}, rule, var)


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


__all__ = ["data_parallel", "data_plan", "data_rule"]
