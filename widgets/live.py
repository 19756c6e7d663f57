"""Live plotly figures that redraw in place.

Building a new ``FigureWidget`` per redraw costs plotly's validation, deep
copies and template every time, and the browser a new widget model. The
dashboard instead keeps one widget per view and hands it the new traces and
layout as plain dicts (:func:`show`): when the traces line up with the ones on
display (same count, same types, same ``meta["kind"]``) each is updated in
place, in one batched message; otherwise the traces are replaced. Click
handlers registered on the traces survive an in-place update.

Plotly's Python side costs about a millisecond per property set, changed or
not, so :func:`show` remembers what it last gave each widget and passes on only
the properties that differ (it assumes it is the only writer of what it set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

TEMPLATE = "plotly_white"


def live_figure(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> go.FigureWidget:
    """A FigureWidget of ``traces`` and ``layout`` (the template is set here, once)."""
    widget = go.FigureWidget(data=list(traces), layout={**layout, "template": TEMPLATE})
    widget._distir_sent = (list(traces), dict(layout))
    return widget


def show(widget: go.FigureWidget, traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> bool:
    """Make ``widget`` show ``traces`` and ``layout``; True when updated in place.

    Properties a trace dict leaves out keep their current values, so trace
    builders give every trace of a kind the same keys.
    """
    in_place = _signature(widget.data) == [_kind(t) for t in traces]
    sent_traces, sent_layout = getattr(widget, "_distir_sent", ([{}] * len(traces), {}))
    if len(sent_traces) != len(traces):
        sent_traces = [{}] * len(traces)
    with widget.batch_update():
        if in_place:
            for trace, new, old in zip(widget.data, traces, sent_traces):
                changed = _changed(new, old)
                if changed:
                    trace.update(changed, overwrite=True)
        changed = _changed(layout, sent_layout)
        if changed:
            widget.layout.update(changed, overwrite=True)
    if not in_place:  # plotly does not allow adding traces inside a batch
        widget.data = ()
        widget.add_traces(list(traces))
    widget._distir_sent = (list(traces), dict(layout))  # what show() last gave it
    return in_place


def _changed(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``new`` that ``old`` does not have with an equal value."""
    return {k: v for k, v in new.items() if k not in old or not _same(v, old[k])}


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _signature(data: Sequence[Any]) -> list[tuple[str, Any]]:
    return [
        (t.type, (t.meta or {}).get("kind") if isinstance(t.meta, dict) else None) for t in data
    ]


def _kind(trace: dict[str, Any]) -> tuple[str, Any]:
    meta = trace.get("meta")
    return (trace.get("type", "scatter"), meta.get("kind") if isinstance(meta, dict) else None)
