"""Readable units for axes and hover text."""

from __future__ import annotations

_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))
_BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1.0))


def time_unit(span_s: float) -> tuple[str, float]:
    """The unit to show a span of ``span_s`` seconds in, and seconds per unit.

    >>> time_unit(0.012)
    ('ms', 0.001)
    """
    for name, size in _TIME_UNITS:
        if span_s >= size:
            return name, size
    return _TIME_UNITS[-1]


def byte_unit(size_bytes: float) -> tuple[str, float]:
    """The unit to show ``size_bytes`` in, and bytes per unit (decimal: 1 GB = 1e9 B).

    >>> byte_unit(3.2e9)
    ('GB', 1000000000.0)
    """
    for name, size in _BYTE_UNITS:
        if size_bytes >= size:
            return name, size
    return _BYTE_UNITS[-1]


def format_bytes(size_bytes: float) -> str:
    """``3.2 GB``, ``512 B``."""
    name, size = byte_unit(size_bytes)
    return f"{size_bytes / size:.3g} {name}"


def format_time(t_s: float) -> str:
    """``12.3 ms``, ``4 µs``."""
    name, size = time_unit(t_s)
    return f"{t_s / size:.4g} {name}"


def format_flops(flops: float) -> str:
    """``1.5 GFLOP``."""
    for name, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= size:
            return f"{flops / size:.3g} {name}"
    return f"{flops:.3g} FLOP"
