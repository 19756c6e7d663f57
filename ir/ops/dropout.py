"""Dropout with a mask that every sharding of a program draws alike.

``(y, mask) = Dropout(x, p=0.1, seed=0)`` keeps each element with probability ``1 - p``
and scales the kept ones by ``1 / (1 - p)``; ``mask`` (bool, one byte per element, as
Megatron-LM's fused dropout keeps it for the backward pass) says which were kept.
``DropoutGrad(dy, mask, p)`` is ``dy * mask / (1 - p)``.

The mask is a deterministic hash of ``seed`` and each element's *value*, not of a
random-number stream: a generator keyed by value rather than by position. A tensor split
over devices, recomputed under activation checkpointing, or run on the torch backend
draws the mask the sequential program draws, so distributed programs with dropout still
execute equal to the sequential one. Sharded arithmetic can round differently from the
sequential program in the last bits (a row-parallel product sums its partial results in
another order), so the hash reads the value rounded down to a coarser grid: float64
values to 31 mantissa bits (a relative step of 5e-10, against float64 rounding
differences of 1e-16: a draw flips with a probability of about 1e-7 per element), float32
to 12 bits (about 1e-4 per element: proofs run in float64, as the project's do),
half-precision values as they are. For continuous activations the draws are a fair
Bernoulli(1 - p) mask; equal values (exact zeros after a ReLU, say) share their draw.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import tensor
from ._examples import ctx, t

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # a 32-bit avalanche multiplier (products stay below 2**63)
_GOLDEN = 0x9E3779B1


def _mix32(h: np.ndarray) -> np.ndarray:
    h = ((h ^ (h >> 16)) * _MIX) & _M32
    h = ((h ^ (h >> 16)) * _MIX) & _M32
    return h ^ (h >> 16)


#: Mantissa bits dropped before hashing, by element size in bytes (see the module docstring).
DROPPED_BITS = {8: 21, 4: 11, 2: 0}


def keep_mask(x: np.ndarray, p: float, seed: int) -> np.ndarray:
    """Which elements of ``x`` Dropout keeps: a hash of ``seed`` and each element's bits,
    rounded down by :data:`DROPPED_BITS` (32-bit words mixed in int64 arithmetic, which
    the torch kernel repeats exactly)."""
    size = x.dtype.itemsize
    bits = np.ascontiguousarray(x).view(np.dtype(f"u{size}")).astype(np.uint64)
    bits >>= np.uint64(DROPPED_BITS[size])
    lo = (bits & np.uint64(_M32)).astype(np.int64)
    hi = (bits >> np.uint64(32)).astype(np.int64)
    h = _mix32(lo ^ ((seed * _GOLDEN) & _M32))
    h = _mix32(h ^ hi)
    return h >= int(p * 2**32)


def _check(c: TypeContext):
    x = tensor(c, 0, "x")
    if not x.dtype.is_float:
        raise TypeRuleError(f"Dropout needs a floating-point x, got {x.dtype.value}")
    p = c.attributes["p"]
    if not 0 <= p < 1:
        raise TypeRuleError(f"dropout probability p must be in [0, 1), got {p}")
    return x


def _dropout_types(c: TypeContext):
    x = _check(c)
    return [x, TensorType(x.shape, DType.bool, x.device)]


def _dropout(xs, a):
    x = xs[0]
    keep = keep_mask(x, a["p"], a["seed"])
    return [np.where(keep, x / (1 - a["p"]), 0).astype(x.dtype), keep]


def _dropout_cost(c: CostContext) -> Cost:
    x = c.input_types[0]
    y, mask = c.output_types
    # one fused kernel: read x, write y and the one-byte mask (Megatron-LM's fused dropout)
    return Cost(2.0 * x.num_elements, x.size_bytes, y.size_bytes + mask.size_bytes)


register_op(
    OpDef(
        name="Dropout",
        operands=("x",),
        results=("y", "mask"),
        type_rule=_dropout_types,
        kernel=_dropout,
        cost_rule=_dropout_cost,
        attributes=(
            Attr("p", 0.1, "probability of dropping an element", kind=kinds.PROBABILITY),
            Attr("seed", 0, "seed of the value-keyed mask", kind=kinds.INT),
        ),
        doc="Keep each element with probability 1 - p (scaled by 1 / (1 - p)); the mask is a "
        "hash of the seed and the element's value, so every sharding draws it alike.",
        extra={"examples": lambda s: [ctx(t(2 * s, 3)), ctx(t(s, 4), p=0.5, seed=7)]},
    )
)


def _dropout_grad_types(c: TypeContext):
    dy, mask = tensor(c, 0, "dy"), tensor(c, 1, "mask")
    if not dy.dtype.is_float:
        raise TypeRuleError(f"DropoutGrad needs a floating-point dy, got {dy.dtype.value}")
    if mask.dtype != DType.bool or mask.shape != dy.shape:
        raise TypeRuleError(
            f"mask must be a bool tensor of dy's shape {dy.shape}, got {mask.dtype.value} "
            f"{mask.shape}"
        )
    p = c.attributes["p"]
    if not 0 <= p < 1:
        raise TypeRuleError(f"dropout probability p must be in [0, 1), got {p}")
    return [dy]


register_op(
    OpDef(
        name="DropoutGrad",
        operands=("dy", "mask"),
        results=("dx",),
        type_rule=_dropout_grad_types,
        kernel=lambda xs, a: [np.where(xs[1], xs[0] / (1 - a["p"]), 0).astype(xs[0].dtype)],
        cost_rule=lambda c: Cost(
            c.output_types[0].num_elements,
            c.input_types[0].size_bytes + c.input_types[1].size_bytes,
            c.output_types[0].size_bytes,
        ),
        attributes=(Attr("p", 0.1, "the forward's dropout probability", kind=kinds.PROBABILITY),),
        doc="Gradient of Dropout: dy * mask / (1 - p).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), t(2 * s, 3, dtype=DType.bool)),
                ctx(t(s, 4), t(s, 4, dtype=DType.bool), p=0.5),
            ]
        },
    )
)


# -- sharding: elementwise (the mask follows each element's value, wherever it lives) ----

fx.attach(
    "Dropout",
    lambda c: fx.rule([fx.axes(c.input_types[0].rank)], [fx.axes(c.input_types[0].rank)] * 2),
)
fx.attach(
    "DropoutGrad",
    lambda c: fx.rule(
        [fx.axes(c.input_types[0].rank)] * 2, [fx.axes(c.input_types[0].rank)], linear=[(0,)]
    ),
)


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname

    def dropout(b, op, ins, outs, dys):
        dy = dys[0]
        if dy is None:
            return [None]
        p = op.attributes["p"]
        return [b.call("DropoutGrad", dy, outs[1], p=p, name=gname(ins[0]))]

    attach_rule("Dropout", "gradient_rule", dropout)


_attach_gradient_rules()
