"""Live charts (widgets.chart.Chart): the figure is the chart's state, the latest one,
so the browser (and a reloaded page, and the saved notebook) draws what a new figure of
the same step draws; a click is read against the traces shown when it comes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

import comm
import ipywidgets
import numpy as np
from comm.base_comm import BaseComm

import ir
from widgets.chart import Chart, PlotlyLibrary, figure_json, from_typed_array, plotly_library
from widgets.gantt import connect_clicks, gantt_figure, gantt_spec
from widgets.live import live_figure, plotted, show
from widgets.memory import memory_figure, memory_spec

sys.path.insert(0, str(Path(__file__).parent))
from widget_programs import data_parallel_matmul, deep_mlp


def test_show_makes_the_state_the_new_figure_and_clicks_follow_it():
    first = data_parallel_matmul((1, 2, 3), batch=48)
    second = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    a = ir.simulate(first, ir.Topology.uniform(4))
    b = ir.simulate(second, ir.Topology.uniform(3))
    widget = live_figure(*gantt_spec(a, first))
    clicked: list[str] = []
    connect_clicks(widget, clicked.append)
    revision = widget.revision
    show(widget, *gantt_spec(b, second))
    assert widget.revision == revision + 1  # the browser redraws on each revision
    assert plotted(widget) == plotted(gantt_figure(b, second))
    # the state is JSON with typed arrays: what chart.js hands plotly.js
    state = widget.figure["data"][0]
    assert set(state["x"]) == {"dtype", "bdata"} and state["x"]["dtype"] == "f8"
    np.testing.assert_allclose(from_typed_array(state["x"]), widget.traces[0]["x"])
    # what the browser reports for a click on device 0's first compute bar
    widget.clicked = {"trace": 0, "point": 0, "n": 1}
    assert clicked == [str(widget.traces[0]["meta"]["op_ids"]).split("\n")[0]]
    assert clicked[0].startswith("op-")
    widget.clicked = {"trace": 99, "point": 0, "n": 2}  # a stale click: nothing happens
    assert len(clicked) == 1


def test_every_chart_shares_one_plotly_library_model():
    one = deep_mlp(2, device_of_layer=lambda i: 0, width=8)
    a = ir.simulate(one, ir.Topology.uniform(1))
    first, second = live_figure(*memory_spec(a)), live_figure(*gantt_spec(a, one))
    assert first.library is second.library is plotly_library()
    assert "plotly.js" in first.library.source[:200]  # sent once, referred to by every chart
    assert "source" not in first.figure and len(first._esm) < 20_000  # charts stay small


class _Recorded(BaseComm):
    """A comm that keeps what it would send to the front end."""

    sent: ClassVar[list[tuple[str, dict, list]]] = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        _Recorded.sent.append((msg_type, data or {}, list(buffers or [])))


def test_plotly_js_travels_in_the_opening_message_and_on_request_never_in_restored_state(
    monkeypatch,
):
    _Recorded.sent = []
    monkeypatch.setattr(comm, "create_comm", _Recorded)
    library = PlotlyLibrary()
    (kind, opening, _), *_ = _Recorded.sent
    assert kind == "comm_open" and opening["state"]["source"] == library.source
    assert library.source.startswith("/**") and len(library.source) > 1_000_000
    # what a reloaded page restores (ipywidgets' request_states): the version alone
    assert library.get_state()["source"] == "" and library.version
    assert "source" not in library.get_state(drop_defaults=True)
    state = ipywidgets.Widget.get_manager_state(drop_defaults=True)["state"]
    assert len(json.dumps(state[library.model_id])) < 1_000
    # that page asks for the source: one binary buffer back
    library.comm.handle_msg(
        {"content": {"data": {"method": "custom", "content": {"want": "plotly.js"}}}, "buffers": []}
    )
    kind, reply, buffers = _Recorded.sent[-1]
    assert kind == "comm_msg" and reply["content"] == {"plotly.js": library.version}
    assert bytes(buffers[0]).decode() == library.source
    library.comm.handle_msg(
        {"content": {"data": {"method": "custom", "content": {"x": 1}}}, "buffers": []}
    )
    assert _Recorded.sent[-1][1] is reply  # anything else: no answer
    library.close()


def test_a_chart_of_a_figure_and_its_saved_state_draw_the_same():
    three = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    b = ir.simulate(three, ir.Topology.uniform(3))
    figure = memory_figure(b)
    chart = Chart.of(figure)
    assert plotted(chart) == plotted(figure)
    # the saved notebook keeps the chart's state: as a figure again, it draws the same
    again = figure_json(chart.figure)
    assert plotted(Chart(again["data"], again["layout"])) == plotted(figure)


def test_repeated_hover_texts_travel_once():
    f = data_parallel_matmul(tuple(range(8)), batch=64)
    result = ir.simulate(f, ir.Topology.uniform(8))
    traces, layout = gantt_spec(result, f)
    comm = {**traces[0], "hovertext": np.array(["same text"] * 100, dtype=object)}
    chart = Chart([comm], layout)
    sent = chart.figure["data"][0]["hovertext"]
    assert sent["strings"] == ["same text"] and len(from_typed_array(sent["index"])) == 100
    assert figure_json(chart.figure)["data"][0]["hovertext"] == ["same text"] * 100
