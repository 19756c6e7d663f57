"""The search's two tiers: the closed-form estimator's error against the simulator on every
strategy of small spaces (what justifies its margins), and the two-tier front equal to
the front of simulating everything."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.search import search, search_rows
from ir.search.estimate import (
    MEMORY_MARGIN,
    TIME_MARGIN,
    Estimator,
    optimistic_step_s,
    step_error,
)
from ir.search.space import Strategy

KNOBS = dict(
    microbatches=[1, 2],
    schedules=("1f1b", "interleaved"),
    chunks=(1, 2),
    zero=(0, 1),
    sequence_parallel=(False, True),
    recompute=(False, True),
)
CASES = {
    "mlp": (models.mlp(256, 512, 512, 256, layers=8), "sgd"),
    "gpt": (models.gpt(batch=16, seq=64, hidden=128, heads=8, vocab=256, layers=4), "adam"),
}


def _exhaustive(name: str, ideal: bool) -> tuple[ir.search.SearchResult, ir.Topology]:
    model, optimizer = CASES[name]
    topology = ir.Topology.preset("a100-hgx", 8, ideal=ideal)
    result = search(model, topology, optimizer=optimizer, simulate="all", progress=False, **KNOBS)
    return result, topology


@pytest.fixture(scope="module", params=[("mlp", False), ("gpt", False), ("gpt", True)])
def exhaustive(request):
    name, ideal = request.param
    result, topology = _exhaustive(name, ideal)
    return name, ideal, result, topology


def test_the_estimates_exceed_the_simulation_by_less_than_the_margins(exhaustive) -> None:
    """Every strategy simulated and estimated: the estimate may be below the simulation
    (it leaves out what the event simulation adds), never above by more than the margins
    the search makes its estimates optimistic by. The busiest device's compute, which
    the step time's margin leaves as it is, is never above the simulated step.

    Measured (116 strategies each, interleaving with one pipeline rank now pruned; before
    164; estimate / simulation, the step-time error on what the estimate adds to the
    compute, the peak's): MLP 0.86-1.14 (median 0.93), 27 %, -36 %..+6 %; GPT 0.84-1.10
    (0.91), 14 %, -26 %..+3 %; GPT on the ideal roofline 0.92-1.18 (1.00), 60 %,
    -26 %..+3 %. Before the pipelines' exchanges (single ratio):
    MLP 0.80-1.27, GPT 0.82-1.28, ideal 0.95-1.18. Before the peak's sums met one
    microbatch fewer where no forward follows the first backward: peaks up to +15 %
    (MLP), +24 % (GPT), +17 % (ideal)."""
    name, _, result, topology = exhaustive
    model, optimizer = CASES[name]
    t = transforms.training(model, optimizer)
    rows = [r for r in result.rows if r.status in ("ok", "over capacity")]
    assert len(rows) > 40
    est = Estimator(t, topology, 16 if name == "gpt" else 256, [r.strategy for r in rows])
    e = est.estimate([r.strategy for r in rows])
    assert e.known.mean() > 0.8  # the estimator covers nearly all of the space
    simulated = np.array([r.step_time_s for r in rows])[e.known]
    busy = e.busy_s[e.known]
    assert (busy <= simulated).all()
    over_t = step_error(e.step_time_s[e.known], busy, simulated)
    assert (optimistic_step_s(e.step_time_s[e.known], busy, TIME_MARGIN) < simulated).all()
    peaks = np.array([r.peak_memory_bytes for r in rows])[e.known]
    over_m = e.peak_memory_bytes[e.known] / peaks - 1
    assert over_t.max() < TIME_MARGIN, f"step time {over_t.max():.1%} over"
    assert over_m.max() < MEMORY_MARGIN, f"peak memory {over_m.max():.1%} over"
    # the longest chain is a floor under every simulated step
    floors = np.array([est.bound_s(r.strategy) for r in rows])
    steps = np.array([r.step_time_s for r in rows])
    assert (floors <= steps).all(), max(floors / steps)
    # what must be live at once is a floor under every simulated peak, and not an empty one
    least = np.array([est.peak_floor_bytes(r.strategy) for r in rows])
    all_peaks = np.array([r.peak_memory_bytes for r in rows])
    assert (least <= all_peaks).all(), max(least / all_peaks)
    assert np.median((least / all_peaks)[e.known]) > 0.5, np.median(least / all_peaks)


def test_the_longest_chain_spares_simulations_and_keeps_the_fastest(monkeypatch) -> None:
    """A GPT of 1.3B's layer shape on 16 A100s: with the chains' floors the fastest
    strategy is proven with fewer simulations than with the estimate's margin alone
    (measured: 1 against 2; the front 58 against 70), and it is the same strategy."""
    f = models.gpt(32, 1024, 2048, 16, 51200, 8, dtype="bfloat16")
    topology = ir.Topology.preset("a100-hgx", 16)
    knobs = dict(microbatches=[1, 2, 4, 8], zero=(0, 1), sequence_parallel=(False, True))
    simulated = lambda r: r.status in ("ok", "over capacity")  # noqa: E731
    (with_floor, n_floor), (margin_only, n_margin) = _fastest_with_and_without(
        monkeypatch, f, topology, knobs, "bound_s", simulated
    )
    assert any("longest chain" in (r.error or "") for r in with_floor.rows)
    assert n_floor < n_margin
    a, b = with_floor.best(), margin_only.best()
    assert (a.strategy, a.step_time_s) == (b.strategy, b.step_time_s)


def _fastest_with_and_without(monkeypatch, f, topology, knobs, floor: str, counted) -> tuple:
    """``simulate="fastest"`` searches of ``f`` with the estimator's ``floor`` method and
    with it returning 0: each result and how many of its rows ``counted`` keeps."""

    def fastest():
        r = search(f, topology, optimizer="adam", progress=False, simulate="fastest", **knobs)
        return r, sum(counted(x) for x in r.rows)

    with_floor = fastest()
    monkeypatch.setattr(Estimator, floor, lambda self, s: 0.0)
    return with_floor, fastest()


def test_what_must_be_live_at_once_spares_simulations_over_capacity(monkeypatch) -> None:
    """GPT-3's layer (hidden 12288, 96 heads, sequence 2048, bfloat16, Adam), 16 layers
    on 16 A100s, where many strategies' estimates sit just over the devices' 80 GB: the
    memory margin (the estimate may exceed the simulation by up to it) leaves them to
    simulate, and the simulation finds them over capacity. What their schedules must
    hold at once (``Estimator.peak_floor_bytes``) is already over for most: measured 1
    simulated over capacity against 6 (6 simulations against 11), the same fastest."""
    f = models.gpt(
        batch=64, seq=2048, hidden=12288, heads=96, vocab=51200, layers=16, dtype="bfloat16"
    )
    topology = ir.Topology.preset("a100-hgx", 16)
    knobs = dict(
        microbatches=[2, 4, 8, 16, 32], schedules=("1f1b", "interleaved"), chunks=(1, 2),
        zero=(0, 1), sequence_parallel=(False, True), recompute=(False, True),
    )  # fmt: skip
    over = lambda r: r.status == "over capacity"  # noqa: E731
    (with_floor, over_floor), (margin_only, over_margin) = _fastest_with_and_without(
        monkeypatch, f, topology, knobs, "peak_floor_bytes", over
    )
    assert any("live at once" in (r.error or "") for r in with_floor.rows)
    assert over_floor < over_margin
    a, b = with_floor.best(), margin_only.best()
    assert (a.strategy, a.step_time_s, a.peak_memory_bytes) == (
        b.strategy,
        b.step_time_s,
        b.peak_memory_bytes,
    )


def _front(result: ir.search.SearchResult) -> list[tuple]:
    return [(str(r.strategy), r.step_time_s, r.peak_memory_bytes) for r in result.pareto()]


def test_the_peak_estimate_holds_from_the_warm_up_to_the_steady_state() -> None:
    """The peak through the regimes of the schedules: every forward before the first
    backward (1F1B and interleaving with few microbatches: the gradient sums meet one
    microbatch fewer in flight, the interleaved chunks' sums appearing ``pp`` backwards
    apart) and a steady state (the flight refilled after each backward); GPipe, which
    the search prunes (1F1B's time in less memory), is not searched. Measured on this
    space (133 strategies): -7 %..+5 % (before the sums' timing: up to +24 %, dp4 pp2
    m2 ZeRO-1, 1F1B or interleaved)."""
    model, optimizer = CASES["gpt"]
    topology = ir.Topology.preset("a100-hgx", 8)
    space = dict(
        microbatches=[1, 2, 4, 8],
        schedules=("1f1b", "interleaved"),
        chunks=(1, 2),
        zero=(0, 1, 2),
    )
    result = search(model, topology, optimizer=optimizer, simulate="all", progress=False, **space)
    rows = [r for r in result.rows if r.status in ("ok", "over capacity")]
    assert len(rows) > 100 and {r.strategy.schedule for r in rows} == set(space["schedules"])
    t = transforms.training(model, optimizer)
    e = Estimator(t, topology, 16, [r.strategy for r in rows]).estimate([r.strategy for r in rows])
    peaks = np.array([r.peak_memory_bytes for r in rows])[e.known]
    over = e.peak_memory_bytes[e.known] / peaks - 1
    assert e.known.mean() > 0.8
    assert over.max() < 0.1 < MEMORY_MARGIN, f"peak memory {over.max():.1%} over"


def test_the_two_tier_front_is_the_front_of_simulating_everything(exhaustive) -> None:
    name, _, full, topology = exhaustive
    model, optimizer = CASES[name]
    seen = []
    two = search(model, topology, optimizer=optimizer, progress=False, on_row=seen.append, **KNOBS)
    assert _front(two) == _front(full)
    statuses = [r.status for r in two.rows if r.status != "pruned"]
    assert statuses.count("estimated") > 0  # some were never simulated (more in big spaces)
    assert len(seen) == len(two.rows)  # every row was streamed as it was decided
    simulated = [r for r in two.rows if r.status in ("ok", "over capacity")]
    for r in simulated:  # both figures side by side
        twin = next(x for x in full.rows if x.strategy == r.strategy)
        assert r.step_time_s == twin.step_time_s
        assert r.peak_memory_bytes == twin.peak_memory_bytes
    assert sum(not math.isnan(r.estimated_step_time_s) for r in simulated) > len(simulated) / 2
    for r in two.rows:
        if r.status == "estimated":
            assert r.error and not math.isnan(r.estimated_step_time_s)


def test_the_fastest_mode_finds_the_fastest_of_simulating_everything(exhaustive) -> None:
    name, _, full, topology = exhaustive
    model, optimizer = CASES[name]
    fastest = search(
        model, topology, optimizer=optimizer, progress=False, simulate="fastest", **KNOBS
    )
    front = search(model, topology, optimizer=optimizer, progress=False, **KNOBS)
    best, truth = fastest.best(), full.best()
    assert (best.strategy, best.step_time_s, best.peak_memory_bytes) == (
        truth.strategy,
        truth.step_time_s,
        truth.peak_memory_bytes,
    )

    def simulated(result):
        return sum(r.status in ("ok", "over capacity") for r in result.rows)

    assert simulated(fastest) < simulated(front)  # the front's slower, leaner points not
    left = [r for r in fastest.rows if r.status == "estimated"]
    assert left and all("faster" in r.error or "GiB" in r.error for r in left)


def test_rows_stream_in_the_order_the_search_decides_them() -> None:
    model, optimizer = CASES["mlp"]
    topology = ir.Topology.preset("a100-hgx", 4)
    rows = list(search_rows(model, topology, optimizer=optimizer, microbatches=[1, 2]))
    decided = [r for r in rows if r.status != "pruned"]
    first_ok = next(i for i, r in enumerate(decided) if r.ok)
    assert decided[first_ok].step_time_s == min(r.step_time_s for r in decided if r.ok) or any(
        r.ok for r in decided
    )
    full = search(model, topology, optimizer=optimizer, microbatches=[1, 2], progress=False)
    assert {str(r.strategy) for r in rows} == {str(r.strategy) for r in full.rows}


def test_the_peak_memory_estimate_scales_the_split_steps_own_ops_with_the_microbatch() -> None:
    """Issue 24: ops only the tensor-split step has (the vocabulary-parallel embedding
    and loss) kept the reference microbatch's rows at every microbatch size, so a large
    vocabulary's logits made the estimated peak several times the simulated one (GPT-3
    on 1,024 GPUs: 106 GiB estimated, 37 GiB simulated). On a space where the logits
    dominate, with interleaving, recomputation, sequence parallelism and ZeRO, no
    estimate exceeds its simulation by more than the memory margin."""
    model = models.gpt(batch=64, seq=64, hidden=64, heads=4, vocab=4096, layers=4)
    topology = ir.Topology.preset("a100-hgx", 16)
    space = dict(
        dp=(2, 4), tp=(2, 4), pp=2, microbatches=[2, 4, 8], schedules=("1f1b", "interleaved"),
        chunks=(1, 2), zero=(0, 2), sequence_parallel=(False, True), recompute=(False, True),
    )  # fmt: skip
    result = search(model, topology, simulate="all", progress=False, **space)
    rows = [r for r in result.rows if r.status in ("ok", "over capacity")]
    assert len(rows) >= 24
    assert any(r.strategy.chunks > 1 and r.strategy.recompute and r.strategy.zero for r in rows)
    peaks = np.array([r.peak_memory_bytes for r in rows])
    strategies = [r.strategy for r in rows]
    assert {s.tp for s in strategies} == {2, 4}  # tp 4 scaled from the analysis at tp 2
    e = Estimator(transforms.training(model, "adam"), topology, 64, strategies)
    e = e.estimate(strategies)
    assert e.known.all()
    error = e.peak_memory_bytes / peaks - 1
    # measured: -12.4 % to -0.2 % on these 96 (before the fix: +31 % to +70 %)
    assert error.max() < 0.05, f"peak memory {error.max():.1%} over"
    assert error.min() > -0.25, f"peak memory {-error.min():.1%} under"


def test_gpt3_shaped_pipelines_interleaved_and_zero2_are_estimated_within_a_tenth() -> None:
    """Issue 24: on GPT-3 175B on 1,024 A100s the estimator ranked deeply interleaved
    strategies fastest and the simulator gave them 0.36-0.87 of it. GPT-3's layer (hidden
    12288, 96 heads, sequence 2048, bfloat16, Adam) at tp 8 x pp 4 on 64 A100s, 16
    layers, sequence parallel: 1F1B and interleaved over 2 and 4 chunks, ZeRO 0 and 2.
    Measured, estimate / simulation: 1.01-1.07 (before the pipelines' exchanges and
    ZeRO-2's per-microbatch reductions: interleaved v4 0.84-0.94, ZeRO-2 0.61-0.79;
    the simulator had v4 slower than v2); the estimate's compute equal to the simulated
    busiest device's, and both rank the schedules alike (v4 < v2 < 1F1B)."""
    f = models.gpt(
        batch=32, seq=2048, hidden=12288, heads=96, vocab=51200, layers=16, dtype="bfloat16"
    )
    t = transforms.training(f, "adam")
    topology = ir.Topology.preset("a100-hgx", 64)
    strategies = [
        Strategy(2, 8, 4, m, "interleaved" if v > 1 else "1f1b", v, zero, True)
        for m in (8, 16)
        for v in (1, 2, 4)
        for zero in (0, 2)
    ]
    model = Estimator(t, topology, 32, strategies)
    e = model.estimate(strategies)
    assert e.known.all()
    steps, busiest = [], []
    for s in strategies:
        r = ir.simulate(s.build(t, topology), topology)
        steps.append(r.step_time_s)
        busiest.append(max(r.busy_s.values()))
    ratio = e.step_time_s / np.array(steps)
    assert ratio.min() > 0.95 and ratio.max() < 1.12, ratio
    assert np.allclose(e.busy_s, busiest, rtol=1e-3)
    # the longest chain (compute, the tensor-parallel collectives it waits for, the fill
    # and drain) is below every step and above the compute alone
    floor = np.array([model.bound_s(s) for s in strategies]) / np.array(steps)
    assert floor.max() <= 1.0 and (floor > e.busy_s / np.array(steps)).all(), floor
    for m in (8, 16):
        for zero in (0, 2):
            by_v = {
                s.chunks: i
                for i, s in enumerate(strategies)
                if (s.microbatches, s.zero) == (m, zero)
            }
            order = sorted(by_v, key=lambda v: steps[by_v[v]])
            assert order == sorted(by_v, key=lambda v: e.step_time_s[by_v[v]]) == [4, 2, 1]


def test_a_host_running_ahead_issues_while_the_collectives_run() -> None:
    """A stage's time was its device's ops or its host's issue, whichever is longer, plus
    its collectives; but the host runs ahead of the device through the collectives (the
    simulator's does, as CUDA's does), so where the microbatches are small the estimate
    counted the host's issue and the collectives' waits one after the other. Found out of
    sample (``bench_estimator_error.py --seed 1129``: GPT of 1.3B's layer shape on 16
    A100s, dp 2 x tp 8, 8 microbatches of 2 sequences, estimated at 1.19 times its
    simulation, its step error above the compute +51 %; with ZeRO-2, +82 %, past the
    margin). Now the longer of the device's ops with their collectives and the host's
    issue: 0.98-1.03 here. Seed 1130, drawn after the change, the largest step error above
    the compute per preset: h100-hgx +41 % -> +11 %, a100-pcie +51 % -> +30 %, a100-hgx
    +68 % -> +61 % (ZeRO-2's per-microbatch reductions, left as they are)."""
    f = models.gpt(32, 1024, 2048, 16, 51200, 8, dtype="bfloat16")
    t = transforms.training(f, "adam")
    topology = ir.Topology.preset("a100-hgx", 16)
    strategies = [Strategy(2, 8, 1, m, zero=z) for m in (1, 4, 8) for z in (0, 1)]
    e = Estimator(t, topology, 32, strategies).estimate(strategies)
    simulated = [ir.simulate(s.build(t, topology), topology).step_time_s for s in strategies]
    ratio = e.step_time_s / np.array(simulated)
    assert ratio.min() > 0.95 and ratio.max() < 1.05, ratio


def test_reductions_outlasting_the_last_backward_are_counted_once() -> None:
    """Where a stage's data-parallel reductions outlast its last backward, the estimate
    counted the excess and then the largest reduction again, and overlapped them with the
    last backward less its gradient sums. Found by execution: an MLP whose one large
    weight's all-reduce is most of the step was estimated at 1.50 and 1.36 times its
    simulation (dp 8; dp 4 x tp 2), a MoE GPT's dp 4 steps at 1.09, so the two-tier
    search skipped its fastest strategy (dp 4, 2 microbatches: 1.598 ms simulated,
    1.739 ms estimated, 1.677 ms even 75 % lower) for one it simulated at 1.651 ms: the
    front and ``best()`` lost it. Now 0.96-1.01."""
    mlp = transforms.training(models.mlp(32, 256, 256, 8, layers=2), "sgd")
    moe = models.gpt(batch=16, seq=64, hidden=128, heads=4, vocab=256, layers=2, experts=4)
    pcie, dgx1 = (
        ir.Topology.preset(n, d, ideal=True) for n, d in (("v100-pcie", 8), ("v100-dgx1", 4))
    )
    cases = [
        (mlp, pcie, 32, [Strategy(8, 1, 1), Strategy(4, 2, 1)]),
        (transforms.training(moe, "adam"), dgx1, 16, [Strategy(4, 1, 1, 1), Strategy(4, 1, 1, 2)]),
    ]
    for t, topology, batch, strategies in cases:
        e = Estimator(t, topology, batch, strategies).estimate(strategies)
        simulated = [ir.simulate(s.build(t, topology), topology).step_time_s for s in strategies]
        ratio = e.step_time_s / np.array(simulated)
        assert ratio.min() > 0.9 and ratio.max() < 1.03, ratio
    space = dict(dp=(1, 4), tp=(1, 2), pp=(1, 2), microbatches=2)
    full = search(moe, dgx1, simulate="all", progress=False, **space)
    two = search(moe, dgx1, progress=False, **space)
    assert _front(two) == _front(full)
    assert str(two.best().strategy) == "dp4 tp1 pp1 m2 1f1b"


def test_roofline_and_host_synchronising_topologies_start_from_the_wider_margin() -> None:
    """The estimator's interleaved and tensor-split pipelines on the roofline (ideal
    presets, the cpu preset) were seen 2.45 times over the simulation's part above the
    compute (a review's random spaces), against 1.003 on the efficiency-model presets:
    the search starts from ROOFLINE_TIME_MARGIN there."""
    from ir.search.estimate import ROOFLINE_TIME_MARGIN, time_margin

    assert time_margin(ir.Topology.preset("a100-hgx", 8)) == TIME_MARGIN
    assert time_margin(ir.Topology.preset("a100-hgx", 8, ideal=True)) == ROOFLINE_TIME_MARGIN
    assert time_margin(ir.Topology.preset("cpu", 4)) == ROOFLINE_TIME_MARGIN
    assert ROOFLINE_TIME_MARGIN > 2.45 > TIME_MARGIN


def test_sequence_parallel_layers_keep_their_token_slices_for_the_regather() -> None:
    """Sequence parallelism all-gathers a layer norm's token slices again in the backward
    (Korthikanti et al. 2022, 4.2.2), so the slices live from the forward to the
    backward: the estimator left them out of the activations in flight (the re-gather is
    in the backward's tasks, not the plan's items) and underestimated the peak more the
    more layers a rank holds (GPT-3 175B on 1,024 A100s, no recomputation: 5-8 GiB under,
    which the search then simulated to find over capacity). GPT-3's layer (hidden 12288,
    96 heads, sequence 2048, bfloat16, Adam) at tp 4 x pp 4 on 16 A100s, 8 and 16
    layers, activations ahead of the optimizer's peak. Measured, estimate / simulation:
    0.978-0.995 (before: 0.911-0.995, 0.91-0.93 where the activations set the peak)."""
    topology = ir.Topology.preset("a100-hgx", 16)
    ratios, least = [], []
    for layers in (8, 16):
        f = models.gpt(
            batch=64, seq=2048, hidden=12288, heads=96, vocab=51200, layers=layers,
            dtype="bfloat16",
        )  # fmt: skip
        t = transforms.training(f, "adam")
        strategies = [
            Strategy(1, 4, 4, m, schedule, v, 0, True, False)
            for m in (8, 16)
            for schedule, v in (("1f1b", 1), ("interleaved", 2))
        ]
        model = Estimator(t, topology, 64, strategies)
        e = model.estimate(strategies)
        assert e.known.all()
        for i, s in enumerate(strategies):
            simulated = max(ir.simulate(s.build(t, topology), topology).peak_memory_bytes.values())
            ratios.append(e.peak_memory_bytes[i] / simulated)
            least.append(model.peak_floor_bytes(s) / simulated)
    assert min(ratios) > 0.97 and max(ratios) < 1.02, ratios
    # what must be live at once: below each, and close where the activations dominate
    assert min(least) > 0.9 and max(least) <= 1.0, least


def test_random_strategies_nobody_fitted_stay_within_the_margins() -> None:
    """A fixed random sample of the pruned spaces of three models (an MLP, a small GPT and
    a GPT of 1.3B's layer shape in bfloat16) on two efficiency-model presets, estimated
    and simulated: no estimate exceeds its simulation by more than the margins the
    search makes its estimates optimistic by (benchmarks/bench_estimator_error.py runs
    the larger sample: 1,947 strategies on four presets, step error above the compute
    at most +68 %, peaks at most +7.1 %). Before the interleaved fill and drain counted
    each rank's cycle once, interleaved pipelines on v100-dgx1 reached +110-126 %."""
    import random

    from ir.search import _tensor_problems
    from ir.search.space import ModelFacts, divisors, prune, strategies

    rng = random.Random(11)
    cases = [
        (models.mlp(256, 512, 512, 256, layers=8), "sgd", 256, 8),
        (models.gpt(16, 64, 128, 8, 256, 4), "adam", 16, 8),
        (models.gpt(32, 1024, 2048, 16, 51200, 8, dtype="bfloat16"), "adam", 32, 16),
    ]
    over_t, over_m, floor, least = [], [], [], []
    for preset in ("a100-hgx", "v100-dgx1"):
        for f, optimizer, batch, devices in cases:
            topology = ir.Topology.preset(preset, devices)
            t = transforms.training(f, optimizer)
            space = strategies(
                devices, batch, microbatches=divisors(batch), schedules=("1f1b", "interleaved"),
                chunks=(1, 2), zero=(0, 1, 2), sequence_parallel=(False, True),
                recompute=(False, True),
            )  # fmt: skip
            capacity = min(d.memory_bytes for d in topology.devices)
            pruned = prune(space, ModelFacts.of(t, batch), capacity, _tensor_problems(t, space))
            sample = rng.sample([s for s in space if s not in pruned], 8)
            model = Estimator(t, topology, batch, sample)
            e = model.estimate(sample)
            for i, s in enumerate(sample):
                if not e.known[i]:
                    continue
                r = ir.simulate(s.build(t, topology), topology)
                over_t.append(float(step_error(e.step_time_s[i], e.busy_s[i], r.step_time_s)))
                peak = max(r.peak_memory_bytes.values())
                over_m.append(e.peak_memory_bytes[i] / peak - 1)
                floor.append((model.bound_s(s) / r.step_time_s, s.tp > 1, str(s)))
                least.append((model.peak_floor_bytes(s) / peak, str(s)))
    assert len(over_t) > 35
    assert max(over_t) < TIME_MARGIN, f"step time {max(over_t):.0%} over"
    assert max(over_m) < MEMORY_MARGIN, f"peak memory {max(over_m):.1%} over"
    # the longest chain is a floor: no simulated step below it (on these, up to 0.98 of it)
    assert max(floor)[0] <= 1.0, max(floor)
    # and not an empty one: with tensor parallelism its collectives are on the chains
    assert max(x for x, split, _ in floor if split) > 0.9
    # no simulated peak below what must be live at once
    assert max(least)[0] <= 1.0, max(least)
    assert np.median([x for x, _ in least]) > 0.5, sorted(least)


def test_the_scheduled_floor_places_each_task_after_its_rank_and_its_input() -> None:
    """``_scheduled`` on a two-stage 1F1B pipeline of two microbatches, forward 1 s and
    backward 2 s a task, each depending on its whole neighbour: rank 0 runs F0 F1 B0 B1,
    rank 1 F0 B0 F1 B1; the last backward ends at (m + pp - 1) (f + b) = 9 s, then
    rank 0's optimizer step (0.5 s). Then with transfers, hosts that wait for them, and
    the data-parallel reductions and ZeRO's all-gathers on each rank's communicator."""
    from ir.search.estimate import _scheduled

    z = np.zeros(2)
    span_f, span_b = np.array([1.0, 1.0]), np.array([2.0, 2.0])
    out_f, out_b = np.array([1.0, 0.0]), np.array([0.0, 2.0])  # the value for the next
    on_f, on_b = z, z  # (each value is made at the task's end: no shorter path)
    end_f, end_b = np.array([0.0, 1.0]), np.array([2.0, 0.0])  # from the input's arrival
    chains = (span_f, span_b, out_f, out_b, on_f, on_b, end_f, end_b)
    assert _scheduled("1f1b", 2, 1, 2, chains, np.array([0.5, 0.25])) == 9.5
    # GPipe: both forwards, then both backwards: rank 1's B1 ends at 1 + 1 + 1 + 2 + 2 = 7
    # (its F1 waits for rank 0's second forward), rank 0's B1 at 7 + 2 = 9, the same here
    assert _scheduled("gpipe", 2, 1, 2, chains, np.array([0.5, 0.25])) == 9.5
    # one stage: the tasks back to back
    one = tuple(x[:1] for x in chains)
    assert _scheduled("1f1b", 1, 1, 3, one, np.array([0.0])) == 9.0
    # transfers of 0.5 s each way: every input arrives 0.5 s after it is made, two on
    # the critical path (rank 1's F0, rank 0's B1): 9 + 2 x 0.5, then the optimizer step
    opt = np.array([0.5, 0.25])
    send = np.full((2, 2), 0.5)
    assert _scheduled("1f1b", 2, 1, 2, chains, opt, send) == 10.5
    # hosts that synchronise after transfers: a sender waits for its transfer out too
    # (rank 0's F1 starts at 1.5, rank 1's F1 at 5 after B0's gradient left), 11 s
    assert _scheduled("1f1b", 2, 1, 2, chains, opt, send, True) == 11.0
    # data-parallel reductions of 1 s (stage 0) and 3 s (stage 1), each released when its
    # stage's last backward starts (rank 0 at 7, rank 1 at 5): rank 1 done at 8; then
    # ZeRO's all-gathers after each rank's last task and its reductions: rank 0
    # max(9, 8) + 1, rank 1 max(7, 8) + 2.5
    jobs = (np.array([0, 1]), z, np.array([1.0, 3.0]), z)  # (stage, made, seconds, step)
    assert _scheduled("1f1b", 2, 1, 2, chains, opt, None, False, jobs) == 9.5
    gathers = np.array([1.0, 2.5])
    assert _scheduled("1f1b", 2, 1, 2, chains, opt, None, False, jobs, gathers) == 10.5
    # a microbatch between the first and the last adds its gradients to the sums on its
    # backward's chain (3 s instead of 2): one stage, three microbatches, F B F B' F B
    summing = (np.array([3.0]), np.array([0.0]), np.array([0.0]), np.array([3.0]))
    assert _scheduled("1f1b", 1, 1, 3, one, np.array([0.0]), summing=summing) == 10.0
    # each gradient's reduction released when the last backward (1 s to 3 s) makes it,
    # 0.5 s and 2 s into it, 1 s each on one channel: done at 3 + 1, then an optimizer
    # step (0.25 s) reads it; released both at the backward's start they would end by 3
    jobs = (np.array([0, 0]), np.array([0.5, 2.0]), np.ones(2), np.full(2, 0.25))
    assert _scheduled("1f1b", 1, 1, 1, one, np.array([0.0]), jobs=jobs) == 4.25
    at_start = (np.array([0, 0]), np.zeros(2), np.ones(2), np.zeros(2))
    assert _scheduled("1f1b", 1, 1, 1, one, np.array([0.0]), jobs=at_start) == 3.0


def test_the_gradient_sums_on_the_backward_chains_raise_the_floor_and_keep_it_one(
    monkeypatch,
) -> None:
    """``T.megatron`` adds each microbatch's weight gradients to their sums in the pmap
    body that makes them, on the backward's chain: every microbatch's but the first's
    and the last's, without ZeRO-2 (whose sums follow a reduce-scatter each). With those
    sums on the chains the floor of a GPT whose weights are large beside a microbatch's
    work (hidden 4096, 256 tokens a microbatch) rises by 8-19 % (measured:
    0.57-0.71 of the simulated step without them, 0.68-0.78 with them), and stays under
    the simulated step; on GPT-3 175B's every-knob space on 1,024 GPUs it spares the
    fastest search 11 of its 19 simulations (``docs/search.md``)."""
    f = models.gpt(8, 256, 4096, 32, 512, 4, dtype="bfloat16")
    topology = ir.Topology.preset("a100-hgx", 8)
    t = transforms.training(f, "adam")
    summed = [
        Strategy(1, 2, 4, 8),
        Strategy(1, 2, 4, 8, sequence_parallel=True),
        Strategy(2, 1, 4, 4, zero=1),
        Strategy(1, 2, 2, 8, "interleaved", chunks=2),
    ]
    apart = [Strategy(2, 2, 2, 4, zero=2), Strategy(1, 2, 4, 2)]  # ZeRO-2; no middle one
    with_sums = Estimator(t, topology, 8, summed + apart)
    floors = [with_sums.bound_s(s) for s in summed + apart]
    monkeypatch.setattr(
        Estimator, "_sums", lambda self, tp, sp: np.zeros(len(self._entry(tp, sp)[0].records))
    )
    without = Estimator(t, topology, 8, summed + apart)
    for s, floor in zip(summed + apart, floors, strict=True):
        step = ir.simulate(s.build(t, topology, allow_replication=True), topology).step_time_s
        assert floor <= step, (str(s), floor / step)
        if s in summed:
            assert floor > 1.05 * without.bound_s(s), (str(s), floor, without.bound_s(s))
        else:
            assert floor == without.bound_s(s), str(s)
