"""Strategy search speed: the 35-strategy grid, GPT-3 at scale, and a space of 110,880.

    python benchmarks/bench_search.py [--repeat 3] [--workers 2] [--skip-gpt3]
                                      [--skip-space] [--gpt3-microbatches 64]
                                      [--gpt3-dp 16 256]

1. The 35 strategies of a 16-layer MLP (hidden 8192, batch 8192) on 16 A100s: every
   power-of-two dp x tp x pp, microbatches in {2, 8, 32} when pp > 1. Figures, best of
   ``--repeat`` passes (wall clock, and this process's CPU time, which other processes on
   a shared machine disturb less), all in the same run:

   * every strategy built by ``T.megatron`` and simulated in full (``ir.simulate``: rank
     classes walked once, pmap bodies scheduled once per device model), peak memory
     included;
   * the reference it is tested against: every op of every device walked
     (``symmetry=False``);
   * ``ir.search.search`` end to end over the same 35 (``strategies=``), simulating all
     of them (``simulate="all"``) and in two tiers (``simulate="front"``: estimated, the event
     simulation on those that can reach the front), with how many it simulated;
   * the same two searches on a ``ProcessPoolExecutor`` of ``--workers`` processes
     (started before the clock): each job a batch of strategies that share analyses,
     built with one set of shared plans (wall clock only: the workers' CPU time is not
     this process's).
2. A GPT-3 175B-shaped model (96 layers, hidden 12288, 96 heads, sequence 2048, vocab
   51200, bfloat16, Adam) at tp 8 x pp 8 and ``--gpt3-microbatches`` microbatches of
   one sequence, on 1,024 and 16,384 ``a100-hgx`` GPUs (dp 16 and 256): model, build,
   simulate and memory-curve seconds and the process's peak resident memory (each in a
   process of its own). Then its tasks step (``T.megatron(tasks=True)``) on 1,024 GPUs
   at 8, 64 and 128 microbatches, simulated with repeated tasks replayed
   (``ir.sim.tasks``: the steady state's microbatches not walked) beside every
   application walked, in the same process: CPU seconds, applications walked, and
   whether every figure is equal.
3. Every knob for the same GPT-3 on 1,024 GPUs (batch 1536): dp x tp x pp, every
   microbatch count dividing the batch, the three schedules, chunks 1-8, ZeRO 0-2,
   sequence parallelism and recomputation: 110,880 strategies. Figures (wall and CPU
   seconds): enumeration and pruning (of which the tensor degrees' analyses), the
   estimator's set-up (its analyses of the step, from the same shared analyses as the
   pruning, as ``ir.search.search`` makes them) and its rate over the space, and the
   strategies a two-tier search would then simulate first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import ir
from ir import models, transforms
from ir.search import _request, _simulate
from ir.search.space import SharedPlans


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


MLP = models.mlp(8192, 8192, 8192, 8192, layers=16)


def _best(repeat: int, run) -> tuple[float, float, object]:
    wall = cpu = float("inf")
    out = None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = run()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, out


def bench_grid(repeat: int, workers: int) -> None:
    t = transforms.training(MLP)
    topology = ir.Topology.preset("a100-hgx", 16)
    space = mlp_strategies()

    def simulate_each(symmetry: bool):
        def run():
            for dp, tp, pp, m in space:
                g = transforms.megatron(t, dp, tp, pp, m)
                _ = ir.simulate(g, topology, symmetry=symmetry).peak_memory_bytes

        return run

    grid = [ir.search.Strategy(dp, tp, pp, m) for dp, tp, pp, m in space]

    def searched(mode: str, executor=None):
        return lambda: ir.search.search(
            MLP,
            topology,
            optimizer="sgd",
            strategies=grid,
            simulate=mode,
            progress=False,
            executor=executor,
        )

    simulate_each(True)()  # warm-up: imports, the registry's and types' caches
    request = _request(MLP, topology, None, "sgd", *[None] * 11, chosen=grid)
    todo = [s for s in request.space if s not in request.pruned]

    def each_searched(shared: bool):
        def run():
            plans = SharedPlans() if shared else None
            return [_simulate(s, *request.args(), shared=plans) for s in todo]

        return run

    alone = _best(repeat, each_searched(False))
    together = _best(repeat, each_searched(True))
    same = all(
        (a.status, a.step_time_s, a.peak_memory_bytes, a.error, a.bubble, a.exposed_comm_s)
        == (b.status, b.step_time_s, b.peak_memory_bytes, b.error, b.bubble, b.exposed_comm_s)
        for a, b in zip(alone[2], together[2], strict=True)
    )
    print(f"the grid's {len(todo)} strategies built and simulated (best of {repeat}):")
    for label, (wall, cpu, _) in (("each plan alone", alone), ("plans shared", together)):
        print(
            f"  {label:<38}: {len(todo) / wall:6.1f} strategies/s ({wall:.2f} s; "
            f"CPU {cpu:.2f} s: {len(todo) / cpu:.1f}/s)"
        )
    print(f"  every row identical (status, step time, peak memory, error, bubble, exposed): {same}")
    rows = [
        ("each strategy simulated in full", *_best(repeat, simulate_each(True))),
        ("every op on every device (reference)", *_best(repeat, simulate_each(False))),
        ("search, simulate='all'", *_best(repeat, searched("all"))),
        ("search, two tiers ('front')", *_best(repeat, searched("front"))),
    ]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(abs, range(workers)))  # the workers started (and ir imported) first
        for mode in ("all", "front"):
            label = f"search, {mode!r}, {workers} processes"
            rows.append((label, *_best(repeat, searched(mode, pool))))
    print(f"35 strategies of a 16-layer MLP (hidden 8192) on 16 A100s (best of {repeat}):")
    for label, wall, cpu, out in rows:
        n = len(grid)
        extra = ""
        if isinstance(out, ir.search.SearchResult):
            simulated = sum(r.status in ("ok", "over capacity", "error") for r in out.rows)
            pruned = sum(r.status == "pruned" for r in out.rows)
            extra = f"; {simulated} simulated, {pruned} pruned"
        cpu_part = f"CPU {cpu:.2f} s: {n / cpu:.1f}/s"
        if "processes" in label:
            cpu_part = "the workers' CPU not counted"
        print(f"  {label:<38}: {n / wall:6.1f} strategies/s ({wall:.2f} s; {cpu_part}){extra}")


def gpt3(dp: int, microbatches: int, tasks: bool = False) -> dict[str, float]:
    import resource

    t0, cpu0 = time.perf_counter(), time.process_time()
    f = models.gpt(
        batch=dp * microbatches,
        seq=2048,
        hidden=12288,
        heads=96,
        vocab=51200,
        layers=96,
        dtype="bfloat16",
    )
    t = transforms.training(f, "adam")
    t1 = time.perf_counter()
    g = transforms.megatron(t, dp, 8, 8, microbatches, "1f1b", tasks=tasks)
    t2 = time.perf_counter()
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", dp * 64))
    t3 = time.perf_counter()
    peak = result.totals.max_peak_memory_bytes
    t4 = time.perf_counter()
    return {
        "model_s": t1 - t0,
        "build_s": t2 - t1,
        "simulate_s": t3 - t2,
        "memory_s": t4 - t3,
        "top_level_ops": len(g.ops),
        "step_s": result.step_time_s,
        "device_peak_gb": peak / 1e9,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "cpu_s": time.process_time() - cpu0,
    }


def bench_steady_state(microbatches: tuple[int, ...] = (8, 64, 128)) -> None:
    """GPT-3's tasks step simulated with its repeated tasks replayed (``ir.sim.tasks``)
    beside every application walked, in the same process: CPU seconds, applications
    walked, and whether every figure is equal."""
    from ir.sim.engine import Engine
    from ir.sim.result import SimResult

    dp = 16
    topology = ir.Topology.preset("a100-hgx", dp * 64)
    print(
        "GPT-3 175B shape, tp8 x pp8 x dp16 (1,024 GPUs), 1F1B tasks step: simulated with "
        "repeated tasks replayed, beside every application walked (best of 2, CPU s):"
    )
    for m in microbatches:
        f = models.gpt(dp * m, 2048, 12288, 96, 51200, 96, dtype="bfloat16")
        g = transforms.megatron(transforms.training(f, "adam"), dp, 8, 8, m, tasks=True)
        figures = {}
        for share in (False, True):
            best = float("inf")
            for _ in range(2):
                start = time.process_time()
                engine = Engine(topology, classes=g.rank_classes, share_tasks=share)
                engine.run(g)
                best = min(best, time.process_time() - start)
            result = SimResult(engine)
            figures[share] = (best, engine, result.step_time_s, result.totals)
        (walk_s, _, step_a, totals_a), (memo_s, engine, step_b, totals_b) = (
            figures[False],
            figures[True],
        )
        applications = engine.task_memo.hits + engine.task_memo.walked
        print(
            f"  {m:>4} microbatches: every application walked {walk_s:.2f} s, replayed "
            f"{memo_s:.2f} s ({engine.task_memo.walked} of {applications} task applications "
            f"walked); step {step_b:.4f} s; every figure equal: "
            f"{step_a == step_b and totals_a == totals_b}"
        )


def bench_space() -> None:
    from ir.search import _tensor_problems
    from ir.search.estimate import Estimator
    from ir.search.space import ModelFacts, divisors, prune, strategies

    batch = 1536
    f = models.gpt(batch, 2048, 12288, 96, 51200, 96, dtype="bfloat16")
    t = transforms.training(f, "adam")
    topology = ir.Topology.preset("a100-hgx", 1024)
    cpu = [time.process_time()]
    start = time.perf_counter()
    space = strategies(
        1024,
        batch,
        microbatches=divisors(batch),
        schedules=("1f1b", "gpipe", "interleaved"),
        chunks=(1, 2, 3, 4, 6, 8),
        zero=(0, 1, 2),
        sequence_parallel=(False, True),
        recompute=(False, True),
    )
    capacity = min(d.memory_bytes for d in topology.devices)
    # as ir.search.search prunes: tensor degrees that would repeat work (past 96 heads)
    # (and with the request's shared analyses, which the estimator and the builds reuse)
    shared = SharedPlans()
    tensor_cpu = time.process_time()
    problems = _tensor_problems(t, space, shared, batch)
    tensor_cpu = time.process_time() - tensor_cpu
    pruned = prune(space, ModelFacts.of(t, batch), capacity, problems)
    todo = [s for s in space if s not in pruned]
    t1 = time.perf_counter()
    cpu.append(time.process_time())
    est = Estimator(t, topology, batch, todo, shared)
    t2 = time.perf_counter()
    cpu.append(time.process_time())
    e = est.estimate(todo)
    t3 = time.perf_counter()
    cpu.append(time.process_time())
    est.estimate(todo)  # again: every distinct op, cut and shape known
    warm = time.process_time() - cpu[-1]
    c = [b - a for a, b in itertools.pairwise(cpu)]
    fits = e.known & (e.peak_memory_bytes <= capacity)
    order = sorted(range(len(todo)), key=lambda i: e.step_time_s[i] if fits[i] else float("inf"))
    print(f"GPT-3 175B on 1,024 A100s, every knob: {len(space)} strategies")
    print(
        f"  enumerated and pruned in {t1 - start:.1f} s (CPU {c[0]:.1f} s, of which the "
        f"tensor degrees {tensor_cpu:.1f} s; {len(pruned)} pruned by the state's bytes, the "
        f"batch and the heads); estimator set-up (its analyses of "
        f"the step) {t2 - t1:.1f} s (CPU {c[1]:.1f} s); {len(todo)} estimated in "
        f"{t3 - t2:.2f} s (CPU {c[2]:.2f} s; each distinct op, stage cut and shape costed "
        f"once); again {warm:.2f} s CPU ({len(todo) / warm:,.0f} strategies/s); the "
        f"{len(space)} ranked in {t3 - start:.1f} s (CPU {sum(c):.1f} s)"
    )
    print(
        f"  {int(e.known.sum())} estimable, {len(e.refused)} refused by the stage cut, "
        f"{int(fits.sum())} estimated to fit; fastest:"
    )
    for i in order[:3]:
        print(
            f"    {todo[i]}: {e.step_time_s[i]:.2f} s, "
            f"{e.peak_memory_bytes[i] / 2**30:.1f} GiB (estimated)"
        )


def bench_full_search(mode: str = "front", workers: int = 0) -> None:
    """The same every-knob space searched end to end (``ir.search.search``, two tiers):
    pruned, estimated, and the strategies that can reach the front (``mode="fastest"``:
    that could be the fastest that fits) built and simulated (``workers``: on a process
    pool of that many, started before the clock; 0: in this process)."""
    from ir.search.space import divisors

    batch = 1536
    f = models.gpt(batch, 2048, 12288, 96, 51200, 96, dtype="bfloat16")
    topology = ir.Topology.preset("a100-hgx", 1024)
    first: list[float] = []
    start, start_cpu = time.perf_counter(), time.process_time()

    def seen(row: ir.search.Row) -> None:
        if row.status not in ("ok", "over capacity"):
            return  # pruned, estimated, refused by the stage cut (error): nothing simulated
        first.append(time.perf_counter() - start)
        print(
            f"    {first[-1]:6.1f} s (CPU {time.process_time() - start_cpu:.1f} s): {row.strategy}"
            f" {row.status}, {row.step_time_s:.2f} s (estimated {row.estimated_step_time_s:.2f}"
            f" s), {row.peak_memory_bytes / 2**30:.1f} GiB (estimated "
            f"{row.estimated_peak_memory_bytes / 2**30:.1f})",
            flush=True,
        )

    pool = ProcessPoolExecutor(workers) if workers else None
    if pool is not None:
        list(pool.map(abs, range(workers)))  # the workers started (and ir imported) first
        start, start_cpu = time.perf_counter(), time.process_time()
    result = ir.search.search(
        f,
        topology,
        executor=pool,
        microbatches=divisors(batch),
        schedules=("1f1b", "gpipe", "interleaved"),
        chunks=(1, 2, 3, 4, 6, 8),
        zero=(0, 1, 2),
        sequence_parallel=(False, True),
        recompute=(False, True),
        progress=False,
        on_row=seen,
        simulate=mode,
    )
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if pool is not None:
        pool.shutdown()
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    simulated = sum(counts.get(k, 0) for k in ("ok", "over capacity"))
    cpu_note = ", this process's: the workers' not counted" if workers else ""
    print(
        f"GPT-3 175B on 1,024 A100s, every knob, searched end to end (simulate={mode!r}"
        f"{f', {workers} processes' if workers else ''}): "
        f"{len(result.rows)} strategies in {wall:.1f} s (CPU {cpu:.1f} s{cpu_note}); first "
        f"simulated row after {first[0] if first else float('nan'):.1f} s; {simulated} built and "
        f"simulated; {counts}"
    )
    if result.simulated():
        best = result.best()
        print(
            f"  best: {best.strategy}: {best.step_time_s:.2f} s simulated "
            f"(estimated {best.estimated_step_time_s:.2f} s), "
            f"{best.peak_memory_bytes / 2**30:.1f} GiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="passes; the best is shown")
    parser.add_argument("--gpt3-microbatches", type=int, default=64)
    parser.add_argument("--gpt3-dp", type=int, nargs="*", default=[16, 256])
    parser.add_argument(
        "--workers", type=int, default=2, help="processes of the grid's executor searches"
    )
    parser.add_argument("--skip-gpt3", action="store_true")
    parser.add_argument("--skip-space", action="store_true")
    parser.add_argument(
        "--full-search", action="store_true", help="also search the every-knob space end to end"
    )
    parser.add_argument(
        "--full-search-mode",
        choices=("front", "fastest"),
        default="front",
        help="the every-knob search's simulate= (front: the Pareto front; fastest: the best)",
    )
    parser.add_argument(
        "--full-search-workers",
        type=int,
        default=0,
        help="run the every-knob search on a process pool of this many (0: in this process)",
    )
    parser.add_argument("--only-full-search", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gpt3-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gpt3-tasks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gpt3_one is not None:
        print(json.dumps(gpt3(args.gpt3_one, args.gpt3_microbatches, args.gpt3_tasks)))
        return
    if args.only_full_search:
        bench_full_search(args.full_search_mode, args.full_search_workers)
        return
    bench_grid(args.repeat, args.workers)
    if not args.skip_gpt3:
        m = args.gpt3_microbatches
        print(
            f"GPT-3 175B shape, tp8 x pp8, {m} microbatches of 1 (a process each; 'tasks': "
            "each repeated task one Task op, T.megatron(tasks=True), as the search builds):"
        )
        for dp, tasks in itertools.product(args.gpt3_dp, (False, True)):
            extra = ["--gpt3-tasks"] if tasks else []
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--gpt3-one",
                    str(dp),
                    "--gpt3-microbatches",
                    str(m),
                    *extra,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            total = r["model_s"] + r["build_s"] + r["simulate_s"] + r["memory_s"]
            print(
                f"  {dp * 64:>6} GPUs{' tasks' if tasks else ''}: model {r['model_s']:.1f} + "
                f"build {r['build_s']:.1f} + "
                f"simulate {r['simulate_s']:.1f} + memory {r['memory_s']:.1f} = {total:.1f} s "
                f"(CPU {r['cpu_s']:.1f} s); "
                f"{r['top_level_ops']} ops; step {r['step_s']:.2f} s, device peak "
                f"{r['device_peak_gb']:.1f} GB; process peak {r['rss_gib']:.2f} GiB"
            )
    if not args.skip_gpt3:
        bench_steady_state()
    if not args.skip_space:
        bench_space()
    if args.full_search:
        bench_full_search(args.full_search_mode, args.full_search_workers)


if __name__ == "__main__":
    main()
