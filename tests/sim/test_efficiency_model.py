"""The efficiency model of the GPU presets (ir.hardware.kernels, .comm, .efficiency) and the
simulator's host clock: each property below is one the model's docstrings promise."""

from __future__ import annotations

import itertools
import math

import pytest

import ir
from ir import DType, FunctionBuilder, TensorType
from ir.collectives import collective_time_s
from ir.hardware import EfficiencyFactors, GemmModel
from ir.hardware.efficiency import A100_SXM, H100_SXM, NVSWITCH_A100
from ir.registry import Cost

F16 = DType.float16


def chain(op_type: str, n: int, shape=(64, 64), dtype=F16) -> ir.Function:
    """``n`` dependent ops of ``op_type`` on one device (x -> op -> op -> ...)."""
    b = FunctionBuilder("chain")
    x = b.input("x", TensorType(shape, dtype, 0))
    w = b.input("w", TensorType((shape[-1], shape[-1]), dtype, 0))
    for _ in range(n):
        x = b.call(op_type, x, w) if op_type == "MatMul" else b.call(op_type, x)
    return b.finish([x])


# -- GEMMs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "fraction", "shape"),
    [(A100_SXM, 267.9 / 312, (6912, 16384, 2048)), (H100_SXM, 792.1 / 989, (6144, 17920, 2816))],
)
def test_the_gemm_model_meets_the_published_mamf_at_its_measured_shape(model, fraction, shape):
    assert model.gemm.efficiency(1, *shape) == pytest.approx(fraction, rel=1e-12)
    # and no shape beats it by more than the wave and inner-loop slack of the reference
    for m, n, k in ((8192, 8192, 8192), (16384, 16384, 16384), (4096, 4096, 4096)):
        assert model.gemm.efficiency(1, m, n, k) <= model.gemm.max_efficiency


def test_wave_quantisation_makes_one_tile_too_many_cost_a_wave():
    g = GemmModel(sms=108, max_efficiency=1.0, tiles=((128, 128, 1.0),))
    full = g.time_s(1, 128 * 108, 128, 1024, 1.0)  # exactly one wave
    over = g.time_s(1, 128 * 109, 128, 1024, 1.0)  # one tile more: a second wave
    assert over == pytest.approx(2 * full)
    assert g.efficiency(1, 128 * 109, 128, 1024) < 0.51 * g.efficiency(1, 128 * 108, 128, 1024)


def test_tile_quantisation_charges_a_partial_tile_in_full():
    g = GemmModel(sms=1, max_efficiency=1.0, tiles=((128, 128, 1.0),))
    assert g.time_s(1, 129, 128, 512, 1.0) == pytest.approx(2 * g.time_s(1, 128, 128, 512, 1.0))


def test_split_k_is_taken_only_when_it_is_faster():
    g = A100_SXM.gemm
    bandwidth = 2039e9 * A100_SXM.memory_efficiency
    no_split = g.time_s(1, 128, 128, 65536, 312e12)
    split = g.time_s(1, 128, 128, 65536, 312e12, bandwidth)
    assert split < 0.2 * no_split  # one tile, deep K: splitting fills the chip
    big = (1, 8192, 8192, 8192)
    assert g.time_s(*big, 312e12, bandwidth) == g.time_s(*big, 312e12)


def test_small_matmuls_run_far_below_the_peak_and_large_ones_near_it():
    a100 = ir.Topology.preset("a100-hgx", 1).devices[0]
    ideal = ir.Topology.preset("a100-hgx", 1, ideal=True).devices[0]

    def achieved(m, n, k):
        cost = Cost(
            2.0 * m * n * k, 2 * (m * k + k * n + m * n), 0, 2.0 * m * n * k, ((1, m, n, k),)
        )
        return cost.flops / a100.op_time_s(cost, F16) / 312e12

    assert achieved(8192, 8192, 8192) > 0.8
    assert achieved(2048, 384, 1024) < 0.6  # a tensor-parallel slice of a small model
    assert achieved(1, 4096, 4096) < 0.01  # a decode step's matrix-vector product: memory-bound
    cost = Cost(2.0 * 8192**3, 0, 0, 2.0 * 8192**3, ((1, 8192, 8192, 8192),))
    assert ideal.op_time_s(cost, F16) < a100.op_time_s(cost, F16)


# -- memory-bound kernels, views, optimizer ------------------------------------------


def test_a_memory_bound_kernel_moves_its_bytes_at_the_achieved_bandwidth():
    a100 = ir.Topology.preset("a100-hgx", 1).devices[0]
    nbytes = 512 * 2**20
    t = a100.op_time_s(Cost(0.0, nbytes / 2, nbytes / 2), F16)
    want = nbytes / (2039e9 * A100_SXM.memory_efficiency) + A100_SXM.kernel_gap_s
    assert t == pytest.approx(want, rel=1e-12)
    tiny = a100.op_time_s(Cost(0.0, 64, 64), F16)
    assert tiny == pytest.approx(A100_SXM.kernel_min_s)


def test_a_reshape_launches_nothing_and_the_optimizer_is_a_fused_share():
    a100 = ir.Topology.preset("a100-hgx", 1)
    r = ir.simulate(_reshape(), a100)
    (event,) = r.events_on(0, "compute")
    assert event.dur_s == 0.0
    d = a100.devices[0]
    opt = Cost(4e6, 16e6, 16e6, kernel="optimizer")
    assert d.op_time_s(opt, F16) == pytest.approx(32e6 / (2039e9 * A100_SXM.memory_efficiency))
    assert d.host_time_s(opt) == A100_SXM.host.optimizer_s < A100_SXM.host.op_s


def _reshape() -> ir.Function:
    b = FunctionBuilder("r")
    x = b.input("x", TensorType((64, 64), F16, 0))
    return b.finish([b.call("Reshape", x, shape=(4096,))])


# -- the host clock -------------------------------------------------------------------


def test_tiny_kernels_are_host_bound():
    """100 dependent tiny ops: the host issues one every op_s, the device waits for it."""
    n = 100
    f = chain("Relu", n, (8, 8))
    r = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
    host = A100_SXM.host.op_s
    assert r.step_time_s == pytest.approx(n * host + A100_SXM.kernel_min_s, rel=1e-9)
    ideal = ir.simulate(f, ir.Topology.preset("a100-hgx", 1, ideal=True))
    assert ideal.step_time_s < 0.5 * r.step_time_s


def test_large_kernels_hide_the_host():
    """Kernels longer than their dispatch: the host runs ahead and costs only the first op."""
    n = 10
    f = chain("MatMul", n, (8192, 8192))
    a100 = ir.Topology.preset("a100-hgx", 1)
    r = ir.simulate(f, a100)
    busy = sum(e.dur_s for e in r.events_on(0, "compute"))
    first_issue = A100_SXM.host.op_s
    assert r.step_time_s == pytest.approx(first_issue + busy, rel=1e-9)


def test_the_host_waits_for_its_device_after_a_point_to_point_transfer():
    """After a send the host of each side synchronises: the next op is issued only once the
    device is idle, so its host time is exposed again."""
    g = _send_program()
    a100 = ir.Topology.preset("a100-hgx", 2)
    r = ir.simulate(g, a100)
    send = next(e for e in r.events_on(1, "communication"))
    (after,) = [e for e in r.events_on(1, "compute")]
    # the receiving host waits for the transfer, then issues the matmul: op_s later
    assert after.start_s == pytest.approx(send.start_s + send.dur_s + A100_SXM.host.op_s)


def test_transfers_a_host_issues_one_after_another_are_one_batch():
    """Megatron-LM posts an exchange's sends and receives in one batch_isend_irecv and
    waits once: a host's transfers with nothing issued between them run together (the
    second does not wait for the first's synchronisation); with an op issued between
    them, the second waits for the host to come back from the first."""
    a100 = ir.Topology.preset("a100-hgx", 3)
    for between, together in ((False, True), (True, False)):
        b = FunctionBuilder("exchange")
        x = b.input("x", TensorType((8192, 8192), F16, 0))
        y = b.call("MatMul", x, x)
        to_1 = b.call("Send", y, to_device=1)
        if between:
            y = b.call("MatMul", y, x)
        to_2 = b.call("Send", y, to_device=2)
        r = ir.simulate(b.finish([to_1, to_2]), a100)
        first, second = sorted(r.events_on(0, "communication"), key=lambda e: e.start_s)
        if together:
            assert second.start_s == pytest.approx(first.start_s, abs=A100_SXM.host.comm_s)
        else:
            assert second.start_s > first.end_s


def _send_program() -> ir.Function:
    b = FunctionBuilder("p2p")
    x = b.input("x", TensorType((8192, 8192), F16, 0))
    w = b.input("w", TensorType((8192, 8192), F16, 1))
    y = b.call("MatMul", x, x)
    z = b.call("Send", y, to_device=1)
    return b.finish([b.call("MatMul", z, w)])


def test_an_ideal_preset_has_no_host_and_no_models():
    t = ir.Topology.preset("a100-hgx", 4, ideal=True)
    assert t.ideal and t.collectives is None
    assert all(d.kernels is None and d.host_time_s(Cost()) == 0.0 for d in t.devices)
    assert not ir.Topology.preset("a100-hgx", 4).ideal
    assert ir.Topology.preset("cpu", 2).ideal  # the CPU preset is this machine's roofline


# -- collectives ------------------------------------------------------------------------


def allreduce_bus_bandwidth(size_bytes: float, devices, topology) -> float:
    t = collective_time_s("allreduce", size_bytes, devices, topology)
    n = len(devices)
    return 2 * (n - 1) / n * size_bytes / t


def test_large_all_reduces_on_an_a100_node_reach_nccls_cap():
    node = ir.Topology.preset("a100-hgx", 8)
    busbw = allreduce_bus_bandwidth(2**30, range(8), node)
    assert busbw == pytest.approx(235e9, rel=0.01)  # NCCL's cap, latency negligible at 1 GiB
    assert allreduce_bus_bandwidth(2**16, range(8), node) < 0.1 * busbw  # latency-bound


def test_a_collective_never_gets_faster_with_more_bytes():
    node = ir.Topology.preset("a100-hgx", 16)
    for kind in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast"):
        times = [collective_time_s(kind, 2.0**p, range(16), node) for p in range(4, 32)]
        assert all(a <= b for a, b in itertools.pairwise(times)), kind


def test_across_nodes_a_ring_is_paced_by_the_nics_of_the_node():
    """One GPU per node drives one NIC; eight GPUs per node drive eight."""
    cluster = ir.Topology.preset("a100-hgx", 32)
    size = 2**34  # 16 GiB: the 62 ring steps' latency is a fraction of a percent
    one_per_node = allreduce_bus_bandwidth(size, [0, 8, 16, 24], cluster)
    whole = allreduce_bus_bandwidth(size, range(32), cluster)
    nic = 25e9 * NVSWITCH_A100.inter_efficiency
    assert one_per_node == pytest.approx(nic, rel=0.02)
    assert whole == pytest.approx(min(235e9, 8 * nic), rel=0.02)


def test_point_to_point_sends_take_a_step_latency_and_the_links_achieved_bandwidth():
    node = ir.Topology.preset("a100-hgx", 16)
    size = 2**28
    inside = collective_time_s("send", size, [0, 1], node)
    across = collective_time_s("send", size, [0, 8], node)
    assert inside == pytest.approx(size / (300e9 * NVSWITCH_A100.intra_efficiency), rel=0.02)
    assert across == pytest.approx(size / (25e9 * NVSWITCH_A100.inter_efficiency), rel=0.02)
    assert inside > size / (300e9 * NVSWITCH_A100.intra_efficiency)  # plus a step's latency


def test_pcie_presets_use_no_nvlink_only_protocol():
    pcie = ir.Topology.preset("a100-pcie", 4).collectives
    assert [p.name for p in pcie._protocols()] == ["LL", "Simple"]


# -- factors and the fit ----------------------------------------------------------------


def test_factors_scale_the_model_and_cap_efficiencies_at_one():
    t = ir.Topology.preset("a100-hgx", 8)
    fast = EfficiencyFactors(gemm=10.0, memory=10.0, network=10.0, host=0.5).apply(t)
    k = fast.devices[0].kernels
    assert k.gemm.max_efficiency == 1.0 and k.memory_efficiency == 1.0
    assert k.host.op_s == pytest.approx(0.5 * A100_SXM.host.op_s)
    assert fast.collectives.intra_efficiency == 1.0
    with pytest.raises(ir.TopologyError, match="no efficiency model"):
        EfficiencyFactors(gemm=0.9).apply(ir.Topology.preset("a100-hgx", 8, ideal=True))
    with pytest.raises(ir.TopologyError, match="positive"):
        EfficiencyFactors(host=0)


def _strategies():
    from ir import models
    from ir.transforms import megatron, training

    t = training(models.gpt(8, 512, 1024, 8, 1024, 2, dtype="float16"), "adam")
    return {
        "dp4": megatron(t, 4, 1),
        "tp4": megatron(t, 1, 4),
        "dp2 tp2": megatron(t, 2, 2),
        "dp2 pp2 m4": megatron(t, 2, 1, 2, 4),
        "dp4 m2": megatron(t, 4, 1, 1, 2),
    }


def test_the_fit_recovers_known_factors_and_reports_held_out_error():
    truth = EfficiencyFactors(gemm=0.8, memory=0.9, host=1.6, network=0.85)
    programs = _strategies()
    topology = truth.apply(ir.Topology.preset("a100-hgx", 4))
    measurements = [
        ir.Measurement(label, g, ir.simulate(g, topology).step_time_s, group="gpt")
        for label, g in programs.items()
    ]
    fit = ir.calibrate(measurements, preset="a100-hgx", factors=("host", "gemm"), prior=0.0)
    assert fit.factors.host == pytest.approx(1.6, rel=0.1)
    assert fit.in_sample_mape < fit.model_mape
    assert fit.held_out_mape is not None and math.isfinite(fit.held_out_mape)
    assert all(r.held_out_s is not None for r in fit.rows)
    table = fit.table()
    assert table.index("held out") < table.index("unscaled") < table.index("in sample")
    t = fit.topology(4)
    assert t.devices[0].kernels.host.op_s == pytest.approx(A100_SXM.host.op_s * fit.factors.host)


def test_calibrate_refuses_what_it_cannot_fit():
    g = _strategies()["dp4"]
    with pytest.raises(ir.DistIRError, match="name the preset"):
        ir.calibrate([ir.Measurement("a", g, 1.0)])
    with pytest.raises(ir.DistIRError, match="no efficiency model"):
        ir.calibrate([ir.Measurement("a", g, 1.0)], preset="cpu")
    with pytest.raises(ir.DistIRError, match="step_time_s must be a positive"):
        ir.Measurement("a", g, -1.0)
    with pytest.raises(ir.DistIRError, match="factors must be among"):
        ir.calibrate([ir.Measurement("a", g, 1.0)], preset="a100-hgx", factors=("speed",))
