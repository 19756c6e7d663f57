"""Attribute kinds: which values an op's attribute may take.

Each :class:`ir.registry.Attr` declares its kind in its op's record, and the one checker
(:func:`ir.verify.infer_types`, which the builder, the parser, every transform and
``verify`` go through) refuses a value outside it, naming the op, the attribute and the
value. Type rules then see only values of the declared kind: ``to_device=True``,
``"gpu1"`` or ``-3`` never reach a rule, a printer or the simulator.

A kind is a description (what the error message and ``docs/ops.md`` say) and a
predicate; the combinators below build them.

>>> DEVICE.accepts(3), DEVICE.accepts(True), DEVICE.accepts("gpu1")
(True, False, False)
>>> sequence_of(INT).accepts([1, -2]), optional(INT).accepts(None)
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .limits import MAX_DEVICES, MAX_INT
from .types import DeviceVar, DType


@dataclass(frozen=True)
class AttrKind:
    """What values an attribute takes: ``description`` for people, ``check`` for values."""

    description: str
    check: Callable[[Any], bool]
    item: AttrKind | None = None  # a list's item kind, so that errors can name the bad item
    # A check of a whole list of values at C speed (a group of 16,384 device ids): True
    # when it accepts them all; False leaves the list to ``check`` item by item.
    every: Callable[[Any], bool] | None = None

    def accepts(self, value: Any) -> bool:
        try:
            return bool(self.check(value))
        except RecursionError:  # a value nested beyond reason is not of any kind
            return False

    def __str__(self) -> str:
        return self.description


def _is_int(v: Any) -> bool:
    return type(v) is int and -MAX_INT <= v <= MAX_INT


def _is_real(v: Any) -> bool:
    """An int or a float that is not NaN (bools, complex numbers and strings are not)."""
    return (type(v) is float and not math.isnan(v)) or _is_int(v)


def _ints_within(low: int, high: int) -> Callable[[Any], bool]:
    """Whether a list holds only ints from ``low`` to ``high``: type and bounds checked by
    ``map``, ``min`` and ``max`` in C, not a Python call per item."""

    def every(v: Any) -> bool:
        return not v or (set(map(type, v)) == {int} and low <= min(v) and max(v) <= high)

    return every


def _is_sequence(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) <= MAX_DEVICES


INT = AttrKind("an integer", _is_int, every=_ints_within(-MAX_INT, MAX_INT))
NONNEG_INT = AttrKind(
    "an integer >= 0", lambda v: _is_int(v) and v >= 0, every=_ints_within(0, MAX_INT)
)
POS_INT = AttrKind(
    "an integer >= 1", lambda v: _is_int(v) and v >= 1, every=_ints_within(1, MAX_INT)
)
BOOL = AttrKind("True or False", lambda v: type(v) is bool)
REAL = AttrKind("a number (not NaN)", _is_real)
FINITE = AttrKind("a finite number", lambda v: _is_real(v) and math.isfinite(v))
NONNEG_REAL = AttrKind("a finite number >= 0", lambda v: _is_real(v) and 0 <= v < math.inf)
NAME = AttrKind("a name (a Python identifier)", lambda v: type(v) is str and v.isidentifier())
DTYPE = AttrKind(
    f"a dtype ({', '.join(DType.__members__)})",
    lambda v: type(v) is DType or (type(v) is str and v in DType.__members__),
)
DEVICE = AttrKind(
    f"a device (an integer from 0 to {MAX_DEVICES - 1}, a device variable, or None)",
    lambda v: v is None or type(v) is DeviceVar or (type(v) is int and 0 <= v < MAX_DEVICES),
    every=_ints_within(0, MAX_DEVICES - 1),
)


def sequence_of(kind: AttrKind, min_len: int = 0) -> AttrKind:
    """A list (or tuple) of values of ``kind``."""
    some = f" of at least {min_len} items" if min_len else ""
    return AttrKind(
        f"a list{some}, each {kind.description}",
        lambda v: (
            _is_sequence(v)
            and len(v) >= min_len
            and ((kind.every is not None and kind.every(v)) or all(kind.accepts(x) for x in v))
        ),
        kind,
    )


def problem(kind: AttrKind, value: Any) -> str | None:
    """None when ``value`` is of ``kind``, else what is wrong with it, for a message."""
    if kind.accepts(value):
        return None
    if kind.item is not None and _is_sequence(value):
        for i, x in enumerate(value):
            if not kind.item.accepts(x):
                return f"is not {kind}: item {i} ({shown(x)}) is not {kind.item}"
    return f"is not {kind}"


def shown(value: Any) -> str:
    """A value for a message, cut short when its repr is long."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested beyond reason, or an int too long to print
        return f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def optional(kind: AttrKind) -> AttrKind:
    """None or a value of ``kind``."""
    return AttrKind(f"None or {kind.description}", lambda v: v is None or kind.accepts(v))


def either(*kinds: AttrKind) -> AttrKind:
    """A value of any of ``kinds``."""
    return AttrKind(
        " or ".join(k.description for k in kinds), lambda v: any(k.accepts(v) for k in kinds)
    )


def one_of(*words: str) -> AttrKind:
    """One of the strings ``words``."""
    return AttrKind(
        "one of " + ", ".join(f'"{w}"' for w in words), lambda v: type(v) is str and v in words
    )


def _device_map(v: Any, depth: int = 0) -> bool:
    """``{device: [devices]}`` or ``{device: {device: [devices]}}`` (seed 002), a few deep."""
    if not isinstance(v, Mapping) or depth > 4:
        return False
    for key, item in v.items():
        if not (type(key) is int and 0 <= key < MAX_DEVICES):
            return False
        if isinstance(item, Mapping):
            if not _device_map(item, depth + 1):
                return False
        elif not DEVICES.accepts(item):
            return False
    return True


SHAPE = sequence_of(NONNEG_INT)
DEVICES = sequence_of(DEVICE)
DEVICE_MAP = AttrKind(
    "None or a dict from device to a list of devices (or to such a dict)",
    lambda v: v is None or _device_map(v),
)
REDUCTION = one_of("sum", "mean", "max", "min")
GROUPS = optional(sequence_of(sequence_of(NONNEG_INT, 1), 1))
NEW_SHAPE = sequence_of(AttrKind("an integer >= -1", lambda v: _is_int(v) and v >= -1))
PADS = AttrKind(
    "a list [top, bottom, left, right] of integers >= 0", lambda v: SHAPE.accepts(v) and len(v) == 4
)
PROBABILITY = AttrKind("a number from 0 to 1 (1 excluded)", lambda v: _is_real(v) and 0 <= v < 1)
PLACEMENTS = sequence_of(
    AttrKind('a placement string ("S(i)", "R" or "P(sum)")', lambda v: type(v) is str)
)
AXES = optional(either(INT, sequence_of(INT)))
