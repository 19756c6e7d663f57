"""Idle time of pipeline-parallel training steps on a realistic preset, against (p-1)/(m+p-1).

    python benchmarks/pipeline_bubbles.py [--comm channels|serial] [--not-resident]

The model is ``ir.models.mlp`` with ``2 p`` layers of width 1024 and a batch of
``64 m`` rows (64 rows per microbatch), trained with SGD, pipelined with
``pipeline_parallel`` and simulated on ``Topology.preset("a100-hgx", 8)``. For
each case it prints the step time, the mean over stages of
``SimResult.idle_fraction`` (neither compute nor communication running) and of
the compute stream's idle fraction, and the closed form ``(p-1)/(m+p-1)``. The
whole step is measured (loss, optimizer and transfers included), so the figures
sit a little above the closed form. The figures in docs/simulator.md come from
this script.
"""

from __future__ import annotations

import argparse

import ir
import ir.models
from ir.transforms import pipeline_parallel

CASES = (("gpipe", 4, 32), ("gpipe", 8, 32), ("1f1b", 8, 32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comm", choices=("channels", "serial"), default=None)
    parser.add_argument("--not-resident", action="store_true")
    args = parser.parse_args()
    simulate_kw = {} if args.comm is None else {"comm": args.comm}
    pipeline_kw = {"resident": False} if args.not_resident else {}
    topology = ir.Topology.preset("a100-hgx", 8)
    print(
        f"{'schedule':>8} {'p':>2} {'m':>3} {'step ms':>8} {'idle':>6} {'compute idle':>12} "
        f"{'(p-1)/(m+p-1)':>13}"
    )
    for schedule, p, m in CASES:
        f = ir.models.mlp(64 * m, 1024, 1024, 1024, layers=2 * p, training=True)
        g = pipeline_parallel(f, p, m, schedule, **pipeline_kw)
        r = ir.simulate(g, topology, **simulate_kw)
        idle = sum(r.idle_fraction(d) for d in range(p)) / p
        compute_idle = sum(1 - r.busy_s[d] / r.step_time_s for d in range(p)) / p
        print(
            f"{schedule:>8} {p:>2} {m:>3} {r.step_time_s * 1e3:>8.3f} {idle:>6.1%} "
            f"{compute_idle:>12.1%} {(p - 1) / (m + p - 1):>13.1%}"
        )


if __name__ == "__main__":
    main()
