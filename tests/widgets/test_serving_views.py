"""The serving views as data: the KV-cache memory curve is the metrics' closed form point by
point, the front's traces are the front, the SLA and the best point are where they belong."""

from __future__ import annotations

import pytest

import ir
from ir.inference import RequestMix, ServingStrategy, serving_front, serving_metrics
from widgets.serving import front_spec, kv_memory_spec, summary_html, summary_rows

GB = 1e9


@pytest.fixture(scope="module")
def model():
    return ir.models.llama(1, 2048, 512, 8, 1000, 4, kv_heads=4, ffn=1024, dtype="bfloat16")


def test_the_memory_curve_is_the_closed_form_at_every_context(model):
    m = serving_metrics(
        model, ir.Topology.preset("a100-hgx", 2), ServingStrategy(2), RequestMix(512, 128, 16)
    )
    traces, layout = kv_memory_spec(m, contexts=[16, 640, 2048])
    by = {t["meta"]["kind"]: t for t in traces}
    mem = max(m.memory.values(), key=lambda d: d.weights_bytes)
    for x, kv, most in zip(by["kv"]["x"], by["kv"]["y"], by["max_batch"]["y"]):
        assert kv == pytest.approx(
            (mem.weights_bytes + 16 * m.rounded(x) * mem.kv_bytes_per_token) / GB
        )
        assert most == m.max_batch(x)
    assert by["usable"]["y"] == [mem.capacity_bytes / GB] * 2
    assert by["max_batch"]["yaxis"] == "y2" and layout["yaxis2"]["overlaying"] == "y"
    assert by["max_batch"]["y"][0] > by["max_batch"]["y"][-1]  # longer contexts, fewer sequences


def test_the_front_view_draws_the_front_the_sla_and_the_best_point(model):
    front = serving_front(
        model, ir.Topology.preset("a100-hgx", 2), RequestMix(256, 64), batches=(1, 16)
    )
    front.sla_tpot_s = sorted(m.tpot_s for m in front.points)[-2]
    traces, layout = front_spec(front)
    strategies = [t for t in traces if t["meta"]["kind"] == "strategy"]
    assert {t["name"] for t in strategies} == {m.strategy.label for m in front.points}
    assert sum(len(t["x"]) for t in strategies) == len(front.points)
    (line,) = [t for t in traces if t["meta"]["kind"] == "front"]
    assert line["x"] == [m.tpot_s * 1e3 for m in front.pareto()]
    (best,) = [t for t in traces if t["meta"]["kind"] == "best"]
    assert (best["meta"]["strategy"], best["meta"]["batch"]) == (
        front.best().strategy.label, front.best().mix.batch,
    )  # fmt: skip
    assert layout["shapes"][0]["x0"] == pytest.approx(front.sla_tpot_s * 1e3)
    assert best["x"][0] <= front.sla_tpot_s * 1e3


def test_the_summary_says_the_figures(model):
    m = serving_metrics(
        model, ir.Topology.preset("h100-hgx", 1), ServingStrategy(1), RequestMix(128, 16, 4)
    )
    rows = dict(summary_rows(m))
    assert rows["time to first token"] == f"{m.ttft_s * 1e3:.1f} ms"
    assert rows["time per output token"].startswith(f"{m.tpot_s * 1e3:.2f} ms (CUDA graphs)")
    assert str(m.max_batch()) in rows["largest batch"]
    assert "<table" in summary_html(m) and "time per output token" in summary_html(m)
