"""Issue 25: the torch backend listens on loopback only, and a run that stops making
progress names the rank that stopped.

Every launcher (``torch_dist.run``, ``run_ranked``, ``measure``, ``profile_ops``,
``ir.calibrate``'s gloo benchmark) is run while a thread samples the TCP sockets that
this process and its children listen on (``/proc``); a hanging rank holds the world
open for seconds, so its store and every gloo connection are up while it is sampled."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

import ir
from ir import transforms
from ir.builder import FunctionBuilder
from ir.loopback import loopback_environment, loopback_interface
from ir.types import TensorType

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

from _listening import ListenWatch, is_loopback, listening

from ir.backends import torch_dist
from ir.sharding import lower_to_ranks

F64 = ir.DType.float64


def _sleeps_on_relu(monkeypatch) -> None:
    """Relu's kernel, in the forked workers, computes for an hour (a stuck rank)."""
    get_op = torch_dist.get_op

    def hanging(xs, attributes):
        time.sleep(3600)

    def patched(op_type: str):
        record = get_op(op_type)
        return dataclasses.replace(record, kernel=hanging) if op_type == "Relu" else record

    monkeypatch.setattr(torch_dist, "get_op", patched)


def _two_devices() -> tuple[ir.Function, list]:
    """x on device 0 moves to device 1, whose Relu result comes back and is added."""
    b = FunctionBuilder("two")
    x = b.input("x", TensorType((2, 3), F64, 0))
    moved = b.call("Send", x, to_device=1, name="moved")
    y = b.call("Relu", moved, name="y")
    back = b.call("Send", y, to_device=0, name="back")
    return b.finish([b.call("Add", x, back, name="z")]), [np.ones((2, 3))]


def test_the_helper_sees_a_socket_listening_on_every_interface():
    """The check can fail: a socket bound to all interfaces is reported as such."""
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        seen = listening([os.getpid()])
    assert ("0.0.0.0", port) in seen
    assert not is_loopback("0.0.0.0") and not is_loopback("::")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")


def test_a_stuck_rank_is_named_with_its_op_and_nothing_listens_beyond_loopback(monkeypatch):
    """Issue 25: device 1 computes forever; the timeout names rank 1 (device 1) and its
    op, not every device; meanwhile the store and gloo listen on loopback only."""
    _sleeps_on_relu(monkeypatch)
    f, inputs = _two_devices()
    with ListenWatch(os.getpid()) as watch, pytest.raises(ir.ExecutionError) as e:
        torch_dist.run(f, inputs, timeout_s=4)
    error = e.value
    assert isinstance(error, torch_dist.RankTimeoutError)
    assert (error.rank, error.device) == (1, 1)
    assert error.op is not None and "= Relu(moved)" in error.op
    message = str(error)
    assert re.search(
        r"within 4 s: rank 1 \(device 1\) stopped making progress, computing at op 1 "
        r"`y: .*Relu\(moved\)` for \d",
        message,
    ), message
    assert re.search(r"rank 0 \(device 0\) is communicating at op 2 `back: .*Send", message)
    assert watch.seen, "no listening socket was sampled: the check would pass vacuously"
    assert watch.beyond_loopback == []


def test_a_ranked_run_listens_on_loopback_only():
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    g = transforms.megatron(f, dp=2, tp=2)
    ranked = lower_to_ranks(g)
    inputs = ir.distribute(g, ir.random_inputs(f, 0), source=f)
    with ListenWatch(os.getpid()) as watch:
        got = ir.collect(g, torch_dist.run_ranked(ranked, inputs))
    want = ir.execute(f, ir.random_inputs(f, 0))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert watch.seen and watch.beyond_loopback == []


def test_measure_and_profile_listen_on_loopback_only():
    from ir.backends.profile import profile_ops

    f = ir.models.mlp(8, 4, 6, 4, layers=2, dtype=F64)
    g = transforms.data_parallel(f, 2)
    inputs = ir.distribute(g, ir.random_inputs(f, 0), source=f)
    with ListenWatch(os.getpid()) as watch:
        torch_dist.measure(g, inputs, steps=1, warmup=0)
        profile_ops(g, processes=2, repeats=2, warmup=0, progress=False)
    assert watch.seen and watch.beyond_loopback == []


def test_the_calibration_gloo_benchmark_listens_on_loopback_only():
    from ir.calibration import CalibrationOptions, _gloo

    opts = dataclasses.replace(CalibrationOptions.quick(), message_bytes=(2**10, 2**12))
    with ListenWatch(os.getpid()) as watch:
        samples = _gloo(opts)
    assert {s.kind for s in samples} == {"send", "allreduce"}
    assert watch.seen and watch.beyond_loopback == []


def test_the_workers_are_told_the_loopback_interface():
    name = loopback_interface()
    flags = (Path("/sys/class/net") / name / "flags").read_text()
    assert int(flags, 16) & 0x8  # Linux's IFF_LOOPBACK
    assert loopback_environment() == {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}


def test_progress_names_the_worker_that_is_not_waiting_for_a_peer():
    import multiprocessing as mp

    from ir.backends.workers import Progress

    progress = Progress(mp.get_context("fork"), 4)
    names = [f"rank {w}" for w in range(4)]
    progress.at(0, 5, communicating=True)
    progress.at(1, 2)  # computing
    progress.done(2)
    # rank 3 never got past setting up: it and rank 1 are not waiting; 3 has been longer
    stuck, said = progress.stalled([0, 1, 2, 3], names, lambda w, i: f"op{i}")
    assert stuck == 3 and said.startswith("rank 3 stopped making progress, setting up")
    assert "rank 1 is computing at op 2 `op2`" in said
    assert "rank 0 is communicating at op 5 `op5`" in said
    assert "rank 2 is done with its ops" in said
    progress.at(3, 0, communicating=True)
    stuck, said = progress.stalled([0, 1, 3], names)
    assert stuck == 1 and said.startswith("rank 1 stopped making progress, computing at op 2")
    progress.at(1, 3, communicating=True)
    stuck, said = progress.stalled([0, 1, 3], names)
    assert stuck == 0 and said.startswith("every rank left waits for a peer")
    assert progress.index(0) == 5 and progress.index(3) == 0
