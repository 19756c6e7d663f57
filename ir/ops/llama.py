"""The layer ops of Llama-style decoders: ``RMSNorm``, ``Rotary`` and ``SwiGLU``.

Each is one op (one kernel) where an imported model writes several (``Pow``,
``ReduceMean``, ``Rsqrt``, ``Mul`` for an RMSNorm; ``Slice``, ``Neg``, ``Concat``, ``Mul``
for a rotary embedding; ``Sigmoid``, ``Mul``, ``Mul`` for SiLU times the up projection),
as the fused kernels serving engines and Megatron-LM run (vLLM's ``rms_norm``,
``rotary_embedding`` and ``silu_and_mul``; Megatron-LM's fused RMSNorm and bias-SwiGLU):
one launch and one pass over memory each, which the efficiency model times as one
memory-bound kernel. ``ir.models.llama`` builds with them.

* ``RMSNorm(x, gamma)``: ``x / sqrt(mean(x^2) + epsilon) * gamma`` over the last axis
  (Zhang and Sennrich 2019); gradient ``RMSNormGrad(x, gamma, dy) -> (dx, dgamma)``.
* ``Rotary(x, theta=, offset=, inverse=)``: rotary position embedding (Su et al. 2021,
  RoFormer) of ``x`` ``(..., S, D)`` at positions ``offset .. offset + S - 1`` of axis
  ``-2``, in the "rotate half" arrangement of Hugging Face's Llama: channel ``i`` and
  ``i + D/2`` rotate together by ``position * theta^(-2i/D)``. ``inverse=True`` rotates
  back, which is the gradient (a rotation's transpose is its inverse). The positions are
  an attribute, so a KV-cached decode step (``ir.inference``) moves them with
  ``offset`` (the record's ``extra["position_attribute"]``).
* ``SwiGLU(gate, up)``: ``silu(gate) * up`` (Shazeer 2020), the Llama MLP's product of
  its gate and up projections; gradient ``SwiGLUGrad(gate, up, dy) -> (dgate, dup)``.

Sharding: RMSNorm splits every axis but the normalised one; Rotary every axis but the
positions and the channels (a pair spans both halves); SwiGLU is elementwise. With
tensor parallelism the rotary embedding runs on each device's heads and SwiGLU on each
device's columns of the MLP, so none of them communicates.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, attach_rule, register_op
from . import _factors as fx
from ._common import per_output_element, same_dtype, tensor
from ._examples import ctx, t


def _float(c: TypeContext, i: int, what: str):
    x = tensor(c, i, what)
    if not x.dtype.is_float:
        raise TypeRuleError(f"{what} must have a floating-point dtype, got {x.dtype.value}")
    return x


def _like(c: TypeContext, i: int, what: str, ref, ref_what: str):
    x = _float(c, i, what)
    if x.shape != ref.shape:
        raise TypeRuleError(f"{what} has shape {x.shape}, {ref_what} has {ref.shape}")
    same_dtype(ref, x)
    return x


# -- RMSNorm -------------------------------------------------------------------------------


def _rms_params(c: TypeContext, what: str):
    x = _float(c, 0, "x")
    if x.rank < 1:
        raise TypeRuleError(f"{what} needs a tensor of rank >= 1, got a scalar")
    gamma = tensor(c, 1, "gamma")
    if gamma.shape != x.shape[-1:]:
        raise TypeRuleError(
            f"gamma has shape {gamma.shape}, it must be ({x.shape[-1]},): x's last axis"
        )
    same_dtype(x, gamma)
    if not c.attributes["epsilon"] > 0:
        raise TypeRuleError(f"epsilon must be positive, got {c.attributes['epsilon']}")
    return x, gamma


def _inv_rms(x: np.ndarray, epsilon: float) -> np.ndarray:
    return 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(epsilon))


def _rms_norm(xs, a):
    x, gamma = xs
    return [(x * _inv_rms(x, a["epsilon"]) * gamma).astype(x.dtype)]


def _rms_norm_grad(xs, a):
    x, gamma, dy = xs
    inv = _inv_rms(x, a["epsilon"])
    xhat = x * inv
    g = dy * gamma
    dx = inv * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    dgamma = np.sum(dy * xhat, axis=tuple(range(x.ndim - 1)))
    return [dx.astype(x.dtype), dgamma.astype(x.dtype)]


_EPSILON = Attr("epsilon", 1e-6, "added to the mean square", kind=kinds.NONNEG_REAL)

register_op(
    OpDef(
        name="RMSNorm",
        operands=("x", "gamma"),
        results=("y",),
        type_rule=lambda c: [_rms_params(c, "RMSNorm")[0]],
        kernel=_rms_norm,
        cost_rule=per_output_element(4),
        attributes=(_EPSILON,),
        doc="x / sqrt(mean(x^2) + epsilon) * gamma over the last axis (Llama's norm), one "
        "memory-bound kernel.",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(2 * s, 4 * s), t(4 * s)),
                ctx(t(2, s, 3), t(3), epsilon=1e-5),
            ],
        },
    )
)


def _rms_grad_types(c: TypeContext):
    x, gamma = _rms_params(c, "RMSNormGrad")
    _like(c, 2, "dy", x, "x")
    return [x, gamma]


register_op(
    OpDef(
        name="RMSNormGrad",
        operands=("x", "gamma", "dy"),
        results=("dx", "dgamma"),
        type_rule=_rms_grad_types,
        kernel=_rms_norm_grad,
        cost_rule=per_output_element(8),
        attributes=(_EPSILON,),
        doc="Gradients of RMSNorm(x, gamma) given dy: (dx, dgamma).",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(2 * s, 4 * s), t(4 * s), t(2 * s, 4 * s)),
                ctx(t(2, s, 3), t(3), t(2, s, 3), epsilon=1e-5),
            ],
        },
    )
)


# -- Rotary --------------------------------------------------------------------------------


def rotary_tables(
    positions: int, dim: int, theta: float, offset: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``(positions, dim)`` in float64: the angles of positions
    ``offset ..`` for channel pairs ``(i, i + dim/2)``, ``position * theta^(-2i/dim)``,
    repeated for both halves (Hugging Face's ``LlamaRotaryEmbedding``)."""
    inv_freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(offset, offset + positions, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def _rotate(x: np.ndarray, a) -> np.ndarray:
    s, d = x.shape[-2:]
    cos, sin = rotary_tables(s, d, a["theta"], a["offset"])
    if a["inverse"]:
        sin = -sin
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos.astype(x.dtype) + rotated * sin.astype(x.dtype)).astype(x.dtype)


def _rotary_types(c: TypeContext):
    x = _float(c, 0, "x")
    if x.rank < 2 or x.shape[-1] % 2:
        raise TypeRuleError(
            f"Rotary rotates channel pairs of x (..., positions, channels) with an even number "
            f"of channels, got shape {x.shape}"
        )
    if not c.attributes["theta"] > 1:
        raise TypeRuleError(
            f"theta must be > 1 (the base of the wavelengths), got {c.attributes['theta']}"
        )
    return [x]


register_op(
    OpDef(
        name="Rotary",
        operands=("x",),
        results=("y",),
        type_rule=_rotary_types,
        kernel=lambda xs, a: [_rotate(xs[0], a)],
        cost_rule=per_output_element(6),
        attributes=(
            Attr("theta", 10000.0, "base of the rotation wavelengths", kind=kinds.FINITE),
            Attr("offset", 0, "position of the first row of axis -2", kind=kinds.NONNEG_INT),
            Attr("inverse", False, "rotate back (the gradient)", kind=kinds.BOOL),
        ),
        doc="Rotary position embedding of x (..., S, D) at positions offset..offset+S-1 "
        "(axis -2), channels i and i + D/2 rotated by position * theta^(-2i/D) (Hugging "
        "Face's rotate-half Llama form); inverse rotates back. One memory-bound kernel.",
        extra={
            # ir.inference moves a step's positions with this attribute (a decode step's
            # one token sits at position C of the sequence)
            "position_attribute": "offset",
            # it rotates by each row's index, not by a position it is given: no sequence in
            # another order (context parallelism) can take it
            "context_form": lambda b, op, ins, ctx: (
                "Rotary rotates each row by its index along the sequence, not by its "
                "position: use cp=1"
            ),
            "examples": lambda s: [
                ctx(t(2, 3, 2 * s, 4)),
                ctx(t(s, 3, 2 * s), theta=500000.0, offset=7),
                ctx(t(2, s, 6), inverse=True, offset=3),
            ],
        },
    )
)


# -- SwiGLU --------------------------------------------------------------------------------


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for large |x|


def _swiglu_types(c: TypeContext):
    gate = _float(c, 0, "gate")
    _like(c, 1, "up", gate, "gate")
    return [gate]


def _swiglu_grad(xs, a):
    gate, up, dy = xs
    s = _sigmoid(gate)
    dgate = dy * up * s * (1.0 + gate * (1.0 - s))
    return [dgate.astype(gate.dtype), (dy * gate * s).astype(gate.dtype)]


def _swiglu_grad_types(c: TypeContext):
    gate = _float(c, 0, "gate")
    _like(c, 1, "up", gate, "gate")
    _like(c, 2, "dy", gate, "gate")
    return [gate, gate]


register_op(
    OpDef(
        name="SwiGLU",
        operands=("gate", "up"),
        results=("y",),
        type_rule=_swiglu_types,
        kernel=lambda xs, a: [(xs[0] * _sigmoid(xs[0]) * xs[1]).astype(xs[0].dtype)],
        cost_rule=per_output_element(5),
        doc="silu(gate) * up = gate * sigmoid(gate) * up (the Llama MLP's gated product), one "
        "memory-bound kernel.",
        extra={"examples": lambda s: [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(2, s, 4), t(2, s, 4))]},
    )
)

register_op(
    OpDef(
        name="SwiGLUGrad",
        operands=("gate", "up", "dy"),
        results=("dgate", "dup"),
        type_rule=_swiglu_grad_types,
        kernel=_swiglu_grad,
        cost_rule=per_output_element(6),
        doc="Gradients of SwiGLU(gate, up) given dy: (dgate, dup).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), t(2 * s, 3), t(2 * s, 3)),
                ctx(t(2, s, 4), t(2, s, 4), t(2, s, 4)),
            ]
        },
    )
)


# -- sharding rules ------------------------------------------------------------------------


def _rms_sharding(c: TypeContext) -> dict:
    x = (*fx.axes(c.input_types[0].rank - 1), None)
    return fx.rule([x, (None,)], [x])


def _rms_grad_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[0].rank - 1)
    x = (*lead, None)
    return fx.rule([x, (None,), x], [x, (None,)], reduce=dict.fromkeys(lead, "sum"), linear=[(2,)])


fx.attach("RMSNorm", _rms_sharding)
fx.attach("RMSNormGrad", _rms_grad_sharding)
# positions (axis -2) sit where the shard does and a channel pair spans both halves
fx.attach("Rotary", lambda c: fx.same_axes(c, whole=(-2, -1), partial_ops=fx.LINEAR))
fx.attach("SwiGLU", lambda c: fx.elementwise(c))
fx.attach(
    "SwiGLUGrad",
    lambda c: fx.rule(
        [fx.axes(c.input_types[0].rank)] * 3, [fx.axes(c.input_types[0].rank)] * 2, linear=[(2,)]
    ),
)


# -- gradient rules (autodiff) -------------------------------------------------------------


def _rms_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    x, gamma = ins
    eps = op.attributes["epsilon"]
    return list(b.call("RMSNormGrad", x, gamma, dy, epsilon=eps, name=[gname(x), gname(gamma)]))


def _rotary_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None]
    a = dict(op.attributes)
    a["inverse"] = not a.get("inverse", False)
    return [b.call("Rotary", dy, **a, name=gname(ins[0]))]


def _swiglu_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    gate, up = ins
    return list(b.call("SwiGLUGrad", gate, up, dy, name=[gname(gate), gname(up)]))


attach_rule("RMSNorm", "gradient_rule", _rms_gradient)
attach_rule("Rotary", "gradient_rule", _rotary_gradient)
attach_rule("SwiGLU", "gradient_rule", _swiglu_gradient)
