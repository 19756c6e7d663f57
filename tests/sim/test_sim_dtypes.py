"""Peak flops per element type: matrix work at the tensor-core figure of its dtype,
elementwise work at the vector figure, float32 matmuls at FP32 unless TF32 is allowed."""

from __future__ import annotations

import math

import pytest

import ir
from ir import DType, FunctionBuilder, TensorType
from ir.device import PEAK_DTYPES
from ir.hardware import NODES
from ir.registry import CostContext, get_op

TFLOPS = 1e12
N = 4096  # a 4096^3 matmul is compute-bound on every preset (flops/byte ~ 680 in fp32)


def one_op(op_type: str, *shapes: tuple[int, ...], dtype: DType = DType.float32, **attrs):
    b = FunctionBuilder(op_type.lower())
    xs = [b.input(f"x{i}", TensorType(s, dtype, device=0)) for i, s in enumerate(shapes)]
    out = b.call(op_type, *xs, **attrs)
    return b.finish(list(out) if isinstance(out, tuple) else [out])


def cost_of(f: ir.Function) -> ir.Cost:
    (op,) = f.ops
    ctx = CostContext(
        tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs), op.attributes
    )
    return get_op(op.op_type).cost_rule(ctx)


def time_s(f: ir.Function, topology: ir.Topology, combine: str = "roofline") -> float:
    return ir.simulate(f, topology, combine=combine).step_time_s


def test_an_fp32_matmul_on_a_v100_runs_at_the_fp32_peak():
    f = one_op("MatMul", (N, N), (N, N))
    v100 = ir.Topology.preset("v100-dgx1", 1, ideal=True)
    launch = v100.devices[0].launch_overhead_s
    want = launch + 2.0 * N**3 / (15.7 * TFLOPS)
    assert time_s(f, v100) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("preset", "dtype", "tflops"),
    [
        ("v100-dgx1", DType.float16, 125),
        ("v100-pcie", DType.float16, 112),
        ("a100-hgx", DType.bfloat16, 312),
        ("a100-hgx", DType.float16, 312),
        ("h100-hgx", DType.bfloat16, 989),
        ("rtx4090", DType.bfloat16, 165.2),
        ("a100-hgx", DType.float32, 19.5),
        ("h100-hgx", DType.float32, 67),
        ("a100-hgx", DType.float64, 19.5),  # FP64 tensor cores
        ("v100-dgx1", DType.bfloat16, 15.7),  # no BF16 units: the FP32 vector rate
    ],
)
def test_a_matmul_runs_at_the_matrix_peak_of_its_dtype(preset, dtype, tflops):
    f = one_op("MatMul", (N, N), (N, N), dtype=dtype)
    topology = ir.Topology.preset(preset, 1, ideal=True)
    want = topology.devices[0].launch_overhead_s + 2.0 * N**3 / (tflops * TFLOPS)
    assert time_s(f, topology) == pytest.approx(want, rel=1e-12)


def test_tf32_is_chosen_by_the_topology_not_by_default():
    f = one_op("MatMul", (N, N), (N, N))
    fp32 = time_s(f, ir.Topology.preset("a100-hgx", 1, ideal=True))
    tf32 = time_s(f, ir.Topology.preset("a100-hgx", 1, allow_tf32=True, ideal=True))
    flops = 2.0 * N**3
    assert fp32 == pytest.approx(4e-6 + flops / (19.5 * TFLOPS), rel=1e-12)
    assert tf32 == pytest.approx(4e-6 + flops / (156 * TFLOPS), rel=1e-12)
    # a GPU without TF32 (V100) is unaffected; half precision is unaffected
    v100 = [ir.Topology.preset("v100-dgx1", 1, allow_tf32=t, ideal=True) for t in (False, True)]
    assert time_s(f, v100[0]) == time_s(f, v100[1])
    half = one_op("MatMul", (N, N), (N, N), dtype=DType.bfloat16)
    h100 = [ir.Topology.preset("h100-hgx", 1, allow_tf32=t, ideal=True) for t in (False, True)]
    assert time_s(half, h100[0]) == time_s(half, h100[1])


@pytest.mark.parametrize(
    ("op_type", "shapes", "attrs"),
    [
        ("MatMulGrad", [(N, N), (N, N), (N, N)], {}),
        ("Conv2D", [(8, 64, 64, 256), (3, 3, 256, 256)], {"padding": "same"}),
    ],
)
def test_other_matrix_ops_use_the_matrix_peak(op_type, shapes, attrs):
    v100 = ir.Topology.preset("v100-dgx1", 1, ideal=True)
    for dtype, tflops in ((DType.float32, 15.7), (DType.float16, 125)):
        f = one_op(op_type, *shapes, dtype=dtype, **attrs)
        c = cost_of(f)
        assert c.matrix_flops == c.flops > 0
        want = 4e-6 + c.flops / (tflops * TFLOPS)
        assert time_s(f, v100) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("dtype", "vector_tflops"), [(DType.float32, 19.5), (DType.float16, 78), (DType.bfloat16, 39)]
)
def test_elementwise_ops_use_the_vector_peak(dtype, vector_tflops):
    # additive: the flops term shows even though a Relu is memory-bound
    f = one_op("Relu", (N, N), dtype=dtype)
    a100 = ir.Topology.preset("a100-hgx", 1, ideal=True)
    c = cost_of(f)
    assert c.matrix_flops == 0 < c.flops
    device = a100.devices[0]
    want = (
        device.launch_overhead_s
        + c.flops / (vector_tflops * TFLOPS)
        + (c.bytes_read + c.bytes_written) / device.mem_bandwidth_bytes_per_s
    )
    assert time_s(f, a100, "additive") == pytest.approx(want, rel=1e-12)


def test_a_compute_bound_elementwise_op_is_timed_at_the_vector_figure():
    device = ir.Device(
        0,
        peak_flops=100 * TFLOPS,
        mem_bandwidth_bytes_per_s=1e20,  # memory is free: flops decide
        matrix_peak_flops={"float32": 100 * TFLOPS},
        vector_peak_flops={"float32": 1 * TFLOPS},
    )
    topology = ir.Topology((device,), ((0.0,),), ((0.0,),))
    relu = one_op("Relu", (N, N))
    assert time_s(relu, topology) == pytest.approx(cost_of(relu).flops / TFLOPS, rel=1e-12)
    matmul = one_op("MatMul", (N, N), (N, N))
    assert time_s(matmul, topology) == pytest.approx(2.0 * N**3 / (100 * TFLOPS), rel=1e-12)


CLAIMED_MATRIX_DTYPES = {
    "v100-dgx1": {"float16"},
    "v100-dgx2": {"float16"},
    "v100-pcie": {"float16"},
    "a100-hgx": {"float64", "float32", "tf32", "bfloat16", "float16"},
    "a100-pcie": {"float64", "float32", "tf32", "bfloat16", "float16"},
    "h100-hgx": {"float64", "float32", "tf32", "bfloat16", "float16", "float8"},
    "h200-hgx": {"float64", "float32", "tf32", "bfloat16", "float16", "float8"},
    "rtx4090": {"float32", "tf32", "bfloat16", "float16", "float8"},
}


@pytest.mark.parametrize("name", sorted(NODES))
def test_every_gpu_preset_has_a_figure_for_every_dtype_it_claims(name):
    device = ir.Topology.preset(name, 1, ideal=True).devices[0]
    matrix, vector = dict(device.matrix_peak_flops), dict(device.vector_peak_flops)
    assert set(matrix) == CLAIMED_MATRIX_DTYPES[name]
    assert {"float64", "float32", "float16"} <= set(vector)
    # the headline figure is the half-precision tensor one
    assert device.peak_flops == matrix["float16"]
    # tensor cores are never slower than the vector units of the same type
    for dtype, flops in matrix.items():
        assert math.isfinite(flops) and flops >= vector.get(dtype, 0.0), (name, dtype)
    # lower precision is never slower
    ladder = [matrix[d] for d in ("float32", "tf32", "bfloat16", "float8") if d in matrix]
    assert ladder == sorted(ladder)
    # every IR element type and every named format gets a positive, finite figure
    for dtype in (*DType, *PEAK_DTYPES):
        for is_matrix in (True, False):
            flops = device.peak_flops_for(dtype, is_matrix)
            assert 0 < flops < math.inf


def test_a_plain_device_runs_every_dtype_at_its_one_peak():
    device = ir.Device(0, peak_flops=3e12)
    for dtype in DType:
        assert device.peak_flops_for(dtype, True) == device.peak_flops_for(dtype, False) == 3e12
    hash(ir.Topology.preset("h100-hgx", 2, ideal=True).devices[0])  # devices stay hashable


def test_a_peak_table_with_an_unknown_dtype_or_a_bad_figure_is_refused():
    with pytest.raises(ir.TopologyError, match=r"device 0: matrix_peak_flops: unknown .*fp32"):
        ir.Device(0, matrix_peak_flops={"fp32": 1e12})
    with pytest.raises(ir.TopologyError, match="float16 peak must be positive"):
        ir.Device(0, vector_peak_flops={"float16": 0.0})


PCIE_VS_NVLINK = [("v100-pcie", "v100-dgx2"), ("a100-pcie", "a100-hgx"), ("rtx4090", "a100-hgx")]


def dp_allreduce(n: int = 8, rows: int = 4096, cols: int = 4096) -> ir.Function:
    b = FunctionBuilder("dp_grads")
    grads = [b.input(f"g{d}", TensorType((rows, cols), device=d)) for d in range(n)]
    return b.finish([b.call("AllReduce", b.call("MakeTuple", *grads))])


@pytest.mark.parametrize(("pcie", "nvlink"), PCIE_VS_NVLINK)
def test_pcie_presets_have_slower_links_and_slower_allreduces(pcie, nvlink):
    p, v = ir.Topology.preset(pcie, 8, ideal=True), ir.Topology.preset(nvlink, 8, ideal=True)
    fastest_pcie = max(p.bandwidth(0, d) for d in range(1, 8))
    slowest_nvlink = min(v.bandwidth(0, d) for d in range(1, 8))
    assert fastest_pcie < slowest_nvlink
    f = dp_allreduce()
    assert time_s(f, p) > 2 * time_s(f, v)


def test_a_v100_pcie_allreduce_is_slower_than_the_dgx1_nvlink_ring():
    f = dp_allreduce()
    pcie, dgx1 = (
        time_s(f, ir.Topology.preset(n, 8, ideal=True)) for n in ("v100-pcie", "v100-dgx1")
    )
    assert pcie > dgx1


def test_consumer_cards_without_peer_to_peer_are_slower_than_a_pcie_switch():
    rtx, a100 = (
        ir.Topology.preset("rtx4090", 8, ideal=True),
        ir.Topology.preset("a100-pcie", 8, ideal=True),
    )
    assert rtx.bandwidth(0, 1) < a100.bandwidth(0, 1)
    assert rtx.latency(0, 1) > a100.latency(0, 1)


@pytest.mark.parametrize("dtype", [DType.float32, DType.float16])
def test_sharding_propagation_costs_compute_at_the_simulators_peak_for_the_dtype(dtype):
    """Propagation's chooser and the simulator time an op with one roofline
    (``Device.compute_time_s``), so a strategy is ranked at its dtype's peak."""
    from ir.sharding import choice

    f = one_op("MatMul", (N, N), (N, N), dtype=dtype)
    (op,) = f.ops
    for v100 in (
        ir.Topology.preset("v100-dgx1", 1),
        ir.Topology.preset("v100-dgx1", 1, ideal=True),
    ):
        chooser = choice.Chooser.__new__(choice.Chooser)
        chooser.device, chooser.topology = v100.devices[0], v100
        cost = get_op("MatMul").cost_rule(
            CostContext(tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs), {})
        )
        # one op alone: the host issues it, then the device runs it
        issued = v100.devices[0].host_time_s(cost)
        assert issued + chooser._whole_time_s(op) == pytest.approx(time_s(f, v100), rel=1e-12)
    launch = v100.devices[0].launch_overhead_s
    peak = 15.7 if dtype == DType.float32 else 125
    want = launch + 2.0 * N**3 / (peak * TFLOPS)
    assert chooser._whole_time_s(op) == pytest.approx(want, rel=1e-12)
