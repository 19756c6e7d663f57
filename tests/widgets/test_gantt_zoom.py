"""Gantt zoom from summary to detail: a time window shows its events, in Python."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.errors import DistIRError
from widgets.breakdown import step_breakdown
from widgets.gantt import (
    DUR_S,
    START_S,
    bar_numbers,
    gantt_figure,
    gantt_spec,
    gantt_traces,
    op_id_at,
)
from widgets.gantt_zoom import GanttZoom
from widgets.live import live_figure, plotted
from widgets.timeline import GanttError
from widgets.units import time_unit


@pytest.fixture(scope="module")
def pipeline():
    f = transforms.training(models.mlp(8, 4, 8, 4, layers=4))
    g = transforms.pipeline_parallel(f, 2, 4)
    return g, ir.simulate(g, ir.Topology.preset("a100-hgx", 2))


def _overlapping(result, t0: float, t1: float) -> np.ndarray:
    bars = result.bars
    return (bars.start_s < t1) & (bars.start_s + bars.dur_s > t0)


def test_a_window_shows_exactly_the_events_that_overlap_it(pipeline):
    g, result = pipeline
    t0, t1 = 0.3 * result.step_time_s, 0.5 * result.step_time_s
    traces, _ = gantt_traces(result, g, window=(t0, t1))
    bars = [t for t in traces if t["meta"]["kind"] in ("compute", "communication")]
    shown = np.concatenate([bar_numbers(t) for t in bars])
    assert len(shown) == int(_overlapping(result, t0, t1).sum()) < len(result.bars)
    assert (shown[:, START_S] < t1).all() and (shown[:, START_S] + shown[:, DUR_S] > t0).all()
    (idle,) = [bar_numbers(t) for t in traces if t["meta"]["kind"] == "idle"]
    assert len(idle) and (idle[:, START_S] >= t0).all()
    assert (idle[:, START_S] + idle[:, DUR_S] <= t1 * (1 + 1e-12)).all()
    figure = gantt_figure(result, g, window=(t0, t1))
    ids = [
        op_id_at(figure, k, i)
        for k, t in enumerate(figure.data)
        if t.meta["kind"] == "compute"
        for i in range(len(t.x))
    ]
    assert ids and all(i and i.startswith("op-") for i in ids)  # a click still selects the op


def test_a_summarised_step_shows_a_windows_events_when_zoomed_in(pipeline):
    g, result = pipeline
    whole = gantt_figure(result, g, summary_above=5)
    assert all(t.meta["summary"] for t in whole.data)
    assert "zoom in to see events" in whole.layout.title.subtitle.text
    t0, t1 = 0.40 * result.step_time_s, 0.45 * result.step_time_s
    per_device = np.bincount(result.bars.device[_overlapping(result, t0, t1)])
    assert per_device.max() <= 5  # few enough in the window to draw one by one
    zoomed = gantt_figure(result, g, window=(t0, t1), summary_above=5)
    assert not any(t.meta.get("summary") for t in zoomed.data)
    drawn = [t for t in zoomed.data if t.meta["kind"] in ("compute", "communication")]
    assert sum(len(t.x) for t in drawn) == per_device.sum()
    _, unit = time_unit(result.step_time_s)  # the step's unit, kept in the window
    assert list(zoomed.layout.xaxis.range) == pytest.approx([t0 / unit, t1 / unit])


def test_a_window_still_too_dense_is_summarised_over_the_window(pipeline):
    g, result = pipeline
    t0, t1 = 0.1 * result.step_time_s, 0.9 * result.step_time_s
    traces, _ = gantt_traces(result, g, window=(t0, t1), summary_above=2)
    assert [t["meta"]["kind"] for t in traces] == ["compute", "compute", "communication", "idle"]
    numbers = [bar_numbers(t) for t in traces]
    parts = step_breakdown(result, (t0, t1))
    for i, part in enumerate(parts):
        compute, comm, idle = numbers[i][0], numbers[2][i], numbers[3][i]  # a compute trace each
        assert compute[START_S] == pytest.approx(t0)
        assert compute[DUR_S] + comm[DUR_S] + idle[DUR_S] == pytest.approx(t1 - t0)
        assert part.events == int(_overlapping(result, t0, t1)[result.bars.device == i].sum())
    assert sum(p.compute_s for p in parts) < sum(p.compute_s for p in step_breakdown(result))


@pytest.mark.parametrize("window", [(2e-6, 1e-6), (1e-6, 1e-6), (0.0, float("nan")), ("a",)])
def test_a_bad_window_is_a_clear_error(pipeline, window):
    g, result = pipeline
    with pytest.raises(GanttError, match="window") as caught:
        gantt_figure(result, g, window=window)
    assert isinstance(caught.value, DistIRError)


def test_zooming_the_live_chart_redraws_it(pipeline):
    g, result = pipeline
    widget = live_figure(*gantt_spec(result, g, summary_above=5))
    zoom = GanttZoom(widget, result, g, summary_above=5)
    t0, t1 = 0.40 * result.step_time_s, 0.45 * result.step_time_s
    _, unit = time_unit(result.step_time_s)
    # what chart.js reports when the user drags a window on the time axis
    widget.zoomed = {"range": [t0 / unit, t1 / unit], "n": 1}
    assert zoom.window == pytest.approx((t0, t1))
    assert (
        plotted(widget)[0]
        == plotted(gantt_figure(result, g, window=zoom.window, summary_above=5))[0]
    )
    widget.zoomed = {"autorange": True, "n": 2}  # a double-click: the whole step
    assert zoom.window is None and all(t["meta"]["summary"] for t in widget.traces)
    widget.zoomed = {"range": [t0 / unit, t1 / unit], "n": 3}  # the next drag
    assert zoom.window == pytest.approx((t0, t1))
    assert not any(t["meta"].get("summary") for t in widget.traces)


def test_a_step_drawn_bar_by_bar_is_left_to_plotlys_own_zoom(pipeline):
    g, result = pipeline
    widget = live_figure(*gantt_spec(result, g))
    zoom = GanttZoom(widget, result, g)
    before, revision = plotted(widget)[0], widget.revision
    widget.zoomed = {"range": [1.0, 2.0], "n": 1}
    assert zoom.window is None and plotted(widget)[0] == before
    assert widget.revision == revision  # nothing sent


def test_the_dashboard_zooms_its_gantt(pipeline):
    from workbench import Workbench

    wb = Workbench(
        transforms.training(models.mlp(8, 4, 8, 4, layers=4)), ir.Topology.preset("a100-hgx", 2)
    )
    assert wb.set_strategy(pp=2, microbatches=4)
    result = wb.session.current.result
    assert wb.gantt_zoom is not None and wb.gantt_zoom.result is result
    wb.gantt_zoom.summary_above = 5
    wb.gantt_zoom.show(result, wb.session.current.function)
    assert all(t["meta"]["summary"] for t in wb.gantt.traces)
    t0, t1 = 0.40 * result.step_time_s, 0.45 * result.step_time_s
    wb.gantt.zoomed = {"range": [t0 / 1e-6, t1 / 1e-6], "n": 1}
    assert not any(t["meta"].get("summary") for t in wb.gantt.traces)
