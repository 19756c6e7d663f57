"""Strategy search speed: strategies per second end to end, and one strategy at GPT-3 scale.

    python benchmarks/bench_search.py [--repeat 3] [--gpt3-microbatches 8] [--skip-gpt3]

1. The 35 strategies of a 16-layer MLP (hidden 8192, batch 8192) on 16 A100s: every
   power-of-two dp x tp x pp, microbatches in {2, 8, 32} when pp > 1, each built by
   ``T.megatron`` and simulated. Figures: strategies per second with rank classes
   (each pmap body walked once per class: the default) and without (every device
   walked: the program-per-device baseline), measured in the same run, each the best of
   ``--repeat`` passes over the 35 (wall clock, and the CPU time of this process, which
   other processes on a shared machine disturb less).
2. A GPT-3 175B-shaped model (96 layers, hidden 12288, 96 heads, sequence 2048,
   vocab 51200, bfloat16, Adam) on 1,024 GPUs of the ``a100-hgx`` preset at
   dp x tp x pp = 16 x 8 x 8, microbatch size 1: build and simulate time, and the
   peak memory Python allocated for it (tracemalloc, in a second run: tracing slows it).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import ir
from ir import models, transforms


def mlp_strategies() -> list[tuple[int, int, int, int]]:
    out = []
    for dp in (1, 2, 4, 8, 16):
        for tp in (1, 2, 4, 8, 16):
            if 16 % (dp * tp):
                continue
            pp = 16 // (dp * tp)
            for m in (2, 8, 32) if pp > 1 else (1,):
                out.append((dp, tp, pp, m))
    return out


def bench_mlp(symmetry: bool, repeat: int = 1) -> tuple[float, float, float]:
    """(strategies per second, wall seconds, CPU seconds) for the 35 MLP strategies: the
    best of ``repeat`` passes."""
    t = transforms.training(models.mlp(8192, 8192, 8192, 8192, layers=16))
    topology = ir.Topology.preset("a100-hgx", 16)
    space = mlp_strategies()
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        for dp, tp, pp, m in space:
            g = transforms.megatron(t, dp, tp, pp, m)
            result = ir.simulate(g, topology, symmetry=symmetry)
            _ = result.peak_memory_bytes
        best_wall = min(best_wall, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    return len(space) / best_wall, best_wall, best_cpu


def bench_gpt3(microbatches: int, traced: bool = False) -> dict[str, float]:
    """Times (without tracing), or with ``traced`` the Python peak (tracing slows it)."""
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    f = models.gpt(
        batch=16 * microbatches,
        seq=2048,
        hidden=12288,
        heads=96,
        vocab=51200,
        layers=96,
        dtype="bfloat16",
        attention="unfused",  # the program docs/search.md measured (its op counts)
    )
    t = transforms.training(f, "adam")
    t1 = time.perf_counter()
    g = transforms.megatron(t, 16, 8, 8, microbatches, "1f1b")
    t2 = time.perf_counter()
    topology = ir.Topology.preset("a100-hgx", 1024)
    result = ir.simulate(g, topology)
    peak = max(result.peak_memory_bytes.values())
    t3 = time.perf_counter()
    traced_peak = 0.0
    if traced:
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {
        "model_s": t1 - t0,
        "build_s": t2 - t1,
        "simulate_s": t3 - t2,
        "logical_ops": g.num_ops(),
        "walked_ops": result.walked_ops,
        "represented_ops": result.num_ops,
        "step_s": result.step_time_s,
        "device_peak_gb": peak / 1e9,
        "python_peak_gib": traced_peak / 2**30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="passes; the best is shown")
    parser.add_argument("--gpt3-microbatches", type=int, default=8)
    parser.add_argument("--skip-gpt3", action="store_true")
    args = parser.parse_args()

    bench_mlp(symmetry=True)  # warm-up: imports, the registry's and types' caches
    base_rate, base_seconds, base_cpu = bench_mlp(symmetry=False, repeat=args.repeat)
    rate, seconds, cpu = bench_mlp(symmetry=True, repeat=args.repeat)
    print(
        "35 strategies of a 16-layer MLP (hidden 8192) on 16 A100s, build + simulate "
        f"(best of {args.repeat}):"
    )
    print(
        f"  rank classes walked once : {rate:6.2f} strategies/s ({seconds:.2f} s; "
        f"CPU {cpu:.2f} s: {35 / cpu:.1f}/s)"
    )
    print(
        f"  every device walked      : {base_rate:6.2f} strategies/s ({base_seconds:.2f} s; "
        f"CPU {base_cpu:.2f} s: {35 / base_cpu:.1f}/s)"
    )
    if args.skip_gpt3:
        return
    m = args.gpt3_microbatches
    r = bench_gpt3(m)
    r["python_peak_gib"] = bench_gpt3(m, traced=True)["python_peak_gib"]
    print(f"GPT-3 175B shape on 1024 A100s, dp16 x tp8 x pp8, {m} microbatches of 1:")
    print(
        f"  build {r['build_s']:.1f} s + simulate {r['simulate_s']:.1f} s "
        f"= {r['build_s'] + r['simulate_s']:.1f} s (model {r['model_s']:.1f} s)"
    )
    print(
        f"  {r['logical_ops']} logical ops, {r['walked_ops']} walked, standing for "
        f"{r['represented_ops']} per-device op runs"
    )
    print(
        f"  predicted step {r['step_s']:.2f} s, device peak {r['device_peak_gb']:.1f} GB; "
        f"Python peak {r['python_peak_gib']:.2f} GiB"
    )


if __name__ == "__main__":
    main()
