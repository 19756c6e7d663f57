"""The efficiency model of each GPU preset: its kernel model and its collective model.

Each figure below names its source (see ``ir.hardware.kernels`` and ``ir.hardware.comm``
for the models themselves). "Assumed" marks a value for which no public measurement
was found; ``ir.calibrate(measurements, preset=...)`` fits the free factors to a user's own runs.

GEMMs: ``max_efficiency`` is solved so that the GEMM model reaches, at the shape where
it was measured, the chip's published maximum achievable matmul FLOPS (MAMF, BF16,
S. Bekman's "Machine Learning Engineering", compute/accelerator: A100 SXM 267.9 of 312
TFLOPS at 6912x16384x2048; A100 PCIe 256.4 at 2304x5120x1536; H100 SXM 792.1 of 989 at
6144x17920x2816; H100/H200 SXM 794.5). SM counts from the architecture whitepapers:
V100 80, A100 108, H100 SXM5 132, AD102 (RTX 4090) 128.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..device import Topology, TopologyError
from .comm import CollectiveModel
from .kernels import AttentionModel, GemmModel, HostModel, KernelModel


def mamf_gemm(sms: int, fraction: float, shape: tuple[int, int, int]) -> GemmModel:
    """A :class:`GemmModel` of ``sms`` SMs whose efficiency at ``shape`` (m, n, k) is the
    measured MAMF ``fraction`` of peak."""
    unit = GemmModel(sms, 1.0, reference=shape)
    return GemmModel(sms, fraction / unit.efficiency(1, *shape), reference=shape)


# FlashAttention-2 on an A100 80GB SXM4 (Dao 2023, "FlashAttention-2: Faster Attention with
# Better Parallelism and Work Partitioning", Figures 4-6): forward about 170-190 TFLOPS at
# head dimension 64 and 190-220 at 128, backward about 130-150 and 160-180, at long
# sequences (of 312).
FLASH2_A100 = AttentionModel(
    forward=((64, 0.55), (128, 0.65)), backward=((64, 0.42), (128, 0.52)), half_seq=256
)
# FlashAttention-3 / cuDNN fused attention on an H100 SXM5 (Shah et al. 2024,
# "FlashAttention-3", Figures 5-7, FP16: forward about 500-650 TFLOPS at head dimension
# 64-128, backward 400-500, of 989).
FLASH_H100 = AttentionModel(
    forward=((64, 0.5), (128, 0.65)), backward=((64, 0.4), (128, 0.5)), half_seq=256
)
# Volta has no FlashAttention kernel (FlashAttention needs Turing or later); memory-
# efficient attention kernels reach roughly a third of the tensor peak there (assumed).
FUSED_V100 = AttentionModel(
    forward=((64, 0.3), (128, 0.4)), backward=((64, 0.22), (128, 0.3)), half_seq=256
)

# Achieved HBM bandwidth: Jia et al. 2018 ("Dissecting the NVIDIA Volta GPU Architecture via
# Microbenchmarking", Citadel) measured 750 of 900 GB/s on a V100 (0.83). For HBM2e/HBM3
# parts a STREAM-like copy reaches a similar share; 0.85 is assumed for them.
V100_MEMORY = 0.83
HBM_MEMORY = 0.85

V100 = KernelModel("V100", mamf_gemm(80, 0.80, (8192, 8192, 8192)), V100_MEMORY, FUSED_V100)
A100_SXM = KernelModel(
    "A100-SXM", mamf_gemm(108, 267.9 / 312, (6912, 16384, 2048)), HBM_MEMORY, FLASH2_A100
)
A100_PCIE = KernelModel(
    "A100-PCIe", mamf_gemm(108, 256.4 / 312, (2304, 5120, 1536)), HBM_MEMORY, FLASH2_A100
)
H100_SXM = KernelModel(
    "H100-SXM", mamf_gemm(132, 792.1 / 989, (6144, 17920, 2816)), HBM_MEMORY, FLASH_H100
)
H200_SXM = KernelModel(
    "H200-SXM", mamf_gemm(132, 794.5 / 989, (6144, 17920, 2816)), HBM_MEMORY, FLASH_H100
)
# The RTX 4090's published MAMF (178.5 TFLOPS) exceeds its whitepaper dense peak with FP32
# accumulation (165.2 at the rated 2.52 GHz boost; cards boost higher): the model takes
# the full datasheet peak for large GEMMs (assumed).
RTX4090 = KernelModel("RTX-4090", mamf_gemm(128, 1.0, (8192, 8192, 8192)), HBM_MEMORY, FLASH2_A100)

KERNEL_MODELS: dict[str, KernelModel] = {
    m.name: m for m in (V100, A100_SXM, A100_PCIE, H100_SXM, H200_SXM, RTX4090)
}

# Collectives. NVSwitch A100: NCCL's own bus-bandwidth cap for compute capability 8.0,
# 235 of 300 GB/s. NVLink 4 (H100/H200): nccl-tests all_reduce_perf on HGX H100 reports
# about 360-370 GB/s bus bandwidth without NVLink SHARP, of 450 (0.8; assumed for V100
# NVLink too). InfiniBand HDR/NDR: about 23 of 25 GB/s (and 46 of 50) per NIC in
# nccl-tests across nodes (0.92). PCIe presets already hold effective figures (80% of raw
# Gen3/Gen4); NCCL gets about 0.9 of them (assumed).
NVSWITCH_A100 = CollectiveModel("nvswitch-a100", "nvlink", 235 / 300, 0.92)
NVLINK = CollectiveModel("nvlink", "nvlink", 0.8, 0.92)
PCIE = CollectiveModel("pcie", "pci", 0.9, 0.92)

COLLECTIVE_MODELS: dict[str, CollectiveModel] = {m.name: m for m in (NVSWITCH_A100, NVLINK, PCIE)}


@dataclass(frozen=True)
class EfficiencyFactors:
    """Multipliers on a topology's efficiency model, as :func:`ir.calibrate` fits them.

    ``gemm`` scales every matrix kernel's achieved efficiency (GEMMs and fused attention),
    ``memory`` the achieved memory bandwidth, ``host`` every host time (per op, per
    launch, per collective), ``network`` the collectives' achieved share of their links.
    Efficiencies are capped at 1 (nothing beats the datasheet).
    """

    gemm: float = 1.0
    memory: float = 1.0
    host: float = 1.0
    network: float = 1.0

    def __post_init__(self) -> None:
        for name in ("gemm", "memory", "host", "network"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise TopologyError(
                    f"efficiency factor {name} must be a positive number, got {value!r}"
                )

    def kernels(self, model: KernelModel) -> KernelModel:
        """``model`` with these factors applied."""
        gemm = replace(model.gemm, max_efficiency=min(1.0, model.gemm.max_efficiency * self.gemm))
        attention = replace(
            model.attention,
            forward=tuple((d, min(1.0, e * self.gemm)) for d, e in model.attention.forward),
            backward=tuple((d, min(1.0, e * self.gemm)) for d, e in model.attention.backward),
        )
        h = model.host
        host = replace(
            h,
            op_s=h.op_s * self.host,
            launch_s=h.launch_s * self.host,
            view_s=h.view_s * self.host,
            comm_s=h.comm_s * self.host,
            optimizer_s=h.optimizer_s * self.host,
        )
        memory = min(1.0, model.memory_efficiency * self.memory)
        return replace(model, gemm=gemm, attention=attention, host=host, memory_efficiency=memory)

    def collectives(self, model: CollectiveModel) -> CollectiveModel:
        return replace(
            model,
            intra_efficiency=min(1.0, model.intra_efficiency * self.network),
            inter_efficiency=min(1.0, model.inter_efficiency * self.network),
        )

    def apply(self, topology: Topology) -> Topology:
        """``topology`` with every device's kernel model and its collective model scaled."""
        if topology.ideal:
            raise TopologyError(
                f"topology {topology.name!r} has no efficiency model to scale (an ideal "
                "preset, or a custom topology); use Topology.preset(name, n)"
            )
        scaled: dict[KernelModel, KernelModel] = {}
        devices = tuple(
            d
            if d.kernels is None
            else replace(d, kernels=scaled.setdefault(d.kernels, self.kernels(d.kernels)))
            for d in topology.devices
        )
        comm = topology.collectives
        return replace(
            topology, devices=devices, collectives=None if comm is None else self.collectives(comm)
        )


def with_host(topology: Topology, host: HostModel) -> Topology:
    """``topology`` with every device's host model replaced by ``host`` (for a step replayed
    as a CUDA graph, :data:`ir.hardware.kernels.CUDA_GRAPH_HOST`); devices without a kernel
    model (``ideal=True`` presets, custom topologies) are left as they are.

    >>> from ir.hardware import CUDA_GRAPH_HOST, preset
    >>> t = with_host(preset("h100-hgx", 2), CUDA_GRAPH_HOST)
    >>> t.devices[0].kernels.host.op_s, preset("h100-hgx", 2).devices[0].kernels.host.op_s
    (0.0, 2.4e-05)
    """
    swapped: dict[KernelModel, KernelModel] = {}
    devices = tuple(
        d
        if d.kernels is None
        else replace(d, kernels=swapped.setdefault(d.kernels, replace(d.kernels, host=host)))
        for d in topology.devices
    )
    return replace(topology, devices=devices)
