"""The graph view's SVG and id map, checked without a browser."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ir import FunctionBuilder, TensorType
from widgets.graph import GraphOptions, render_graph, start_render
from widgets.graph_widget import GraphView
from widgets.ids import op_paths, value_names
from widgets.palette import device_color
from widgets.svg import GraphvizError, dot_to_svg

sys.path.insert(0, str(Path(__file__).parent))
from widget_programs import data_parallel_matmul, deep_mlp

SVG = "{http://www.w3.org/2000/svg}"


def _groups(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.get("id"): g for g in root.iter(f"{SVG}g") if g.get("id")}


def _fills(g: ET.Element) -> set[str]:
    return {
        el.get("fill")
        for el in g.iter()
        if el.get("fill") not in (None, "none", "transparent", "black")
    }


def test_svg_contains_every_op_id_and_id_map_round_trips():
    f = data_parallel_matmul()
    g = render_graph(f)
    drawn = _groups(g.svg)
    paths = op_paths(f)
    assert len(paths) == f.num_ops() == 6
    for op, path in paths.items():
        assert f"op-{path}" in drawn, path
        assert g.id_map[f"op-{path}"] == ("op", path)
        assert g.ops[path] is op
    for svg_id, (kind, name) in g.id_map.items():
        assert svg_id in drawn, svg_id
        if kind == "value":
            assert value_names(f)[g.values[name]] == name
    # every value that is read somewhere has a clickable edge
    edge_values = {name for i, (k, name) in g.id_map.items() if k == "value" and i.startswith("v-")}
    assert edge_values == {"x", "wA", "xs", "wAs", "xi", "wAi", "ai", "rs", "r"}


def test_value_names_match_the_printer_with_duplicate_names():
    b = FunctionBuilder("dup")
    x = b.input("x", TensorType((2,), device=0))
    y = b.call("Relu", x, name="x")
    z = b.call("Neg", y, name="x")
    f = b.finish([z])
    names = value_names(f)
    assert [names[v] for v in (x, y, z)] == ["x", "x_1", "x_2"]
    assert "x_2: Tensor[(2,), 0] = Neg(x_1)" in str(f)


def test_op_colours_match_the_legend():
    f = deep_mlp(6, device_of_layer=lambda i: i // 2)
    g = render_graph(f)
    legend = {e.device: e.color for e in g.legend if e.kind == "device"}
    assert sorted(legend) == [0, 1, 2]
    assert all(legend[d] == device_color(d) for d in legend)
    drawn = _groups(g.svg)
    for op, path in op_paths(f).items():
        fills = _fills(drawn[f"op-{path}"])
        if op.op_type == "Send":  # communication: striped with both devices, double border
            assert fills == {legend[op.inputs[0].type.device], legend[op.device]}
            assert len(drawn[f"op-{path}"].findall(f"{SVG}polygon")) >= 2
        else:
            assert fills == {legend[op.device]}, (path, fills)


def test_pmap_body_is_a_cluster_and_comm_ops_are_distinct():
    g = render_graph(data_parallel_matmul())
    drawn = _groups(g.svg)
    assert drawn["op-2"].get("class") == "cluster"
    assert {"op-2.0", "op-2.1"} <= set(drawn)
    body_fills = _fills(drawn["op-2.0"])
    assert body_fills == {device_color(1), device_color(2)}  # the body runs on both devices
    assert 'peripheries="2"' in g.dot.split('"op-0" [', 1)[1].split("\n", 1)[0]
    assert "communication" in [e.label for e in g.legend]


def test_edges_have_wide_invisible_hit_areas_and_placement_labels():
    f = data_parallel_matmul()
    g = render_graph(f, placements={f.value("xs"): "S(0)", "r": "R"})
    drawn = _groups(g.svg)
    edges = [el for el in drawn.values() if el.get("class") == "edge"]
    assert edges
    for edge in edges:
        hit = [p for p in edge.iter(f"{SVG}path") if p.get("class") == "hit"]
        assert len(hit) == 1 and float(hit[0].get("stroke-width")) >= 10
        assert hit[0].get("stroke") == "transparent"
    labels = {"".join(t.itertext()) for e in edges for t in e.iter(f"{SVG}text")}
    assert {"S(0)", "R", "2 × [4×4]"} <= labels


def test_24_layer_program_folds_repeated_layers():
    f = deep_mlp(24)  # 72 ops on one device
    full = render_graph(f, options=GraphOptions(max_ops=None))
    assert sum(k == "op" for k, _ in full.id_map.values()) == 72
    g = render_graph(f, options=GraphOptions(max_ops=40))
    ops_drawn = [p for k, p in g.id_map.values() if k == "op"]
    assert len(ops_drawn) < 15
    assert {"0", "1", "2"} <= set(ops_drawn)  # the first layer stays visible
    (group,) = g.groups
    assert g.id_map[group] == ("group", group)
    hidden = set(g.groups[group])
    assert len(hidden) >= 60
    assert hidden | {f"op-{p}" for p in ops_drawn} == {f"op-{i}" for i in range(72)}
    assert group in _groups(g.svg)
    # weights read only inside the fold are folded too
    assert len([i for i in g.id_map if i.startswith("in-")]) < 10


def test_large_pmap_body_folds_into_one_node():
    f = data_parallel_matmul()
    g = render_graph(f, options=GraphOptions(max_ops=3, max_body_ops=1))
    assert g.id_map["op-2"] == ("op", "2")
    assert g.groups["op-2"] == ("op-2.0", "op-2.1")
    assert "op-2.0" not in g.id_map
    assert _groups(g.svg)["op-2"].get("class") == "node"


def test_graph_view_selection_from_clicks():
    f = data_parallel_matmul()
    view = GraphView(f)
    assert view.svg.startswith("<svg") and "device 1" in view.legend_html
    view.clicked = {"id": "op-2.0", "n": 1}
    sel = view.selection
    assert sel.kind == "op" and sel.op.op_type == "MatMul" and sel.svg_id == "op-2.0"
    edge = next(i for i, t in view.rendered.id_map.items() if t == ("value", "xs"))
    view.clicked = {"id": edge, "n": 2}
    assert view.selection.value is f.value("xs")
    view.clicked = {"id": "return", "n": 3}  # not selectable: selection unchanged
    assert view.selection.value is f.value("xs")
    with pytest.raises(KeyError, match="not an op or value id"):
        view.select("op-99")


def test_graph_view_opens_a_fold_to_select_a_hidden_op():
    f = deep_mlp(24)
    view = GraphView(f, options=GraphOptions(max_ops=40))
    hidden = next(iter(view.rendered.groups.values()))[5]
    view.select(hidden)
    assert view.selection.svg_id == hidden
    assert hidden in _groups(view.svg)
    seen = []
    view.on_select(seen.append)
    view.select_value(f.value("a3"))
    assert seen[-1].value is f.value("a3") and len(view.selected["ids"]) == 1
    folded = GraphView(f, options=GraphOptions(max_ops=40))
    assert "op-41" in next(iter(folded.rendered.groups.values()))
    folded.select_value(f.value("h13"))  # made by op 41, inside the fold: the fold opens
    assert folded.selection.value is f.value("h13")
    assert "op-41" in _groups(folded.svg)


def test_a_prepared_drawing_shows_only_when_asked_and_a_failed_one_keeps_the_last():
    first, second = data_parallel_matmul(), deep_mlp(3)
    view = GraphView(first)
    before = view.svg
    pending = view.prepare(second)  # graphviz runs in its own process meanwhile
    assert view.svg == before and view.rendered.ops["0"] in first.ops
    view.show(pending)
    assert view.svg != before and view.rendered.ops["0"] in second.ops
    assert view.svg == render_graph(second).svg and not view.error
    shown = view.svg
    broken = start_render(first, dot_binary="false")  # a "dot" that exits 1
    with pytest.raises(GraphvizError, match="failed"):
        view.show(broken)
    assert view.svg == shown and "GraphvizError" in view.error


def test_missing_dot_binary_says_what_to_install():
    with pytest.raises(GraphvizError, match="install graphviz"):
        dot_to_svg("digraph {}", dot_binary="no-such-dot-binary")


def test_es_module_is_small_and_offline():
    js = (Path(__file__).parents[2] / "widgets" / "static" / "graph.js").read_text()
    assert len(js.splitlines()) < 200  # a thin view: Python decides, the module draws
    assert "export default" in js
    assert not re.search(r"\bimport\b.*\bfrom\b|https?://", js)


def test_many_values_between_a_fold_and_a_node_share_one_edge():
    b = FunctionBuilder("fan")
    x = b.input("x", TensorType((4,), device=0))
    ys = [b.call("Relu", x, name=f"y{i}") for i in range(30)]
    f = b.finish(b.call("MakeTuple", *ys, name="ys"))
    g = render_graph(f, options=GraphOptions(max_ops=10))
    (group,) = g.groups
    bundles = [i for i, target in g.id_map.items() if i.startswith("b-")]
    assert len(bundles) == 1 and g.id_map[bundles[0]] == ("group", group)
    assert g.dot.count("->") < 8  # not one edge per folded value
    assert '"29 values"' in g.dot  # y0 stays visible, y1 .. y29 are folded


def _every_op_reachable(f, g) -> None:
    hidden = {op for members in g.groups.values() for op in members}
    drawn = _groups(g.svg)
    for path in op_paths(f).values():
        oid = f"op-{path}"
        assert (oid in drawn and g.id_map[oid] == ("op", path)) or oid in hidden, oid


def test_training_program_draws_small_with_stubs_for_far_reads():
    import ir

    f = ir.transforms.training(ir.models.gpt(2, 8, 16, 2, 32, 4))
    g = render_graph(f)
    _every_op_reachable(f, g)
    assert g.svg.count('class="node"') < 200  # 250 ops, 47 weights: folded, not all drawn
    stubs = [i for i in g.id_map if i.startswith("s-")]
    assert stubs and all(i in _groups(g.svg) for i in stubs)
    for sid in stubs:  # a stub stands for a value (or a bundle into a fold) and feeds one node
        assert g.id_map[sid][0] in ("value", "group")
        drawn_from = [ln for ln in g.dot.splitlines() if f'"{sid}" -> ' in ln and "invis" not in ln]
        assert len({ln.split(" -> ")[1].split(" [")[0] for ln in drawn_from}) == 1
        assert len(drawn_from) == 1 or g.id_map[sid][0] == "group"  # a fold's shared stub
    shared = [i for i in stubs if i.startswith("s-far-")]
    assert shared and all(g.id_map[i] == ("group", i.replace("s-far-g", "group-")) for i in shared)
    full = render_graph(f, options=GraphOptions(max_edge_ranks=None))
    assert not [i for i in full.id_map if i.startswith("s-")]


def test_programs_over_budget_without_repeats_fold_runs_per_device():
    b = FunctionBuilder("runs")
    h = b.input("x", TensorType((4, 4), device=0))
    ops = ["Relu", "Neg", "Tanh", "Gelu"]
    for i in range(60):  # no tandem repeats of 3: op types follow a non-periodic pattern
        h = b.call(ops[(i * i + i // 3) % 4], h, name=f"h{i}")
    f = b.finish([h])
    g = render_graph(f, options=GraphOptions(max_ops=20))
    _every_op_reachable(f, g)
    assert sum(k == "op" for k, _ in g.id_map.values()) <= 12
    view = GraphView(f, options=GraphOptions(max_ops=20))
    view.select("op-59")  # hidden in a run: the run opens
    assert "op-59" in _groups(view.svg)


def test_long_edges_are_those_spanning_many_longest_path_ranks():
    from widgets.layout import long_edges

    chain = [(f"n{i}", f"n{i + 1}") for i in range(12)]
    edges = [*chain, ("n0", "n12"), ("in-0", "n11"), ("in-0", "n1"), ("in-1", "n12")]
    options = GraphOptions(max_edge_ranks=8, stub_above_nodes=5)
    # in-1 sits just above its only reader; in-0 above its nearest one (n1)
    assert long_edges(edges, options) == {("n0", "n12"), ("in-0", "n11")}
    assert long_edges(edges, GraphOptions(max_edge_ranks=None)) == set()
    assert long_edges(edges, GraphOptions(stub_above_nodes=100)) == set()
