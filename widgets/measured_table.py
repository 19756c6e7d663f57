"""The error table of a measured run against the simulator: step, per device, per op type.

Pure functions over a :class:`ir.backends.measurement.Measurement` and a
:class:`ir.sim.SimResult` (the dashboard's measure panel and the static report
show the same table). Errors are ``(simulated - measured) / measured``, negative
when the simulator is optimistic, as in :mod:`widgets.measured`.

>>> import ir
>>> from ir.backends.measurement import Measurement
>>> f = ir.models.mlp(4, 3, 5, 2)
>>> sim = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
>>> timed = [(i, 1e-3 * i, 1e-3 * (i + 1)) for i in range(len(f.ops))]
>>> rows = op_type_errors(Measurement.from_records(f, {0: [(0.0, timed)]}), sim)
>>> rows[0].name, rows[0].count, f"{rows[0].measured_s * 1e3:.0f} ms"
('MatMul', 2, '2 ms')
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .measured import device_errors, event_kind, op_pairs, relative_error
from .units import format_bytes, format_time

if TYPE_CHECKING:
    from ir.backends.measurement import Measurement
    from ir.sim import SimResult

__all__ = ["OpTypeError", "error_table_html", "op_type_errors"]


@dataclass(frozen=True)
class OpTypeError:
    """The paired events of one op type (communication: one kind, such as ``allreduce``)
    over all devices: their summed durations, measured and simulated."""

    name: str
    stream: str
    count: int
    measured_s: float
    simulated_s: float

    @property
    def error(self) -> float:
        return relative_error(self.simulated_s, self.measured_s)


def op_type_errors(measured: Measurement, simulated: SimResult) -> list[OpTypeError]:
    """The pairs of :func:`widgets.measured.op_pairs` summed by op type (communication by
    what it does, so a rank's ``RankCollective`` and the global ``AllReduce`` are one row),
    the most measured time first."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for p in op_pairs(measured, simulated):
        row = sums[(event_kind(p.measured), p.measured.stream)]
        row[0] += 1
        row[1] += p.measured.dur_s
        row[2] += p.simulated.dur_s
    rows = [OpTypeError(k, s, int(n), m, x) for (k, s), (n, m, x) in sums.items()]
    return sorted(rows, key=lambda r: -r.measured_s)


def _cells(*items: str) -> str:
    return "".join(f"<td>{html.escape(x)}</td>" for x in items)


def error_table_html(measured: Measurement, simulated: SimResult) -> str:
    """The step time, each device's busy time, end and (ranked runs) peak live bytes, and
    each op type's summed time, measured against simulated, as one HTML table."""
    head = "<tr><th></th><th>measured</th><th>simulated</th><th>error</th></tr>"
    step_error = relative_error(simulated.step_time_s, measured.step_time_s)
    rows = [
        "<tr><th colspan='4'>step</th></tr>",
        "<tr>"
        + _cells(
            f"step time (median of {measured.steps})",
            format_time(measured.step_time_s),
            format_time(simulated.step_time_s),
            f"{step_error:+.0%}",
        )
        + "</tr>",
        "<tr><th colspan='4'>per device</th></tr>",
    ]
    for r in device_errors(measured, simulated):
        rows.append(
            "<tr>"
            + _cells(
                f"device {r.device} busy",
                format_time(r.measured_busy_s),
                format_time(r.simulated_busy_s),
                f"{r.busy_error:+.0%}",
            )
            + "</tr><tr>"
            + _cells(
                f"device {r.device} last op ends",
                format_time(r.measured_end_s),
                format_time(r.simulated_end_s),
                f"{r.end_error:+.0%}",
            )
            + "</tr>"
        )
        if r.device in measured.peak_memory_bytes and r.device in simulated.peak_memory_bytes:
            peak_m = measured.peak_memory_bytes[r.device]
            peak_s = simulated.peak_memory_bytes[r.device]
            rows.append(
                "<tr>"
                + _cells(
                    f"device {r.device} peak live bytes",
                    format_bytes(peak_m),
                    format_bytes(peak_s),
                    f"{relative_error(peak_s, peak_m):+.0%}",
                )
                + "</tr>"
            )
    rows.append("<tr><th colspan='4'>per op type (all devices, summed)</th></tr>")
    for r in op_type_errors(measured, simulated):
        label = f"{r.name} x{r.count}" + (" (communication)" if r.stream != "compute" else "")
        rows.append(
            "<tr>"
            + _cells(
                label, format_time(r.measured_s), format_time(r.simulated_s), f"{r.error:+.0%}"
            )
            + "</tr>"
        )
    return (
        "<table border='1' class='distir-measured-errors' style='border-collapse:collapse'>"
        f"{head}{''.join(rows)}</table>"
    )
