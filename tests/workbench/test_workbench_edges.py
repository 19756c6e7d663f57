"""Issue 17, class 7: what the editor, the listeners and the report's CLI do at the edges."""

from __future__ import annotations

import html
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ir
from ir import models
from ir.sharding import Mesh, S
from workbench import Session
from workbench.__main__ import main
from workbench.editor import ShardingEditor, parse_devices, parse_mesh_shape
from workbench.session import ListenerWarning, SessionError

MLP = models.mlp(8, 16, 32, 4)
TOPOLOGY = ir.Topology.preset("a100-hgx", 4)

_odd = st.sampled_from(["²", "٣", "1" * 5000, "9" * 20, "-1", "inf", "1e9", "0", "", "x"])
numbers = st.one_of(st.integers(0, 10**40).map(str), st.integers(1, 4).map(str), _odd)
shapes = st.one_of(
    st.lists(numbers, min_size=1, max_size=40).map("x".join),
    st.integers(17, 5000).map(lambda n: "x".join(["1"] * n)),
    st.text(max_size=30),
)
devices = st.one_of(
    st.just(""),
    st.tuples(numbers, numbers).map(lambda p: f"{p[0]}..{p[1]}"),
    st.lists(numbers, max_size=6).map(", ".join),
    st.text(max_size=30),
)
specs = st.one_of(
    st.integers(1, 3000).map(lambda n: "devices=" + "[" * n),
    st.tuples(numbers, numbers).map(lambda p: f"devices=[{p[0]}] sharded_dims=[(0, {p[1]})]"),
    st.sampled_from(["devices=5", "devices=[0, 1] device_map={0: 5}", "devices=[0] dims=[1]"]),
    st.text(max_size=40).map(lambda t: "devices=" + t),
)


@pytest.fixture(scope="module")
def editor() -> ShardingEditor:
    editor = ShardingEditor(Session(MLP, TOPOLOGY))
    editor.session.on_change(lambda _s: editor.refresh())  # as the dashboard does
    editor.select("wA")
    return editor


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes, devices_text=devices, spec=specs, mode=st.sampled_from(["mesh", "spec"]))
def test_whatever_is_typed_apply_shows_a_message_or_applies(
    editor, shape, devices_text, spec, mode
):
    session = editor.session
    before = session.current
    start = time.perf_counter()
    editor.mode.value = mode
    editor.mesh_shape.value = shape  # rebuilds the placement dropdowns as typed
    editor.devices.value = devices_text
    editor.spec.value = spec
    editor._on_apply()  # what the Apply button calls
    assert time.perf_counter() - start < 10
    if session.current is before:
        assert session.error and html.escape(session.error) in editor.status.value
        assert "Error: " not in session.error.split(":")[0]  # no bare Python exception name
    else:
        assert session.undo()  # applied: back to the start for the next example
    assert len(editor.placements.children) <= 16


def test_huge_meshes_and_device_ranges_are_refused_before_they_are_made():
    with pytest.raises(SessionError, match="MAX_DEVICES"):
        parse_mesh_shape("100000000000x100000000000")
    with pytest.raises(SessionError, match="at most 16"):
        parse_mesh_shape("x".join(["1"] * 100))
    with pytest.raises(SessionError, match="positive sizes"):
        parse_mesh_shape("2x²")
    with pytest.raises(SessionError, match="more devices than"):
        parse_devices("0..100000000000000", 4)
    with pytest.raises(ir.DistIRError, match="MAX_DEVICES"):
        Mesh((10**30,))


def test_a_listener_that_raises_is_reported_and_the_change_stands():
    s = Session(MLP, TOPOLOGY)
    heard = []

    def boom(_session: Session) -> None:
        raise RuntimeError("a broken view")

    s.on_change(boom)
    s.on_change(lambda session: heard.append(session.state.describe()))
    with pytest.warns(ListenerWarning, match="boom raised RuntimeError: a broken view"):
        assert s.annotate("wA", (Mesh((4,)), [S(1)])) is True
    assert s.annotations["wA"] == (Mesh((4,)), (S(1),)) and s.error is None
    assert heard == ["annotated: wA: mesh (4,) [S(1)]"]  # later listeners still hear it
    assert [str(e) for e in s.listener_errors] == ["a broken view"]
    assert s.can_undo and s.previous is not None
    with pytest.warns(ListenerWarning):
        assert s.undo() and s.annotations == {}
    with pytest.warns(ListenerWarning):
        assert not s.undo() and s.error == "nothing to undo"


def test_a_chart_that_cannot_be_drawn_says_so_in_the_summary(monkeypatch):
    from workbench import Workbench, dashboard

    wb = Workbench(MLP, TOPOLOGY)
    gantt = wb.gantt
    monkeypatch.setattr(dashboard, "_charts", lambda d: (_ for _ in ()).throw(IndexError("x")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dashboard handles it: no ListenerWarning
        wb.set_strategy(dp=4)
    assert "the charts could not be drawn: IndexError: x" in wb.summary.value
    assert "dp=4" in wb.summary.value and wb.gantt is gantt  # the rest shows the new state


_SMALL = ["--model", "mlp", "--batch", "8", "--features", "16", "--classes", "4", "--quiet"]


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_report_out_where_it_cannot_be_written_is_one_line(tmp_path, capsys, where):
    out = tmp_path / "nope" / "r.html" if where == "missing-folder" else tmp_path
    assert main(["report", "--out", str(out), *_SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_report_out_failing_while_written_is_one_line(tmp_path, capsys, monkeypatch):
    import workbench.report

    def refuse(*_args, **_kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(workbench.report, "write_report", refuse)
    assert main(["report", "--out", str(tmp_path / "r.html"), *_SMALL]) == 1
    err = capsys.readouterr().err
    assert err == f"error: --out {tmp_path / 'r.html'}: cannot write it: Permission denied\n"
