"""The serving views: the KV cache's memory growing with context, the latency/throughput
front of serving strategies, and the figures of one strategy (pure functions, tested
without a browser; the dashboard's serving mode and the static report draw them).

* :func:`kv_memory_spec`: per GPU of a replica (its busiest device), the weights, the KV
  cache of ``batch`` sequences and the workspace against the context, the usable memory
  line, and the largest batch at each context on a second axis;
* :func:`front_spec`: every (strategy, batch) point as TPOT against tokens per second per
  GPU, one colour per strategy, the Pareto front joined, the SLA a dashed line, the best
  point within it ringed;
* :func:`summary_rows` / :func:`summary_html`: TTFT, TPOT, throughput, memory, the floor.

The decode step's Gantt is :func:`widgets.gantt.gantt_spec` of ``metrics.decode``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from .live import TEMPLATE
from .palette import DEVICE_PALETTE, OOM_COLOR

if TYPE_CHECKING:
    from ir.inference import ServingFront, ServingMetrics

GB = 1e9
FRONT_COLOR = "#222222"
CAPACITY_COLOR = "#7f7f7f"
HOVER = "%{text}<br>TPOT %{x:.2f} ms<br>%{y:.0f} tokens/s/GPU<extra></extra>"


def contexts_of(metrics: ServingMetrics, points: int = 24) -> list[int]:
    """Contexts from one block to the model's last position, ``points`` of them, the
    request mix's final context among them."""
    last = metrics.positions
    step = max(metrics.block_tokens, last // points)
    out = sorted({*range(step, last + 1, step), metrics.mix.final_context, last})
    return [c for c in out if 0 < c <= last]


def kv_memory_spec(
    metrics: ServingMetrics, contexts: Sequence[int] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Traces and layout of the KV-cache memory curve (see the module docstring); every
    trace's ``meta`` says what it is (``{"kind": "weights" | "kv" | "workspace" |
    "usable" | "max_batch"}``)."""
    xs = list(contexts) if contexts is not None else contexts_of(metrics)
    d, mem = max(metrics.memory.items(), key=lambda kv: kv[1].weights_bytes)
    batch = metrics.mix.batch
    weights = [mem.weights_bytes / GB] * len(xs)
    kv = [
        (mem.weights_bytes + batch * metrics.rounded(x) * mem.kv_bytes_per_token) / GB for x in xs
    ]
    work = max(batch * mem.decode_workspace_bytes, mem.prefill_workspace_bytes)
    total = [k + work / GB for k in kv]
    usable = mem.capacity_bytes / GB
    most = [metrics.max_batch(x) for x in xs]
    traces = [
        {
            "name": "weights",
            "x": xs,
            "y": weights,
            "mode": "lines",
            "fill": "tozeroy",
            "line": {"color": DEVICE_PALETTE[0]},
            "meta": {"kind": "weights"},
        },
        {
            "name": f"+ KV cache of {batch} sequences",
            "x": xs,
            "y": kv,
            "mode": "lines",
            "fill": "tonexty",
            "line": {"color": DEVICE_PALETTE[1]},
            "meta": {"kind": "kv"},
        },
        {
            "name": "+ workspace",
            "x": xs,
            "y": total,
            "mode": "lines",
            "fill": "tonexty",
            "line": {"color": DEVICE_PALETTE[2]},
            "meta": {"kind": "workspace"},
        },
        {
            "name": f"usable ({usable:.1f} GB)",
            "x": [xs[0], xs[-1]],
            "y": [usable, usable],
            "mode": "lines",
            "line": {"color": CAPACITY_COLOR, "dash": "dash"},
            "meta": {"kind": "usable"},
        },
        {
            "name": "largest batch",
            "x": xs,
            "y": most,
            "mode": "lines+markers",
            "yaxis": "y2",
            "line": {"color": FRONT_COLOR, "dash": "dot"},
            "marker": {"size": 5},
            "meta": {"kind": "max_batch"},
        },
    ]
    over = [x for x, t in zip(xs, total) if t > usable]
    per_token = metrics.kv_bytes_per_token / 1e3
    title = f"KV cache on GPU {d} ({metrics.strategy.label}): {per_token:.0f} kB a token"
    if over:
        title += f" · {batch} sequences overflow from context {over[0]}"
    layout = {
        "title": {"text": title},
        "xaxis": {"title": {"text": "context (tokens)"}},
        "yaxis": {"title": {"text": "memory per GPU (GB)"}, "rangemode": "tozero"},
        "yaxis2": {
            "title": {"text": "largest batch"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"l": 10, "r": 10, "t": 40, "b": 40},
        "height": 320,
    }
    if over:
        layout["shapes"] = [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": over[0],
                "x1": xs[-1],
                "y0": 0,
                "y1": 1,
                "fillcolor": OOM_COLOR,
                "opacity": 0.08,
                "line": {"width": 0},
            }
        ]
    return traces, layout


def _label(m: ServingMetrics) -> str:
    return f"{m.strategy.label}, batch {m.mix.batch}"


def front_spec(front: ServingFront) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Traces and layout of the latency/throughput front (see the module docstring); each
    point's ``customdata`` is its strategy's label and batch (what a click selects)."""
    traces: list[dict[str, Any]] = []
    by_strategy: dict[str, list[ServingMetrics]] = {}
    for m in front.points:
        by_strategy.setdefault(m.strategy.label, []).append(m)
    for k, (label, points) in enumerate(by_strategy.items()):
        points = sorted(points, key=lambda m: m.mix.batch)
        traces.append(
            {
                "name": label,
                "x": [m.tpot_s * 1e3 for m in points],
                "y": [m.tokens_per_s_per_gpu for m in points],
                "text": [_label(m) for m in points],
                "customdata": [[m.strategy.label, m.mix.batch] for m in points],
                "mode": "lines+markers",
                "line": {"color": DEVICE_PALETTE[k % len(DEVICE_PALETTE)], "width": 1},
                "marker": {"size": 8},
                "hovertemplate": HOVER,
                "meta": {"kind": "strategy", "strategy": label},
            }
        )
    pareto = front.pareto()
    traces.append(
        {
            "name": "front",
            "x": [m.tpot_s * 1e3 for m in pareto],
            "y": [m.tokens_per_s_per_gpu for m in pareto],
            "text": [_label(m) for m in pareto],
            "mode": "lines",
            "line": {"color": FRONT_COLOR, "shape": "hv", "dash": "dot"},
            "hoverinfo": "skip",
            "meta": {"kind": "front"},
        }
    )
    best = front.best()
    if best is not None:
        traces.append(
            {
                "name": f"best within SLA: {_label(best)}",
                "x": [best.tpot_s * 1e3],
                "y": [best.tokens_per_s_per_gpu],
                "text": [_label(best)],
                "mode": "markers",
                "marker": {
                    "size": 18,
                    "color": "rgba(0,0,0,0)",
                    "line": {"color": OOM_COLOR, "width": 2},
                },
                "meta": {"kind": "best", "strategy": best.strategy.label, "batch": best.mix.batch},
            }
        )
    sla_ms = front.sla_tpot_s * 1e3
    layout = {
        "title": {"text": f"latency / throughput · SLA TPOT ≤ {sla_ms:g} ms"},
        "xaxis": {"title": {"text": "time per output token (ms)"}, "rangemode": "tozero"},
        "yaxis": {"title": {"text": "tokens/s per GPU"}, "rangemode": "tozero"},
        "shapes": [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": sla_ms,
                "x1": sla_ms,
                "y0": 0,
                "y1": 1,
                "line": {"color": OOM_COLOR, "dash": "dash"},
            }
        ],
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"l": 10, "r": 10, "t": 40, "b": 40},
        "height": 360,
    }
    return traces, layout


def summary_rows(metrics: ServingMetrics) -> list[tuple[str, str]]:
    """(figure, value) pairs of one strategy serving one request mix."""
    m = metrics
    mem = max(m.memory.values(), key=lambda x: x.weights_bytes)
    host = " (CUDA graphs)" if m.cuda_graphs else " (eager)"
    cache = m.kv_bytes(m.mix.batch, m.mix.final_context) / GB
    fits = "" if m.fits else f" (batch {m.mix.batch} does not fit)"
    return [
        ("strategy", f"{m.strategy.label} on {m.topology}"),
        ("requests", f"prompt {m.mix.prompt_len}, output {m.mix.output_len}, batch {m.mix.batch}"),
        ("time to first token", f"{m.ttft_s * 1e3:.1f} ms"),
        ("time per output token", f"{m.tpot_s * 1e3:.2f} ms{host}"),
        (
            "memory floor, MBU",
            f"{m.decode_floor_s * 1e3:.2f} ms, {m.memory_bandwidth_utilization:.0%}",
        ),
        (
            "decode throughput",
            f"{m.tokens_per_s_per_gpu:.0f} tokens/s/GPU, {m.tokens_per_s:.0f} all",
        ),
        ("request latency", f"{m.latency_s * 1e3:.0f} ms"),
        ("weights per GPU", f"{mem.weights_bytes / GB:.2f} GB"),
        ("KV cache", f"{m.kv_bytes_per_token / 1e3:.1f} kB a token, {cache:.2f} GB for the batch"),
        ("largest batch", f"{m.max_batch()} at context {m.mix.final_context}{fits}"),
    ]


def summary_html(metrics: ServingMetrics) -> str:
    """:func:`summary_rows` as a small HTML table."""
    rows = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
        f"<td>{html.escape(v)}</td></tr>"
        for k, v in summary_rows(metrics)
    )
    return f"<table class='distir-serving-summary'>{rows}</table>"


def kv_memory_figure(metrics: ServingMetrics, contexts: Sequence[int] | None = None) -> go.Figure:
    traces, layout = kv_memory_spec(metrics, contexts)
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})


def front_figure(front: ServingFront) -> go.Figure:
    traces, layout = front_spec(front)
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})
