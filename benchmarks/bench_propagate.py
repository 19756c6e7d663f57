"""Propagation, lowering and ranked runs of annotated GPTs: sizes, times, equality.

For each case: the sequential program's ops and the propagated step's ops (outside pmap
bodies, and unrolled to every device), the collectives propagation inserted and their
predicted time, the time to propagate, lower to ranks and run the ranks (numpy), the
ranks and their distinct programs, and whether the ranked run equals the sequential one.

    python benchmarks/bench_propagate.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import numpy as np

import ir
from ir import models, transforms
from ir.sharding import Mesh, R, S, lower_to_ranks, propagate, run_ranked


def megatron_annotations(f: ir.Function, mesh: Mesh, axis: int) -> dict:
    """Heads (q, k, v by columns, o by rows) and the MLP (w1 columns, w2 rows) on ``axis``."""
    out = {}
    for v in f.inputs:
        for suffix, dim in (("wq", 1), ("wk", 1), ("wv", 1), ("wo", 0), ("w1", 1), ("w2", 0)):
            if v.name.endswith(suffix):
                placements = [R] * mesh.ndim
                placements[axis] = S(dim)
                out[v.name] = (mesh, placements)
    return out


def cases():
    # unfused attention: the programs docs/click_to_redraw.md and docs/sharding.md measured
    fwd = models.gpt(batch=8, seq=16, hidden=64, heads=4, vocab=128, layers=2, attention="unfused")
    yield (
        "GPT fwd, 2 layers, heads + MLP split, mesh (2,)",
        fwd,
        megatron_annotations(fwd, Mesh((2,)), 0),
    )
    train = models.gpt(
        batch=8, seq=16, hidden=64, heads=4, vocab=128, layers=2, training=True, attention="unfused"
    )
    mesh = Mesh((2, 4))
    both = megatron_annotations(train, mesh, 1)
    both["tokens"] = (mesh, [S(0), R])
    yield "GPT training, 2 layers, mesh 2x4 data x tensor", train, both
    yield "GPT training, 2 layers, data parallel over 8", train, {"tokens": (Mesh((8,)), [S(0)])}
    odd = models.gpt(
        batch=6, seq=10, hidden=16, heads=2, vocab=11, layers=1, training=True, attention="unfused"
    )
    yield (
        "GPT training, 1 layer, uneven tokens (6x10) on 2x2 (4, 4)",
        odd,
        {"tokens": (Mesh((2, 2)), [S(0), S(1)])},
    )


def main() -> None:
    topology = ir.Topology.preset("a100-hgx", 8)
    print(
        "| program | ops -> step ops (unrolled) | collectives (predicted) | propagate | lower "
        "| ranks / programs | run_ranked | equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, f, placed in cases():
        start = time.perf_counter()
        g, report = propagate(f, placed, topology)
        propagated = time.perf_counter() - start
        unrolled = transforms.unroll_pmap(g).num_ops()
        start = time.perf_counter()
        ranked = lower_to_ranks(g)
        lowered = time.perf_counter() - start
        xs = ir.random_inputs(f, 0)
        start = time.perf_counter()
        outs = run_ranked(ranked, ir.distribute(g, xs, source=f))
        ran = time.perf_counter() - start
        equal = all(
            np.allclose(got, want, rtol=1e-4, atol=1e-5)
            for got, want in zip(ir.collect(g, outs, rtol=1e-5), ir.execute(f, xs))
        )
        print(
            f"| {name} | {f.num_ops()} -> {len(g.ops)} ({unrolled}) | "
            f"{len(report.collectives)} ({report.communication_time_s * 1e6:.1f} us) | "
            f"{propagated:.2f} s | {lowered * 1e3:.0f} ms | "
            f"{len(ranked.ranks)} / {ranked.num_unique} | {ran * 1e3:.0f} ms | "
            f"{'yes' if equal else 'NO'} |"
        )


if __name__ == "__main__":
    main()
