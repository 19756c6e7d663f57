"""The simulator against real processes on this machine (docs/accuracy.md, "On this machine").

    python benchmarks/bench_accuracy.py [--steps 9] [--warmup 2] [--runs 1] [--quick] [--ranked]

Each program is an MLP training step (SGD) arranged by ``ir.transforms.megatron``:
data, tensor and pipeline parallelism (GPipe and 1F1B) and their 3D mixes, on 1, 2
and 4 processes, for two MLP sizes. Each is measured with
``ir.backends.torch_dist.measure`` (gloo on this CPU, one process per device, the
median of ``--steps`` timed steps after ``--warmup``) and simulated with
``ir.simulate`` on ``ir.calibrate()``'s topology of this machine (``--quick``: its
short calibration; ``comm=calibration.comm_mode(n)``: transfers hold the compute of
their processes where the processes leave no core free), and again with a profiled
cost table
(``ir.backends.profile.profile_ops``: each distinct op of the program timed alone on the
torch backend, in as many processes at once as the program has ranks; one table per
process count, shared by the programs). Nothing is fitted to the measurements: the
calibration and the profile time single ops and single transfers, never a step.
``--ranked`` measures each
program lowered to ranks instead (``ir.sharding.lower_to_ranks``: each process runs its
own rank's program with torch kernels, the weights carried from step to step) and
also prints each program's highest measured and simulated peak memory per rank.

Prints per program the measured and simulated step times (calibrated models, then
profiled costs) and the errors ``(simulated - measured) / measured``, then per cost
source the mean absolute percentage error (MAPE), the Spearman rank correlation of
the programs' step times, and, per size and process count, whether the fastest
program measured is the one the simulator ranks fastest. ``--runs 2`` measures
everything twice (the calibration once) and prints each program's spread between runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

import ir
from ir import models, transforms
from ir.backends import torch_dist
from ir.backends.profile import profile_ops
from ir.backends.torch_ranked import carry_of
from ir.sharding import lower_to_ranks

# (batch, features, hidden, classes, layers) of the two MLPs
SIZES = {"small": (64, 64, 128, 16, 4), "large": (256, 256, 1024, 64, 4)}
# (label, dp, tp, pp, microbatches, schedule)
STRATEGIES = [
    ("1 device", 1, 1, 1, 1, "1f1b"),
    ("dp2", 2, 1, 1, 1, "1f1b"),
    ("tp2", 1, 2, 1, 1, "1f1b"),
    ("pp2 gpipe m4", 1, 1, 2, 4, "gpipe"),
    ("pp2 1f1b m4", 1, 1, 2, 4, "1f1b"),
    ("dp4", 4, 1, 1, 1, "1f1b"),
    ("tp4", 1, 4, 1, 1, "1f1b"),
    ("dp2 tp2", 2, 2, 1, 1, "1f1b"),
    ("dp2 pp2 1f1b m2", 2, 1, 2, 2, "1f1b"),
    ("tp2 pp2 gpipe m2", 1, 2, 2, 2, "gpipe"),
]


@dataclass(frozen=True)
class Row:
    size: str
    strategy: str
    processes: int
    measured_s: list[float]  # one per run (each the median step of that run)
    simulated_s: dict[str, float]  # by cost source: "model", "profiled"

    def error(self, source: str, run: int = 0) -> float:
        return (self.simulated_s[source] - self.measured_s[run]) / self.measured_s[run]

    @property
    def spread(self) -> float:
        return max(self.measured_s) / min(self.measured_s) - 1


SOURCES = ("model", "profiled")


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (no ties expected among measured times)."""
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the short calibration")
    parser.add_argument(
        "--ranked", action="store_true", help="measure the per-rank programs, state carried"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"load average {os.getloadavg()[0]:.2f}; {'ranked' if args.ranked else 'global'}")
    calibration = ir.calibrate(quick=args.quick, progress=False)
    print(f"calibrated in {time.perf_counter() - started:.1f} s")
    print(calibration.summary_markdown())
    rows = []
    tables: dict[int, ir.sim.OpCosts] = {}
    for size in SIZES:
        source = transforms.training(models.mlp(*SIZES[size]), "sgd")
        inputs = ir.random_inputs(source, seed=0)
        for label, dp, tp, pp, m, schedule in STRATEGIES:
            g = transforms.megatron(source, dp, tp, pp, m, schedule)
            n = dp * tp * pp
            flat = transforms.unroll_pmap(g)
            tables[n] = profile_ops(flat, n, costs=tables.get(n), progress=False)
            step_inputs = ir.distribute(g, inputs, source=source)
            program, options = g, {}
            if args.ranked:
                program = lower_to_ranks(g)
                options = {"carry": carry_of(source)}
            measured = [
                torch_dist.measure(
                    program, step_inputs, steps=args.steps, warmup=args.warmup, **options
                )
                for _ in range(args.runs)
            ]
            topology, comm = calibration.topology(n), calibration.comm_mode(n)
            sim = ir.simulate(flat, topology, comm=comm)
            profiled = ir.simulate(flat, topology, comm=comm, costs=tables[n])
            simulated = {"model": sim.step_time_s, "profiled": profiled.step_time_s}
            row = Row(size, label, n, [x.step_time_s for x in measured], simulated)
            rows.append(row)
            times = " ".join(f"{x * 1e3:8.2f}" for x in row.measured_s)
            memory = ""
            if args.ranked:
                peak_m = max(measured[0].peak_memory_bytes.values()) / 2**20
                peak_s = max(sim.peak_memory_bytes.values()) / 2**20
                memory = f"  peak {peak_m:6.2f} / {peak_s:6.2f} MiB"
            print(
                f"{size:6} {label:18} {n} proc  measured {times} ms  "
                f"model {row.simulated_s['model'] * 1e3:8.2f} ms ({row.error('model'):+7.1%})  "
                f"profiled {row.simulated_s['profiled'] * 1e3:8.2f} ms "
                f"({row.error('profiled'):+7.1%}){memory}",
                flush=True,
            )
    print(f"\n{len(rows)} programs")
    for src in SOURCES:
        for run in range(args.runs):
            measured = [r.measured_s[run] for r in rows]
            errors = [abs(r.error(src, run)) for r in rows]
            rho = spearman(measured, [r.simulated_s[src] for r in rows])
            print(
                f"{src:8} run {run + 1}: MAPE {statistics.mean(errors):.1%}, median |error| "
                f"{statistics.median(errors):.1%}, Spearman {rho:.3f}"
            )
    for src in SOURCES:
        by_n = {
            n: statistics.mean(abs(r.error(src)) for r in rows if r.processes == n)
            for n in sorted({r.processes for r in rows})
        }
        shown = ", ".join(f"{n} process{'es' if n > 1 else ''} {e:.1%}" for n, e in by_n.items())
        print(f"{src:8} MAPE by process count (run 1; {os.cpu_count()} cores here): {shown}")
    if args.runs > 1:
        spreads = [r.spread for r in rows]
        print(f"spread between runs: median {statistics.median(spreads):.1%}, ", end="")
        print(f"max {max(spreads):.1%}")
    for src in SOURCES:
        print(f"\nfastest per size and process count, {src} (measured / simulated):")
        for size in SIZES:
            for n in sorted({r.processes for r in rows}):
                group = [r for r in rows if r.size == size and r.processes == n]
                if len(group) < 2:
                    continue
                fast_m = min(group, key=lambda r: r.measured_s[0])
                fast_s = min(group, key=lambda r: r.simulated_s[src])
                rho = spearman(
                    [r.measured_s[0] for r in group], [r.simulated_s[src] for r in group]
                )
                hit = "yes" if fast_m is fast_s else "no"
                print(
                    f"  {size:6} {n} proc: {fast_m.strategy} / {fast_s.strategy} "
                    f"(predicted: {hit}; Spearman {rho:.2f} over {len(group)})"
                )
    print(f"\nload average {os.getloadavg()[0]:.2f}; total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
