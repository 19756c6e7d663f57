"""What the dashboard drew for each state, kept while the state may come back.

Undo, Redo and a search point already simulated come back to a state the session has
derived; drawing it again (its Gantt's thousands of bars, graphviz's layout of its
graph) took most of such a click. :class:`Drawings` keeps the chart specs and the graph
drawing of the last few states, keyed as the session keys its derived states (by
:class:`~workbench.session.State`) and the graph by what it was drawn from, and forgets
the oldest: what a session holds stays bounded however long it runs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from widgets.graph import RenderedGraph

from .lru import KEEP, Lru

__all__ = ["Charts", "Drawings"]


@dataclass(frozen=True)
class Charts:
    """The Gantt's and the memory view's specs (traces, layout) and the breakdown's HTML
    of one derived state."""

    gantt: tuple[list[dict[str, Any]], dict[str, Any]]
    memory: tuple[list[dict[str, Any]], dict[str, Any]]
    breakdown: str


class Drawings:
    """The charts of the last :data:`KEEP` states and the graphs of their drawings."""

    def __init__(self, size: int = KEEP) -> None:
        self.charts: Lru[Hashable, Charts] = Lru(size)
        self.graphs: Lru[Hashable, RenderedGraph] = Lru(size)
