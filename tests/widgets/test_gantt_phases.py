"""The pipeline picture: forward and backward work told apart by the dataflow, each
task labelled with its microbatch, in the order the schedule runs them."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.transforms.pipeline import _device_sequence
from widgets.gantt import gantt_figure, gantt_spec
from widgets.gantt_bars import BACKWARD_OPACITY, DUR_S, FLOPS, START_S, bar_numbers
from widgets.phases import BACKWARD, FORWARD, UPDATE, op_roles
from widgets.units import time_unit


def _labels_by_row(traces: list[dict], rows: list[str]) -> dict[str, list[str]]:
    (labels,) = [t for t in traces if t["meta"]["kind"] == "labels"]
    out: dict[str, list[tuple[float, str]]] = {}
    for x, y, text in zip(labels["x"], labels["y"], labels["text"]):
        out.setdefault(rows[int(y)], []).append((float(x), str(text)))
    return {row: [t for _, t in sorted(items)] for row, items in out.items()}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_each_stage_shows_its_tasks_in_the_schedules_order(schedule):
    p, k = 4, 8
    t = transforms.training(models.mlp(16, 8, 8, 4, layers=4), "sgd")
    g = transforms.pipeline_parallel(t, p, k, schedule=schedule)
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", p))
    traces, layout = gantt_spec(result, g)
    rows = layout["yaxis"]["ticktext"]
    shown = _labels_by_row(traces, rows)
    for d in range(p):
        expected = [f"{phase}{m}" for _, m, phase in _device_sequence(schedule, d, p, 1, k, True)]
        assert shown[f"dev {d} · comp"] == expected, d
    assert "F3/B3" in layout["title"]["subtitle"]["text"]


def test_the_megatron_step_labels_shared_bodies_by_their_microbatch():
    """T.parallelize's pipeline runs one pmap per (stage, microbatch, phase) task over a body
    the microbatches share: the label comes from the pmap the bar ran under."""
    t = transforms.training(models.gpt(8, 16, 32, 4, 64, 4), "adam")
    g = transforms.parallelize(t, dp=2, pp=2, microbatches=4, schedule="1f1b")
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 4))
    traces, layout = gantt_spec(result, g)
    shown = _labels_by_row(traces, layout["yaxis"]["ticktext"])
    expected = [f"{phase}{m}" for _, m, phase in _device_sequence("1f1b", 0, 2, 1, 4, True)]
    assert shown["dev 0 · comp"] == shown["dev 1 · comp"] == expected  # a stage's two replicas


def test_phases_come_from_the_dataflow_and_backward_bars_are_lighter():
    t = transforms.training(models.mlp(8, 4, 8, 4), "adam")
    roles = op_roles(t)
    phases = [roles[op].phase for op in t.ops]
    first_backward = phases.index(BACKWARD)
    assert set(phases[:first_backward]) == {FORWARD}  # the loss and everything before it
    assert t.ops[first_backward].op_type == "LossGrad"
    assert {roles[op].phase for op in t.ops if op.op_type == "Adam"} == {UPDATE}
    assert all(roles[op].microbatch is None for op in t.ops)  # no microbatches: no labels
    result = ir.simulate(t, ir.Topology.preset("a100-hgx", 1))
    fig = gantt_figure(result, t)
    compute = next(tr for tr in fig.data if tr.meta["kind"] == "compute")
    opacity = np.asarray(compute.marker.opacity)
    events = result.events_on(0, "compute")
    assert len(opacity) == len(events)
    for event, alpha in zip(events, opacity):
        expected = BACKWARD_OPACITY if roles[event.op].phase == BACKWARD else 1.0
        assert alpha == expected, event.op.op_type
    labels = next(tr for tr in fig.data if tr.meta["kind"] == "labels")
    assert len(labels.x) == 0 and "F3/B3" not in fig.layout.title.text


def test_above_the_limit_a_tasks_consecutive_ops_are_one_block():
    t = transforms.training(models.gpt(8, 16, 32, 4, 64, 4), "adam")
    g = transforms.parallelize(t, dp=2, pp=2, microbatches=4, schedule="1f1b")
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 4))
    bars = result.bars
    whole, layout = gantt_spec(result, g, blocks_above=10)
    each, _ = gantt_spec(result, g, blocks_above=None)
    assert "a bar per task" in layout["title"]["subtitle"]["text"]
    rows = layout["yaxis"]["ticktext"]
    for merged, single in zip(whole, each):
        if merged["meta"]["kind"] != "compute":
            continue
        assert merged["meta"]["blocks"] and not single["meta"]["blocks"]
        d = merged["meta"]["device"]
        mine = (bars.stream == 0) & (bars.device == d)
        m, s = bar_numbers(merged), bar_numbers(single)
        assert len(s) == mine.sum() > len(m) > 0  # fewer bars, none lost:
        assert m[:, FLOPS].sum() == pytest.approx(bars.flops[mine].sum())
        assert m[:, DUR_S].sum() >= s[:, DUR_S].sum() * (1 - 1e-9)  # a block spans its ops
        starts, ends = m[:, START_S], m[:, START_S] + m[:, DUR_S]
        assert (starts[1:] >= ends[:-1] - 1e-12).all()  # blocks do not overlap
        inside = [  # each op lies inside exactly one block
            ((starts <= a + 1e-15) & (a + b <= ends + 1e-12)).sum()
            for a, b in zip(s[:, START_S], s[:, DUR_S])
        ]
        assert inside == [1] * len(s)
        assert all("ops</b>" in text for text in merged["hovertext"])
    # the task labels are the same either way: the 1F1B order
    assert _labels_by_row(whole, rows) == _labels_by_row(each, rows)


def test_a_step_without_transfers_draws_its_blocks():
    # a data-parallel forward step sends nothing: each device's communication row is empty
    g = transforms.parallelize(models.gpt(8, 16, 32, 4, 64, 2), dp=4)
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 4))
    traces, _ = gantt_spec(result, g, blocks_above=1)
    kinds = {t["meta"]["kind"]: t for t in traces}
    assert all(t["meta"]["blocks"] for t in traces if t["meta"]["kind"] == "compute")
    assert len(bar_numbers(kinds["communication"])) == int((result.bars.stream != 0).sum())


def test_zooming_into_a_blocked_step_draws_each_op():
    from widgets.chart import Chart
    from widgets.gantt_zoom import GanttZoom

    t = transforms.training(models.gpt(8, 16, 32, 4, 64, 4), "adam")
    g = transforms.parallelize(t, dp=2, pp=2, microbatches=4, schedule="1f1b")
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 4))
    limit = int((result.bars.stream == 0).sum()) // 2  # the step is over it, a tenth is not
    chart = Chart(*gantt_spec(result, g, blocks_above=limit))
    zoom = GanttZoom(chart, result, g, blocks_above=limit)
    assert chart.traces[0]["meta"]["blocks"]
    t0, t1 = 0.40 * result.step_time_s, 0.50 * result.step_time_s
    unit = time_unit(result.step_time_s)[1]  # the axis is in the step's unit
    chart.zoomed = {"range": [t0 / unit, t1 / unit], "n": 1}
    assert zoom.window == pytest.approx((t0, t1))
    assert not any(tr["meta"].get("blocks") for tr in chart.traces)
    chart.zoomed = {"autorange": True, "n": 2}
    assert chart.traces[0]["meta"]["blocks"]
