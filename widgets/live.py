"""Live plotly figures that redraw in place.

Building a new ``FigureWidget`` per redraw costs plotly's validation, deep
copies and template every time, and the browser a new widget model. The
dashboard instead keeps one widget per view and hands it the new traces and
layout as plain dicts (:func:`show`): when the traces line up with the ones on
display (same count, same types, same ``meta["kind"]``) each is updated in
place, in one batched message; otherwise the traces are replaced. Click
handlers registered on the traces survive an in-place update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

TEMPLATE = "plotly_white"


def live_figure(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> go.FigureWidget:
    """A FigureWidget of ``traces`` and ``layout`` (the template is set here, once)."""
    return go.FigureWidget(data=list(traces), layout={**layout, "template": TEMPLATE})


def show(widget: go.FigureWidget, traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> bool:
    """Make ``widget`` show ``traces`` and ``layout``; True when updated in place.

    Properties a trace dict leaves out keep their current values, so trace
    builders give every trace of a kind the same keys.
    """
    in_place = _signature(widget.data) == [_kind(t) for t in traces]
    with widget.batch_update():
        if in_place:
            for trace, new in zip(widget.data, traces):
                trace.update(new, overwrite=True)
        widget.layout.update(layout, overwrite=True)
    if not in_place:  # plotly does not allow adding traces inside a batch
        widget.data = ()
        widget.add_traces(list(traces))
    return in_place


def _signature(data: Sequence[Any]) -> list[tuple[str, Any]]:
    return [
        (t.type, (t.meta or {}).get("kind") if isinstance(t.meta, dict) else None) for t in data
    ]


def _kind(trace: dict[str, Any]) -> tuple[str, Any]:
    meta = trace.get("meta")
    return (trace.get("type", "scatter"), meta.get("kind") if isinstance(meta, dict) else None)
