"""pmap unrolling: every ``Pmap`` replaced by its body once per device (seed 000, "Lowering pmap").

Each device's copy reads its elements of the pmap's tuples (``TupleGet``), has
the device variable bound to that device (``d`` -> 1, ``d.k`` -> the device
map's k-th sub-device) in its types and in attributes such as ``to_device``
and ``devices``, and the results are put back into tuples (``MakeTuple``).
Nested pmaps unroll too. The result computes the same values with only
explicit per-device ops, the form the simulator and a per-rank backend want.

``device_programs`` is the inverse view for display: one op list per device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..arguments import function_arg
from ..builder import FunctionBuilder
from ..function import Function
from ..layout import layouts_of
from ..op import Op
from ..types import DeviceRef, DeviceVar, TupleType, bind_device, format_device
from ..value import Value
from ..verify import verify
from ._rewrite import TransformError

Binder = Callable[[DeviceRef], DeviceRef]


def unroll_pmap(f: Function) -> Function:
    """``f`` with every Pmap (nested ones too) replaced by explicit per-device ops.

    >>> import ir
    >>> from ir.transforms import data_parallel, unroll_pmap
    >>> b = ir.FunctionBuilder("f")
    >>> w = b.input("w", ir.TensorType((4, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> g = unroll_pmap(data_parallel(b.finish(b.call("MatMul", x, w, name="y")), 2))
    >>> sorted({op.op_type for op in g.ops}), g.input_layouts
    (['MakeTuple', 'MatMul', 'TupleGet'], (('R',), ('S(0)',)))

    Inputs and outputs keep their types, so a steady-state step keeps its layouts.
    """
    function_arg("unroll_pmap", "f", f)
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    _inline(b, f.ops, env, lambda ref: ref, "")
    return verify(layouts_of(b.finish([env[v] for v in f.outputs]), f))


def _inline(
    b: FunctionBuilder,
    ops,
    env: dict[Value, Value],
    bind: Binder,
    suffix: str,
    names: Mapping[Value, str] | None = None,
) -> None:
    """Copy ``ops``; a result is named ``names[v]`` (else its own name) plus ``suffix``."""
    names = names or {}
    for op in ops:
        ins = [env[v] for v in op.inputs]
        if op.op_type == "Pmap":
            results = _unroll(b, op, ins, suffix)
        elif op.op_type == "Task":  # its body in its place (its pmaps unrolled too)
            (body,) = op.subfunctions
            inner = dict(zip(body.inputs, ins))
            outer = {v: r.name for v, r in zip(body.outputs, op.outputs)}
            _inline(b, body.ops, inner, bind, suffix, outer)
            results = [inner[v] for v in body.outputs]
        else:
            new = b.add_op(
                op.op_type,
                ins,
                {k: _bind_attr(x, bind) for k, x in op.attributes.items()},
                names=[names.get(v, v.name) + suffix for v in op.outputs],
                subfunctions=op.subfunctions,
                op_name=op.name,
            )
            results = new.outputs
        env.update(zip(op.outputs, results))


def inline_tasks(f: Function) -> Function:
    """``f`` with every ``Task`` replaced by its body (a task's body may hold tasks; a
    pmap's body is copied as it is): the flat
    program, op for op, for the consumers that read top-level ops one by one (a per-rank
    backend, traffic counts). The values a body makes are named after the task's results
    where it returns them, else as in the body.

    >>> import ir
    >>> from ir.transforms import inline_tasks
    >>> body = ir.FunctionBuilder("twice")
    >>> x = body.input("x", ir.TensorType((2,), device=0))
    >>> body = body.finish([body.call("Add", x, x)])
    >>> b = ir.FunctionBuilder("f")
    >>> a = b.input("a", ir.TensorType((2,), device=0))
    >>> (y,) = b.add_op("Task", [a], subfunctions=[body], names=["y"]).outputs
    >>> print(inline_tasks(b.finish([y])))
    def f(a: Tensor[(2,), 0]):
        y: Tensor[(2,), 0] = Add(a, a)
        return y
    """
    from dataclasses import replace

    function_arg("inline_tasks", "f", f)
    if not any(op.op_type == "Task" for op in f.ops):
        return f
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    _flatten(b, f.ops, env, {})
    g = layouts_of(b.finish([env[v] for v in f.outputs]), f)
    return replace(g, rank_classes=f.rank_classes)


def _flatten(b: FunctionBuilder, ops, env: dict[Value, Value], names: Mapping[Value, str]) -> None:
    """Copy ``ops`` (each like itself: typed once), inlining tasks."""
    for op in ops:
        ins = [env[v] for v in op.inputs]
        if op.op_type == "Task":
            (body,) = op.subfunctions
            inner = dict(zip(body.inputs, ins))
            outer = {v: names.get(r, r.name) for v, r in zip(body.outputs, op.outputs)}
            _flatten(b, body.ops, inner, outer)
            results = [inner[v] for v in body.outputs]
        else:
            results = b.add_like(op, ins, [names.get(v, v.name) for v in op.outputs]).outputs
        env.update(zip(op.outputs, results))


def _unroll(b: FunctionBuilder, op: Op, ins: list[Value], suffix: str) -> list[Value]:
    (body,) = op.subfunctions
    var = op.attributes["device_var"]
    device_map = _plain(op.attributes.get("device_map"))
    if not isinstance(ins[0].type, TupleType):
        raise TransformError(f"pmap operand {ins[0].name!r} is not a per-device tuple")
    devices = ins[0].type.devices
    # a device's copy of a value the pmap takes or returns is named after the pmap's
    # operand or result (``x_1``, ``h_mb0_1``), whatever the body calls it
    outer_names = {v: r.name for v, r in zip(body.outputs, op.outputs)}
    per_device: list[list[Value]] = []
    for k, dev in enumerate(devices):
        tag = f"{suffix}_{format_device(dev).replace('.', '_')}"
        env: dict[Value, Value] = {}
        for param, xs in zip(body.inputs, ins):
            env[param] = b.call("TupleGet", xs, index=k, name=xs.name + tag)

        def bind(ref: DeviceRef, dev: DeviceRef = dev) -> DeviceRef:
            return bind_device(ref, var, dev, device_map)

        _inline(b, body.ops, env, bind, tag, outer_names)
        per_device.append([env[v] for v in body.outputs])
    return [
        b.call("MakeTuple", *(outs[j] for outs in per_device), name=result.name + suffix)
        for j, result in enumerate(op.outputs)
    ]


def _bind_attr(x: Any, bind: Binder) -> Any:
    if isinstance(x, DeviceVar):
        return bind(x)
    if isinstance(x, tuple):
        return tuple(_bind_attr(e, bind) for e in x)
    if isinstance(x, Mapping):
        return {k: _bind_attr(e, bind) for k, e in x.items()}
    return x


def _plain(m: Any) -> dict | None:
    if m is None:
        return None
    return {k: (_plain(v) if isinstance(v, Mapping) else list(v)) for k, v in m.items()}


def device_programs(f: Function) -> dict[str, list[str]]:
    """The unrolled program as one list of op descriptions per device (the MPMD view).

    Ops on one device go to that device's list; collectives and other ops that
    span devices are listed under ``"*"``.
    """
    from ..text import format_op

    function_arg("device_programs", "f", f)
    g = unroll_pmap(f)
    out: dict[str, list[str]] = {}
    for op in g.ops:
        if op.op_type in ("TupleGet", "MakeTuple"):
            continue
        key = "*" if op.device is None else format_device(op.device)
        out.setdefault(key, []).append(format_op(op).strip())
    return out


__all__ = ["device_programs", "inline_tasks", "unroll_pmap"]
