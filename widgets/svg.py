"""Running graphviz and preparing its SVG for clicking.

``dot_to_svg`` runs the real ``dot -Tsvg`` binary; ``postprocess_svg`` gives
every edge a wide transparent stroke (a thin line is hard to hit with a mouse),
puts readable tooltips into the ``<title>`` elements, and drops the XML prolog
so the SVG can sit inline in HTML.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from ir.errors import DistIRError

SVG_NS = "http://www.w3.org/2000/svg"
EDGE_HIT_WIDTH = 14  # px of invisible stroke around each edge that still takes clicks


class GraphvizError(DistIRError):
    """graphviz's ``dot`` is missing or failed on the generated source."""


def dot_to_svg(dot_source: str, *, dot_binary: str = "dot", timeout_s: float = 120.0) -> str:
    """Lay out ``dot_source`` with the ``dot`` binary and return the SVG text."""
    exe = shutil.which(dot_binary)
    if exe is None:
        raise GraphvizError(
            f"the graphviz binary {dot_binary!r} is not on PATH; the graph view needs it. "
            "Install graphviz (`apt-get install graphviz`, `conda install graphviz` or "
            "`brew install graphviz`) or pass dot_binary='/path/to/dot'."
        )
    try:
        done = subprocess.run(
            [exe, "-Tsvg"],
            input=dot_source.encode(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GraphvizError(
            f"{exe} -Tsvg took longer than {timeout_s} s; fold more of the graph "
            "(GraphOptions.max_ops) or raise timeout_s"
        ) from None
    if done.returncode != 0:
        raise GraphvizError(
            f"{exe} -Tsvg failed (exit {done.returncode}): {done.stderr.decode(errors='replace')}"
        )
    return done.stdout.decode()


def postprocess_svg(svg: str, tooltips: Mapping[str, str]) -> str:
    """Widen edge hit areas, set tooltips by element id, return inline-ready SVG."""
    root = ET.fromstring(svg)
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith("{"):
            el.tag = el.tag.split("}", 1)[1]
    for g in root.iter("g"):
        gid = g.get("id", "")
        title = g.find("title")
        if title is not None and gid in tooltips:
            title.text = tooltips[gid]
        if g.get("class") == "edge":
            path = g.find("path")
            if path is not None:
                hit = ET.SubElement(g, "path")
                hit.attrib.update(
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
