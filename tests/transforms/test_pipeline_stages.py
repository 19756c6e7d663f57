"""Seed 001's pipeline-stage annotations drive the pipeline transforms, proven by execution.

An annotated forward program is trained (``training`` keeps the markers), then pipelined
(``pipeline_parallel``) or 3D-parallelised (``megatron``): the step computes the
sequential step's outputs, each op runs on its annotated stage's devices (read from the
ops, not from names of devices), and bad annotations are refused with a TransformError
that names the pipeline level and the reason.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _parallel_programs import assert_same

import ir
import ir.models
from ir import transforms
from ir.sharding import annotate_stages, pipeline_stages
from ir.transforms import TransformError, megatron, pipeline_parallel, stage_assignment

F64 = ir.DType.float64
DOCS = Path(__file__).resolve().parents[2] / "docs" / "transforms-parallel.md"


def _mlp(layers: int = 4, batch: int = 8) -> ir.Function:
    return ir.models.mlp(batch, 4, 6, 4, layers=layers, dtype=F64)


def _unbalanced() -> ir.Function:
    """Stage 0 = layer 0, stage 1 = layers 1-3 (the cost cut would give 2 + 2)."""
    return transforms.training(annotate_stages(_mlp(), {"a1": 1}))


def _layer(name: str) -> int | None:
    """The MLP layer a value belongs to: ``a2``, ``h2``, ``da2``, ``dwC``, ``wC1``... -> 2."""
    base = re.sub(r"(_mb\d+|_acc\d+|_at\w+)+$", "", name)
    if m := re.fullmatch(r"d?[ah](\d)", base):
        return int(m.group(1))
    if m := re.fullmatch(r"d?w([A-Z])1?", base):
        return ord(m.group(1)) - ord("A")
    return 3 if base in ("y", "l", "dl") else None


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


def test_backward_ops_and_optimizer_steps_follow_their_forward_ops() -> None:
    t = _unbalanced()
    stage = stage_assignment(t, 2)
    layer_stage = {0: 0, 1: 1, 2: 1, 3: 1}
    for op, s in stage.items():
        layer = _layer(op.outputs[0].name)
        if layer is not None and op.op_type != "PipelineStage":
            assert s == layer_stage[layer], op.outputs[0].name
    # the cost-balanced cut of the same program, for contrast: two layers a stage
    balanced = stage_assignment(transforms.training(_mlp()), 2)
    plain = {op.outputs[0].name: s for op, s in balanced.items()}
    assert plain["a1"] == 0 and plain["a2"] == 1


# -- pipeline_parallel -------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_annotated_mlp_pipelines_equal_to_the_sequential_step_on_its_stages(schedule) -> None:
    t = _unbalanced()
    g = pipeline_parallel(t, 2, 4, schedule)
    assert_same(transforms.training(_mlp()), g)
    assert "PipelineStage" not in {op.op_type for op in g.ops}
    placed = 0
    for op in g.ops:
        layer = _layer(op.outputs[0].name)
        if layer is None or op.op_type in ("Send", "TupleGet", "Split", "Concat"):
            continue
        assert op.device == (0 if layer == 0 else 1), str(op)
        placed += 1
    assert placed >= 4 * 4 * 2  # every layer's forward and backward, 4 microbatches
    # the weights live on their annotated stage
    assert {v.name: v.type.device for v in g.inputs if v.name.startswith("w")} == {
        "wA": 0,
        "wB": 1,
        "wC": 1,
        "wD": 1,
    }


def test_stage_of_gives_the_same_pipeline_as_markers() -> None:
    plain = transforms.training(_mlp())
    by_keyword = pipeline_parallel(plain, 2, 4, "1f1b", stage_of={"a1": 1})
    by_markers = pipeline_parallel(_unbalanced(), 2, 4, "1f1b")
    assert str(by_keyword) == str(by_markers)
    assert str(by_keyword) != str(pipeline_parallel(plain, 2, 4, "1f1b"))


def test_the_simulator_shows_the_unbalanced_stages() -> None:
    f = ir.models.mlp(256, 512, 512, 512, layers=4)
    topo = ir.Topology.uniform(2)

    def busy_s(g: ir.Function) -> tuple[dict[int, float], float]:
        result = ir.simulate(g, topo)
        busy = {0: 0.0, 1: 0.0}
        for e in result.events:
            if e.stream == "compute":
                busy[e.device] += e.dur_s
        return busy, result.step_time_s

    t = transforms.training(annotate_stages(f, {"a1": 1}))
    unbalanced, slow_s = busy_s(pipeline_parallel(t, 2, 4, "1f1b"))
    balanced, fast_s = busy_s(pipeline_parallel(transforms.training(f), 2, 4, "1f1b"))
    assert unbalanced[1] > 2.5 * unbalanced[0]  # three layers against one
    assert balanced[1] < 1.2 * balanced[0]
    assert slow_s > 1.1 * fast_s  # the busier stage sets the pace


def test_annotated_gpt_pipelines_equal_to_the_sequential_step() -> None:
    f = ir.models.gpt(batch=4, seq=4, hidden=8, heads=2, vocab=16, layers=3, dtype=F64)
    t = transforms.training(annotate_stages(f, {"h1_ln1_y": 1}))
    weight_stage = {v.name: 0 if v.name.startswith(("wte", "wpe", "h0_")) else 1 for v in t.inputs}
    for schedule in ("gpipe", "1f1b"):
        g = pipeline_parallel(t, 2, 2, schedule)
        assert_same(transforms.training(f), g)
        # forward ops on their annotated stage; weight gradients and updates with the weight
        for op in g.ops:
            name = re.sub(r"(_mb\d+|_acc\d+)+$", "", op.outputs[0].name)
            if op.op_type in ("Send", "TupleGet", "Split", "Concat"):
                continue
            if name.startswith(("h0_", "tok_emb", "emb")):
                assert op.device == 0, str(op)
            elif name.startswith(("h1_", "h2_", "lnf_", "logits")):
                assert op.device == 1, str(op)
            elif name.startswith("d") and name[1:] in weight_stage:
                assert op.device == weight_stage[name[1:]], str(op)
        assert {v.name: v.type.device for v in g.inputs if v.name in weight_stage} == {
            w: s for w, s in weight_stage.items() if w not in ("tokens", "labels")
        } | {"tokens": 0, "labels": 1}


def test_interleaved_pipeline_takes_pp_times_chunks_annotated_stages() -> None:
    t = transforms.training(annotate_stages(_mlp(), {"a1": 1, "a2": 2, "y": 3}))
    g = pipeline_parallel(t, 2, 2, "interleaved", chunks=2)
    assert_same(transforms.training(_mlp()), g)
    # model stage c * 2 + d runs on device d: layers 0 and 2 on device 0, 1 and 3 on 1
    opt = {op.outputs[0].name: op.device for op in g.ops if op.op_type == "SGDOptimizer"}
    assert opt == {"wA1": 0, "wB1": 1, "wC1": 0, "wD1": 1}


def test_seed_001_example_runs_through_pipeline_parallel() -> None:
    """Seed 001: "A -> B -> C -> D -> E" have pipeline id 1, "F -> ... -> K" id 2. The
    seed counts from 1, stages here from 0; as in the seed, only the first node of each
    stage is annotated and the nodes after it follow."""
    b = ir.FunctionBuilder("seed001")
    t4 = ir.TensorType((4, 4), F64, 0)
    ws = {n: b.input(f"w{n}", t4) for n in "ACEFHJ"}
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    z = b.input("z", ir.TensorType((8,), ir.DType.int64, 0))
    v = x
    for node in "ABCDEFGHIJ":
        v = b.call("MatMul", v, ws[node], name=node) if node in ws else b.call("Relu", v, name=node)
    f = b.finish([b.call("Loss", v, z, name="K")])
    marked = annotate_stages(f, {"A": 0, "F": 1})
    assert {op.outputs[0].name: s for op, s in pipeline_stages(marked).items()} == {
        n: 0 if n in "ABCDE" else 1 for n in "ABCDEFGHIJK"
    }
    t = transforms.training(marked)
    g = pipeline_parallel(t, 2, 4, "1f1b")
    assert_same(transforms.training(f), g)
    for op in g.ops:
        node = op.outputs[0].name.split("_")[0]
        if op.op_type in ("MatMul", "Relu", "Loss") and node in "ABCDEFGHIJK":
            assert op.device == (0 if node in "ABCDE" else 1), str(op)


# -- megatron ----------------------------------------------------------------------------


def _unrolled_devices(g: ir.Function) -> dict[int, set[int]]:
    """The devices each MLP layer's forward MatMuls run on, read from the unrolled ops."""
    found: dict[int, set[int]] = {}
    for op in transforms.unroll_pmap(g).ops:
        if op.op_type == "MatMul":
            layer = _layer(op.outputs[0].name.rsplit("_", 1)[0])
            assert layer is not None, str(op)
            found.setdefault(layer, set()).add(op.device)
    return found


@pytest.mark.parametrize(("dp", "tp"), [(1, 2), (2, 2)])
def test_megatron_puts_each_annotated_stage_on_its_own_tensor_parallel_group(dp, tp) -> None:
    t = _unbalanced()
    g = megatron(t, dp=dp, tp=tp, pp=2, microbatches=2)
    xs = ir.random_inputs(t, 0)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10)
    n = dp * tp
    group = {s: {s * n + i * tp + j for i in range(dp) for j in range(tp)} for s in (0, 1)}
    assert _unrolled_devices(g) == {0: group[0], 1: group[1], 2: group[1], 3: group[1]}
    # stage_of on the plain program: the same step; without annotations, two layers a stage
    plain = transforms.training(_mlp())
    assert _unrolled_devices(megatron(plain, dp, tp, 2, 2, stage_of={"a1": 1})) == (
        _unrolled_devices(g)
    )
    assert _unrolled_devices(megatron(plain, dp, tp, 2, 2))[1] == group[0]


def test_megatron_runs_an_annotated_gpt_with_tensor_parallel_stages() -> None:
    f = ir.models.gpt(batch=4, seq=4, hidden=8, heads=2, vocab=16, layers=3, dtype=F64)
    t = transforms.training(annotate_stages(f, {"h1_ln1_y": 1}))
    g = megatron(t, 1, 2, 2, 2, "gpipe")
    xs = ir.random_inputs(t, 1)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for w, o in zip(ir.execute(t, xs), got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10)
    layouts = dict(zip((v.name for v in g.inputs), (v.type for v in g.inputs)))
    assert {e.device for e in layouts["h0_attn_wq"].elements} == {0, 1}
    assert {e.device for e in layouts["h1_attn_wq"].elements} == {2, 3}
    assert {e.device for e in layouts["h2_attn_wq"].elements} == {2, 3}
    ir.simulate(g, ir.Topology.uniform(4))  # markers left in the step's bodies are free


# -- bad annotations ---------------------------------------------------------------------


def _tied() -> ir.Function:
    """One weight read by two MatMuls (as tied embeddings are)."""
    b = ir.FunctionBuilder("tied")
    w = b.input("w", ir.TensorType((4, 4), F64, 0))
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    z = b.input("z", ir.TensorType((8,), ir.DType.int64, 0))
    y = b.call("MatMul", b.call("MatMul", x, w, name="a"), w, name="y")
    return b.finish([b.call("Loss", y, z, name="l")])


CUTS: dict[str, Callable[..., ir.Function]] = {
    "pipeline_parallel": lambda t, n, **kw: pipeline_parallel(t, n, 2, **kw),
    "megatron": lambda t, n, **kw: megatron(t, pp=n, microbatches=2, **kw),
}

BAD = [
    ("more annotated stages", _mlp(), {"a1": 1, "a2": 2}, 2, r"stage\(s\) \[2\] are out of range"),
    ("out of range", _mlp(), {"a1": 5}, 2, r"pipeline has 2 .*stage\(s\) \[5\] are out of range"),
    ("fewer annotated stages", _mlp(), {"a1": 1}, 3, r"make 2 stage\(s\) but the pipeline has 3"),
    ("gap", _mlp(), {"a1": 2}, 3, r"stage\(s\) \[1\] have no op \(a gap"),
    ("empty first stage", _mlp(), {"a0": 1, "a1": 2}, 3, r"stage\(s\) \[0\] have no op"),
    ("cycle", _mlp(), {"a1": 1, "a2": 0}, 2, r"'a2' is annotated stage 0 but reads 'h1' from"),
    ("tied weight", _tied(), {"y": 1}, 2, r"weight 'w' is read by stages \[0, 1\]"),
]


@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize(("why", "f", "stages", "n", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_annotations_are_refused_naming_the_pipeline_level(why, f, stages, n, match, cut):
    t = transforms.training(annotate_stages(f, stages))
    with pytest.raises(TransformError, match="pipeline level: .*" + match):
        CUTS[cut](t, n)
    # the same annotation given as stage_of= on the plain program
    with pytest.raises(TransformError, match="pipeline level: .*" + match):
        CUTS[cut](transforms.training(f), n, stage_of=stages)


def test_bad_stage_of_mappings_are_refused() -> None:
    plain, marked = transforms.training(_mlp()), _unbalanced()
    with pytest.raises(TransformError, match="no forward op of mlp makes a value named 'dwA'"):
        pipeline_parallel(plain, 2, 2, stage_of={"dwA": 1})
    with pytest.raises(TransformError, match="must be a non-negative integer, got -1"):
        pipeline_parallel(plain, 2, 2, stage_of={"a1": -1})
    with pytest.raises(TransformError, match="carries PipelineStage annotations and stage_of="):
        pipeline_parallel(marked, 2, 2, stage_of={"a1": 1})
    with pytest.raises(TransformError, match=r"make 2 stage\(s\) but the pipeline has 4 \(the"):
        pipeline_parallel(marked, 2, 2, "interleaved", chunks=2)
    # a marker put on the backward pass after training: the backward follows the forward
    with pytest.raises(TransformError, match="'dwB' is annotated, but its op is part of"):
        pipeline_parallel(annotate_stages(plain, {"a1": 1, "dwB": 1}), 2, 2)


def test_megatron_refuses_bad_stage_of_and_counts_pp_times_chunks() -> None:
    plain, marked = transforms.training(_mlp()), _unbalanced()
    with pytest.raises(TransformError, match="carries PipelineStage annotations and stage_of="):
        megatron(marked, pp=2, microbatches=2, stage_of={"a1": 1})
    with pytest.raises(TransformError, match="no forward op of mlp makes a value named 'wB1'"):
        megatron(plain, pp=2, microbatches=2, stage_of={"wB1": 1})
    with pytest.raises(TransformError, match=r"make 2 stage\(s\) but the pipeline has 4 \(the"):
        megatron(marked, pp=2, microbatches=2, schedule="interleaved", chunks=2)


# -- the docs' example -------------------------------------------------------------------


def test_the_docs_example_runs() -> None:
    blocks = re.findall(r" *```python\n(.*?) *```", DOCS.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "annotate_stages" in b]
    namespace: dict = {}
    exec(compile(textwrap.dedent(example), f"{DOCS.name} (annotated stages)", "exec"), namespace)
    assert namespace["devices"] == {"a0": 0, "a1": 1, "a2": 1, "y": 1}
    assert str(namespace["same"]) == str(namespace["g"])


def _scaled_mlp() -> ir.Function:
    """x @ w1, scaled per feature by a broadcast weight g (an RMSNorm's scale), @ w2."""
    f64 = ir.DType.float64
    b = ir.FunctionBuilder("scaled")
    w1 = b.input("w1", ir.TensorType((4, 6), f64, 0))
    g = b.input("g", ir.TensorType((6,), f64, 0))
    w2 = b.input("w2", ir.TensorType((6, 3), f64, 0))
    x = b.input("x", ir.TensorType((8, 4), f64, 0))
    z = b.input("z", ir.TensorType((8,), ir.DType.int64, 0))
    h = b.call("MatMul", x, w1, name="h")
    y = b.call("Mul", h, g, name="y")
    out = b.call("MatMul", y, w2, name="out")
    return transforms.training(b.finish([b.call("Loss", out, z, name="l")]))


def test_a_broadcast_scales_gradient_runs_on_the_scales_stage() -> None:
    """``dg = sum(dy * h)`` reads ``h`` from stage 0 but is g's gradient: it runs on g's
    stage 1 (it ran on stage 0, which then waited for stage 1's backward: a deadlock)."""
    t = _scaled_mlp()
    stage = stage_assignment(t, 2, {"y": 1})
    g_grad = [op for op in t.ops if any(v.name.startswith("dg") for v in op.outputs)]
    assert g_grad and {stage[op] for op in g_grad} == {1}
    g = megatron(t, 1, 1, 2, 2, stage_of={"y": 1})
    xs = ir.random_inputs(t, 0)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)))
    for v, o, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-9, err_msg=v.name)


def test_constants_run_on_the_first_stage_that_reads_them() -> None:
    """A constant read only by stage 1 (and its backward) is made there, not on stage 0."""
    t = transforms.training(ir.models.mlp(8, 4, 6, 3, layers=2, dtype="float64"))
    stage = stage_assignment(t, 2)
    readers = t.consumers
    for op in t.ops:
        if op.op_type == "Constant":
            assert stage[op] == min(stage[u] for v in op.outputs for u in readers[v])
