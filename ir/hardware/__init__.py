"""Hardware: presets with their sources (``presets``), and how close real kernels and
collectives come to them (``kernels``, ``comm``, ``efficiency``).

``Topology.preset(name, n)`` builds a preset; ``Topology.presets()`` lists the names.
"""

from __future__ import annotations

from .comm import CollectiveModel, Protocol
from .efficiency import COLLECTIVE_MODELS, KERNEL_MODELS, EfficiencyFactors, mamf_gemm, with_host
from .kernels import (
    CUDA_GRAPH_HOST,
    KERNEL_KINDS,
    AttentionModel,
    GemmModel,
    HostModel,
    KernelModel,
)
from .presets import (
    CPU_MEASURED,
    GB,
    NODES,
    PCIE3_BYTES_PER_S,
    PCIE4_BYTES_PER_S,
    TFLOPS,
    NodeSpec,
    calibrate_cpu,
    cpu_topology,
    hierarchical,
    node_topology,
    preset,
    preset_names,
)

__all__ = [
    "COLLECTIVE_MODELS",
    "CPU_MEASURED",
    "CUDA_GRAPH_HOST",
    "GB",
    "KERNEL_KINDS",
    "KERNEL_MODELS",
    "NODES",
    "PCIE3_BYTES_PER_S",
    "PCIE4_BYTES_PER_S",
    "TFLOPS",
    "AttentionModel",
    "CollectiveModel",
    "EfficiencyFactors",
    "GemmModel",
    "HostModel",
    "KernelModel",
    "NodeSpec",
    "Protocol",
    "calibrate_cpu",
    "cpu_topology",
    "hierarchical",
    "mamf_gemm",
    "node_topology",
    "preset",
    "preset_names",
    "with_host",
]
