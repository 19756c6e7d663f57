"""Searches whose executor runs jobs in this process's threads (a thread pool, a dask
worker's threads) and searches stopped early: each thread builds with the search's one
set of shared plans, and work a stopped search no longer needs is cancelled."""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import ir
from ir import models
from ir.search import search

GPT4 = models.gpt(batch=16, seq=16, hidden=32, heads=4, vocab=64, layers=4)
A100_8 = ir.Topology.preset("a100-hgx", 8)
SPACE = {"schedules": ("1f1b", "interleaved"), "chunks": (1, 2), "zero": (0, 1)}


def test_thread_workers_sharing_one_searchs_plans_give_the_serial_rows() -> None:
    """A thread pool's jobs build with the same SharedPlans at once: without its lock,
    with threads switching often, strategies came out as 'internal error (KeyError)' or
    'facts were made for another program' rows (5 searches of 6)."""
    serial = [r.as_record() for r in search(GPT4, A100_8, progress=False, simulate="all",
                                            **SPACE).rows]  # fmt: skip
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: what a busy machine does at times
    try:
        with ThreadPoolExecutor(4) as pool:
            for _ in range(2):
                rows = search(GPT4, A100_8, progress=False, simulate="all", executor=pool,
                              **SPACE).rows  # fmt: skip
                assert [r.as_record() for r in rows] == serial
    finally:
        sys.setswitchinterval(switch)


class _Kept:
    """A thread pool of one worker that keeps every future it gave."""

    _max_workers = 2  # it says two: the search keeps four in flight on its one thread

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool, self.futures = pool, []

    def submit(self, *args) -> Future:
        self.futures.append(self.pool.submit(*args))
        return self.futures[-1]


def _stop_after(count: int):
    seen = []

    def on_row(row) -> None:
        if row.status == "ok":  # simulated
            seen.append(row)
            if len(seen) == count:
                raise KeyboardInterrupt  # as a dashboard's Cancel (ir.interrupt.check) does

    return on_row


@pytest.mark.parametrize("mode", ["all", "front", "fastest"])
def test_a_search_stopped_by_its_caller_cancels_the_work_it_no_longer_needs(mode) -> None:
    """Stopped from outside the executor's wait (on_row, a Cancel between rows), the
    search's pending jobs are cancelled (they ran on before), and a thread job of the
    ended search leaves no plans behind in this process."""
    from ir.search import _WORKER_PLANS

    before = set(_WORKER_PLANS)
    with ThreadPoolExecutor(1) as pool:
        kept = _Kept(pool)
        result = search(GPT4, A100_8, progress=False, simulate=mode, executor=kept,
                        on_row=_stop_after(2), **SPACE)  # fmt: skip
        assert sum(r.status == "cancelled" for r in result.rows) > 0
        assert len(kept.futures) >= 3
        assert sum(not f.done() for f in kept.futures) <= 1  # at most the one running
    assert set(_WORKER_PLANS) == before
