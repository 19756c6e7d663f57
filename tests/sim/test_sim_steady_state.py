"""A data-parallel training step is steady state: the weights never leave device 0 in it, the
gradient all-reduces are its communication, and it is far faster than distributing every step."""

from __future__ import annotations

import ir
from ir.registry import OpKind
from ir.transforms import data_parallel, setup_program


def _communication(g: ir.Function) -> list[ir.Op]:
    return [op for op in g.ops if ir.get_op(op.op_type).kind is OpKind.COMMUNICATION]


def test_data_parallel_mlp_on_8_gpus_moves_no_weights_and_only_all_reduces_gradients() -> None:
    f = ir.models.mlp(256, 1024, 1024, 256, layers=4, training=True)
    topology = ir.Topology.preset("a100-hgx", 8, ideal=True)
    step = data_parallel(f, 8)
    old = data_parallel(f, 8, inputs="distribute")
    comm = _communication(step)
    assert not any(op.op_type in ("Broadcast", "Scatter", "Send") for op in comm)
    weights = {v.name for v in f.inputs if v.name.startswith("w")}
    assert all(v.name not in weights for op in comm for v in op.inputs)
    # one all-reduce per weight gradient; besides them only the scalar loss is summed
    reduces = [op for op in comm if op.op_type == "AllReduce"]
    assert len(reduces) == len(weights)
    assert sorted(op.inputs[0].type.elements[0].shape for op in reduces) == sorted(
        f.value(w).type.shape for w in weights
    )
    others = [op for op in comm if op.op_type != "AllReduce"]
    assert all(op.outputs[0].type.shape == () for op in others)  # the loss Reduce
    step_s = ir.simulate(step, topology).step_time_s
    old_s = ir.simulate(old, topology).step_time_s
    assert step_s < 0.5 * old_s
    # the distribution is still there, once: the setup program
    setup_s = ir.simulate(setup_program(f, step), topology).step_time_s
    assert setup_s > 0


def test_simulated_step_starts_with_resident_memory_on_every_device() -> None:
    """Each device holds its own weight replica from the start of the step."""
    f = ir.models.mlp(64, 256, 256, 64, layers=3, training=True)
    r = ir.simulate(data_parallel(f, 4), ir.Topology.preset("a100-hgx", 4))
    weight_bytes = sum(v.type.size_bytes for v in f.inputs if v.name.startswith("w"))
    assert all(r.peak_memory_bytes[d] >= weight_bytes for d in range(4))
