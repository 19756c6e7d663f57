"""Losses: softmax cross-entropy and mean squared error, and their gradient.

``Loss(y, z)`` returns a scalar on y's device. ``cross_entropy``: ``y`` holds
logits ``(..., C)`` and ``z`` class indices with y's leading shape (any dtype;
float labels are cast to int). ``mse``: ``z`` has y's shape and the loss is the
sum of squared differences. Both divide by ``denominator`` when it is positive,
else by the number of rows of the local ``y`` (the product of all dims but the
last; for a rank-1 ``y`` under ``mse`` every element is a row). Data
parallelism sets ``denominator`` to the global batch size, so that the
per-device losses and gradients sum to the global ones.

``LossGrad(y, z, scale)`` is ``scale * dLoss/dy``; the seeds write
``LossGrad(y, z, 1)``, so ``scale`` is the first attribute.
"""

from __future__ import annotations

import math

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import DType
from . import _factors as fx
from ._common import checked_indices, same_dtype, tensor
from ._examples import ctx, t

KINDS = ("cross_entropy", "mse")


def _check(c: TypeContext):
    y, z = tensor(c, 0, "y"), tensor(c, 1, "z")
    a = c.attributes
    if not y.dtype.is_float:
        raise TypeRuleError(f"y must hold floating-point values, got {y.dtype.value}")
    if a["kind"] not in KINDS:
        raise TypeRuleError(f"kind must be one of {', '.join(KINDS)}, got {a['kind']!r}")
    d = a["denominator"]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0:
        raise TypeRuleError(f"denominator must be a number >= 0, got {d!r}")
    if a["kind"] == "cross_entropy":
        if y.rank < 1:
            raise TypeRuleError(
                "cross_entropy needs logits of rank >= 1 (classes on the last axis)"
            )
        if z.shape != y.shape[:-1]:
            raise TypeRuleError(
                f"labels z have shape {z.shape}, but logits of shape {y.shape} need labels of "
                f"shape {y.shape[:-1]} (one class index per row)"
            )
    else:
        if z.shape != y.shape:
            raise TypeRuleError(f"mse targets z have shape {z.shape}, y has {y.shape}")
        same_dtype(y, z)
    return y, z


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1]) if len(shape) >= 2 else max(math.prod(shape), 1)


def _denominator(y: np.ndarray, a, kind: str) -> float:
    if a["denominator"] > 0:
        return float(a["denominator"])
    if kind == "cross_entropy":
        return float(max(math.prod(y.shape[:-1]), 1))
    return float(_rows(y.shape))


def _log_softmax(y: np.ndarray) -> np.ndarray:
    shifted = y - np.max(y, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _labels(op: str, z: np.ndarray, classes: int) -> np.ndarray:
    return checked_indices(op, "class labels z", z, classes)[..., None]


def _loss_kernel(xs, a):
    y, z = xs
    if a["kind"] == "cross_entropy":
        picked = np.take_along_axis(_log_softmax(y), _labels("Loss", z, y.shape[-1]), axis=-1)
        total = -np.sum(picked)
    else:
        total = np.sum((y - z) ** 2)
    return [np.asarray(total / _denominator(y, a, a["kind"]), dtype=y.dtype)]


def _loss_grad_kernel(xs, a):
    y, z = xs
    factor = a["scale"] / _denominator(y, a, a["kind"])
    if a["kind"] == "cross_entropy":
        dy = np.exp(_log_softmax(y))
        labels = _labels("LossGrad", z, y.shape[-1])
        np.put_along_axis(dy, labels, np.take_along_axis(dy, labels, -1) - 1.0, -1)
    else:
        dy = 2.0 * (y - z)
    return [(dy * factor).astype(y.dtype)]


def _loss_cost(c: CostContext) -> Cost:
    y, z = c.input_types[:2]
    flops_per_element = 5 if c.attributes["kind"] == "cross_entropy" else 3
    out = sum(x.size_bytes for x in c.output_types)
    return Cost(flops_per_element * y.num_elements, y.size_bytes + z.size_bytes, out)


_KIND = Attr(
    "kind", "cross_entropy", "cross_entropy (softmax of logits) or mse", kind=kinds.one_of(*KINDS)
)
_SCALE = Attr("scale", 1.0, "the upstream gradient dl (a constant)", kind=kinds.FINITE)
_DENOMINATOR = Attr(
    "denominator",
    0,
    "divide the sum by this when > 0, else by the local number of rows",
    kind=kinds.NONNEG_REAL,
)


def _label_range(op) -> dict[int, tuple[int, int]]:
    """Valid values of each operand, for ``ir.random_inputs``: class labels index y's last axis."""
    if op.attributes["kind"] != "cross_entropy":
        return {}
    return {1: (0, op.inputs[0].type.shape[-1])}


def _examples(grad: bool):
    def examples(s: int):
        extra = {"scale": 1.0} if grad else {}
        return [
            ctx(t(2 * s, 5), t(2 * s, dtype=DType.int64), **extra),
            ctx(t(2, s, 3), t(2, s), denominator=8, **extra),
            ctx(t(3 * s, 4), t(3 * s, 4), kind="mse", **extra),
        ]

    return examples


register_op(
    OpDef(
        name="Loss",
        operands=("y", "z"),
        results=("l",),
        type_rule=lambda c: [_check(c)[0].with_shape(())],
        kernel=_loss_kernel,
        cost_rule=_loss_cost,
        attributes=(_KIND, _DENOMINATOR),
        aliases=("N11Loss",),
        doc="Mean softmax cross-entropy of logits y against class indices z, or mean squared "
        "error against targets z; a scalar on y's device.",
        extra={
            "examples": _examples(grad=False),
            "value_ranges": _label_range,
            "loss": True,  # a training objective (recompute never replays it)
            "vocabulary_form": lambda *args: _vocabulary_form(*args),
            "vocabulary_classes": lambda op: op.inputs[0].type.shape[-1],
            "nondiff_operands": (1,),  # the labels carry no gradient, float or not
            "unit_gradient": lambda b, op, ins: _loss_unit_gradient(b, op, ins),
        },
    )
)

register_op(
    OpDef(
        name="LossGrad",
        operands=("y", "z"),
        results=("dy",),
        type_rule=lambda c: [_check(c)[0]],
        kernel=_loss_grad_kernel,
        cost_rule=_loss_cost,
        attributes=(
            Attr("scale", 1.0, "the upstream gradient dl (a constant)", kind=kinds.FINITE),
            _KIND,
            _DENOMINATOR,
        ),
        doc="scale * dLoss(y, z)/dy, with y's shape.",
        extra={
            "examples": _examples(grad=True),
            "value_ranges": _label_range,
            "backward_seed": True,  # the first one starts a training program's backward pass
            "vocabulary_form": lambda *args: _vocabulary_form(*args),
            "vocabulary_classes": lambda op: op.inputs[0].type.shape[-1],
            "nondiff_operands": (1,),
        },
    )
)


def _vocabulary_form(b, op, ins, stats: dict):
    """A cross-entropy ``Loss`` / ``LossGrad`` as its parts (``ir/ops/vocabulary.py``),
    which split over the classes; None for ``mse`` (kept as it is). ``stats`` holds each
    logits value's row statistics ``(m, s)``: the gradient reuses the loss's."""
    a = op.attributes
    if a["kind"] != "cross_entropy":
        return None
    y, z = ins
    name = op.outputs[0].name
    seed = "scale" in a  # LossGrad (its scale is the upstream gradient), else Loss
    found = stats.get(y)
    if found is None:
        m = b.call("ClassMax", y, name=f"{y.name}_max")
        s = b.call("ClassSumExp", y, m, name=f"{y.name}_sumexp")
        found = stats[y] = (m, s)
    m, s = found
    classes = b.call("Arange", n=y.type.shape[-1], device=y.type.device, name=f"{name}_classes")
    labels = z  # (float labels are class indices too: the parts' kernels read them as ids)
    if not seed:
        picked = b.call("ClassPick", y, labels, classes, name=f"{y.name}_label")
        return [b.call("CrossEntropyLoss", m, s, picked, denominator=a["denominator"], name=name)]
    return [
        b.call(
            "CrossEntropyGrad",
            y,
            labels,
            classes,
            m,
            s,
            scale=a["scale"],
            denominator=a["denominator"],
            name=name,
        )
    ]


# -- sharding rules ------------------------------------------------------------------
# Sharding the rows makes each device's loss a Partial sum: the local op divides
# by the global number of rows (the denominator attribute), never the local one.


def _loss_factors(c: TypeContext):
    y = c.input_types[0]
    if c.attributes["kind"] == "cross_entropy":
        lead = fx.axes(y.rank - 1)
        return lead, (*lead, None), lead
    names = fx.axes(y.rank)
    return names, names, names


def _global_denominator(c: TypeContext):
    y = c.input_types[0]
    d = c.attributes["denominator"] or (
        math.prod(y.shape[:-1]) if c.attributes["kind"] == "cross_entropy" else _rows(y.shape)
    )

    def local(attrs, ins, outs):
        return {**dict(attrs), "denominator": max(d, 1)}

    return local


def _loss_sharding(c: TypeContext) -> dict:
    names, y, z = _loss_factors(c)
    return fx.rule(
        [y, z],
        [()],
        reduce=dict.fromkeys(names, "sum"),
        local_attributes=_global_denominator(c),
    )


def _loss_grad_sharding(c: TypeContext) -> dict:
    _, y, z = _loss_factors(c)
    return fx.rule([y, z], [y], local_attributes=_global_denominator(c))


fx.attach("Loss", _loss_sharding)
fx.attach("LossGrad", _loss_grad_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# The labels z get no gradient. ir.transforms.autodiff seeds a loss output made by
# Loss with LossGrad(y, z, scale=1) directly (the seed's `dl`); elsewhere the upstream
# scalar gradient multiplies LossGrad's result.


def _loss_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dl,) = dys
    if dl is None:
        return [None, None]
    y, z = ins
    a = op.attributes
    dy = b.call(
        "LossGrad",
        y,
        z,
        scale=1.0,
        kind=a["kind"],
        denominator=a["denominator"],
        name=f"{gname(y)}_unit",
    )
    return [b.call("Mul", dy, dl, name=gname(y)), None]


def _loss_unit_gradient(b, op, ins):
    """The gradient of a loss output differentiated with gradient 1 (the seed's ``dl``)."""
    y, z = ins
    a = op.attributes
    dy = b.call("LossGrad", y, z, scale=1, kind=a["kind"], denominator=a["denominator"], name="dl")
    return [dy, None]


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule

    attach_rule("Loss", "gradient_rule", _loss_gradient)


_attach_gradient_rules()
