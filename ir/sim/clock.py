"""The engine's clock: whole ticks of 2**-44 s, so that times add exactly."""

from __future__ import annotations

from math import isfinite

# The engine's clock ticks in 2**-44 s (57 femtoseconds): every duration it adds is
# rounded to a whole number of ticks (``on_clock``), so a time is an integer number of
# ticks and, below 2**9 s, every sum, difference and comparison of times is exact
# (``EXACT_BELOW_S`` is half that: two times below it add exactly). That makes the walk
# shift-invariant: an op sequence whose inputs and streams are all later by the same
# delta ends exactly delta later, which is what lets a repeated task be timed from an
# earlier run of it (``ir.sim.tasks``) with the same result to the last bit. The rounding
# is 3e-14 s per op at most, a part in 10^7 of a one-microsecond kernel.
TICKS_PER_S = 2.0**44
EXACT_BELOW_S = 2.0**8


def on_clock(seconds: float) -> float:
    """``seconds`` rounded to the engine's clock tick (see ``TICKS_PER_S``)."""
    if not isfinite(seconds):
        return seconds
    return round(seconds * TICKS_PER_S) / TICKS_PER_S
