"""The dashboard's search: one call (the "Search all" button) simulates every strategy, shows
the chart, and applying a row gives the very program and figures the search simulated."""

from __future__ import annotations

import plotly.graph_objects as go

import ir
from ir import models
from workbench import Workbench


def test_search_all_shows_the_front_and_applies_what_it_simulated() -> None:
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    result = wb.search()
    (figure,) = wb.search_box.children
    assert isinstance(figure, go.FigureWidget)
    assert [t.name for t in figure.data][-1] == "Pareto front"
    for row in (result.best(), result.pareto()[-1]):
        assert wb.apply_search_row(row)
        shown = wb.session.current
        assert shown.result.step_time_s == row.step_time_s
        assert max(shown.result.peak_memory_bytes.values()) == row.peak_memory_bytes
        assert (wb.dp.value, wb.hp.value, wb.pp.value) == (
            row.strategy.dp,
            row.strategy.tp,
            row.strategy.pp,
        )


def test_a_row_the_knobs_cannot_express_is_refused_with_a_message() -> None:
    f = models.mlp(16, 8, 8, 4, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 2))
    result = wb.search(zero=(1,), dp=2, tp=1, pp=1)
    (row,) = [r for r in result.rows if r.status == "ok"]
    before = wb.session.state
    assert not wb.apply_search_row(row)
    assert "cannot express" in wb.session.error
    assert wb.session.state == before
