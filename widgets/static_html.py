"""Every view as HTML that needs no kernel: for docs, reports and CI artifacts.

Pages are self-contained and work offline: plotly.js is inlined (once per
page, by plotly's ``include_plotlyjs=True``), the graph's SVG sits inline, and
nothing is fetched from a CDN.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from ir.function import Function
from ir.value import Value

from .compare import compare_figure
from .gantt import gantt_figure
from .graph import GraphOptions, RenderedGraph, legend_html, render_graph
from .memory import memory_figure

if TYPE_CHECKING:
    from ir.sim import SimResult

Part = go.Figure | RenderedGraph | str

# A graph is shown at its natural size, its text readable, scrolled inside its box (fitted
# to the page's width, a wide graph's text was 5 px); a click toggles fitting it to the
# page's width (an overview). Wide text scrolls in its own box too: nothing makes the page
# wider than the window.
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
.distir-graph-box { overflow: auto; max-height: 80vh; border: 1px solid #ddd; cursor: zoom-out; }
.distir-graph-box svg { max-width: none; display: block; }
.distir-graph-box.distir-fit { cursor: zoom-in; }
.distir-graph-box.distir-fit svg { max-width: 100%; height: auto; }
pre, .distir-wide { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; } td, th { padding: 3px 8px; text-align: left; }
"""
_TOGGLE = "this.classList.toggle('distir-fit')"


def graph_html(graph: RenderedGraph) -> str:
    """The graph's legend and inline SVG (an HTML fragment): at its natural size (its text
    readable), scrolled in its box; a click fits it to the page's width and back."""
    return legend_html(graph.legend) + (
        f'<div class="distir-graph-box" title="click: fit to width / natural size" '
        f'onclick="{_TOGGLE}">{graph.svg}</div>'
    )


def figure_html(figure: go.Figure, *, include_plotlyjs: bool = True) -> str:
    """One plotly figure as an HTML fragment; with ``include_plotlyjs`` it carries plotly.js."""
    return figure.to_html(
        full_html=False,
        include_plotlyjs=include_plotlyjs,
        config={"displaylogo": False, "responsive": True},
    )


def page_html(title: str, parts: Sequence[tuple[str, Part]]) -> str:
    """A self-contained page of (heading, part) sections; a str part is raw HTML.

    plotly.js is inlined with the first figure only.
    """
    body: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    plotly_included = False
    for heading, part in parts:
        if heading:
            body.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(part, go.Figure):
            body.append(figure_html(part, include_plotlyjs=not plotly_included))
            plotly_included = True
        elif isinstance(part, RenderedGraph):
            body.append(graph_html(part))
        else:
            body.append(part)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def graph_page(
    function: Function,
    placements: Mapping[Value | str, str] | None = None,
    options: GraphOptions | None = None,
) -> str:
    """The graph view of ``function`` as a page."""
    return page_html(function.name, [("", render_graph(function, placements, options))])


def gantt_page(result: SimResult, function: Function | None = None) -> str:
    """The Gantt view as a page."""
    return page_html("Gantt", [("", gantt_figure(result, function))])


def memory_page(result: SimResult) -> str:
    """The memory view as a page."""
    return page_html("Memory", [("", memory_figure(result))])


def compare_page(
    a: SimResult, b: SimResult, labels: tuple[str, str] = ("A", "B"), **kwargs: object
) -> str:
    """The comparison of two strategies as a page."""
    return page_html(
        f"{labels[0]} vs {labels[1]}", [("", compare_figure(a, b, labels=labels, **kwargs))]
    )


def report_page(
    function: Function,
    result: SimResult,
    *,
    title: str | None = None,
    placements: Mapping[Value | str, str] | None = None,
    options: GraphOptions | None = None,
) -> str:
    """Graph, Gantt and memory of one strategy on one page (the workbench's report)."""
    return page_html(
        title or f"{function.name}: simulated step",
        [
            ("Program", render_graph(function, placements, options)),
            ("Timeline", gantt_figure(result, function)),
            ("Memory", memory_figure(result)),
        ],
    )
