"""Session files: save -> load round-trips, corrupt files, atomic writes, the Save/Load control."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ir
from ir import models
from ir.device import Device, LinkTable, Topology
from ir.sharding import Mesh, R, S, ShardingSpec
from workbench import Session, Strategy, session_file
from workbench.dashboard import Workbench
from workbench.session_file import SessionFileError

MLP = models.mlp(8, 16, 32, 4)

TOPOLOGIES = {
    "preset": Topology.preset("a100-hgx", 4),
    "preset-tf32": Topology.preset("h100-hgx", 4, allow_tf32=True),
    "uniform": Topology.uniform(4, link_latency_s=2e-6),
    "dense": Topology(
        tuple(Device(i, "toy", 2e12, 3e11, 8e9, 1e-6, {"float32": 2e12}) for i in range(4)),
        tuple(tuple(0.0 if i == j else 1e10 * (1 + i + j) for j in range(4)) for i in range(4)),
        tuple(tuple(0.0 if i == j else 1e-6 for j in range(4)) for i in range(4)),
        name="toy",
        nodes=((0, 1), (2, 3)),
    ),
    "by-node": Topology(
        tuple(Device(i) for i in range(4)),
        LinkTable.by_node(4, 2, [[0.0, 5e10], [5e10, 0.0]], 1e10),
        LinkTable.by_node(4, 2, [[0.0, 1e-6], [1e-6, 0.0]], 5e-6),
        name="two-nodes",
        nodes=((0, 1), (2, 3)),
    ),
}

ANNOTATIONS = [
    ("wA", (Mesh((4,)), [S(1)])),
    ("wB", (Mesh((4,)), [S(0)])),
    ("x", (Mesh((4,)), [S(0)])),
    ("x", (Mesh((2, 2)), ["S(0)", "R"])),
    ("wA", (Mesh((2,), (2, 3)), [R])),
    ("x", ShardingSpec([0, 1], [(0, 2)])),
    ("h", ShardingSpec([0, 1], [(1, 2)], {0: [0, 2], 1: [1, 3]})),
]
STRATEGIES = [
    Strategy(dp=2),
    Strategy(dp=4),
    Strategy(hp=2),
    Strategy(pp=2, microbatches=2, schedule="1f1b"),
    Strategy(dp=2, zero=3),
    Strategy(),
]

actions = st.lists(
    st.one_of(
        st.tuples(st.just("annotate"), st.sampled_from(ANNOTATIONS)),
        st.tuples(st.just("strategy"), st.sampled_from(STRATEGIES)),
        st.tuples(st.just("unannotate"), st.sampled_from(["wA", "x"])),
        st.tuples(st.just("undo"), st.none()),
        st.tuples(st.just("redo"), st.none()),
    ),
    max_size=6,
)


def _act(s: Session, action: tuple) -> None:
    kind, arg = action
    if kind == "annotate":
        s.annotate(*arg)
    elif kind == "strategy":
        s.set_strategy(arg)
    elif kind == "unannotate":
        s.unannotate(arg)
    else:
        getattr(s, kind)()


def _same(a: Session, b: Session) -> None:
    assert b.state == a.state
    assert ir.format(b.function) == ir.format(a.function)
    assert ir.format(b.base) == ir.format(a.base)
    assert b.result.step_time_s == a.result.step_time_s
    assert b.topology == a.topology
    assert (b._history.undo, b._history.redo) == (a._history.undo, a._history.redo)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(topology=st.sampled_from(sorted(TOPOLOGIES)), steps=actions)
def test_save_then_load_gives_the_same_session(tmp_path, topology, steps):
    s = Session(MLP, TOPOLOGIES[topology])
    for action in steps:
        _act(s, action)
    path = s.save(tmp_path / "s.json")
    loaded = Session.load(path)
    _same(s, loaded)
    # saving the loaded session writes the same document; undo and redo walk the same way
    assert loaded.save(tmp_path / "again.json").read_text() == path.read_text()
    while s.can_undo:
        assert s.undo() and loaded.undo()
        assert loaded.state == s.state
        assert loaded.result.step_time_s == s.result.step_time_s


def test_the_dashboard_saves_and_loads(tmp_path):
    wb = Workbench(MLP, TOPOLOGIES["preset"])
    assert wb.annotate("wA", (Mesh((4,)), [S(1)]))
    wb.save(tmp_path / "wb.json")
    loaded = Workbench.load(tmp_path / "wb.json")
    _same(wb.session, loaded.session)
    assert loaded.session.can_undo and loaded.undo() and loaded.session.annotations == {}


def test_the_save_and_load_buttons(tmp_path):
    wb = Workbench(MLP, TOPOLOGIES["preset"])
    wb.file_path.value = str(tmp_path / "b.json")
    assert wb.set_strategy(dp=2)
    wb.save_button.click()
    assert (tmp_path / "b.json").exists() and "saved" in wb.file_status.value
    assert wb.set_strategy(hp=2)
    wb.load_button.click()
    assert wb.session.strategy == Strategy(dp=2) and wb.session.error is None
    assert wb.dp.value == 2 and wb.hp.value == 1
    assert "dp=2" in wb.summary.value
    # a file that does not load: the message shows where other errors do, nothing changes
    (tmp_path / "b.json").write_text('{"format": "distir-workbench-session", "version": 99}')
    before = wb.session.current
    wb.load_button.click()
    assert wb.session.current is before
    assert "version 99" in wb.editor.status.value and "$.version" in wb.editor.status.value
    wb.file_path.value = str(tmp_path / "missing" / "b.json")
    wb.save_button.click()
    assert "cannot write there" in wb.editor.status.value


# -- corrupt and hand-edited files ---------------------------------------------------------


def _valid_document(tmp_path: Path) -> tuple[Path, str]:
    s = Session(MLP, TOPOLOGIES["dense"])
    assert s.annotate("h", ShardingSpec([0, 1], [(1, 2)], {0: [0, 2], 1: [1, 3]}))
    assert s.set_strategy(dp=2)
    assert s.annotate("wA", (Mesh((4,)), [S(1)]))
    assert s.annotate("x", (Mesh((4,)), [S(0)]))
    assert s.undo()
    path = s.save(tmp_path / "valid.json")
    return path, path.read_text()


@pytest.mark.parametrize(
    ("edit", "field", "words"),
    [
        (lambda d: d.update(version=2), "$.version", "newer workbench"),
        (lambda d: d.update(format="something-else"), "$.format", "not a workbench session"),
        (lambda d: d.pop("history"), "$.history", "missing"),
        (lambda d: d.update(program=d["program"].replace("Relu", "Rleu")), "$.program", "Rleu"),
        (lambda d: d.update(program=d["program"][:40]), "$.program", "does not parse"),
        (lambda d: d["annotations"][0].update(value="nope"), "$.annotations[0].value", "nope"),
        (
            lambda d: d["annotations"][0].update(placements=["S(x)"]),
            "$.annotations[0].placements[0]",
            "S(x)",
        ),
        (lambda d: d["annotations"][0].update(placements=["S(9)"]), "$.annotations", "S(9)"),
        (
            lambda d: d["annotations"][0]["mesh"].update(devices=[0, 1, 2, 9]),
            "$.annotations[0].mesh.devices",
            "[9]",
        ),
        (lambda d: d["strategy"].update(dp="2"), "$.strategy.dp", "an integer"),
        (lambda d: d["strategy"].update(dp=True), "$.strategy.dp", "an integer"),
        (lambda d: d["strategy"].update(schedule="zigzag"), "$.strategy", "zigzag"),
        (lambda d: d["strategy"].update(zero=4), "$.strategy.zero", "from 0 to 3"),
        (lambda d: d["strategy"].update(ep=3), "$.strategy", "ep=3 must divide dp=1"),
        (lambda d: d["history"]["undo"].append(7), "$.history.undo[3]", "an object"),
        (
            lambda d: d["topology"]["devices"][1].update(peak_flops=-1),
            "$.topology.devices[1]",
            "peak_flops",
        ),
        (lambda d: d["topology"].update(latency_s=[[0.0]]), "$.topology", "4x4"),
        (
            lambda d: d.update(topology={"preset": "tpu", "devices": 4, "allow_tf32": False}),
            "$.topology",
            "tpu",
        ),
        (
            lambda d: d["history"]["undo"][1]["annotations"][0]["spec"].update(devices=[0]),
            "$.history.undo[1].annotations[0].spec",
            "shard",
        ),
    ],
)
def test_a_hand_edited_file_names_what_is_wrong(tmp_path, edit, field, words):
    path, text = _valid_document(tmp_path)
    doc = json.loads(text)
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SessionFileError) as caught:
        Session.load(path)
    message = str(caught.value)
    assert caught.value.field.startswith(field) and field in message
    assert str(path) in message and words in message


def _mutations() -> st.SearchStrategy:
    """Functions text -> mutated text: truncation, byte flips, key removal or renaming,
    wrong-typed values, version bumps."""
    wrong = st.sampled_from([None, True, -1, 0, 2**70, 1.5, "", "x", [], {}, [[1]], {"a": 1}])

    def truncate(cut: float):
        return lambda text: text[: int(len(text) * cut)]

    def flip(where: list[tuple[float, int]]):
        def go(text: str) -> str:
            raw = bytearray(text.encode())
            for at, byte in where:
                raw[int(at * (len(raw) - 1))] = byte
            return raw.decode("utf-8", errors="surrogateescape")

        return go

    def on_json(kind: str, pick: float, value: object):
        def go(text: str) -> str:
            doc = json.loads(text)
            places = list(_places(doc))
            parent, key = places[int(pick * (len(places) - 1))]
            if kind == "remove":
                del parent[key]
            elif kind == "rename" and isinstance(parent, dict):
                parent[f"{key}_"] = parent.pop(key)
            elif kind == "retype":
                parent[key] = value
            return json.dumps(doc)

        return go

    fraction = st.floats(0, 1)
    return st.one_of(
        fraction.map(truncate),
        st.lists(st.tuples(fraction, st.integers(0, 255)), min_size=1, max_size=4).map(flip),
        st.builds(on_json, st.sampled_from(["remove", "rename", "retype"]), fraction, wrong),
        st.integers(2, 10**30).map(
            lambda v: lambda text: json.dumps({**json.loads(text), "version": v})
        ),
    )


def _places(node: object):
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key
            yield from _places(value)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield node, i
            yield from _places(value)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutate=_mutations())
def test_a_corrupt_file_is_a_project_error_and_leaves_the_session_as_it_was(tmp_path, mutate):
    valid, text = _valid_document(tmp_path)
    s = Session(MLP, TOPOLOGIES["preset"])
    s.annotate("wA", (Mesh((4,)), [S(1)]))
    before = (s.current, list(s._history.undo), list(s._history.redo), s.base, s.topology)
    bad = tmp_path / "bad.json"
    bad.write_bytes(mutate(text).encode("utf-8", errors="surrogateescape"))
    if s.restore(bad):
        event("still a valid session")
        return  # the mutation kept the file valid (a digit for a digit, a space...)
    event("refused at " + (re.match(r"session file '[^']*'(, [$.\w]+)?", s.error)[1] or ": file"))
    assert s.error.startswith(f"session file {str(bad)!r}")
    after = (s.current, s._history.undo, s._history.redo, s.base, s.topology)
    assert after == before
    assert valid.read_text() == text


# -- writing ------------------------------------------------------------------------------


def test_a_save_that_fails_mid_way_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    s = Session(MLP, TOPOLOGIES["preset"])
    path = s.save(tmp_path / "s.json")
    old = path.read_bytes()
    s.set_strategy(dp=2)
    real_dump = json.dump

    def half_then_fail(obj, f, **kw):
        text = json.dumps(obj, **kw)
        f.write(text[: len(text) // 2])
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(session_file.json, "dump", half_then_fail)
    with pytest.raises(RuntimeError, match="disk went away"):
        s.save(path)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["s.json"]  # no temporary file left behind
    monkeypatch.setattr(session_file.json, "dump", real_dump)
    s.save(path)
    assert Session.load(path).strategy == Strategy(dp=2)


def test_saving_where_it_cannot_be_written_is_a_project_error(tmp_path):
    s = Session(MLP, TOPOLOGIES["preset"])
    with pytest.raises(SessionFileError, match="cannot write there"):
        s.save(tmp_path / "missing" / "s.json")
    (tmp_path / "folder").mkdir()
    with pytest.raises(SessionFileError, match="cannot write it"):
        s.save(tmp_path / "folder")
    assert os.listdir(tmp_path) == ["folder"]
    with pytest.raises(SessionFileError, match="cannot read it"):
        Session.load(tmp_path / "nothing.json")


def test_an_annotation_of_no_known_form_is_refused_when_made():
    s = Session(MLP, TOPOLOGIES["preset"])
    assert not s.annotate("wA", "S(1)")
    assert "wA" in s.error and "(Mesh, placements)" in s.error
    assert s.annotate("wA", ((4,), "S(1)")) and s.annotations["wA"] == (Mesh((4,)), (S(1),))
