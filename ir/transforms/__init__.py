"""Transforms: pure functions Function -> Function, each verifying its output.

Training (reverse-mode autodiff + optimizer step) and activation recomputation
are here; the parallelism transforms (data, horizontal, pipeline parallel and
their compositions) join them.
"""

from __future__ import annotations

from .autodiff import AutodiffError, default_params, gradients, training
from .recompute import RecomputeError, peak_live_bytes, recomputable, recompute

# Parallelism (data, horizontal, pipeline, placement, compositions, pmap unrolling).
from ._rewrite import TransformError
from .compose import data_then_horizontal, horizontal_then_data, nested, parallelize
from .data_parallel import data_parallel
from .horizontal import horizontal_parallel
from .pipeline import live_microbatches, pipeline_parallel, stage_assignment
from .placement import place
from .unroll import device_programs, unroll_pmap

__all__ = [
    "AutodiffError",
    "RecomputeError",
    "default_params",
    "gradients",
    "peak_live_bytes",
    "recomputable",
    "recompute",
    "training",
    # parallelism
    "TransformError",
    "data_parallel",
    "data_then_horizontal",
    "device_programs",
    "horizontal_parallel",
    "horizontal_then_data",
    "live_microbatches",
    "nested",
    "parallelize",
    "pipeline_parallel",
    "place",
    "stage_assignment",
    "unroll_pmap",
]
