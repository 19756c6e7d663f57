"""Print the README's strategy table: a GPT training step on 8 simulated A100s.

Every program is the steady-state step its transform builds (weights and optimizer
state resident on their devices; no distribution from device 0 inside the step).
``--switches``: the table of ZeRO, sequence parallelism and gradient accumulation
(docs/transforms-parallel.md).
"""

from __future__ import annotations

import sys

import ir
from ir import models, transforms


def main() -> None:
    topology = ir.Topology.preset("a100-hgx", 8)
    f = models.gpt(batch=64, seq=256, hidden=1024, heads=16, vocab=1024, layers=4)
    t = transforms.training(f)
    programs = {
        "sequential (1 device)": lambda: t,
        "DP 8": lambda: transforms.data_parallel(t, 8),
        "HP 8": lambda: transforms.horizontal_parallel(t, 8),
        "PP 4, K=8, GPipe": lambda: transforms.pipeline_parallel(t, 4, 8, "gpipe"),
        "PP 4, K=8, 1F1B": lambda: transforms.pipeline_parallel(t, 4, 8, "1f1b"),
        "3D: DP 8 (Megatron step)": lambda: transforms.megatron(t, 8, 1, 1, 1),
        "3D: DP 4 x TP 2": lambda: transforms.megatron(t, 4, 2, 1, 1),
        "3D: DP 2 x TP 2 x PP 2, K=4, 1F1B": lambda: transforms.megatron(t, 2, 2, 2, 4, "1f1b"),
        "3D: DP 1 x TP 2 x PP 4, K=8, 1F1B": lambda: transforms.megatron(t, 1, 2, 4, 8, "1f1b"),
    }
    extras = {
        "DP 8 (Adam)": lambda: transforms.megatron(adam, 8),
        "DP 8, ZeRO-1 (Adam)": lambda: transforms.megatron(adam, 8, zero=1),
        "DP 8, K=4, ZeRO-1 (Adam)": lambda: transforms.megatron(adam, 8, 1, 1, 4, zero=1),
        "DP 8, K=4, ZeRO-2 (Adam)": lambda: transforms.megatron(adam, 8, 1, 1, 4, zero=2),
        "DP 2 x TP 4": lambda: transforms.megatron(t, 2, 4),
        "DP 2 x TP 4, sequence parallel": lambda: transforms.megatron(
            t, 2, 4, sequence_parallel=True
        ),
        "sequential (1 device)": lambda: t,
        "gradient accumulation, K=8 (1 device)": lambda: transforms.gradient_accumulation(t, 8),
    }
    adam = transforms.training(f, optimizer="adam")
    if "--switches" in sys.argv:
        programs = extras
    print("| program | step ms | max peak MiB | ops (logical) |")
    print("| --- | --- | --- | --- |")
    for name, make in programs.items():
        g = make()
        r = ir.simulate(g, topology)
        peak = max(r.peak_memory_bytes.values()) / 2**20
        print(f"| {name} | {r.step_time_s * 1e3:.1f} | {peak:.0f} | {g.num_ops()} |")


if __name__ == "__main__":
    main()
