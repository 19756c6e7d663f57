"""The logical graph view: what it draws for a transform's output, without a browser."""

from __future__ import annotations

import re
from functools import cache

import pytest

import ir
from ir import transforms
from ir.function import Function
from ir.sim import simulate
from widgets.device_marks import device_glyph, device_ranges
from widgets.graph import GraphOptions, render_graph
from widgets.logical import LogicalDrawing
from widgets.palette import COMMUNICATION_COLOR, DEVICE_PALETTE

LOGICAL = GraphOptions(view="logical")


@cache
def step(dp: int, tp: int, pp: int = 1, microbatches: int = 1) -> Function:
    return transforms.megatron(
        transforms.training(ir.models.gpt(8, 16, 32, 4, 64, 2)), dp, tp, pp, microbatches
    )


def node_ids(dot: str) -> list[str]:
    return re.findall(r'^  "([^"]+)" \[', dot, flags=re.M)


def test_one_node_per_logical_op_whatever_the_number_of_devices() -> None:
    counts = {}
    for dp, tp in [(2, 2), (4, 2), (2, 4)]:
        f = step(dp, tp)
        drawing = LogicalDrawing(f, {}, LOGICAL)
        ops = [n for n in node_ids(drawing.dot()) if n.startswith("op-")]
        assert len(ops) == len(f.ops)  # one node per top-level op, no pmap body drawn
        counts[dp, tp] = len(ops)
    assert len(set(counts.values())) == 1, counts


def test_a_pmap_names_its_devices_and_body_and_shows_their_colours() -> None:
    f = step(4, 2)
    drawing = LogicalDrawing(f, {}, LOGICAL)
    dot = drawing.dot()
    # (a one-op body is named by its op: the vocabulary ids' Arange comes first)
    pmap = next(
        i for i, op in enumerate(f.ops) if op.op_type == "Pmap" and op.subfunctions[0].num_ops() > 1
    )
    line = next(x for x in dot.splitlines() if x.startswith(f'  "op-{pmap}" ['))
    assert "pmap on 0–7 (8 dev)" in line
    assert f"{f.ops[pmap].subfunctions[0].num_ops()} ops:" in line
    for d in range(8):
        assert f'COLOR="{DEVICE_PALETTE[d]}">■' in line
    assert [e.device for e in drawing.legend() if e.kind == "device"] == list(range(8))


def test_a_collective_is_a_dark_hexagon_with_kind_bytes_and_simulated_time() -> None:
    f = step(2, 2)
    result = simulate(f, ir.Topology.preset("a100-hgx", 4))
    g = render_graph(f, options=LOGICAL, result=result)
    k = next(i for i, op in enumerate(f.ops) if op.op_type == "AllReduce")
    line = next(x for x in g.dot.splitlines() if x.startswith(f'  "op-{k}" ['))
    assert 'shape="hexagon"' in line and f'fillcolor="{COMMUNICATION_COLOR}"' in line
    assert "AllReduce sum" in line and "groups of 2" in line
    assert re.search(r"\d+(\.\d+)? [kMG]?B/dev · \d+(\.\d+)? [mµn]?s", line), line
    assert any(e.label == "communication" and e.color == COMMUNICATION_COLOR for e in g.legend)


def test_sendeach_is_an_arrow_between_stages() -> None:
    f = step(1, 2, 2, 2)
    dot = LogicalDrawing(f, {}, GraphOptions(view="logical", max_ops=None)).dot()
    sends = [x for x in dot.splitlines() if "SendEach" in x and 'shape="cds"' in x]
    assert sends and all("0–1 → 2–3" in x or "2–3 → 0–1" in x for x in sends), sends


def test_input_layouts_label_the_edges() -> None:
    f = step(2, 2)
    assert f.input_layouts
    dot = LogicalDrawing(f, {}, LOGICAL).dot()
    layout = " ".join(f.input_layouts[0])
    assert re.search(r'"in-0" -> "[^"]+" \[id="[^"]+", label="[^"]*\\n' + re.escape(layout), dot)


def test_above_max_ops_runs_on_the_same_devices_fold_and_open_on_request() -> None:
    f = step(1, 2, 2, 2)
    options = GraphOptions(view="logical", max_ops=20)
    drawing = LogicalDrawing(f, {}, options)
    nodes = node_ids(drawing.dot())
    assert drawing.groups and len(nodes) < len(f.ops) / 2
    gid, members = max(drawing.groups.items(), key=lambda kv: len(kv[1]))
    line = next(x for x in drawing.dot().splitlines() if x.startswith(f'  "{gid}" ['))
    assert f"▸ {len(members)} ops on" in line and "×" in line  # repeated layers named
    opened = LogicalDrawing(
        f, {}, GraphOptions(view="logical", max_ops=20, expanded=frozenset({gid}))
    )
    shown = set(node_ids(opened.dot()))
    inside = {m for ms in opened.groups.values() for m in ms}  # a repeated layer, still folded
    assert gid not in shown and set(members) <= shown | inside and len(shown) > len(nodes)


def test_communication_has_a_colour_of_its_own() -> None:
    def rgb(c: str) -> tuple[int, ...]:
        return tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))

    comm = rgb(COMMUNICATION_COLOR)
    for color in DEVICE_PALETTE:
        distance = sum((a - b) ** 2 for a, b in zip(comm, rgb(color))) ** 0.5
        assert distance > 100, f"communication {COMMUNICATION_COLOR} looks like {color}"


def test_unknown_view_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'logical' or 'unrolled'"):
        render_graph(step(2, 2), options=GraphOptions(view="per-device"))


def test_device_ranges_and_glyph() -> None:
    assert device_ranges((4, 5, 6, 7, 0, 9)) == "0, 4–7, 9"
    assert device_ranges((None,)) == "?"
    glyph = device_glyph(tuple(range(64)))
    assert glyph.count("■") == 16 and "+48" in glyph


def test_per_device_copies_of_one_op_are_one_node_and_open_when_a_copy_is_selected() -> None:
    from ir.sharding import Mesh, S
    from widgets.graph_widget import GraphView
    from workbench.session import Session

    # hidden 30 over 4 devices (8, 8, 7, 7): the devices differ, so propagation writes
    # each op once per device (an even split is one Pmap instead)
    session = Session(ir.models.mlp(8, 16, 30, 4), ir.Topology.preset("a100-hgx", 4))
    assert session.annotate("wA", (Mesh((4,)), [S(1)]))
    f = session.current.function
    view = GraphView(f, options=LOGICAL)
    copies = {nid: ids for nid, ids in view.rendered.groups.items() if nid.startswith("op-")}
    whole = {nid: ids for nid, ids in copies.items() if len(ids) == 3}  # 4 devices, 1 drawn
    assert whole and all(len(ids) in (1, 3) for ids in copies.values())  # 8+8 | 7+7 pairs
    nid, ids = next(iter(whole.items()))
    assert "×4 on 0–3" in next(x for x in view.rendered.dot.splitlines() if f'"{nid}" [' in x)
    view.select(ids[0])  # a Gantt click on another device's copy
    assert view.selection is not None and view.selection.svg_id == ids[0]


def _lanes(dot: str) -> list[tuple[str, list[str]]]:
    found = re.findall(
        r'subgraph "cluster_lane_\d+" \{ graph \[[^]]*label="([^"]*)"[^]]*\]; (.*) \}', dot
    )
    return [(label, re.findall(r'"([^"]+)"', members)) for label, members in found]


def test_a_pipeline_draws_one_lane_per_stage_on_that_stages_devices() -> None:
    f = step(2, 1, pp=2, microbatches=2)  # stages on devices 0-1 and 2-3
    for options in (LOGICAL, GraphOptions(view="logical", max_ops=6)):  # folded, or not
        drawing = LogicalDrawing(f, {}, options)
        lanes = _lanes(drawing.dot())
        assert [label for label, _ in lanes] == ["stage 0: devices 0–1", "stage 1: devices 2–3"]
        assert drawing.lanes == 2
        for stage, (_, members) in zip(({0, 1}, {2, 3}), lanes):
            assert len(members) >= 2
            assert all(drawing.node_devices[nid] == stage for nid in members)
            outside = [n for n, d in drawing.node_devices.items() if d == stage]
            assert sorted(outside) == sorted(members)  # every node on the stage is in it
        all_members = [nid for _, members in lanes for nid in members]
        assert len(all_members) == len(set(all_members))  # a node is in one lane
    svg = render_graph(f, options=GraphOptions(view="logical", max_ops=6)).svg
    assert 'id="lane-0"' in svg and 'id="lane-1"' in svg


def test_no_lanes_without_a_pipeline() -> None:
    drawing = LogicalDrawing(step(2, 2), {}, LOGICAL)
    assert not _lanes(drawing.dot()) and drawing.lanes == 0
