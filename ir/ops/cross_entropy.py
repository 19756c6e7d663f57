"""The cross-entropy in parts, the form that splits over the classes (Megatron-LM's
parallel cross-entropy, Shoeybi et al. 2019, section 3; the vocabulary-parallel forms are
introduced in ``ir/ops/vocabulary.py``).

``m = ClassMax(y)``, ``s = ClassSumExp(y, m)``, ``t = ClassPick(y, z, classes)``,
``l = CrossEntropyLoss(m, s, t)`` is ``sum(m + log s - t) / denominator``, and
``CrossEntropyGrad(y, z, classes, m, s)`` is ``scale * (exp(y - m) / s - onehot(z)) /
denominator`` (``classes``: the vocabulary ids of y's last axis, an ``Arange``). Split
over the classes, ``m`` is all-reduced with ``max``, ``s`` and ``t`` with ``sum``: the
whole logits never meet on one device. ``Loss`` and ``LossGrad`` (cross-entropy) offer
this form in their records' ``extra["vocabulary_form"]``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import TensorType
from . import _factors as fx
from ._common import memory_cost, same_dtype, tensor
from ._examples import ctx, t
from .vocabulary import I64, _int_operand, _match, _onehot

# -- the cross-entropy from its parts --------------------------------------------------


def _logits(c: TypeContext, i: int = 0) -> TensorType:
    y = tensor(c, i, "logits y")
    if not y.dtype.is_float or y.rank < 1 or y.shape[-1] == 0:
        raise TypeRuleError(
            f"logits y must be floating-point with at least one class on the last axis, got {y}"
        )
    return y


def _row_stat(c: TypeContext, i: int, what: str, y: TensorType) -> TensorType:
    x = tensor(c, i, what)
    if x.shape != y.shape[:-1]:
        raise TypeRuleError(f"{what} has shape {x.shape}, logits {y.shape} need {y.shape[:-1]}")
    same_dtype(x, y)
    return x


def _labels_and_classes(c: TypeContext, y: TensorType, i: int) -> None:
    z = tensor(c, i, "labels z")
    if z.shape != y.shape[:-1]:
        raise TypeRuleError(f"labels z have shape {z.shape}, logits {y.shape} need {y.shape[:-1]}")
    classes = _int_operand(c, i + 1, "classes", rank=1)
    if classes.shape[0] != y.shape[-1]:
        raise TypeRuleError(f"classes has {classes.shape[0]} ids for {y.shape[-1]} logits a row")


def _class_max_types(c: TypeContext):
    y = _logits(c)
    return [y.with_shape(y.shape[:-1])]


def _class_sum_exp_types(c: TypeContext):
    y = _logits(c)
    _row_stat(c, 1, "m", y)
    return [y.with_shape(y.shape[:-1])]


def _class_pick_types(c: TypeContext):
    y = _logits(c)
    _labels_and_classes(c, y, 1)
    return [y.with_shape(y.shape[:-1])]


def _class_pick(xs, a):
    y, z, classes = xs
    hit = _match(z, classes)
    if hit is None:
        return [np.sum(y * _onehot(z, classes, y.dtype), axis=-1).astype(y.dtype)]
    pos, found = hit
    picked = np.take_along_axis(y, pos[..., None], axis=-1)[..., 0]
    return [np.where(found, picked, 0).astype(y.dtype)]


def _denominator(a, rows: int) -> float:
    return float(a["denominator"]) if a["denominator"] > 0 else float(max(rows, 1))


def _ce_loss_types(c: TypeContext):
    m = tensor(c, 0, "m")
    if not m.dtype.is_float:
        raise TypeRuleError(f"m must be floating-point, got {m.dtype.value}")
    for i, name in ((1, "s"), (2, "t")):
        x = tensor(c, i, name)
        if x.shape != m.shape:
            raise TypeRuleError(f"{name} has shape {x.shape}, m has {m.shape}")
        same_dtype(x, m)
    return [m.with_shape(())]


def _ce_loss(xs, a):
    m, s, target = xs
    total = np.sum(m + np.log(s) - target)
    return [np.asarray(total / _denominator(a, m.size), dtype=m.dtype)]


def _ce_grad_types(c: TypeContext):
    y = _logits(c)
    _labels_and_classes(c, y, 1)
    _row_stat(c, 3, "m", y)
    _row_stat(c, 4, "s", y)
    return [y]


def _ce_grad(xs, a):
    y, z, classes, m, s = xs
    factor = a["scale"] / _denominator(a, math.prod(y.shape[:-1]))
    dy = np.exp(y - m[..., None]) / s[..., None]
    hit = _match(z, classes)
    if hit is None:
        dy = dy - _onehot(z, classes, y.dtype)
    else:
        pos, found = hit
        onehot = np.zeros_like(dy)
        np.put_along_axis(onehot, pos[..., None], found[..., None].astype(y.dtype), axis=-1)
        dy = dy - onehot
    return [(dy * factor).astype(y.dtype)]


def _per_logit(flops: int):
    def rule(c: CostContext) -> Cost:
        return memory_cost(c, flops * c.input_types[0].num_elements)

    return rule


def _pick_cost(c: CostContext) -> Cost:
    (out,) = c.output_types
    read = c.input_types[1].size_bytes + c.input_types[2].size_bytes + out.size_bytes
    return Cost(0.0, read, out.size_bytes)


_DENOMINATOR = Attr(
    "denominator",
    0,
    "divide the sum by this when > 0, else by the local number of rows",
    kind=kinds.NONNEG_REAL,
)
_CLASS_RANGES = {
    "value_ranges": lambda op: {
        1: (0, op.inputs[0].type.shape[-1]),
        2: (0, op.inputs[0].type.shape[-1]),
    }
}


def _logit_examples(extra_operands):
    def examples(s: int):
        return [
            ctx(t(2 * s, 6), *extra_operands((2 * s,), 6)),
            ctx(t(2, s, 4), *extra_operands((2, s), 4)),
        ]

    return examples


def _labelled(lead, classes):
    return [t(*lead, dtype=I64), t(classes, dtype=I64)]


register_op(
    OpDef(
        name="ClassMax",
        operands=("y",),
        results=("m",),
        type_rule=_class_max_types,
        kernel=lambda xs, a: [np.max(xs[0], axis=-1)],
        cost_rule=_per_logit(1),
        doc="The largest logit of each row (over the last axis); split over the classes, "
        "each device's maximum is a partial maximum.",
        extra={"examples": _logit_examples(lambda lead, n: [])},
    )
)

register_op(
    OpDef(
        name="ClassSumExp",
        operands=("y", "m"),
        results=("s",),
        type_rule=_class_sum_exp_types,
        kernel=lambda xs, a: [
            np.sum(np.exp(xs[0] - xs[1][..., None]), axis=-1).astype(xs[0].dtype)
        ],
        cost_rule=_per_logit(3),
        doc="sum(exp(y - m)) over each row's classes (m: the row's largest logit).",
        extra={"examples": _logit_examples(lambda lead, n: [t(*lead)])},
    )
)

register_op(
    OpDef(
        name="ClassPick",
        operands=("y", "z", "classes"),
        results=("t",),
        type_rule=_class_pick_types,
        kernel=_class_pick,
        cost_rule=_pick_cost,
        doc="Each row's logit of its label: y[..., j] where classes[j] == z[...], zero where "
        "no class of y has that id (the label's logit is on another shard).",
        extra={
            "index_operands": (2,),
            "nondiff_operands": (1, 2),
            **_CLASS_RANGES,
            "examples": _logit_examples(_labelled),
        },
    )
)

register_op(
    OpDef(
        name="CrossEntropyLoss",
        operands=("m", "s", "t"),
        results=("l",),
        type_rule=_ce_loss_types,
        kernel=_ce_loss,
        cost_rule=_per_logit(3),
        attributes=(_DENOMINATOR,),
        doc="Mean softmax cross-entropy from its parts: sum(m + log(s) - t) / denominator "
        "(m, s: each row's largest logit and sum(exp(y - m)); t: its label's logit).",
        extra={
            "loss": True,
            "value_ranges": lambda op: {1: (1, None)},  # s >= 1: the largest term is exp(0)
            "examples": lambda s: [
                ctx(t(2 * s), t(2 * s), t(2 * s)),
                ctx(t(2, s), t(2, s), t(2, s), denominator=8),
            ],
        },
    )
)

register_op(
    OpDef(
        name="CrossEntropyGrad",
        operands=("y", "z", "classes", "m", "s"),
        results=("dy",),
        type_rule=_ce_grad_types,
        kernel=_ce_grad,
        cost_rule=_per_logit(4),
        attributes=(
            Attr("scale", 1.0, "the upstream gradient dl (a constant)", kind=kinds.FINITE),
            _DENOMINATOR,
        ),
        doc="scale * (exp(y - m) / s - onehot(z)) / denominator: LossGrad of the "
        "cross-entropy from the row statistics m and s (classes: the ids of y's last axis).",
        extra={
            "backward_seed": True,
            "index_operands": (2,),
            "nondiff_operands": (1, 2),
            "value_ranges": lambda op: {
                1: (0, op.inputs[0].type.shape[-1]),
                2: (0, op.inputs[0].type.shape[-1]),
                4: (1, None),
            },
            "examples": _logit_examples(lambda lead, n: [*_labelled(lead, n), t(*lead), t(*lead)]),
        },
    )
)


# -- sharding rules --------------------------------------------------------------------
# The class factor "c" of the logits' last axis names the classes operand's axis too.


def _global_denominator(rows: int):
    def local(attrs, ins, outs):
        return {**dict(attrs), "denominator": attrs["denominator"] or max(rows, 1)}

    return local


def _lead(c: TypeContext) -> tuple[str, ...]:
    return fx.axes(c.input_types[0].rank - 1)


def _class_max_sharding(c: TypeContext) -> dict:
    lead = _lead(c)
    return fx.rule([(*lead, "c")], [lead], reduce={"c": "max"}, linear=[(0,)], partial_ops=("max",))


def _class_sum_exp_sharding(c: TypeContext) -> dict:
    lead = _lead(c)
    return fx.rule([(*lead, "c"), lead], [lead], reduce={"c": "sum"})


def _class_pick_sharding(c: TypeContext) -> dict:
    lead = _lead(c)
    return fx.rule([(*lead, "c"), lead, ("c",)], [lead], reduce={"c": "sum"}, linear=[(0,)])


def _ce_loss_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[0].rank)
    rows = math.prod(c.input_types[0].shape)
    return fx.rule(
        [lead, lead, lead],
        [()],
        reduce=dict.fromkeys(lead, "sum"),
        local_attributes=_global_denominator(rows),
    )


def _ce_grad_sharding(c: TypeContext) -> dict:
    lead = _lead(c)
    rows = math.prod(c.input_types[0].shape[:-1])
    y = (*lead, "c")
    return fx.rule([y, lead, ("c",), lead, lead], [y], local_attributes=_global_denominator(rows))


fx.attach("ClassMax", _class_max_sharding)
fx.attach("ClassSumExp", _class_sum_exp_sharding)
fx.attach("ClassPick", _class_pick_sharding)
fx.attach("CrossEntropyLoss", _ce_loss_sharding)
fx.attach("CrossEntropyGrad", _ce_grad_sharding)
