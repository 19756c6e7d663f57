"""``RingShift``: each member of each group (a ring) sends its element of a per-device tuple
to the member ``offset`` places on, cyclically: ring attention's step
(``ir.transforms._megatron_ring``), an asynchronous point-to-point transfer."""

from __future__ import annotations

from .. import attr_kinds as kinds
from ..collectives import Collective
from ..errors import TypeRuleError
from ..registry import Attr, CostContext, OpDef, OpKind, TypeContext, attach_rule, register_op
from ..types import TensorType, TupleType
from ._common import memory_cost
from ._examples import ctx, per_device
from .communication import element_groups


def _shift_types(c: TypeContext):
    (xs,) = c.input_types
    if (
        not isinstance(xs, TupleType)
        or not xs.elements
        or not all(isinstance(e, TensorType) for e in xs.elements)
    ):
        raise TypeRuleError(f"RingShift takes a tuple of per-device tensors, got {xs}")
    for g in element_groups(c.attributes.get("groups"), len(xs)):
        shapes = {xs.elements[i].shape for i in g}
        dtypes = {xs.elements[i].dtype for i in g}
        if len(shapes) > 1 or len(dtypes) > 1:
            raise TypeRuleError(f"the members of group {g} hold different types")
    return [xs]


def _shift(xs, a):
    parts = xs[0]
    out = list(parts)
    for g in element_groups(a.get("groups"), len(parts)):
        n = len(g)
        for i, member in enumerate(g):
            out[g[(i + a["offset"]) % n]] = parts[member]
    return [tuple(out)]


def _shift_comm(c: CostContext) -> Collective:
    (xs,) = c.input_types
    pairs = []
    for g in element_groups(c.attributes.get("groups"), len(xs)):
        n = len(g)
        for i, member in enumerate(g):
            to = g[(i + c.attributes["offset"]) % n]
            if to != member:
                pairs.append((xs.elements[member].device, xs.elements[to].device))
    size = max(e.size_bytes for e in xs.elements)
    if not pairs:
        return Collective("local", 0, tuple(e.device for e in xs.elements))
    return Collective(
        "send", size, pairs[0], pairs[0][1], groups=tuple(pairs) if len(pairs) > 1 else ()
    )


register_op(
    OpDef(
        name="RingShift",
        operands=("xs",),
        results=("ys",),
        type_rule=_shift_types,
        kernel=_shift,
        cost_rule=memory_cost,
        attributes=(
            Attr(
                "groups", None, "element positions of each ring; None: one ring", kind=kinds.GROUPS
            ),
            Attr("offset", 1, "how many members on each element goes", kind=kinds.INT),
        ),
        kind=OpKind.COMMUNICATION,
        doc="Each member of each group (ring) sends its element to the member offset places "
        "on, cyclically: element g[(i + offset) % n] of the result is element g[i].",
        extra={
            # ring attention's transfers run on their own streams with no host
            # synchronisation after them (Megatron-Core / Transformer Engine's context
            # parallelism: isend/irecv on a side stream), unlike a pipeline's
            # batch_isend_irecv: the simulator lets the host run ahead (ir.sim.engine)
            "async_p2p": True,
            "examples": lambda s: [
                ctx(per_device(2 * s, 3)),
                ctx(per_device(s, 2, devices=(0, 1, 2, 3)), groups=[[0, 2], [1, 3]], offset=-1),
            ],
        },
    )
)
attach_rule("RingShift", "comm_rule", _shift_comm)


def _shift_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None]
    a = op.attributes
    return [
        b.call("RingShift", dy, groups=a.get("groups"), offset=-a["offset"], name=gname(ins[0]))
    ]


attach_rule("RingShift", "gradient_rule", _shift_gradient)
