"""Simulator speed: simulated ops per second at 1k, 10k and 100k ops, and its own peak memory.

    python benchmarks/bench_simulator.py [--repeats 3]

The programs are ladders over 8 devices: each device runs a chain of
MatMul + Relu layers on its own activations, and every few layers the 8
devices all-reduce (as data parallelism does with gradients). Timing covers
``ir.simulate`` alone (building the program is not timed); the best of
``--repeats`` runs is reported with the worst (the machine is shared), and
ops per CPU-second (process time), which other processes disturb less.
Peak memory is measured in a separate run under ``tracemalloc`` (which slows it).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import ir
from ir import FunctionBuilder, TensorType

DEVICES = 8
ALLREDUCE_EVERY = 4  # layers between all-reduces


def ladder(num_ops: int, width: int = 256) -> ir.Function:
    """About ``num_ops`` ops: per layer, MatMul and Relu on each device; an AllReduce
    (with its MakeTuple and TupleGets) every ``ALLREDUCE_EVERY`` layers."""
    b = FunctionBuilder(f"ladder_{num_ops}")
    ws = [b.input(f"w{d}", TensorType((width, width), device=d)) for d in range(DEVICES)]
    hs = [b.input(f"x{d}", TensorType((64, width), device=d)) for d in range(DEVICES)]
    layer = 0
    while b.ops.__len__() < num_ops:
        hs = [b.call("Relu", b.call("MatMul", h, w)) for h, w in zip(hs, ws)]
        layer += 1
        if layer % ALLREDUCE_EVERY == 0:
            summed = b.call("AllReduce", b.call("MakeTuple", *hs))
            hs = [b.call("TupleGet", summed, index=d) for d in range(DEVICES)]
    return b.finish(hs)


def _ops(f: ir.Function) -> int:
    return f.num_ops()


def bench(num_ops: int, repeats: int) -> dict[str, float]:
    f = ladder(num_ops)
    topology = ir.Topology.preset("a100-hgx", DEVICES)
    times, cpu_times = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = ir.simulate(f, topology)
        cpu_times.append(time.process_time() - c0)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _ = result.peak_memory_bytes  # the memory curves (numpy), computed on first use
    memory_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _ = result.events  # Event objects, built on first use
    events_s = time.perf_counter() - t0
    tracemalloc.start()
    _ = ir.simulate(f, topology).peak_memory_bytes
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ops = _ops(f)
    best = min(times)
    return {
        "ops": ops,
        "best_s": best,
        "worst_s": max(times),
        "ops_per_s": ops / best,
        "ops_per_s_worst": ops / max(times),
        "ops_per_cpu_s": ops / min(cpu_times),
        "memory_curves_s": memory_s,
        "events_s": events_s,
        "peak_mib": peak / 2**20,
        "step_time_s": result.step_time_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    rows = [bench(n, args.repeats) for n in args.sizes]
    print(
        f"{'ops':>8} {'simulate s':>11} {'ops/s (best)':>13} {'ops/s (worst)':>14} "
        f"{'ops/CPU-s':>10} {'+memory s':>10} {'+events s':>10} {'peak MiB':>9}"
    )
    for r in rows:
        print(
            f"{r['ops']:>8} {r['best_s']:>11.4f} {r['ops_per_s']:>13,.0f} "
            f"{r['ops_per_s_worst']:>14,.0f} {r['ops_per_cpu_s']:>10,.0f} "
            f"{r['memory_curves_s']:>10.4f} "
            f"{r['events_s']:>10.4f} {r['peak_mib']:>9.1f}"
        )
    per_op = [r["best_s"] / r["ops"] for r in rows]
    growth = per_op[-1] / per_op[0]
    print(f"time per op, largest vs smallest program: x{growth:.2f} (1.0 = linear)")
    if growth > 2.0:
        print("WARNING: cost grows faster than linearly")


if __name__ == "__main__":
    main()
