"""The search's figure: what is drawn is the result's rows, the front joined in order."""

from __future__ import annotations

import html
from dataclasses import replace

import pytest

import ir
from ir import models
from ir.search import search
from widgets import pareto_figure, pareto_spec, picked_annotations, rows_html
from widgets.palette import DEVICE_PALETTE, STRATEGY_COLOR
from widgets.units import format_bytes, format_time


@pytest.fixture(scope="module")
def result():
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    return search(f, ir.Topology.preset("a100-hgx", 4), progress=False, zero=(0, 1))


def test_every_simulated_strategy_is_a_point_and_the_front_is_joined(result) -> None:
    capacity = 2 * max(r.peak_memory_bytes for r in result.simulated())
    spec = pareto_spec(result, capacity_bytes=capacity)
    *groups, front = spec["traces"]
    drawn = sorted(t for g in groups for t in g["text"])
    assert drawn == sorted(str(r.strategy) for r in result.rows if r.status == "ok")
    assert front["name"] == "Pareto front"
    assert front["text"] == [str(r.strategy) for r in result.pareto()]
    assert front["y"] == [r.step_time_s * 1e3 for r in result.pareto()]
    assert front["y"] == sorted(front["y"]) and front["x"] == sorted(front["x"], reverse=True)
    assert spec["layout"]["shapes"][0]["x0"] == pytest.approx(capacity / 2**30)
    assert {g["name"] for g in groups} == {f"pp = {r.strategy.pp}" for r in result.simulated()}
    # one colour, a shape each: no strategy family wears a device's colour
    assert {g["marker"]["color"] for g in groups} == {STRATEGY_COLOR}
    assert not {g["marker"]["color"] for g in groups} & set(DEVICE_PALETTE)
    symbols = [g["marker"]["symbol"] for g in groups]
    assert len(set(symbols)) == len(symbols)


def test_strategies_over_capacity_are_crossed_out(result) -> None:
    first = next(i for i, r in enumerate(result.rows) if r.ok)
    rows = [
        replace(r, status="over capacity") if i == first else r for i, r in enumerate(result.rows)
    ]
    spec = pareto_spec(type(result)(rows))
    over = spec["traces"][-1]
    assert over["name"] == "over capacity" and over["text"] == [str(rows[first].strategy)]
    figure = pareto_figure(type(result)(rows))
    assert [t.name for t in figure.data][-1] == "over capacity"


def test_a_capacity_far_beyond_every_peak_is_named_not_drawn(result) -> None:
    """80 GB beside peaks of a few MB: a line there would squeeze every point onto the axis."""
    spec = pareto_spec(result, capacity_bytes=80e9)
    assert spec["layout"]["shapes"] == []
    assert "capacity 74.5 GiB per device" in spec["layout"]["title"]["text"]
    largest = max(x for t in spec["traces"] for x in t["x"])
    assert largest < 80e9 / 2**30 / 4


def test_picked_points_are_labelled_where_the_chart_draws_them(result) -> None:
    a, b = result.simulated()[:2]
    marks = picked_annotations([a, b])
    assert [(m["text"], m["x"], m["y"]) for m in marks] == [
        ("<b>A</b>", a.peak_memory_bytes / 2**30, a.step_time_s * 1e3),
        ("<b>B</b>", b.peak_memory_bytes / 2**30, b.step_time_s * 1e3),
    ]
    spec = pareto_spec(result)
    drawn = {(x, y) for t in spec["traces"] for x, y in zip(t["x"], t["y"])}
    assert {(m["x"], m["y"]) for m in marks} <= drawn
    assert picked_annotations([]) == []


def test_rows_html_tables_two_rows_figures_side_by_side(result) -> None:
    a, b = result.simulated()[:2]
    table = rows_html([a, b])
    assert f"<th>A: {a.strategy}</th><th>B: {b.strategy}</th>" in table
    assert f"<tr><th>MFU</th><td>{a.mfu:.1%}</td><td>{b.mfu:.1%}</td></tr>" in table
    assert f"<td>{format_time(b.exposed_comm_s)}</td>" in table
    assert f"<td>{format_bytes(a.peak_memory_bytes)}</td>" in table
    assert "why not simulated" not in table
    refused = next(r for r in result.rows if r.status in ("error", "pruned"))
    table = rows_html([a, refused], labels=("X", "Y"))
    assert f"<th>Y: {refused.strategy}</th>" in table
    step = format_time(a.step_time_s)
    assert f"<tr><th>step time</th><td>{step}</td><td></td></tr>" in table
    why = html.escape(refused.error)
    assert f"<tr><th>why not simulated</th><td></td><td>{why}</td></tr>" in table


def test_the_title_counts_cancelled_strategies_and_leaves_them_out(result) -> None:
    assert "cancelled" not in pareto_spec(result)["layout"]["title"]["text"]
    rows = [
        replace(r, status="cancelled") if r.ok and i % 2 else r for i, r in enumerate(result.rows)
    ]
    n = sum(r.status == "cancelled" for r in rows)
    spec = pareto_spec(type(result)(rows))
    assert f"refused, {n} cancelled" in spec["layout"]["title"]["text"]
    drawn = {t for trace in spec["traces"] for t in trace["text"]}
    assert not drawn & {str(r.strategy) for r in rows if r.status == "cancelled"}
