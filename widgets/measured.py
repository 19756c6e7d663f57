"""Measured against simulated: a real run's Gantt chart above the simulator's, one time axis.

A :class:`ir.backends.measurement.Measurement` (from ``torch_dist.measure``) answers
what a :class:`ir.sim.SimResult` does (``bars``, ``devices``, ``step_time_s``,
``busy_s``), so both charts are :func:`widgets.gantt.gantt_traces`. Errors are
``(simulated - measured) / measured``, as in docs/accuracy.md: negative when the
simulator is optimistic.

>>> import ir
>>> from ir.backends.measurement import Measurement
>>> f = ir.models.mlp(4, 3, 5, 2)
>>> sim = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
>>> timed = [(i, 1e-3 * i, 1e-3 * (i + 1)) for i in range(len(f.ops))]
>>> measured = Measurement.from_records(f, {0: [(0.0, timed)]})
>>> traces, layout = measured_vs_simulated_spec(measured, sim)
>>> layout["title"]["text"].startswith(f"measured {len(f.ops)} ms vs simulated")
True
>>> layout["meta"]["step_error"] < 0  # an A100 runs this MLP in far less than 1 ms an op
True
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ir.function import Function

from .gantt import gantt_traces
from .live import TEMPLATE
from .units import format_time, time_unit

if TYPE_CHECKING:
    from ir.backends.measurement import Measurement
    from ir.op import Op
    from ir.sim import SimResult
    from ir.sim.result import Event

__all__ = [
    "DeviceError",
    "OpPair",
    "communication_kind",
    "device_errors",
    "event_kind",
    "measured_vs_simulated_figure",
    "measured_vs_simulated_spec",
    "op_pairs",
    "relative_error",
]


def relative_error(simulated: float, measured: float) -> float:
    """``(simulated - measured) / measured`` (0 when both are 0, inf when only measured is)."""
    if measured == 0:
        return 0.0 if simulated == 0 else float("inf")
    return (simulated - measured) / measured


@dataclass(frozen=True)
class OpPair:
    """One op on one device: its measured event and the simulator's."""

    measured: Event
    simulated: Event

    @property
    def op(self) -> Op:
        return self.measured.op

    @property
    def device(self) -> int:
        return self.measured.device

    @property
    def error(self) -> float:
        """Duration error of the simulated event against the measured one."""
        return relative_error(self.simulated.dur_s, self.measured.dur_s)


@dataclass(frozen=True)
class DeviceError:
    """One device's compute time (busy) and end of its last op, measured and simulated."""

    device: int
    measured_busy_s: float
    simulated_busy_s: float
    measured_end_s: float
    simulated_end_s: float

    @property
    def busy_error(self) -> float:
        return relative_error(self.simulated_busy_s, self.measured_busy_s)

    @property
    def end_error(self) -> float:
        return relative_error(self.simulated_end_s, self.measured_end_s)


def op_pairs(measured: Measurement, simulated: SimResult) -> list[OpPair]:
    """Each measured event with the simulated event of the same op on the same device.

    When the simulator ran the program that was measured (``measured.function``) the
    ops are the same objects and pair exactly. Otherwise (the simulator ran the
    program with its ``Pmap`` folded, or a ranked program was measured against the
    global one it was lowered from) the k-th event of an op type on a device's stream,
    in time order, pairs with the k-th; communication ops pair by what they do
    (:func:`communication_kind`: a rank's ``SendTo`` and ``RecvFrom`` with the global
    ``Send``'s events on the sender and the receiver, a ``RankCollective`` with the
    collective of its kind). Unpaired events (a lowering's own ``Slice``, say) are left out.
    """
    exact = {(e.op, e.device, e.stream): e for e in simulated.events}
    mine = measured.events
    if all((e.op, e.device, e.stream) in exact for e in mine):
        return [OpPair(e, exact[(e.op, e.device, e.stream)]) for e in mine]
    queues: dict[tuple[int, str, str], list[Event]] = defaultdict(list)
    for e in sorted(simulated.events, key=lambda e: e.start_s):
        queues[(e.device, e.stream, event_kind(e))].append(e)
    pairs, taken = [], defaultdict(int)
    for e in sorted(mine, key=lambda e: e.start_s):
        key = (e.device, e.stream, event_kind(e))
        k = taken[key]
        if k < len(queues[key]):
            pairs.append(OpPair(e, queues[key][k]))
            taken[key] = k + 1
    return pairs


_SENDS = ("Send", "SendEach", "SendTo", "RecvFrom")


def communication_kind(op: Op) -> str:
    """What a communication op does, the same for a global op and its ranked lowering:
    ``"send"`` for the point-to-point ops, a ``RankCollective``'s ``kind``, else the op
    type in lower case (``AllReduce``: ``"allreduce"``)."""
    if op.op_type in _SENDS:
        return "send"
    if op.op_type == "RankCollective":
        return str(op.attributes["kind"])
    return op.op_type.lower()


def event_kind(e: Event) -> str:
    """What pairs an event: its op type, or for communication :func:`communication_kind`."""
    return communication_kind(e.op) if e.stream == "communication" else e.op.op_type


def device_errors(measured: Measurement, simulated: SimResult) -> list[DeviceError]:
    """Per device (those both ran), busy compute time and last op's end, both ways."""
    out = []
    for d in measured.devices:
        if d not in simulated.busy_s:
            continue
        out.append(
            DeviceError(
                d,
                measured.busy_s[d],
                simulated.busy_s[d],
                max((e.end_s for e in measured.events_on(d)), default=0.0),
                max((e.end_s for e in simulated.events_on(d)), default=0.0),
            )
        )
    return out


def measured_vs_simulated_spec(
    measured: Measurement,
    simulated: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measured Gantt above simulated Gantt, one time axis, as plain plotly dicts.

    The title gives both step times and their error; a note under the charts gives
    each device's busy time, both ways, and its error. ``layout["meta"]`` holds the
    step error and the per-device rows (what the note shows, as numbers).
    """
    end_s = max(measured.step_time_s, simulated.step_time_s)
    unit = time_unit(end_s)
    top, rows_top = gantt_traces(measured, function, unit=unit, prefix="measured: ")
    bottom, rows_bottom = gantt_traces(
        simulated, function, unit=unit, prefix="simulated: ", showlegend=False
    )
    for trace in top:
        trace.update(xaxis="x", yaxis="y")
    for trace in bottom:
        trace.update(xaxis="x", yaxis="y2")
    n_top, n_bottom = max(len(rows_top), 1), max(len(rows_bottom), 1)
    gap = 0.08
    split = gap / 2 + (1 - gap) * n_bottom / (n_top + n_bottom)
    step_error = relative_error(simulated.step_time_s, measured.step_time_s)
    rows = device_errors(measured, simulated)
    note = "<br>".join(
        f"dev {r.device}: busy {format_time(r.measured_busy_s)} measured, "
        f"{format_time(r.simulated_busy_s)} simulated ({r.busy_error:+.0%})"
        for r in rows
    )

    def axis(names: list[str], domain: list[float]) -> dict[str, Any]:
        return {
            "domain": domain,
            "tickmode": "array",
            "tickvals": list(range(len(names))),
            "ticktext": names,
            "autorange": "reversed",
        }

    layout = {
        "barmode": "overlay",
        "title": {
            "text": title
            or (
                f"measured {format_time(measured.step_time_s)} vs simulated "
                f"{format_time(simulated.step_time_s)} ({step_error:+.0%}), "
                f"median of {measured.steps} steps"
            )
        },
        "xaxis": {
            "anchor": "y2",
            "title": {"text": f"time ({unit[0]})"},
            "range": [0, end_s / unit[1] * 1.01],
        },
        "yaxis": axis(rows_top, [split + gap / 2, 1.0]),
        "yaxis2": axis(rows_bottom, [0.0, split - gap / 2]),
        "annotations": [
            {
                "text": note,
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 0,
                "yshift": -45,  # below the time axis and its title
                "yanchor": "top",
                "showarrow": False,
                "align": "left",
            }
        ],
        "height": 160 + 26 * (n_top + n_bottom) + 16 * len(rows),
        "margin": {"l": 10, "r": 10, "t": 60, "b": 60 + 16 * len(rows)},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        "hoverlabel": {"align": "left"},
        "meta": {
            "step_error": step_error,
            "devices": [
                {
                    "device": r.device,
                    "measured_busy_s": r.measured_busy_s,
                    "simulated_busy_s": r.simulated_busy_s,
                    "busy_error": r.busy_error,
                }
                for r in rows
            ],
        },
    }
    return top + bottom, layout


def measured_vs_simulated_figure(
    measured: Measurement,
    simulated: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
) -> go.Figure:
    """The figure of :func:`measured_vs_simulated_spec`."""
    traces, layout = measured_vs_simulated_spec(measured, simulated, function, title=title)
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})
