"""The dashboard's search: one call (the "Search all" button) simulates every strategy, shows
the chart, and applying a row gives the very program and figures the search simulated."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from plotly.callbacks import Points

import ir
from ir import models
from ir.search import Row
from widgets.units import format_bytes, format_time
from workbench import Workbench
from workbench.session import SessionError


def test_search_all_shows_the_front_and_applies_what_it_simulated() -> None:
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    result = wb.search()
    assert wb.search_box.children == (wb.search_panel,)
    figure = wb.search_panel.figure
    assert isinstance(figure, go.FigureWidget) and figure in wb.search_panel.chart.children
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


def _click(wb: Workbench, row: Row) -> None:
    """Click ``row``'s point on the chart as the browser reports it (the first trace that
    draws it, its index there)."""
    label = str(row.strategy)
    for i, trace in enumerate(wb.search_panel.figure.data):
        if trace.text is not None and label in trace.text:
            k = list(trace.text).index(label)
            trace._dispatch_on_click(
                Points(point_inds=[k], xs=[trace.x[k]], ys=[trace.y[k]], trace_index=i), None
            )
            return
    raise AssertionError(f"{label} is not drawn")


@pytest.fixture(scope="module")
def searched() -> tuple[Workbench, list[Row]]:
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    result = wb.search()
    rows = result.simulated()
    assert len({r.step_time_s for r in rows}) >= 3  # distinct points to tell apart
    return wb, rows


def test_a_click_without_compare_loads_the_strategy_and_compares_nothing(searched) -> None:
    wb, rows = searched
    panel = wb.search_panel
    panel.compare_mode.value = False
    _click(wb, rows[1])
    assert wb.session.current.result.step_time_s == rows[1].step_time_s
    assert panel.picked == [] and panel.comparison.children == ()
    assert panel.figure.layout.annotations == ()


def test_two_clicks_in_compare_mode_show_both_strategies_side_by_side(searched) -> None:
    wb, rows = searched
    panel = wb.search_panel
    panel.compare_mode.value = True
    a, b = rows[-1], rows[0]
    _click(wb, a)
    assert [r for r, _ in panel.picked] == [a] and panel.comparison.children == ()
    assert f"A = {a.strategy}; click a second point" in panel.status.value
    _click(wb, b)
    assert wb.session.current.result.step_time_s == b.step_time_s  # the last click is loaded
    (shown_a, shown_b) = [d for _, d in panel.picked]
    assert shown_a.result.step_time_s == a.step_time_s
    assert max(shown_b.result.peak_memory_bytes.values()) == b.peak_memory_bytes
    table, figure = panel.comparison.children
    assert isinstance(figure, go.FigureWidget)
    titles = [t.text for t in figure.layout.annotations]
    assert titles[0] == (
        f"A: {a.strategy}: step {format_time(a.step_time_s)}, "
        f"peak {format_bytes(a.peak_memory_bytes)}"
    )
    assert titles[1].startswith(f"B: {b.strategy}: step {format_time(b.step_time_s)}")
    names = {t.name for t in figure.data if t.name}
    assert any(n.startswith("A: ") for n in names) and any(n.startswith("B: ") for n in names)
    assert f"A: {a.strategy}" in table.value and f"{b.mfu:.1%}" in table.value
    marks = [(m.text, m.x, m.y) for m in panel.figure.layout.annotations]
    assert marks == [
        ("<b>A</b>", a.peak_memory_bytes / 2**30, a.step_time_s * 1e3),
        ("<b>B</b>", b.peak_memory_bytes / 2**30, b.step_time_s * 1e3),
    ]
    _click(wb, rows[1])  # a third click: B becomes A, the new point B
    assert [r for r, _ in panel.picked] == [b, rows[1]]
    assert f"A: {b.strategy}" in panel.comparison.children[0].value
    panel.compare_mode.value = False  # switching off forgets the picks
    assert panel.picked == [] and panel.comparison.children == ()
    assert panel.figure.layout.annotations == ()


def test_compare_search_rows_from_code_and_a_row_the_knobs_cannot_load() -> None:
    f = models.mlp(16, 8, 8, 4, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 2))
    with pytest.raises(SessionError, match="run search"):
        wb.compare_search_rows(None, None)
    result = wb.search(zero=(0, 1))
    plain, other = [r for r in result.simulated() if not r.strategy.zero][:2]
    zero = next(r for r in result.simulated() if r.strategy.zero)
    figure = wb.compare_search_rows(plain, other)
    assert figure is wb.search_panel.comparison.children[-1]
    assert figure.layout.title.text == f"A: {plain.strategy} vs B: {other.strategy}"
    with pytest.raises(SessionError, match="cannot express it"):
        wb.compare_search_rows(plain, zero)
    assert [r for r, _ in wb.search_panel.picked] == [plain]  # the refused row not picked


def test_the_chart_is_redrawn_as_simulated_rows_come_in(monkeypatch) -> None:
    """Each simulated row that fits redraws the chart with the rows so far (the clock is
    stepped a second a call, so none is skipped), the last with the whole result."""
    import itertools

    import workbench.dashboard_panels as panels

    clock = itertools.count()
    monkeypatch.setattr(panels.time, "monotonic", lambda: float(next(clock)))
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    shown: list[int] = []
    real = wb.search_panel.show

    def show(result, **kw):
        shown.append(len(result.rows))
        return real(result, **kw)

    monkeypatch.setattr(wb.search_panel, "show", show)
    result = wb.search()
    ok = sum(r.ok for r in result.rows)
    assert len(shown) == ok + 1  # one per simulated row that fits, then the whole
    assert shown == sorted(shown) and shown[-1] == len(result.rows)
