"""Helpers for the ``examples`` entry every op record carries in ``extra``.

``extra["examples"]`` is a function ``(scale: int) -> list[TypeContext]``: a few
valid operand types and attributes whose sizes grow with ``scale``. The
registry walk (``tests/ir/test_registry_walk.py``) runs every op's kernel, type
rule, cost rule and print/parse round trip on them, so no op can skip the walk.
Attributes left out of an example take their defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..registry import TypeContext
from ..types import DeviceRef, DType, TensorType, TupleType, Type

Examples = Callable[[int], list[TypeContext]]


def t(*shape: int, dtype: DType = DType.float32, device: DeviceRef = 0) -> TensorType:
    """A tensor type on device 0 unless told otherwise (float32 by default)."""
    return TensorType(tuple(shape), dtype, device)


def per_device(*shape: int, devices: tuple[int, ...] = (1, 2), dtype: DType = DType.float32):
    """A tuple with one tensor of ``shape`` on each of ``devices``."""
    return TupleType(tuple(TensorType(tuple(shape), dtype, d) for d in devices))


def ctx(*types: Type, **attributes: Any) -> TypeContext:
    """A TypeContext of operand ``types`` and (possibly partial) ``attributes``."""
    return TypeContext(tuple(types), attributes)
