"""Neural-network layers: softmax, layer normalisation, scaling, the causal mask.

Gradients are ops of their own (``SoftmaxGrad``, ``LayerNormGrad``); ``Scale``
and ``CausalMask`` are linear, so their gradients are ``Scale(dy, factor)`` and
``CausalMask(dy, fill=0.0)``.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
from . import _factors as fx
from ._common import normalize_axis, per_output_element, same_dtype, tensor
from ._examples import ctx, t


def _float(x, what: str):
    if not x.dtype.is_float:
        raise TypeRuleError(f"{what} must have a floating-point dtype, got {x.dtype.value}")
    return x


def _same_shape(a, b, what_a: str, what_b: str) -> None:
    if a.shape != b.shape:
        raise TypeRuleError(f"{what_b} has shape {b.shape}, {what_a} has {a.shape}")
    same_dtype(a, b)


# -- Softmax -----------------------------------------------------------------------


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _above_diagonal(shape: tuple[int, ...]) -> np.ndarray:
    rows, cols = shape[-2:]
    return np.triu(np.ones((rows, cols), dtype=bool), k=1)


def _fused_softmax(x: np.ndarray, a) -> np.ndarray:
    z = x * a["scale"] if a["scale"] != 1 else x
    if a["causal"]:
        z = np.where(_above_diagonal(x.shape), np.asarray(-np.inf, dtype=x.dtype), z)
    return _softmax(z, a["axis"]).astype(x.dtype)


def _softmax_types(c: TypeContext):
    x = _float(tensor(c, 0, "x"), "x")
    axis = normalize_axis(c.attributes["axis"], x.rank)
    if c.attributes["causal"] and (x.rank < 2 or axis != x.rank - 1):
        raise TypeRuleError(
            f"a causal Softmax normalises the last axis of a rank >= 2 tensor (keys), got "
            f"axis {c.attributes['axis']} of shape {x.shape}"
        )
    return [x]


_SOFTMAX_ATTRS = (
    Attr("axis", -1, "axis the probabilities sum to one over", kind=kinds.INT),
    Attr("scale", 1.0, "x is multiplied by it first (attention's 1/sqrt(dh))", kind=kinds.FINITE),
    Attr("causal", False, "mask entries above the diagonal of the last two axes", kind=kinds.BOOL),
)

register_op(
    OpDef(
        name="Softmax",
        operands=("x",),
        results=("y",),
        type_rule=_softmax_types,
        kernel=lambda xs, a: [_fused_softmax(xs[0], a)],
        cost_rule=per_output_element(5),
        attributes=_SOFTMAX_ATTRS,
        doc="exp(z) / sum(exp(z)) along axis, z = scale * x with the entries above the "
        "diagonal masked out if causal (computed stably): Megatron-LM's fused "
        "scale-mask-softmax as one kernel.",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 5)),
                ctx(t(2, s, 3 * s), axis=1),
                ctx(t(2, 3 * s, 3 * s), scale=0.5, causal=True),
            ],
            # over attention scores, its result is what selective recomputation replays
            # (Korthikanti et al. 2022; ir.transforms.recompute(t, "selective"))
            "attention_probabilities": True,
            # a causal one masks by each score's index: no sequence in another order
            # (context parallelism) can take it
            "context_form": lambda b, op, ins, ctx: (
                "a causal Softmax masks by the index of each score: build the model with "
                "attention='fused'"
                if op.attributes["causal"]
                else None
            ),
        },
    )
)


def _softmax_grad_types(c: TypeContext):
    y, dy = tensor(c, 0, "y"), tensor(c, 1, "dy")
    _float(y, "y")
    _same_shape(y, dy, "y", "dy")
    normalize_axis(c.attributes["axis"], y.rank)
    return [y]


def _softmax_grad(xs, a):
    y, dy = xs
    dx = y * (dy - np.sum(dy * y, axis=a["axis"], keepdims=True))
    return [dx * a["scale"] if a["scale"] != 1 else dx]


register_op(
    OpDef(
        name="SoftmaxGrad",
        operands=("y", "dy"),
        results=("dx",),
        type_rule=_softmax_grad_types,
        kernel=_softmax_grad,
        cost_rule=per_output_element(4),
        attributes=(
            Attr("axis", -1, "the softmax's axis", kind=kinds.INT),
            Attr("scale", 1.0, "the softmax's scale", kind=kinds.FINITE),
        ),
        doc="Gradient of Softmax given its output y: scale * y * (dy - sum(dy * y, axis)) "
        "(masked entries have y = 0, so no gradient).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 5), t(2 * s, 5)),
                ctx(t(s, 3), t(s, 3), axis=0),
                ctx(t(s, 3), t(s, 3), scale=0.25),
            ]
        },
    )
)

# -- LayerNorm ---------------------------------------------------------------------


def _layer_norm_params(c: TypeContext, what: str):
    x = _float(tensor(c, 0, "x"), "x")
    if x.rank < 1:
        raise TypeRuleError(f"{what} needs a tensor of rank >= 1, got a scalar")
    gamma = tensor(c, 1, "gamma")
    if gamma.shape != x.shape[-1:]:
        raise TypeRuleError(
            f"gamma has shape {gamma.shape}, it must be ({x.shape[-1]},): x's last axis"
        )
    same_dtype(x, gamma)
    if c.attributes["epsilon"] <= 0:
        raise TypeRuleError(f"epsilon must be positive, got {c.attributes['epsilon']}")
    return x, gamma


def _layer_norm_types(c: TypeContext):
    x, gamma = _layer_norm_params(c, "LayerNorm")
    if normalize_axis(c.attributes["axis"], x.rank) != x.rank - 1:
        raise TypeRuleError(
            f"LayerNorm normalises the last axis only, got axis {c.attributes['axis']}"
        )
    beta = tensor(c, 2, "beta")
    _same_shape(gamma, beta, "gamma", "beta")
    return [x]


def _normalise(x: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    mean = np.mean(x, axis=-1, keepdims=True)
    inv_std = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + epsilon)
    return (x - mean) * inv_std, inv_std


def _layer_norm(xs, a):
    x, gamma, beta = xs
    xhat, _ = _normalise(x, a["epsilon"])
    return [(xhat * gamma + beta).astype(x.dtype)]


register_op(
    OpDef(
        name="LayerNorm",
        operands=("x", "gamma", "beta"),
        results=("y",),
        type_rule=_layer_norm_types,
        kernel=_layer_norm,
        cost_rule=per_output_element(8),
        attributes=(
            Attr("axis", -1, "the normalised axis (must be the last)", kind=kinds.INT),
            Attr("epsilon", 1e-5, "added to the variance", kind=kinds.NONNEG_REAL),
        ),
        doc="(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis.",
        extra={
            "weight_operands": (1, 2),  # gamma and beta are weights
            "examples": lambda s: [
                ctx(t(2 * s, 4 * s), t(4 * s), t(4 * s)),
                ctx(t(2, s, 3), t(3), t(3), epsilon=1e-3),
            ],
        },
    )
)


def _layer_norm_grad_types(c: TypeContext):
    x, gamma = _layer_norm_params(c, "LayerNormGrad")
    _same_shape(x, tensor(c, 2, "dy"), "x", "dy")
    return [x, gamma, gamma]


def _layer_norm_grad(xs, a):
    x, gamma, dy = xs
    xhat, inv_std = _normalise(x, a["epsilon"])
    lead = tuple(range(x.ndim - 1))
    dgamma = np.sum(dy * xhat, axis=lead)
    dbeta = np.sum(dy, axis=lead)
    g = dy * gamma
    dx = inv_std * (
        g - np.mean(g, axis=-1, keepdims=True) - xhat * np.mean(g * xhat, axis=-1, keepdims=True)
    )
    return [dx.astype(x.dtype), dgamma.astype(x.dtype), dbeta.astype(x.dtype)]


register_op(
    OpDef(
        name="LayerNormGrad",
        operands=("x", "gamma", "dy"),
        results=("dx", "dgamma", "dbeta"),
        type_rule=_layer_norm_grad_types,
        kernel=_layer_norm_grad,
        cost_rule=per_output_element(12),
        attributes=(Attr("epsilon", 1e-5, "the forward op's epsilon", kind=kinds.NONNEG_REAL),),
        doc="Gradients of LayerNorm(x, gamma, beta) given dy: (dx, dgamma, dbeta).",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(2 * s, 4 * s), t(4 * s), t(2 * s, 4 * s)),
                ctx(t(2, s, 3), t(3), t(2, s, 3), epsilon=1e-3),
            ],
        },
    )
)

# -- Scale and CausalMask ------------------------------------------------------------


def _scale_types(c: TypeContext):
    x = _float(tensor(c, 0, "x"), "x")
    if isinstance(c.attributes["factor"], bool) or not isinstance(
        c.attributes["factor"], (int, float)
    ):
        raise TypeRuleError(f"factor must be a number, got {c.attributes['factor']!r}")
    return [x]


register_op(
    OpDef(
        name="Scale",
        operands=("x",),
        results=("y",),
        type_rule=_scale_types,
        kernel=lambda xs, a: [(xs[0] * a["factor"]).astype(xs[0].dtype)],
        cost_rule=per_output_element(1),
        attributes=(Attr("factor", doc="the constant multiplier", kind=kinds.FINITE),),
        doc="x * factor for a constant factor; linear, so its gradient is Scale(dy, factor).",
        extra={"examples": lambda s: [ctx(t(s, 3), factor=0.5), ctx(t(2, 2 * s), factor=3.0)]},
    )
)


def _causal_mask_types(c: TypeContext):
    x = _float(tensor(c, 0, "x"), "x")
    if x.rank < 2:
        raise TypeRuleError(f"CausalMask needs a tensor of rank >= 2, got shape {x.shape}")
    return [x]


def _causal_mask(xs, a):
    x = xs[0]
    rows, cols = x.shape[-2:]
    above = np.triu(np.ones((rows, cols), dtype=bool), k=1)
    return [np.where(above, np.asarray(a["fill"], dtype=x.dtype), x)]


register_op(
    OpDef(
        name="CausalMask",
        operands=("x",),
        results=("y",),
        type_rule=_causal_mask_types,
        kernel=_causal_mask,
        cost_rule=per_output_element(1),
        attributes=(Attr("fill", -1e9, "value written above the diagonal", kind=kinds.REAL),),
        doc="x with the entries above the diagonal of its last two axes set to fill; its "
        "gradient is CausalMask(dy, fill=0.0).",
        extra={
            "examples": lambda s: [ctx(t(2 * s, 2 * s)), ctx(t(2, 3 * s, 3 * s), fill=0.0)],
            "context_form": lambda b, op, ins, ctx: (
                "CausalMask masks by the index of each score: build the model with "
                "attention='fused'"
            ),
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# Softmax and LayerNorm need their normalised axis whole; any other axis may be
# sharded. LayerNormGrad's dgamma and dbeta sum over the leading axes (Partial).


def _layer_norm_sharding(c: TypeContext) -> dict:
    r = c.input_types[0].rank
    x = (*fx.axes(r - 1), None)
    return fx.rule([x, (None,), (None,)], [x])


def _layer_norm_grad_sharding(c: TypeContext) -> dict:
    r = c.input_types[0].rank
    lead = fx.axes(r - 1)
    x = (*lead, None)
    return fx.rule(
        [x, (None,), x],
        [x, (None,), (None,)],
        reduce=dict.fromkeys(lead, "sum"),
        linear=[(2,)],
    )


def _causal_mask_sharding(c: TypeContext) -> dict:
    linear = [(0,)] if c.attributes["fill"] == 0 else []
    return fx.same_axes(c, whole=(-2, -1), linear=linear, partial_ops=fx.LINEAR)


fx.attach(
    "Softmax",
    lambda c: fx.same_axes(
        c, whole=(-2, -1) if c.attributes["causal"] else (c.attributes["axis"],), linear=()
    ),
)
fx.attach(
    "SoftmaxGrad",
    lambda c: fx.same_axes(c, whole=(c.attributes["axis"],), linear=[(1,)], partial_ops=fx.LINEAR),
)
fx.attach("LayerNorm", _layer_norm_sharding)
fx.attach("LayerNormGrad", _layer_norm_grad_sharding)
fx.attach("Scale", lambda c: fx.same_axes(c, partial_ops=fx.LINEAR))
fx.attach("CausalMask", _causal_mask_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# Softmax's gradient reads its output; LayerNormGrad recomputes the statistics from x.


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname

    def softmax(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None]
        axis, scale = op.attributes["axis"], op.attributes["scale"]
        return [b.call("SoftmaxGrad", outs[0], dy, axis=axis, scale=scale, name=gname(ins[0]))]

    def layer_norm(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None, None, None]
        x, gamma, beta = ins
        names = [gname(x), gname(gamma), gname(beta)]
        eps = op.attributes["epsilon"]
        return list(b.call("LayerNormGrad", x, gamma, dy, epsilon=eps, name=names))

    def scale(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None]
        return [b.call("Scale", dy, factor=op.attributes["factor"], name=gname(ins[0]))]

    def causal_mask(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None]
        return [b.call("CausalMask", dy, fill=0.0, name=gname(ins[0]))]

    attach_rule("Softmax", "gradient_rule", softmax)
    attach_rule("LayerNorm", "gradient_rule", layer_norm)
    attach_rule("Scale", "gradient_rule", scale)
    attach_rule("CausalMask", "gradient_rule", causal_mask)


_attach_gradient_rules()
