"""A value of no batch input read by every layer, pipelined (issue 29's Llama-7B figure).

An imported Llama computes its rotary tables from its ``inv_freq`` buffer and reads them
in every layer. ``benchmarks/llama7b_simulation.py`` simulated its forward step on 4
pipeline stages slower than on one GPU (1852 ms against 1797 ms): in the forward
program the buffer counts as a weight, so the tables crossed every layer boundary and
the cut fell at sublayer points (one stage held most layers); and the first stage made
the tables (and a causal mask of the batch's shape) for each microbatch and sent them
to every later stage, each transfer waiting (Megatron-LM synchronises after its
point-to-point transfers) for the last stage to get there. Now the cut ignores values
of no batch input, each stage makes such values itself (``stage_constants``) and the
buffer crosses stages once a step. Proven by execution in float64 and by the program's
transfers.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir

T = ir.transforms

F64 = ir.DType.float64
BATCH, POSITIONS, HIDDEN, LAYERS = 8, 2, 4, 4
WEIGHTS = [f"w{i}" for i in range(LAYERS)]


def rotary_like() -> ir.Function:
    """Layers that each scale their activation by a table made from a buffer ``freq``
    (read as a weight is: broadcast against a larger constant) and the positions."""
    b = ir.FunctionBuilder("rotary")
    freq = b.input("freq", ir.TensorType((HIDDEN,), F64, 0))
    ws = [b.input(n, ir.TensorType((HIDDEN, HIDDEN), F64, 0)) for n in WEIGHTS]
    x = b.input("x", ir.TensorType((BATCH, POSITIONS, HIDDEN), F64, 0))
    positions = b.call(
        "Constant", value=0.5, dtype="float64", shape=(POSITIONS, HIDDEN), device=0, name="pos"
    )
    table = b.call("Cos", b.call("Mul", positions, freq, name="angles"), name="table")
    h = x
    for i, w in enumerate(ws):
        h = b.call("Mul", b.call("Tanh", b.call("MatMul", h, w), name=f"a{i}"), table)
    return b.finish(h)


def _step() -> ir.Function:
    return T.training(ir.models.with_loss(rotary_like(), kind="mse"), params=WEIGHTS)


def _assert_equal(g: ir.Function, f: ir.Function) -> None:
    xs = ir.random_inputs(f, 4)
    want = ir.execute(f, xs)
    got = ir.execute_step(g, xs, source=f)
    for v, a, w in zip(f.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-14, err_msg=v.name)


def _transfers(g: ir.Function) -> list[str]:
    """The names of the values ``g`` sends between stages."""
    return [op.inputs[0].name for op in g.ops if op.op_type in ("Send", "SendEach")]


def test_the_forward_program_is_cut_at_layer_boundaries() -> None:
    f = rotary_like()
    assert "freq" in [v.name for v in ir.transforms.step_parts.weights(f)]  # read as a weight
    cut = T.pipeline_cut(f, LAYERS)
    assert cut.at == "layer boundaries"
    assert [len(s.weights) for s in cut.stages] == [2, 1, 1, 1]  # freq, w0 | w1 | w2 | w3


@pytest.mark.parametrize(
    ("build", "stages"),
    [
        (lambda f: T.pipeline_parallel(f, LAYERS, LAYERS, "1f1b"), LAYERS),
        (lambda f: T.megatron(f, 1, 1, LAYERS, LAYERS), LAYERS),
        (lambda f: T.megatron(f, 2, 1, 2, 2), 2),
    ],
    ids=["pipeline_parallel", "megatron_pp4", "megatron_dp2_pp2"],
)
@pytest.mark.parametrize("training", [False, True], ids=["forward", "step"])
def test_every_stage_makes_the_table_and_only_the_buffer_crosses_once(build, stages, training):
    f = _step() if training else rotary_like()
    g = build(f)
    _assert_equal(g, f)
    sent = _transfers(g)
    assert not any(name.startswith(("table", "angles", "pos")) for name in sent), sent
    assert sent.count("freq") == stages - 1  # once a step to each other stage


def test_a_copy_runs_on_each_stage_that_reads_the_table() -> None:
    f = _step()
    g, stage = T.stage_cut.staged(f, LAYERS, {})
    made = {stage[op] for op in g.ops if op.op_type == "Cos"}
    readers = {
        stage[op]
        for op in g.ops
        if op.op_type == "Mul" and any(v.name.startswith("table") for v in op.inputs)
    }
    assert made == readers == set(range(LAYERS))
