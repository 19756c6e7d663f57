"""How close real kernels come to a GPU's datasheet: the kernel efficiency model.

A datasheet gives peaks. A preset built with ``ideal=False`` (the default) adds a
:class:`KernelModel` to each device, and the simulator times every compute op by it
instead of by the roofline at the peaks (``Device.op_time_s``):

* **Matrix products** (:class:`GemmModel`): a GEMM runs as output tiles of a fixed size,
  one thread block per streaming multiprocessor (SM) at a time, in *waves* of as many
  tiles as the chip has SMs. A partly filled tile costs a whole tile (tile
  quantisation) and a partly filled last wave costs a whole wave (wave quantisation);
  each tile also pays a fixed prologue and epilogue, worth ``k_overhead`` steps of its
  inner loop. The library picks the fastest tile from a cuBLAS-like set and splits the
  inner dimension over more blocks when too few tiles fill the chip (split-K). Both
  effects are described in NVIDIA's "Matrix Multiplication Background User's Guide"
  (DU-09799-001, sections "Typical Tile Dimensions in cuBLAS", "Tile Quantization",
  "Wave Quantization"). ``max_efficiency`` is set so that the model gives, at the
  shape where it was measured, the *maximum achievable matmul FLOPS* (MAMF) published
  for the chip: the best large BF16 GEMM reaches 85.9% of peak on an A100 SXM, 82.2%
  on an A100 PCIe and 80.1% on an H100 SXM (S. Bekman, "Machine Learning Engineering",
  compute/accelerator, MAMF table, measured with ``mamf-finder.py``, CUDA 12.1).
* **Memory-bound kernels** (elementwise ops, normalisations, softmax, copies) move
  their bytes at ``memory_efficiency`` of the datasheet HBM bandwidth: 83% on a V100
  (Jia et al. 2018, "Dissecting the NVIDIA Volta GPU Architecture via
  Microbenchmarking": 750 of 900 GB/s); the same order is assumed for later HBM parts.
* **Fused attention** (``kernel="attention"``): FlashAttention-2's achieved fraction of
  the tensor-core peak by head dimension, forward and backward (Dao 2023,
  "FlashAttention-2", Figures 4-6 on an A100: about 0.55-0.70 forward and 0.45-0.60
  backward for head dimensions 64-128 at long sequences), lower for short sequences.
* **Every kernel** pays a gap between back-to-back kernels on the GPU and takes at
  least a minimum time (launch latency on the device).
* **The host** (:class:`HostModel`): an eager framework spends CPU time dispatching each
  op (Python, the dispatcher, the CUDA launch). The GPU cannot start a kernel before
  the host has launched it, so where kernels are shorter than their dispatch the step
  is host-bound: the regime of small microbatches and wide tensor parallelism. The
  simulator keeps a host clock per device (``ir.sim.engine``).

``ideal=True`` presets carry no model: ops take the roofline at the peaks plus the
device's ``launch_overhead_s``, as the closed-form tests and the course's first lessons
assume. Every figure here is a named constant with its source; where no public figure
exists the docstring says the value is assumed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

#: Kernel classes a cost rule may name (``ir.registry.Cost.kernel``); "" infers one:
#: "gemm" when the cost lists matrix products, else "memory".
KERNEL_KINDS = ("", "gemm", "memory", "view", "attention", "attention_grad", "optimizer")

#: Thread-block tiles (rows, columns, relative efficiency of the tile's main loop) a
#: cuBLAS-like library chooses from. Larger tiles reuse each loaded operand more
#: (NVIDIA's guide: "larger tiles have more data reuse, allowing them to use less
#: bandwidth and be more efficient than smaller tiles"); the relative figures below
#: are this model's assumption, ordered by that reuse (tile area over perimeter).
CUBLAS_TILES: tuple[tuple[int, int, float], ...] = (
    (256, 128, 1.0),
    (128, 256, 1.0),
    (128, 128, 0.95),
    (256, 64, 0.9),
    (64, 256, 0.9),
    (128, 64, 0.85),
    (64, 128, 0.85),
    (64, 64, 0.7),
)

#: Smallest inner-dimension slice a split-K kernel gives one block (cuBLAS splits K
#: only when the slices stay long enough to amortise the partial sums' reduction).
SPLIT_K_MIN = 256


@dataclass(frozen=True)
class GemmModel:
    """Tile- and wave-quantised time of a batched matrix product on one GPU.

    ``sms``: streaming multiprocessors. ``max_efficiency``: the fraction of the peak one
    SM reaches on a full tile in steady state (set from the chip's MAMF, see the module
    docstring). ``k_overhead``: the prologue and epilogue of a tile, in steps of its
    inner loop (32: about one pipeline stage of the 32-deep K slices Ampere and Hopper
    kernels load, plus writing the tile out). ``reference``: the (m, n, k) at which the
    MAMF was measured, for the record.

    >>> g = GemmModel(sms=108, max_efficiency=0.872)  # an A100 SXM (ir.hardware.efficiency)
    >>> round(g.efficiency(1, 8192, 8192, 8192), 2)  # a large square GEMM
    0.87
    >>> round(g.efficiency(1, 2048, 9216, 2304), 2)  # 6 waves of 128 x 128 tiles, the last partial
    0.79
    >>> round(g.efficiency(24, 2048, 2048, 96), 2)  # attention scores: a short inner dimension
    0.64
    """

    sms: int
    max_efficiency: float
    tiles: tuple[tuple[int, int, float], ...] = CUBLAS_TILES
    k_overhead: int = 32
    reference: tuple[int, int, int] = (8192, 8192, 8192)

    def time_s(
        self,
        batch: int,
        m: int,
        n: int,
        k: int,
        peak_flops: float,
        bandwidth_bytes_per_s: float | None = None,
    ) -> float:
        """Compute time of ``batch`` products of (m, k) by (k, n) at ``peak_flops``: the
        fastest tile choice, with or without split-K (which adds the partial sums'
        float32 round trip through memory at ``bandwidth_bytes_per_s``; None: no
        split-K)."""
        if batch <= 0 or m <= 0 or n <= 0 or k <= 0:
            return 0.0
        per_sm = peak_flops / self.sms
        best = math.inf
        for tm, tn, relative in self.tiles:
            tiles = batch * -(-m // tm) * -(-n // tn)
            rate = per_sm * relative * self.max_efficiency
            choices = [1]
            if bandwidth_bytes_per_s and tiles < self.sms and k >= 2 * SPLIT_K_MIN:
                choices.append(max(1, min(self.sms // tiles, k // SPLIT_K_MIN)))
            for splits in choices:
                depth = -(-k // splits)
                waves = -(-(tiles * splits) // self.sms)
                t = waves * 2.0 * tm * tn * (depth + self.k_overhead) / rate
                if splits > 1:  # each split writes its float32 partial sums; one pass adds them
                    t += 2.0 * splits * batch * m * n * 4 / bandwidth_bytes_per_s
                best = min(best, t)
        return best

    def efficiency(self, batch: int, m: int, n: int, k: int) -> float:
        """Achieved fraction of the peak (compute only, without split-K: no memory bound,
        no floor)."""
        t = self.time_s(batch, m, n, k, 1.0)
        return 2.0 * batch * m * n * k / t if t > 0 else 0.0


@dataclass(frozen=True)
class AttentionModel:
    """Achieved fraction of the matrix peak of a fused (FlashAttention-style) kernel.

    ``forward`` and ``backward``: (head dimension, efficiency) points, interpolated
    linearly in the head dimension (clamped at the ends), at long sequences;
    ``half_seq``: the key length at which the efficiency is half of that (short
    sequences leave the kernel's pipeline and the SMs under-used).
    """

    forward: tuple[tuple[int, float], ...]
    backward: tuple[tuple[int, float], ...]
    half_seq: int = 128

    def efficiency(self, head_dim: int, seq: int, backward: bool = False) -> float:
        points = self.backward if backward else self.forward
        if head_dim <= points[0][0]:
            base = points[0][1]
        elif head_dim >= points[-1][0]:
            base = points[-1][1]
        else:
            base = points[-1][1]
            for (d0, e0), (d1, e1) in itertools.pairwise(points):
                if d0 <= head_dim <= d1:
                    base = e0 + (e1 - e0) * (head_dim - d0) / (d1 - d0)
                    break
        return base * seq / (seq + self.half_seq)


@dataclass(frozen=True)
class HostModel:
    """CPU time an eager framework spends issuing work (seconds per op).

    ``op_s``: one op through the framework (Python module code, the dispatcher, the
    CUDA launch call); ``launch_s``: each further kernel of the same op; ``view_s``: an
    op that launches nothing (a reshape of a contiguous tensor); ``comm_s``: a
    collective or send through the process group; ``optimizer_s``: one weight's share
    of a fused multi-tensor optimizer step (one launch updates many weights).
    ``sync_p2p``: the host waits for the device after point-to-point transfers, as
    Megatron-LM's pipeline schedules do (``torch.cuda.synchronize()`` after
    ``batch_isend_irecv``, ``batch_p2p_sync``).

    The defaults are this model's estimates for eager PyTorch under Megatron-LM-style
    Python (2.x, a recent x86 host): an eager aten op costs roughly 5-10 us of Python,
    dispatcher, autograd bookkeeping and ``cudaLaunchKernel`` (PyTorch's CUDA-graphs
    documentation: launch overheads of several microseconds per kernel), and one op of
    this IR stands for one to three of them (a linear layer's product and bias add; the
    tensor-parallel region functions around it; a fused kernel's Python wrapper; Python
    autograd Functions cost more than plain ops), so an op costs about 24 us, a further
    kernel 4 us, a view 4 us, a collective through the process group 24 us. That puts a
    GPT layer's forward (27 ops of ``ir.models.gpt``) at about 0.6 ms of host time, the
    order of eager Megatron-LM layers, and makes small-microbatch, wide-tensor-parallel
    steps of 1-2B models host-bound at roughly twice their roofline time, as measured
    Megatron runs in that regime are reported to be (issue 23). These are estimates,
    not measurements: fit them to your own runs with ``ir.calibrate(measurements,
    preset=...)`` (factor ``host``).
    """

    op_s: float = 24e-6
    launch_s: float = 4e-6
    view_s: float = 4e-6
    comm_s: float = 24e-6
    optimizer_s: float = 0.5e-6
    sync_p2p: bool = True

    def time_s(self, kernel: str, launches: int) -> float:
        if kernel == "view":
            return self.view_s
        if kernel == "optimizer":
            return self.optimizer_s
        return self.op_s + max(0, launches - 1) * self.launch_s


#: The host of a step captured once as a CUDA graph and replayed (``torch.cuda.CUDAGraph``,
#: as vLLM and TensorRT-LLM run their decode steps): one graph launch issues every kernel,
#: so no op waits for the host, and the host does not wait after transfers. The kernels
#: still pay ``KernelModel.kernel_gap_s`` and ``kernel_min_s`` on the device: a graph
#: removes the CPU's launch work, not the GPU's scheduling of each kernel (NVIDIA,
#: "Getting Started with CUDA Graphs", 2019: graphs cut the CPU launch overhead of
#: short-kernel sequences; PyTorch's CUDA-graphs documentation, "CUDA Graphs": replay
#: "sacrifices the dynamic flexibility of eager mode" to remove "CPU overhead"). The
#: graph's own launch (a few microseconds per step) is not charged.
CUDA_GRAPH_HOST = HostModel(0.0, 0.0, 0.0, 0.0, 0.0, sync_p2p=False)


@dataclass(frozen=True)
class KernelModel:
    """Everything between a GPU's datasheet and its kernels' real times (module docstring).

    ``name`` identifies the model (a GPU kind) in saved sessions.
    """

    name: str
    gemm: GemmModel
    memory_efficiency: float
    attention: AttentionModel
    host: HostModel = HostModel()
    vector_efficiency: float = 0.8  # elementwise arithmetic on CUDA cores (rarely binding)
    kernel_gap_s: float = 1e-6  # between back-to-back kernels on one stream
    kernel_min_s: float = 2.5e-6  # the shortest kernel, launch latency included

    def time_s(
        self,
        cost: Any,
        *,
        matrix_peak_flops: float,
        vector_peak_flops: float,
        mem_bandwidth_bytes_per_s: float,
    ) -> float:
        """Device time of one op of ``cost`` (an ``ir.registry.Cost``)."""
        kernel = cost.kernel or ("gemm" if cost.gemms else "memory")
        if kernel == "view":
            return 0.0
        nbytes = cost.bytes_read + cost.bytes_written
        memory_s = nbytes / (mem_bandwidth_bytes_per_s * self.memory_efficiency)
        vector_s = (cost.flops - cost.matrix_flops) / (vector_peak_flops * self.vector_efficiency)
        if kernel == "optimizer":  # fused over many weights: no launch or gap of its own
            return max(memory_s, vector_s)
        if kernel in ("attention", "attention_grad") and cost.gemms:
            _, _, sk, head_dim = cost.gemms[0]
            efficiency = self.attention.efficiency(head_dim, sk, kernel == "attention_grad")
            matrix_s = cost.matrix_flops / (matrix_peak_flops * efficiency)
        elif cost.gemms:
            bandwidth = mem_bandwidth_bytes_per_s * self.memory_efficiency
            matrix_s = sum(self.gemm.time_s(*g, matrix_peak_flops, bandwidth) for g in cost.gemms)
        else:
            matrix_s = cost.matrix_flops / (matrix_peak_flops * self.gemm.max_efficiency)
        launches = max(1, cost.launches)
        busy = max(matrix_s + vector_s, memory_s)
        return max(busy + launches * self.kernel_gap_s, launches * self.kernel_min_s)

    def host_time_s(self, cost: Any) -> float:
        """Host (CPU) time to issue one op of ``cost``."""
        kernel = cost.kernel or ("gemm" if cost.gemms else "memory")
        return self.host.time_s(kernel, cost.launches)
