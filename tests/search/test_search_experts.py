"""The search over expert parallelism, context parallelism and ZeRO-3: degrees that cannot
split the model pruned with the reason before anything is built, the rest built and
simulated, and the front of a mixture-of-experts model holding such points."""

from __future__ import annotations

import csv

import pytest

import ir
from ir import transforms
from ir.search import SearchResult, Strategy, search, strategies

MOE = ir.models.gpt(8, 12, 32, 4, 64, 2, experts=4, top_k=2)
H100_8 = ir.Topology.preset("h100-hgx", 8)


@pytest.fixture(scope="module")
def result() -> SearchResult:
    return search(MOE, H100_8, progress=False, pp=1, ep=(1, 2, 8), cp=(1, 2, 4), zero=(0, 3))


def test_the_space_spans_dp_cp_tp_and_ep_inside_dp() -> None:
    space = strategies(8, 8, pp=1, ep=(1, 2, 4), cp=(1, 2))
    assert all(s.dp * s.cp * s.tp * s.pp == 8 and s.dp % s.ep == 0 for s in space)
    assert Strategy(4, 1, 1, ep=4, cp=2) in space
    assert Strategy(2, 2, 1, ep=4, cp=2) not in space  # ep=4 does not divide dp=2
    assert str(Strategy(4, 1, 1, zero=3, ep=4, cp=2)) == "dp4 ep4 cp2 tp1 pp1 m1 1f1b zero3"


def test_degrees_that_cannot_split_the_model_are_pruned_with_the_reason(result) -> None:
    pruned = {str(r.strategy): r.error for r in result.rows if r.status == "pruned"}
    assert pruned["dp8 ep8 tp1 pp1 m1 1f1b"] == "ep=8 does not divide the 4 experts"
    assert pruned["dp2 cp4 tp1 pp1 m1 1f1b"].startswith(
        "cp=4 cuts each sequence into 2 x cp = 8 chunks, which 12 tokens"
    )
    dense = ir.models.gpt(8, 12, 32, 4, 64, 1)
    rows = search(dense, H100_8, progress=False, dp=8, tp=1, pp=1, ep=(1, 2)).rows
    assert {r.error for r in rows if r.strategy.ep == 2} == {
        "ep=2 needs a mixture-of-experts model"
    }


def test_expert_context_and_zero3_rows_are_what_simulating_them_gives(result) -> None:
    t = transforms.training(MOE, "adam")
    picked = [
        r
        for r in result.simulated()
        if (r.strategy.ep, r.strategy.cp, r.strategy.zero) in ((2, 1, 0), (1, 2, 0), (2, 2, 3))
    ]
    assert len(picked) >= 3 and all(r.status == "ok" for r in picked)
    for row in picked:
        r = ir.simulate(row.strategy.build(t, H100_8), H100_8)
        assert row.step_time_s == pytest.approx(r.step_time_s)
        assert row.peak_memory_bytes == max(r.peak_memory_bytes.values())


def test_the_front_holds_expert_context_or_zero3_points(result) -> None:
    front = result.pareto()
    assert front
    assert any(r.strategy.ep > 1 or r.strategy.cp > 1 or r.strategy.zero == 3 for r in front)
    # ZeRO-3 splits the weights and optimizer state over the replicas: the least memory
    least = min(result.simulated(), key=lambda r: r.peak_memory_bytes)
    assert least.strategy.zero == 3 or least.strategy.cp > 1 or least.strategy.ep > 1


def test_a_result_written_before_ep_and_cp_existed_reads_them_as_one(tmp_path, result) -> None:
    with open(result.to_csv(tmp_path / "new.csv"), newline="") as f:
        records = [r for r in csv.DictReader(f) if r["ep"] == r["cp"] == "1"]
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as f:
        columns = [c for c in records[0] if c not in ("ep", "cp")]
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    back = SearchResult.from_csv(old)
    assert len(back.rows) == len(records)
    assert all(r.strategy.ep == r.strategy.cp == 1 for r in back.rows)
    plain = [r for r in result.rows if r.strategy.ep == r.strategy.cp == 1]
    assert [str(r.strategy) for r in back.rows] == [str(r.strategy) for r in plain]
