"""Gantt, memory, comparison and static HTML views of real simulations (no browser)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

import ir
from ir.device import Device
from ir.limits import MAX_DEVICES
from widgets.breakdown import union_s
from widgets.compare import compare_figure
from widgets.gantt import (
    BYTES,
    DEVICE,
    DUR_S,
    FLOPS,
    START_S,
    bar_colors,
    bar_numbers,
    gantt_figure,
    gantt_traces,
    gantt_widget,
    op_id_at,
)
from widgets.graph import render_graph
from widgets.ids import op_paths
from widgets.memory import memory_figure
from widgets.palette import COMMUNICATION_COLOR, DEVICE_PALETTE, IDLE_BAR, device_color
from widgets.static_html import compare_page, gantt_page, graph_page, memory_page, report_page

sys.path.insert(0, str(Path(__file__).parent))
from widget_programs import data_parallel_matmul, deep_mlp

REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(https?:)?//", re.IGNORECASE)
REMOTE_LINK = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?\s*(https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def dp():
    f = data_parallel_matmul((1, 2, 3), batch=48)
    return f, ir.simulate(f, ir.Topology.uniform(4))


@pytest.fixture(scope="module")
def pipeline():
    f = deep_mlp(6, device_of_layer=lambda i: i // 2, width=64)
    return f, ir.simulate(f, ir.Topology.uniform(3))


def _bars(fig: go.Figure, kind: str) -> go.Bar:
    (trace,) = [t for t in fig.data if t.meta and t.meta["kind"] == kind]
    return trace


def _compute(fig: go.Figure, device: int) -> go.Bar:
    (trace,) = [t for t in fig.data if t.meta["kind"] == "compute" and t.meta["device"] == device]
    return trace


def _rows_of(fig: go.Figure, trace: go.Bar) -> list[str]:
    labels = list(fig.layout.yaxis.ticktext)
    assert list(fig.layout.yaxis.tickvals) == list(range(len(labels)))
    return [labels[int(y)] for y in trace.y]


def test_gantt_has_a_row_per_device_and_stream(dp):
    f, result = dp
    fig = gantt_figure(result, f)
    rows = list(fig.layout.yaxis.ticktext)
    assert rows == [f"dev {d} · {s}" for d in result.devices for s in ("comp", "comm")]
    assert fig.layout.yaxis.autorange == "reversed"  # device 0 on top
    # a compute trace per device (the legend names each device's colour), then
    # communication and idle
    kinds = [(t.meta["kind"], t.meta.get("device")) for t in fig.data]
    assert kinds == [
        *(("compute", d) for d in result.devices),
        ("communication", None),
        ("idle", None),
        ("labels", None),  # a pipeline's task labels (none here)
    ]
    events = [ev for ev in result.events if ev.stream == "compute"]
    assert sum(len(_compute(fig, d).x) for d in result.devices) == len(events) == 6
    for d in (1, 2, 3):
        assert set(_rows_of(fig, _compute(fig, d))) == {f"dev {d} · comp"}
    assert len(_compute(fig, 0).x) == 0
    comm = _bars(fig, "communication")
    assert set(_rows_of(fig, comm)) <= {r for r in rows if r.endswith("comm")}
    assert len(comm.x) == sum(ev.stream == "communication" for ev in result.events)
    assert set(_rows_of(fig, _bars(fig, "idle"))) <= {r for r in rows if r.endswith("comp")}
    # compute bars in their device's colour (as in the graph and memory views), the legend
    # entry too; communication and idle in colours no device has
    for d in result.devices:
        trace = _compute(fig, d)
        assert trace.marker.color == device_color(d) and trace.name == f"device {d}"
    assert set(bar_colors(comm)) == {COMMUNICATION_COLOR} and comm.name == "communication"
    assert set(bar_colors(_bars(fig, "idle"))) <= {IDLE_BAR}
    assert not {COMMUNICATION_COLOR, IDLE_BAR} & set(DEVICE_PALETTE)


def test_gantt_bars_match_events_and_report_op_ids(dp):
    f, result = dp
    fig = gantt_figure(result, f)
    paths = op_paths(f)
    compute = _compute(fig, 1)
    trace = list(fig.data).index(compute)
    evs = result.events_on(1, "compute")
    scale = 1e-6  # µs: the step is microseconds long
    assert fig.layout.xaxis.title.text == "time (µs)"
    np.testing.assert_allclose(
        np.array(compute.base, dtype=float) * scale, [e.start_s for e in evs]
    )
    np.testing.assert_allclose(np.array(compute.x) * scale, [e.dur_s for e in evs])
    mine = range(len(evs))
    assert [op_id_at(fig, trace, i) for i in mine] == [f"op-{paths[e.op]}" for e in evs]
    assert [op_id_at(fig, trace, i) for i in mine] == ["op-2.0", "op-2.1"]
    hover = compute.hovertemplate
    assert all(f"customdata[{k}]" in hover for k in (START_S, DUR_S, FLOPS, BYTES, DEVICE))
    assert "%{hovertext}" in hover
    text = compute.hovertext[0]
    assert "MatMul → ai" in text and "16×4, 4×3 → 16×3" in text
    numbers = bar_numbers(compute)
    matmul = evs[0]
    np.testing.assert_allclose(
        numbers[0], [matmul.start_s, matmul.dur_s, matmul.flops, matmul.bytes, 1]
    )
    assert matmul.flops == 2 * 16 * 4 * 3 and matmul.bytes > 0
    idle = list(fig.data).index(_bars(fig, "idle"))
    assert len(fig.data[idle].x) > 0 and op_id_at(fig, idle, 0) is None


def test_gantt_idle_fills_the_gaps(pipeline):
    f, result = pipeline
    fig = gantt_figure(result, f)
    idle = _bars(fig, "idle")
    rows = _rows_of(fig, idle)
    for d in result.devices:
        total = sum(x for x, row in zip(idle.x, rows) if row == f"dev {d} · comp") * 1e-6
        assert total == pytest.approx(result.idle_s[d], rel=1e-6, abs=1e-15)


def test_gantt_click_selects_the_op_in_the_graph(dp):
    from widgets.graph_widget import GraphView

    f, result = dp
    view = GraphView(f)
    widget = gantt_widget(result, f, on_select=view.select)
    trace = next(i for i, t in enumerate(widget.traces) if len(t["x"]))  # device 1's compute
    assert op_id_at(widget, trace, 1) == "op-2.1"
    widget.clicked = {"trace": trace, "point": 1, "n": 1}  # what chart.js reports
    assert view.selection.op.op_type == "Relu"


def test_memory_peak_marker_equals_the_simulated_peak(pipeline):
    _, result = pipeline
    fig = memory_figure(result)
    scale = 1e3 if fig.layout.yaxis.title.text.endswith("(kB)") else 1e6
    assert fig.layout.yaxis.title.text in ("live memory (kB)", "live memory (MB)")
    peaks = {t.meta["device"]: t for t in fig.data if t.meta["kind"] == "peak"}
    assert sorted(peaks) == list(result.devices)
    for d, t in peaks.items():
        assert t.y[0] * scale == pytest.approx(result.peak_memory_bytes[d])
        assert t.marker.color == device_color(d)
        times, live = result.memory_timeline(d)
        curve = next(c for c in fig.data if c.meta == {"kind": "live", "device": d})
        np.testing.assert_allclose(np.array(curve.y) * scale, live)
        np.testing.assert_allclose(t.x[0] * 1e-6, times[np.argmax(live)])  # x axis in µs
        assert curve.line.shape == "hv"
    (cap,) = [t for t in fig.data if t.meta["kind"] == "capacity"]
    assert cap.y[0] * scale == pytest.approx(16e9)
    assert not [t for t in fig.data if t.meta["kind"] == "oom"]


def test_out_of_memory_is_highlighted(dp):
    f, _ = dp
    result = ir.simulate(f, ir.Topology.uniform(4, memory_bytes=600))
    ooms = {d: op for d, op in result.oom.items() if op is not None}
    assert ooms
    fig = memory_figure(result)
    marked = {t.meta["device"]: t for t in fig.data if t.meta["kind"] == "oom"}
    assert set(marked) == set(ooms)
    for d, t in marked.items():
        over = [y for y in t.y if y is not None and not np.isnan(y)]
        unit_bytes = {"(kB)": 1e3, "(B)": 1.0}[fig.layout.yaxis.title.text.split()[-1]]
        assert over and min(over) * unit_bytes > 600  # every drawn point is over capacity
        assert ooms[d].op_type in t.meta["op"]
    assert "out of memory" in fig.layout.title.text


def test_compare_shares_one_time_axis(dp, pipeline):
    (fa, a), (fb, b) = dp, pipeline
    fig = compare_figure(a, b, function_a=fa, function_b=fb, labels=("dp", "pp"))
    assert fig.layout.xaxis2.matches == fig.layout.xaxis3.matches == "x"  # one time axis
    titles = [a.text for a in fig.layout.annotations]
    for axis, label, result in (("y", "dp", a), ("y2", "pp", b)):
        rows = list(fig.layout["yaxis" + axis[1:]].ticktext)
        assert rows == [f"dev {d} · {s}" for d in result.devices for s in ("comp", "comm")]
        bars = [t for t in fig.data if t.type == "bar" and t.yaxis == axis]
        kinds = [t.meta["kind"] for t in bars]
        assert kinds == ["compute"] * len(result.devices) + ["communication", "idle"]
        assert sum(t.meta["kind"] == "labels" for t in fig.data if t.yaxis == axis) == 1
        assert sum(len(t.x) for t in bars if t.meta["kind"] != "idle") == len(result.events)
        assert any(t.startswith(f"<b>{label} · step") for t in titles)
    # the two Gantts and the memory panel are stacked, apart: their titles do not overlap
    domains = [fig.layout[k].domain for k in ("yaxis", "yaxis2", "yaxis3")]
    assert domains[0][0] > domains[1][1] and domains[1][0] > domains[2][1]
    curves = [t for t in fig.data if t.type == "scatter" and t.meta["kind"] == "live"]
    assert {t.name.split(":")[0] for t in curves} == {"dp", "pp"}
    assert {t.line.dash for t in curves if t.name.startswith("pp")} == {"dash"}
    assert all(t.yaxis == "y3" for t in curves)


def test_static_pages_are_self_contained(dp):
    f, result = dp
    pages = {
        "graph": graph_page(f),
        "gantt": gantt_page(result, f),
        "memory": memory_page(result),
        "compare": compare_page(result, result),
        "report": report_page(f, result),
    }
    for name, page in pages.items():
        assert not REMOTE_SCRIPT.search(page), name
        assert not REMOTE_LINK.search(page), name
        assert page.startswith("<!DOCTYPE html>"), name
    for name in ("gantt", "memory", "compare", "report"):
        assert pages[name].count("Plotly.newPlot") >= 1, name
        assert len(re.findall(r"plotly\.js v\d", pages[name])) == 1, name  # inlined once
    report = pages["report"]
    assert "<svg" in report and 'id="op-2.0"' in report
    assert render_graph(f).svg in report
    assert "<svg" in pages["graph"] and "Plotly" not in pages["graph"]


# Device ids are 0 .. MAX_DEVICES - 1 (issue 17: a negative or huge id is refused as a
# type's device); within that, any order and any gaps.
@pytest.mark.parametrize("ids", [(MAX_DEVICES - 1, 0, 1), (5, 0, 60_000)])
def test_gantt_rows_follow_the_devices_whatever_their_ids(ids):
    topology = ir.Topology(
        tuple(Device(i) for i in ids),
        tuple(tuple(1e9 for _ in ids) for _ in ids),
        tuple(tuple(0.0 for _ in ids) for _ in ids),
    )
    b = ir.FunctionBuilder("f")
    xs = [b.input(f"x{k}", ir.TensorType((64, 64), device=d)) for k, d in enumerate(ids)]
    f = b.finish([b.call("MatMul", x, x, name=f"y{k}") for k, x in enumerate(xs)])
    result = ir.simulate(f, topology)
    traces, rows = gantt_traces(result, f)
    compute = [t for t in traces if t["meta"]["kind"] == "compute"]
    assert [t["meta"]["device"] for t in compute] == list(result.devices)
    for trace in compute:
        devices = bar_numbers(trace)[:, DEVICE]
        labels = [rows[int(y)] for y in trace["y"]]
        assert (
            labels
            == [f"dev {trace['meta']['device']} · comp"] * len(devices)
            == [f"dev {int(d)} · comp" for d in devices]
        )
    assert sorted(t["meta"]["device"] for t in compute) == sorted(ids)


def test_gantt_summarises_each_device_above_its_event_limit(pipeline):
    f, result = pipeline
    traces, _ = gantt_traces(result, f, summary_above=1)
    n = len(result.devices)
    assert [t["meta"]["kind"] for t in traces] == ["compute"] * n + ["communication", "idle"]
    assert all(t["meta"]["summary"] and not t["meta"]["op_ids"].strip() for t in traces)
    numbers = [bar_numbers(t) for t in traces]
    assert [len(x) for x in numbers] == [1] * n + [n, n]  # one bar per device each
    for i, d in enumerate(result.devices):
        compute, comm, idle = numbers[i][0], numbers[n][i], numbers[n + 1][i]
        assert compute[DEVICE] == d and compute[START_S] == 0.0
        assert comm[START_S] == compute[DUR_S] and idle[START_S] == compute[DUR_S] + comm[DUR_S]
        step = compute[DUR_S] + comm[DUR_S] + idle[DUR_S]
        assert step == pytest.approx(result.step_time_s)
        assert compute[DUR_S] == pytest.approx(result.busy_s[d])  # compute never overlaps itself
    full, _ = gantt_traces(result, f)  # under the limit: one bar per event
    assert sum(
        len(t["x"]) for t in full if t["meta"]["kind"] in ("compute", "communication")
    ) == len(result.bars)


def test_step_breakdown_counts_overlapped_communication_as_hidden():
    assert union_s(np.array([0.0, 0.5, 3.0]), np.array([1.0, 2.0, 4.0])) == 3.0
    assert union_s(np.array([]), np.array([])) == 0.0


def test_the_breakdown_bar_sums_to_the_step_and_shows_a_pipelines_idle():
    from ir import models, transforms
    from widgets.breakdown import breakdown_html, step_breakdown

    topology = ir.Topology.preset("a100-hgx", 4)
    f = models.mlp(64, 32, 32, 8, layers=8, training=True)
    pipeline = ir.simulate(transforms.pipeline_parallel(f, 4, 8, schedule="gpipe"), topology)
    parts = step_breakdown(pipeline)
    for p in parts:
        assert p.step_s == pytest.approx(pipeline.step_time_s, rel=1e-9)
        assert p.idle_s == pytest.approx(pipeline.idle_s[p.device], rel=1e-6, abs=1e-15)
    page = breakdown_html(pipeline)
    assert page.count("<div style='white-space:nowrap") == len(parts) and "http" not in page
    # every stage of a pipeline waits (its bubble); the idle share is written out per device
    for p in parts:
        assert p.idle_s > 0 and f"idle {p.idle_s / p.step_s:.0%}" in page
