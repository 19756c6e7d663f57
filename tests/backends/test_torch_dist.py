"""The torch.distributed backend runs programs on real processes (gloo over loopback)
and gets what the numpy reference executor gets."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ir
from ir import DeviceVar, FunctionBuilder, TensorType, TupleType
from ir.backends import torch_dist
from ir.registry import OpKind
from ir.verify import describe_op

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")


def T(*shape, device=0):
    return TensorType(tuple(shape), device=device)


def _same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _collectives_program():
    """Every communication op of a global program, over devices 0..3, uneven shapes too."""
    b = FunctionBuilder("comm")
    x = b.input("x", T(7, 4))
    w = b.input("w", T(4, 4))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2, 3], name="xs")  # 3, 2, 2 rows
    ws = b.call("Broadcast", w, devices=[1, 2, 3], name="ws")
    parts = []
    for k in range(3):
        xk = b.call("TupleGet", xs, index=k)
        wk = b.call("TupleGet", ws, index=k)
        parts.append(b.call("Relu", b.call("MatMul", xk, wk)))
    ys = b.call("MakeTuple", *parts, name="ys")
    y = b.call("Gather", ys, dim=0, to_device=0, name="y")
    gathered = b.call("AllGather", ys, dim=0, name="gathered")  # uneven: point to point
    even = b.call("Broadcast", w, devices=[0, 1, 2, 3], name="even")
    summed = b.call("AllReduce", even, name="summed")
    biggest = b.call("AllReduce", even, op="max", name="biggest")
    rs = b.call("ReduceScatter", even, dim=1, name="rs")
    a2a = b.call("AllToAll", summed, split_dim=0, concat_dim=1, name="a2a")
    total = b.call("Reduce", a2a, to_device=2, name="total")
    back = b.call("Send", total, to_device=0, name="back")
    eg = b.call("AllGather", rs, dim=1, name="eg")  # even shapes: torch all_gather
    return b.finish([y, gathered, summed, biggest, rs, a2a, back, eg])


def test_every_global_communication_op_has_a_lowering():
    ranked_only = {"SendTo", "RecvFrom", "RankCollective", "Shard", "Unshard"}
    comm = {o.name for o in ir.all_ops() if o.kind is OpKind.COMMUNICATION}
    assert comm - ranked_only <= set(torch_dist._LOWERINGS)


def test_collectives_match_the_reference_executor():
    f = _collectives_program()
    inputs = ir.random_inputs(f, seed=1)
    _same(torch_dist.run(f, inputs), ir.execute(f, inputs))


def test_data_parallel_mlp_with_pmap_matches():
    b = FunctionBuilder("dp")
    x = b.input("x", T(8, 4))
    w = b.input("w", T(4, 3))
    xs = b.call("Scatter", x, dim=0, devices=[0, 1], name="xs")
    ws = b.call("Broadcast", w, devices=[0, 1], name="ws")
    body = FunctionBuilder("body")
    xi = body.input("xi", T(4, 4, device=DeviceVar("d")))
    wi = body.input("wi", T(4, 3, device=DeviceVar("d")))
    yi = body.call("Gelu", body.call("MatMul", xi, wi))
    ys = b.call("Pmap", xs, ws, subfunctions=[body.finish([yi])], name="ys")
    f = b.finish([b.call("AllGather", ys, dim=0, name="y")])
    inputs = ir.random_inputs(f, seed=2)
    got = torch_dist.run(f, inputs)
    _same(got, ir.execute(f, inputs))
    assert isinstance(got[0], tuple) and got[0][1].shape == (8, 3)


def test_unassigned_devices_are_refused():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((2,), device=None))
    f = b.finish([b.call("Relu", x)])
    with pytest.raises(torch_dist.BackendError, match="concrete device"):
        torch_dist.run(f, [np.ones(2, dtype=np.float32)])


def test_a_failing_worker_reports_the_device():
    b = FunctionBuilder("f")
    xs = b.input("xs", TupleType((T(2, device=0), T(2, device=1))))
    f = b.finish([b.call("AllReduce", xs)])
    with pytest.raises(ir.ExecutionError, match="needs a tuple of 2 arrays"):
        torch_dist.run(f, [(np.ones(2),)])


@pytest.mark.parametrize(("device", "label"), [(1, 7), (0, -1), (1, 2**40)])
def test_a_crashing_rank_names_its_device_the_op_and_the_original_error(device, label):
    b = FunctionBuilder("two")
    outs = []
    for d in (0, 1):
        y = b.input(f"y{d}", T(3, 4, device=d))
        z = b.input(f"z{d}", TensorType((3,), "int64", device=d))
        outs.append(b.call("Loss", y, z, name=f"l{d}"))
    f = b.finish(outs)
    labels = [np.array([0, 1, 2]), np.array([0, 1, 2])]
    labels[device][1] = label  # out of range on one device only
    args = [np.ones((3, 4), np.float32), labels[0], np.ones((3, 4), np.float32), labels[1]]
    with pytest.raises(torch_dist.BackendError) as caught:
        torch_dist.run(f, args, timeout_s=60)
    e = caught.value
    op = next(op for op in f.ops if op.device == device)
    assert (e.device, e.rank, e.op) == (device, device, describe_op(op))
    first_line, error_line = str(e).splitlines()[:2]
    assert first_line == (
        f"device {device} (rank {device} of 2) running 'two' failed at op {device}: {e.op}"
    )
    assert error_line.strip() == (
        f"ExecutionError: Loss: class labels z must be in [0, 4), got {label} at index [1]"
    )
    assert "Traceback" not in str(e) and "Traceback" in e.worker_traceback


@pytest.mark.parametrize(
    ("dp", "hp"),
    [(2, 1), (2, 2)],
    ids=["data-parallel", "data-over-horizontal"],
)
def test_parallel_training_step_matches_on_real_processes(dp, hp):
    from ir import models, transforms

    f = models.mlp(8, 4, 8, 4, layers=2, training=True)
    levels = [("dp", dp)] + ([("hp", hp)] if hp > 1 else [])
    g = transforms.nested(f, *levels)  # the seed-003 form (grouped collectives: issue 16)
    inputs = ir.random_inputs(f, seed=4)
    step_inputs = ir.distribute(g, inputs, source=f)  # as they are where g has no layouts
    got = torch_dist.run(g, step_inputs)
    _same(got, ir.execute(g, step_inputs))
    want = ir.execute(f, inputs)  # the parallel program returns what the sequential one does
    np.testing.assert_allclose(ir.collect(g, got, rtol=1e-5)[0], want[0], rtol=1e-5)


@pytest.mark.parametrize("transform", ["data_parallel", "horizontal_parallel"])
def test_steady_state_step_runs_on_real_processes(transform):
    """Each process gets its resident weights and batch slice (``ir.distribute``); the
    collected outputs equal the sequential program's."""
    from ir import models, transforms

    f = models.mlp(6, 4, 8, 4, layers=2, training=True)
    g = getattr(transforms, transform)(f, 2)
    inputs = ir.random_inputs(f, seed=5)
    step_inputs = ir.distribute(g, inputs, source=f)
    got = torch_dist.run(g, step_inputs)
    _same(got, ir.execute(g, step_inputs))
    for a, b in zip(ir.collect(g, got, rtol=1e-5), ir.execute(f, inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_send_each_moves_every_element_to_its_device_on_real_processes():
    b = ir.FunctionBuilder("send_each")
    piece = [ir.TensorType((2, 3), ir.DType.float32, d) for d in (0, 1)]
    xs = b.input("xs", ir.TupleType(tuple(piece)))
    f = b.finish(b.call("SendEach", xs, to_devices=[3, 2]))
    parts = (np.ones((2, 3), np.float32), 2 * np.ones((2, 3), np.float32))
    (got,) = torch_dist.run(f, [parts])
    (want,) = ir.execute(f, [parts])
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)


def test_keep_shard_keeps_each_group_position_block_on_real_processes():
    b = ir.FunctionBuilder("keep_shard")
    piece = [ir.TensorType((4, 3), ir.DType.float32, d) for d in range(4)]
    xs = b.input("xs", ir.TupleType(tuple(piece)))
    f = b.finish(b.call("KeepShard", xs, dim=0, groups=[[0, 2], [1, 3]]))
    parts = tuple(np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * d for d in range(4))
    (got,) = torch_dist.run(f, [parts])
    (want,) = ir.execute(f, [parts])
    for d, (a, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, w)
        # positions 0 and 1 of groups [0, 2] and [1, 3]: devices 0, 1 keep rows 0-1
        np.testing.assert_array_equal(w, parts[d][:2] if d < 2 else parts[d][2:])


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "options"),
    [(2, 2, 1, {}), (2, 1, 2, {"zero": 1}), (1, 2, 2, {"sequence_parallel": True})],
    ids=["dp2-tp2", "dp2-pp2-zero1", "tp2-pp2-sp"],
)
def test_the_3d_step_runs_on_real_processes(dp, tp, pp, options):
    """Grouped collectives run one torch.distributed collective per group (tensor groups,
    data groups), each on its own process group; the step equals the sequential one."""
    from ir import models, transforms

    t = transforms.training(models.mlp(8, 4, 8, 4, layers=4), "adam")
    g = transforms.megatron(t, dp, tp, pp, 2, **options)
    inputs = [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed=6))
    ]
    step_inputs = ir.distribute(g, inputs, source=t)
    got = torch_dist.run(g, step_inputs)
    _same(got, ir.execute(g, step_inputs))
    for a, b in zip(ir.collect(g, got, rtol=1e-5), ir.execute(t, inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_step_runs_on_real_processes(schedule):
    """The microbatch split is a tuple made on the first stage's device only; the other
    stages' processes hold no part of it and receive their activations by sends."""
    from ir import models, transforms

    t = transforms.training(models.mlp(8, 4, 8, 4, layers=4))
    g = transforms.pipeline_parallel(t, 2, 2, schedule)
    inputs = ir.random_inputs(t, seed=7)
    step_inputs = ir.distribute(g, inputs, source=t)
    got = torch_dist.run(g, step_inputs)
    _same(got, ir.execute(g, step_inputs))
    for a, b in zip(ir.collect(g, got, rtol=1e-5), ir.execute(t, inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_process_that_dies_without_a_word_is_named_not_its_peer(monkeypatch):
    """A process killed outside Python says nothing; its peer then fails in gloo: the error
    names the dead one's device and how it ended (workers are forked: the patch reaches
    them)."""
    run_ops = torch_dist._run_ops

    def dying(function, rank, *timed):
        if rank.device == 1:
            os._exit(3)
        return run_ops(function, rank, *timed)

    monkeypatch.setattr(torch_dist, "_run_ops", dying)
    b = FunctionBuilder("f")
    xs = b.input("xs", TupleType((T(2, device=0), T(2, device=1))))
    f = b.finish([b.call("AllReduce", xs)])
    with pytest.raises(
        torch_dist.BackendError, match=r"^the process of device 1 \(pid \d+\) exited with status 3"
    ) as e:
        torch_dist.run(f, [(np.ones(2), np.ones(2))], timeout_s=60)
    assert e.value.device == 1


@pytest.mark.parametrize(
    ("dp", "options"),
    [(2, {"ep": 2}), (1, {"cp": 2}), (2, {"ep": 2, "cp": 2, "zero": 3})],
    ids=["ep2", "cp2-ring", "ep2-cp2-zero3"],
)
def test_experts_and_ring_attention_run_on_real_processes(dp, options):
    """Expert parallelism's grouped all-to-alls and ring attention's point-to-point ring
    steps (RingShift: every member's isend/irecv at once) on gloo processes: the step
    equals the reference executor's and the sequential step."""
    from ir import models, transforms

    f = models.gpt(4, 8, 16, 4, 32, 1, experts=4, top_k=2, dtype="float64")
    t = transforms.training(f, "adam")
    g = transforms.megatron(t, dp, **options)
    inputs = [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed=8))
    ]
    step_inputs = ir.distribute(g, inputs, source=t)
    got = torch_dist.run(g, step_inputs)
    _same(got, ir.execute(g, step_inputs))
    for a, b in zip(ir.collect(g, got, rtol=1e-9), ir.execute(t, inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
