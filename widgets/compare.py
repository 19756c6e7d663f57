"""Two strategies side by side: two aligned Gantt charts on one time axis, then both
memory curves.

Each Gantt keeps the short row labels of a single one (``dev 3 · comp``); its title
names the strategy (``A: dp=8 · step 1.2 ms · peak 3.1 GB``) at the left, above its
own rows, so titles never sit on each other or on the bars. The one legend (devices,
communication, idle) is under the chart.

>>> import ir
>>> from ir import models, transforms
>>> f = transforms.training(models.mlp(8, 4, 8, 4, layers=2))
>>> topology = ir.Topology.preset("a100-hgx", 2)
>>> a = ir.simulate(transforms.data_parallel(f, 2), topology)
>>> b = ir.simulate(transforms.pipeline_parallel(f, 2, 2), topology)
>>> fig = compare_figure(a, b, labels=("data parallel", "pipeline"))
>>> fig.layout.title.text
'data parallel vs pipeline'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ir.function import Function

from .gantt import LEGEND_ROW_PX, ROW_PX, legend_rows
from .gantt_bars import gantt_traces
from .live import TEMPLATE
from .memory import memory_traces, y_top_bytes
from .units import byte_unit, format_bytes, format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

MEMORY_PX = 220  # the memory curves' panel
GAP_PX = 56  # between panels: room for the next panel's title


def compare_figure(
    a: SimResult,
    b: SimResult,
    *,
    function_a: Function | None = None,
    function_b: Function | None = None,
    labels: tuple[str, str] = ("A", "B"),
    title: str | None = None,
) -> go.Figure:
    """Gantt of ``a`` above Gantt of ``b`` (one time axis), then both memory curves.

    ``a``'s memory curves are solid, ``b``'s dashed; both share one byte unit. The one
    legend names each device's colour, communication and idle; a memory curve has its
    device's colour too (named on hover).
    """
    end_s = max(a.step_time_s, b.step_time_s)
    t_unit = time_unit(end_s)
    peak = max([*a.peak_memory_bytes.values(), *b.peak_memory_bytes.values(), 1.0])
    b_unit = byte_unit(peak)
    traces_a, rows_a = gantt_traces(a, function_a, unit=t_unit)
    traces_b, rows_b = gantt_traces(b, function_b, unit=t_unit, showlegend=False)
    for label, traces in ((labels[0], traces_a), (labels[1], traces_b)):
        for trace in traces:  # hover says which strategy; the rows stay short
            if "hovertemplate" in trace:
                extra = f"<extra>{label}: "
                trace["hovertemplate"] = trace["hovertemplate"].replace("<extra>", extra)
    # the legend: every device of either (the first chart's entries, plus B's others)
    shown_a = {t["legendgroup"] for t in traces_a if t["showlegend"]}
    for trace in traces_b:
        group = trace.get("legendgroup")
        if group is not None and group not in shown_a:
            trace["showlegend"] = True
            shown_a.add(group)
    entries = len(shown_a)
    legend_px = LEGEND_ROW_PX * legend_rows(entries)
    heights = [ROW_PX * len(rows_a), ROW_PX * len(rows_b), MEMORY_PX]
    top, bottom = 40, 44 + legend_px
    height = top + bottom + sum(heights) + 2 * GAP_PX
    plot_px = height - top - bottom
    domains, y = [], 1.0
    for h in heights:  # paper fractions, top to bottom, GAP_PX apart
        domains.append([max(0.0, y - h / plot_px), y])
        y -= (h + GAP_PX) / plot_px
    data: list[dict[str, Any]] = []
    for x_axis, y_axis, traces in (("x2", "y", traces_a), ("x3", "y2", traces_b)):
        data += [{**t, "xaxis": x_axis, "yaxis": y_axis} for t in traces]
    for label, result, dash in ((labels[0], a, "solid"), (labels[1], b, "dash")):
        for trace in memory_traces(
            result,
            time_unit_=t_unit,
            bytes_unit=b_unit,
            prefix=f"{label}: ",
            dash=dash,
            end_s=end_s,
        ):
            data.append({**trace, "showlegend": False, "xaxis": "x", "yaxis": "y3"})
    capacity = min(r.topology.device(d).memory_bytes for r in (a, b) for d in r.devices)
    y_top = y_top_bytes(peak, capacity) * 1.15 / b_unit[1]
    x_range = [0, end_s / t_unit[1] * 1.01]

    def rows_axis(rows: list[str], domain: list[float]) -> dict[str, Any]:
        ticks = list(range(len(rows)))
        return {
            "domain": domain,
            "tickmode": "array",
            "tickvals": ticks,
            "ticktext": rows,
            "autorange": "reversed",
        }

    titles = [
        _summary(labels[0], a),
        _summary(labels[1], b),
        f"live memory per device, in its colour: {labels[0]} solid, {labels[1]} dashed",
    ]
    layout = {
        "barmode": "overlay",
        "title": {"text": title or f"{labels[0]} vs {labels[1]}", "x": 0, "xanchor": "left"},
        "height": height,
        "margin": {"l": 10, "r": 10, "t": top, "b": bottom},
        "xaxis": {"anchor": "y3", "range": x_range, "title": {"text": f"time ({t_unit[0]})"}},
        "yaxis": rows_axis(rows_a, domains[0]),
        "yaxis2": rows_axis(rows_b, domains[1]),
        "yaxis3": {"domain": domains[2], "range": [0, y_top], "title": {"text": b_unit[0]}},
        "annotations": [
            {
                "text": f"<b>{text}</b>" if i < 2 else text,
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "xanchor": "left",
                "y": domains[i][1],
                "yanchor": "bottom",
                "yshift": 4,
                "showarrow": False,
            }
            for i, text in enumerate(titles)
        ],
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
        },
        "hoverlabel": {"align": "left"},
    }
    # every panel shows the one time axis, zoomed together
    layout["xaxis2"] = {"matches": "x", "anchor": "y"}
    layout["xaxis3"] = {"matches": "x", "anchor": "y2"}
    return go.Figure(data=data, layout={**layout, "template": TEMPLATE})


def _summary(label: str, result: SimResult) -> str:
    peak = max(result.peak_memory_bytes.values(), default=0.0)
    return f"{label} · step {format_time(result.step_time_s)} · peak {format_bytes(peak)}"
