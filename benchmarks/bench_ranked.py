"""Ranked lowering and ranked runs of transformed training steps: sizes and times.

    python benchmarks/bench_ranked.py [--steps 3] [--repeats 3]

For each program (an MLP and a GPT training step, data, tensor, pipeline and 3D
parallel), it prints the ranks and rank classes ``lower_to_ranks`` makes, the
lowering time, the numpy ``ir.sharding.run_ranked`` time, and the wall time of
``torch_dist.run_ranked`` (``--steps`` steps with the state carried, process start
and gloo set-up included) beside ``torch_dist.run`` of the global program for one
step. Each time is the median of ``--repeats`` runs; on a shared machine they are
noisy. Every run is checked equal to ``ir.execute`` before it is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ir
import ir.models
from ir import transforms
from ir.backends import torch_dist
from ir.backends.torch_ranked import carry_of
from ir.sharding import lower_to_ranks, run_ranked

F64 = ir.DType.float64


def _programs():
    mlp = ir.models.mlp(64, 128, 256, 16, layers=4, training=True, dtype=F64)
    # unfused attention: the program docs/sharding.md measured
    gpt = ir.models.gpt(4, 16, 64, 4, 128, 2, training=True, dtype=F64, attention="unfused")
    return [
        ("MLP DP 4", mlp, transforms.data_parallel(mlp, 4)),
        ("MLP TP 2", mlp, transforms.horizontal_parallel(mlp, 2)),
        ("MLP PP 2 1f1b m4", mlp, transforms.pipeline_parallel(mlp, 2, 4, "1f1b")),
        ("GPT dp2 tp2", gpt, transforms.megatron(gpt, 2, 2, 1)),
        ("GPT dp2 pp2 m2", gpt, transforms.megatron(gpt, 2, 1, 2, 2)),
        ("GPT tp2 pp2 m2", gpt, transforms.megatron(gpt, 1, 2, 2, 2)),
    ]


def _median_s(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _flat(values) -> list:
    out = []
    for v in values:
        out += _flat(v) if isinstance(v, tuple) else [v]
    return out


def _check(got, want, what: str) -> None:
    for g, w in zip(_flat(got), _flat(want), strict=True):
        if not np.allclose(g, w, rtol=1e-9, atol=1e-12):
            raise SystemExit(f"{what}: differs from ir.execute")


def _row(name: str, f: ir.Function, g: ir.Function, steps: int, repeats: int) -> str:
    u = transforms.unroll_pmap(g)
    lower_s, ranked = _median_s(lambda: lower_to_ranks(u), repeats)
    inputs = ir.distribute(g, ir.random_inputs(f, 0), source=f)
    want = ir.execute(u, inputs)
    numpy_s, got = _median_s(lambda: run_ranked(ranked, inputs), repeats)
    _check(got, want, f"{name} numpy ranked")
    _check(torch_dist.run_ranked(ranked, inputs), want, f"{name} torch ranked")
    carry = carry_of(f)
    torch_s, _ = _median_s(
        lambda: torch_dist.run_ranked(ranked, inputs, steps=steps, carry=carry), repeats
    )
    global_s, _ = _median_s(lambda: torch_dist.run(u, inputs), repeats)
    return (
        f"{name:<18} {len(ranked.ranks):>5} {ranked.num_unique:>7} {lower_s * 1e3:>8.1f} "
        f"{numpy_s * 1e3:>8.1f} {torch_s:>14.2f} {global_s:>14.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'program':<18} {'ranks':>5} {'classes':>7} {'lower ms':>8} {'numpy ms':>8} "
        f"{'torch ranked s':>14} {'torch global s':>14}"
    )
    for name, f, g in _programs():
        print(_row(name, f, g, args.steps, args.repeats))
    print(f"(torch ranked: {args.steps} steps in one launch; torch global: one step)")


if __name__ == "__main__":
    main()
