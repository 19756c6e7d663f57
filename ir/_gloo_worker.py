"""One rank of :func:`ir.calibrate`'s communication benchmark, run as a script.

    python ir/_gloo_worker.py PORT RANK SIZES_BYTES REPEATS TIMEOUT_S

It joins a two-process gloo group through the parent's TCPStore on
127.0.0.1:PORT (the parent's port, chosen by the OS; gloo's own connections stay on
loopback through the ``GLOO_SOCKET_IFNAME`` the parent puts in its environment,
``ir.loopback``), then times, for each size,
a ping-pong of ``send``/``recv`` (one-way time: half the round trip) and an
``all_reduce``. Rank 0 prints one JSON object to stdout:
``{"send": [[bytes, seconds], ...], "allreduce": [[bytes, seconds], ...]}``,
the fastest of ``REPEATS`` runs per size. Run by path, so it imports torch and
not the ``ir`` package. ``signal.alarm`` ends it after TIMEOUT_S even if its
parent is gone.
"""

from __future__ import annotations

import json
import signal
import sys
import time


def main(argv: list[str]) -> None:
    port, rank = int(argv[0]), int(argv[1])
    sizes = [int(s) for s in argv[2].split(",")]
    repeats, timeout_s = int(argv[3]), float(argv[4])
    signal.alarm(max(1, int(timeout_s)))  # never outlive the calibration

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    peer = 1 - rank
    send, allreduce = [], []
    try:
        for size in sizes:
            x = torch.zeros(max(1, size // 4), dtype=torch.float32)
            best = float("inf")
            for k in range(repeats + 1):  # the first round trip warms the connection up
                dist.barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(x, peer)
                    dist.recv(x, peer)
                else:
                    dist.recv(x, peer)
                    dist.send(x, peer)
                if k:
                    best = min(best, (time.perf_counter() - t0) / 2)
            send.append([x.numel() * 4, best])
            best = float("inf")
            for k in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                if k:
                    best = min(best, time.perf_counter() - t0)
            allreduce.append([x.numel() * 4, best])
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"send": send, "allreduce": allreduce}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
