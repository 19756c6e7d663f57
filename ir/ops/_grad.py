"""Helpers the gradient rules of the op families share (see ``ir.transforms.autodiff``).

A gradient rule has the signature::

    rule(b: FunctionBuilder, op: Op, inputs: list[Value], outputs: list[Value],
         output_grads: list[Value | None]) -> list[Value | None]

and returns one gradient (or None: no gradient flows there) per operand. The rule
adds its gradient ops to ``b`` with ``b.call``; ``inputs`` and ``outputs`` are the
op's operands and results as defined in ``b`` (the forward op has already been
added), ``output_grads[i]`` the gradient of result ``i`` or None when no gradient
reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..types import TensorType, TupleType, Type
from ..value import Value

if TYPE_CHECKING:
    from ..builder import FunctionBuilder


def gname(v: Value) -> str:
    """The name hint of the gradient of ``v``: ``dwA`` for ``wA``."""
    return f"d{v.name}"


def zeros(b: FunctionBuilder, t: Type, name: str = "zero") -> Value:
    """A zero value of type ``t`` (a Constant, or a tuple of Constants)."""
    if isinstance(t, TupleType):
        items = [zeros(b, e, f"{name}_{i}") for i, e in enumerate(t.elements)]
        return b.call("MakeTuple", *items, name=name)
    assert isinstance(t, TensorType)
    return b.call(
        "Constant", value=0.0, shape=t.shape, dtype=t.dtype.value, device=t.device, name=name
    )


def or_zeros(b: FunctionBuilder, g: Value | None, t: Type, name: str) -> Value:
    return zeros(b, t, name) if g is None else g


def unbroadcast(b: FunctionBuilder, g: Value, target: TensorType, name: str) -> Value:
    """Sum ``g`` down to ``target``'s shape (undoing numpy broadcasting)."""
    gt = g.type
    assert isinstance(gt, TensorType)
    if gt.shape == target.shape:
        return g
    lead = gt.rank - target.rank
    axes = list(range(lead))
    axes += [lead + i for i, n in enumerate(target.shape) if n == 1 and gt.shape[lead + i] != 1]
    s = b.call("ReduceSum", g, axes=tuple(axes), keepdims=True, name=f"{name}_sum")
    return b.call("Reshape", s, shape=target.shape, name=name)


def add_grads(b: FunctionBuilder, a: Value, c: Value, name: str) -> Value:
    """``a + c`` for two gradients of one value (tuples add element by element)."""
    if isinstance(a.type, TupleType):
        n = len(a.type)
        items = [
            b.call(
                "Add",
                b.call("TupleGet", a, index=i, name=f"{name}_a{i}"),
                b.call("TupleGet", c, index=i, name=f"{name}_b{i}"),
                name=f"{name}_{i}",
            )
            for i in range(n)
        ]
        return b.call("MakeTuple", *items, name=name)
    return b.call("Add", a, c, name=name)


def attrs(op: Any) -> dict[str, Any]:
    return dict(op.attributes)
