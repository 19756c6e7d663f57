"""Click -> propagate -> simulate -> redraw, timed in Python for a 24-layer GPT on 8 devices.

Drives a real :class:`workbench.Workbench` without a browser: a click on an
input node of the graph (what ``graph.js`` reports), then Apply in the sharding
editor. Prints the time of each phase; the target is under 300 ms in total.

Each repeat shards over a different 8-device mesh, so no result is served from
the session's cache. Two clocks: *wall* (what a user waits, on a busy machine
inflated by other processes) and *CPU* (the kernel process's own Python time;
graphviz runs in its own process meanwhile and is not counted there).

    python benchmarks/bench_click_to_redraw.py [--layers 24] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import ir
from ir import models
from workbench import Workbench

MESHES = ("8", "2x4", "4x2", "1x8", "8x1")  # all of the 8 devices, five different meshes


def reference_loop_ms() -> float:
    """A fixed pure-Python workload (best of 3): how fast this host runs Python right now.

    Shared machines drift by 1.5x within minutes; compare runs through this figure.
    """
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        table: dict[int, int] = {}
        for i in range(300_000):
            table[i % 1000] = table.get(i % 1000, 0) + i
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5, help="at most 5 (distinct meshes)")
    parser.add_argument("--training", action="store_true", help="a training step, not forward")
    args = parser.parse_args()

    f = models.gpt(
        batch=8,
        seq=128,
        hidden=512,
        heads=8,
        vocab=1024,
        layers=args.layers,
        training=args.training,
        attention="unfused",  # the program docs/click_to_redraw.md measured (its op counts)
    )
    topology = ir.Topology.preset("a100-hgx", 8)
    start = time.perf_counter()
    wb = Workbench(f, topology)
    print(f"GPT: {args.layers} layers, {f.num_ops()} ops, on {topology.name}")
    print(f"dashboard built in {time.perf_counter() - start:.2f} s (imports and first drawing)")

    tokens_id = next(i for i, v in enumerate(f.inputs) if v.name == "tokens")
    rows = []
    for k in range(args.repeats):
        # A new mesh each time, so that no state is served from the session's cache.
        shape = MESHES[k % len(MESHES)]
        wb.editor.mesh_shape.value = shape
        t0, c0 = time.perf_counter(), time.process_time()
        wb.graph.clicked = {"id": f"in-{tokens_id}", "n": k + 1}  # the click
        t1 = time.perf_counter()
        assert wb.editor.value_name == "tokens", wb.editor.value_name
        for i, dropdown in enumerate(wb.editor.placements.children):
            dropdown.value = "S(0)" if i == 0 else "R"
        wb.editor.apply_button.click()  # propagate, simulate, redraw every view
        t2, c2 = time.perf_counter(), time.process_time()
        assert wb.session.error is None, wb.session.error
        d = wb.session.current
        rows.append((t2 - t0, c2 - c0))
        views = ", ".join(f"{k} {1e3 * v:.0f}" for k, v in wb.redraw_s.items())
        print(
            f"mesh {shape:>3}: {d.function.num_ops()} ops; click {1e3 * (t1 - t0):5.1f} ms, "
            f"propagate {1e3 * d.derive_s:6.1f} ms, simulate {1e3 * d.simulate_s:6.1f} ms, "
            f"redraw {1e3 * wb.last_redraw_s:6.1f} ms ({views}), total {1e3 * (t2 - t0):6.1f} ms "
            f"wall, {1e3 * (c2 - c0):6.1f} ms CPU"
        )
        wb.session.undo()  # back to sequential, so the next apply is a fresh derivation
    wall = [1e3 * r[0] for r in rows]
    cpu = [1e3 * r[1] for r in rows]
    print(
        f"click -> propagate -> simulate -> redraw over {len(rows)} meshes (target 300 ms): "
        f"wall median {statistics.median(wall):.0f} ms (best {min(wall):.0f}), "
        f"CPU median {statistics.median(cpu):.0f} ms (best {min(cpu):.0f}); "
        f"load average {os.getloadavg()[0]:.2f}; reference loop {reference_loop_ms():.1f} ms"
    )


if __name__ == "__main__":
    main()
