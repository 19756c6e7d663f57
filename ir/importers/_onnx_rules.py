"""What the ONNX importer's op rules share: the rule record, the refusal signal, and
small helpers (attributes, constants, axes).

A rule reads one ONNX node into registry ops: ``Rule.read(reader, node)`` returns one
entry per node output, each a ``Value``, a numpy array (a result known at import time:
a ``Shape``, a folded ``Range``), a :class:`Uniform` (a constant-filled tensor, not
materialised), or None (an optional output nobody reads). It raises :class:`Refused`
with a sentence when the node's attributes or operands are outside what it reads; the
reader collects every refusal of the graph and reports them together.

``static`` lists the operand positions that must be constants (initializers,
``Constant`` nodes, or values folded at import time): they become attributes of the
registry ops (a ``Reshape``'s shape). ``newest`` is the newest version of the op's
definition whose meaning the rule implements (a newer one is refused, not guessed).
``wide``: a rule that writes the op as several registry ops computes float16 and
bfloat16 operands in float32 and rounds once at the end, as onnx's reference and
torch's half-precision kernels do (rounding after every step drifts by an ulp).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..types import DType


class Refused(Exception):  # noqa: N818  (internal signal, collected by the reader)
    """The node is outside what its rule reads; the message says what and why."""


@dataclass(frozen=True)
class Rule:
    read: Callable[[Any, Any], list]
    static: tuple[int, ...] = ()
    newest: int = 28
    wide: bool = False


@dataclass(frozen=True)
class Uniform:
    """A tensor of ``shape`` whose every element is ``value`` (ONNX ``ConstantOfShape``)."""

    value: Any
    shape: tuple[int, ...]
    dtype: DType

    def array(self) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=self.dtype.numpy)


def attr(rd, node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (strings decoded), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            value = rd.onnx.helper.get_attribute_value(a)
            if isinstance(value, bytes):
                return value.decode()
            if isinstance(value, list) and value and isinstance(value[0], bytes):
                return [v.decode() for v in value]
            return value
    return default


def known_attributes(node, *names: str) -> None:
    """Refuse an attribute the rule does not read (a newer or rarer option)."""
    for a in node.attribute:
        if a.name not in names:
            raise Refused(f"attribute {a.name!r} is not read")


def float32(x: float) -> float:
    """An ONNX float attribute as the float32 it is, in shortest decimal form."""
    return float(str(np.float32(x)))


def ints(array: np.ndarray | None) -> list[int]:
    return [] if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def axis_of(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise Refused(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def scalar(rd, value: float, like) -> Any:
    """A rank-0 ``Constant`` of ``like``'s dtype (a Value's type or a DType)."""
    dtype = like if isinstance(like, DType) else like.type.dtype
    return rd.constant(value, dtype)


def need_float(x, what: str = "the input") -> None:
    if not x.type.dtype.is_float:
        raise Refused(f"{what} has dtype {x.type.dtype.value}; the registry op needs a float")
