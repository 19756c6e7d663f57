"""A Mixtral-8x22B-shaped (or DeepSeek-V3-shaped) training step over hundreds of GPUs,
built and simulated: the time each part takes (the issue's goal: under 30 s together) and
what the simulator says.

Mixtral 8x22B (Mistral AI's model card and config.json): 56 layers, hidden 6144, 48
query heads over 8 key/value heads, 8 experts of 16384 columns with 2 chosen per token,
a 32768-word vocabulary; here a GPT-style block of those shapes (LayerNorm and GELU in
place of RMSNorm and SwiGLU: the same matrices but the gate's), bf16 with fp32 master
weights and Adam, ZeRO-1 and sequence parallelism, on H100 HGX nodes (8 GPUs each).
The default layout, dp 8 (ep 8 inside) x tp 4 x pp 8 = 256 GPUs with 16 microbatches
of one 4096-token sequence per replica, is the shape of Megatron-Core's MoE recipes
(EP inside DP, TP inside a node, PP across nodes).

``--shape deepseek``: DeepSeek-V3's shapes (the V3 report, Liu et al. 2024: 61 layers,
hidden 7168, 128 heads, the first 3 layers dense, then 256 routed experts of 2048 columns
with 8 chosen per token and 1 shared expert, a 129280-word vocabulary), with plain
multi-head attention in place of MLA and GPT's 4 x hidden dense MLP, on its layout's
degrees: pp 16, ep 64 inside dp 64 (1024 GPUs), 32 microbatches. No recomputation, so the
peak exceeds an H100's memory, as the real run would without DeepSeek's recomputation
and FP8: the figure here is the build and simulation time.

    python benchmarks/moe_scale.py [--shape mixtral|deepseek] [--layers 56] [--dp 8]
        [--ep 8] [--tp 4] [--pp 8] [--cp 1] [--microbatches 16] [--seq 4096] [--zero 1]
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

SHAPES = {  # model keywords, then the default degrees
    "mixtral": (
        dict(
            hidden=6144,
            heads=48,
            vocab=32768,
            layers=56,
            kv_heads=8,
            experts=8,
            top_k=2,
            expert_hidden=16384,
        ),
        dict(dp=8, ep=8, tp=4, pp=8, microbatches=16),
    ),
    "deepseek": (
        dict(
            hidden=7168,
            heads=128,
            vocab=129280,
            layers=61,
            experts=256,
            top_k=8,
            expert_hidden=2048,
            shared_experts=1,
            dense_layers=3,
        ),
        dict(dp=64, ep=64, tp=1, pp=16, microbatches=32),
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="mixtral")
    p.add_argument("--layers", type=int)
    p.add_argument("--dp", type=int)
    p.add_argument("--ep", type=int)
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--microbatches", type=int)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--zero", type=int, default=1)
    a = p.parse_args()
    shape, degrees = SHAPES[a.shape]
    shape = {**shape, "layers": a.layers or shape["layers"]}
    for name, value in degrees.items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    gpus = a.dp * a.cp * a.tp * a.pp
    t0 = time.perf_counter()
    f = models.gpt(
        a.dp * a.microbatches,
        a.seq,
        shape.pop("hidden"),
        shape.pop("heads"),
        shape.pop("vocab"),
        shape.pop("layers"),
        dtype="bfloat16",
        **shape,
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
    layers = a.layers or SHAPES[a.shape][0]["layers"]
    name = {"mixtral": "Mixtral-8x22B", "deepseek": "DeepSeek-V3"}[a.shape]
    print(
        f"{name}-shaped, {layers} layers, dp{a.dp} ep{a.ep} cp{a.cp} tp{a.tp} "
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
