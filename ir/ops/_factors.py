"""Helpers for writing sharding rules (the ``# -- sharding rules`` sections).

A sharding rule is ``rule(ctx: TypeContext) -> dict`` in *factor notation*
(as in GSPMD / Shardy): every tensor axis of every operand and result is named
by a factor; sharding a factor over a mesh axis shards every axis it names.

* ``operands`` / ``results``: per value, one factor name (or ``None``: that
  axis must stay whole) per tensor axis; for a tuple-typed value, per axis of
  its elements.
* ``reduce``: ``{factor: "sum"}`` for contraction factors; a result without
  such a factor becomes Partial when the factor is sharded (``P(sum)``).
* ``linear``: tuples of operand indices that may be Partial together (the
  others Replicated), giving Partial results; ``partial_ops`` says which
  reductions commute with the op (``sum``/``mean`` for linear arithmetic, all
  for pure data movement).
* ``local_attributes``: ``fn(attributes, local_input_types, local_result_types)
  -> attributes`` when the per-device op needs other attributes (``Reshape``'s
  target shape, ``Loss``'s global denominator).
* ``halo``: sliding windows (``Conv2D``: height and width), a dict or a list of dicts ``{"operand",
  "axis", "result_axis", "window", "stride", "pads", "local_attributes"}``; propagation
  exchanges boundary rows between neighbours with send/recv.

The rule is plain data: ``ir.sharding`` reads it, ops never import sharding.
"""

from __future__ import annotations

from typing import Any

from ..registry import TypeContext
from ..types import TensorType, TupleType

ALL_REDUCTIONS = ("sum", "mean", "max", "min")
LINEAR = ("sum", "mean")


def axes(n: int, prefix: str = "f") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def rank(t) -> int:
    if isinstance(t, TupleType):
        return rank(t.elements[0]) if t.elements else 0
    return t.rank


def shape(t) -> tuple[int, ...]:
    return shape(t.elements[0]) if isinstance(t, TupleType) else t.shape


def rule(operands, results, reduce=None, linear=(), partial_ops=LINEAR, **extra) -> dict:
    out: dict[str, Any] = {
        "operands": [tuple(o) for o in operands],
        "results": [tuple(r) for r in results],
        "reduce": dict(reduce or {}),
        "linear": [tuple(ix) for ix in linear],
        "partial_ops": tuple(partial_ops),
    }
    out.update(extra)
    return out


def elementwise(c: TypeContext, linear=(), partial_ops=LINEAR) -> dict:
    """Broadcasting elementwise ops: operand axes line up with the result's trailing axes."""
    out_shape: tuple[int, ...] = ()
    for t in c.input_types:
        if len(shape(t)) > len(out_shape):
            out_shape = (1,) * (len(shape(t)) - len(out_shape)) + out_shape
        s = (1,) * (len(out_shape) - len(shape(t))) + shape(t)
        out_shape = tuple(max(a, b) for a, b in zip(out_shape, s))
    names = axes(len(out_shape))
    ops = []
    for t in c.input_types:
        s = shape(t)
        lead = len(out_shape) - len(s)
        ops.append(
            tuple(
                None if (n == 1 and out_shape[lead + i] != 1) else names[lead + i]
                for i, n in enumerate(s)
            )
        )
    return rule(ops, [names], linear=linear, partial_ops=partial_ops)


def same_axes(c: TypeContext, whole=(), linear=((0,),), partial_ops=ALL_REDUCTIONS) -> dict:
    """Unary-style ops whose operands and results share axes; ``whole`` axes stay unsharded."""
    r = rank(c.input_types[0])
    whole = {a % r for a in whole} if r else set()
    names = tuple(None if i in whole else n for i, n in enumerate(axes(r)))
    ops = [names if rank(t) == r else (None,) * rank(t) for t in c.input_types]
    return rule(ops, [names], linear=linear, partial_ops=partial_ops)


def is_tensor(t) -> bool:
    return isinstance(t, TensorType)


def attach(name: str, fn) -> None:
    """Attach ``fn`` as op ``name``'s sharding rule."""
    from ..registry import attach_rule

    attach_rule(name, "sharding_rule", fn)
