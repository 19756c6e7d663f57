"""Finding repeated layers in a program, so the graph view can fold them.

A transformer's 24 layers print as the same run of op types 24 times in a row.
:func:`find_repeats` finds such tandem repeats in a sequence of op signatures,
greedily taking the one that hides the most ops first, until the visible count
fits a budget. The first repetition stays visible (the user sees what one layer
is); the others fold into one summary node.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Repeat:
    """``count`` copies of a block of ``period`` ops starting at ``start``."""

    start: int
    period: int
    count: int

    @property
    def folded(self) -> range:
        """Positions hidden by folding: every copy but the first."""
        return range(self.start + self.period, self.start + self.period * self.count)


def find_repeats(
    signatures: Sequence[Hashable],
    *,
    budget: int,
    min_count: int = 3,
    max_period: int = 400,
    min_gain: int = 2,
) -> list[Repeat]:
    """Tandem repeats to fold until at most ``budget`` positions stay visible.

    Each fold replaces its hidden positions by one summary node, so it shows
    ``len(folded) - 1`` fewer things; folds that show fewer than ``min_gain``
    fewer things are not worth a search each. Repeats never overlap. Returned in
    position order.

    >>> find_repeats(list("xabcabcabcabcy"), budget=5)
    [Repeat(start=1, period=3, count=4)]
    """
    codes: dict[Hashable, int] = {}
    sig = np.array([codes.setdefault(s, len(codes)) for s in signatures], dtype=np.int64)
    visible = len(sig)
    found: list[Repeat] = []
    fresh = -1  # folded positions get unique negative codes so no repeat crosses them
    while visible > budget:
        # one scan finds every run; the best ones that do not overlap are all still
        # valid, so take them in order of gain (a run cut by a fold is found again by
        # the next scan, shorter)
        taken = np.zeros(len(sig), dtype=bool)
        picked = 0
        for best in _repeats_by_gain(sig, min_count, max_period, min_gain):
            span = slice(best.start, best.start + best.period * best.count)
            if taken[span].any():
                continue
            taken[span] = True
            found.append(best)
            picked += 1
            visible -= len(best.folded) - 1
            if visible <= budget:
                break
        if not picked:
            break
        k = int(taken.sum())
        sig[taken] = np.arange(fresh, fresh - k, -1)
        fresh -= k
    return sorted(found, key=lambda r: r.start)


def _repeats_by_gain(
    sig: np.ndarray, min_count: int, max_period: int, min_gain: int
) -> list[Repeat]:
    """Every maximal run of each period that gains at least ``min_gain``, best first
    (ties: shorter period, then earlier start); all periods in one 2-D pass."""
    n = len(sig)
    top = min(max_period, n // 2)
    if top < 1:
        return []
    periods = np.arange(1, top + 1)
    later = np.arange(n)[None, :] + periods[:, None]  # position i + p, row p - 1
    inside = later < n
    other = sig[np.minimum(later, n - 1)]
    eq = inside & (sig[None, :] == other) & (other >= 0)
    pad = np.zeros((top, 1), dtype=np.int8)
    edges = np.diff(np.concatenate((pad, eq.astype(np.int8), pad), axis=1), axis=1)
    rows, starts = np.nonzero(edges == 1)  # row-major: runs in (period, start) order
    _, ends = np.nonzero(edges == -1)
    p = periods[rows]
    counts = 1 + (ends - starts) // p
    gains = np.where(counts >= min_count, (counts - 1) * p - 1, 0)
    keep = np.flatnonzero(gains >= min_gain)
    order = keep[np.argsort(-gains[keep], kind="stable")]
    return [Repeat(int(starts[j]), int(p[j]), int(counts[j])) for j in order]
