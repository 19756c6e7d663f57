"""The simulator against one GPU (docs/accuracy.md, "On a GPU").

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/bench_accuracy_gpu.py
        [--steps 5] [--warmup 3] [--preset NAME] [--budget-s 200] [--out FILE]
        [--device cpu --quick]

Each program runs on one rank: GPT training steps (``ir.models.gpt`` +
``ir.transforms.training(f, "adam")``) in float16 and bfloat16 over four sizes, and
the one-device MLP training steps of ``benchmarks/bench_accuracy.py`` (float32, SGD).
Each is lowered to its rank (``ir.sharding.lower_to_ranks``) and measured with
``ir.backends.torch_dist.measure(..., device="cuda")``: one process on the GPU, the
weights and Adam state carried from step to step, every op timed from a synchronised
GPU to its kernels' end (the median of ``--steps`` steps after ``--warmup``). Each is
simulated with ``ir.simulate`` on ``ir.hardware.preset(NAME, 1)``, NAME from the GPU's
name (H100 -> ``h100-hgx``, H200 -> ``h200-hgx``; ``--preset`` overrides). Nothing is
fitted to the measurements.

Prints per program the measured and simulated step times and the error
``(simulated - measured) / measured``, the FLOP/s the measured time implies, the peak
memory (measured live bytes / simulated, and the allocator's peak on CUDA), then the
MAPE and Spearman rank correlation over all programs, and for the largest program the
time per op type (measured and simulated microseconds, summed over its ops) and the
matrix efficiency the measurement implies: the simulated MatMul/MatMulGrad time (at
100% of the preset's peak) over the measured one. Everything printed is also written to
``--out`` (default ``$OUT/accuracy_gpu.txt`` when ``OUT`` is set), after each program,
so a run cut short keeps what it measured. Programs run smallest first; one that fails
is reported and skipped, and none starts after ``--budget-s`` seconds.

``--device cpu --quick`` runs tiny versions of the programs on the CPU against the
``cpu`` preset: a check of this script where there is no GPU, not a measurement.

Imports only ``ir``, numpy and torch (no widgets): it runs on a bare GPU image.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
from bench_accuracy import SIZES, spearman

import ir
import ir.hardware
from ir import models, transforms
from ir.backends import torch_dist
from ir.backends.torch_ranked import carry_of
from ir.execute import input_value_ranges
from ir.registry import ops_cost
from ir.sharding import lower_to_ranks

MATMULS = ("MatMul", "MatMulGrad")


@dataclass(frozen=True)
class Gpt:
    """One GPT training step's sizes: ``ir.models.gpt(batch, seq, hidden, heads, vocab,
    layers)``."""

    batch: int
    seq: int
    hidden: int
    heads: int
    vocab: int
    layers: int

    def label(self, dtype: str) -> str:
        return f"gpt h{self.hidden} l{self.layers} s{self.seq} b{self.batch} {dtype}"

    def source(self, dtype: str) -> ir.Function:
        # unfused attention: the program docs/accuracy.md's measured rows ran
        f = models.gpt(
            self.batch,
            self.seq,
            self.hidden,
            self.heads,
            self.vocab,
            self.layers,
            dtype=dtype,
            attention="unfused",
        )
        return transforms.training(f, "adam")


# 4 sizes x 2 dtypes, smallest first; the largest is 24 TFLOP a step (50-70 ms on an H100)
GPTS = [
    Gpt(8, 512, 512, 8, 8192, 4),
    Gpt(8, 1024, 1024, 16, 16384, 2),
    Gpt(4, 2048, 2048, 16, 16384, 2),
    Gpt(8, 1024, 4096, 32, 16384, 2),
]
QUICK_GPTS = [Gpt(2, 32, 32, 2, 64, 2), Gpt(2, 64, 64, 4, 128, 2)]
DTYPES = ("float16", "bfloat16")


class Report:
    """Prints each line at once and keeps them, to write to ``path`` (if any) as it goes."""

    def __init__(self, path: str | None) -> None:
        self.path, self.lines = path, []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "w") as out:
                out.write("\n".join(self.lines) + "\n")


def gpu_name() -> str:
    """The name of GPU 0, asked in a forked child: CUDA initialised in this process would
    stop the measured ranks (forked from it) from using the GPU."""
    with mp.get_context("fork").Pool(1) as pool:
        return pool.apply(_device_name)


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def preset_for(name: str) -> str:
    """``h100-hgx`` or ``h200-hgx`` from a CUDA device name."""
    upper = name.upper()
    for key, preset in (("H200", "h200-hgx"), ("H100", "h100-hgx")):
        if key in upper:
            return preset
    raise SystemExit(
        f"no preset for GPU {name!r}: pass --preset (one of {ir.hardware.preset_names()})"
    )


def fast_inputs(f: ir.Function, seed: int = 0) -> list:
    """Inputs like ``ir.random_inputs(f)`` (standard normal floats, Adam's second moment
    non-negative, token ids and labels below the vocabulary) in a fraction of its time: a
    float input repeats one block of 2**20 standard normal values (drawing and converting
    a GPT's hundreds of millions of weights and moments took a minute here; the kernels'
    times do not depend on the values' order)."""
    rng = np.random.default_rng(seed)
    ranges = input_value_ranges(f)
    block = rng.standard_normal(2**20, dtype=np.float32)
    blocks: dict = {}
    out = []
    for i, v in enumerate(f.inputs):
        t, (lo, hi) = v.type, ranges.get(i, (None, None))
        if t.dtype.is_float and hi is None:
            positive = lo is not None and lo >= 0
            key = (t.dtype, positive)
            if key not in blocks:
                blocks[key] = (np.abs(block) if positive else block).astype(t.dtype.numpy)
            out.append(np.resize(blocks[key], t.shape))
        else:
            low = 0 if lo is None else int(lo)
            high = max(low + 1, 4 if hi is None else int(hi))
            out.append(rng.integers(low, high, t.shape).astype(t.dtype.numpy))
    return out


@dataclass(frozen=True)
class Row:
    label: str
    measured_s: float
    simulated_s: float
    flops: float
    peak_measured_bytes: float
    peak_simulated_bytes: float
    allocated_peak_bytes: float  # torch.cuda.max_memory_allocated (0 on the CPU)

    @property
    def error(self) -> float:
        return (self.simulated_s - self.measured_s) / self.measured_s


def per_op_type(events) -> dict[str, float]:
    """Seconds per op type, summed over ``events``."""
    total: dict[str, float] = defaultdict(float)
    for e in events:
        total[e.op.op_type] += e.end_s - e.start_s
    return dict(total)


def run_one(label, source, inputs_of, topology, args, report) -> tuple[Row, object, object]:
    g = transforms.megatron(source, 1, 1, 1, 1)
    started = time.perf_counter()
    inputs = ir.distribute(g, inputs_of(source), source=source)
    made = time.perf_counter() - started
    m = torch_dist.measure(
        lower_to_ranks(g),
        inputs,
        steps=args.steps,
        warmup=args.warmup,
        carry=carry_of(source),
        device=args.device,
        timeout_s=300.0,
    )
    sim = ir.simulate(transforms.unroll_pmap(g), topology)
    flops = ops_cost(source.ops).flops
    row = Row(
        label,
        m.step_time_s,
        sim.step_time_s,
        flops,
        max(m.peak_memory_bytes.values()),
        max(sim.peak_memory_bytes.values()),
        max(m.allocated_peak_bytes.values(), default=0.0),
    )
    report(
        f"{label:34} measured {row.measured_s * 1e3:9.3f} ms  simulated "
        f"{row.simulated_s * 1e3:9.3f} ms  error {row.error:+7.1%}  "
        f"{flops / 1e9:8.1f} GFLOP -> {flops / row.measured_s / 1e12:6.2f} TFLOP/s  "
        f"peak {row.peak_measured_bytes / 1e9:7.3f} / {row.peak_simulated_bytes / 1e9:7.3f} GB "
        f"(allocator {row.allocated_peak_bytes / 1e9:.3f})  "
        f"(inputs {made:.1f} s, all {time.perf_counter() - started:.1f} s)"
    )
    return row, m, sim


def breakdown(row: Row, m, sim, report) -> None:
    """Per op type, measured vs simulated, and the matrix efficiency (module doc)."""
    measured, simulated = per_op_type(m.events), per_op_type(sim.events)
    report(f"\nper op type, {row.label} (microseconds summed over its ops, one step):")
    report(f"  {'op type':16} {'measured':>12} {'simulated':>12} {'sim/meas':>9}")
    for t in sorted(measured, key=measured.get, reverse=True):
        s = simulated.get(t, 0.0)
        ratio = s / measured[t] if measured[t] else float("nan")
        report(f"  {t:16} {measured[t] * 1e6:12.1f} {s * 1e6:12.1f} {ratio:9.2f}")
    mm_measured = sum(measured.get(t, 0.0) for t in MATMULS)
    mm_simulated = sum(simulated.get(t, 0.0) for t in MATMULS)
    if mm_measured > 0:
        report(
            f"matrix efficiency (simulated MatMul+MatMulGrad at peak / measured): "
            f"{mm_simulated / mm_measured:.1%} ({mm_simulated * 1e3:.2f} / "
            f"{mm_measured * 1e3:.2f} ms)"
        )


def programs(args) -> list[tuple[str, ir.Function, object]]:
    """(label, sequential training program, its inputs' maker), smallest first."""
    out = []
    for size in SIZES:
        batch, features, hidden, classes, layers = SIZES[size]
        if args.quick:
            batch, features, hidden = 8, 8, 16
        f = transforms.training(models.mlp(batch, features, hidden, classes, layers), "sgd")
        out.append((f"mlp {size} float32 sgd", f, lambda s: ir.random_inputs(s, seed=0)))
    for gpt in QUICK_GPTS if args.quick else GPTS:
        for dtype in DTYPES:
            out.append((gpt.label(dtype), gpt.source(dtype), fast_inputs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--preset", help="hardware preset (default: from the GPU's name)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no program after")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny programs (script check)")
    out = os.path.join(os.environ["OUT"], "accuracy_gpu.txt") if os.environ.get("OUT") else None
    parser.add_argument("--out", default=out, help="also write the output here")
    args = parser.parse_args()
    report = Report(args.out)
    started = time.perf_counter()
    if args.device == "cuda":
        name = gpu_name()
        preset = args.preset or preset_for(name)
    else:
        name, preset = "cpu", args.preset or "cpu"
    import torch

    report(f"device {name}; preset {preset}; torch {torch.__version__} (CUDA {torch.version.cuda})")
    report(f"steps {args.steps} after {args.warmup} warm-up; python {sys.version.split()[0]}")
    topology = ir.hardware.preset(preset, 1)
    rows, largest = [], None
    for label, source, inputs_of in programs(args):
        if time.perf_counter() - started > args.budget_s:
            report(f"{label:34} skipped: past --budget-s {args.budget_s:.0f} s")
            continue
        try:
            row, m, sim = run_one(label, source, inputs_of, topology, args, report)
        except Exception as e:  # one program failing (out of memory, say) ends no others
            said = " | ".join(str(e).splitlines()[:3])[:500]
            report(f"{label:34} FAILED: {type(e).__name__}: {said}")
            for line in (getattr(e, "worker_traceback", None) or "").splitlines()[-6:]:
                report(f"    {line}")
            report.save()
            continue
        rows.append(row)
        if largest is None or row.flops > largest[0].flops:
            largest = (row, replace(m, outputs=()), sim)  # its events, not its weights
        report.save()
    if len(rows) >= 2:
        measured = [r.measured_s for r in rows]
        errors = [abs(r.error) for r in rows]
        rho = spearman(measured, [r.simulated_s for r in rows])
        report(
            f"\n{len(rows)} programs; MAPE {statistics.mean(errors):.1%}, median |error| "
            f"{statistics.median(errors):.1%}, Spearman {rho:.3f}"
        )
        for group in ("mlp", "float16", "bfloat16"):
            mine = [r for r in rows if group in (r.label.split()[0], r.label.split()[-1])]
            if mine:
                mape = statistics.mean(abs(r.error) for r in mine)
                report(f"  {group:9} {len(mine):2} programs: MAPE {mape:.1%}")
    if largest is not None:
        breakdown(*largest, report)
    report(f"\ntotal {time.perf_counter() - started:.0f} s")
    report.save()


if __name__ == "__main__":
    main()
