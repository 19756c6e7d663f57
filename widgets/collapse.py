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
        best = _best_repeat(sig, min_count, max_period, min_gain)
        if best is None:
            break
        found.append(best)
        for i in range(best.start, best.start + best.period * best.count):
            sig[i] = fresh
            fresh -= 1
        visible -= len(best.folded) - 1
    return sorted(found, key=lambda r: r.start)


def _best_repeat(sig: np.ndarray, min_count: int, max_period: int, min_gain: int) -> Repeat | None:
    """The repeat that hides the most positions; all periods at once (one 2-D pass)."""
    n = len(sig)
    top = min(max_period, n // 2)
    if top < 1:
        return None
    periods = np.arange(1, top + 1)
    later = np.arange(n)[None, :] + periods[:, None]  # position i + p, row p - 1
    inside = later < n
    other = sig[np.minimum(later, n - 1)]
    eq = inside & (sig[None, :] == other) & (other >= 0)
    pad = np.zeros((top, 1), dtype=np.int8)
    edges = np.diff(np.concatenate((pad, eq.astype(np.int8), pad), axis=1), axis=1)
    rows, starts = np.nonzero(edges == 1)  # row-major: runs in (period, start) order
    if not len(rows):
        return None
    _, ends = np.nonzero(edges == -1)
    p = periods[rows]
    counts = 1 + (ends - starts) // p
    gains = np.where(counts >= min_count, (counts - 1) * p - 1, 0)
    j = int(np.argmax(gains))  # first of the best, as a scan by period then start finds
    if gains[j] < min_gain:
        return None
    return Repeat(int(starts[j]), int(p[j]), int(counts[j]))
