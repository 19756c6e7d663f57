"""benchmarks/accuracy.py: its FLOP count, its recomputation, its rows and its MAPE."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import ir

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy.py"


@pytest.fixture(scope="module")
def acc():
    spec = importlib.util.spec_from_file_location("accuracy_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


SMALL = dict(hidden=64, heads=4, layers=2, seq=32, vocab=256)
BATCH = 4


def test_counted_matrix_flops_without_recomputation_are_the_papers_72_formula(acc):
    m = acc.GptConfig(**SMALL)
    plain = replace(acc.MEGATRON_2021, recompute=None)
    _, matrix = acc.counted_flops(acc.training_step(m, BATCH, plain))
    want = acc.model_flops(BATCH, m.seq, m.layers, m.hidden, m.vocab, recompute=False)
    assert matrix == pytest.approx(want, rel=1e-12)


def test_checkpointed_layers_replay_every_product_as_the_papers_96_formula_counts(acc):
    """96 B s l h^2 (...) counts a whole extra forward of every layer. With Megatron-LM's
    hidden dropout after each layer's last projection, its mask is needed by the backward,
    so the transform replays that projection too: every product, as the paper counts."""
    m = acc.GptConfig(**SMALL)
    t = acc.training_step(m, BATCH)
    _, matrix = acc.counted_flops(t)
    want = acc.model_flops(BATCH, m.seq, m.layers, m.hidden, m.vocab)
    assert matrix == pytest.approx(want, rel=1e-12)
    replayed = [op.outputs[0].name for op in t.ops if op.op_type == "MatMul"]
    for i in range(m.layers):
        assert replayed.count(f"h{i}_q") == 2 and replayed.count(f"h{i}_fc") == 2
        assert replayed.count(f"h{i}_proj") == 2


def small_case(acc, **kw):
    fields = dict(
        label="small",
        source="test",
        model=acc.GptConfig(**SMALL),
        batch=BATCH,
        dp=2,
        tp=2,
        preset="a100-hgx",
        published_step_s=1e-3,
    )
    return acc.Case(**{**fields, **kw})


def test_a_small_row_builds_simulates_and_respects_the_roofline(acc):
    case = small_case(acc)
    row = acc.run_case(case)
    # every device does a quarter of the matmuls (half the batch, half of each layer but
    # the replicated logit layer's share), so device 0's matmul time is at least the
    # sequential step's matrix FLOPs / 4 at the float16 matrix peak
    _, matrix = acc.counted_flops(acc.training_step(case.model, case.batch))
    peak = ir.Topology.preset("a100-hgx", 1).peak_flops_for(0, "float16", matrix=True)
    assert row.matmul_s >= matrix / 4 / peak
    busy = row.matmul_s + row.attention_elementwise_s + row.other_compute_s
    assert busy + row.exposed_s == pytest.approx(max(busy, row.simulated_s))
    assert row.error == pytest.approx(row.simulated_s / 1e-3 - 1)


def test_slower_matrix_kernels_slow_matmuls_and_nothing_else(acc):
    # wide and long enough that the matmuls are compute-bound and outlast the host
    wide = acc.GptConfig(hidden=2048, heads=16, layers=1, seq=512, vocab=1024)
    case = small_case(acc, model=wide, batch=16, microbatch_size=8)
    topology = ir.Topology.preset("a100-hgx", case.gpus)
    slow = ir.hardware.EfficiencyFactors(gemm=0.5).apply(topology)
    full, half = acc.run_case(case, topology), acc.run_case(case, slow)
    assert 1.8 * full.matmul_s < half.matmul_s <= 2 * full.matmul_s
    assert half.attention_elementwise_s == pytest.approx(full.attention_elementwise_s)
    assert full.simulated_s < half.simulated_s < 2 * full.simulated_s


def test_every_published_row_is_a_configuration_megatron_builds(acc):
    """Rows are checked without building: their degrees multiply to their GPUs, the batch
    divides into replicas and microbatches, and pipelines have layers for every stage."""
    for c in acc.CASES:
        assert c.dp * c.tp * c.pp == c.gpus and c.batch % (c.dp * c.microbatch_size) == 0
        assert c.model.layers >= c.pp and c.model.hidden % c.model.heads == 0
        assert c.model.heads % c.tp == 0 and c.model.vocab % c.tp == 0
    sources = {c.source for c in acc.CASES}
    assert {acc.NARAYANAN, acc.KORTHIKANTI, acc.V1_POST} <= sources
    assert sum(c.source == acc.NARAYANAN for c in acc.CASES) == 10  # all of Table 1
    assert sum(c.source == acc.KORTHIKANTI for c in acc.CASES) == 8  # all of Table 5


def test_ranking_quality_is_spearman_and_the_fastest_within_each_group(acc):
    a = small_case(acc, label="a", group="g", published_step_s=1.0)
    b = small_case(acc, label="b", group="g", published_step_s=2.0)
    rows = [acc.Row(a, 1.5, 0, 0, 0, 0, 0), acc.Row(b, 1.2, 0, 0, 0, 0, 0)]
    assert acc.ranking(rows) == [("g", 2, -1.0, False)]
    rows = [acc.Row(a, 0.9, 0, 0, 0, 0, 0), acc.Row(b, 2.5, 0, 0, 0, 0, 0)]
    assert acc.ranking(rows) == [("g", 2, 1.0, True)]
    assert "fastest predicted in 1 of 1" in acc.table_markdown(rows)


def test_a_published_throughput_becomes_a_time_by_the_papers_count(acc):
    case = small_case(acc, published_step_s=None, published_tflops_per_gpu=100)
    assert case.published_s == pytest.approx(case.flops / (100e12 * 4))


def test_mape_is_the_mean_of_the_absolute_errors(acc):
    case = small_case(acc, published_step_s=2.0)
    rows = [acc.Row(case, s, 0.0, 0.0, 0.0, 0.0, 0.0) for s in (1.0, 3.0, 2.5)]
    assert [r.error for r in rows] == pytest.approx([-0.5, 0.5, 0.25])
    assert acc.mape(rows) == pytest.approx((0.5 + 0.5 + 0.25) / 3)
    assert "MAPE over 3 rows: 41.7%" in acc.table_markdown(rows)
    with pytest.raises(ValueError):
        acc.mape([])


def test_the_scripts_docstring_examples_run(acc):
    assert doctest.testmod(acc).failed == 0
