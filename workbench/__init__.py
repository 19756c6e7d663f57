"""The workbench: a notebook session over a DistIR program, its dashboard and the CLI.

``Workbench(function, topology)`` in a notebook shows the dashboard: the graph
coloured by device (click a value to select it), the sharding editor, the
ready transforms (data / horizontal / pipeline degrees), and the simulated
Gantt chart and memory curves, all updated after every change. The state
behind it is :class:`workbench.session.Session` (pure Python, with undo and
redo); :func:`workbench.report.write_report` writes the same views as one
self-contained HTML file. ``python -m workbench lab`` opens the tutorials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .session import Session, SessionError, State, Strategy

__version__ = "0.1.0"  # the package's one version (pyproject.toml reads it)

if TYPE_CHECKING:
    from .dashboard import Workbench

__all__ = ["Session", "SessionError", "State", "Strategy", "Workbench", "__version__"]


def __getattr__(name: str) -> Any:
    # The dashboard imports ipywidgets and anywidget; the CLI and the report do not need them.
    if name == "Workbench":
        from .dashboard import Workbench

        return Workbench
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
