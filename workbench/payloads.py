"""What the dashboard's views show, built by pure functions (tested without a browser):
the graph drawing, the Gantt and memory figures and the summary of a session's state,
and which base-program value a clicked, transformed value comes from.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from widgets import GraphOptions, RenderedGraph, gantt_figure, memory_figure
from widgets.drawing import Placed
from widgets.graph import render_graph
from widgets.units import format_bytes, format_time

from .session import Annotation, Derived, Session


def base_name(name: str, candidates: Sequence[str]) -> str | None:
    """The base-program value a displayed value comes from, by its printed name.

    Transforms and propagation name per-device copies after the original
    (``wA_2``, ``wA_s``, ``y_parts``): the longest candidate that is the name
    itself or a prefix followed by ``_`` or ``@`` wins.

    >>> base_name("wA_2", ["w", "wA", "x"]), base_name("x", ["x"]), base_name("q", ["x"])
    ('wA', 'x', None)
    """
    if name in candidates:
        return name
    best = None
    for c in candidates:
        if re.match(re.escape(c) + r"[_@.]", name) and (best is None or len(c) > len(best)):
            best = c
    return best


@dataclass(frozen=True)
class Payloads:
    """Everything the views show for one derived state (built in Python, no browser)."""

    graph: RenderedGraph
    gantt: go.Figure
    memory: go.Figure
    summary_html: str


def placements_of(derived: Derived) -> dict[str, Placed]:
    """Placement labels per base-program value, with the devices of the mesh it is laid out
    on (the graph of the program as written colours it by those), from the propagation
    report."""
    report = derived.report
    layouts = getattr(report, "layouts", None) or {}
    mesh = getattr(report, "mesh", None)
    devices = tuple(mesh.devices) if mesh is not None else ()
    return {name: Placed(" ".join(ps), devices) for name, ps in layouts.items()}


def summary_html(session: Session) -> str:
    """Strategy, step time, peaks (out-of-memory flagged) and inserted collectives."""
    d = session.current
    r = d.result
    peaks = r.peak_memory_bytes
    worst = max(peaks, key=peaks.get) if peaks else None
    over = getattr(r, "over_capacity", ())
    parts = [
        f"<b>{html.escape(d.state.describe())}</b>",
        f'step time <b class="distir-step-time">{format_time(r.step_time_s)}</b>',
        f"{len(r.devices)} device(s)",
    ]
    if worst is not None:
        parts.append(f"peak memory {format_bytes(peaks[worst])} (device {worst})")
    if over:
        parts.append(
            f'<span style="color:#d62728">out of memory on device(s) {", ".join(map(str, over))}'
            "</span>"
        )
    text = " · ".join(parts)
    if d.collectives:
        items = "".join(f"<li><code>{html.escape(str(c))}</code></li>" for c in d.collectives)
        text += (
            f"<details><summary>{len(d.collectives)} redistribution(s) inserted by propagation"
            f"</summary><ul>{items}</ul></details>"
        )
    text += (
        f"<div style='color:#888;font-size:smaller'>derive {d.derive_s * 1e3:.0f} ms, "
        f"simulate {d.simulate_s * 1e3:.0f} ms</div>"
    )
    return f'<div class="distir-summary-body">{text}</div>'


def build_payloads(
    session: Session, options: GraphOptions | None = None, *, view: str = "distributed"
) -> Payloads:
    """The graph drawing, Gantt and memory figures and summary of the session's state."""
    d = session.current
    if view == "original":
        graph = render_graph(session.base, placements_of(d), options)
    else:
        graph = render_graph(d.function, None, options)
    return Payloads(
        graph,
        gantt_figure(d.result, d.function),
        memory_figure(d.result),
        summary_html(session),
    )


def short_annotation(annotation: Annotation) -> str:
    if isinstance(annotation, tuple):
        mesh, placements = annotation
        return f"mesh {list(mesh.shape)} [{', '.join(map(str, placements))}]"
    return str(annotation)


__all__ = [
    "Payloads",
    "base_name",
    "build_payloads",
    "placements_of",
    "short_annotation",
    "summary_html",
]
