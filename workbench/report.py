"""The static report: a model under several strategies as one self-contained HTML file.

The page carries plotly.js inline (once) and the graphs as inline SVG, and
fetches nothing, so it opens offline, from an e-mail or a CI artifact. It opens
with the summary table of the strategies (step time, peak memory, exposed
communication, idle), then the strategy search's Pareto front (step time against
peak memory over every dp x tp x pp of the devices), the comparison of the first
two strategies on one time axis, and per strategy its Gantt chart, memory curves
and logical program graph (one node per pmap, collective or send, fitted to the
page's width). Each chart has one legend.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ir.device import Topology
from ir.errors import DistIRError
from ir.function import Function
from widgets import (
    GraphOptions,
    compare_figure,
    gantt_figure,
    memory_figure,
    pareto_figure,
    render_graph,
)
from widgets.breakdown import breakdown_html, step_breakdown
from widgets.static_html import Part, page_html
from widgets.units import format_bytes, format_time

from .report_config import DEFAULT_STRATEGIES, OPTIMIZERS, ReportConfig, build_model
from .session import Derived, State, Strategy, derive

if TYPE_CHECKING:
    from ir.search import SearchResult


@dataclass(frozen=True)
class Outcome:
    """One strategy's derived state, or the error that stopped it."""

    label: str
    derived: Derived | None
    error: str = ""


def simulate_strategies(
    function: Function,
    topology: Topology,
    strategies: Sequence[str | Strategy],
    *,
    progress: bool = False,
) -> list[Outcome]:
    """Transform and simulate ``function`` under each strategy; failures are recorded."""
    from tqdm.auto import tqdm

    outcomes = []
    for item in tqdm(list(strategies), desc="simulating strategies", disable=not progress):
        strategy = Strategy.parse(item) if isinstance(item, str) else item
        label = strategy.describe()
        try:
            outcomes.append(Outcome(label, derive(function, topology, State(strategy))))
        except Exception as e:  # one failing strategy must not lose the others' report
            kind = "" if isinstance(e, DistIRError) else f"{type(e).__name__}: "
            outcomes.append(Outcome(label, None, f"{kind}{e}"))
    return outcomes


def summary_table(outcomes: Sequence[Outcome]) -> str:
    """An HTML table: one row per strategy with its step time, peak memory, exposed
    communication and idle time (each the largest over devices), the fastest first marked."""
    times = [o.derived.result.step_time_s for o in outcomes if o.derived is not None]
    fastest = min(times, default=None)
    rows = []
    for o in outcomes:
        label = html.escape(o.label)
        if o.derived is None:
            rows.append(
                f"<tr><td>{label}</td><td colspan='5' style='color:#b2182b'>"
                f"{html.escape(o.error)}</td></tr>"
            )
            continue
        r = o.derived.result
        peak = max(r.peak_memory_bytes.values(), default=0.0)
        parts = step_breakdown(r)
        exposed = max((p.exposed_communication_s for p in parts), default=0.0)
        idle = max((p.idle_s for p in parts), default=0.0)
        over = getattr(r, "over_capacity", ())
        oom = f"out of memory on {list(over)}" if over else "fits"
        best = " <b>(fastest)</b>" if r.step_time_s == fastest and len(times) > 1 else ""
        share = idle / r.step_time_s if r.step_time_s else 0.0
        rows.append(
            f"<tr><td>{label}{best}</td><td>{format_time(r.step_time_s)}</td>"
            f"<td>{format_bytes(peak)}</td><td>{format_time(exposed)}</td>"
            f"<td>{format_time(idle)} ({share:.0%})</td><td>{oom}</td></tr>"
        )
    head = (
        "<tr><th>strategy</th><th>step time</th><th>peak memory (max device)</th>"
        "<th>exposed communication (max device)</th><th>idle (max device)</th>"
        "<th>memory</th></tr>"
    )
    return f"<table border='1' class='distir-summary'>{head}{''.join(rows)}</table>"


def search_strategies(
    function: Function, topology: Topology, *, progress: bool = False
) -> SearchResult | str:
    """Every dp x tp x pp of ``topology``'s devices for ``function`` (as it is: a training
    step trains, a forward program runs forward), or why the search could not run."""
    from ir.search import search

    try:
        return search(function, topology, optimizer=None, progress=progress)
    except DistIRError as e:
        return str(e)


def search_part(search: SearchResult | str, topology: Topology) -> list[tuple[str, Part]]:
    """The report's search section: the Pareto figure and the front as a table."""
    heading = "Strategy search: step time against peak memory"
    if isinstance(search, str):
        return [(heading, f"<p>The search could not run: {html.escape(search)}</p>")]
    front = search.pareto()
    rows = "".join(
        f"<tr><td>{html.escape(str(r.strategy))}</td><td>{format_time(r.step_time_s)}</td>"
        f"<td>{format_bytes(r.peak_memory_bytes)}</td><td>{r.mfu:.0%}</td>"
        f"<td>{format_time(r.exposed_comm_s)}</td><td>{r.bubble:.0%}</td></tr>"
        for r in front
    )
    table = (
        "<p>The Pareto front (no other strategy is both faster and smaller), fastest "
        "first:</p><table border='1' class='distir-pareto'><tr><th>strategy</th>"
        "<th>step time</th><th>peak memory</th><th>MFU</th><th>exposed communication "
        f"(mean)</th><th>bubble (mean)</th></tr>{rows}</table>"
    )
    capacity = min(device.memory_bytes for device in topology.devices)
    return [(heading, pareto_figure(search, capacity)), ("", table)]


def report_html(
    function: Function,
    topology: Topology,
    outcomes: Sequence[Outcome],
    *,
    title: str,
    description: str = "",
    graph_options: GraphOptions | None = None,
    search: SearchResult | str | None = None,
    measured: Sequence[tuple[str, Part]] = (),
) -> str:
    """The report page (a complete HTML document with plotly.js inlined).

    The summary table comes first; ``search`` (a search's result, or why it failed)
    adds its Pareto front, ``measured`` (:func:`workbench.measuring.measure_part`) the
    measured-against-simulated section. Each strategy's program is drawn as its logical graph
    (one node per pmap, collective or send, whatever the number of devices), the
    sequential program op by op with repeated layers folded.
    """
    options = graph_options or GraphOptions()
    logical = replace(options, view="logical")
    intro = (
        f"<p>{html.escape(description)}</p><p>Hardware: {html.escape(topology.name)}, "
        f"{len(topology.devices)} devices. Times are simulated (see docs/simulator.md).</p>"
    )
    parts: list[tuple[str, Part]] = [("Summary", summary_table(outcomes)), ("", intro)]
    if search is not None:
        parts += search_part(search, topology)
    parts += measured
    done = [o for o in outcomes if o.derived is not None]
    if len(done) >= 2:
        a, b = done[0].derived, done[1].derived
        assert a is not None and b is not None
        # A and B name the rows: a strategy's description before every row label would
        # take half the chart's width
        heading = f"A = {done[0].label} vs B = {done[1].label}"
        figure = compare_figure(
            a.result,
            b.result,
            function_a=a.function,
            function_b=b.function,
            labels=("A", "B"),
            title=heading,
        )
        parts.append((heading, figure))
    for o in done:
        d = o.derived
        assert d is not None
        parts += [
            (f"{o.label}: timeline", gantt_figure(d.result, d.function)),
            (f"{o.label}: where each device's step goes", breakdown_html(d.result)),
            (f"{o.label}: memory", memory_figure(d.result)),
            (
                f"{o.label}: program (one node per logical op)",
                render_graph(d.function, None, logical, result=d.result),
            ),
        ]
    parts.append(("The sequential program", render_graph(function, None, options)))
    text = html.escape(str(function))
    parts.append(("", f"<details><summary>as text</summary><pre>{text}</pre></details>"))
    return page_html(title, parts)


def write_report(
    path: Path,
    function: Function,
    config: ReportConfig | None = None,
    *,
    topology: Topology | None = None,
    progress: bool = False,
    measure_topology: Topology | None = None,
) -> Path:
    """Simulate ``function`` under ``config.strategies`` (and search the strategies when
    ``config.search``; measure them when ``config.measure``, simulated for that on
    ``measure_topology``, default this machine calibrated) and write the report to
    ``path``."""
    from tqdm.auto import tqdm

    config = config or ReportConfig()
    topology = topology or Topology.preset(config.preset, config.devices)
    outcomes = simulate_strategies(function, topology, config.strategies, progress=progress)
    if not any(o.derived is not None for o in outcomes):
        errors = "; ".join(f"{o.label}: {o.error}" for o in outcomes)
        raise DistIRError(f"no strategy could be simulated: {errors}")
    found = search_strategies(function, topology, progress=progress) if config.search else None
    measured: list[tuple[str, Part]] = []
    if config.measure:
        from .measuring import measure_part

        steps = [(o.label, o.derived.function) for o in outcomes if o.derived is not None]
        measured = measure_part(function, steps, measure_topology)
    with tqdm(total=1, desc="drawing the report", disable=not progress) as bar:
        page = report_html(
            function,
            topology,
            outcomes,
            title=f"DistIR Workbench report: {function.name} on {topology.name}",
            description=config.describe_model(),
            search=found,
            measured=measured,
        )
        bar.update(1)
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


def session_report(session: Any, path: Path) -> Path:
    """The report of a live session's current state (what the dashboard shows)."""
    d: Derived = session.current
    outcome = Outcome(d.state.describe(), d)
    page = report_html(
        session.base,
        session.topology,
        [outcome],
        title=f"DistIR Workbench report: {session.base.name} on {session.topology.name}",
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


__all__ = [
    "DEFAULT_STRATEGIES",
    "OPTIMIZERS",
    "Outcome",
    "ReportConfig",
    "build_model",
    "report_html",
    "search_part",
    "search_strategies",
    "session_report",
    "simulate_strategies",
    "summary_table",
    "write_report",
]
