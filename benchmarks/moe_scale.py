"""A Mixtral-8x22B-shaped training step over hundreds of GPUs, built and simulated: the
time each part takes (the issue's goal: under 30 s together) and what the simulator says.

Mixtral 8x22B (Mistral AI's model card and config.json): 56 layers, hidden 6144, 48
query heads over 8 key/value heads, 8 experts of 16384 columns with 2 chosen per token,
a 32768-word vocabulary; here a GPT-style block of those shapes (LayerNorm and GELU in
place of RMSNorm and SwiGLU: the same matrices but the gate's), bf16 with fp32 master
weights and Adam, ZeRO-1 and sequence parallelism, on H100 HGX nodes (8 GPUs each).
The default layout, dp 8 (ep 8 inside) x tp 4 x pp 8 = 256 GPUs with 16 microbatches
of one 4096-token sequence per replica, is the shape of Megatron-Core's MoE recipes
(EP inside DP, TP inside a node, PP across nodes).

    python benchmarks/moe_scale.py [--layers 56] [--dp 8] [--ep 8] [--tp 4] [--pp 8]
        [--cp 1] [--microbatches 16] [--seq 4096] [--zero 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import ir
from ir import models, transforms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=56)
    p.add_argument("--dp", type=int, default=8)
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--pp", type=int, default=8)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--zero", type=int, default=1)
    a = p.parse_args()
    gpus = a.dp * a.cp * a.tp * a.pp
    t0 = time.perf_counter()
    f = models.gpt(
        a.dp * a.microbatches,
        a.seq,
        6144,
        48,
        32768,
        a.layers,
        dtype="bfloat16",
        kv_heads=8,
        experts=8,
        top_k=2,
        expert_hidden=16384,
    )
    t = transforms.training(f, optimizer="adam", master_weights=True)
    t1 = time.perf_counter()
    g = transforms.megatron(
        t,
        a.dp,
        a.tp,
        a.pp,
        a.microbatches,
        ep=a.ep,
        cp=a.cp,
        zero=a.zero,
        sequence_parallel=a.tp > 1,
    )
    t2 = time.perf_counter()
    topology = ir.Topology.preset("h100-hgx", gpus)
    r = ir.simulate(g, topology)
    t3 = time.perf_counter()
    tokens = a.dp * a.microbatches * a.seq
    by_kind: dict[str, float] = defaultdict(float)
    for e in r.events_on(0):
        if e.op.op_type in ("AllToAll", "AllGather", "ReduceScatter", "AllReduce", "SendEach"):
            by_kind[e.op.op_type] += e.end_s - e.start_s
    print(
        f"Mixtral-8x22B-shaped, {a.layers} layers, dp{a.dp} ep{a.ep} cp{a.cp} tp{a.tp} "
        f"pp{a.pp} m{a.microbatches} zero{a.zero}: {gpus} H100s, {tokens} tokens a step"
    )
    print(f"  model + training step  {t1 - t0:6.1f} s")
    print(f"  megatron build         {t2 - t1:6.1f} s  ({len(g.ops)} ops)")
    print(f"  simulate               {t3 - t2:6.1f} s")
    print(f"  total                  {t3 - t0:6.1f} s  (goal: < 30 s)")
    rate = tokens / r.step_time_s
    print(f"  step time              {r.step_time_s:6.3f} s  ({rate:,.0f} tokens/s)")
    peak = max(r.peak_memory_bytes.values()) / 2**30
    print(f"  peak memory            {peak:6.1f} GiB per GPU")
    for kind, s in sorted(by_kind.items()):
        print(f"  device 0 {kind:<14} {s * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
