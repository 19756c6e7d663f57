"""Seed 001's pipeline-stage annotations drive the pipeline transforms, proven by execution.

An annotated forward program is trained (``training`` keeps the markers), then pipelined
(``pipeline_parallel``) or 3D-parallelised (``megatron``): the step computes the
sequential step's outputs, each op runs on its annotated stage's devices (read from the
ops, not from names of devices), and bad annotations are refused with a TransformError
that names the pipeline level and the reason.
"""

from __future__ import annotations

import numpy as np

import ir
import ir.models
from ir import transforms
from ir.sharding import annotate_stages

F64 = ir.DType.float64


def _mlp(layers: int = 4, batch: int = 8) -> ir.Function:
    return ir.models.mlp(batch, 4, 6, 4, layers=layers, dtype=F64)


def _unbalanced() -> ir.Function:
    """Stage 0 = layer 0, stage 1 = layers 1-3 (the cost cut would give 2 + 2)."""
    return transforms.training(annotate_stages(_mlp(), {"a1": 1}))


# -- training keeps the annotations ----------------------------------------------------


def test_training_keeps_the_markers_in_the_forward_and_adds_none_to_the_backward() -> None:
    f = _mlp()
    t = _unbalanced()
    kinds = [op.op_type for op in t.ops]
    assert kinds.count("PipelineStage") == 1
    assert kinds.index("PipelineStage") < kinds.index("LossGrad")
    xs = ir.random_inputs(t, 0)
    for want, got in zip(ir.execute(transforms.training(f), xs), ir.execute(t, xs), strict=True):
        np.testing.assert_allclose(got, want)
    # a marker is free: the annotated step simulates to the plain step's time and memory
    topo = ir.Topology.uniform(1)
    plain, marked = ir.simulate(transforms.training(f), topo), ir.simulate(t, topo)
    assert marked.step_time_s == plain.step_time_s
    assert marked.peak_memory_bytes == plain.peak_memory_bytes
