"""Bubbles of ``pipeline_parallel``'s own training steps against the closed forms.

The model: a stem ``x (b, 1) @ w_stem (1, H)``, then ``p * k`` equal layers
``h @ w_i (H, H)``, then a cross-entropy loss; trained with SGD. Stage ``s`` holds
``k`` equal layers (stage 0 the stem too), so its forward takes ``tf = k * 2bH^2``
flops per microbatch and its backward ``tb = k * 4bH^2`` (the gradients of the
weight and of the activation of each layer). The stem, loss, loss gradient and
running gradient sums (``Add``) cost ``O(bH + H^2)`` flops against the layers'
``O(bH^2)``: with ``b = H = 2**20`` they are a few millionths of a stage's work;
the test sums their time and allows exactly that much deviation (``_extras_s``),
so the closed forms are checked to about 1e-6.

The topology makes compute time ``flops / peak`` exactly (no launch overhead,
memory traffic free) and links free (1e30 B/s, no latency: a send takes about
1e-18 of a layer), so a bubble is the schedule's alone, not communication's.

Measured: the *pipelined part* of the step, from the start of the first layer's
forward (stage 0, microbatch 0) to the end of the last per-microbatch backward
op; the optimizer steps after it and the input split before it are outside.
The idle fraction of a stage's compute stream in that window is compared with
``(p-1)/(m+p-1)`` (GPipe, 1F1B), and for the interleaved schedule with ``v``
chunks its idle time over its busy time with ``(p-1)/(v m)`` (Megatron-LM,
Narayanan et al. 2021).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir import DType, FunctionBuilder, TensorType
from ir.transforms import live_microbatches, pipeline_parallel, training

ROWS = HIDDEN = 2**20  # rows per microbatch, layer width
TOPOLOGY_KW = dict(
    peak_flops=1e12,
    mem_bandwidth_bytes_per_s=1e30,
    launch_overhead_s=0.0,
    link_bandwidth_bytes_per_s=1e30,
    link_latency_s=0.0,
)
LAYER_S = 2 * ROWS * HIDDEN**2 / TOPOLOGY_KW["peak_flops"]  # one layer MatMul, one microbatch


def chain(layers: int, microbatches: int) -> ir.Function:
    """The training step of a stem and ``layers`` equal linear layers (see the module doc)."""
    b = FunctionBuilder("chain")
    batch = ROWS * microbatches
    stem = b.input("w_stem", TensorType((1, HIDDEN), DType.float32, 0))
    ws = [b.input(f"w{i}", TensorType((HIDDEN, HIDDEN), DType.float32, 0)) for i in range(layers)]
    x = b.input("x", TensorType((batch, 1), DType.float32, 0))
    z = b.input("z", TensorType((batch,), DType.int64, 0))
    h = b.call("MatMul", x, stem, name="h_stem")
    for i, w in enumerate(ws):
        h = b.call("MatMul", h, w, name=f"h{i}")
    return training(b.finish([h, b.call("Loss", h, z, name="l")]))


def pipelined(p: int, m: int, schedule: str, chunks: int = 1, k: int = 1) -> ir.SimResult:
    f = chain(p * chunks * k, m)
    g = pipeline_parallel(f, p, m, schedule, chunks=chunks)
    return ir.simulate(g, ir.Topology.uniform(p, **TOPOLOGY_KW))


def window(result: ir.SimResult) -> tuple[float, float]:
    """The pipelined part: first layer forward to last per-microbatch op."""
    per_mb = [
        ev
        for ev in result.events
        if ev.stream == "compute" and "_mb" in ev.op.outputs[0].name and ev.dur_s > 0
    ]
    return min(ev.start_s for ev in per_mb), max(ev.end_s for ev in per_mb)


def busy_in(result: ir.SimResult, device: int, lo: float, hi: float) -> float:
    return sum(
        max(0.0, min(ev.end_s, hi) - max(ev.start_s, lo))
        for ev in result.events_on(device, "compute")
    )


def _extras_s(result: ir.SimResult) -> float:
    """Time of every compute op that is not a layer's MatMul (each of which takes
    ``LAYER_S``): stem, loss, loss gradient, gradient sums."""
    return sum(
        ev.dur_s for ev in result.events if ev.stream == "compute" and ev.dur_s < LAYER_S / 2
    )


def check_idle_fraction(p: int, m: int, schedule: str) -> None:
    result = pipelined(p, m, schedule)
    lo, hi = window(result)
    extras = _extras_s(result)
    assert extras < 1e-5 * (hi - lo)  # the extras are negligible; the tolerance is theirs
    want = (p - 1) / (m + p - 1)
    for device in range(p):
        idle = 1 - busy_in(result, device, lo, hi) / (hi - lo)
        assert idle == pytest.approx(want, rel=1e-9, abs=4 * extras / (hi - lo)), device


STAGES = st.sampled_from([2, 4, 8, 16])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 64), (16, 1), (16, 64), (8, 7)])
def test_gpipe_and_1f1b_bubble_extremes(schedule: str, p: int, m: int) -> None:
    check_idle_fraction(p, m, schedule)


@settings(max_examples=12, deadline=None)
@given(STAGES, st.integers(1, 64), st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_idle_fraction_is_p_minus_1_over_m_plus_p_minus_1(p, m, schedule):
    check_idle_fraction(p, m, schedule)


def check_interleaved(p: int, m: int, chunks: int) -> None:
    result = pipelined(p, m, "interleaved", chunks=chunks)
    lo, hi = window(result)
    extras = _extras_s(result)
    assert extras < 1e-5 * (hi - lo)
    want = (p - 1) / (chunks * m)
    for device in range(p):
        busy = busy_in(result, device, lo, hi)
        assert (hi - lo - busy) / busy == pytest.approx(want, rel=1e-9, abs=4 * extras / busy)


@pytest.mark.parametrize(("p", "m", "chunks"), [(2, 2, 2), (2, 64, 2), (4, 4, 3), (16, 16, 2)])
def test_interleaved_bubble_extremes(p: int, m: int, chunks: int) -> None:
    check_interleaved(p, m, chunks)


@settings(max_examples=6, deadline=None)
@given(STAGES, st.integers(1, 8), st.integers(2, 4))
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal_time(p, groups, chunks):
    if p * groups > 64:
        groups = 64 // p
    check_interleaved(p, p * groups, chunks)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 2), (4, 9), (8, 5), (8, 16)])
def test_1f1b_keeps_min_p_minus_s_m_microbatches_alive_on_stage_s(p: int, m: int) -> None:
    g = pipeline_parallel(chain(p, m), p, m, "1f1b")
    assert [live_microbatches(g, s) for s in range(p)] == [min(p - s, m) for s in range(p)]


def test_gpipe_keeps_every_microbatch_alive_on_every_stage() -> None:
    p = 4
    for m in (1, 3, 8, 16):
        g = pipeline_parallel(chain(p, m), p, m, "gpipe")
        assert [live_microbatches(g, s) for s in range(p)] == [m] * p
