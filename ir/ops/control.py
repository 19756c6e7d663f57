"""Structural ops: pmap, tuple construction and access, constants.

``Pmap`` maps its body over devices (seeds 000 and 002). Its operands are
per-device tuples of one length N; the body takes one element of each, typed on
the device variable (``Tensor[(B/N, F), d]``), and its results become tuples
whose i-th element lives on the i-th device of the first operand. A
``device_map`` attribute resolves sub-devices ``d.k`` in nested pmaps.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..limits import MAX_PMAP_NESTING
from ..registry import Attr, OpDef, OpKind, TypeContext, register_op
from ..types import DeviceVar, DType, TensorType, TupleType, bind_type, bound_tuple
from . import _examples as ex
from . import _factors as fx
from ._common import memory_cost, no_cost, tuple_operand


def _pmap_types(ctx: TypeContext):
    if len(ctx.subfunctions) != 1:
        raise TypeRuleError(f"pmap needs exactly one body, got {len(ctx.subfunctions)}")
    (body,) = ctx.subfunctions
    if body.pmap_nesting + 1 > MAX_PMAP_NESTING:
        raise TypeRuleError(
            f"pmaps nest {body.pmap_nesting + 1} deep, more than the limit {MAX_PMAP_NESTING} "
            "(ir.limits.MAX_PMAP_NESTING)"
        )
    var = ctx.attributes["device_var"]
    device_map = _plain_map(ctx.attributes["device_map"])
    if len(body.inputs) != len(ctx.input_types):
        raise TypeRuleError(
            f"the body takes {len(body.inputs)} inputs but pmap maps over "
            f"{len(ctx.input_types)} tuples"
        )
    if not ctx.input_types:
        raise TypeRuleError("pmap needs at least one per-device tuple to map over")
    tuples = [tuple_operand(ctx, i, f"pmap operand {i}") for i in range(len(ctx.input_types))]
    n = len(tuples[0])
    devices = tuples[0].devices
    for i, t in enumerate(tuples):
        if len(t) != n:
            raise TypeRuleError(f"pmap operand {i} has {len(t)} elements, operand 0 has {n}")
        param = body.inputs[i].type
        plain = _binds_plainly(param, var, device_map)
        if plain and t == bound_tuple(param, var, devices):
            continue  # the tuple type a pmap of this body makes (TupleType's equality is
            # its kept hash, then its elements' fields at C level)
        if plain and all(
            e.__class__ is TensorType
            and e.shape == param.shape
            and e.dtype is param.dtype
            and e.device == d
            for e, d in zip(t.elements, devices)
        ):
            continue  # each element is the body's tensor input on its own device
        for k, elem in enumerate(t.elements):
            want = bind_type(param, var, devices[k], device_map)
            if elem != want:
                raise TypeRuleError(
                    f"element {k} of pmap operand {i} is {elem}, but the body's input "
                    f"{body.inputs[i].name!r} bound to device {devices[k]} is {want}"
                )
    if device_map is None:
        return [bound_tuple(out.type, var, devices) for out in body.outputs]
    return [
        TupleType(tuple(bind_type(out.type, var, d, device_map) for d in devices))
        for out in body.outputs
    ]


def _binds_plainly(param, var: str, device_map) -> bool:
    """``param`` is a tensor on the pmap's device variable itself: bound to device ``d`` it
    is the same tensor on ``d``."""
    device = param.device if param.__class__ is TensorType else None
    return isinstance(device, DeviceVar) and device.name == var and not device.sub


def _pmap_examples(s: int) -> list[TypeContext]:
    """Registry-walk examples: a MatMul body, and a two-result body on three devices."""
    from ..builder import FunctionBuilder  # the builder needs the registry loaded first

    d = DeviceVar("d")
    b = FunctionBuilder("body")
    x, w = b.input("x", ex.t(s, 3, device=d)), b.input("w", ex.t(3, 2 * s, device=d))
    matmul = b.finish([b.call("MatMul", x, w)])
    b = FunctionBuilder("body2")
    x = b.input("x", ex.t(2 * s, device=d))
    two = b.finish([b.call("Relu", x), b.call("Add", x, x)])
    return [
        TypeContext((ex.per_device(s, 3), ex.per_device(3, 2 * s)), {"device_var": "d"}, (matmul,)),
        TypeContext((ex.per_device(2 * s, devices=(1, 2, 3)),), {"device_var": "d"}, (two,)),
    ]


def _plain_map(m):
    if m is None:
        return None
    return {k: (_plain_map(v) if hasattr(v, "items") else list(v)) for k, v in m.items()}


register_op(
    OpDef(
        name="Pmap",
        operands=("data",),
        results=("results",),
        type_rule=_pmap_types,
        kernel=None,  # the executor runs the body once per device
        cost_rule=no_cost,
        attributes=(
            Attr(
                "device_var",
                "d",
                "name of the device variable the body is typed on",
                kind=kinds.NAME,
            ),
            Attr(
                "device_map",
                None,
                "device -> sub-devices, resolving d.k in nested pmaps",
                kind=kinds.DEVICE_MAP,
            ),
        ),
        variadic=True,
        kind=OpKind.CONTROL,
        doc="Map the body over devices; operands and results are per-device tuples.",
        extra={"variadic_results": True, "examples": _pmap_examples},
    )
)


def _task_types(ctx: TypeContext):
    if len(ctx.subfunctions) != 1:
        raise TypeRuleError(f"task needs exactly one body, got {len(ctx.subfunctions)}")
    (body,) = ctx.subfunctions
    if body.pmap_nesting > MAX_PMAP_NESTING:
        raise TypeRuleError(
            f"the task's body nests pmaps {body.pmap_nesting} deep, more than the limit "
            f"{MAX_PMAP_NESTING} (ir.limits.MAX_PMAP_NESTING)"
        )
    if len(body.inputs) != len(ctx.input_types):
        raise TypeRuleError(
            f"the body takes {len(body.inputs)} inputs but the task is given "
            f"{len(ctx.input_types)} operands"
        )
    for i, (t, param) in enumerate(zip(ctx.input_types, body.inputs)):
        if t is not param.type and t != param.type:
            raise TypeRuleError(
                f"task operand {i} is {t}, but the body's input {param.name!r} is {param.type}"
            )
    return [out.type for out in body.outputs]


def _task_examples(s: int) -> list[TypeContext]:
    """Registry-walk examples: a body on one device, and a body of a pmap and a collective
    on two."""
    from ..builder import FunctionBuilder

    b = FunctionBuilder("step")
    x, w = b.input("x", ex.t(s, 3)), b.input("w", ex.t(3, 2 * s))
    one = b.finish([b.call("Relu", b.call("MatMul", x, w))])
    d = DeviceVar("d")
    inner = FunctionBuilder("local")
    y = inner.input("y", ex.t(2 * s, device=d))
    local = inner.finish([inner.call("Relu", y)])
    b = FunctionBuilder("step2")
    ys = b.input("ys", ex.per_device(2 * s))
    (relus,) = b.add_op("Pmap", [ys], {"device_var": "d"}, subfunctions=[local]).outputs
    summed = b.call("AllReduce", relus)
    two = b.finish([summed, relus])
    return [
        TypeContext((ex.t(s, 3), ex.t(3, 2 * s)), {}, (one,)),
        TypeContext((ex.per_device(2 * s),), {}, (two,)),
    ]


register_op(
    OpDef(
        name="Task",
        operands=("args",),
        results=("results",),
        type_rule=_task_types,
        kernel=None,  # the executor runs the body
        cost_rule=no_cost,
        variadic=True,
        kind=OpKind.CONTROL,
        doc=(
            "Run the body (a program of pmaps, collectives and transfers on concrete "
            "devices) on the operands; its results are the body's. A pipeline stage's "
            "forward or backward of one microbatch, written once and run per microbatch."
        ),
        extra={"variadic_results": True, "examples": _task_examples},
    )
)


def _tuple_get_types(ctx: TypeContext):
    xs = tuple_operand(ctx, 0)
    i = ctx.attributes["index"]
    if not -len(xs) <= i < len(xs):
        raise TypeRuleError(f"index {i} is out of range for a tuple of {len(xs)}")
    return [xs.elements[i]]


register_op(
    OpDef(
        name="TupleGet",
        operands=("xs",),
        results=("x",),
        type_rule=_tuple_get_types,
        kernel=lambda xs, a: [xs[0][a["index"]]],
        cost_rule=no_cost,
        attributes=(Attr("index", doc="element index", kind=kinds.INT),),
        kind=OpKind.CONTROL,
        doc="Element i of a tuple; the text format also writes it xs[i].",
        extra={
            "examples": lambda s: [
                ex.ctx(ex.per_device(s, 3), index=1),
                ex.ctx(ex.per_device(s), index=0),
            ]
        },
    )
)

register_op(
    OpDef(
        name="MakeTuple",
        operands=("x",),
        results=("xs",),
        type_rule=lambda ctx: [TupleType(tuple(ctx.input_types))],
        kernel=lambda xs, a: [tuple(xs)],
        cost_rule=no_cost,
        variadic=True,
        kind=OpKind.CONTROL,
        doc="A tuple of its operands (one per device, usually).",
        extra={
            "examples": lambda s: [
                ex.ctx(ex.t(s, 3, device=1), ex.t(s, 3, device=2)),
                ex.ctx(ex.t(2 * s)),
            ]
        },
    )
)


def _constant_types(ctx: TypeContext):
    a = ctx.attributes
    dtype = a["dtype"] if isinstance(a["dtype"], DType) else DType(a["dtype"])
    return [TensorType(tuple(a["shape"]), dtype, a["device"])]


def _constant_kernel(xs, a):
    dtype = a["dtype"] if isinstance(a["dtype"], DType) else DType(a["dtype"])
    return [np.full(tuple(a["shape"]), a["value"], dtype=dtype.numpy)]


register_op(
    OpDef(
        name="Constant",
        operands=(),
        results=("c",),
        type_rule=_constant_types,
        kernel=_constant_kernel,
        cost_rule=memory_cost,
        attributes=(
            Attr("value", doc="the fill value", kind=kinds.either(kinds.REAL, kinds.BOOL)),
            Attr("shape", (), "result shape", kind=kinds.SHAPE),
            Attr("dtype", "float32", "element type name", kind=kinds.DTYPE),
            Attr("device", None, "device the constant lives on", kind=kinds.DEVICE),
        ),
        doc="A tensor filled with one value.",
        extra={
            "examples": lambda s: [
                ex.ctx(value=1.5, shape=(s, 3), device=0),
                ex.ctx(value=2, shape=(2 * s,), dtype="int64", device=1),
            ]
        },
    )
)


# -- sharding rules ------------------------------------------------------------------


def _constant_sharding(c: TypeContext) -> dict:
    return fx.rule([], [(None,) * len(tuple(c.attributes["shape"]))])


fx.attach("TupleGet", lambda c: fx.same_axes(c, partial_ops=fx.ALL_REDUCTIONS))
fx.attach("Constant", _constant_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# A tuple's gradient is a tuple: TupleGet sends dy back into its slot (zeros elsewhere),
# MakeTuple hands each element its slot. Pmap is differentiated by ir.transforms.autodiff,
# which differentiates its body. Constant has no operands.


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, zeros

    def tuple_get(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None]
        (xs,) = ins
        i = op.attributes["index"] % len(xs.type)
        items = [
            dy if k == i else zeros(b, e, f"{gname(xs)}_{k}")
            for k, e in enumerate(xs.type.elements)
        ]
        return [b.call("MakeTuple", *items, name=gname(xs))]

    def make_tuple(b, op, ins, outs, dys):
        (dxs,) = dys
        if dxs is None:
            return [None] * len(ins)
        return [b.call("TupleGet", dxs, index=i, name=gname(x)) for i, x in enumerate(ins)]

    attach_rule("TupleGet", "gradient_rule", tuple_get)
    attach_rule("MakeTuple", "gradient_rule", make_tuple)
    attach_rule("Constant", "gradient_rule", lambda b, op, ins, outs, dys: [])


_attach_gradient_rules()
