"""The workbench without a browser: session state, undo/redo, errors, editor, dashboard, report."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ir
import ir.sharding.facts as facts_module
from ir import models
from ir.sharding import Mesh, R, S
from ir.sharding.rules import rule_for
from widgets import gantt_figure, memory_figure, op_id_at
from widgets.live import plotted
from workbench import Session, Strategy
from workbench.__main__ import lab_command, main, parser
from workbench.dashboard import Workbench, base_name, build_payloads
from workbench.editor import ShardingEditor, mesh_annotation, parse_devices, parse_spec
from workbench.report import ReportConfig, write_report
from workbench.session import SessionError


@pytest.fixture(scope="module")
def mlp() -> ir.Function:
    return models.mlp(8, 16, 32, 4)


@pytest.fixture(scope="module")
def topology() -> ir.Topology:
    return ir.Topology.preset("a100-hgx", 4)


def _outputs(f: ir.Function, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``f``'s outputs on the sequential ``inputs`` (a steady-state step's laid out and back)."""
    return [np.asarray(o) for o in ir.execute_step(f, inputs, rtol=1e-5)]


def test_annotation_propagates_simulates_and_executes_like_the_original(mlp, topology):
    s = Session(mlp, topology)
    sequential_s = s.result.step_time_s
    assert s.result.devices == (0,)
    assert s.annotate("wA", (Mesh((4,)), [S(1)]))
    assert s.error is None
    assert set(s.result.devices) == {0, 1, 2, 3}
    assert s.result.step_time_s != sequential_s
    assert s.current.report.layouts["wA"] == ("S(1)",)
    inputs = ir.random_inputs(mlp, seed=0)
    for got, want in zip(_outputs(s.function, inputs), _outputs(mlp, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_session_reads_its_programs_rules_once_over_every_click(mlp, topology, monkeypatch):
    reads: list = []

    def counted(op, *args, **kwargs):
        reads.append(op)
        return rule_for(op, *args, **kwargs)

    monkeypatch.setattr(facts_module, "rule_for", counted)
    s = Session(mlp, topology)
    assert s.annotate("wA", (Mesh((4,)), [S(1)]))
    assert sorted(map(id, reads)) == sorted(map(id, mlp.ops))
    assert s.annotate("wA", (Mesh((2,)), [S(1)]))  # a new mesh: a new propagation
    assert s.annotate("x", (Mesh((2,)), [S(0)]))
    assert len(reads) == len(mlp.ops)  # each op's rule read by the first click only
    # another session keeps its own facts; taking it over takes its program's facts
    other = models.mlp(8, 16, 32, 4)
    t = Session(other, topology)
    s.adopt(t)
    assert s.annotate("wA", (Mesh((4,)), [S(1)])), s.error
    assert sorted(map(id, reads[len(mlp.ops) :])) == sorted(map(id, other.ops))


def test_undo_redo_walks_the_history_and_a_new_change_clears_redo(mlp, topology):
    s = Session(mlp, topology)
    first = s.function
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    annotated = s.function
    assert s.can_undo and not s.can_redo
    assert s.undo() and s.function is first and s.annotations == {}
    assert s.redo() and s.function is annotated
    assert not s.redo() and s.error == "nothing to redo"
    s.undo()
    s.annotate("x", (Mesh((4,)), [S(0)]))
    assert not s.can_redo
    assert list(s.annotations) == ["x"]


def test_a_failed_annotation_keeps_the_previous_state(mlp, topology):
    s = Session(mlp, topology)
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    before = (s.state, s.function, s.result)
    assert not s.annotate("wA", (Mesh((4,)), [S(5)]))
    assert "S(5)" in s.error and "wA" in s.error
    assert (s.state, s.function, s.result) == before
    assert not s.annotate("nope", (Mesh((4,)), [R]))
    assert "'nope'" in s.error and "wA" in s.error
    assert (s.state, s.function, s.result) == before
    assert s.annotate("x", (Mesh((4,)), [S(0)])) and s.error is None


def test_strategies_replace_annotations_and_undo_restores_them(mlp, topology):
    s = Session(mlp, topology)
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    assert s.set_strategy(dp=2)
    assert s.annotations == {} and s.strategy == Strategy(dp=2)
    assert any(op.op_type == "Pmap" for op in s.function.ops)
    assert set(s.result.devices) == {0, 1}
    assert not s.set_strategy(dp=0) and "dp must be a positive integer" in s.error
    assert s.strategy == Strategy(dp=2)
    s.undo()
    assert list(s.annotations) == ["wA"]


def test_listeners_hear_every_change_including_failures(mlp, topology):
    s = Session(mlp, topology)
    heard: list[str | None] = []
    s.on_change(lambda session: heard.append(session.error))
    s.annotate("wA", (Mesh((2,)), [S(1)]))
    s.annotate("wA", (Mesh((2,)), [S(9)]))
    s.undo()
    assert heard[0] is None and "S(9)" in heard[1] and heard[2] is None


def test_strategy_text():
    assert Strategy.parse("dp=2,hp=2,pp=2,microbatches=4,schedule=1f1b").num_devices == 8
    assert Strategy.parse("").is_sequential
    with pytest.raises(SessionError, match="key=value"):
        Strategy.parse("dp2")
    with pytest.raises(SessionError, match="schedule"):
        Strategy.parse("pp=2,schedule=zigzag")


def test_editor_reads_meshes_and_onnx_specs():
    mesh, placements = mesh_annotation("2x2", ["S(0)", "P(sum)"], "4..7")
    assert mesh.shape == (2, 2) and mesh.devices == (4, 5, 6, 7)
    assert [str(p) for p in placements] == ["S(0)", "P(sum)"]
    spec = parse_spec("devices=[0, 1, 2, 3], sharded_dims=[(0, 2), (1, 2)]")
    assert spec.sharded_dims == ((0, 2), (1, 2))
    with pytest.raises(SessionError, match="one per mesh axis"):
        mesh_annotation("2x4", ["S(0)"])
    with pytest.raises(SessionError, match="lists 3 device"):
        parse_devices("0,1,2", 4)
    with pytest.raises(SessionError, match="give the devices"):
        parse_spec("sharded_dims=[(0, 2)]")


def test_editor_buttons_apply_remove_undo(mlp, topology):
    s = Session(mlp, topology)
    editor = ShardingEditor(s)
    assert editor.apply_button.disabled
    editor.select("wA")
    editor.mesh_shape.value = "4"
    editor.placements.children[0].value = "S(1)"
    editor.apply_button.click()
    assert s.annotations["wA"][0].shape == (4,)
    editor.refresh()
    assert not editor.remove_button.disabled and not editor.undo_button.disabled
    editor.mode.value = "spec"
    editor.spec.value = "devices=[0, 1] sharded_dims=[(7, 2)]"
    editor.apply_button.click()
    editor.refresh()
    assert "failed" in editor.status.value and "wA" in editor.status.value
    assert s.annotations["wA"][0].shape == (4,)
    editor.undo_button.click()
    assert s.annotations == {}


def test_dashboard_redraws_every_view_after_a_click_and_apply(mlp, topology):
    wb = Workbench(mlp, topology)
    svg, gantt, summary = wb.graph.svg, wb.gantt, wb.summary.value
    title = gantt.figure_layout["title"]["text"]
    wb.graph.clicked = {"id": "in-0", "n": 1}  # what graph.js reports for a click on wA
    assert wb.editor.value_name == "wA"
    assert "wA" in wb.selection.value
    wb.editor.placements.children[0].value = "S(1)"
    wb.editor.apply_button.click()
    assert wb.session.error is None
    assert wb.graph.svg != svg and wb.summary.value != summary
    assert "annotated: wA" in wb.summary.value
    # the same widget, redrawn, shows what a new figure of the new state shows
    assert wb.gantt is gantt and wb.gantt.figure_layout["title"]["text"] != title
    rows = wb.gantt.figure_layout["yaxis"]["ticktext"]
    assert {rows[int(y)] for t in wb.gantt.traces for y in t["y"]} >= {"dev 3 · comp"}
    d = wb.session.current
    for widget, fresh in (
        (wb.gantt, gantt_figure(d.result, d.function)),
        (wb.memory, memory_figure(d.result)),
    ):
        assert plotted(widget) == plotted(fresh)
    wb.graph.clicked = {"id": "in-0", "n": 2}
    assert wb.editor.value_name == "wA"


def test_dashboard_maps_per_device_copies_back_to_original_values():
    assert base_name("wA_3", ["wA", "wB", "x"]) == "wA"
    assert base_name("h0_mlp_w1_s", ["h0_mlp_w1", "h0_mlp_w"]) == "h0_mlp_w1"
    assert base_name("tmp", ["x"]) is None


def test_payloads_for_the_original_view_carry_placements(mlp, topology):
    s = Session(mlp, topology)
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    p = build_payloads(s, view="original")
    assert "S(1)" in p.graph.dot
    assert p.gantt.data and p.memory.data and "step time" in p.summary_html


def test_report_is_self_contained(tmp_path, mlp):
    config = ReportConfig(model="mlp", devices=4, strategies=("dp=2", "hp=2", "dp=99"))
    page = write_report(tmp_path / "r.html", mlp, config).read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", page)
    assert not re.search(r"<link[^>]+href=[\"']?https?:", page)
    assert re.search(r"plotly\.js v\d", page)  # the bundle itself, inlined
    assert page.count("<svg") >= 2 and "dp=99" in page and "A = dp=2 vs B = hp=2" in page


def test_cli_report_with_defaults_for_everything_but_size(tmp_path):
    out = tmp_path / "cli.html"
    argv = ["report", "--model", "mlp", "--devices", "4", "--strategy", "dp=4", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "dp=4" in out.read_text()
    defaults = parser().parse_args(["report"])
    assert (defaults.model, defaults.devices, defaults.out) == ("gpt", 8, "report.html")


def test_lab_command_serves_the_notebooks_with_a_token():
    cmd = lab_command(port=8123, token="abc", as_root=True)
    assert "--IdentityProvider.token=abc" in cmd and "--allow-root" in cmd
    # the workspace: copies of the notebooks, so the committed ones stay clean
    assert any(a.startswith("--notebook-dir=") and a.endswith("build/workbench") for a in cmd)
    assert "--allow-root" not in lab_command(port=1, token="", as_root=False)


def test_a_transform_output_is_drawn_as_its_logical_program(mlp, topology):
    wb = Workbench(mlp, topology, max_graph_ops=5)
    assert wb.set_strategy(dp=4)
    d = wb.session.current
    assert wb.graph.function is d.function and wb.graph.options.view == "logical"
    drawn = [i for i in wb.graph.rendered.id_map if i.startswith("op-")]
    assert drawn and all("." not in i for i in drawn)  # no pmap body unrolled
    assert "max_graph_ops" not in wb.summary.value
    assert set(wb.redraw_s) == {"graph", "gantt", "memory"}
    wb.view.value = "unrolled"  # too big to unroll: says so, keeps the logical view
    assert "max_graph_ops=5" in wb.summary.value and wb.graph.options.view == "logical"
    wb.view.value = "original"
    assert wb.graph.function is mlp and wb.graph.options.view == "unrolled"


def test_a_gantt_bar_click_selects_its_op_in_the_graph(mlp, topology):
    wb = Workbench(mlp, topology)
    wb.set_strategy(dp=2)
    trace = next(i for i, t in enumerate(wb.gantt.traces) if t["meta"]["kind"] == "compute")
    assert op_id_at(wb.gantt, trace, 0)
    wb.gantt.clicked = {"trace": trace, "point": 0, "n": 1}  # what chart.js reports
    selection = wb.graph.selection
    assert selection is not None and selection.kind == "op" and selection.op is not None
    assert wb.editor.value_name in wb.session.annotatable()


def test_an_onnx_spec_from_the_editor_equals_the_mesh_annotation(mlp, topology):
    s = Session(mlp, topology)
    editor = ShardingEditor(s)
    editor.select("wA")
    editor.mode.value = "spec"
    editor.spec.value = "devices=[0, 1, 2, 3] sharded_dims=[(1, 4)]"
    editor.apply_button.click()
    assert s.error is None
    by_spec = s.function
    s.undo()
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    assert s.function.is_equivalent(by_spec)


def test_compare_shows_the_previous_state_next_to_this_one(mlp, topology):
    wb = Workbench(mlp, topology)
    with pytest.raises(KeyError, match="make a change first") as e:  # issue 25: not bare
        wb.compare()
    assert isinstance(e.value, ir.DistIRError) and str(e.value).startswith("compare: nothing")
    wb.set_strategy(dp=2)
    fig = wb.compare()
    titles = [a.text for a in fig.layout.annotations]
    assert any("before: sequential" in t for t in titles)
    assert any("now: dp=2" in t for t in titles)
    assert wb.session.previous.state.strategy.is_sequential


def test_the_charts_fill_the_dashboards_width(mlp, topology):
    wb = Workbench(mlp, topology)
    wb.set_strategy(dp=2)
    for chart in (wb.gantt, wb.memory):
        # the browser sizes the chart to its box (no width round trip through the kernel)
        assert chart.layout.width == "100%" and "width" not in chart.figure["layout"]


def test_a_failed_strategy_keeps_the_knobs_as_typed_a_change_shows_the_strategy(mlp, topology):
    wb = Workbench(mlp, topology)
    wb.dp.value, wb.pp.value = 4, 1
    wb.microbatches.value = 3  # the batch of 8 does not split into 4 x 3
    apply = next(b for b in wb.strategy_buttons if "distir-apply-strategy" in b._dom_classes)
    apply.click()
    assert wb.session.error and "does not split" in wb.session.error
    assert (wb.dp.value, wb.microbatches.value) == (4, 3)  # what the user typed, to fix
    assert wb.set_strategy(dp=2, pp=2, microbatches=2)  # a change from code: the knobs follow
    assert (wb.dp.value, wb.pp.value, wb.microbatches.value) == (2, 2, 2)
    wb.undo()
    assert (wb.dp.value, wb.pp.value, wb.microbatches.value) == (1, 1, 1)


def test_the_program_as_written_wears_the_colours_of_the_devices_it_is_placed_on(mlp, topology):
    from widgets.palette import device_color

    wb = Workbench(mlp, topology)
    wb.view.value = "original"
    before = wb.graph.rendered.dot
    assert device_color(3) not in before  # the program as written: everything on device 0
    assert wb.annotate("wA", (Mesh((4,)), [S(1)]))
    dot = wb.graph.rendered.dot
    node = next(line for line in dot.splitlines() if '"in-0"' in line and "fillcolor" in line)
    assert all(device_color(d) in node for d in range(4)), node  # wA: split over 4 devices
    assert "S(1)" in dot  # and its placement on its edges
