"""A picture of a device mesh: which device is which stage, replica and tensor rank, and
which devices talk to which.

Each pipeline stage is a panel, left to right; in it, one row per data-parallel replica
and one column per tensor rank. A device is a square in its colour (the colour it has in
every view) with its number; a row of a stage is a tensor-parallel group (its devices
all-reduce activations in every layer), a column a data-parallel group (they all-reduce
the gradients of the shard they hold), and activations go from each stage to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from .chart import TEMPLATE
from .palette import COMMUNICATION_COLOR, device_color

__all__ = ["megatron_device", "mesh_figure"]

CELL = 1.0  # a device's square, in plot units
GAP = 0.25  # between squares
STAGE_GAP = 1.2  # between stages


def megatron_device(s: int, i: int, j: int, dp: int, tp: int) -> int:
    """Megatron-LM's rank of stage ``s``, replica ``i``, tensor rank ``j`` (what
    ``ir.transforms.megatron`` numbers devices by): ``s·dp·tp + i·tp + j``.

    >>> megatron_device(1, 0, 1, dp=2, tp=2)
    5
    """
    return s * dp * tp + i * tp + j


def mesh_figure(
    dp: int,
    tp: int,
    pp: int,
    device: Callable[[int, int, int], int] | None = None,
    *,
    title: str | None = None,
) -> go.Figure:
    """The mesh of ``dp x tp x pp`` devices; ``device(s, i, j)`` numbers them (default:
    :func:`megatron_device`)."""
    number = device or (lambda s, i, j: megatron_device(s, i, j, dp, tp))
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    xs, ys, texts = [], [], []
    stage_w = tp * CELL + (tp - 1) * GAP
    height = dp * CELL + (dp - 1) * GAP
    for s in range(pp):
        x0 = s * (stage_w + STAGE_GAP)
        shapes.append(_rect(x0 - GAP, -GAP, x0 + stage_w + GAP, height + GAP, "#f7f7f7", "#999"))
        notes.append(_text(x0 + stage_w / 2, height + GAP + 0.25, f"<b>stage {s}</b>", 13))
        if s + 1 < pp:  # activations forward (and gradients back) to the next stage
            notes.append(
                {
                    "x": x0 + stage_w + STAGE_GAP - GAP,
                    "y": height / 2,
                    "ax": x0 + stage_w + GAP,
                    "ay": height / 2,
                    "xref": "x",
                    "yref": "y",
                    "axref": "x",
                    "ayref": "y",
                    "showarrow": True,
                    "arrowhead": 2,
                    "arrowwidth": 2,
                    "arrowcolor": COMMUNICATION_COLOR,
                    "text": "",
                }
            )
        for i in range(dp):
            y0 = (dp - 1 - i) * (CELL + GAP)
            if tp > 1:  # a tensor-parallel group: the replica's row in this stage
                shapes.append(
                    _rect(
                        x0 - GAP / 2,
                        y0 - GAP / 2,
                        x0 + stage_w + GAP / 2,
                        y0 + CELL + GAP / 2,
                        "rgba(0,0,0,0)",
                        COMMUNICATION_COLOR,
                        dash="dot",
                    )
                )
            for j in range(tp):
                d = number(s, i, j)
                cx0 = x0 + j * (CELL + GAP)
                shapes.append(_rect(cx0, y0, cx0 + CELL, y0 + CELL, device_color(d), "#ffffff"))
                notes.append(_text(cx0 + CELL / 2, y0 + CELL * 0.62, f"<b>{d}</b>", 15))
                notes.append(_text(cx0 + CELL / 2, y0 + CELL * 0.25, f"i{i} j{j}", 10))
                xs.append(cx0 + CELL / 2)
                ys.append(y0 + CELL / 2)
                texts.append(
                    f"device {d}: stage {s}, replica {i}, tensor rank {j}<br>"
                    f"tensor group: {[number(s, i, k) for k in range(tp)]}<br>"
                    f"data-parallel group: {[number(s, k, j) for k in range(dp)]}"
                )
    width = pp * stage_w + (pp - 1) * STAGE_GAP
    layout = {
        "title": {
            "text": title
            or f"{dp * tp * pp} devices as dp={dp} x tp={tp} x pp={pp}: rows (dotted) are "
            "tensor-parallel groups, columns data-parallel groups",
            "x": 0,
            "xanchor": "left",
            "font": {"size": 13},
        },
        "shapes": shapes,
        "annotations": notes,
        "xaxis": {"visible": False, "range": [-0.6, width + 0.6], "fixedrange": True},
        "yaxis": {
            "visible": False,
            "range": [-0.6, height + 0.9],
            "scaleanchor": "x",
            "fixedrange": True,
        },
        "height": max(220, 150 + 70 * dp),
        "margin": {"l": 10, "r": 10, "t": 50, "b": 10},
        "showlegend": False,
        "hovermode": "closest",
    }
    hover = {  # invisible points over the squares: hover names a device's groups
        "type": "scatter",
        "mode": "markers",
        "x": xs,
        "y": ys,
        "text": texts,
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"size": 30, "opacity": 0},
    }
    return go.Figure(data=[hover], layout={**layout, "template": TEMPLATE})


def _rect(x0: float, y0: float, x1: float, y1: float, fill: str, line: str, dash: str = "solid"):
    return {
        "type": "rect",
        "x0": x0,
        "y0": y0,
        "x1": x1,
        "y1": y1,
        "fillcolor": fill,
        "line": {"color": line, "width": 1.5, "dash": dash},
        "layer": "below",
    }


def _text(x: float, y: float, text: str, size: int) -> dict[str, Any]:
    return {
        "x": x,
        "y": y,
        "xref": "x",
        "yref": "y",
        "text": text,
        "showarrow": False,
        "font": {"size": size, "color": "#111111"},
    }
