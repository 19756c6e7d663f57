"""Serving: prefill and decode steps with the KV cache as state, their parallel forms, and
what they cost (time to first token, time per output token, memory, batch).

* :func:`prefill_step`, :func:`decode_step` (:mod:`ir.inference.steps`): verified
  ``Function`` s built from a forward program (``ir.models.gpt``, ``ir.models.llama`` or an
  imported model).
* :class:`ServingStrategy`, :func:`parallel_step` (:mod:`ir.inference.strategies`):
  tensor parallelism, a pipeline over layers and replicas, built by ``ir.transforms.megatron``.
* :func:`serving_metrics` (:mod:`ir.inference.metrics`): simulated TTFT, TPOT, throughput,
  KV-cache memory and the largest batch; :func:`serving_front` (:mod:`ir.inference.front`):
  the latency/throughput front over strategies and batches, with an SLA filter.
* :func:`annotated_step` (:mod:`ir.inference.annotations`): a strategy as seed 001's
  sharding specs and pipeline stages, for ``ir.sharding.propagate`` and ``ir.to_onnx``.
"""

from __future__ import annotations

from .annotations import annotated_step, op_stages, serving_annotations
from .front import SLA_TPOT_S, ServingFront, fitting_strategies, serving_front
from .metrics import DeviceMemory, RequestMix, ServingMetrics, serving_metrics
from .steps import (
    CacheLayer,
    ServingError,
    analyse,
    cache_layers,
    decode_step,
    prefill_step,
    step,
)
from .strategies import (
    ServingStrategy,
    check_strategy,
    microbatches,
    parallel_step,
    strategies,
)

__all__ = [
    "SLA_TPOT_S",
    "CacheLayer",
    "DeviceMemory",
    "RequestMix",
    "ServingError",
    "ServingFront",
    "ServingMetrics",
    "ServingStrategy",
    "analyse",
    "annotated_step",
    "cache_layers",
    "check_strategy",
    "decode_step",
    "fitting_strategies",
    "microbatches",
    "op_stages",
    "parallel_step",
    "prefill_step",
    "serving_annotations",
    "serving_front",
    "serving_metrics",
    "step",
    "strategies",
]
