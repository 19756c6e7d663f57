"""Hardware presets (with their sources) and a CPU calibration helper.

``Topology.preset(name, num_devices)`` builds these; ``Topology.presets()`` lists
the names. GPU presets hold one node's GPUs per node; asking for more devices
than one node holds adds nodes joined by InfiniBand, which makes the topology
hierarchical (fast links inside a node, slower ones across nodes), as in a
multi-node cluster.

Figures are per GPU and per direction. Each GPU has dense peak FLOP/s per
element type for matrix work (tensor cores) and for vector work (CUDA cores),
see ``ir.device``; ``peak_flops`` is the dense BF16/FP16 tensor figure (FP16 on
the V100, which has no BF16). Sparsity ("2:4") figures are never used: the
datasheets print them first, the dense figure is half. float32 matmuls run at
the FP32 figure unless the topology allows TF32 (``preset(..., allow_tf32=True)``),
as PyTorch does by default since 1.12. Half-precision tensor figures are the
FP32-accumulate ones, which mixed-precision training uses.
Link latencies (alpha) are per transfer step: a few microseconds inside a node
and more across InfiniBand, the magnitudes NCCL's small-message benchmarks show.
A kernel launch costs a few microseconds on CUDA GPUs.

Sources (TFLOPS dense, per figure):

* V100 SXM2: "NVIDIA Tesla V100 GPU Architecture" whitepaper (WP-08608-001,
  Table 1) and the V100 datasheet: FP64 7.8, FP32 15.7, FP16 tensor 125;
  900 GB/s HBM2, 16/32 GB, six NVLink 2.0 links of 25 GB/s per direction each.
  FP16 vector 31.4 is twice FP32 (packed half2 arithmetic; the whitepaper gives
  no non-tensor FP16 figure). No BF16 or TF32 units.
* V100 PCIe: the V100 datasheet's PCIe column: FP64 7, FP32 14, tensor 112
  (lower boost clock at 250 W); 900 GB/s; FP16 vector 28 (twice FP32).
* DGX-1: "NVIDIA DGX-1 With Tesla V100 System Architecture" (WP-08437-002):
  eight V100 16 GB in a hybrid cube-mesh (each quad fully linked by NVLink, GPU i
  linked to GPU i+4; other pairs go over PCIe), four 100 Gb/s EDR InfiniBand
  ports per node.
* DGX-2: "NVIDIA DGX-2 System Architecture" whitepaper: sixteen V100 32 GB on
  NVSwitch (150 GB/s per direction between any pair), eight 100 Gb/s EDR ports.
* A100 (SXM4 and PCIe 80 GB): "NVIDIA A100 Tensor Core GPU Architecture"
  whitepaper (Table 1) and the A100 datasheet: FP64 9.7, FP64 tensor 19.5,
  FP32 19.5, TF32 156, BF16/FP16 tensor 312; FP16 vector 78, BF16 vector 39;
  HBM2e 2,039 GB/s (SXM4 80 GB) and 1,935 GB/s (PCIe 80 GB); NVLink 3 600 GB/s
  total (300 per direction) through NVSwitch on the HGX A100 8-GPU board; DGX
  A100 has one 200 Gb/s HDR InfiniBand port per GPU.
* H100 SXM5: "NVIDIA H100 Tensor Core GPU Architecture" whitepaper (Table 3)
  and the H100 datasheet: FP64 34 (33.5), FP64 tensor 67, FP32 67 (66.9),
  TF32 494.7, BF16/FP16 tensor 989 (989.4), FP8 1,979 (1,978.9); FP16/BF16
  vector 133.8; 3.35 TB/s HBM3, 80 GB, NVLink 4 900 GB/s total (450 per
  direction) on HGX H100; DGX H100 has one 400 Gb/s NDR InfiniBand port per GPU.
* H200 SXM: the H200 datasheet ("NVIDIA H200 Tensor Core GPU", H200 SXM column):
  the H100 SXM5's compute (FP64 34, FP64 tensor 67, FP32 67, TF32 494.7,
  BF16/FP16 tensor 989, FP8 1,979 dense: the datasheet prints the sparse 989,
  1,979 and 3,958), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s total (450 per
  direction) on HGX H200; networking as the HGX H100 (400 Gb/s NDR per GPU).
* RTX 4090: "NVIDIA Ada GPU Architecture" whitepaper (Appendix A, Table 9):
  FP32 82.6, FP16/BF16 vector 82.6, FP64 1.3, TF32 tensor 82.6, FP16/BF16
  tensor with FP32 accumulate 165.2 (330.3 with FP16 accumulate, which
  training does not use), FP8 tensor with FP32 accumulate 330.3; 24 GB GDDR6X,
  1,008 GB/s; PCIe Gen4 x16; no NVLink.
* PCIe links: PCIe Gen3 x16 is 15.75 GB/s per direction raw (8 GT/s, 128b/130b),
  Gen4 x16 31.5 GB/s; NCCL's and ``p2pBandwidthLatencyTest``'s measured figures
  through a PCIe switch are about 80% of raw, so the presets use 12 GB/s (Gen3)
  and 25 GB/s (Gen4). Assumed: every GPU pair reaches the other through PCIe
  switches with peer-to-peer on (a server whose pairs cross CPU sockets is
  slower between sockets; not modelled). GeForce cards have peer-to-peer off, so
  ``rtx4090`` transfers are staged through pinned host memory (device to host,
  then host to device, pipelined by NCCL's SHM transport): about half of Gen4's
  effective 25 GB/s, with a larger latency (10 us inside a node, 15 us across;
  5 and 8 us on the peer-to-peer PCIe presets). PCIe servers get one NIC per node
  (100 Gb/s EDR for the V100 and RTX 4090 ones, 200 Gb/s HDR for A100), shared
  by its eight GPUs.
* cpu: this machine (2-vCPU Intel Xeon Cascade Lake @ 2.5 GHz with AVX-512, 23 GB,
  numpy on OpenBLAS), figures measured with :func:`calibrate_cpu` on 2026-11-21;
  rerun it (or :func:`ir.calibrate`) for fresh ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..device import Device, LinkTable, Topology, TopologyError, peak_table
from . import efficiency
from .comm import CollectiveModel
from .kernels import KernelModel

GB = 1e9


@dataclass(frozen=True)
class NodeSpec:
    """One kind of node: its GPUs and the links inside it and across nodes.

    ``peak_flops`` is the dense BF16/FP16 matrix peak; ``matrix_peak_flops`` and
    ``vector_peak_flops`` map element types to dense peaks (see ``ir.device``)."""

    device_type: str
    devices_per_node: int
    peak_flops: float
    mem_bandwidth_bytes_per_s: float
    memory_bytes: float
    launch_overhead_s: float
    intra_bandwidth_bytes_per_s: Callable[[int, int], float]  # local indices -> bandwidth
    intra_latency_s: float
    inter_bandwidth_bytes_per_s: float  # per GPU, across nodes
    inter_latency_s: float
    matrix_peak_flops: Mapping[str, float] = field(default_factory=dict)
    vector_peak_flops: Mapping[str, float] = field(default_factory=dict)
    # how close real kernels and collectives come to the figures above (ir.hardware.efficiency)
    kernels: KernelModel | None = None
    collectives: CollectiveModel | None = None


def _all_to_all(bandwidth: float) -> Callable[[int, int], float]:
    return lambda i, j: bandwidth


def _dgx1_cube_mesh(i: int, j: int) -> float:
    # NVLink inside each quad (0-3, 4-7) and between GPU i and i+4; PCIe/QPI otherwise.
    # Simplified: every NVLink pair gets one link's 25 GB/s (some pairs have two).
    linked = (i // 4 == j // 4) or abs(i - j) == 4
    return 25 * GB if linked else 10 * GB


TFLOPS = 1e12

_V100 = dict(
    peak_flops=125 * TFLOPS,
    mem_bandwidth_bytes_per_s=900 * GB,
    launch_overhead_s=4e-6,
    matrix_peak_flops={"float16": 125 * TFLOPS},
    vector_peak_flops={"float64": 7.8 * TFLOPS, "float32": 15.7 * TFLOPS, "float16": 31.4 * TFLOPS},
)
_V100_PCIE = dict(
    peak_flops=112 * TFLOPS,
    mem_bandwidth_bytes_per_s=900 * GB,
    launch_overhead_s=4e-6,
    matrix_peak_flops={"float16": 112 * TFLOPS},
    vector_peak_flops={"float64": 7 * TFLOPS, "float32": 14 * TFLOPS, "float16": 28 * TFLOPS},
)
_A100 = dict(
    peak_flops=312 * TFLOPS,
    launch_overhead_s=4e-6,
    matrix_peak_flops={
        "float64": 19.5 * TFLOPS,
        "float32": 19.5 * TFLOPS,
        "tf32": 156 * TFLOPS,
        "bfloat16": 312 * TFLOPS,
        "float16": 312 * TFLOPS,
    },
    vector_peak_flops={
        "float64": 9.7 * TFLOPS,
        "float32": 19.5 * TFLOPS,
        "bfloat16": 39 * TFLOPS,
        "float16": 78 * TFLOPS,
    },
)
_H100 = dict(
    peak_flops=989 * TFLOPS,
    launch_overhead_s=4e-6,
    matrix_peak_flops={
        "float64": 67 * TFLOPS,
        "float32": 67 * TFLOPS,
        "tf32": 494.7 * TFLOPS,
        "bfloat16": 989 * TFLOPS,
        "float16": 989 * TFLOPS,
        "float8": 1979 * TFLOPS,
    },
    vector_peak_flops={
        "float64": 34 * TFLOPS,
        "float32": 67 * TFLOPS,
        "bfloat16": 133.8 * TFLOPS,
        "float16": 133.8 * TFLOPS,
    },
)
_RTX4090 = dict(
    peak_flops=165.2 * TFLOPS,
    launch_overhead_s=4e-6,
    matrix_peak_flops={
        "float32": 82.6 * TFLOPS,  # no FP32 tensor path: the vector rate
        "tf32": 82.6 * TFLOPS,
        "bfloat16": 165.2 * TFLOPS,
        "float16": 165.2 * TFLOPS,
        "float8": 330.3 * TFLOPS,
    },
    vector_peak_flops={
        "float64": 1.3 * TFLOPS,
        "float32": 82.6 * TFLOPS,
        "bfloat16": 82.6 * TFLOPS,
        "float16": 82.6 * TFLOPS,
    },
)
PCIE3_BYTES_PER_S = 12 * GB  # Gen3 x16 through a switch, effective per direction
PCIE4_BYTES_PER_S = 25 * GB  # Gen4 x16 through a switch, effective per direction

NODES: dict[str, NodeSpec] = {
    "v100-dgx1": NodeSpec(
        "V100-SXM2-16GB",
        8,
        memory_bytes=16 * GB,
        intra_bandwidth_bytes_per_s=_dgx1_cube_mesh,
        intra_latency_s=2e-6,
        inter_bandwidth_bytes_per_s=4 * 12.5 * GB / 8,  # 4 x 100 Gb/s EDR per 8 GPUs
        inter_latency_s=5e-6,
        **_V100,
        kernels=efficiency.V100,
        collectives=efficiency.NVLINK,
    ),
    "v100-dgx2": NodeSpec(
        "V100-SXM3-32GB",
        16,
        memory_bytes=32 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(150 * GB),
        intra_latency_s=2e-6,
        inter_bandwidth_bytes_per_s=8 * 12.5 * GB / 16,  # 8 x 100 Gb/s EDR per 16 GPUs
        inter_latency_s=5e-6,
        **_V100,
        kernels=efficiency.V100,
        collectives=efficiency.NVLINK,
    ),
    "v100-pcie": NodeSpec(
        "V100-PCIE-32GB",
        8,
        memory_bytes=32 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(PCIE3_BYTES_PER_S),
        intra_latency_s=5e-6,
        inter_bandwidth_bytes_per_s=12.5 * GB / 8,  # one 100 Gb/s EDR NIC per node
        inter_latency_s=8e-6,  # the NIC sits behind the same PCIe switches
        **_V100_PCIE,
        kernels=efficiency.V100,
        collectives=efficiency.PCIE,
    ),
    "a100-hgx": NodeSpec(
        "A100-SXM4-80GB",
        8,
        mem_bandwidth_bytes_per_s=2039 * GB,
        memory_bytes=80 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(300 * GB),
        intra_latency_s=2e-6,
        inter_bandwidth_bytes_per_s=25 * GB,  # 200 Gb/s HDR per GPU
        inter_latency_s=5e-6,
        **_A100,
        kernels=efficiency.A100_SXM,
        collectives=efficiency.NVSWITCH_A100,
    ),
    "a100-pcie": NodeSpec(
        "A100-PCIE-80GB",
        8,
        mem_bandwidth_bytes_per_s=1935 * GB,
        memory_bytes=80 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(PCIE4_BYTES_PER_S),  # NVLink bridges ignored
        intra_latency_s=5e-6,
        inter_bandwidth_bytes_per_s=25 * GB / 8,  # one 200 Gb/s HDR NIC per node
        inter_latency_s=8e-6,
        **_A100,
        kernels=efficiency.A100_PCIE,
        collectives=efficiency.PCIE,
    ),
    "h100-hgx": NodeSpec(
        "H100-SXM5-80GB",
        8,
        mem_bandwidth_bytes_per_s=3350 * GB,
        memory_bytes=80 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(450 * GB),
        intra_latency_s=2e-6,
        inter_bandwidth_bytes_per_s=50 * GB,  # 400 Gb/s NDR per GPU
        inter_latency_s=5e-6,
        **_H100,
        kernels=efficiency.H100_SXM,
        collectives=efficiency.NVLINK,
    ),
    "h200-hgx": NodeSpec(
        "H200-SXM-141GB",
        8,
        mem_bandwidth_bytes_per_s=4800 * GB,
        memory_bytes=141 * GB,
        intra_bandwidth_bytes_per_s=_all_to_all(450 * GB),
        intra_latency_s=2e-6,
        inter_bandwidth_bytes_per_s=50 * GB,  # 400 Gb/s NDR per GPU
        inter_latency_s=5e-6,
        **_H100,  # same compute as the H100 SXM5: only memory size and bandwidth differ
        kernels=efficiency.H200_SXM,
        collectives=efficiency.NVLINK,
    ),
    "rtx4090": NodeSpec(
        "RTX-4090-24GB",
        8,
        mem_bandwidth_bytes_per_s=1008 * GB,
        memory_bytes=24 * GB,
        # no peer-to-peer: device -> pinned host memory -> device, about half of Gen4
        intra_bandwidth_bytes_per_s=_all_to_all(PCIE4_BYTES_PER_S / 2),
        intra_latency_s=10e-6,
        inter_bandwidth_bytes_per_s=12.5 * GB / 8,  # one 100 Gb/s NIC per node
        inter_latency_s=15e-6,  # staged through host memory on both sides
        **_RTX4090,
        kernels=efficiency.RTX4090,
        collectives=efficiency.PCIE,
    ),
}

# This machine, as measured by calibrate_cpu() (best of several runs on a shared machine).
CPU_MEASURED = dict(
    peak_flops=1.4e11,
    mem_bandwidth_bytes_per_s=9.5 * GB,
    link_bandwidth_bytes_per_s=10 * GB,
    launch_overhead_s=1e-6,
    memory_bytes=23 * GB,
)


def preset_names() -> tuple[str, ...]:
    """Every name :func:`preset` accepts."""
    return (*NODES, "cpu")


def preset(
    name: str, num_devices: int, *, allow_tf32: bool = False, ideal: bool = False
) -> Topology:
    """The topology ``name`` with ``num_devices`` devices (ids 0..num_devices-1).

    ``allow_tf32`` runs float32 matmuls in TF32 on GPUs that have it (A100, H100,
    RTX 4090); off, as in PyTorch, they run at the FP32 figure.

    GPU presets carry the efficiency model (``ir.hardware.efficiency``): kernels at
    their achieved rates, a host that issues them, collectives at achieved bus
    bandwidths. ``ideal=True`` leaves it out: every op on the roofline at the
    datasheet peaks plus ``launch_overhead_s``, every transfer on an alpha-beta ring at
    the links' nominal figures (the closed forms the course teaches).

    >>> t = preset("a100-hgx", 16)
    >>> t.bandwidth(0, 1) > t.bandwidth(0, 8)  # NVSwitch inside a node, InfiniBand across
    True
    >>> preset("a100-hgx", 1, allow_tf32=True).peak_flops_for(0, "float32", matrix=True) / 1e12
    156.0
    """
    if num_devices < 1:
        raise TopologyError(f"a topology needs at least one device, got {num_devices}")
    key = name.lower()
    if key == "cpu":
        topology = cpu_topology(num_devices, **CPU_MEASURED, name="cpu")
    elif key in NODES:
        topology = node_topology(NODES[key], num_devices, name=f"{key}-{num_devices}", ideal=ideal)
    else:
        raise TopologyError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return replace(topology, allow_tf32=allow_tf32) if allow_tf32 else topology


def node_topology(
    spec: NodeSpec, num_devices: int, name: str = "custom", *, ideal: bool = False
) -> Topology:
    """``num_devices`` GPUs of ``spec``, filling nodes of ``spec.devices_per_node`` in id order
    (with ``spec``'s efficiency models unless ``ideal``)."""
    per = spec.devices_per_node
    peaks = (peak_table(spec.matrix_peak_flops), peak_table(spec.vector_peak_flops))
    devices = tuple(
        Device(
            i,
            spec.device_type,
            spec.peak_flops,
            spec.mem_bandwidth_bytes_per_s,
            spec.memory_bytes,
            spec.launch_overhead_s,
            matrix_peak_flops=peaks[0],
            vector_peak_flops=peaks[1],
            kernels=None if ideal else spec.kernels,
        )
        for i in range(num_devices)
    )
    # Links by rule (ir.device.LinkTable): setup is linear in devices, not quadratic.
    local = min(per, num_devices)
    intra_bw = [
        [0.0 if a == b else spec.intra_bandwidth_bytes_per_s(a, b) for b in range(local)]
        for a in range(local)
    ]
    intra_lat = [
        [0.0 if a == b else spec.intra_latency_s for b in range(local)] for a in range(local)
    ]
    bandwidth = LinkTable.by_node(num_devices, per, intra_bw, spec.inter_bandwidth_bytes_per_s)
    latency = LinkTable.by_node(num_devices, per, intra_lat, spec.inter_latency_s)
    nodes = tuple(
        tuple(range(k * per, min((k + 1) * per, num_devices)))
        for k in range((num_devices + per - 1) // per)
    )
    collectives = None if ideal else spec.collectives
    return Topology(devices, bandwidth, latency, name=name, nodes=nodes, collectives=collectives)


def hierarchical(
    num_nodes: int,
    devices_per_node: int,
    *,
    peak_flops: float,
    mem_bandwidth_bytes_per_s: float,
    memory_bytes: float,
    intra_bandwidth_bytes_per_s: float,
    inter_bandwidth_bytes_per_s: float,
    intra_latency_s: float = 2e-6,
    inter_latency_s: float = 5e-6,
    launch_overhead_s: float = 0.0,
    device_type: str = "gpu",
) -> Topology:
    """A custom cluster: ``num_nodes`` nodes of identical devices, fast links inside nodes."""
    spec = NodeSpec(
        device_type,
        devices_per_node,
        peak_flops,
        mem_bandwidth_bytes_per_s,
        memory_bytes,
        launch_overhead_s,
        _all_to_all(intra_bandwidth_bytes_per_s),
        intra_latency_s,
        inter_bandwidth_bytes_per_s,
        inter_latency_s,
    )
    name = f"hierarchical-{num_nodes}x{devices_per_node}"
    return node_topology(spec, num_nodes * devices_per_node, name=name)


def cpu_topology(
    num_devices: int,
    *,
    peak_flops: float,
    mem_bandwidth_bytes_per_s: float,
    link_bandwidth_bytes_per_s: float,
    launch_overhead_s: float,
    memory_bytes: float,
    name: str = "cpu",
) -> Topology:
    """``num_devices`` CPU processes on one machine: links are memory copies."""
    uniform = Topology.uniform(
        num_devices,
        peak_flops=peak_flops,
        mem_bandwidth_bytes_per_s=mem_bandwidth_bytes_per_s,
        link_bandwidth_bytes_per_s=link_bandwidth_bytes_per_s,
        link_latency_s=launch_overhead_s,
        memory_bytes=memory_bytes,
        launch_overhead_s=launch_overhead_s,
        device_type="cpu",
    )
    return replace(uniform, name=name)


def _best_time_s(fn: Callable[[], object], budget_s: float, min_repeats: int = 3) -> float:
    """Fastest of repeated runs of ``fn`` (the least disturbed on a shared machine)."""
    best = math.inf
    start = time.perf_counter()
    runs = 0
    while runs < min_repeats or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
        if runs >= 200:
            break
    return best


def calibrate_cpu(
    num_devices: int = 1, *, matmul_size: int = 384, copy_bytes: int = 32 * 2**20
) -> Topology:
    """Time numpy kernels on this machine and return a matching CPU topology (about 1 s).

    * peak flops: a float32 ``matmul_size`` cube matmul (``2 n^3`` flops), best run;
    * memory bandwidth: ``np.add`` over arrays of ``copy_bytes`` (reads two, writes one);
    * link bandwidth: ``np.copyto`` of ``copy_bytes`` (what a local send does);
    * launch overhead: a tiny ``np.add``, i.e. numpy's per-call cost.

    The result lets simulated CPU runs be compared with executed ones (``ir.execute``).
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((matmul_size, matmul_size), dtype=np.float32)
    b = rng.standard_normal((matmul_size, matmul_size), dtype=np.float32)
    a @ b  # warm up the BLAS threads
    matmul_s = _best_time_s(lambda: a @ b, 0.3)
    n = copy_bytes // 4
    x, y, z = (np.ones(n, dtype=np.float32) for _ in range(3))
    add_s = _best_time_s(lambda: np.add(x, y, out=z), 0.25)
    copy_s = _best_time_s(lambda: np.copyto(z, x), 0.15)
    tiny = np.ones(4, dtype=np.float32)
    launch_s = _best_time_s(lambda: [np.add(tiny, tiny) for _ in range(100)], 0.05) / 100
    try:
        import os

        memory_bytes = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory_bytes = 16 * GB
    return cpu_topology(
        num_devices,
        peak_flops=2.0 * matmul_size**3 / matmul_s,
        mem_bandwidth_bytes_per_s=3 * copy_bytes / add_s,
        link_bandwidth_bytes_per_s=2 * copy_bytes / copy_s,
        launch_overhead_s=launch_s,
        memory_bytes=memory_bytes,
        name="cpu-calibrated",
    )
