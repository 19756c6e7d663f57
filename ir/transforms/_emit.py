"""Emission of an SPMD plan (``_spmd.Plan``) as a program: a steady-state step by default.

Steady state (``inputs="resident"``, DESIGN.md "steady-state steps"): each input
is the per-device tuple of its planned state (``S(k)`` shards, ``R`` replicas),
runs of per-device ops become ``Pmap``s, collectives sit between them on
per-device tuples, and the outputs stay where they are: split (``S``) and
replicated (``R``) ones as per-device tuples, partial sums (``P``, a loss)
reduced onto the output device. An updated parameter or optimizer state comes
back in its input's layout, so that the next step can take it. Layouts are
recorded on the step (``ir.layout``).

``inputs="distribute"`` is the seeds' form: the step takes the whole inputs
where the source has them, scatters or broadcasts them, and gathers split
outputs. Devices whose shards have equal shapes share one pmap; uneven splits
give one pmap per shape group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..builder import FunctionBuilder, rebuild_op
from ..errors import DistIRError
from ..function import Function
from ..layout import with_layouts
from ..ops.communication import split_sizes
from ..types import DeviceRef, TensorType, TupleType, Type
from ..value import Value
from ._rewrite import TransformError, device_of, is_optimizer, sub_tuple
from ._spmd import LocalProgram, P, Plan, R, Shard
from .step_parts import gradient_ops


def _collective(
    b: FunctionBuilder, xs: Value, src: Shard, dst: Shard, devices: tuple, name: str
) -> Value:
    if dst == R and src.kind == "S":
        return b.call("AllGather", xs, dim=src.dim, name=name)
    if dst == R and src.kind in ("P", "M"):
        return b.call("AllReduce", xs, op="sum" if src == P else "max", name=name)
    if dst.kind == "S" and src == P:
        return b.call("ReduceScatter", xs, dim=dst.dim, op="sum", name=name)
    if dst.kind == "S" and src.kind == "S":
        shapes = {e.shape for e in xs.type.elements}
        (shape,) = shapes if len(shapes) == 1 else ((),)
        if shape and shape[dst.dim] % len(devices) == 0:
            return b.call("AllToAll", xs, split_dim=dst.dim, concat_dim=src.dim, name=name)
        whole = b.call("Gather", xs, dim=src.dim, to_device=devices[0], name=f"{name}_whole")
        return b.call("Scatter", whole, dim=dst.dim, devices=list(devices), name=name)
    if dst.kind == "S" and src == R:
        first = b.call("TupleGet", xs, index=0, name=f"{name}_0")
        return b.call("Scatter", first, dim=dst.dim, devices=list(devices), name=name)
    raise TransformError(f"no collective turns {src} into {dst}")


INPUT_MODES = ("resident", "distribute")


def resident_type(t: Type, state: Shard, devices: Sequence[DeviceRef]) -> TupleType:
    """The per-device tuple that holds a value of type ``t`` in ``state`` on ``devices``."""
    if not isinstance(t, TensorType):
        raise TransformError(f"cannot lay a {t} out over devices (tensors only)")
    if state.kind != "S":
        return TupleType(tuple(t.with_device(d) for d in devices))
    shape, n = list(t.shape), len(devices)
    pieces = []
    for d, size in zip(devices, split_sizes(shape[state.dim], n)):
        shape[state.dim] = size
        pieces.append(TensorType(tuple(shape), t.dtype, d))
    return TupleType(tuple(pieces))


def carried_inputs(f: Function) -> dict[Value, Value]:
    """Outputs of ``f`` that are the next step's value of an input: input, or an optimizer
    op's new parameter (result 0, operand 0) or new state (result 1 + i, operand 2 + i)."""
    inputs = set(f.inputs)
    out: dict[Value, Value] = {v: v for v in f.outputs if v in inputs}
    for op in f.ops:
        if not is_optimizer(op):
            continue
        sources = [op.inputs[0], *op.inputs[2:]]
        for result, source in zip(op.outputs, sources):
            if source in inputs and result in f.outputs:
                out[result] = source
    return out


def emit(
    plan: Plan,
    devices: Sequence[DeviceRef],
    *,
    inputs: str = "resident",
    replicated: str = "tuple",
    output_device: DeviceRef | str = "same",
    device_map: dict | None = None,
    name: str | None = None,
    inner: Callable[[Function, list[Shard]], Function] | None = None,
) -> Function:
    """The plan as a program with the source's input names (see the module docstring).

    ``inputs``: ``"resident"`` (a steady-state step) or ``"distribute"`` (whole
    inputs, scattered and broadcast by the step). ``replicated``: ``"tuple"``
    returns an ``R`` output as its per-device tuple, ``"send"`` sends the first
    copy to the output device. ``output_device``: where gathered and reduced
    outputs go (``"same"``: the source output's device).
    ``inner`` rewrites each pmap body (recursive composition) given the states of
    its inputs.
    """
    if not isinstance(inputs, str) or inputs not in INPUT_MODES:
        raise TransformError(f"inputs must be one of {INPUT_MODES}, got {inputs!r}")
    resident = inputs == "resident"
    f = plan.f
    devices = tuple(devices)
    b = FunctionBuilder(name or f.name)
    outer: dict[Value, Value] = {}
    for v in f.inputs:
        t = resident_type(v.type, plan.state[v], devices) if resident else v.type
        outer[v] = b.input(v.name, t)
    for v in f.inputs:
        s = plan.state[v]
        if resident or (not any(v in st.keys for st in plan.steps) and v not in f.outputs):
            continue
        if s.kind == "S":
            outer[v] = b.call(
                "Scatter", outer[v], dim=s.dim, devices=list(devices), name=f"{v.name}s"
            )
        else:
            outer[v] = b.call("Broadcast", outer[v], devices=list(devices), name=f"{v.name}s")
    groups = plan.groups()
    locals_ = [plan.local] + [LocalProgram(plan, g[0]) for g in groups[1:]]
    for loc in locals_[1:]:
        for i, step in enumerate(plan.steps):
            loc.apply(i, step)
    order = schedule(plan)
    needed_later = _needed_later(plan, order)
    pos = 0
    while pos < len(order):
        step = plan.steps[order[pos]]
        if step.op is None:
            src, dst = step.keys
            outer[dst] = _collective(b, outer[src], step.src, step.dst, devices, f"{dst.name}s")
            pos += 1
            continue
        end = pos
        while end < len(order) and plan.steps[order[end]].op is not None:
            end += 1
        _emit_segment(
            b,
            plan,
            order[pos:end],
            groups,
            locals_,
            outer,
            needed_later[end],
            devices,
            device_map,
            inner,
        )
        pos = end
    outs, out_layouts = [], []
    carried = carried_inputs(f) if resident else {}
    made_by_backward = gradient_ops(f) if resident else set()
    gradients = {v for op in made_by_backward for v in op.outputs}
    for v in f.outputs:
        key, s = plan.current[v], plan.state[plan.current[v]]
        if s.kind != "R" and (key, R) in plan.converted:  # already whole on every device
            key, s = plan.converted[(key, R)], R
        value = outer[key]
        if v in carried and s != plan.state[carried[v]]:  # back in its input's layout
            want = plan.state[carried[v]]
            key = plan.converted.get((plan.current[v], want))
            if key is None:
                src = plan.state[plan.current[v]]
                value = _collective(b, outer[plan.current[v]], src, want, devices, f"{v.name}s")
            else:
                value = outer[key]
            s = want
        where = device_of(v.type) if output_device == "same" else output_device
        layout: tuple[str, ...] | None = None
        if s.kind == "S" and resident:
            layout = (str(s),)
        elif s.kind == "S":
            value = b.call("Gather", value, dim=s.dim, to_device=where, name=v.name)
        elif s == P and resident and v in gradients:  # DDP: every replica holds the sum
            value = _collective(b, value, P, R, devices, f"{v.name}s")
            layout = ("R",)
        elif s == P:
            value = b.call("Reduce", value, op="sum", to_device=where, name=v.name)
        elif replicated == "send":
            value = b.call("TupleGet", value, index=0, name=f"{v.name}_0")
            if device_of(value.type) != where:
                value = b.call("Send", value, to_device=where, name=v.name)
        else:
            layout = ("R",)
        outs.append(value)
        out_layouts.append(layout)
    step = b.finish(outs)
    in_layouts = {v.name: (str(plan.state[v]),) for v in f.inputs} if resident else None
    return with_layouts(step, inputs=in_layouts, outputs=out_layouts)


def _run_inner(inner: Callable, body: Function, states: list[Shard]) -> Function:
    """``inner(body, states)``, its failure or a result that is no Function a TransformError."""
    try:
        out = inner(body, states)
    except DistIRError:
        raise
    except Exception as e:  # the caller's callback: say whose code failed
        raise TransformError(
            f"inner (the rewrite of each pmap body) failed on {body.name}: {type(e).__name__}: {e}"
        ) from e
    if not isinstance(out, Function):
        raise TransformError(
            f"inner must return an ir.Function (the rewritten body), got {type(out).__name__}"
        )
    return out


def schedule(plan: Plan) -> list[int]:
    """Step indices in emission order: per-device ops as early as they are ready, collectives
    only when no op can run (so that they batch up between pmaps, as in the seeds)."""
    producer: dict[Value, int] = {}
    for i, step in enumerate(plan.steps):
        for v in step.keys[1:] if step.op is None else step.op.outputs:
            producer[v] = i
    deps = [
        {producer[k] for k in (st.keys[:1] if st.op is None else st.keys) if k in producer}
        for st in plan.steps
    ]
    done: set[int] = set()
    order: list[int] = []
    pending = list(range(len(plan.steps)))
    while pending:
        ready = [i for i in pending if deps[i] <= done]
        ops = [i for i in ready if plan.steps[i].op is not None]
        chosen = ops[:1] if ops else ready
        for i in chosen:
            order.append(i)
            done.add(i)
            pending.remove(i)
    return order


def _needed_later(plan: Plan, order: list[int]) -> list[set[Value]]:
    """For each position p in ``order``, the keys that the steps from p on and the outputs read."""
    need = {plan.current[v] for v in plan.f.outputs}
    result: list[set[Value]] = [set() for _ in range(len(order) + 1)]
    result[len(order)] = set(need)
    for p in range(len(order) - 1, -1, -1):
        step = plan.steps[order[p]]
        need |= set(step.keys[:1] if step.op is None else step.keys)
        result[p] = set(need)
    return result


def _emit_segment(
    b: FunctionBuilder,
    plan: Plan,
    indices: list[int],
    groups: list[list[int]],
    locals_: list[LocalProgram],
    outer: dict[Value, Value],
    needed: set[Value],
    devices: tuple,
    device_map: dict | None,
    inner: Callable[[Function, list[Shard]], Function] | None,
) -> None:
    defined: set[Value] = set()
    inputs: list[Value] = []
    for i in indices:
        step = plan.steps[i]
        for k in step.keys:
            if k not in defined and k not in inputs:
                inputs.append(k)
        defined.update(step.op.outputs)
    results = [v for i in indices for v in plan.steps[i].op.outputs if v in needed]
    if not results:
        return
    per_group: list[tuple[Value, ...]] = []
    signatures = {tuple(loc.env[k].type for k in inputs) for loc in locals_}
    if len(signatures) == 1:  # no input is split unevenly: one pmap serves every device
        groups, locals_ = [list(range(plan.n))], locals_[:1]
    for g, loc in zip(groups, locals_):
        body_b = FunctionBuilder(f"{plan.f.name}_body")
        env = {loc.env[k]: body_b.input(k.name, loc.env[k].type) for k in inputs}
        for i in indices:
            op = loc.step_ops[i]
            for x, y in zip(op.outputs, rebuild_op(body_b, op, [env[x] for x in op.inputs])):
                env[x] = y
        body = body_b.finish([env[loc.env[v]] for v in results])
        if inner is not None:
            body = _run_inner(inner, body, [plan.state[k] for k in inputs])
        operands = [sub_tuple(b, outer[k], g, f"{k.name}_g{g[0]}") for k in inputs]
        attrs = {"device_var": plan.var}
        if device_map is not None:
            attrs["device_map"] = device_map
        op = b.add_op(
            "Pmap", operands, attrs, names=[f"{v.name}s" for v in results], subfunctions=[body]
        )
        per_group.append(op.outputs)
    for r, v in enumerate(results):
        if len(groups) == 1:
            outer[v] = per_group[0][r]
            continue
        items: list[Value | None] = [None] * plan.n
        for g, outs in zip(groups, per_group):
            for pos, dev_index in enumerate(g):
                items[dev_index] = b.call(
                    "TupleGet", outs[r], index=pos, name=f"{v.name}_{dev_index}"
                )
        outer[v] = b.call("MakeTuple", *items, name=f"{v.name}s")
