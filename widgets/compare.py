"""Two strategies side by side: both Gantt charts on one time axis, both memory curves.

>>> import ir
>>> from ir import models, transforms
>>> f = transforms.training(models.mlp(8, 4, 8, 4, layers=2))
>>> topology = ir.Topology.preset("a100-hgx", 2)
>>> a = ir.simulate(transforms.data_parallel(f, 2), topology)
>>> b = ir.simulate(transforms.pipeline_parallel(f, 2, 2), topology)
>>> fig = compare_figure(a, b, labels=("data parallel", "pipeline"))
>>> fig.layout.title.text.startswith("data parallel vs pipeline")
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ir.function import Function

from .gantt import gantt_traces
from .memory import memory_traces, y_top_bytes
from .units import byte_unit, format_bytes, format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult


def compare_figure(
    a: SimResult,
    b: SimResult,
    *,
    function_a: Function | None = None,
    function_b: Function | None = None,
    labels: tuple[str, str] = ("A", "B"),
    title: str | None = None,
) -> go.Figure:
    """Gantt of ``a`` above Gantt of ``b`` (shared time axis), then both memory curves.

    ``a``'s memory curves are solid, ``b``'s dashed; both share one byte unit. The one
    legend names the Gantt's kinds of bar; each memory curve has its device's colour
    (named on hover), as that device's compute bars.
    """
    end_s = max(a.step_time_s, b.step_time_s)
    t_unit = time_unit(end_s)
    peak = max([*a.peak_memory_bytes.values(), *b.peak_memory_bytes.values(), 1.0])
    b_unit = byte_unit(peak)
    traces_a, rows_a = gantt_traces(a, function_a, unit=t_unit, prefix=f"{labels[0]}: ")
    traces_b, rows_b = gantt_traces(
        b, function_b, unit=t_unit, prefix=f"{labels[1]}: ", showlegend=False
    )
    heights = [max(len(rows_a), 1), max(len(rows_b), 1), max(len(rows_a), len(rows_b), 4)]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        row_heights=[h / sum(heights) for h in heights],
        subplot_titles=[
            _summary(labels[0], a),
            _summary(labels[1], b),
            f"live memory ({b_unit[0]}) per device, in its Gantt colour: {labels[0]} "
            f"solid, {labels[1]} dashed",
        ],
    )
    for row, traces in ((1, traces_a), (2, traces_b)):
        for trace in traces:
            fig.add_trace(trace, row=row, col=1)
    for label, result, dash in ((labels[0], a, "solid"), (labels[1], b, "dash")):
        for trace in memory_traces(
            result,
            time_unit_=t_unit,
            bytes_unit=b_unit,
            prefix=f"{label}: ",
            dash=dash,
            end_s=end_s,
        ):
            # one legend for the chart: the Gantt's kinds of bar. A curve per device and
            # strategy listed beside them said nothing the colours and titles do not.
            fig.add_trace({**trace, "showlegend": False}, row=3, col=1)
    for row, rows in ((1, rows_a), (2, rows_b)):
        fig.update_yaxes(
            tickmode="array",
            tickvals=list(range(len(rows))),
            ticktext=rows,
            autorange="reversed",
            row=row,
            col=1,
        )
    capacity = min(r.topology.device(d).memory_bytes for r in (a, b) for d in r.devices)
    top = y_top_bytes(peak, capacity) * 1.15 / b_unit[1]
    fig.update_yaxes(title_text=b_unit[0], range=[0, top], row=3, col=1)
    fig.update_xaxes(title_text=f"time ({t_unit[0]})", row=3, col=1)
    fig.update_layout(
        barmode="overlay",
        title=title or f"{labels[0]} vs {labels[1]}",
        height=260 + 26 * sum(heights),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        template="plotly_white",
    )
    return fig


def _summary(label: str, result: SimResult) -> str:
    peak = max(result.peak_memory_bytes.values(), default=0.0)
    return f"{label}: step {format_time(result.step_time_s)}, peak {format_bytes(peak)}"
