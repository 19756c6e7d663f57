"""benchmarks/accuracy.py: its FLOP count, its recomputation, its rows and its MAPE."""

from __future__ import annotations

import doctest
import importlib.util
import sys
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
    _, matrix = acc.counted_flops(acc.training_step(m, BATCH, recompute=False))
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


def test_one_matrix_efficiency_slows_matmuls_and_nothing_else(acc):
    # wide enough that the matmuls are compute-bound; launch overheads do not scale
    wide = acc.GptConfig(hidden=2048, heads=16, layers=1, seq=512, vocab=1024)
    case = small_case(acc, model=wide, batch=8)
    full, half = acc.run_case(case), acc.run_case(case, 0.5)
    assert 1.8 * full.matmul_s < half.matmul_s <= 2 * full.matmul_s
    assert half.attention_elementwise_s == pytest.approx(full.attention_elementwise_s)
    assert full.simulated_s < half.simulated_s < 2 * full.simulated_s
    with pytest.raises(ValueError, match="matrix_efficiency"):
        acc.derated(ir.Topology.preset("a100-hgx", 2), 1.5)


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
