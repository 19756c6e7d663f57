"""The dashboard's search: one call (the "Search all" button) simulates every strategy, shows
the chart, and applying a row gives the very program and figures the search simulated."""

from __future__ import annotations

import pytest

import ir
from ir import models
from ir.search import Row
from widgets.chart import Chart
from widgets.units import format_bytes, format_time
from workbench import Workbench
from workbench.session import SessionError


def test_search_all_shows_the_front_and_applies_what_it_simulated() -> None:
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    result = wb.search()
    assert wb.search_box.children == (wb.search_panel,)
    figure = wb.search_panel.figure
    assert isinstance(figure, Chart) and figure in wb.search_panel.chart.children
    assert [t["name"] for t in figure.traces][-1] == "Pareto front"
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
    chart = wb.search_panel.figure
    for i, trace in enumerate(chart.traces):
        if label in trace.get("text", []):
            k = list(trace["text"]).index(label)
            chart.clicked = {"trace": i, "point": k, "n": chart.clicked.get("n", 0) + 1}
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
    assert panel.figure.to_figure().layout.annotations == ()


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
    table, chart = panel.comparison.children
    assert isinstance(chart, Chart)
    figure = chart.to_figure()
    titles = [t.text for t in figure.layout.annotations]
    assert titles[0] == (
        f"<b>A: {a.strategy} · step {format_time(a.step_time_s)} · "
        f"peak {format_bytes(a.peak_memory_bytes)}</b>"
    )
    assert titles[1].startswith(f"<b>B: {b.strategy} · step {format_time(b.step_time_s)}")
    names = {t.name for t in figure.data if t.name}
    assert any(n.startswith("A: ") for n in names) and any(n.startswith("B: ") for n in names)
    assert f"A: {a.strategy}" in table.value and f"{b.mfu:.1%}" in table.value
    marks = [(m.text, m.x, m.y) for m in panel.figure.to_figure().layout.annotations]
    assert marks == [
        ("<b>A</b>", a.peak_memory_bytes / 2**30, a.step_time_s * 1e3),
        ("<b>B</b>", b.peak_memory_bytes / 2**30, b.step_time_s * 1e3),
    ]
    _click(wb, rows[1])  # a third click: B becomes A, the new point B
    assert [r for r, _ in panel.picked] == [b, rows[1]]
    assert f"A: {b.strategy}" in panel.comparison.children[0].value
    panel.compare_mode.value = False  # switching off forgets the picks
    assert panel.picked == [] and panel.comparison.children == ()
    assert panel.figure.to_figure().layout.annotations == ()


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
    assert figure.figure_layout["title"]["text"] == f"A: {plain.strategy} vs B: {other.strategy}"
    with pytest.raises(SessionError, match="cannot express it"):
        wb.compare_search_rows(plain, zero)
    assert [r for r, _ in wb.search_panel.picked] == [plain]  # the refused row not picked


def test_search_all_runs_as_a_task_shows_progress_and_stops_on_cancel() -> None:
    f = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 4))
    activity, seen = wb.activity, []
    step = activity.step

    def watch(done: int, total: int, what: str = "") -> None:
        step(done, total, what)
        seen.append((done, total, activity.progress.value, activity.progress.max))
        if done == 2:
            activity.cancel_button.click()  # the user's click on Cancel, mid-search

    activity.step = watch
    search = next(b for b in wb.strategy_buttons if "distir-search" in b._dom_classes)
    search.click()
    task = activity.task
    assert task is not None and activity.busy
    assert all(b.disabled for b in wb._action_buttons())  # no second action meanwhile
    task.join(120)
    assert task.cancelled and not activity.busy
    total = seen[0][1]
    assert [s[:2] for s in seen] == [(1, total), (2, total)] and total > 2
    assert seen[-1][2:] == (2, total)  # the bar shows 2 of all to simulate
    result = wb.search_result
    statuses = [r.status for r in result.rows]
    assert statuses.count("ok") + statuses.count("error") == 2 and "cancelled" in statuses
    cancelled = len(result.rows) - 2  # every strategy not decided when Cancel came
    assert f"{cancelled} cancelled" in wb.search_panel.figure.figure_layout["title"]["text"]
    assert not search.disabled and wb.editor.undo_button.disabled is not wb.session.can_undo


def test_a_short_action_says_it_is_working_and_disables_the_buttons_meanwhile() -> None:
    wb = Workbench(
        models.mlp(16, 8, 8, 4, layers=2, training=True), ir.Topology.preset("a100-hgx", 2)
    )
    during: list[tuple[bool, str, list[bool]]] = []
    wb.session.on_change(
        lambda _s: during.append(
            (
                wb.activity.busy,
                wb.activity.message.value,
                [b.disabled for b in wb._action_buttons()],
            )
        )
    )
    apply = next(b for b in wb.strategy_buttons if "distir-apply-strategy" in b._dom_classes)
    wb.dp.value = 2
    apply.click()
    ((busy, message, disabled),) = during
    assert busy and "distir-spin" in message and "transforming and simulating" in message
    assert all(disabled)
    assert not wb.activity.busy and wb.activity.message.value == ""
    assert (
        not apply.disabled and not wb.editor.undo_button.disabled and wb.editor.redo_button.disabled
    )
    assert wb.activity.last_s > 0


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
