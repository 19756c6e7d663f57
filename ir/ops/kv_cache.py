"""The KV cache's one op: ``CacheAppend(past, new)``, keys or values appended in place.

A decode step (``ir.inference.decode_step``) reads each layer's cached keys and values
``past`` ``(B, Hkv, C, D)`` (resident state, like a training step's weights), computes the
new token's ``new`` ``(B, Hkv, 1, D)`` and attends over ``present = CacheAppend(past,
new)`` ``(B, Hkv, C + 1, D)``, which it returns as the next step's cache. The value is the
concatenation along ``axis`` (what Hugging Face's ``DynamicCache`` and ONNX's
``Attention`` with ``past_key`` compute); the *cost* is a serving engine's: the cache is
allocated ahead (vLLM's blocks, TensorRT-LLM's KV cache pool) and the step writes the new
rows into it, so the op reads and writes ``new``'s bytes only, and the simulator's memory
curve allocates only the rows it adds (``extra["appends_to"] = 0``: result 0 extends
operand 0's storage). ``past`` is resident state: tensor parallelism lays it out as the
op's other operand is split (the new token's kv heads), never whole on every device.

Sharding: every axis but ``axis``; a split of the kv heads keeps each device's cache
rows for its heads.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from . import _factors as fx
from ._common import normalize_axis, same_dtype, tensor
from ._examples import ctx, t


def _types(c: TypeContext):
    past, new = tensor(c, 0, "past"), tensor(c, 1, "new")
    same_dtype(past, new)
    if past.rank != new.rank or past.rank == 0:
        raise TypeRuleError(
            f"past {past.shape} and new {new.shape} must have one rank >= 1 (the cache and the "
            "rows appended to it)"
        )
    axis = normalize_axis(c.attributes["axis"], past.rank)
    other = [i for i in range(past.rank) if i != axis]
    if any(past.shape[i] != new.shape[i] for i in other):
        raise TypeRuleError(
            f"past {past.shape} and new {new.shape} must agree on every axis but axis {axis} "
            "(the positions the new rows are appended along)"
        )
    shape = list(past.shape)
    shape[axis] += new.shape[axis]
    return [past.with_shape(tuple(shape))]


def _cost(c: CostContext) -> Cost:
    new = c.input_types[1].size_bytes
    return Cost(0.0, new, new, kernel="memory")  # the new rows, written into their slots


register_op(
    OpDef(
        name="CacheAppend",
        operands=("past", "new"),
        results=("present",),
        type_rule=_types,
        kernel=lambda xs, a: [np.concatenate(xs, axis=a["axis"])],
        cost_rule=_cost,
        attributes=(
            Attr("axis", -2, "the positions axis the rows are appended along", kind=kinds.INT),
        ),
        doc="past with new appended along axis (a KV cache's next token), in place: the value "
        "is the concatenation, the cost reads and writes new's bytes only and the result's "
        "memory is the rows it adds (a serving engine's preallocated cache).",
        extra={
            "appends_to": 0,  # result 0 extends operand 0's storage in place (resident state)
            "keeps_values": True,
            "examples": lambda s: [
                ctx(t(2, 3, 4 * s, 4), t(2, 3, 1, 4)),
                ctx(t(s, 2, 5, 2), t(s, 2, 2 * s, 2)),
                ctx(t(3 * s, 2), t(s, 2), axis=0),
            ],
        },
    )
)


def _sharding(c: TypeContext) -> dict:
    return fx.same_axes(c, whole=(c.attributes["axis"],), linear=[(0, 1)])


fx.attach("CacheAppend", _sharding)


def _gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    past, new = ins
    axis = normalize_axis(op.attributes["axis"], past.type.rank)
    n = past.type.shape[axis]
    end = n + new.type.shape[axis]
    return [
        b.call("Slice", dy, axis=axis, start=0, end=n, name=gname(past)),
        b.call("Slice", dy, axis=axis, start=n, end=end, name=gname(new)),
    ]


attach_rule("CacheAppend", "gradient_rule", _gradient)
