"""ir.backends.profile.profile_ops: every distinct op of a program timed on the torch
backend, in processes sharing the machine as the program's ranks will, and the table
feeding ir.simulate."""

from __future__ import annotations

import os
import re
import time

import pytest

import ir
from ir import transforms

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

from ir.backends.profile import profile_ops
from ir.backends.torch_dist import BackendError
from ir.sim.costs import OpCosts, communication_keys, compute_ops

F32 = ir.DType.float32


def _step(dp: int, tp: int = 1, pp: int = 1, features: int = 8):
    f = ir.models.mlp(8, features, 16, 4, layers=2, training=True, dtype=F32)
    return transforms.megatron(f, dp, tp, pp, 2 if pp > 1 else 1)


def test_every_op_of_a_tensor_parallel_step_is_measured_and_simulates():
    g = _step(1, tp=2)
    table = profile_ops(g, repeats=3, warmup=1, progress=False)
    assert table.processes == 2
    assert table.missing(g) == []
    assert set(table.compute) == {k for k, _ in compute_ops(g)}
    assert set(table.communication) == set(communication_keys(g))
    assert all(0 < t < 1.0 for t in [*table.compute.values(), *table.communication.values()])
    result = ir.simulate(transforms.unroll_pmap(g), ir.Topology.uniform(2), costs=table)
    # each compute event lasts exactly its measured time
    from ir.sim.costs import compute_key

    for e in result.events:
        if e.stream == "compute":
            assert e.dur_s == table.compute[compute_key(e.op.op_type, e.op)]


def test_a_bigger_matmul_is_measured_slower():
    small, big = _step(1, features=4), _step(1, features=32768)
    t_small = profile_ops(small, repeats=3, warmup=1, progress=False)
    t_big = profile_ops(big, repeats=3, warmup=1, progress=False)

    def first_matmul(table):
        return next(t for k, t in table.compute.items() if k[0] == "MatMul")

    # 8 x 32768 x 16 against 8 x 4 x 16: some 0.3 ms here against the 15-70 us that a tiny
    # op's dispatch takes on a busy machine (8 x 512 x 16 was within that noise: flaky)
    assert first_matmul(t_big) > first_matmul(t_small)


def test_a_given_table_is_reused_and_only_new_ops_are_measured(monkeypatch):
    from ir.backends import profile

    one = profile_ops(_step(2), repeats=3, warmup=1, progress=False)
    with monkeypatch.context() as m:  # nothing new: no process is started
        m.setattr(profile, "_measure", lambda *a: pytest.fail("measured a known program"))
        again = profile_ops(_step(2), costs=one, repeats=3, warmup=1, progress=False)
    assert again.compute == one.compute and again.communication == one.communication
    wider = profile_ops(_step(2, features=12), costs=one, repeats=3, warmup=1, progress=False)
    assert set(one.compute) < set(wider.compute)
    for k, t in one.compute.items():  # measured before: kept as it was
        assert wider.compute[k] == t


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"processes": 0}, "processes must be an integer >= 1"),
        ({"repeats": 1}, "repeats must be an integer >= 2"),
        ({"warmup": -1}, "warmup must be an integer >= 0"),
        ({"processes": 2, "costs": OpCosts(processes=4)}, "measured with 4 processes"),
        ({"costs": {"MatMul": 1e-3}}, r"costs must be an ir\.sim\.costs\.OpCosts"),
        ({"timeout_s": 0}, "timeout_s must be a number > 0"),
        ({"timeout_s": "60"}, "timeout_s must be a number > 0"),
    ],
)
def test_bad_arguments_are_refused_before_any_process_starts(options, message):
    with pytest.raises(BackendError, match=message):
        profile_ops(_step(2), progress=False, **options)


def test_a_non_program_is_refused():
    with pytest.raises(BackendError, match=r"profiles an ir\.Function"):
        profile_ops("MatMul", progress=False)


class _SlowWork:
    """A collective's work that takes at least ``delay_s`` more to finish."""

    def __init__(self, work, delay_s: float) -> None:
        self.work, self.delay_s = work, delay_s

    def wait(self):
        time.sleep(self.delay_s)
        return self.work.wait()

    def is_completed(self) -> bool:
        return False


def test_an_all_reduce_is_timed_until_it_completes_not_until_it_is_posted(monkeypatch):
    """The ranked backend posts all-reduces asynchronously (a Pending): the profile must wait
    for each, or it times only the posting. Workers are forked, so a collective whose
    completion takes 50 ms more reaches them through the patched module."""
    from ir.backends import torch_ranked

    posted = torch_ranked._collective

    def slow(*args, **kwargs):
        y = posted(*args, **kwargs)
        if isinstance(y, torch_ranked.Pending):
            y.work = _SlowWork(y.work, 0.05)
        return y

    monkeypatch.setattr(torch_ranked, "_collective", slow)
    g = _step(2)
    table = profile_ops(g, repeats=2, warmup=0, progress=False)
    reduces = {k: t for k, t in table.communication.items() if k[0] == "allreduce"}
    assert reduces and all(t >= 0.05 for t in reduces.values()), reduces


def _dying_on(rank: int, monkeypatch) -> None:
    """Make worker ``rank`` die without a word when it starts timing (workers are forked)."""
    from ir.backends import profile

    timed = profile._time_compute

    def dying(program, args, context, plan, outbox, me):
        if me == rank:
            os._exit(3)
        return timed(program, args, context, plan, outbox, me)

    monkeypatch.setattr(profile, "_time_compute", dying)


def test_a_worker_that_dies_is_named_at_once_not_waited_for(monkeypatch):
    _dying_on(0, monkeypatch)
    with pytest.raises(BackendError, match=r"process 0 \(pid \d+\) exited with status 3"):
        profile_ops(_step(1), processes=1, repeats=2, warmup=0, progress=False, timeout_s=60)


def test_a_dead_worker_is_named_before_the_peer_it_made_fail(monkeypatch):
    _dying_on(1, monkeypatch)
    with pytest.raises(BackendError) as failed:
        profile_ops(_step(2), repeats=2, warmup=0, progress=False, timeout_s=60)
    message = str(failed.value)
    assert re.search(r"process 1 \(pid \d+\) exited with status 3", message), message
    assert message.index("process 1") < message.index("process 0")


def test_an_op_without_a_torch_kernel_is_refused_naming_the_op_before_any_process_starts():
    b = ir.FunctionBuilder("erf")
    a = b.input("a", ir.TensorType((4, 3), device=0))
    f = b.finish([b.call("Erf", b.call("Relu", a, name="h"), name="r")])
    with pytest.raises(BackendError, match=r"Erf has no torch kernel.*\n  in: r: .*= Erf\(h\)"):
        profile_ops(f, progress=False)
