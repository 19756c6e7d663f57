"""The graph's SVG post-processing (one pass over graphviz's text) against a reference
that parses the document and writes it back (what it replaced): the same elements,
attributes and texts, on drawings with nodes, edges, folds, clusters and tooltips
that need escaping."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import pytest

from ir import models
from widgets.drawing import Drawing
from widgets.graph import GraphOptions
from widgets.svg import EDGE_HIT_WIDTH, SVG_NS, GraphvizError, dot_to_svg, postprocess_svg

sys.path.insert(0, str(Path(__file__).parent))
from widget_programs import data_parallel_matmul, deep_mlp


def _reference(svg: str, tooltips: Mapping[str, str]) -> str:
    root = ET.fromstring(svg)
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith("{"):
            el.tag = el.tag.split("}", 1)[1]
    for g in root.iter("g"):
        title = g.find("title")
        if title is not None and g.get("id", "") in tooltips:
            title.text = tooltips[g.get("id", "")]
        path = g.find("path")
        if g.get("class") == "edge" and path is not None:
            ET.SubElement(g, "path").attrib.update(
                {
                    "d": path.get("d", ""),
                    "class": "hit",
                    "fill": "none",
                    "stroke": "transparent",
                    "stroke-width": str(EDGE_HIT_WIDTH),
                    "pointer-events": "stroke",
                }
            )
    root.set("xmlns", SVG_NS)
    root.set("class", "distir-graph")
    return ET.tostring(root, encoding="unicode")


def _tree(svg: str) -> list[tuple]:
    """Every element in document order: tag, attributes, text (namespaces aside)."""

    def local(name: str) -> str:
        return name.split("}", 1)[-1]

    return [
        (
            local(el.tag),
            sorted((local(k), v) for k, v in el.attrib.items()),
            (el.text or "").strip(),
        )
        for el in ET.fromstring(svg).iter()
    ]


PROGRAMS = {
    "pmap clusters": lambda: data_parallel_matmul((1, 2, 3), batch=48),
    "folded layers": lambda: deep_mlp(24, device_of_layer=lambda i: i // 8),
    "gpt training": lambda: models.gpt(
        batch=2, seq=8, hidden=16, heads=2, vocab=32, layers=2, training=True
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_pass_equals_parsing_and_writing_back(name):
    f = PROGRAMS[name]()
    drawing = Drawing(f, {}, GraphOptions())
    svg = dot_to_svg(drawing.dot())
    tooltips = dict(drawing.tooltips)
    tooltips[next(iter(tooltips))] = 'a <b> & "c" -> d'  # text that needs escaping
    got = postprocess_svg(svg, tooltips)
    assert _tree(got) == _tree(_reference(svg, tooltips))
    assert got.startswith("<svg") and "<!--" not in got and "<?xml" not in got
    edges = svg.count('class="edge"')
    assert edges > 0 and got.count('class="hit"') == edges


def test_text_without_an_svg_element_is_an_error():
    with pytest.raises(GraphvizError, match="no <svg> element"):
        postprocess_svg("Warning: something\n", {})
