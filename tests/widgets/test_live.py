"""Live figures redraw in place: same result as a new figure, click handlers kept."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from plotly.callbacks import Points

import ir
from ir.device import Device
from widgets.gantt import connect_clicks, gantt_figure, gantt_spec
from widgets.live import live_figure, plotted, show
from widgets.memory import memory_figure, memory_spec

sys.path.insert(0, str(Path(__file__).parent))
from widget_programs import data_parallel_matmul, deep_mlp


def test_show_updates_in_place_and_matches_a_new_figure():
    first = data_parallel_matmul((1, 2, 3), batch=48)
    second = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    a = ir.simulate(first, ir.Topology.uniform(4))
    b = ir.simulate(second, ir.Topology.uniform(3))
    widget = live_figure(*gantt_spec(a, first))
    clicked: list[str] = []
    connect_clicks(widget, clicked.append)
    traces = list(widget.data)
    assert show(widget, *gantt_spec(b, second))  # three bar traces both times: in place
    assert list(widget.data) == traces  # the same trace objects, so their handlers too
    assert plotted(widget) == plotted(gantt_figure(b, second))
    # what the browser's click on the first compute bar calls (a handler from before)
    widget.data[0]._dispatch_on_click(Points(point_inds=[0], trace_index=0), None)
    assert clicked == [str(widget.data[0].meta["op_ids"]).split("\n")[0]]
    assert clicked[0].startswith("op-")


def test_show_replaces_traces_when_their_structure_changes():
    one = deep_mlp(2, device_of_layer=lambda i: 0, width=8)
    three = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    a = ir.simulate(one, ir.Topology.uniform(1))
    b = ir.simulate(three, ir.Topology.uniform(3))
    widget = live_figure(*memory_spec(a))
    assert len(widget.data) == 3  # one device: curve, peak, capacity
    assert not show(widget, *memory_spec(b))  # three devices: new traces
    assert len(widget.data) == 7
    assert plotted(widget) == plotted(memory_figure(b))
    assert show(widget, *memory_spec(b))  # the same structure again: in place


@pytest.mark.parametrize("third_gb", [16, 8])
def test_memory_view_with_slots_for_more_devices_redraws_in_place(third_gb):
    # devices 0-1 have 16 GB; capacity lines follow the devices a program uses, so with
    # an 8 GB device 2 the line count changes with the program and the traces are replaced
    devices = (Device(0), Device(1), Device(2, memory_bytes=third_gb * 1e9))
    topology = ir.Topology(devices, ((1e10,) * 3,) * 3, ((1e-6,) * 3,) * 3)
    one = deep_mlp(2, device_of_layer=lambda i: 0, width=8)
    three = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    a, b = ir.simulate(one, topology), ir.simulate(three, topology)
    assert a.devices == (0,) and b.devices == (0, 1, 2)
    slots = topology.device_ids
    widget = live_figure(*memory_spec(a, devices=slots))
    traces = list(widget.data)
    hidden = [t for t in traces if t.visible is False]
    assert {t.meta["kind"] for t in hidden} == {"live", "peak"}  # a curve and a peak each
    assert {t.meta["device"] for t in hidden} == {1, 2}
    assert all(len(t.x) == 0 and len(t.y) == 0 for t in hidden)
    shown = [t.meta for t in traces if t.visible is not False]
    assert shown == [t.meta for t in memory_figure(a).data]  # what a figure of a alone shows
    same_lines = third_gb == 16
    assert show(widget, *memory_spec(b, devices=slots)) == same_lines  # one device, then three
    assert (list(widget.data) == traces) == same_lines
    assert plotted(widget) == plotted(memory_figure(b))  # what a new figure of b shows
    assert show(widget, *memory_spec(a, devices=slots)) == same_lines  # and back
    assert plotted(widget) == plotted(live_figure(*memory_spec(a, devices=slots)))
