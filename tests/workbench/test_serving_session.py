"""The workbench's serving mode without a browser: a strategy and a request mix give the
metrics, a placement clicked on the decode step changes its simulated TPOT, refusals leave
the session as it was, and the payload and the report hold every view."""

from __future__ import annotations

import pytest

import ir
from ir.inference import RequestMix, ServingError
from ir.sharding import Mesh, R, S
from workbench.serving import ServingSession


@pytest.fixture
def session():
    f = ir.models.llama(1, 1024, 512, 8, 1000, 2, kv_heads=4, ffn=1024, dtype="bfloat16")
    return ServingSession(f, ir.Topology.preset("a100-hgx", 4), RequestMix(256, 64, 8))


def test_a_strategy_gives_its_metrics_and_a_bad_one_changes_nothing(session):
    one = session.metrics
    four = session.set_strategy(tp=4).metrics
    assert four.strategy.tp == 4 and four.tpot_s != one.tpot_s
    # a small model: its all-reduces cost more than the bytes tensor parallelism saves
    assert four.decode_floor_s < one.decode_floor_s
    with pytest.raises(ServingError, match="does not divide the 4 key/value heads"):
        session.set_strategy(tp=3)
    assert session.strategy.tp == 4
    session.set_mix(batch=16)
    assert session.metrics.mix.batch == 16 and session.metrics.tpot_s > four.tpot_s


def test_a_placement_clicked_on_the_decode_step_changes_its_tpot(session):
    session.set_strategy(tp=4)
    base = session.annotated()
    assert base.tpot_s == pytest.approx(session.metrics.tpot_s, rel=0.1)  # the same strategy
    whole = session.annotate("h0_mlp_w_gate", (Mesh((4,)), [R]))  # every GPU reads it all
    assert whole.tpot_s > base.tpot_s
    assert whole.annotations["h0_mlp_w_gate"][1] == [R]
    back = session.annotate("h0_mlp_w_gate", (Mesh((4,)), [S(1)]))
    assert back.tpot_s == pytest.approx(base.tpot_s)
    with pytest.raises(ir.DistIRError, match="past_key_0"):
        session.annotate("past_key_0", (Mesh((4,)), [S(7)]))  # the cache has 4 axes
    assert session.annotated().tpot_s == pytest.approx(base.tpot_s)


def test_the_payload_and_the_report_hold_every_view(session):
    session.set_strategy(tp=2)
    payload = session.payload()
    assert set(payload) == {"summary", "kv_memory", "decode_gantt"}
    traces, layout = payload["decode_gantt"]
    assert "decode step" in layout["title"]["text"] and traces
    html = session.report_html(front=True)
    assert "Serving" in html and html.count("plotly-graph-div") == 3
    assert {m.strategy.label for m in session.front().points} >= {"tp1 x4", "tp2 x2", "tp4"}
