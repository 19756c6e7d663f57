"""What a gloo all-reduce between two local processes costs, peers waiting or computing.

    python benchmarks/bench_gloo_wakeup.py [--repeats 60]

Two processes (one thread of torch each, as the ranked backend runs them) all-reduce a
float32 tensor of 1 KB to 4 MB, ``--repeats`` times per size and mode, after a barrier:

* ``idle``: each rank posts the all-reduce and waits for it (a tensor-parallel
  all-reduce: nothing else to do);
* ``busy``: each rank posts it asynchronously and computes (small matrix products)
  until it completes (a data-parallel all-reduce overlapping the backward pass).

Prints rank 0's median and mean time from posting to completion. On a machine whose
cores are all taken by the ranks' computing, ``busy`` pays for waking gloo's thread:
it waits for a running task's scheduler slice (docs/accuracy.md, "Where the rest of
the error comes from").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

SIZES_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)


def _rank(rank: int, world: tuple[int, int], repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    from ir.loopback import join_world

    torch.set_num_threads(1)
    join_world(world, rank, 2)  # on loopback only, as the backends join theirs
    a = torch.ones(64, 64)
    rows = []
    for size in SIZES_BYTES:
        x = torch.ones(size // 4)
        for mode in ("idle", "busy"):
            times = []
            for _ in range(repeats + 5):  # the first five warm the connection up
                dist.barrier()
                t0 = time.perf_counter()
                work = dist.all_reduce(x, async_op=True)
                if mode == "busy":
                    while not work.is_completed():
                        a @ a
                work.wait()
                times.append(time.perf_counter() - t0)
            rows.append((size, mode, times[5:]))
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def main() -> None:
    from ir.loopback import Rendezvous

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with Rendezvous(2, 600) as world:
        procs = [
            ctx.Process(target=_rank, args=(r, world.address, args.repeats, out)) for r in (0, 1)
        ]
        for p in procs:
            p.start()
        world.serve()
        rows = out.get(timeout=600)
        for p in procs:
            p.join()
    print(f"{'bytes':>9} {'mode':5} {'median us':>10} {'mean us':>9} {'p90 us':>8}")
    for size, mode, times in rows:
        p90 = sorted(times)[int(0.9 * len(times))]
        print(
            f"{size:9d} {mode:5} {statistics.median(times) * 1e6:10.0f} "
            f"{statistics.mean(times) * 1e6:9.0f} {p90 * 1e6:8.0f}"
        )


if __name__ == "__main__":
    main()
