"""Full garbage collections on the click path: how often a click pays for one, and how long.

Drives a real dashboard (``workbench.Workbench``, no browser) on the built-in example (the
GPT training step with Adam on 8 simulated A100s, built with ``ir.models`` so any checkout
runs it) through ``--clicks`` fresh states: ready strategies and placements of ``tokens``
over different meshes, each new to the session (nothing served from a cache). Python's
collector is left as it is; ``gc.callbacks`` only record each collection's generation and
duration. Prints, per click, its time and any full (generation 2) collection in it, then
the tracked objects at the end and the count and durations of the full collections: the
pauses a user feels, and what sets their length (every tracked object is visited).

    python benchmarks/bench_gc_pauses.py [--clicks 30] [--checkout DIR]

``--checkout DIR`` runs another checkout's code (an earlier commit's ``git worktree``) on
the same clicks.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

if "--checkout" in sys.argv:  # another checkout's code, before anything is imported
    CHECKOUT = Path(sys.argv[sys.argv.index("--checkout") + 1]).resolve()
else:
    CHECKOUT = Path(__file__).resolve().parents[1]  # this checkout, installed or not
sys.path.insert(0, str(CHECKOUT))

import ir
from ir import models, transforms
from ir.sharding import Mesh, R, S
from workbench import Workbench

STRATEGIES = [
    dict(dp=dp, hp=hp, pp=pp, microbatches=m, schedule=s)
    for dp, hp, pp in ((8, 1, 1), (1, 8, 1), (4, 2, 1), (2, 4, 1), (2, 2, 2), (4, 1, 2), (1, 2, 4))
    for m, s in ((2, "1f1b"), (4, "1f1b"), (4, "gpipe"))
    if dp * m <= 16 and 16 % (dp * m) == 0
]
MESHES = [(8,), (2, 4), (4, 2), (1, 8), (8, 1), (2, 2, 2), (4,), (2,)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clicks", type=int, default=30)
    parser.add_argument("--checkout", type=Path, default=CHECKOUT, help="the code to run")
    args = parser.parse_args()
    f = transforms.training(models.gpt(16, 128, 512, 8, 4096, 4), "adam")
    wb = Workbench(f, ir.Topology.preset("a100-hgx", 8))
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def record(phase: str, info: dict) -> None:  # observes only: the collector is untouched
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(record)
    actions = []
    for k in range(max(len(STRATEGIES), len(MESHES))):
        if k < len(STRATEGIES):
            actions.append(("strategy", STRATEGIES[k]))
        if k < len(MESHES):
            actions.append(("placement", MESHES[k]))
    clicks, full = [], []
    for n, (kind, what) in enumerate(actions[: args.clicks]):
        pauses.clear()
        t0 = time.perf_counter()
        if kind == "strategy":
            ok = wb.set_strategy(**what)
        else:
            ok = wb.annotate("tokens", (Mesh(what), [S(0)] + [R] * (len(what) - 1)))
        dt = time.perf_counter() - t0
        mine = [p for g, p in pauses if g == 2]
        full += mine
        clicks.append(dt)
        note = "" if ok else f" (refused: {wb.session.error[:60]})"
        gcs = ", ".join(f"{1e3 * p:.0f} ms" for p in mine)
        print(f"{n:3d} {kind:9s} {dt * 1e3:6.0f} ms  full collections: [{gcs}]{note}")
    gc.callbacks.remove(record)
    tracked = len(gc.get_objects())
    print(
        f"\n{len(clicks)} fresh clicks: median {1e3 * statistics.median(clicks):.0f} ms; "
        f"{len(full)} full collections ({len(full) / len(clicks):.2f} a click), "
        f"{', '.join(f'{1e3 * p:.0f}' for p in full)} ms; {tracked} objects tracked at the end "
        f"({CHECKOUT}); "
        f"load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
