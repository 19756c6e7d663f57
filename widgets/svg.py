"""Running graphviz and preparing its SVG for clicking.

``dot_to_svg`` runs the real ``dot -Tsvg`` binary; ``postprocess_svg`` gives
every edge a wide transparent stroke (a thin line is hard to hit with a mouse),
puts readable tooltips into the ``<title>`` elements, and drops the XML prolog
so the SVG can sit inline in HTML.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from ir.errors import DistIRError

SVG_NS = "http://www.w3.org/2000/svg"
EDGE_HIT_WIDTH = 14  # px of invisible stroke around each edge that still takes clicks


class GraphvizError(DistIRError):
    """graphviz's ``dot`` is missing or failed on the generated source."""


def dot_to_svg(dot_source: str, *, dot_binary: str = "dot", timeout_s: float = 120.0) -> str:
    """Lay out ``dot_source`` with the ``dot`` binary and return the SVG text."""
    return DotJob(dot_source, dot_binary=dot_binary, timeout_s=timeout_s).svg()


class DotJob:
    """A ``dot -Tsvg`` run started now and read later (:meth:`svg`).

    graphviz lays the graph out in its own process (waited for on a thread), so
    the caller can do other work meanwhile: the dashboard builds its charts
    while ``dot`` runs.
    """

    def __init__(
        self, dot_source: str, *, dot_binary: str = "dot", timeout_s: float = 120.0
    ) -> None:
        exe = shutil.which(dot_binary)
        if exe is None:
            raise GraphvizError(
                f"the graphviz binary {dot_binary!r} is not on PATH; the graph view needs it. "
                "Install graphviz (`apt-get install graphviz`, `conda install graphviz` or "
                "`brew install graphviz`) or pass dot_binary='/path/to/dot'."
            )
        self.exe, self.timeout_s = exe, timeout_s
        self._done: subprocess.CompletedProcess[bytes] | GraphvizError | None = None
        self._thread = threading.Thread(target=self._run, args=(dot_source,), daemon=True)
        self._thread.start()

    def _run(self, dot_source: str) -> None:
        try:
            self._done = subprocess.run(
                [self.exe, "-Tsvg"],
                input=dot_source.encode(),
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self._done = GraphvizError(
                f"{self.exe} -Tsvg took longer than {self.timeout_s} s; fold more of the graph "
                "(GraphOptions.max_ops) or raise timeout_s"
            )
        except OSError as e:
            self._done = GraphvizError(f"{self.exe} -Tsvg could not run: {e}")

    def svg(self) -> str:
        """Wait for ``dot`` and return its SVG; raises GraphvizError when it failed."""
        self._thread.join()
        done = self._done
        if isinstance(done, GraphvizError):
            raise done
        assert done is not None
        if done.returncode != 0:
            raise GraphvizError(
                f"{self.exe} -Tsvg failed (exit {done.returncode}): "
                f"{done.stderr.decode(errors='replace')}"
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
