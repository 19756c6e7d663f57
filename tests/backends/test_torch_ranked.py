"""torch_dist.run_ranked: rank programs on real gloo processes with torch kernels equal the
numpy ranked run and the global program, for DP, TP, PP, 3D and uneven shards, and keep
a training step's state on their ranks over several steps."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import ir
import ir.models
from ir import transforms
from ir.sharding import Mesh, S, lower_to_ranks, propagate
from ir.sharding import run_ranked as numpy_run_ranked

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

from ir.backends import torch_dist
from ir.backends.torch_ranked import carry_of

F64 = ir.DType.float64


def mlp() -> ir.Function:
    return ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)


def gpt() -> ir.Function:
    return ir.models.gpt(4, 4, 8, 2, 12, 1, training=True, dtype=F64)


def _flat(values) -> list:
    out = []
    for v in values:
        out += _flat(v) if isinstance(v, tuple) else [v]
    return out


def assert_same(got, want, rtol: float = 1e-9) -> None:
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * 1e-3, err_msg=f"leaf {i}")


STEPS = {
    "DP": (mlp, lambda f: transforms.data_parallel(f, 2)),
    "TP": (mlp, lambda f: transforms.horizontal_parallel(f, 2)),
    "PP 1f1b": (mlp, lambda f: transforms.pipeline_parallel(f, 2, 2, "1f1b")),
    "3D gpt dp2 pp2": (gpt, lambda f: transforms.megatron(f, 2, 1, 2, 2)),
    "3D gpt tp2 pp2": (gpt, lambda f: transforms.megatron(f, 1, 2, 2, 2)),
}


@pytest.mark.parametrize("name", list(STEPS))
def test_ranked_programs_on_gloo_equal_numpy_ranked_and_the_global_program(name):
    make, transform = STEPS[name]
    f = make()
    g = transform(f)
    u = transforms.unroll_pmap(g)
    ranked = lower_to_ranks(u)
    inputs = ir.distribute(g, ir.random_inputs(f, 0), source=f)
    got = torch_dist.run_ranked(ranked, inputs)
    assert_same(got, numpy_run_ranked(ranked, inputs))
    assert_same(got, ir.execute(u, inputs))


def test_an_uneven_shard_keeps_its_tail_block_on_gloo():
    b = ir.FunctionBuilder("uneven")
    x = b.input("x", ir.TensorType((5, 6), device=0))
    w1 = b.input("w1", ir.TensorType((6, 9), device=0))
    w2 = b.input("w2", ir.TensorType((9, 4), device=0))
    h = b.call("Relu", b.call("MatMul", x, w1, name="h"), name="a")
    f = b.finish([b.call("MatMul", h, w2, name="y")])
    g, _ = propagate(f, {"w1": (Mesh((2,)), [S(1)]), "x": (Mesh((2,)), ["R"])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    assert [p.inputs[1].type.shape for p in ranked.programs.values()] == [(6, 5), (6, 4)]
    inputs = ir.random_inputs(f, 1)
    got = torch_dist.run_ranked(ranked, inputs)
    assert_same(got, ir.execute(f, inputs), rtol=1e-5)


def test_the_rfc_tail_block_64_plus_2_runs_on_gloo():
    b = ir.FunctionBuilder("rfc")
    x = b.input("x", ir.TensorType((8, 8), device=0))
    a = b.input("A", ir.TensorType((8, 66), device=0))
    w = b.input("B", ir.TensorType((66, 8), device=0))
    y = b.call("Gelu", b.call("MatMul", x, a, name="lv0"), name="Y")
    f = b.finish([b.call("MatMul", y, w, name="Z")])
    g, _ = propagate(f, {"A": (Mesh((2,)), [S(1, block=64)])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    assert [p.inputs[1].type.shape for p in ranked.programs.values()] == [(8, 64), (8, 2)]
    inputs = ir.random_inputs(f, 5)
    assert_same(torch_dist.run_ranked(ranked, inputs), ir.execute(f, inputs), rtol=1e-5)


def _next_inputs(step: ir.Function, inputs: list, outputs: tuple, carry: dict) -> list:
    names = [v.name for v in step.inputs]
    new = list(inputs)
    for index, name in carry.items():
        new[names.index(name)] = outputs[index]
    return new


def test_several_training_steps_keep_their_state_on_the_ranks():
    f = mlp()
    g = transforms.megatron(f, 2, 1, 2, 2)  # 4 processes: 2 replicas of 2 stages
    ranked = lower_to_ranks(transforms.unroll_pmap(g))
    carry = carry_of(f)
    assert sorted(carry.values()) == ["wA", "wB"]
    seq = ir.random_inputs(f, 2)
    inputs = ir.distribute(g, seq, source=f)
    got = torch_dist.run_ranked(ranked, inputs, steps=3, carry=carry)
    step_inputs, seq_inputs = inputs, seq
    for _ in range(3):
        want = numpy_run_ranked(ranked, step_inputs)
        step_inputs = _next_inputs(g, step_inputs, want, carry)
        seq_out = ir.execute(f, seq_inputs)
        seq_inputs = _next_inputs(f, seq_inputs, seq_out, carry)
    assert_same(got, want)
    # the third step's outputs are the sequential program's third step
    for whole, expected in zip(ir.collect(g, list(got)), seq_out):
        for copy in whole if isinstance(whole, tuple) else (whole,):
            np.testing.assert_allclose(copy, expected, rtol=1e-9)
    # and differ from a single step's: the state really moved on
    once = torch_dist.run_ranked(ranked, inputs)
    assert not np.allclose(_flat(once)[0], _flat(got)[0])


def test_a_rank_that_fails_names_its_rank_and_op():
    b = ir.FunctionBuilder("lookup")
    table = b.input("table", ir.TensorType((5, 3), F64, 0))
    ids = b.input("ids", ir.TensorType((4,), ir.DType.int64, 0))
    f = b.finish([b.call("Embedding", table, ids, name="rows")])
    g, _ = propagate(f, {"ids": (Mesh((2,)), [S(0)])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    bad = [np.zeros((5, 3)), np.array([0, 1, 2, 9])]  # row 9 is on rank 1
    with pytest.raises(torch_dist.BackendError, match=r"rank 1 failed at `rows.*Embedding") as e:
        torch_dist.run_ranked(ranked, bad)
    assert e.value.rank == 1 and "ids must lie in [0, 5)" in str(e.value)


def test_an_op_without_a_torch_kernel_is_refused_before_any_process_starts():
    b = ir.FunctionBuilder("erf")
    a = b.input("a", ir.TensorType((4, 3), device=0))
    f = b.finish([b.call("Erf", a, name="r")])
    ranked = lower_to_ranks(f)
    with pytest.raises(torch_dist.BackendError, match="Erf has no torch kernel"):
        torch_dist.run_ranked(ranked, ir.random_inputs(f, 0))


def test_the_conv_halo_exchange_runs_on_gloo():
    b = ir.FunctionBuilder("conv")
    a = b.input("a", ir.TensorType((1, 7, 5, 3), device=0))
    w = b.input("w", ir.TensorType((3, 3, 3, 4), device=0))
    f = b.finish([b.call("Conv2D", a, w, padding="same", name="r")])
    g, _ = propagate(f, {"a": (Mesh((3,)), [S(1)])}, inputs="distribute")  # 3, 2, 2 rows
    ranked = lower_to_ranks(g)
    assert "RecvFrom" in [op.op_type for op in ranked.programs[1].ops]  # halo rows move
    inputs = ir.random_inputs(f, 4)
    assert_same(torch_dist.run_ranked(ranked, inputs), ir.execute(f, inputs), rtol=1e-5)


def test_steps_without_carry_are_refused():
    f = mlp()
    ranked = lower_to_ranks(transforms.unroll_pmap(transforms.data_parallel(f, 2)))
    with pytest.raises(torch_dist.BackendError, match="needs carry"):
        torch_dist.run_ranked(ranked, ir.random_inputs(f, 0), steps=2)


# -- a rank that hangs, a parent that is killed -----------------------------------------

HANGING = """
import numpy as np
import ir
from ir.sharding import lower_to_ranks
from ir.sharding.rank_classes import classes, instantiate
from dataclasses import replace

b = ir.FunctionBuilder("hang")
x = b.input("x", ir.TensorType((2, 3), device=0))
moved = b.call("Send", x, to_device=1, name="moved")
f = b.finish([b.call("Relu", moved, name="y")])
ranked = lower_to_ranks(f)
recv = [op.op_type for op in ranked.programs[1].ops].index("RecvFrom")
programs = {0: ranked.programs[0], 1: instantiate(ranked.programs[1], {(recv, "tag"): 99})}
unique, dedup, parameters = classes(programs)
hanging = replace(ranked, programs=programs, unique=unique, dedup=dedup, parameters=parameters)
inputs = [np.ones((2, 3), np.float32)]
"""


def test_a_rank_that_waits_forever_ends_the_run_within_the_timeout_naming_the_ranks():
    """Rank 1 waits for a message with a tag nobody sends, rank 0 for its send to be
    taken: the timeout says both wait for a peer, and where each one waits."""
    namespace: dict = {}
    exec(HANGING, namespace)
    with pytest.raises(ir.ExecutionError, match=r"within 3 s: every rank left waits") as e:
        torch_dist.run_ranked(namespace["hanging"], namespace["inputs"], timeout_s=3)
    assert isinstance(e.value, torch_dist.RankTimeoutError) and e.value.rank in (0, 1)
    message = str(e.value)
    waits = r"rank {},? (is )?communicating at op 0 `{}"
    assert re.search(waits.format(1, r"moved: .*RecvFrom\(peer=0, tag=99"), message)
    assert re.search(waits.format(0, r"x_sent: .*SendTo\(x, peer=1"), message)


def _children(pid: int) -> list[int]:
    from pathlib import Path

    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_no_worker_survives_its_parent_killed_by_sigkill():
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = HANGING + "\nfrom ir.backends import torch_dist\n"
    script += "torch_dist.run_ranked(hanging, inputs, timeout_s=600)\n"
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=root)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _children(parent.pid)
        assert len(workers) >= 2, "the two rank processes did not start"
        time.sleep(1.0)  # they are inside the gloo world, waiting
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [w for w in workers if _alive(w)]
    for w in survivors:
        os.kill(w, signal.SIGKILL)  # a failing test leaves no orphans behind either
    assert not survivors


def test_a_rank_that_dies_without_a_word_is_named_not_its_peer(monkeypatch):
    """A rank killed outside Python (out of memory, a crash in C) says nothing; its peer
    then fails in gloo ("Connection reset by peer"): the error names the dead rank, how it
    ended, and comes at once (workers are forked, so the patched step reaches them)."""
    from ir.backends import torch_ranked

    step = torch_ranked._step

    def dying(program, args, context, state):
        if context.me == 1:
            os._exit(3)
        return step(program, args, context, state)

    monkeypatch.setattr(torch_ranked, "_step", dying)
    f = mlp()
    g = transforms.data_parallel(f, 2)
    with pytest.raises(torch_dist.BackendError, match=r"^rank 1 \(pid \d+\) exited with status 3"):
        torch_dist.run_ranked(
            lower_to_ranks(g), ir.distribute(g, ir.random_inputs(f, 0), source=f), timeout_s=60
        )


@pytest.mark.parametrize("kind", ["AllReduce", "ReduceScatter"])
@pytest.mark.parametrize("dtype", [F64, ir.DType.int64])
def test_a_mean_collective_in_flight_ends_in_its_declared_dtype(kind, dtype):
    """All-reduces and reduce-scatters are posted asynchronously and divided once done; a
    mean keeps the declared dtype (integers rounded toward zero) over uneven blocks (5 rows
    on 2 ranks)."""
    b = ir.FunctionBuilder("mean")
    xs = b.input("xs", ir.TupleType(tuple(ir.TensorType((5, 3), dtype, d) for d in (0, 1))))
    options = {"dim": 0} if kind == "ReduceScatter" else {}
    f = b.finish([b.call(kind, xs, op="mean", name="ys", **options)])
    x = np.arange(15).reshape(5, 3)
    args = [(x.astype(dtype.numpy), (3 * x + 2).astype(dtype.numpy))]
    (got,) = torch_dist.run_ranked(lower_to_ranks(f), args)
    (want,) = ir.execute(f, args)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype.numpy
        np.testing.assert_array_equal(g, np.trunc(w).astype(dtype.numpy))


def test_a_step_waits_for_a_collective_that_nothing_reads(monkeypatch, tmp_path):
    """An all-reduce is posted asynchronously; one whose result no op reads (here on both
    ranks) is still waited for before the step ends, so it cannot outlive its step or fail
    unheard. Workers are forked: the patched collective records each wait in a file."""
    from ir.backends import torch_ranked

    posted = torch_ranked._collective

    class Recorded:
        def __init__(self, work, me):
            self.work, self.me = work, me

        def wait(self):
            (tmp_path / f"waited{self.me}").touch()
            return self.work.wait()

        def is_completed(self):
            return self.work.is_completed()

    def recorded(x, op, me, *rest):
        y = posted(x, op, me, *rest)
        if isinstance(y, torch_ranked.Pending):
            y.work = Recorded(y.work, me)
        return y

    monkeypatch.setattr(torch_ranked, "_collective", recorded)
    b = ir.FunctionBuilder("unread")
    xs = b.input("xs", ir.TupleType((ir.TensorType((4, 3), F64, 0), ir.TensorType((4, 3), F64, 1))))
    b.call("AllReduce", xs, name="unread")
    f = b.finish([b.call("Relu", b.call("TupleGet", xs, index=0, name="x0"), name="r")])
    ranked = lower_to_ranks(f)
    assert all("RankCollective" in [op.op_type for op in p.ops] for p in ranked.unique)
    (got,) = torch_dist.run_ranked(ranked, [(np.ones((4, 3)), np.ones((4, 3)))])
    np.testing.assert_array_equal(got, np.ones((4, 3)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["waited0", "waited1"]
