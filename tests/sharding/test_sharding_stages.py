"""Pipeline-stage annotations on ops: print, parse, read back, place by execution."""

from __future__ import annotations

import numpy as np
import pytest

import ir
import ir.models
from ir.sharding import AnnotationError, annotate_stages, pipeline_stages, place_stages


def _mlp() -> ir.Function:
    return ir.models.mlp(8, 4, 6, 4, layers=3)


def test_stages_print_parse_and_fill_forward():
    marked = annotate_stages(_mlp(), {"a0": 0, "a1": 1})
    text = str(marked)
    assert "PipelineStage(a1, stage=1)" in text
    if hasattr(ir, "parse"):
        assert ir.parse(text).is_equivalent(marked)
    stages = {op.outputs[0].name: s for op, s in pipeline_stages(marked).items()}
    # The seed's picture: ops after a stage-1 op stay in stage 1 until told otherwise.
    assert stages == {"a0": 0, "h0": 0, "a1": 1, "h1": 1, "y": 1, "l": 1}


def test_placing_stages_on_devices_computes_the_same():
    f = _mlp()
    placed = place_stages(annotate_stages(f, {"a0": 0, "a1": 1}), [1, 2])
    devices = {op.outputs[0].name: op.device for op in placed.ops if op.op_type != "Send"}
    assert devices["h0"] == 1 and devices["a1"] == 2 and devices["l"] == 2
    assert [op.attributes["to_device"] for op in placed.ops if op.op_type == "Send"].count(2) == 4
    inputs = ir.random_inputs(f, 0)
    for want, got in zip(ir.execute(f, inputs), ir.execute(placed, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_stage_errors_name_the_value():
    with pytest.raises(AnnotationError, match="named 'nope'"):
        annotate_stages(_mlp(), {"nope": 1})
    with pytest.raises(AnnotationError, match=r"no device given for pipeline stage\(s\) \[1\]"):
        place_stages(annotate_stages(_mlp(), {"a1": 1}), [0])
