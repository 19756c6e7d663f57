"""Jupyter views of DistIR programs: the clickable graph, the Gantt chart, the
memory curves, strategy comparison, and static HTML exports of each.

Payloads (SVG, id maps, plotly figures, HTML) come from pure functions that are
tested without a browser; the widgets only display them and report clicks.
"""

from __future__ import annotations

from .graph import GraphOptions, LegendEntry, RenderedGraph, legend_html, render_graph
from .graph_widget import GraphView, Selection
from .ids import op_id, op_paths, shape_label, value_names
from .palette import device_color
from .svg import GraphvizError

__all__ = [
    "GraphOptions",
    "GraphView",
    "GraphvizError",
    "LegendEntry",
    "RenderedGraph",
    "Selection",
    "device_color",
    "legend_html",
    "op_id",
    "op_paths",
    "render_graph",
    "shape_label",
    "value_names",
]
