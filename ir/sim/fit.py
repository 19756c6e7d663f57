"""Fit a preset's efficiency model to step times a user has measured: :func:`fit_efficiency`.

The presets' efficiency models come from first principles and public figures
(``ir.hardware.efficiency``). A user with measurements of their own (their cluster, their
framework version) can scale the model's four free factors (:class:`EfficiencyFactors`:
matrix-kernel efficiency, memory bandwidth, host time, network efficiency) to them:

>>> import ir
>>> from ir import models, transforms as T
>>> f = models.gpt(4, 64, 128, 4, 256, 2, dtype="float16")
>>> program = T.megatron(T.training(f, "adam"), 2, 1)
>>> real = ir.Topology.preset("a100-hgx", 2)
>>> slower = ir.hardware.EfficiencyFactors(host=2.0).apply(real)  # a "measured" run
>>> m = [Measurement("dp2", program, ir.simulate(program, slower).step_time_s)]
>>> fit = fit_efficiency(m, "a100-hgx", factors=("host",), prior=0.0)
>>> round(fit.factors.host, 2)
2.0

The fit works in log space on a linearised model of each measurement's step time (its
elasticity to each factor, by finite differences of real simulations), with a ridge pull
towards the unscaled model (``prior``), relinearised a few times. Every returned figure is
re-simulated exactly. Held-out error is leave-one-out: each measurement predicted by a fit
to the others.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..device import Topology
from ..errors import ArgumentError
from ..function import Function
from ..hardware.efficiency import EfficiencyFactors
from . import simulate

FACTORS = ("gemm", "memory", "host", "network")


@dataclass(frozen=True)
class Measurement:
    """One measured training (or serving) step.

    ``program``: the step as it ran, built with the project's transforms (its devices
    say how many GPUs); ``step_time_s``: the measured time of one step (an iteration);
    ``group``: configurations of one model, so that ranking quality is judged within it.
    """

    label: str
    program: Function
    step_time_s: float
    group: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.program, Function):
            raise ArgumentError(
                f"measurement {self.label!r}: program must be an ir.Function (the step as "
                f"built by ir.transforms), got {type(self.program).__name__}"
            )
        t = self.step_time_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ArgumentError(
                f"measurement {self.label!r}: step_time_s must be a positive number of "
                f"seconds, got {t!r}"
            )

    @classmethod
    def from_trace(
        cls,
        label: str,
        program: Function,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        group: str = "",
    ) -> Measurement:
        """The step a PyTorch profiler (Kineto) trace recorded, one file per rank: each op
        of ``program`` marked by its ``record_function`` range
        (:func:`ir.backends.traces.label`; :func:`ir.backends.traces.profile_step` writes
        such a trace), the step time the median step's. A trace that is not one of
        ``program``'s steps raises ``TraceError`` saying why."""
        from ..backends.traces import read_trace

        measured = read_trace(paths, program)
        return cls(label, program, float(measured.step_time_s), group)


@dataclass(frozen=True)
class FitRow:
    """A measurement with its predictions: the unscaled model, the fit (in sample), and the
    fit to the other measurements (leave-one-out, out of sample)."""

    label: str
    group: str
    measured_s: float
    model_s: float
    fitted_s: float
    held_out_s: float | None

    @staticmethod
    def error(predicted: float, measured: float) -> float:
        return predicted / measured - 1


@dataclass(frozen=True)
class EfficiencyFit:
    """The fitted factors, the topologies they make, and the errors (see :func:`mape`)."""

    preset: str
    factors: EfficiencyFactors
    rows: tuple[FitRow, ...]

    def topology(self, num_devices: int) -> Topology:
        """``Topology.preset(preset, num_devices)`` with the fitted factors applied."""
        return self.factors.apply(Topology.preset(self.preset, num_devices))

    @property
    def model_mape(self) -> float:
        """Mean absolute percentage error of the unscaled model (a fraction)."""
        return _mape([(r.model_s, r.measured_s) for r in self.rows])

    @property
    def in_sample_mape(self) -> float:
        return _mape([(r.fitted_s, r.measured_s) for r in self.rows])

    @property
    def held_out_mape(self) -> float | None:
        """Leave-one-out MAPE (None with fewer than two measurements)."""
        pairs = [(r.held_out_s, r.measured_s) for r in self.rows if r.held_out_s is not None]
        return _mape(pairs) if pairs else None

    def table(self) -> str:
        """A markdown table: held-out error first, then the unscaled model and the fit."""
        lines = [
            "| measurement | measured s | held out (LOO) | unscaled model | fitted (in sample) |",
            "|---|---|---|---|---|",
        ]
        for r in self.rows:
            held = (
                "-" if r.held_out_s is None else f"{FitRow.error(r.held_out_s, r.measured_s):+.1%}"
            )
            lines.append(
                f"| {r.label} | {r.measured_s:.4g} | {held} "
                f"| {FitRow.error(r.model_s, r.measured_s):+.1%} "
                f"| {FitRow.error(r.fitted_s, r.measured_s):+.1%} |"
            )
        held = self.held_out_mape
        lines.append("")
        lines.append(
            f"MAPE: held out {'-' if held is None else f'{held:.1%}'}, unscaled model "
            f"{self.model_mape:.1%}, fitted in sample {self.in_sample_mape:.1%}; factors "
            + ", ".join(f"{k} {getattr(self.factors, k):.3g}" for k in FACTORS)
        )
        return "\n".join(lines)


def _mape(pairs: Sequence[tuple[float, float]]) -> float:
    return sum(abs(p / m - 1) for p, m in pairs) / len(pairs)


def fit_efficiency(
    measurements: Sequence[Measurement],
    preset: str,
    *,
    factors: Sequence[str] = FACTORS,
    prior: float = 0.05,
    iterations: int = 3,
    held_out: bool = True,
) -> EfficiencyFit:
    """Fit ``factors`` (a subset of :data:`FACTORS`) of ``preset``'s efficiency model to
    ``measurements``; report each measurement's error unscaled, fitted and held out.

    ``prior``: the weight of the pull towards factor 1 (log space), against each
    measurement's squared log error; ``iterations``: relinearisations.
    """
    measurements = list(measurements)
    if not measurements:
        raise ArgumentError("calibrate: give at least one Measurement")
    unknown = [f for f in factors if f not in FACTORS]
    if unknown or not factors:
        raise ArgumentError(f"calibrate: factors must be among {FACTORS}, got {list(factors)}")
    names = tuple(dict.fromkeys(factors))
    sizes = [_program_devices(m.program) for m in measurements]
    bases = {n: Topology.preset(preset, n) for n in set(sizes)}
    if any(t.ideal for t in bases.values()):
        raise ArgumentError(f"calibrate: preset {preset!r} has no efficiency model to fit")
    measured = np.log([m.step_time_s for m in measurements])

    def times(theta: np.ndarray, which: Sequence[int]) -> np.ndarray:
        scale = EfficiencyFactors(**{n: float(math.exp(x)) for n, x in zip(names, theta)})
        out = []
        for j in which:
            topology = scale.apply(bases[sizes[j]])
            out.append(simulate(measurements[j].program, topology).step_time_s)
        return np.log(out)

    everyone = range(len(measurements))
    theta = np.zeros(len(names))
    model_log = times(theta, everyone)
    current, jac = model_log, None
    for _ in range(iterations):
        jac = _jacobian(times, theta, current, everyone)
        theta = _step(theta, jac, measured - current, prior, range(len(measurements)))
        current = times(theta, everyone)
    fitted = EfficiencyFactors(**{n: float(math.exp(x)) for n, x in zip(names, theta)})
    held: list[float | None] = [None] * len(measurements)
    if held_out and len(measurements) > 1 and jac is not None:
        for j in everyone:
            others = [k for k in everyone if k != j]
            # one Gauss-Newton step from the full fit, on the others' residuals
            theta_j = _step(theta, jac, measured - current, prior, others)
            held[j] = float(math.exp(times(theta_j, [j])[0]))
    rows = tuple(
        FitRow(
            m.label,
            m.group,
            m.step_time_s,
            float(math.exp(model_log[j])),
            float(math.exp(current[j])),
            held[j],
        )
        for j, m in enumerate(measurements)
    )
    return EfficiencyFit(preset, fitted, rows)


def _program_devices(f: Function) -> int:
    """How many GPUs ``f`` runs on: one more than its largest integer device id."""
    ids = [d for d in f.devices if isinstance(d, int) and not isinstance(d, bool)]
    if not ids:
        raise ArgumentError(f"calibrate: program {f.name!r} names no device")
    return max(ids) + 1


def _jacobian(times, theta: np.ndarray, at: np.ndarray, which) -> np.ndarray:
    """d log T_j / d log factor_i by a forward difference of 10% in each factor."""
    h = math.log(1.1)
    jac = np.zeros((len(at), len(theta)))
    for i in range(len(theta)):
        bumped = theta.copy()
        bumped[i] += h
        jac[:, i] = (times(bumped, which) - at) / h
    return jac


def _step(theta, jac, residual, prior, rows) -> np.ndarray:
    """The ridge-regularised least-squares update on ``rows``:
    argmin_d |J d - r|^2 + prior |theta + d|^2."""
    rows = list(rows)
    J, r = jac[rows], residual[rows]
    n = len(theta)
    lhs = J.T @ J + prior * np.eye(n)
    rhs = J.T @ r - prior * theta
    # least squares: a factor no measurement depends on (a host-bound set says nothing of
    # the GEMMs) stays where it is instead of making the system singular
    return theta + np.linalg.lstsq(lhs, rhs, rcond=None)[0]


__all__ = ["FACTORS", "EfficiencyFit", "FitRow", "Measurement", "fit_efficiency"]
