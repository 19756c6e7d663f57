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
the properties that differ (it assumes it is the only writer of what it set),
all of them in one ``plotly_update``: plotly's own message, which its
``batch_update`` ends with too, without validating each property again on
the way. The trace builders' dicts are validated when a figure is first built
from them (:func:`live_figure`, the static figures), and the tests check that
an updated widget equals a figure built anew.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

# plotly's "leave this trace's property as it is" in a restyle (module-level since 3.0)
from plotly.basedatatypes import Undefined

TEMPLATE = "plotly_white"


def live_figure(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> go.FigureWidget:
    """A FigureWidget of ``traces`` and ``layout`` (the template is set here, once)."""
    widget = go.FigureWidget(data=list(traces), layout={**layout, "template": TEMPLATE})
    widget._distir_sent = (list(traces), dict(layout))
    return widget


def show(widget: go.FigureWidget, traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> bool:
    """Make ``widget`` show ``traces`` and ``layout``; True when updated in place.

    Properties a trace dict leaves out keep their current values, so trace
    builders give every trace of a kind the same keys. An in-place update passes
    values on as given (as ``plotly_update`` does, unvalidated, arrays by
    reference): give it what a builder makes, whose dicts are validated
    whenever a figure is built from them (:func:`live_figure`, the static
    figures, new traces here).
    """
    in_place = _signature(widget.data) == [_kind(t) for t in traces]
    sent_traces, sent_layout = getattr(widget, "_distir_sent", ([{}] * len(traces), {}))
    if len(sent_traces) != len(traces):
        sent_traces = [{}] * len(traces)
    relayout = _changed(layout, sent_layout)
    if in_place:
        changes = [_changed(new, old) for new, old in zip(traces, sent_traces)]
        indexes = [i for i, c in enumerate(changes) if c]
        keys = list(dict.fromkeys(k for i in indexes for k in changes[i]))
        restyle = {k: [changes[i].get(k, Undefined) for i in indexes] for k in keys}
        if restyle or relayout:  # one message: every trace's changes and the layout's
            widget.plotly_update(
                restyle_data=restyle, relayout_data=relayout, trace_indexes=indexes
            )
    else:  # the layout, then new traces (validated as they are added)
        with widget.batch_update():
            if relayout:
                widget.layout.update(relayout, overwrite=True)
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


def typed_array(array: np.ndarray) -> dict[str, str]:
    """A float64 array as plotly.js's typed-array spec (base64, with its shape).

    Plotly sends a 2-D numpy array to a live widget as nested lists (thousands of
    small lists to walk and encode); this is one string.
    """
    array = np.ascontiguousarray(array, dtype="<f8")
    spec = {"dtype": "f8", "bdata": base64.b64encode(array.tobytes()).decode("ascii")}
    if array.ndim > 1:
        spec["shape"] = ", ".join(map(str, array.shape))
    return spec


def from_typed_array(spec: dict[str, Any]) -> np.ndarray:
    """The numpy array of a plotly.js typed-array spec (``{"dtype", "bdata", "shape"}``)."""
    flat = np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<" + spec["dtype"])
    shape = [int(n) for n in str(spec.get("shape", len(flat))).split(",")]
    return flat.reshape(shape)


def plotted(figure: go.Figure) -> tuple[list[Any], dict[str, Any]]:
    """What plotly.js draws: the figure's traces and layout as JSON, typed arrays
    decoded to lists, the template aside. Plotly writes a numpy array as base64 or
    as a list depending on how it was set; the drawing is the same."""
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
