"""A plotly chart in a notebook that draws every time: an anywidget of our own.

plotly's ``FigureWidget`` ships its 5 MB bundle as *every* chart's ES module, so the
browser parses plotly.js once per chart; anywidget gives a model 2 s to load its module
and then drops the model's messages ("[anywidget] Failed to initialize model"), which
on a busy machine left a chart blank or showing its first figure. Its later changes
travel as messages, not state, so a page reload showed the first figure too.

:class:`Chart` fixes both by design. Its module (``static/chart.js``) is a few KB and
loads at once; plotly.js reaches the page once, with one shared :class:`PlotlyLibrary`
model every chart refers to (never in the state a reloaded page restores), and is
evaluated once per page. The figure a chart shows is its *state* (``figure``): a
reloaded page, a second view and the saved notebook all show the latest figure, and
:func:`figure_json` of it is what a static page draws. The browser sizes the chart to
its container and reports clicks and zooms; Python decides what they mean.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import traitlets
from plotly.offline import get_plotlyjs, get_plotlyjs_version

STATIC = Path(__file__).parent / "static"
TEMPLATE = "plotly_white"
# The chart's tool bar shows on hover only, at the top right, where no legend or title is
# (see widgets.layout.chart_layout); no logo, no link that leaves the page.
CONFIG: dict[str, Any] = {"displaylogo": False, "displayModeBar": "hover", "responsive": True}

__all__ = [
    "CONFIG",
    "Chart",
    "PlotlyLibrary",
    "figure_json",
    "from_typed_array",
    "plotly_library",
    "strings_table",
    "template_json",
    "typed_array",
]


class PlotlyLibrary(ipywidgets.Widget):
    """plotly.js for the pages that draw charts: one model per kernel, without a view;
    every :class:`Chart` refers to it and a page evaluates it once.

    The source rides only in the message that opens the model, so the pages open then
    draw at once, even while the cell that made the first chart still runs. After that
    the model's state is its version alone: a reloaded page or a second tab restores
    every widget of the kernel in one small message (ipywidgets gives that message 4 s,
    then falls back to one request per widget), and asks for the source with a message
    of its own, answered with the source as one binary buffer.
    """

    version = traitlets.Unicode("").tag(sync=True)
    source = traitlets.Unicode("").tag(sync=True)  # in the opening message only

    def __init__(self) -> None:
        self._opened = False
        super().__init__(version=get_plotlyjs_version(), source=get_plotlyjs())
        self._opened = True
        self.on_msg(self._answer)

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict[str, Any]:
        state = super().get_state(key, drop_defaults)
        if self._opened and "source" in state:
            if drop_defaults:
                del state["source"]
            else:
                state["source"] = ""
        return state

    def _answer(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("want") == "plotly.js":
            self.send({"plotly.js": self.version}, buffers=[self.source.encode()])


class _Library:
    """The kernel's one :class:`PlotlyLibrary` (made on first use, again if closed)."""

    widget: PlotlyLibrary | None = None

    @classmethod
    def get(cls) -> PlotlyLibrary:
        if cls.widget is None or cls.widget.comm is None:
            cls.widget = PlotlyLibrary()
        return cls.widget


def plotly_library() -> PlotlyLibrary:
    """The library model the kernel's charts share."""
    return _Library.get()


class Chart(anywidget.AnyWidget):
    """A plotly chart drawn from plain trace and layout dicts (see :meth:`show`).

    >>> chart = Chart([{"type": "bar", "x": np.array([1.0, 2.0]), "y": [0, 1]}], {"height": 200})
    >>> chart.figure["data"][0]["x"]["dtype"], chart.figure["layout"]["height"]
    ('f8', 200)
    >>> chart.to_figure().data[0].type
    'bar'
    """

    _esm = STATIC / "chart.js"

    figure = traitlets.Dict().tag(sync=True)  # {"data": [...], "layout": {...}}, JSON
    template = traitlets.Dict().tag(sync=True)  # the plotly template, sent once
    config = traitlets.Dict().tag(sync=True)
    library = traitlets.Instance(PlotlyLibrary).tag(sync=True, **ipywidgets.widget_serialization)
    revision = traitlets.Int(0).tag(sync=True)  # one more per figure shown
    # set by the browser
    clicked = traitlets.Dict().tag(sync=True)  # {"trace": i, "point": j, "n": clicks}
    zoomed = traitlets.Dict().tag(sync=True)  # {"range": [x0, x1]} or {"autorange": True}, "n"
    drawn = traitlets.Int(0).tag(sync=True)  # the revision the browser has drawn

    def __init__(
        self,
        traces: Sequence[Mapping[str, Any]] = (),
        layout: Mapping[str, Any] | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("layout", ipywidgets.Layout(width="100%"))
        super().__init__(
            library=plotly_library(),
            template=template_json(),
            config={**CONFIG, **(config or {})},
            **kwargs,
        )
        self.traces: list[dict[str, Any]] = []
        self.figure_layout: dict[str, Any] = {}  # (``layout`` is the widget's box)
        self._click_handlers: list[Callable[[int, int, dict[str, Any]], Any]] = []
        self._zoom_handlers: list[Callable[[tuple[float, float] | None], Any]] = []
        self.show(traces, layout or {})

    def show(self, traces: Sequence[Mapping[str, Any]], layout: Mapping[str, Any]) -> None:
        """Show ``traces`` and ``layout`` (plotly dicts; numpy arrays allowed): the whole
        figure becomes the chart's state, and the browser redraws it (``Plotly.react``)."""
        self.traces = [dict(t) for t in traces]
        self.figure_layout = dict(layout)
        data = [_json(t) for t in self.traces]
        with self.hold_sync():  # one message: the figure and its revision
            self.figure = {"data": data, "layout": _json(self.figure_layout)}
            self.revision += 1

    @classmethod
    def of(cls, figure: go.Figure, **kwargs: Any) -> Chart:
        """A chart showing ``figure`` (its template aside: charts share one)."""
        spec = figure.to_dict()
        spec["layout"].pop("template", None)
        return cls(spec["data"], spec["layout"], **kwargs)

    def to_figure(self) -> go.Figure:
        """The figure shown, as a plotly Figure (validated), for static pages and tests."""
        return go.Figure(data=self.traces, layout={**self.figure_layout, "template": TEMPLATE})

    def on_click(self, callback: Callable[[int, int, dict[str, Any]], Any]) -> None:
        """Call ``callback(trace_index, point_index, trace)`` when a point is clicked."""
        self._click_handlers.append(callback)

    def on_zoom(self, callback: Callable[[tuple[float, float] | None], Any]) -> None:
        """Call ``callback((x0, x1))`` when the user zooms the x axis (axis units), or
        ``callback(None)`` when they zoom back out (double-click)."""
        self._zoom_handlers.append(callback)

    @traitlets.observe("clicked")
    def _on_clicked(self, change: dict[str, Any]) -> None:
        click = change["new"] or {}
        trace, point = click.get("trace"), click.get("point")
        if not isinstance(trace, int) or not isinstance(point, int):
            return
        if not 0 <= trace < len(self.traces):
            return
        for handler in self._click_handlers:
            handler(trace, point, self.traces[trace])

    @traitlets.observe("zoomed")
    def _on_zoomed(self, change: dict[str, Any]) -> None:
        zoom = change["new"] or {}
        window = None
        if not zoom.get("autorange"):
            x = zoom.get("range")
            if not (isinstance(x, list) and len(x) == 2):
                return
            try:
                window = (float(x[0]), float(x[1]))
            except (TypeError, ValueError):
                return
        for handler in self._zoom_handlers:
            handler(window)


def template_json() -> dict[str, Any]:
    """The charts' plotly template as JSON."""
    return pio.templates[TEMPLATE].to_plotly_json()


def typed_array(array: np.ndarray) -> dict[str, str]:
    """A numeric array as plotly.js's typed-array spec (base64, with its shape): float64,
    or int32 for integers (plotly.js has no int64 arrays).

    Plotly sends a 2-D numpy array to a live widget as nested lists (thousands of
    small lists to walk and encode); this is one string.

    >>> typed_array(np.array([1, 2]))["dtype"], from_typed_array(typed_array(np.ones((2, 3)))).shape
    ('i4', (2, 3))
    """
    dtype = "<i4" if np.issubdtype(array.dtype, np.integer) else "<f8"
    array = np.ascontiguousarray(array, dtype=dtype)
    spec = {"dtype": dtype[1:], "bdata": base64.b64encode(array.tobytes()).decode("ascii")}
    if array.ndim > 1:
        spec["shape"] = ", ".join(map(str, array.shape))
    return spec


def from_typed_array(spec: Mapping[str, Any]) -> np.ndarray:
    """The numpy array of a plotly.js typed-array spec (``{"dtype", "bdata", "shape"}``)."""
    flat = np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<" + spec["dtype"])
    shape = [int(n) for n in str(spec.get("shape", len(flat))).split(",")]
    return flat.reshape(shape)


def strings_table(strings: Sequence[str], index: np.ndarray) -> dict[str, Any]:
    """``[strings[i] for i in index]``, sent as the distinct strings and an index array:
    the chart's module expands it (a Gantt's bars repeat one hover text per device)."""
    return {"strings": list(strings), "index": typed_array(np.asarray(index, dtype=np.int32))}


def _json(node: Any) -> Any:
    """``node`` as JSON for the chart's state: numeric arrays as typed-array specs, other
    arrays and tuples as lists, numpy scalars as Python numbers."""
    if isinstance(node, dict):
        return {k: _json(v) for k, v in node.items()}
    if isinstance(node, np.ndarray):
        if node.dtype.kind in "fiu":
            return typed_array(node)
        if node.dtype.kind == "b":
            return node.tolist()
        return _strings(node.tolist())
    if isinstance(node, list | tuple):
        return [_json(v) for v in node]
    if isinstance(node, np.generic):
        return node.item()
    return node


def _strings(values: list[Any]) -> Any:
    """A list of strings, as a :func:`strings_table` when that is shorter (a Gantt's bars
    repeat each op's hover text once per device)."""
    if len(values) < 64 or not all(isinstance(v, str) for v in values):
        return [_json(v) for v in values]
    index = dict.fromkeys(values)
    if len(index) * 2 > len(values):
        return values
    position = {s: i for i, s in enumerate(index)}
    return strings_table(list(index), np.fromiter(map(position.__getitem__, values), np.int32))


def figure_json(figure: Mapping[str, Any]) -> dict[str, Any]:
    """A chart's saved ``figure`` state as a plotly figure dict (string tables expanded),
    ready for ``plotly.io.to_html``."""
    return {"data": [_expanded(t) for t in figure.get("data", [])], "layout": figure["layout"]}


def _expanded(node: Any) -> Any:
    if isinstance(node, dict) and "strings" in node and "index" in node:
        strings = node["strings"]
        return [strings[i] for i in from_typed_array(node["index"]).tolist()]
    if isinstance(node, dict):
        return {k: _expanded(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_expanded(v) for v in node]
    return node
