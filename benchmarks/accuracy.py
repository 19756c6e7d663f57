"""The simulator against published iteration times of Megatron-LM GPT training (docs/accuracy.md).

    python benchmarks/accuracy.py [--rows LABEL ...] [--sources NAME ...] [--quick]
                                  [--fit] [--microbatch-size K] [--jobs N]

Each row is a configuration from a paper or its authors' post, rebuilt with this
project's own tools as Megatron-LM ran it (:class:`Recipe`: fused scale-mask-softmax
attention, 0.1 dropouts, Adam on float32 master weights, the paper's recomputation and
sequence parallelism; ``ir.transforms.megatron`` with vocabulary-parallel embedding and
head), simulated once on the **default presets** (the efficiency model of
``ir.hardware``, nothing fitted to these rows), and compared with the published
iteration time (measured, or derived from the published throughput with the paper's own
FLOP count, :func:`model_flops`). The report gives each row's error, the mean absolute
percentage error (MAPE) per source and overall, and ranking quality within the groups of
rows that share a model (Spearman, and whether the fastest configuration is predicted
fastest).

Rows run a process each, ``--jobs`` at once (default: the CPUs). ``--fit`` then fits the
efficiency model's four factors to these rows with ``ir.calibrate`` and prints the
leave-one-out (held-out) errors first and the in-sample ones second, labelled.
``--quick`` skips rows of more than 2,500 layer-microbatches to build (the pipelines from
76.1B up). ``--microbatch-size K`` overrides the rows' microbatch size (the papers rarely
state it; see docs/accuracy.md).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import ir
from ir import models, transforms
from ir.function import Function
from ir.registry import ops_cost

MATMULS = ("MatMul", "MatMulGrad")
# The attention core's memory-bound kernels on the (b, heads, s, s) scores.
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
        return sum(math.prod(shape) for shape in shapes.values())


@dataclass(frozen=True)
class Recipe:
    """How a published run computed its step, in this project's terms."""

    attention: str = "fused_softmax"  # Megatron-LM before FlashAttention
    dropout: float = 0.1  # Megatron-LM's --hidden-dropout default
    attention_dropout: float = 0.1  # --attention-dropout default
    recompute: str | None = "full"  # --recompute-granularity (or --checkpoint-activations)
    sequence_parallel: bool = False
    master_weights: bool = True  # mixed precision: float32 master weights and moments
    dtype: str = "float16"
    # Megatron-LM's DDP all-reduces the gradients after the backward of the last
    # microbatch (v2.x train_step: allreduce_gradients() after forward_backward_func;
    # Megatron-Core: --overlap-grad-reduce is off by default)
    overlap_grad_reduce: bool = False


MEGATRON_2021 = Recipe()
# Korthikanti et al.'s "present work": selective recomputation and sequence parallelism
SELECTIVE_SP = replace(MEGATRON_2021, recompute="selective", sequence_parallel=True)


@dataclass(frozen=True)
class Case:
    """One published measurement and the configuration that produced it.

    ``published_step_s`` is a measured iteration time; where a paper gives only
    throughput, ``published_tflops_per_gpu`` and :func:`model_flops` give it.
    ``microbatch_size`` sequences per microbatch (``microbatches`` per replica follow);
    ``group``: rows of one model on one machine, compared for ranking."""

    label: str
    source: str
    model: GptConfig
    batch: int  # global batch, sequences per iteration
    dp: int
    tp: int
    preset: str
    published_step_s: float | None = None
    published_tflops_per_gpu: float | None = None
    pp: int = 1
    microbatch_size: int = 1
    schedule: str = "1f1b"
    recipe: Recipe = MEGATRON_2021
    group: str = ""

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        per_replica = self.batch // self.dp
        return max(1, per_replica // self.microbatch_size)

    @property
    def flops(self) -> float:
        """The paper's FLOP count of one iteration (see :func:`model_flops`)."""
        m = self.model
        full = self.recipe.recompute == "full"
        return model_flops(self.batch, m.seq, m.layers, m.hidden, m.vocab, recompute=full)

    @property
    def published_s(self) -> float:
        if self.published_step_s is not None:
            return self.published_step_s
        if self.published_tflops_per_gpu is None:
            raise ValueError(f"{self.label}: give a published time or throughput")
        return self.flops / (self.published_tflops_per_gpu * 1e12 * self.gpus)

    @property
    def build_size(self) -> int:
        """How big the program is to build: layers x microbatches (tasks of one layer)."""
        return self.model.layers * self.microbatches


def model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, *, recompute=True):
    """FLOPs of one GPT training iteration as Narayanan et al. (SC'21, section 5.1) count them.

    ``96 B s l h^2 (1 + s / 6h + V / 16 l h)``: the matrix products only, a forward
    pass counted three times over the layers (forward, backward = 2 forwards, and
    the recomputation of checkpointed layers) and three times for the logit layer.
    ``recompute=False`` gives the count without recomputation, ``72 B s l h^2 (1 +
    s / 6h + V / 12 l h)`` (Korthikanti et al.'s model FLOPs).

    >>> round(model_flops(512, 2048, 24, 2304, 51200) / 1e15, 2)  # their 1.7B row: PFLOP
    15.47
    """
    B, s, L, h, V = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def training_step(model: GptConfig, batch: int, recipe: Recipe = MEGATRON_2021) -> Function:
    """The sequential training step (Adam) of ``model`` as ``recipe`` says."""
    m = model
    f = models.gpt(
        batch,
        m.seq,
        m.hidden,
        m.heads,
        m.vocab,
        m.layers,
        dtype=recipe.dtype,
        attention=recipe.attention,
        dropout=recipe.dropout,
        attention_dropout=recipe.attention_dropout,
    )
    t = transforms.training(f, "adam", master_weights=recipe.master_weights)
    return t if recipe.recompute is None else transforms.recompute(t, recipe.recompute)


def build(case: Case) -> Function:
    """The Megatron-LM-arranged steady-state step of ``case`` on ``case.gpus`` devices."""
    t = training_step(case.model, case.batch, case.recipe)
    return transforms.megatron(
        t,
        case.dp,
        case.tp,
        case.pp,
        case.microbatches,
        case.schedule,
        sequence_parallel=case.recipe.sequence_parallel,
        overlap_grad_reduce=case.recipe.overlap_grad_reduce,
    )


def counted_flops(f: Function) -> tuple[float, float]:
    """(all FLOPs, matrix FLOPs) of the top-level ops of ``f``, from their cost rules."""
    cost = ops_cost(f.ops)
    return cost.flops, cost.matrix_flops


@dataclass(frozen=True)
class Row:
    """A simulated case: the step time and where device 0's time went."""

    case: Case
    simulated_s: float
    matmul_s: float  # device 0's compute stream in MatMul and MatMulGrad
    attention_elementwise_s: float  # ... in the attention core's softmax and its gradient
    other_compute_s: float  # ... in every other compute op
    build_s: float
    simulate_s: float
    program: Function | None = None

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
        """Step time with device 0's compute stream idle (communication, host, bubble)."""
        busy = self.matmul_s + self.attention_elementwise_s + self.other_compute_s
        return max(0.0, self.simulated_s - busy)


def run_case(case: Case, topology: ir.Topology | None = None, *, keep: bool = False) -> Row:
    """Build ``case``, simulate it on its preset (or ``topology``) and break down device 0's
    time. ``keep``: keep the program on the row (for a fit)."""
    t0 = time.perf_counter()
    program = build(case)
    t1 = time.perf_counter()
    result = ir.simulate(program, topology or ir.Topology.preset(case.preset, case.gpus))
    t2 = time.perf_counter()
    matmul = attention = other = 0.0
    for ev in result.events_on(0, "compute"):
        if ev.op.op_type in MATMULS:
            matmul += ev.dur_s
        elif ev.op.op_type in ATTENTION_ELEMENTWISE:
            attention += ev.dur_s
        else:
            other += ev.dur_s
    kept = program if keep else None
    return Row(case, result.step_time_s, matmul, attention, other, t1 - t0, t2 - t1, kept)


def mape(rows: Iterable[Row]) -> float:
    """Mean absolute percentage error of the rows' iteration times, as a fraction."""
    errors = [abs(r.error) for r in rows]
    if not errors:
        raise ValueError("MAPE of no rows")
    return sum(errors) / len(errors)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (no ties expected; 1.0 for fewer than 2 points).

    >>> spearman([1, 2, 3], [10, 30, 20])
    0.5
    """
    n = len(xs)
    if n < 2:
        return 1.0

    def ranks(v):
        order = sorted(range(n), key=lambda i: v[i])
        r = [0.0] * n
        for k, i in enumerate(order):
            r[i] = float(k)
        return r

    rx, ry = ranks(xs), ranks(ys)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry))
    return 1 - 6 * d2 / (n * (n * n - 1))


def ranking(rows: Sequence[Row]) -> list[tuple[str, int, float, bool]]:
    """Per group of two or more rows: (group, rows, Spearman of simulated vs published
    step time, whether the fastest published configuration is the fastest simulated)."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.case.group:
            groups.setdefault(r.case.group, []).append(r)
    out = []
    for name, members in groups.items():
        if len(members) < 2:
            continue
        sim = [r.simulated_s for r in members]
        pub = [r.case.published_s for r in members]
        fastest = min(range(len(members)), key=lambda i: pub[i])
        out.append((name, len(members), spearman(sim, pub), sim[fastest] == min(sim)))
    return out


NARAYANAN = "Narayanan et al. 2021 (SC'21), Table 1"
KORTHIKANTI = "Korthikanti et al. 2022, Table 5"
V1_POST = "Megatron-LM v1.0 post (NVIDIA ADLR, 2020), Table 1"


def _narayanan(label, hidden, heads, layers, tp, pp, gpus, batch, tflops) -> Case:
    return Case(
        label,
        NARAYANAN,
        GptConfig(hidden, heads, layers, 2048),
        batch=batch,
        dp=gpus // (tp * pp),
        tp=tp,
        pp=pp,
        preset="a100-hgx",
        published_tflops_per_gpu=tflops,
    )


def _korthikanti(label, hidden, heads, layers, tp, pp, batch, full_s, present_s) -> list[Case]:
    model = GptConfig(hidden, heads, layers, 2048)
    common = dict(batch=batch, dp=1, tp=tp, pp=pp, preset="a100-hgx", group=label)
    return [
        Case(f"{label}, full recompute", KORTHIKANTI, model, published_step_s=full_s, **common),
        Case(
            f"{label}, selective + SP",
            KORTHIKANTI,
            model,
            published_step_s=present_s,
            recipe=SELECTIVE_SP,
            **common,
        ),
    ]


CASES: tuple[Case, ...] = (
    Case(
        "1.2B, 1 V100",
        V1_POST,
        GptConfig(1536, 16, 40, 1024),
        batch=8,
        dp=1,
        tp=1,
        preset="v100-dgx2",
        microbatch_size=8,
        published_step_s=1.288,
    ),
    _narayanan("1.7B", 2304, 24, 24, 1, 1, 32, 512, 137),
    _narayanan("3.6B", 3072, 32, 30, 2, 1, 64, 512, 138),
    _narayanan("7.5B", 4096, 32, 36, 4, 1, 128, 512, 142),
    _narayanan("18.4B", 6144, 48, 40, 8, 1, 256, 1024, 135),
    _narayanan("39.1B", 8192, 64, 48, 8, 2, 512, 1536, 138),
    _narayanan("76.1B", 10240, 80, 60, 8, 4, 1024, 1792, 140),
    _narayanan("145.6B", 12288, 96, 80, 8, 8, 1536, 2304, 148),
    _narayanan("310.1B", 16384, 128, 96, 8, 16, 1920, 2160, 155),
    _narayanan("529.6B", 20480, 128, 105, 8, 35, 2520, 2520, 163),
    _narayanan("1008.0B", 25600, 160, 128, 8, 64, 3072, 3072, 163),
    *_korthikanti("22B", 6144, 64, 48, 8, 1, 4, 1.42, 1.10),
    *_korthikanti("175B", 12288, 96, 96, 8, 8, 64, 18.13, 13.75),
    *_korthikanti("530B", 20480, 128, 105, 8, 35, 280, 49.05, 37.83),
    *_korthikanti("1T", 25600, 160, 128, 8, 64, 512, 94.42, 71.49),
)

QUICK_BUILD_SIZE = 2500  # layers x microbatches: the 39.1B row (48 x 48) and smaller


def table_markdown(rows: Sequence[Row]) -> str:
    """The rows as a markdown table, then MAPE per source and overall, then ranking."""
    lines = [
        "| row | source | GPUs | published s | simulated s | error | TFLOP/s per GPU: "
        "published | simulated | device 0: matmul / attention softmax / other / exposed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.case
        shares = [r.matmul_s, r.attention_elementwise_s, r.other_compute_s, r.exposed_s]
        split = " / ".join(f"{s / r.simulated_s:.0%}" for s in shares)
        derived = "" if c.published_step_s is not None else " (from TFLOP/s)"
        lines.append(
            f"| {c.label} | {c.source} | {c.gpus} | {c.published_s:.3f}{derived} "
            f"| {r.simulated_s:.3f} | {r.error:+.1%} | {r.published_tflops_per_gpu:.0f} "
            f"| {r.simulated_tflops_per_gpu:.0f} | {split} |"
        )
    lines.append("")
    by_source: dict[str, list[Row]] = {}
    for r in rows:
        by_source.setdefault(r.case.source, []).append(r)
    for source, members in by_source.items():
        lines.append(f"- {source}: MAPE {mape(members):.1%} over {len(members)} rows")
    lines.append(f"MAPE over {len(rows)} rows: {mape(rows):.1%}")
    groups = ranking(rows)
    if groups:
        right = sum(g[3] for g in groups)
        lines.append(
            f"Ranking within {len(groups)} groups: fastest predicted in {right} of "
            f"{len(groups)}; Spearman "
            + ", ".join(f"{name} {rho:+.2f}" for name, _, rho, _ in groups)
        )
    return "\n".join(lines)


def fit_report(rows: Sequence[Row]) -> str:
    """The efficiency model fitted to ``rows`` (ir.calibrate): held-out errors first."""
    by_preset: dict[str, list[Row]] = {}
    for r in rows:
        by_preset.setdefault(r.case.preset, []).append(r)
    parts = []
    for preset, members in by_preset.items():
        if len(members) < 2:
            continue
        measured = [
            ir.Measurement(r.case.label, r.program, r.case.published_s, group=r.case.group)
            for r in members
            if r.program is not None
        ]
        fit = ir.calibrate(measured, preset=preset)
        parts.append(f"### {preset} ({len(measured)} rows)\n\n{fit.table()}")
    return "\n\n".join(parts)


def _rows(cases: Sequence[Case], jobs: int, *, keep: bool) -> Iterator[tuple[Case, Row]]:
    """Each case with its row as it is done: one process per row, ``jobs`` at once (the
    largest rows first, so that the pool ends together), or here, in order, when
    ``keep`` or one job."""
    if keep or jobs <= 1 or len(cases) <= 1:
        for case in cases:
            yield case, run_case(case, keep=keep)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(cases, key=lambda c: -c.build_size)
    context = multiprocessing.get_context("spawn")  # a clean interpreter per worker
    with ProcessPoolExecutor(min(jobs, len(cases)), mp_context=context) as pool:
        futures = {pool.submit(run_case, case): case for case in order}
        for future in as_completed(futures):
            yield futures[future], future.result()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="labels of the rows to run (default: all)")
    parser.add_argument("--sources", nargs="*", help="run only rows whose source starts so")
    parser.add_argument("--quick", action="store_true", help="skip the largest pipelines")
    parser.add_argument("--microbatch-size", type=int, default=None)
    parser.add_argument("--fit", action="store_true", help="fit the efficiency model, LOO")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="rows built and simulated at once, a process each (default: the CPUs; "
        "--fit keeps the programs and runs one at a time)",
    )
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.rows or c.label in args.rows]
    if args.sources:
        cases = [c for c in cases if any(c.source.startswith(s) for s in args.sources)]
    if args.microbatch_size is not None:
        cases = [replace(c, microbatch_size=args.microbatch_size) for c in cases]
    if args.quick:
        skipped = [c.label for c in cases if c.build_size > QUICK_BUILD_SIZE]
        cases = [c for c in cases if c.build_size <= QUICK_BUILD_SIZE]
        if skipped:
            print(f"# --quick: skipped {', '.join(skipped)}")
    rows = []
    started = time.perf_counter()
    for case, row in _rows(cases, args.jobs, keep=args.fit):
        rows.append(row)
        print(
            f"# {case.label}: {case.model.params / 1e9:.1f}B weights, {case.gpus} GPUs, "
            f"{case.microbatches} microbatches, build {row.build_s:.1f} s, simulate "
            f"{row.simulate_s:.1f} s, error {row.error:+.1%}",
            flush=True,
        )
    print(f"# all rows: {time.perf_counter() - started:.0f} s")
    rows.sort(key=lambda r: cases.index(r.case))  # the table in the cases' order
    print(table_markdown(rows))
    if args.fit:
        print("\n## Fitted to these rows (held out first; in-sample figures are a fit)\n")
        print(fit_report(rows))
    print(f"\nmedian |error| {statistics.median(abs(r.error) for r in rows):.1%}")


if __name__ == "__main__":
    main()
