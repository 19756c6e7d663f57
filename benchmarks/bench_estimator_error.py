"""The search's first tier against its second on strategies nobody fitted to: random
strategies of several models on several hardware presets, each estimated
(``ir.search.estimate.Estimator``) and built and simulated, and the estimator's errors
printed per preset: the step time's ratio and its error on what the estimate adds to the
busiest device's compute (``step_error``: what ``TIME_MARGIN`` must cover), and the peak
memory's (what ``MEMORY_MARGIN`` must cover), and the floors (``bound_s``,
``peak_floor_bytes``: never above the simulation) against it. Only an overestimate can
make the two-tier search skip a strategy it should have simulated; an underestimate
costs a simulation.

    python benchmarks/bench_estimator_error.py [--per-case N] [--seed S]

The margins are bounds measured here and in tests/search/test_estimate.py; nothing is
fitted to these strategies (the sample is drawn afresh from the seed)."""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
from tqdm.auto import tqdm

import ir
from ir import models, transforms
from ir.search import _tensor_problems
from ir.search.estimate import MEMORY_MARGIN, Estimator, step_error, time_margin
from ir.search.space import ModelFacts, divisors, prune, strategies

KNOBS = dict(
    schedules=("1f1b", "gpipe", "interleaved"),
    chunks=(1, 2, 4),
    zero=(0, 1, 2),
    sequence_parallel=(False, True),
    recompute=(False, True),
)


def cases() -> list[tuple[str, ir.Function, str, int, int]]:
    """(name, model, optimizer, batch, devices)."""
    return [
        ("mlp", models.mlp(256, 512, 512, 256, layers=8), "sgd", 256, 8),
        ("gpt-small", models.gpt(16, 64, 128, 8, 256, 4), "adam", 16, 8),
        (
            "gpt-1.3b-shape (8 layers, bf16)",
            models.gpt(32, 1024, 2048, 16, 51200, 8, dtype="bfloat16"),
            "adam",
            32,
            16,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-case", type=int, default=40, help="strategies per model and preset")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--presets", nargs="*", default=["a100-hgx", "h100-hgx", "a100-pcie", "v100-dgx1"]
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    found: dict[str, list[tuple]] = {}
    start = time.perf_counter()
    work = [(c, p) for c in cases() for p in args.presets]
    for (name, f, optimizer, batch, devices), preset in tqdm(work, desc="cases"):
        topology = ir.Topology.preset(preset, devices)
        t = transforms.training(f, optimizer)
        space = strategies(devices, batch, microbatches=divisors(batch), **KNOBS)
        # as ir.search.search prunes: what cannot run or repeats work is never estimated
        capacity = min(d.memory_bytes for d in topology.devices)
        pruned = prune(space, ModelFacts.of(t, batch), capacity, _tensor_problems(t, space))
        space = [s for s in space if s not in pruned]
        sample = rng.sample(space, min(args.per_case, len(space)))
        model = Estimator(t, topology, batch, sample)
        est = model.estimate(sample)
        for i, s in enumerate(sample):
            if not est.known[i]:
                continue
            try:
                r = ir.simulate(s.build(t, topology), topology)
            except ir.DistIRError:
                continue  # the transform refuses it (a real limit): nothing to compare
            peak = max(r.peak_memory_bytes.values())
            found.setdefault(preset, []).append(
                (
                    name,
                    str(s),
                    est.step_time_s[i] / r.step_time_s,
                    float(step_error(est.step_time_s[i], est.busy_s[i], r.step_time_s)),
                    est.peak_memory_bytes[i] / peak - 1,
                    model.bound_s(s) / r.step_time_s,
                    est.busy_s[i] / r.step_time_s,
                    float(step_error(est.step_time_s[i], model.bound_s(s), r.step_time_s)),
                    model.peak_floor_bytes(s) / peak,
                )
            )
    print(f"{sum(map(len, found.values()))} strategies estimated and simulated in "
          f"{time.perf_counter() - start:.0f} s (seed {args.seed})")  # fmt: skip
    for preset, rows in found.items():
        ratio = np.array([r[2] for r in rows])
        over_t = np.array([r[3] for r in rows])
        over_m = np.array([r[4] for r in rows])
        margin = time_margin(ir.Topology.preset(preset, 8))
        print(
            f"  {preset}: {len(rows)}; step estimate / simulation {ratio.min():.2f}-"
            f"{ratio.max():.2f} (median {np.median(ratio):.2f}); step error above the "
            f"compute at most {over_t.max():+.0%} (margin {margin:.0%}); peak "
            f"{over_m.min():+.1%}..{over_m.max():+.1%} (margin {MEMORY_MARGIN:.0%})"
        )
        bound = np.array([r[5] for r in rows])
        busy = np.array([r[6] for r in rows])
        print(
            f"    compute bound / simulated step at most {bound.max():.4f} (must stay <= 1; "
            f"median {np.median(bound):.2f}, the busiest device's compute alone "
            f"{np.median(busy):.2f})"
        )
        above = np.array([r[7] for r in rows])
        print(f"    step error above the floor at most {above.max():+.0%}")
        worst = max(rows, key=lambda r: r[7])
        print(f"    above the floor most over: {worst[0]} {worst[1]} ({worst[7]:+.0%})")
        worst = max(rows, key=lambda r: r[5])
        print(f"    bound closest: {worst[0]} {worst[1]} ({worst[5]:.4f})")
        least = np.array([r[8] for r in rows])
        print(
            f"    peak floor / simulated peak {least.min():.2f}-{least.max():.4f} (must stay "
            f"<= 1; median {np.median(least):.2f})"
        )
        worst = max(rows, key=lambda r: r[8])
        print(f"    peak floor closest: {worst[0]} {worst[1]} ({worst[8]:.4f})")
        worst = max(rows, key=lambda r: r[4])
        print(f"    peak most over: {worst[0]} {worst[1]} ({worst[4]:+.1%})")
        worst = max(rows, key=lambda r: r[3])
        print(f"    step most over: {worst[0]} {worst[1]} ({worst[3]:+.0%} above the compute)")


if __name__ == "__main__":
    main()
