"""The search's figure: what is drawn is the result's rows, the front joined in order."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ir
from ir import models
from ir.search import search
from widgets import pareto_figure, pareto_spec


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


def test_strategies_over_capacity_are_crossed_out(result) -> None:
    rows = [
        replace(r, status="over capacity") if i == 0 and r.ok else r
        for i, r in enumerate(result.rows)
    ]
    spec = pareto_spec(type(result)(rows))
    over = spec["traces"][-1]
    assert over["name"] == "over capacity" and over["text"] == [str(rows[0].strategy)]
    figure = pareto_figure(type(result)(rows))
    assert [t.name for t in figure.data][-1] == "over capacity"


def test_a_capacity_far_beyond_every_peak_is_named_not_drawn(result) -> None:
    """80 GB beside peaks of a few MB: a line there would squeeze every point onto the axis."""
    spec = pareto_spec(result, capacity_bytes=80e9)
    assert spec["layout"]["shapes"] == []
    assert "capacity 74.5 GiB per device" in spec["layout"]["title"]
    largest = max(x for t in spec["traces"] for x in t["x"])
    assert largest < 80e9 / 2**30 / 4
