"""Live charts that redraw in place, and what a figure draws.

The dashboard keeps one :class:`~widgets.chart.Chart` per view and hands it the new
traces and layout as plain dicts (:func:`show`); the browser redraws it with
``Plotly.react``, which changes only what differs. Trace builders' dicts are validated
whenever a figure is built from them (the static figures, :meth:`Chart.to_figure`), and
the tests check that an updated chart draws what a figure built anew draws
(:func:`plotted`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .chart import TEMPLATE, Chart, from_typed_array, typed_array

__all__ = ["TEMPLATE", "from_typed_array", "live_figure", "plotted", "show", "typed_array"]


def live_figure(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> Chart:
    """A live :class:`~widgets.chart.Chart` of ``traces`` and ``layout``."""
    return Chart(traces, layout)


def show(chart: Chart, traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> None:
    """Make ``chart`` show ``traces`` and ``layout``."""
    chart.show(traces, layout)


def plotted(figure: go.Figure | Chart) -> tuple[list[Any], dict[str, Any]]:
    """What plotly.js draws: the figure's traces and layout as JSON, typed arrays
    decoded to lists, the template aside. Plotly writes a numpy array as base64 or
    as a list depending on how it was set; the drawing is the same."""
    if isinstance(figure, Chart):
        figure = figure.to_figure()
    spec = _decoded(json.loads(pio.to_json(figure)))
    spec["layout"].pop("template", None)
    return spec["data"], spec["layout"]


def _decoded(node: Any) -> Any:
    if isinstance(node, dict) and "bdata" in node and "dtype" in node:
        return from_typed_array(node).tolist()
    if isinstance(node, dict):
        return {k: _decoded(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_decoded(v) for v in node]
    return node
