"""Transforms: pure functions Function -> Function, each verifying its output.

Training (reverse-mode autodiff + optimizer step) and activation recomputation
are here; the parallelism transforms (data, horizontal, pipeline parallel and
their compositions) join them.
"""

from __future__ import annotations

from .autodiff import AutodiffError, default_params, gradients, training

__all__ = ["AutodiffError", "default_params", "gradients", "training"]
