"""What serving costs, simulated: time to first token, time per output token, throughput,
KV-cache memory and the largest batch that fits.

:func:`serving_metrics` builds the prefill and decode steps of a forward program
(:mod:`ir.inference.steps`) under a :class:`~ir.inference.strategies.ServingStrategy`,
simulates them (``ir.simulate`` with the topology's efficiency model: nothing here is
a cost model of its own) and reads:

* **TTFT**: the prefill of ``prefill_batch`` prompts of ``prompt_len`` tokens (no
  queueing), run eagerly, as serving engines run prefills.
* **TPOT**: a decode step of ``batch`` sequences at the mean context of the output
  (``prompt_len + (output_len - 1) // 2``: a decode step's time grows linearly with its
  context, so its mean over the output is the step at the mean context). With
  ``cuda_graphs=True`` (the default) the step is replayed from a CUDA graph, as vLLM and
  TensorRT-LLM replay decode steps: the host issues no op
  (:data:`ir.hardware.CUDA_GRAPH_HOST`); ``False`` keeps the eager framework's host
  time per op, which makes small-batch decode host-bound. Over ``pp > 1`` stages a
  sequence's tokens come once per pipeline cycle in steady state (``pp`` microbatches in
  flight): the busiest device's span over one step's microbatches.
* **Throughput**: decode tokens per second per replica (``batch / TPOT``) and per GPU.
* **Memory**: per device of a replica, the weights it holds and the KV cache's bytes per
  token (both read off the step's inputs), the decode step's workspace per sequence and
  the prefill's workspace (read off the simulated peaks). The largest batch at a
  context ``X`` is the largest ``B`` with ``weights + B * X' * kv_per_token +
  max(B * workspace, prefill workspace) <= memory_fraction * capacity`` on every device,
  ``X'`` being ``X`` rounded up to whole cache blocks of ``block_tokens`` (vLLM's paged
  blocks: 16 tokens by default; 1: no blocks). KV bytes per token of a sequence:
  ``2 * layers * kv_heads * head_dim * bytes`` (keys and values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..device import Topology
from ..function import Function
from ..hardware import CUDA_GRAPH_HOST, with_host
from ..sim import SimResult, simulate
from ..types import TensorType, TupleType, Type
from .steps import ServingError, analyse, decode_step, prefill_step
from .strategies import ServingStrategy, check_strategy, microbatches, parallel_step


@dataclass(frozen=True)
class RequestMix:
    """The requests served: prompts of ``prompt_len`` tokens answered with ``output_len``,
    ``batch`` sequences decoded together per replica, ``prefill_batch`` prompts
    prefilled together."""

    prompt_len: int = 512
    output_len: int = 128
    batch: int = 8
    prefill_batch: int = 1

    def __post_init__(self) -> None:
        for what in ("prompt_len", "output_len", "batch", "prefill_batch"):
            n = getattr(self, what)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ServingError(f"{what} must be a positive integer, got {n!r}")

    @property
    def mean_context(self) -> int:
        """The cached context of the output's middle token."""
        return self.prompt_len + (self.output_len - 1) // 2

    @property
    def final_context(self) -> int:
        """The context when the last token is made: prompt and output."""
        return self.prompt_len + self.output_len


def _per_device(t: Type, into: dict[int, float]) -> None:
    if isinstance(t, TupleType):
        for e in t.elements:
            _per_device(e, into)
    elif isinstance(t, TensorType) and isinstance(t.device, int):
        into[t.device] = into.get(t.device, 0.0) + t.size_bytes


def input_bytes(program: Function, names: Any) -> dict[int, float]:
    """Bytes per device of the inputs of ``program`` that ``names(name)`` selects."""
    out: dict[int, float] = {}
    for v in program.inputs:
        if names(v.name):
            _per_device(v.type, out)
    return out


def _is_cache(name: str) -> bool:
    return name.startswith(("past_key_", "past_value_"))


def _is_weight(name: str) -> bool:
    return name != "tokens" and not _is_cache(name)


def _bandwidth(device: Any) -> tuple[float, float]:
    """A device's achieved and datasheet HBM bandwidth (achieved: the kernel model's
    share; the datasheet's on an ideal preset)."""
    peak = device.mem_bandwidth_bytes_per_s
    k = device.kernels
    return (peak if k is None else peak * k.memory_efficiency), peak


def _span_s(result: SimResult, device: int) -> float:
    events = result.events_on(device)
    if not events:
        return 0.0
    return max(e.end_s for e in events) - min(e.start_s for e in events)


def round_up(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens) * block_tokens


#: The batch a device holds when it keeps no cache and no per-sequence workspace (a
#: pipeline stage with the embedding only): other devices bound the replica's batch.
UNBOUNDED = 2**62


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory in a replica (bytes): what it holds whatever the batch, per
    sequence and token of context, per sequence of a decode step, for a prefill."""

    capacity_bytes: float
    weights_bytes: float
    kv_bytes_per_token: float  # of one sequence, on this device
    decode_workspace_bytes: float  # per sequence
    prefill_workspace_bytes: float

    def max_batch(self, context: int) -> int:
        """The most sequences of ``context`` cached positions that fit (see the module)."""
        room = self.capacity_bytes - self.weights_bytes
        if room <= self.prefill_workspace_bytes:
            return 0
        cache = context * self.kv_bytes_per_token
        per_seq = cache + self.decode_workspace_bytes
        by_prefill = (room - self.prefill_workspace_bytes) / cache if cache > 0 else math.inf
        by_decode = room / per_seq if per_seq > 0 else math.inf
        most = min(by_prefill, by_decode)
        return UNBOUNDED if most >= UNBOUNDED else math.floor(most)


@dataclass(frozen=True)
class ServingMetrics:
    """The figures of one strategy serving one request mix (see the module docstring)."""

    strategy: ServingStrategy
    mix: RequestMix
    topology: str
    ttft_s: float
    tpot_s: float
    kv_bytes_per_token: int  # one sequence, the whole model
    memory: Mapping[int, DeviceMemory]
    block_tokens: int
    cuda_graphs: bool
    prefill: SimResult = field(repr=False, compare=False)
    decode: SimResult = field(repr=False, compare=False)
    prefill_program: Function = field(repr=False, compare=False)
    decode_program: Function = field(repr=False, compare=False)
    # per device of a replica: the bytes a decode step (a pipeline cycle) must read, and
    # the HBM bandwidth it reads them at (achieved, datasheet)
    decode_read_bytes: Mapping[int, float] = field(default_factory=dict, repr=False)
    bandwidth: Mapping[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    positions: int = 0  # the longest context the model takes

    def rounded(self, context: int) -> int:
        """``context`` in whole cache blocks (tokens)."""
        return round_up(context, self.block_tokens)

    @property
    def decode_floor_s(self) -> float:
        """The memory floor of a decode step (of a pipeline cycle with ``pp > 1``): the
        busiest device's bytes that must be read, its weights (but the embedding table, of
        which a step reads one row per sequence; once per microbatch) and its KV cache, at
        the achieved HBM bandwidth (``ir.hardware``; the datasheet's on an ideal preset).
        The simulated TPOT is never below it."""
        return max(b / self.bandwidth[d][0] for d, b in self.decode_read_bytes.items())

    @property
    def memory_bandwidth_utilization(self) -> float:
        """MBU: the bytes a decode step must read per TPOT over the datasheet bandwidth of
        the busiest device (the figure serving benchmarks report)."""
        return max(b / self.bandwidth[d][1] for d, b in self.decode_read_bytes.items()) / (
            self.tpot_s
        )

    @property
    def tokens_per_s_per_replica(self) -> float:
        return self.mix.batch / self.tpot_s

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second of all replicas."""
        return self.tokens_per_s_per_replica * self.strategy.replicas

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s_per_replica / self.strategy.replica_devices

    @property
    def latency_s(self) -> float:
        """A request's end-to-end latency: its first token, then ``output_len - 1`` more."""
        return self.ttft_s + (self.mix.output_len - 1) * self.tpot_s

    def kv_bytes(self, batch: int, context: int) -> int:
        """KV-cache bytes of ``batch`` sequences of ``context`` positions (whole blocks), the
        whole model (a replica's devices together)."""
        return batch * round_up(context, self.block_tokens) * self.kv_bytes_per_token

    def max_batch(self, context: int | None = None) -> int:
        """The most sequences of ``context`` positions (None: prompt and output) that one
        replica holds."""
        x = round_up(self.mix.final_context if context is None else context, self.block_tokens)
        return min(m.max_batch(x) for m in self.memory.values())

    @property
    def fits(self) -> bool:
        return self.mix.batch <= self.max_batch()

    def row(self) -> dict[str, Any]:
        """The figures as one table row (times in ms)."""
        return {
            "strategy": self.strategy.label,
            "gpus": self.strategy.devices,
            "batch": self.mix.batch,
            "ttft_ms": self.ttft_s * 1e3,
            "tpot_ms": self.tpot_s * 1e3,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tokens_per_s": self.tokens_per_s,
            "max_batch": self.max_batch(),
            "fits": self.fits,
        }


def _device_memory(
    topology: Topology,
    decode: Function,
    decode_result: SimResult,
    prefill: Function,
    prefill_result: SimResult,
    batch: int,
    context: int,
    prompt_batch: int,
    prompt_len: int,
    memory_fraction: float,
) -> dict[int, DeviceMemory]:
    weights = input_bytes(decode, _is_weight)
    caches = input_bytes(decode, _is_cache)
    out = {}
    for d in sorted(weights):
        per_token = caches.get(d, 0.0) / (batch * context)
        kv_after = batch * (context + 1) * per_token  # the step appends one position
        decode_ws = (decode_result.peak_memory_bytes[d] - weights[d] - kv_after) / batch
        prefill_kv = prompt_batch * prompt_len * per_token
        prefill_ws = prefill_result.peak_memory_bytes.get(d, 0.0) - weights[d] - prefill_kv
        out[d] = DeviceMemory(
            topology.device(d).memory_bytes * memory_fraction,
            weights[d],
            per_token,
            max(0.0, decode_ws),
            max(0.0, prefill_ws),
        )
    return out


def simulated_prefill(
    forward: Function, topology: Topology, strategy: ServingStrategy, mix: RequestMix
) -> tuple[Function, SimResult]:
    """The strategy's prefill of ``mix.prefill_batch`` prompts and its simulation (eager)."""
    step = prefill_step(forward, mix.prompt_len, batch=mix.prefill_batch)
    program = parallel_step(step, strategy, replicas=False)
    return program, simulate(program, topology)


def serving_metrics(
    forward: Function,
    topology: Topology,
    strategy: ServingStrategy | None = None,
    mix: RequestMix | None = None,
    *,
    cuda_graphs: bool = True,
    memory_fraction: float = 0.9,
    block_tokens: int = 16,
    prefill: tuple[Function, SimResult] | None = None,
) -> ServingMetrics:
    """Simulated TTFT, TPOT, throughput and memory of ``forward`` served by ``strategy``
    (default: one GPU) on ``topology`` for ``mix`` (see the module docstring).
    ``memory_fraction``: the share of each GPU's memory the engine uses (vLLM's
    ``gpu_memory_utilization``, 0.9 by default). ``prefill``: the parallel prefill step of
    this strategy and mix and its simulation, when already made (a front of several decode
    batches shares one). Raises a :class:`ServingError` when the strategy does not fit the
    model or the topology, or nothing fits in memory."""
    strategy = strategy or ServingStrategy()
    mix = mix or RequestMix()
    if not 0 < memory_fraction <= 1:
        raise ServingError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ServingError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    if strategy.devices > len(topology.devices):
        raise ServingError(
            f"{strategy.label} needs {strategy.devices} GPUs; {topology.name} has "
            f"{len(topology.devices)} ({strategy.devices - len(topology.devices)} short)"
        )
    check_strategy(forward, strategy)
    a = analyse(forward)
    if mix.final_context > a.positions:
        raise ServingError(
            f"a prompt of {mix.prompt_len} and {mix.output_len} output tokens reach context "
            f"{mix.final_context}, beyond the model's {a.positions} positions by "
            f"{mix.final_context - a.positions}"
        )
    if prefill is None:
        prefill = simulated_prefill(forward, topology, strategy, mix)
    prefill_program, prefill_result = prefill
    context = mix.mean_context
    decode_plain = decode_step(forward, context, batch=mix.batch)
    decode = parallel_step(decode_plain, strategy, replicas=False)
    graphs = with_host(topology, CUDA_GRAPH_HOST) if cuda_graphs else topology
    decode_result = simulate(decode, graphs)
    if strategy.pp > 1:  # steady state: pp microbatches in flight, one cycle per token
        tpot = max(_span_s(decode_result, d) for d in decode_result.devices)
    else:
        tpot = decode_result.step_time_s
    tables = {op.inputs[0].name for op in decode_plain.ops if op.op_type == "Embedding"}
    m = microbatches(strategy, mix.batch, decode=True)
    weights_read = input_bytes(decode, lambda n: _is_weight(n) and n not in tables)
    kv_read = input_bytes(decode, _is_cache)
    read = {d: m * w + kv_read.get(d, 0.0) for d, w in weights_read.items()}
    bandwidth = {d: _bandwidth(topology.device(d)) for d in read}
    memory = _device_memory(
        topology,
        decode,
        decode_result,
        prefill_program,
        prefill_result,
        mix.batch,
        context,
        mix.prefill_batch,
        mix.prompt_len,
        memory_fraction,
    )
    metrics = ServingMetrics(
        strategy,
        mix,
        topology.name,
        prefill_result.step_time_s,
        tpot,
        sum(layer.bytes_per_token for layer in a.layers),
        memory,
        block_tokens,
        cuda_graphs,
        prefill_result,
        decode_result,
        prefill_program,
        decode,
        read,
        bandwidth,
        a.positions,
    )
    if metrics.max_batch() < 1:
        raise ServingError(_nothing_fits(metrics, memory_fraction))
    return metrics


def _nothing_fits(m: ServingMetrics, memory_fraction: float) -> str:
    where = f"{m.strategy.label} on {m.topology}"
    context = round_up(m.mix.final_context, m.block_tokens)
    for d, mem in m.memory.items():
        need = mem.weights_bytes + mem.prefill_workspace_bytes
        if need >= mem.capacity_bytes:
            return (
                f"{where}: device {d} needs {need / 1e9:.1f} GB for its weights and a "
                f"prefill's workspace, beyond the {mem.capacity_bytes / 1e9:.1f} GB usable "
                f"({memory_fraction:.0%} of the GPU) by {(need - mem.capacity_bytes) / 1e9:.1f}"
                " GB; split the model over more GPUs (tp x pp)"
            )
    d, mem = min(m.memory.items(), key=lambda kv: kv[1].max_batch(context))
    room = mem.capacity_bytes - mem.weights_bytes - mem.prefill_workspace_bytes
    one = context * mem.kv_bytes_per_token + mem.decode_workspace_bytes
    return (
        f"{where}: one sequence of {context} positions needs {one / 1e9:.2f} GB on device "
        f"{d} (its KV cache and workspace), beyond the {room / 1e9:.2f} GB left beside the "
        f"weights by {(one - room) / 1e9:.2f} GB"
    )
