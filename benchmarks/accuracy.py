"""The simulator against published iteration times of GPT training (docs/accuracy.md).

    python benchmarks/accuracy.py [--rows LABEL ...] [--microbatches K]
                                  [--matrix-efficiency E] [--fit]

Each row is a configuration from a paper or its authors' post, rebuilt with this
project's own tools: ``ir.models.gpt`` in float16, ``ir.transforms.training`` with
Adam, per-layer activation checkpointing (``ir.transforms.recompute`` of every
activation inside a transformer layer, as Megatron-LM's ``--checkpoint-activations``
recomputes a layer from its input), ``ir.transforms.megatron`` for the data and
tensor parallelism, and a hardware preset of ``ir.hardware``. It is simulated
once, and the step time is compared with the published iteration time (measured,
or derived from the published throughput with the paper's own FLOP count,
:func:`model_flops`). The table gives each row's error and the mean absolute
percentage error (MAPE) over the rows.

``--microbatches K`` splits every replica's batch into ``K`` microbatches (gradient
accumulation) instead of the rows' one; the papers do not give their microbatch
size. ``--matrix-efficiency E`` scales every device's matrix (tensor-core) peaks by
``E`` (one factor for all rows, never per row); ``--fit`` also prints the
efficiency each row would need, their median, and the rows re-simulated at it.
The presets themselves have no efficiency factor: they cost at 100% of peak.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import ir
from ir import models, transforms
from ir.function import Function
from ir.registry import ops_cost

MATMULS = ("MatMul", "MatMulGrad")
# The attention's elementwise ops on the (batch, heads, seq, seq) scores: memory-bound.
ATTENTION_ELEMENTWISE = ("Scale", "CausalMask", "Softmax", "SoftmaxGrad")


@dataclass(frozen=True)
class GptConfig:
    """A GPT's sizes, in Megatron-LM's names (h, a, l, s, V)."""

    hidden: int
    heads: int
    layers: int
    seq: int
    vocab: int = 51200  # GPT-2's 50,257 BPE tokens padded, as Megatron-LM pads them

    @property
    def params(self) -> int:
        """Weights of ``ir.models.gpt`` (embeddings, blocks, final norm, untied head)."""
        shapes = models.gpt_weight_shapes(self.seq, self.hidden, self.vocab, self.layers)
        total = 0
        for shape in shapes.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


@dataclass(frozen=True)
class Case:
    """One published measurement and the configuration that produced it.

    ``published_step_s`` is a measured iteration time; where a paper gives only
    throughput, ``published_tflops_per_gpu`` and :func:`model_flops` give it."""

    label: str
    source: str
    model: GptConfig
    batch: int  # global batch, sequences per iteration
    dp: int
    tp: int
    preset: str
    published_step_s: float | None = None
    published_tflops_per_gpu: float | None = None
    microbatches: int = 1  # per replica; 1: the replica's whole batch at once
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def flops(self) -> float:
        """The paper's FLOP count of one iteration (see :func:`model_flops`)."""
        m = self.model
        return model_flops(self.batch, m.seq, m.layers, m.hidden, m.vocab)

    @property
    def published_s(self) -> float:
        if self.published_step_s is not None:
            return self.published_step_s
        if self.published_tflops_per_gpu is None:
            raise ValueError(f"{self.label}: give a published time or throughput")
        return self.flops / (self.published_tflops_per_gpu * 1e12 * self.gpus)


def model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, *, recompute=True):
    """FLOPs of one GPT training iteration as Narayanan et al. (SC'21, section 5.1) count them.

    ``96 B s l h^2 (1 + s / 6h + V / 16 l h)``: the matrix products only, a forward
    pass counted three times over the layers (forward, backward = 2 forwards, and
    the recomputation of checkpointed layers) and three times for the logit layer.
    ``recompute=False`` gives the count without recomputation, ``72 B s l h^2 (1 +
    s / 6h + V / 12 l h)``.

    >>> round(model_flops(512, 2048, 24, 2304, 51200) / 1e15, 2)  # their 1.7B row: PFLOP
    15.47
    """
    B, s, L, h, V = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def training_step(model: GptConfig, batch: int, *, recompute: bool = True) -> Function:
    """The sequential float16 training step (Adam) of ``model``, layers checkpointed.

    As Megatron-LM of 2020-2022 ran it: attention as two batched matmuls around its fused
    scale-mask-softmax kernel (``attention="fused_softmax"``; FlashAttention came to
    Megatron-LM later), and its default dropouts (0.1 on the attention probabilities and
    on each residual branch)."""
    m = model
    f = models.gpt(
        batch,
        m.seq,
        m.hidden,
        m.heads,
        m.vocab,
        m.layers,
        dtype="float16",
        attention="fused_softmax",
        dropout=0.1,
        attention_dropout=0.1,
    )
    t = transforms.training(f, "adam")
    return transforms.recompute(t, models.gpt_layer_activations(t)) if recompute else t


def build(case: Case) -> Function:
    """The Megatron-LM-arranged steady-state step of ``case`` on ``case.gpus`` devices."""
    t = training_step(case.model, case.batch)
    return transforms.megatron(t, case.dp, case.tp, case.pp, case.microbatches)


def counted_flops(f: Function) -> tuple[float, float]:
    """(all FLOPs, matrix FLOPs) of the top-level ops of ``f``, from their cost rules."""
    cost = ops_cost(f.ops)
    return cost.flops, cost.matrix_flops


def derated(topology: ir.Topology, matrix_efficiency: float) -> ir.Topology:
    """``topology`` with every device's matrix peaks scaled by ``matrix_efficiency``."""
    if not 0 < matrix_efficiency <= 1:
        raise ValueError(f"matrix_efficiency must be in (0, 1], got {matrix_efficiency}")
    if matrix_efficiency == 1:
        return topology
    devices = tuple(
        replace(
            d,
            peak_flops=d.peak_flops * matrix_efficiency,
            matrix_peak_flops={k: v * matrix_efficiency for k, v in d.matrix_peak_flops},
        )
        for d in topology.devices
    )
    return replace(topology, devices=devices)


@dataclass(frozen=True)
class Row:
    """A simulated case: the step time and where device 0's time went."""

    case: Case
    simulated_s: float
    matmul_s: float  # device 0's compute stream in MatMul and MatMulGrad
    attention_elementwise_s: float  # ... in scale, mask, softmax and its gradient
    other_compute_s: float  # ... in every other compute op
    build_s: float
    simulate_s: float
    matrix_efficiency: float = 1.0

    @property
    def error(self) -> float:
        """(simulated - published) / published iteration time."""
        return self.simulated_s / self.case.published_s - 1

    @property
    def simulated_tflops_per_gpu(self) -> float:
        return self.case.flops / (self.simulated_s * self.case.gpus) / 1e12

    @property
    def published_tflops_per_gpu(self) -> float:
        return self.case.flops / (self.case.published_s * self.case.gpus) / 1e12

    @property
    def exposed_s(self) -> float:
        """Step time with device 0's compute stream idle (communication not hidden)."""
        busy = self.matmul_s + self.attention_elementwise_s + self.other_compute_s
        return max(0.0, self.simulated_s - busy)

    def needed_matrix_efficiency(self) -> float | None:
        """The matrix efficiency at which this row's step would take the published time,
        if only matmul time scales (the rest as simulated); None if no efficiency can."""
        rest = self.simulated_s - self.matmul_s
        if self.case.published_s <= rest:
            return None
        return self.matmul_s * self.matrix_efficiency / (self.case.published_s - rest)


def run_case(case: Case, matrix_efficiency: float = 1.0) -> Row:
    """Build ``case``, simulate it on its preset and break down device 0's time."""
    t0 = time.perf_counter()
    program = build(case)
    t1 = time.perf_counter()
    topology = derated(ir.Topology.preset(case.preset, case.gpus), matrix_efficiency)
    result = ir.simulate(program, topology)
    step_s = result.step_time_s
    t2 = time.perf_counter()
    matmul = attention = other = 0.0
    for ev in result.events_on(0, "compute"):
        if ev.op.op_type in MATMULS:
            matmul += ev.dur_s
        elif ev.op.op_type in ATTENTION_ELEMENTWISE:
            attention += ev.dur_s
        else:
            other += ev.dur_s
    return Row(case, step_s, matmul, attention, other, t1 - t0, t2 - t1, matrix_efficiency)


def mape(rows: Iterable[Row]) -> float:
    """Mean absolute percentage error of the rows' iteration times, as a fraction."""
    errors = [abs(r.error) for r in rows]
    if not errors:
        raise ValueError("MAPE of no rows")
    return sum(errors) / len(errors)


NARAYANAN = "Narayanan et al. 2021 (SC'21), Table 1"
V1_POST = "Megatron-LM v1.0 post (NVIDIA ADLR, 2020), Table 1"

CASES: tuple[Case, ...] = (
    Case(
        "1.2B, 1 V100",
        V1_POST,
        GptConfig(1536, 16, 40, 1024),
        batch=8,
        dp=1,
        tp=1,
        preset="v100-dgx2",
        published_step_s=1.288,
    ),
    Case(
        "1.7B, DP 32",
        NARAYANAN,
        GptConfig(2304, 24, 24, 2048),
        batch=512,
        dp=32,
        tp=1,
        preset="a100-hgx",
        published_tflops_per_gpu=137,
    ),
    Case(
        "3.6B, TP 2 x DP 32",
        NARAYANAN,
        GptConfig(3072, 32, 30, 2048),
        batch=512,
        dp=32,
        tp=2,
        preset="a100-hgx",
        published_tflops_per_gpu=138,
    ),
    Case(
        "7.5B, TP 4 x DP 32",
        NARAYANAN,
        GptConfig(4096, 32, 36, 2048),
        batch=512,
        dp=32,
        tp=4,
        preset="a100-hgx",
        published_tflops_per_gpu=142,
    ),
    Case(
        "18.4B, TP 8 x DP 32",
        NARAYANAN,
        GptConfig(6144, 48, 40, 2048),
        batch=1024,
        dp=32,
        tp=8,
        preset="a100-hgx",
        published_tflops_per_gpu=135,
    ),
    Case(
        "39.1B, TP 8 x PP 2 x DP 32",
        NARAYANAN,
        GptConfig(8192, 64, 48, 2048),
        batch=1536,
        dp=32,
        tp=8,
        pp=2,
        microbatches=48,  # microbatch size 1: the replica's 48 sequences, 1F1B
        preset="a100-hgx",
        published_tflops_per_gpu=138,
    ),
)


def table_markdown(rows: Sequence[Row]) -> str:
    """The rows as a markdown table, then the MAPE."""
    lines = [
        "| row | source | GPUs | preset | published s | simulated s | error | "
        "TFLOP/s per GPU (96 B s l h^2 ... count): published | simulated "
        "| device 0: matmul / attention elementwise / other / exposed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.case
        shares = [r.matmul_s, r.attention_elementwise_s, r.other_compute_s, r.exposed_s]
        split = " / ".join(f"{s / r.simulated_s:.0%}" for s in shares)
        derived = "" if c.published_step_s is not None else " (from TFLOP/s)"
        lines.append(
            f"| {c.label} | {c.source} | {c.gpus} | `{c.preset}` | {c.published_s:.3f}{derived} "
            f"| {r.simulated_s:.3f} | {r.error:+.1%} | {r.published_tflops_per_gpu:.0f} "
            f"| {r.simulated_tflops_per_gpu:.0f} | {split} |"
        )
    lines.append("")
    lines.append(f"MAPE over {len(rows)} rows: {mape(rows):.1%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="labels of the rows to run (default: all)")
    parser.add_argument("--microbatches", type=int, default=None)
    parser.add_argument("--matrix-efficiency", type=float, default=1.0)
    parser.add_argument("--fit", action="store_true")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.rows or c.label in args.rows]
    if args.microbatches is not None:
        cases = [replace(c, microbatches=args.microbatches) for c in cases]
    rows = []
    for case in cases:
        row = run_case(case, args.matrix_efficiency)
        rows.append(row)
        print(
            f"# {case.label}: {case.model.params / 1e9:.2f}B weights, build {row.build_s:.1f} s, "
            f"simulate {row.simulate_s:.1f} s",
            flush=True,
        )
    print(f"matrix efficiency {args.matrix_efficiency:g}")
    print(table_markdown(rows))
    if args.fit:
        needed = {r.case.label: r.needed_matrix_efficiency() for r in rows}
        print("\nmatrix efficiency each row needs:")
        for label, e in needed.items():
            print(f"- {label}: {'none would do' if e is None else f'{e:.2f}'}")
        fitted = statistics.median(e for e in needed.values() if e is not None)
        print(f"\none efficiency for every row (the median, fitted on these rows): {fitted:.2f}")
        print(table_markdown([run_case(c, fitted) for c in cases]))


if __name__ == "__main__":
    main()
