"""Strategy search: the space, its pruning, the rows against direct simulation, the Pareto
front, and the CSV the results are kept in."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import ir
from ir import models, transforms
from ir.search import SearchError, SearchResult, Strategy, search, strategies
from ir.search.result import Row
from ir.search.tiers import batches, shares, work

MLP = models.mlp(64, 32, 32, 8, layers=4)
GPT = models.gpt(batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2)
A100_8 = ir.Topology.preset("a100-hgx", 8)


@pytest.fixture(scope="module")
def gpt_result() -> SearchResult:
    return search(GPT, A100_8, progress=False, zero=(0, 1), sequence_parallel=(False, True))


def test_the_space_is_every_split_of_the_devices() -> None:
    space = strategies(16, 8192, microbatches=None)
    assert all(s.dp * s.tp * s.pp == 16 for s in space)
    degrees = {(s.dp, s.tp, s.pp) for s in space}
    assert len(degrees) == 15  # ordered factorisations of 2^4 into three
    # the benchmark space: microbatches {2, 8, 32} when pp > 1
    bench = [
        s
        for d in ((dp, tp, 16 // (dp * tp)) for dp in (1, 2, 4, 8, 16) for tp in (1, 2, 4, 8, 16))
        if 16 % (d[0] * d[1]) == 0
        for s in strategies(16, 8192, dp=d[0], tp=d[1], pp=d[2], microbatches=[2, 8, 32])
        if s.pp > 1 or s.microbatches == 2
    ]
    assert len(bench) == 5 + 10 * 3


def test_rows_are_what_simulating_the_strategy_gives(gpt_result) -> None:
    t = transforms.training(GPT, "adam")
    for row in gpt_result.simulated()[:3] + gpt_result.pareto()[-2:]:
        r = ir.simulate(row.strategy.build(t, A100_8), A100_8)
        assert row.step_time_s == r.step_time_s
        assert row.peak_memory_bytes == max(r.peak_memory_bytes.values())
        assert row.samples_per_s == pytest.approx(8 / r.step_time_s)
        assert row.tokens_per_s == pytest.approx(8 * 16 / r.step_time_s)
        assert 0 < row.mfu < 1 and 0 <= row.bubble < 1 and row.exposed_comm_s >= 0


def test_the_pareto_front_is_the_non_dominated_rows(gpt_result) -> None:
    front = gpt_result.pareto()
    ok = gpt_result.simulated()
    assert front and front[0] == gpt_result.best() == ok[0]
    for a in front:  # nothing beats a front row in both figures
        assert not any(
            b.step_time_s <= a.step_time_s
            and b.peak_memory_bytes <= a.peak_memory_bytes
            and (b.step_time_s, b.peak_memory_bytes) != (a.step_time_s, a.peak_memory_bytes)
            for b in ok
        )
    for b in ok:  # every other row is dominated by (or equal to) a front row
        assert any(
            a.step_time_s <= b.step_time_s and a.peak_memory_bytes <= b.peak_memory_bytes
            for a in front
        )


def test_pruning_says_why_before_building(gpt_result) -> None:
    pruned = {str(r.strategy): r.error for r in gpt_result.rows if r.status == "pruned"}
    assert pruned["dp8 tp1 pp1 m1 1f1b sp"].startswith("sequence parallelism with one")
    assert pruned["dp1 tp4 pp2 m2 1f1b zero1"].startswith("ZeRO with one replica")
    assert "degree 8 does not divide the 4 attention heads" in pruned["dp1 tp8 pp1 m1 1f1b"]
    space = strategies(8, 8, dp=8, tp=1, pp=1, microbatches=[1, 2])
    result = search(GPT, A100_8, progress=False, dp=8, tp=1, pp=1, microbatches=[1, 2])
    assert [r.status for r in result.rows] == ["ok", "pruned"]
    assert "does not split" in result.rows[1].error
    assert len(space) == 2


def test_state_that_cannot_fit_is_pruned_by_the_lower_bound() -> None:
    small = replace(A100_8, devices=tuple(replace(d, memory_bytes=2e6) for d in A100_8.devices))
    f = models.mlp(64, 256, 256, 8, layers=8)  # 8 x 256 x 256 float32 = 2 MiB of weights
    result = search(f, small, progress=False, dp=[8, 1], tp=1, pp=[1, 8], microbatches=[8])
    by = {(r.strategy.dp, r.strategy.pp): r for r in result.rows}
    assert by[(8, 1)].status == "pruned" and "GiB per device" in by[(8, 1)].error
    assert by[(1, 8)].status in ("ok", "over capacity")


def test_a_strategy_the_transform_refuses_is_a_row_with_its_error() -> None:
    bad = models.mlp(12, 6, 6, 3, layers=2)  # hidden 6 does not split over 4 devices
    result = search(bad, ir.Topology.preset("a100-hgx", 4), progress=False, dp=1, tp=4, pp=1)
    assert result.rows[0].status == "error" and "tensor level" in result.rows[0].error


def test_csv_round_trip_keeps_every_row(tmp_path, gpt_result) -> None:
    path = gpt_result.to_csv(tmp_path / "search.csv")
    back = SearchResult.from_csv(path)
    assert len(back) == len(gpt_result)
    for a, b in zip(gpt_result.rows, back.rows):
        assert a.strategy == b.strategy and a.status == b.status and a.error == b.error
        for name in ("step_time_s", "peak_memory_bytes", "mfu", "bubble", "exposed_comm_s"):
            x, y = getattr(a, name), getattr(b, name)
            assert (math.isnan(x) and math.isnan(y)) or x == y
    assert [str(r.strategy) for r in back.pareto()] == [
        str(r.strategy) for r in gpt_result.pareto()
    ]


def test_a_corrupt_csv_is_refused_naming_line_and_column(tmp_path, gpt_result) -> None:
    path = gpt_result.to_csv(tmp_path / "search.csv")
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[1].split(",")
    cells[header.index("dp")] = "two"
    path.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    with pytest.raises(SearchError, match=r"line 2, column 'dp': 'two'"):
        SearchResult.from_csv(path)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SearchError, match="not a search result"):
        SearchResult.from_csv(tmp_path / "other.csv")
    with pytest.raises(SearchError, match="cannot read"):
        SearchResult.from_csv(tmp_path / "missing.csv")


def test_bad_searches_are_refused() -> None:
    with pytest.raises(SearchError, match="batch=16"):
        search(MLP, A100_8, batch=16, progress=False)
    with pytest.raises(SearchError, match="unknown schedule"):
        search(MLP, A100_8, schedules=["zigzag"], progress=False)
    with pytest.raises(SearchError, match="positive integers"):
        search(MLP, A100_8, dp=[0], progress=False)
    with pytest.raises(SearchError, match=r"ir\.Function"):
        search("mlp", A100_8, progress=False)


@pytest.mark.parametrize(
    ("space", "says"),
    [
        (dict(dp=2.0), r"dp must be one value or a list of values, got 2\.0"),
        (dict(microbatches=0), "microbatches must be positive integers, got 0"),
        (dict(microbatches=-1), "microbatches must be positive integers, got -1"),
        (dict(chunks="2", schedules="interleaved"), "chunks must be positive integers, got '2'"),
        (dict(zero=4), "zero must be a ZeRO stage: 0, 1, 2 or 3, got 4"),
        (dict(zero="1"), "zero must be a ZeRO stage: 0, 1, 2 or 3, got '1'"),
        (dict(sequence_parallel="no"), "sequence_parallel must be True or False, got 'no'"),
        (dict(recompute=2), "recompute must be True or False, got 2"),
        (dict(schedules="interleaved"), r"schedules \['interleaved'\] with chunks \[1\] make no"),
        (dict(chunks=2), r"schedules \['1f1b'\] with chunks \[2\] make no strategy"),
        (dict(batch="64"), "batch must be an integer"),
        (dict(cp=3), r"degrees asked \(cp=\[3\]\)"),
        (dict(on_row=3), "on_row must be a function of a row, got int"),
    ],
)
def test_bad_knobs_are_refused_naming_the_knob(space: dict, says: str) -> None:
    """Each used to be a bare TypeError or ZeroDivisionError from deep inside, a row per
    strategy with the same complaint, a message about degrees for a schedule mismatch,
    or (a string for a switch) silently taken as True."""
    with pytest.raises(SearchError, match=says):
        search(MLP, ir.Topology.preset("a100-hgx", 4), progress=False, **space)


def test_numpy_integers_are_degrees_like_ints() -> None:
    import numpy as np

    topology = ir.Topology.preset("a100-hgx", 4)
    asked = search(MLP, topology, dp=np.int64(2), microbatches=[np.int64(2)], progress=False)
    plain = search(MLP, topology, dp=2, microbatches=[2], progress=False)
    assert [(r.strategy, r.status, r.step_time_s) for r in asked.rows] == [
        (r.strategy, r.status, r.step_time_s) for r in plain.rows
    ]


def test_a_row_prints_its_strategy() -> None:
    row = Row(Strategy(2, 2, 2, 4), "pruned", error="why")
    assert row.as_record()["strategy"] == "dp2 tp2 pp2 m4 1f1b"
    assert "pruned" in SearchResult([row]).table()


def test_an_executor_gives_the_rows_a_serial_search_gives() -> None:
    from concurrent.futures import ProcessPoolExecutor

    space = {"dp": [1, 2], "tp": [1, 2], "pp": [1, 2], "microbatches": [2]}
    serial = search(GPT, ir.Topology.preset("a100-hgx", 4), progress=False, **space)
    with ProcessPoolExecutor(2) as pool:
        spread = search(
            GPT, ir.Topology.preset("a100-hgx", 4), progress=False, executor=pool, **space
        )
    assert [r.as_record() for r in spread.rows] == [r.as_record() for r in serial.rows]
    with pytest.raises(SearchError, match="submit"):
        search(GPT, A100_8, progress=False, executor=object())


def test_a_dask_cluster_on_loopback_runs_the_search() -> None:
    distributed = pytest.importorskip(
        "distributed", reason="dask.distributed is in the 'cluster' extra (pip install .[all])"
    )
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        space = {"dp": [2, 4], "tp": [1, 2], "pp": 1}
        spread = search(
            GPT, ir.Topology.preset("a100-hgx", 4), progress=False, executor=client, **space
        )
    serial = search(GPT, ir.Topology.preset("a100-hgx", 4), progress=False, **space)
    assert [r.as_record() for r in spread.rows] == [r.as_record() for r in serial.rows]


def test_impossible_requests_say_which_constraint_failed() -> None:
    with pytest.raises(SearchError, match=r"dp=16 needs at least 16 devices; the topology has 8"):
        search(MLP, A100_8, dp=16, progress=False)
    with pytest.raises(SearchError, match=r"pp=32 needs at least 32 devices"):
        search(MLP, A100_8, pp=[2, 32], progress=False)
    no_split = r"no dp x cp x tp x pp of the degrees asked \(dp=\[2\], "
    with pytest.raises(SearchError, match=no_split):
        search(MLP, A100_8, dp=2, tp=1, pp=1, progress=False)  # 2 of the 8 devices
    small_batch = models.mlp(4, 32, 32, 8, layers=4)
    with pytest.raises(SearchError, match="the batch of 4 is smaller than dp=8: every"):
        search(small_batch, A100_8, dp=[8], progress=False)
    one_layer = models.mlp(8, 4, 4, 3, layers=1)  # no MatMul pair, 3 classes: nothing splits
    with pytest.raises(SearchError, match="tensor parallelism cannot split mlp: tensor level: no"):
        search(one_layer, ir.Topology.preset("a100-hgx", 4), tp=[2, 4], progress=False)
    # asked among others, the impossible points are rows that say why
    result = search(one_layer, ir.Topology.preset("a100-hgx", 4), tp=[1, 2], progress=False)
    refused = {str(r.strategy): r for r in result.rows if r.strategy.tp == 2}
    assert refused and all(r.status == "error" and r.error for r in refused.values())
    assert refused["dp2 tp2 pp1 m1 1f1b"].error.startswith("tensor level: no weight of mlp")
    assert any(r.ok for r in result.rows)


def test_a_strategy_that_fails_with_a_bug_is_a_row_saying_so(monkeypatch) -> None:
    def broken(self, t, topology=None, **options):
        if self.pp == 2:
            raise ZeroDivisionError("division by zero\nmore detail")
        return real(self, t, topology, **options)

    real = Strategy.build
    monkeypatch.setattr(Strategy, "build", broken)
    result = search(GPT, ir.Topology.preset("a100-hgx", 4), progress=False, microbatches=[2])
    failed = [r for r in result.rows if r.strategy.pp == 2]
    assert failed and all(
        r.status == "error" and r.error == "internal error (ZeroDivisionError): division by zero"
        for r in failed
    )
    assert all(r.ok for r in result.rows if r.strategy.pp != 2)


def test_an_interrupted_search_returns_the_rows_so_far(monkeypatch, tmp_path) -> None:
    import ir.search as search_module

    real, calls = search_module._simulate, []

    def interrupted(s, *args):
        calls.append(s)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(s, *args)

    monkeypatch.setattr(search_module, "_simulate", interrupted)
    space = {"dp": [1, 2, 4], "tp": [1, 2], "microbatches": [1, 2]}
    result = search(GPT, ir.Topology.preset("a100-hgx", 4), progress=False, simulate="all", **space)
    built = [r for r in result.rows if r.status != "pruned"]
    assert [r.strategy for r in built[:2]] == calls[:2] and all(r.ok for r in built[:2])
    assert len(built) > 3 and all(r.status == "cancelled" for r in built[2:])
    assert "interrupted before this strategy" in built[2].error
    back = SearchResult.from_csv(result.to_csv(tmp_path / "partial.csv"))
    assert [r.status for r in back.rows] == [r.status for r in result.rows]
    assert result.best() in built[:2]


class _Future:
    def __init__(self, outcome, done: bool = True) -> None:
        self.outcome, self._done, self.cancelled = outcome, done, False

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def result(self):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _InterruptedExecutor:
    """One worker's executor: runs the first two batches of strategies, is interrupted
    waiting for the third (the user's Ctrl-C), whose worker was interrupted too; the rest
    never started."""

    _max_workers = 1  # as a concurrent.futures pool says it: the search makes 4 batches

    def __init__(self, while_submitting: bool = False) -> None:
        self.futures: list[_Future] = []
        self.batches: list[list[Strategy]] = []
        self.while_submitting = while_submitting  # Ctrl-C while the third is submitted

    def submit(self, fn, batch, *args):
        n = len(self.futures)
        if n == 2 and self.while_submitting:
            raise KeyboardInterrupt
        if n < 2:
            future = _Future(fn(batch, *args))
        elif n == 2:
            future = _Future(KeyboardInterrupt())
        else:
            future = _Future(None, done=False)
        self.futures.append(future)
        self.batches.append(list(batch))
        return future


def test_an_interrupted_search_on_an_executor_keeps_what_finished_and_cancels_the_rest():
    space = {"dp": [1, 2, 4], "tp": [1, 2], "microbatches": [1, 2]}
    topology = ir.Topology.preset("a100-hgx", 4)
    for while_submitting in (True, False):
        executor = _InterruptedExecutor(while_submitting)
        result = search(GPT, topology, progress=False, executor=executor, simulate="all", **space)
        built = [r for r in result.rows if r.status != "pruned"]
        assert len(built) >= 8 and all(len(b) >= 2 for b in executor.batches[:2])
        finished = {s for b in executor.batches[:2] for s in b}
        assert len(executor.futures) == (2 if while_submitting else 4)
        assert all(r.ok for r in built if r.strategy in finished)
        assert all(r.status == "cancelled" for r in built if r.strategy not in finished)
        assert not any(f.cancelled for f in executor.futures[:3])
        assert all(f.cancelled for f in executor.futures[3:])


class _Recording:
    """An executor of two workers that runs each job at once, here, and keeps its batch."""

    _max_workers = 2

    def __init__(self) -> None:
        self.batches: list[list[Strategy]] = []

    def submit(self, fn, batch, *args):
        self.batches.append(list(batch))
        return _Future(fn(batch, *args))


@pytest.mark.parametrize("mode", ["all", "front"])
def test_an_executor_runs_batches_of_strategies_that_share_analyses(mode) -> None:
    space = {"dp": [1, 2, 4], "tp": [1, 2, 4], "microbatches": [1, 2, 4, 8]}
    topology = ir.Topology.preset("a100-hgx", 8)
    serial = search(GPT, topology, progress=False, simulate=mode, **space)
    executor = _Recording()
    spread = search(GPT, topology, progress=False, simulate=mode, executor=executor, **space)
    assert [r.as_record() for r in spread.rows] == [r.as_record() for r in serial.rows]
    simulated = [s for b in executor.batches for s in b]
    assert set(simulated) >= {  # (the two tiers may simulate ahead what they then drop)
        r.strategy for r in serial.rows if r.status not in ("pruned", "estimated")
    }
    if mode == "front":  # one strategy a job, kept in flight (a worker keeps the plans)
        assert all(len(b) == 1 for b in executor.batches)
        assert len(simulated) == len(set(simulated))  # none simulated twice
        return
    assert len(executor.batches) < len(simulated)  # jobs of several strategies
    for batch in executor.batches:  # those that share analyses side by side
        keys = [shares(s) for s in batch]
        assert keys == sorted(keys)
    if mode == "all":  # a few batches per worker, of nearly equal work (not count)
        assert len(executor.batches) == 8
        totals = [sum(map(work, b)) for b in executor.batches]
        assert max(totals) - min(totals) <= 2 * max(map(work, simulated))
        assert max(map(len, executor.batches)) > min(map(len, executor.batches))


def test_batches_balance_work_not_counts() -> None:
    """A batch of 32-microbatch pipelines costs several single-stage steps: batches of
    equal counts left one worker with most of the 35-strategy grid."""
    grid = [Strategy(dp, 16 // (dp * pp), pp, m)
            for dp in (1, 2, 4, 8, 16) for pp in (1, 2, 4, 8, 16) if 16 % (dp * pp) == 0
            for m in ((2, 8, 32) if pp > 1 else (1,))]  # fmt: skip
    assert len(grid) == 35
    for count in (2, 4, 8):
        made = batches(list(enumerate(grid)), count)
        assert len(made) == count
        assert sorted(i for b in made for i, _ in b) == list(range(35))  # each once
        totals = [sum(work(s) for _, s in b) for b in made]
        assert max(totals) - min(totals) <= 2 * max(map(work, grid))
        assert max(totals) < 1.5 * sum(totals) / count
    assert batches([(0, grid[0])], 8) == [[(0, grid[0])]]


@pytest.mark.parametrize("mode", ["front", "fastest"])
def test_the_two_tiers_on_an_executor_decide_every_row_as_a_serial_search(mode) -> None:
    """The two tiers simulate a wave of strategies at a time on an executor, then decide
    each in order on the rows before it, as a serial search does: a row simulated ahead
    that a serial search leaves estimated is dropped (the reviewer's space: 17 rows left
    estimated serially, 14 on a process pool before)."""
    space = dict(
        microbatches=[1, 2, 4], zero=(0, 1), schedules=("1f1b", "interleaved"), chunks=(1, 2)
    )
    topology = ir.Topology.preset("cpu", 4)
    serial = search(GPT, topology, progress=False, simulate=mode, **space)
    executor = _Recording()
    spread = search(GPT, topology, progress=False, simulate=mode, executor=executor, **space)
    assert [r.as_record() for r in spread.rows] == [r.as_record() for r in serial.rows]
    left = [r for r in serial.rows if r.status == "estimated"]
    assert left and len({s for b in executor.batches for s in b}) > len(serial.rows) - len(
        left
    ) - sum(r.status == "pruned" for r in serial.rows)  # some simulated ahead, dropped


def test_progress_can_be_a_callable_given_decided_and_total() -> None:
    seen: list[tuple[int, int]] = []
    result = search(
        GPT,
        ir.Topology.preset("a100-hgx", 4),
        progress=lambda done, total: seen.append((done, total)),
        microbatches=[1, 2],
    )
    decided = [r for r in result.rows if r.status != "pruned"]
    assert seen == [(k, len(decided)) for k in range(1, len(decided) + 1)]


def test_tensor_parallelism_past_the_heads_is_pruned_with_the_reason() -> None:
    """4 heads over 8 tensor ranks would run the whole attention on each of the 8: pruned
    (not built), the row naming tp and the limit; tp 4 is built."""
    result = search(GPT, A100_8, progress=False, dp=[1, 2], tp=[8, 4], pp=1)
    by = {(r.strategy.dp, r.strategy.tp): r for r in result.rows}
    assert by[(1, 8)].status == "pruned"
    assert "degree 8 does not divide the 4 attention heads" in by[(1, 8)].error
    assert "\n" not in by[(1, 8)].error  # the reason's first line, as error rows keep
    # the unfused form says it through the comparison with the plan over one rank
    unfused = models.gpt(
        batch=8, seq=16, hidden=32, heads=4, vocab=64, layers=2, attention="unfused"
    )
    (row,) = search(unfused, A100_8, progress=False, dp=1, tp=8, pp=1).rows
    assert row.status == "pruned" and "tp=8" in row.error and "must divide 4" in row.error
    assert by[(2, 4)].status in ("ok", "over capacity")


def test_no_row_is_ok_with_a_device_that_computes_nothing() -> None:
    """The 2-layer GPT cut in 8 at most (its layers and sublayers): a deeper pipeline is
    refused by the transform (it left 2 of 16 devices idle and was "ok"), and every
    simulated row has every device computing."""
    topology = ir.Topology.preset("a100-hgx", 16)
    result = search(GPT, topology, progress=False, dp=1, tp=1, pp=16, microbatches=[8])
    (row,) = result.rows
    assert row.status == "error" and "16 stages" in row.error and "at most 8" in row.error
    t = transforms.training(GPT, "adam")
    for row in search(GPT, A100_8, progress=False, tp=1, microbatches=[8]).simulated():
        r = ir.simulate(row.strategy.build(t, A100_8), A100_8)
        assert all(r.busy_s[d] > 0 for d in range(8)), row.strategy


def test_a_program_leaving_a_device_idle_is_never_an_ok_row(monkeypatch) -> None:
    """The guard behind the transforms' refusals: a built step in which a device of the
    strategy computes nothing is an error row, never "ok"."""

    def half(self, t, topology=None, **options):  # dp2 built on one replica only
        return transforms.megatron(t, self.dp // 2, self.tp, self.pp, self.microbatches)

    monkeypatch.setattr(Strategy, "build", half)
    result = search(MLP, ir.Topology.preset("a100-hgx", 2), progress=False, dp=2, tp=1, pp=1)
    (row,) = result.rows
    assert row.status == "error" and "device(s) [1] of the 2 compute nothing" in row.error


def test_an_interrupted_two_tier_search_on_an_executor_keeps_the_rows_decided() -> None:
    space = dict(
        microbatches=[1, 2, 4], zero=(0, 1), schedules=("1f1b", "interleaved"), chunks=(1, 2)
    )
    topology = ir.Topology.preset("cpu", 4)
    serial = {r.strategy: r for r in search(GPT, topology, progress=False, **space).rows}
    for while_submitting in (True, False):
        executor = _InterruptedExecutor(while_submitting)
        result = search(GPT, topology, progress=False, executor=executor, **space)
        statuses = [r.status for r in result.rows]
        # (one strategy a job: the two that ran are decided, the one in flight cancelled)
        assert "cancelled" in statuses and statuses.count("ok") >= 2
        assert all(f.cancelled for f in executor.futures[3:])
        for r in result.rows:  # what was decided is what a serial search decides
            assert r.status == "cancelled" or r.as_record() == serial[r.strategy].as_record()


def test_interleaving_with_one_pipeline_rank_is_pruned_beside_its_1f1b_step() -> None:
    space = dict(pp=1, microbatches=[2], schedules=("1f1b", "interleaved"), chunks=(1, 2))
    result = search(GPT, ir.Topology.preset("a100-hgx", 4), progress=False, **space)
    interleaved = [r for r in result.rows if r.strategy.schedule == "interleaved"]
    assert interleaved and all(
        r.status == "pruned" and "without a pipeline" in r.error for r in interleaved
    )
    assert any(r.ok and r.strategy.schedule == "1f1b" for r in result.rows)
    alone = search(
        GPT,
        ir.Topology.preset("a100-hgx", 4),
        progress=False,
        **{**space, "schedules": ("interleaved",)},
    )
    assert all(r.status != "pruned" or "without" not in r.error for r in alone.rows)


def test_a_listed_grid_is_searched_as_the_space_would_be() -> None:
    """search(strategies=[...]): a grid that is no product of knobs (microbatches only
    where there is a pipeline) gives the rows the knobs' space gives for those
    strategies, in the space's order, once each."""
    topology = ir.Topology.preset("a100-hgx", 4)
    grid = [Strategy(dp, 4 // (dp * pp), pp, 4 if pp > 1 else 1)
            for dp in (1, 2, 4) for pp in (1, 2, 4) if 4 % (dp * pp) == 0]  # fmt: skip
    listed = search(GPT, topology, strategies=grid[::-1] + grid[:2], simulate="all",
                    progress=False)  # fmt: skip
    assert [r.strategy for r in listed.rows] == sorted(set(grid), key=lambda s: (s.dp, s.tp, s.pp))
    space = search(GPT, topology, microbatches=[1, 4], simulate="all", progress=False)
    of_space = {r.strategy: r.as_record() for r in space.rows}
    assert all(r.status in ("ok", "over capacity") for r in listed.rows)
    assert [r.as_record() for r in listed.rows] == [of_space[r.strategy] for r in listed.rows]
    two_tiers = search(GPT, topology, strategies=grid, progress=False)
    best = two_tiers.best()  # (with the estimate beside it)
    assert (best.strategy, best.step_time_s) == (listed.best().strategy, listed.best().step_time_s)


@pytest.mark.parametrize(
    ("listed", "says"),
    [
        ([Strategy(2, 2, 2, 4)], r"strategies\[0\] \(dp2 tp2 pp2 m4 1f1b\): dp x cp x tp x pp = 8"),
        ([Strategy(2, 2, 1), "dp4 tp1"], r"strategies\[1\] is 'dp4 tp1', not an ir\.search\.Str"),
        ([Strategy(2, 2, 1, 0)], r"strategies\[0\] .*microbatches must be positive integers"),
        ([Strategy(4, 1, 1, chunks=2)], r"strategies\[0\] .*chunks \(model chunks per device\)"),
        ([Strategy(2, 2, 1, ep=4)], r"strategies\[0\] .*ep=4 does not divide dp=2"),
        ([], "strategies lists no strategy"),
        (3, "strategies must be a list of ir.search.Strategy, got 3"),
    ],
)
def test_a_listed_strategy_that_is_no_point_of_a_space_is_refused_naming_it(
    listed, says: str
) -> None:
    with pytest.raises(SearchError, match=says):
        search(MLP, ir.Topology.preset("a100-hgx", 4), strategies=listed, progress=False)


def test_listed_strategies_and_knobs_are_not_mixed() -> None:
    with pytest.raises(SearchError, match=r"either strategies= or the knobs .*\(pp=2 with"):
        search(MLP, ir.Topology.preset("a100-hgx", 4), pp=2, strategies=[Strategy(4, 1, 1)],
               progress=False)  # fmt: skip
    # a knob at its default is no knob
    rows = search(MLP, ir.Topology.preset("a100-hgx", 4), schedules="1f1b",
                  strategies=[Strategy(4, 1, 1)], progress=False).rows  # fmt: skip
    assert [r.strategy for r in rows] == [Strategy(4, 1, 1)]


def test_a_workers_batches_of_one_search_share_its_analyses() -> None:
    """An executor's worker keeps one SharedPlans per search (by the request's name, not
    an object's id), so each analysis runs once per worker, not once per batch; it keeps
    the last two searches', and a search's own process drops its plans when it ends."""
    import pickle

    from ir.search import _WORKER_PLANS, _request, _simulate, _simulate_batch

    topology = ir.Topology.preset("a100-hgx", 4)
    chosen = [Strategy(2, 2, 1), Strategy(2, 1, 2, 2), Strategy(1, 2, 2, 4)]
    request = _request(GPT, topology, None, "adam", *[None] * 11, chosen=chosen)
    t, *rest = request.args()
    first = _simulate_batch(request.space[:2], request.name, pickle.dumps(t), *rest)
    t_kept, plans = _WORKER_PLANS[request.name]
    analysed = len(plans.of(t_kept, False)[1])
    assert analysed > 0
    # the step is unpickled by the first batch only (these bytes are no pickle)
    again = _simulate_batch(request.space[:2], request.name, b"not unpickled", *rest)
    assert _WORKER_PLANS[request.name] == (t_kept, plans)
    assert len(plans.of(t_kept, False)[1]) == analysed  # nothing analysed twice
    assert [r.as_record() for r in again] == [r.as_record() for r in first]
    assert [r.as_record() for r in first] == [
        _simulate(s, *request.args()).as_record() for s in request.space[:2]
    ]
    for other in ("a", "b"):
        _simulate_batch(request.space[:1], other, pickle.dumps(t), *rest)
    assert request.name not in _WORKER_PLANS and list(_WORKER_PLANS)[-2:] == ["a", "b"]
    _WORKER_PLANS.clear()
    search(GPT, topology, strategies=request.space, executor=_Recording(), progress=False)
    assert not _WORKER_PLANS
