"""Transforms: pure functions Function -> Function, each verifying its output.

Training (reverse-mode autodiff + optimizer step) and activation recomputation
are here; the parallelism transforms (data, horizontal, pipeline parallel and
their compositions) join them.
"""

from __future__ import annotations

# Parallelism (data, horizontal, pipeline, placement, compositions, pmap unrolling).
from ._rewrite import TransformError
from .autodiff import AutodiffError, default_params, gradients, training
from .compose import data_then_horizontal, horizontal_then_data, nested, parallelize
from .data_parallel import data_parallel
from .horizontal import horizontal_parallel
from .megatron import gradient_accumulation, megatron
from .pipeline import live_microbatches, pipeline_parallel, stage_assignment
from .placement import place
from .recompute import (
    RecomputeError,
    attention_core_activations,
    mode_activations,
    peak_live_bytes,
    recomputable,
    recompute,
)
from .setup import setup_program
from .stage_cut import PipelineCut, StageCut, pipeline_cut
from .unroll import device_programs, inline_tasks, unroll_pmap

__all__ = [
    "AutodiffError",
    "PipelineCut",
    "RecomputeError",
    "StageCut",
    # parallelism
    "TransformError",
    "attention_core_activations",
    "data_parallel",
    "data_then_horizontal",
    "default_params",
    "device_programs",
    "gradient_accumulation",
    "gradients",
    "horizontal_parallel",
    "horizontal_then_data",
    "inline_tasks",
    "live_microbatches",
    "megatron",
    "mode_activations",
    "nested",
    "parallelize",
    "peak_live_bytes",
    "pipeline_cut",
    "pipeline_parallel",
    "place",
    "recomputable",
    "recompute",
    "setup_program",
    "stage_assignment",
    "training",
    "unroll_pmap",
]
