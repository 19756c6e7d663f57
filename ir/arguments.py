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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ArgumentError


def _got(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit limit on int -> str
        text = f"<an integer of {value.bit_length()} bits>"
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
        try:
            value = float(value)
        except OverflowError:  # an int beyond float's range
            value = math.inf
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


def bool_arg(where: str, name: str, value: Any) -> bool:
    """``value`` if it is True or False (a numpy bool too): a flag never takes a truthy
    string, number or list, which would silently mean True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ArgumentError(f"{where}: {name} must be True or False, got {_got(value)}")


def topology_arg(where: str, name: str, value: Any, optional: bool = True) -> Any:
    """``value`` if it is an :class:`ir.Topology` (or None, when ``optional``)."""
    from .device import Topology

    if (value is None and optional) or isinstance(value, Topology):
        return value
    none = " or None" if optional else ""
    raise ArgumentError(
        f"{where}: {name} must be an ir.Topology (Topology.preset(...), "
        f"Topology.uniform(...)){none}, got {_got(value)}"
    )


def names_arg(where: str, name: str, value: Any, what: str = "value names") -> list[Any] | None:
    """None, or ``value`` as a list of names (strings) or ``ir.Value`` objects: a string
    alone (which would be read letter by letter) or a dict is refused."""
    from .value import Value

    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentError(f"{where}: {name} must be a list of {what}, got {_got(value)}")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, (str, Value)):
            raise ArgumentError(
                f"{where}: {name}[{i}] must be a name (a string) or an ir.Value, got {_got(item)}"
            )
    return items


def callable_arg(where: str, name: str, value: Any) -> Callable[..., Any] | None:
    """None, or ``value`` if it can be called."""
    if value is None or callable(value):
        return value
    raise ArgumentError(f"{where}: {name} must be a function or None, got {_got(value)}")


def nested_shape(x: Any) -> tuple[int, ...]:
    """The shape ``np.asarray(x)`` would have, read from lengths and first elements
    without converting: a list of huge arrays is refused by its shape before numpy
    allocates a copy of them all. Ragged lists are not detected here (numpy refuses them).
    """
    shape: list[int] = []
    while isinstance(x, (list, tuple)):
        shape.append(len(x))
        if not x:
            return tuple(shape)
        x = x[0]
    return tuple(shape) + tuple(np.shape(x)) if isinstance(x, np.ndarray) else tuple(shape)
