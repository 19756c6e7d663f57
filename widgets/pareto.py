"""The search's picture: every simulated strategy as a point of peak memory and step time,
the Pareto front joined, points over a device's capacity crossed out.

:func:`pareto_spec` computes what is drawn (tested without a browser);
:func:`pareto_figure` makes it a plotly figure. Two picked strategies are labelled on it
(:func:`picked_annotations`) and their figures tabled side by side (:func:`rows_html`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from .live import TEMPLATE
from .memory import CAPACITY_OFF_SCALE
from .palette import OOM_COLOR, STRATEGY_COLOR, STRATEGY_SYMBOLS
from .units import format_bytes, format_time

if TYPE_CHECKING:
    from ir.search import Row, SearchResult

FRONT_COLOR = "#222222"


def pareto_spec(result: SearchResult, capacity_bytes: float | None = None) -> dict[str, Any]:
    """Traces (one per pipeline degree, then the front, then the strategies over capacity)
    and the layout: memory in GiB on x, step time in ms on y, the strategy on hover.

    ``capacity_bytes`` is drawn as a dashed line, unless it lies more than
    :data:`~widgets.memory.CAPACITY_OFF_SCALE` times beyond the largest peak drawn: then
    the title gives it, and the points keep the width of the plot.
    """
    gib, ms = 2**-30, 1e3
    traces: list[dict[str, Any]] = []
    by_pp: dict[int, list] = {}
    for row in result.rows:
        if row.status == "ok":
            by_pp.setdefault(row.strategy.pp, []).append(row)
    for k, (pp, rows) in enumerate(sorted(by_pp.items())):
        traces.append(
            {
                "name": f"pp = {pp}",
                "mode": "markers",
                "x": [r.peak_memory_bytes * gib for r in rows],
                "y": [r.step_time_s * ms for r in rows],
                "text": [str(r.strategy) for r in rows],
                # a shape per pipeline degree, one colour: colours are devices' elsewhere
                "marker": {
                    "color": STRATEGY_COLOR,
                    "symbol": STRATEGY_SYMBOLS[k % len(STRATEGY_SYMBOLS)],
                    "size": 9,
                    "opacity": 0.8,
                },
            }
        )
    front = result.pareto()
    traces.append(
        {
            "name": "Pareto front",
            "mode": "lines+markers",
            "x": [r.peak_memory_bytes * gib for r in front],
            "y": [r.step_time_s * ms for r in front],
            "text": [str(r.strategy) for r in front],
            "line": {"color": FRONT_COLOR, "shape": "hv", "dash": "dot"},
            "marker": {"color": "rgba(0,0,0,0)", "size": 14, "line": {"color": FRONT_COLOR}},
        }
    )
    over = [r for r in result.rows if r.status == "over capacity"]
    if over:
        traces.append(
            {
                "name": "over capacity",
                "mode": "markers",
                "x": [r.peak_memory_bytes * gib for r in over],
                "y": [r.step_time_s * ms for r in over],
                "text": [str(r.strategy) for r in over],
                "marker": {"color": OOM_COLOR, "symbol": "x", "size": 9},
            }
        )
    shapes = []
    drawn = [r.peak_memory_bytes for r in result.rows if r.status in ("ok", "over capacity")]
    note = ""
    if capacity_bytes is not None and capacity_bytes > CAPACITY_OFF_SCALE * max(drawn, default=0):
        # a line at 80 GB beside points under 1 GB squeezes them all onto the axis
        note = f"; capacity {capacity_bytes * gib:.3g} GiB per device, far to the right"
        capacity_bytes = None
    if capacity_bytes is not None:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": capacity_bytes * gib,
                "x1": capacity_bytes * gib,
                "y0": 0,
                "y1": 1,
                "line": {"color": OOM_COLOR, "dash": "dash"},
            }
        )
    counts = {
        s: sum(r.status == s for r in result.rows)
        for s in ("ok", "pruned", "estimated", "error", "cancelled")
    }
    cancelled = f", {counts['cancelled']} cancelled" if counts["cancelled"] else ""
    # a two-tier search: the strategies estimated only (beyond the front's reach)
    estimated = f", {counts['estimated']} estimated" if counts["estimated"] else ""
    layout = {
        # two short lines at the left: the chart's width, not the title's, sets the layout
        "title": {
            "text": (
                "Step time against peak memory<br><span style='font-size:12px'>"
                f"{counts['ok']} strategies simulated{estimated}, {counts['pruned']} pruned, "
                f"{counts['error']} refused{cancelled}{note}</span>"
            ),
            "x": 0,
            "xanchor": "left",
        },
        "xaxis": {"title": {"text": "peak memory per device (GiB)"}},
        "yaxis": {"title": {"text": "step time (ms)"}},
        "hovermode": "closest",
        "shapes": shapes,
        "height": 420,
        "margin": {"l": 10, "r": 10, "t": 64, "b": 40},
        "legend": {"title": {"text": "pipeline degree"}},
    }
    return {"traces": traces, "layout": layout}


def pareto_figure(result: SearchResult, capacity_bytes: float | None = None) -> go.Figure:
    """The figure of :func:`pareto_spec`."""
    spec = pareto_spec(result, capacity_bytes)
    figure = go.Figure(layout={**spec["layout"], "template": TEMPLATE})
    for trace in spec["traces"]:
        figure.add_trace(go.Scatter(hovertemplate="%{text}<extra></extra>", **trace))
    return figure


def picked_annotations(rows: Sequence[Row], labels: Sequence[str] = "AB") -> list[dict[str, Any]]:
    """One plotly annotation per picked row: its label (``A``, ``B``) with an arrow to its
    point (peak memory in GiB, step time in ms, as :func:`pareto_spec` draws it)."""
    return [
        {
            "x": row.peak_memory_bytes * 2**-30,
            "y": row.step_time_s * 1e3,
            "xref": "x",
            "yref": "y",
            "text": f"<b>{html.escape(label)}</b>",
            "showarrow": True,
            "arrowhead": 2,
            "ax": 18,
            "ay": -24,
            "font": {"color": FRONT_COLOR, "size": 14},
        }
        for label, row in zip(labels, rows)
    ]


_FIGURES = (  # (heading, how a row's figure is written)
    ("step time", lambda r: format_time(r.step_time_s)),
    ("samples/s", lambda r: f"{r.samples_per_s:.4g}"),
    ("MFU", lambda r: f"{r.mfu:.1%}"),
    ("peak memory per device", lambda r: format_bytes(r.peak_memory_bytes)),
    ("exposed communication", lambda r: format_time(r.exposed_comm_s)),
    ("bubble", lambda r: f"{r.bubble:.1%}"),
)


def rows_html(rows: Sequence[Row], labels: Sequence[str] = "AB") -> str:
    """The search's figures of ``rows`` side by side: an HTML table with one column per
    row (headed ``label: strategy``), one line per figure; a row not simulated says why."""
    head = "".join(
        f"<th>{html.escape(label)}: {html.escape(str(r.strategy))}</th>"
        for label, r in zip(labels, rows)
    )
    lines = []
    for heading, shown in _FIGURES:
        cells = "".join(
            f"<td>{'' if math.isnan(r.step_time_s) else html.escape(shown(r))}</td>" for r in rows
        )
        lines.append(f"<tr><th>{heading}</th>{cells}</tr>")
    if any(r.error for r in rows):
        cells = "".join(f"<td>{html.escape(r.error or '')}</td>" for r in rows)
        lines.append(f"<tr><th>why not simulated</th>{cells}</tr>")
    return (
        '<table class="distir-search-rows"><tr><th></th>'
        + head
        + "</tr>"
        + "".join(lines)
        + "</table>"
    )


__all__ = ["pareto_figure", "pareto_spec", "picked_annotations", "rows_html"]
