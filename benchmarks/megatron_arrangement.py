"""Print the figures of Megatron-LM's arrangement in ``ir.transforms.megatron``
(docs/transforms-parallel.md, docs/transforms-training.md):

1. each pipeline stage's work with the vocabulary whole on every tensor rank and split
   over them (vocabulary-parallel embedding, head and cross-entropy), for a GPT-3 2.7B
   shape (hidden 2560, 32 layers, vocabulary 51200, sequence 2048) at tp 8, pp 4;
2. the bytes a parameter costs with the optimizer in mixed precision (bf16 weights and
   gradients, float32 master weights and Adam moments), without and with ZeRO-1;
3. the activation bytes a transformer layer stores with no, selective and full
   recomputation, against Korthikanti et al. (2022), Table 2, on the simulator's memory
   curve.

``python benchmarks/megatron_arrangement.py`` (about 20 s here).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

import ir
from ir import models, transforms
from ir.registry import ops_cost
from ir.types import TupleType


def _leaves(t: ir.Type) -> list:
    return [x for e in t.elements for x in _leaves(e)] if isinstance(t, TupleType) else [t]


def stage_flops(g: ir.Function, stages: int, per_stage: int) -> list[float]:
    """The most floating-point operations any device of each pipeline stage runs."""
    flops: dict[int, float] = defaultdict(float)
    for op in g.ops:
        if op.op_type == "Pmap":
            work = ops_cost(op.subfunctions[0].ops).flops
            for piece in _leaves(op.inputs[0].type):
                flops[piece.device] += work
    return [max(flops[d] for d in range(s * per_stage, (s + 1) * per_stage)) for s in range(stages)]


def vocabulary_table() -> None:
    b, s, h, heads, vocab, layers, tp, pp, m = 8, 2048, 2560, 32, 51200, 32, 8, 4, 8
    f = models.gpt(b, s, h, heads, vocab, layers, dtype="bfloat16")
    t = transforms.training(f, optimizer="adam", master_weights=True)
    cut = {f"h{layers // pp * k}_ln1_y": k for k in range(1, pp)}  # 8 layers a stage
    topology = ir.Topology.preset("a100-hgx", tp * pp)
    print(f"GPT b={b} s={s} h={h} heads={heads} V={vocab} L={layers}, bf16, Adam with fp32")
    print(f"masters; tp={tp} pp={pp}, {m} microbatches, 1F1B, {layers // pp} layers a stage\n")
    header = "vocabulary | TFLOP a device, stages 0..3 | last / middle | step ms | last busy ms"
    print(f"| {header} |")
    print("| --- | --- | --- | --- | --- |")
    for vp in (False, True):
        g = transforms.megatron(t, 1, tp, pp, m, vocab_parallel=vp, stage_of=cut)
        flops = stage_flops(g, pp, tp)
        result = ir.simulate(g, topology)
        busy = result.busy_s
        last = max(busy[d] for d in range((pp - 1) * tp, pp * tp))
        name = "split (vocab_parallel=True)" if vp else "whole on every rank"
        shown = " / ".join(f"{x / 1e12:.2f}" for x in flops)
        print(
            f"| {name} | {shown} | {flops[-1] / flops[1]:.2f} | "
            f"{result.step_time_s * 1e3:.0f} | {last * 1e3:.0f} |"
        )


def bytes_per_parameter() -> None:
    print("\n| optimizer | weight | gradient | state | total bytes a parameter |")
    print("| --- | --- | --- | --- | --- |")
    f = models.mlp(64, 512, 512, 64, layers=4, dtype="bfloat16")
    for dp, zero in ((1, 0), (8, 0), (8, 1)):
        t = transforms.training(f, optimizer="adam", master_weights=True)
        g = transforms.megatron(t, dp, 1, 1, 1, zero=zero)
        params = [op.inputs[0] for op in t.ops if ir.get_op(op.op_type).extra.get("optimizer")]
        n = sum(p.type.num_elements for p in params)
        names = {p.name for p in params}
        on_zero = {
            v.name: sum(x.size_bytes for x in _leaves(v.type) if x.device == 0) for v in g.inputs
        }
        weight = sum(on_zero[k] for k in names) / n
        state = sum(b for k, b in on_zero.items() if k.split("_")[0] in ("master", "m", "v")) / n
        grad = 2.0  # bf16, as its weight
        label = f"bf16 + fp32 master, Adam, dp={dp}" + (f", ZeRO-{zero}" if zero else "")
        print(f"| {label} | {weight:g} | {grad:g} | {state:g} | {weight + grad + state:g} |")


def _stored(g: ir.Function, devices: int = 1) -> float:
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", devices))
    start = min(
        e.start_s
        for e in result.events
        if e.device == 0 and ir.get_op(e.op.op_type).extra.get("backward_seed")
    )
    times, live = result.memory_timeline(0)
    inputs = sum(x.size_bytes for v in g.inputs for x in _leaves(v.type) if x.device == 0)
    return float(live[np.searchsorted(times, start, side="left") - 1]) - inputs


def activation_table() -> None:
    b, s, h, a = 1, 2048, 2560, 32
    print(f"\nActivations a layer stores, b={b} s={s} h={h} a={a}, bf16, the unfused attention")
    print("with Megatron-LM's dropouts (0.1, 0.1), MiB (simulator's memory curve)\n")
    print("| recomputation | tp | measured | Korthikanti et al., Table 2 |")
    print("| --- | --- | --- | --- |")
    sbh, mib = s * b * h, 2**20
    drop = {"dropout": 0.1, "attention_dropout": 0.1, "attention": "unfused"}
    two, four = (
        transforms.training(models.gpt(b, s, h, a, 512, n, dtype="bfloat16", **drop))
        for n in (2, 4)
    )
    for tp in (1, 8):
        for mode in (None, "selective", "full"):
            steps = [transforms.megatron(x, 1, tp, 1, 1, recompute=mode) for x in (two, four)]
            per_layer = (_stored(steps[1], tp) - _stored(steps[0], tp)) / 2
            core = 5 * a * s / (h * tp) if mode is None else 0
            paper = 2 * sbh if mode == "full" else sbh * (10 + 24 / tp + core)
            print(f"| {mode or 'none'} | {tp} | {per_layer / mib:.1f} | {paper / mib:.1f} |")


if __name__ == "__main__":
    vocabulary_table()
    bytes_per_parameter()
    activation_table()
