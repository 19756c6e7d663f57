"""Running graphviz and preparing its SVG for clicking.

``dot_to_svg`` runs the real ``dot -Tsvg`` binary; ``postprocess_svg`` gives
every edge a wide transparent stroke (a thin line is hard to hit with a mouse),
puts readable tooltips into the ``<title>`` elements, and drops the XML prolog
so the SVG can sit inline in HTML.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import threading
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
    """Widen edge hit areas, set tooltips by element id, return inline-ready SVG.

    One pass over the text graphviz wrote (each group opens with
    ``<g id=".." class="..">`` and its ``<title>``; an edge's first ``<path>`` is
    its line), not a parse and re-serialisation of the whole document: on a few
    hundred nodes that took longer than building the drawing.
    """
    start = svg.find("<svg")
    if start < 0:
        raise GraphvizError(f"dot wrote no <svg> element: {svg[:200]!r}")
    head, *groups = _COMMENT.sub("", svg[start:]).split('<g id="')
    out = [_SVG_TAG.sub(_root_tag, head, count=1)]
    for group in groups:
        out.append('<g id="')
        out.append(_group(group, tooltips))
    return "".join(out)


_COMMENT = re.compile(r"<!--.*?-->\n?", re.S)
_SVG_TAG = re.compile(r"<svg\b([^>]*)>")
_HIT = (
    f'<path d="{{}}" class="hit" fill="none" stroke="transparent" '
    f'stroke-width="{EDGE_HIT_WIDTH}" pointer-events="stroke"/>\n'
)


def _root_tag(m: re.Match[str]) -> str:
    attrs = re.sub(r'\s(?:xmlns|class)="[^"]*"', "", m.group(1))
    return f'<svg{attrs} xmlns="{SVG_NS}" class="distir-graph">'


def _group(text: str, tooltips: Mapping[str, str]) -> str:
    """One group's text after ``<g id="``: its id as the drawing named it (graphviz
    writes ``op-1`` as ``op&#45;1``), its tooltip, and for an edge a hit path."""
    end_id = text.index('"')
    gid = html.unescape(text[:end_id])
    rest = text[end_id:]
    tip = tooltips.get(gid)
    if tip is not None:
        lo, hi = rest.find("<title>"), rest.find("</title>")
        if 0 <= lo < hi:
            rest = f"{rest[: lo + 7]}{html.escape(tip, quote=False)}{rest[hi:]}"
    if rest.startswith('" class="edge"'):
        line = _PATH_D.search(rest)
        close = rest.find("</g>")
        if close < 0:  # a nested group (a link) follows: the hit path goes before it
            close = len(rest)
        if line is not None and line.start() < close:
            rest = rest[:close] + _HIT.format(line.group(1)) + rest[close:]
    return html.escape(gid) + rest


_PATH_D = re.compile(r'<path\b[^>]*?\sd="([^"]*)"')
