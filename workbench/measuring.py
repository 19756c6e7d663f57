"""Measure a workbench program on this machine and simulate it on this machine's topology.

What the dashboard's "Measure" button and ``python -m workbench report --measure``
(:func:`measure_part`) do: the distributed step is lowered to one program per rank
(``ir.sharding.lower_to_ranks``) and run on one gloo process per rank on this CPU
(``torch_dist.measure``, its training state carried from step to step), and the
same step is simulated on a topology of this machine (``ir.calibrate``'s, or one
given). Only small programs are run: at most :data:`MAX_PROCESSES` processes and
:data:`MAX_BYTES_PER_RANK` of simulated peak memory per rank;
:func:`why_not_measured` says why a program is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ir.device import Topology
from ir.errors import DistIRError
from ir.function import Function
from widgets.units import format_bytes

__all__ = [
    "MAX_BYTES_PER_RANK",
    "MAX_PROCESSES",
    "MeasureRefusedError",
    "MeasuredRun",
    "measure_part",
    "measure_step",
    "why_not_measured",
]

MAX_PROCESSES = 4  # one gloo process per device, on a CPU shared with the notebook
MAX_BYTES_PER_RANK = 256 * 2**20


class MeasureRefusedError(DistIRError):
    """The program is not measured on this machine; the message says why."""


@dataclass(frozen=True)
class MeasuredRun:
    """A measured step (``measured``), its simulation on ``topology`` with the topology's
    cost models (``simulated``) and with the step's ops profiled on this machine
    (``profiled``, None when not profiled: ``ir.backends.profile.profile_ops``), and
    whether the training state was carried from step to step (``note`` says if not)."""

    measured: Any  # ir.backends.measurement.Measurement
    simulated: Any  # ir.sim.SimResult
    topology: Topology
    carried: bool
    note: str = ""
    profiled: Any = None  # ir.sim.SimResult with costs=, or None

    @property
    def compared(self) -> Any:
        """The simulation to set beside the measurement: the profiled one when there is
        one (its op costs are this machine's), else the models'."""
        return self.profiled if self.profiled is not None else self.simulated

    def summary(self) -> str:
        """One line: the measured step against each simulation, with the errors."""
        m = self.measured.step_time_s
        parts = [f"measured step {m * 1e3:.2f} ms"]
        for label, sim in (("profiled op costs", self.profiled), ("models", self.simulated)):
            if sim is not None:
                error = (sim.step_time_s - m) / m
                parts.append(
                    f"simulated {sim.step_time_s * 1e3:.2f} ms with {label} ({error:+.0%})"
                )
        return "; ".join(parts)


def why_not_measured(step: Function, simulated: Any = None) -> str | None:
    """Why ``step`` is not run on this machine's processes (None: it can be).

    ``simulated`` (a SimResult of ``step`` on any topology) gives the peak memory per
    device to check; without it only the number of devices is checked.
    """
    devices = sorted(step.devices, key=str)
    if any(not isinstance(d, int) for d in devices):
        return f"its devices {devices} are not all concrete ranks"
    if len(devices) > MAX_PROCESSES:
        return (
            f"it uses {len(devices)} devices; a measurement runs one gloo process per device on "
            f"this CPU, at most {MAX_PROCESSES} (choose a strategy over fewer devices)"
        )
    if simulated is not None:
        peak = max(simulated.peak_memory_bytes.values(), default=0.0)
        if peak > MAX_BYTES_PER_RANK:
            return (
                f"a device's simulated peak memory is {format_bytes(peak)}, above the "
                f"{format_bytes(MAX_BYTES_PER_RANK)} a process may take here (a smaller model)"
            )
    return None


def measure_step(
    source: Function,
    step: Function,
    topology: Topology | None = None,
    *,
    steps: int = 3,
    warmup: int = 1,
    seed: int = 0,
    timeout_s: float = 120.0,
    profile: bool = True,
) -> MeasuredRun:
    """Measure ``step`` (a distributed program built from ``source``, the sequential
    program whose input names it keeps) on gloo processes, ``warmup + steps`` steps on
    random inputs, and simulate it on ``topology`` (default: ``ir.calibrate(quick=True)``'s
    topology of this machine, about 10 s). With ``profile``, each distinct op and transfer
    of the step is also timed on this machine (``ir.backends.profile.profile_ops``, a few
    seconds) and the step simulated with those costs (``MeasuredRun.profiled``). Both
    simulations use ``ir.calibration.comm_mode`` for this machine's cores.
    :class:`MeasureRefusedError` says why not when the program is too big or cannot be
    lowered or run."""
    import ir
    from ir.backends import torch_dist
    from ir.backends.torch_ranked import carry_of
    from ir.sharding import lower_to_ranks

    reason = why_not_measured(step)
    if reason is not None:
        raise MeasureRefusedError(f"{step.name} is not measured: {reason}")
    from ir.calibration import comm_mode

    n = max(len(step.devices), 1)
    if topology is None:
        topology = ir.calibrate(quick=True, progress=False).topology(n)
    comm = comm_mode(n)
    simulated = ir.simulate(step, topology, comm=comm)
    reason = why_not_measured(step, simulated)
    if reason is not None:
        raise MeasureRefusedError(f"{step.name} is not measured: {reason}")
    try:
        ranked = lower_to_ranks(step)
        inputs = ir.distribute(step, ir.random_inputs(source, seed=seed), source=source)
    except DistIRError as e:
        raise MeasureRefusedError(f"{step.name} cannot be run on ranks: {e}") from e
    carry = carry_of(source) or None
    note = "" if carry else "a forward program: every step reruns the same inputs"
    options = {"steps": steps, "warmup": warmup, "timeout_s": timeout_s}
    try:
        measured = torch_dist.measure(ranked, inputs, carry=carry, **options)
    except torch_dist.BackendError as e:
        if carry is None or "carry:" not in str(e):
            raise MeasureRefusedError(f"{step.name} could not be measured: {e}") from e
        # the state is not resident on its ranks (not a steady-state step): rerun
        measured = torch_dist.measure(ranked, inputs, **options)
        carry, note = None, f"the state is not carried between steps ({str(e).splitlines()[0]})"
    profiled = None
    if profile:
        from ir.backends.profile import profile_ops

        try:
            costs = profile_ops(step, n, timeout_s=timeout_s, progress=False)
        except DistIRError as e:
            note = f"{note}; not profiled: {str(e).splitlines()[0]}".lstrip("; ")
        else:
            profiled = ir.simulate(step, topology, comm=comm, costs=costs)
    return MeasuredRun(measured, simulated, topology, carry is not None, note, profiled)


def measure_part(
    source: Function,
    steps: Sequence[tuple[str, Function]],
    topology: Topology | None = None,
    *,
    measured_steps: int = 3,
) -> list[tuple[str, Any]]:
    """The static report's optional section: each ``(label, step)`` small enough measured
    (:func:`measure_step`) and shown as its measured Gantt chart over the simulated one,
    its live bytes against the simulated memory curves and the error table; the others
    with the reason they were not. ``topology`` (default: this machine, calibrated once)
    is what every step is simulated on."""
    import html
    import os

    from widgets.measured import measured_vs_simulated_figure
    from widgets.measured_memory import measured_memory_figure
    from widgets.measured_table import error_table_html

    heading = "Measured on this machine against simulated"
    fits = [(label, step) for label, step in steps if why_not_measured(step) is None]
    if fits and topology is None:
        import ir

        topology = ir.calibrate(quick=True, progress=False).topology(MAX_PROCESSES)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    where = "" if topology is None else f", simulated on {html.escape(topology.name)}"
    parts: list[tuple[str, Any]] = [
        (
            heading,
            f"<p>Each strategy over at most {MAX_PROCESSES} devices run as one gloo process "
            f"per device on this CPU, lowered to ranks, {measured_steps} steps after one "
            f"warm-up step (medians){where}. Load average when measured: {load:.2f}; the "
            "other processes of a busy machine make measured times noisy.</p>",
        )
    ]
    for label, step in steps:
        try:
            run = measure_step(source, step, topology, steps=measured_steps)
        except MeasureRefusedError as e:
            parts.append(("", f"<p>{html.escape(label)}: {html.escape(str(e))}</p>"))
            continue
        title = f"{label}: measured {run.measured.steps} steps against simulated"
        parts.append(("", f"<p>{html.escape(run.summary())}</p>"))
        parts.append((title, measured_vs_simulated_figure(run.measured, run.compared)))
        parts.append(("", measured_memory_figure(run.measured, run.compared)))
        parts.append(("", error_table_html(run.measured, run.compared)))
    return parts
