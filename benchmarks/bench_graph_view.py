"""How long the graph view takes to draw the programs a user opens.

For each program: its op count (pmap bodies included), how many nodes the
drawing has (ops, folds, inputs, stubs), and the seconds ``render_graph`` takes
(building the dot source, running the real ``dot`` binary, post-processing the
SVG). The target is under 2 s for each; the logical view of the 24-layer GPT
trained on 64 devices (``megatron(dp=4, tp=4, pp=4, microbatches=8)``, 15 000 ops
of which 3 800 top-level) under 1 s.

    python benchmarks/bench_graph_view.py [--only gpt4-train] [--save-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import ir
from ir.function import Function
from widgets.graph import GraphOptions, render_graph

LOGICAL = GraphOptions(view="logical")


def programs() -> dict[str, Callable[[], Function]]:
    """The programs to time, built lazily (name -> builder)."""

    def gpt(layers: int) -> Function:
        # unfused attention: the programs docs/graph-view.md measured (op counts included)
        return ir.models.gpt(16, 128, 512, 8, 4096, layers, attention="unfused")

    def train(layers: int) -> Function:
        return ir.transforms.training(gpt(layers))

    return {
        "gpt4-forward": lambda: gpt(4),
        "gpt24-forward": lambda: gpt(24),
        "gpt4-train": lambda: train(4),
        "gpt24-train": lambda: train(24),
        "gpt4-train-dp8": lambda: ir.transforms.data_parallel(train(4), 8),
        "gpt4-train-pp4x8": lambda: ir.transforms.pipeline_parallel(train(4), 4, 8),
        "gpt24-train-dp8": lambda: ir.transforms.data_parallel(train(24), 8),
        "gpt24-train-pp4x8": lambda: ir.transforms.pipeline_parallel(train(24), 4, 8),
        # the logical view (options below): dp x tp x pp = 64 devices
        "gpt24-megatron-64": lambda: ir.transforms.megatron(
            ir.transforms.training(ir.models.gpt(32, 128, 512, 8, 4096, 24, attention="unfused")),
            4,
            4,
            4,
            8,
        ),
    }


def options_for(name: str) -> GraphOptions | None:
    """The megatron programs are drawn as logical programs, the others unrolled."""
    return LOGICAL if "megatron" in name else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", help="program name (repeatable)")
    parser.add_argument("--save-dir", type=Path, help="write <name>.dot and <name>.svg here")
    args = parser.parse_args()
    print(f"{'program':<18} {'ops':>6} {'drawn':>6} {'seconds':>8}")
    for name, build in programs().items():
        if args.only and name not in args.only:
            continue
        f = build()
        start = time.perf_counter()
        g = render_graph(f, options=options_for(name))
        seconds = time.perf_counter() - start
        drawn = g.svg.count('class="node"')
        print(f"{name:<18} {f.num_ops():>6} {drawn:>6} {seconds:>8.2f}", flush=True)
        if args.save_dir:
            args.save_dir.mkdir(parents=True, exist_ok=True)
            (args.save_dir / f"{name}.dot").write_text(g.dot)
            (args.save_dir / f"{name}.svg").write_text(g.svg)


if __name__ == "__main__":
    main()
