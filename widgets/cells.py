"""Widgets that live as long as the cell output that shows them.

ipywidgets keeps every widget a kernel made until it is closed, and a reloaded page
restores all of them: run a notebook's cells ten times and the kernel holds ten
dashboards, of which the page shows one (a workbench is about 230 widget models and
1 MB of state). :func:`own_by_cell` ties a top-level widget to the cell whose run made
it: when that cell runs again, what its earlier runs made is closed (their views left
the page with the cell's old output). The cell is the one the front end names in the
request it runs (JupyterLab, Notebook 7 and nbclient send its id); where none is named
(a plain script, another front end) nothing is ever closed.

:func:`held_widgets` finds what a top-level widget holds: the widgets reachable from it
through synced traits and through the attributes of this project's own objects (hidden
panels, charts kept for a later state), never the one plotly.js model the kernel shares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ipywidgets

from .chart import PlotlyLibrary

__all__ = ["current_run", "held_widgets", "own_by_cell"]

_OURS = ("widgets", "workbench")
# cell id -> (the request that ran it last, the close of each owner that run made)
_BY_CELL: dict[str, tuple[str, list[Callable[[], None]]]] = {}


def current_run() -> tuple[str, str] | None:
    """(cell id, request id) of the cell the kernel is running, or ``None`` where the
    front end names no cell or no kernel runs this code."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or not hasattr(kernel, "get_parent"):
        return None
    parent = kernel.get_parent("shell") or {}
    if (parent.get("header") or {}).get("msg_type") != "execute_request":
        return None  # a click's handler, say: no cell runs
    cell = (parent.get("metadata") or {}).get("cellId")
    request = (parent.get("header") or {}).get("msg_id")
    return (str(cell), str(request)) if cell and request else None


def own_by_cell(close: Callable[[], None]) -> None:
    """Register ``close`` (a top-level widget's) with the running cell (:func:`current_run`),
    first calling the closes that the cell's earlier runs registered."""
    run = current_run()
    if run is None:
        return
    cell, request = run
    last, closes = _BY_CELL.get(cell, (request, []))
    if last != request:
        for earlier in closes:
            earlier()
        closes = []
    closes.append(close)
    _BY_CELL[cell] = (request, closes)


def held_widgets(root: Any) -> Iterator[ipywidgets.Widget]:
    """Every widget ``root`` holds (``root`` first if it is one), each once; the shared
    plotly.js model is left out."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        x = todo.pop()
        if id(x) in seen or isinstance(x, PlotlyLibrary):
            continue
        seen.add(id(x))
        if isinstance(x, ipywidgets.Widget):
            yield x
            todo.extend(getattr(x, name, None) for name in x.keys)
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, list | tuple | set | frozenset):
            todo.extend(x)
        elif type(x).__module__.split(".")[0] in _OURS and hasattr(x, "__dict__"):
            todo.extend(vars(x).values())
