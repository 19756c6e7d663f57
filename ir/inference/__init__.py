"""Serving: prefill and decode steps with the KV cache as state, their parallel forms, and
what they cost (time to first token, time per output token, memory, batch).

* :func:`prefill_step`, :func:`decode_step` (:mod:`ir.inference.steps`): verified
  ``Function`` s built from a forward program (``ir.models.gpt``, ``ir.models.llama`` or an
  imported model).
"""

from __future__ import annotations

from .steps import (
    CacheLayer,
    ServingError,
    analyse,
    cache_layers,
    decode_step,
    prefill_step,
    step,
)

__all__ = [
    "CacheLayer",
    "ServingError",
    "analyse",
    "cache_layers",
    "decode_step",
    "prefill_step",
    "step",
]
