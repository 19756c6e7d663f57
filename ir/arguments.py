"""Checks of public entry points' arguments: a wrong type or value is an
:class:`ir.errors.ArgumentError` naming the function and the parameter, not a bare
TypeError or AttributeError from deep inside.

>>> import ir
>>> ir.random_inputs(None)
Traceback (most recent call last):
...
ir.errors.ArgumentError: random_inputs: function must be an ir.Function, got None (NoneType)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .errors import ArgumentError


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})" if not isinstance(value, str) else text


def function_arg(where: str, name: str, value: Any) -> Any:
    """``value`` if it is an :class:`ir.Function`."""
    from .function import Function

    if not isinstance(value, Function):
        raise ArgumentError(f"{where}: {name} must be an ir.Function, got {_got(value)}")
    return value


def int_arg(where: str, name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int (numpy integers too; never a bool) within [lo, hi]."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
    bounds = (
        f" from {lo} to {hi}"
        if lo is not None and hi is not None
        else f" >= {lo}"
        if lo is not None
        else ""
    )
    raise ArgumentError(f"{where}: {name} must be an integer{bounds}, got {_got(value)}")


def real_arg(
    where: str, name: str, value: Any, lo: float | None = None, positive: bool = False
) -> float:
    """``value`` as a finite float (ints too; never a bool), >= lo, > 0 when ``positive``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if math.isfinite(value) and (lo is None or value >= lo) and (not positive or value > 0):
            return value
    need = " > 0" if positive else f" >= {lo}" if lo is not None else ""
    raise ArgumentError(f"{where}: {name} must be a finite number{need}, got {_got(value)}")


def choice_arg(where: str, name: str, value: Any, choices: Collection[str]) -> str:
    """``value`` if it is one of the strings ``choices``."""
    if isinstance(value, str) and value in choices:
        return value
    shown = ", ".join(repr(c) for c in choices)
    raise ArgumentError(f"{where}: {name} must be one of {shown}, got {_got(value)}")


def str_arg(where: str, name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ArgumentError(f"{where}: {name} must be a string, got {_got(value)}")
    return value


def sequence_arg(where: str, name: str, value: Any, what: str) -> Sequence[Any]:
    """``value`` if it is a list or tuple (not a string)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentError(f"{where}: {name} must be {what}, got {_got(value)}")
    return value


def mapping_arg(where: str, name: str, value: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ArgumentError(f"{where}: {name} must be {what}, got {_got(value)}")
    return value
