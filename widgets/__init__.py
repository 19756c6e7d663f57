"""Jupyter views of DistIR programs: the clickable graph, the Gantt chart, the
memory curves, strategy comparison, and static HTML exports of each.

Payloads (SVG, id maps, plotly figures, HTML) come from pure functions that are
tested without a browser; the widgets only display them and report clicks.
"""

from __future__ import annotations

from .chart import Chart
from .compare import compare_figure
from .gantt import bar_numbers, connect_clicks, gantt_figure, gantt_spec, gantt_widget, op_id_at
from .gantt_zoom import GanttZoom
from .graph import GraphOptions, LegendEntry, RenderedGraph, legend_html, render_graph
from .graph_widget import GraphView, Selection
from .ids import op_id, op_paths, shape_label, value_names
from .live import live_figure, show
from .measured import measured_vs_simulated_figure, measured_vs_simulated_spec
from .memory import memory_figure, memory_spec
from .palette import device_color
from .pareto import pareto_figure, pareto_spec, picked_annotations, rows_html
from .static_html import (
    compare_page,
    figure_html,
    gantt_page,
    graph_html,
    graph_page,
    memory_page,
    page_html,
    report_page,
)
from .svg import GraphvizError
from .timeline import GanttError

__all__ = [
    "Chart",
    "GanttError",
    "GanttZoom",
    "GraphOptions",
    "GraphView",
    "GraphvizError",
    "LegendEntry",
    "RenderedGraph",
    "Selection",
    "bar_numbers",
    "compare_figure",
    "compare_page",
    "connect_clicks",
    "device_color",
    "figure_html",
    "gantt_figure",
    "gantt_page",
    "gantt_spec",
    "gantt_widget",
    "graph_html",
    "graph_page",
    "legend_html",
    "live_figure",
    "measured_vs_simulated_figure",
    "measured_vs_simulated_spec",
    "memory_figure",
    "memory_page",
    "memory_spec",
    "op_id",
    "op_id_at",
    "op_paths",
    "page_html",
    "pareto_figure",
    "pareto_spec",
    "picked_annotations",
    "render_graph",
    "report_page",
    "rows_html",
    "shape_label",
    "show",
    "value_names",
]
