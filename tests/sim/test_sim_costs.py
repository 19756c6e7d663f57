"""ir.simulate(..., costs=OpCosts): measured op times replace the models op by op; ops the
table lacks keep the models, and OpCosts.missing names them."""

from __future__ import annotations

import pytest

import ir
from ir import transforms
from ir.errors import ArgumentError
from ir.sim.clock import on_clock
from ir.sim.costs import OpCosts, communication_keys, compute_key, compute_ops

F32 = ir.DType.float32


def _dp2_step():
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F32)
    return transforms.unroll_pmap(transforms.megatron(f, 2, 1, 1, 1))


def test_a_table_entry_is_the_ops_duration_and_other_ops_keep_the_model():
    g = _dp2_step()
    topo = ir.Topology.uniform(2, peak_flops=1e12, link_bandwidth_bytes_per_s=1e9)
    plain = ir.simulate(g, topo)
    ops = compute_ops(g)
    matmul_key, _ = next((k, op) for k, op in ops if k[0] == "MatMul")
    transfer = next(k for k in communication_keys(g) if k[0] == "allreduce")
    table = OpCosts({matmul_key: 1e-3}, {transfer: 2e-3}, processes=2)
    result = ir.simulate(g, topo, costs=table)
    checked_matmul = checked_other = checked_comm = 0
    for e in result.events:
        if e.stream == "compute" and compute_key(e.op.op_type, e.op) == matmul_key:
            assert e.dur_s == on_clock(1e-3)  # the table's time on the engine's clock
            checked_matmul += 1
        elif e.stream == "compute":
            twin = next(
                p for p in plain.events if p.op is e.op and p.device == e.device
            )  # not in the table: the model's time
            assert e.dur_s == twin.dur_s
            checked_other += 1
    for e in result.events:
        if e.stream != "compute" and e.op.op_type == "AllReduce":
            # the all-reduces of the transfer's size take the table's time, others the model's
            checked_comm += e.dur_s == on_clock(2e-3)
    assert checked_matmul >= 2 and checked_other > 0 and checked_comm >= 1
    assert result.step_time_s > plain.step_time_s  # a 1 ms matmul is slower than the model's


def test_missing_lists_what_the_table_lacks_and_nothing_once_full():
    g = _dp2_step()
    table = OpCosts(processes=2)
    missing = table.missing(g)
    assert len(missing) == len(compute_ops(g)) + len(communication_keys(g))
    assert any("MatMul" in line for line in missing)
    assert any(line.startswith("allreduce of") for line in missing)
    full = OpCosts(
        {k: 1e-6 for k, _ in compute_ops(g)},
        {k: 1e-6 for k in communication_keys(g)},
        processes=2,
    )
    assert full.missing(g) == []
    # every op then costs the table's microsecond: the step is a whole number of them
    result = ir.simulate(g, ir.Topology.uniform(2, peak_flops=1e12), costs=full)
    assert {round(e.dur_s, 12) for e in result.events} == {1e-6}


def test_pmapped_programs_are_keyed_as_their_unrolled_ops():
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F32)
    g = transforms.megatron(f, 2, 1, 1, 1)
    assert any(op.op_type == "Pmap" for op in g.ops)
    keys = [k for k, _ in compute_ops(g)]
    assert keys == [k for k, _ in compute_ops(transforms.unroll_pmap(g))]
    full = OpCosts({k: 5e-6 for k, _ in compute_ops(g)}, {}, processes=2)
    topo = ir.Topology.uniform(2, peak_flops=1e12, link_bandwidth_bytes_per_s=1e9)
    folded = ir.simulate(g, topo, costs=full)
    unrolled = ir.simulate(transforms.unroll_pmap(g), topo, costs=full)
    assert folded.step_time_s == pytest.approx(unrolled.step_time_s, rel=1e-12)


def test_merging_tables_and_refusing_other_process_counts():
    a = OpCosts({("X",): 1.0}, {("allreduce", 8.0, 2): 2.0}, processes=2, notes=("a",))
    b = OpCosts({("X",): 3.0, ("Y",): 4.0}, {}, processes=2, notes=("b",))
    merged = a.updated(b)
    assert merged.compute == {("X",): 3.0, ("Y",): 4.0}
    assert merged.communication == {("allreduce", 8.0, 2): 2.0}
    assert len(merged) == 3 and merged.notes == ("a", "b")
    with pytest.raises(ValueError, match="2 and 4 processes"):
        a.updated(OpCosts(processes=4))


def test_simulate_refuses_a_costs_argument_of_the_wrong_kind():
    g = _dp2_step()
    with pytest.raises(ArgumentError, match=r"costs must be an ir\.sim\.costs\.OpCosts"):
        ir.simulate(g, ir.Topology.uniform(2), costs={"MatMul": 1.0})


@pytest.mark.parametrize("comm", ["channels", "blocking"])
def test_a_table_on_a_3d_step_times_rank_classes_as_every_device(comm):
    f = ir.models.mlp(8, 16, 32, 4, layers=4, training=True, dtype=F32)
    g = transforms.megatron(f, 2, 2, 2, 2)
    assert g.rank_classes
    ops, transfers = compute_ops(g), communication_keys(g)
    table = OpCosts(
        {k: (i + 1) * 1e-6 for i, (k, _) in enumerate(ops)},
        {k: (i + 1) * 3e-6 for i, k in enumerate(transfers)},
        processes=8,
    )
    assert table.missing(g) == []
    topo = ir.Topology.uniform(8, peak_flops=1e12, link_bandwidth_bytes_per_s=1e9)
    classes = ir.simulate(g, topo, comm=comm, costs=table)
    every = ir.simulate(g, topo, comm=comm, symmetry=False, costs=table)
    unrolled = ir.simulate(transforms.unroll_pmap(g), topo, comm=comm, costs=table)
    assert classes.step_time_s == every.step_time_s
    assert classes.step_time_s == pytest.approx(unrolled.step_time_s, rel=1e-12)
    for e in classes.events:  # every op took the table's time
        if e.stream == "compute":
            assert e.dur_s == on_clock(table.compute[compute_key(e.op.op_type, e.op)])


def _pmapped_sum_of_a_tuple() -> ir.Function:
    """A pmap over devices 0 and 1 whose body sums a tuple it makes: a compute op with a
    tuple operand, typed on the body's device variable."""
    body = ir.FunctionBuilder("body")
    x = body.input("x", ir.TensorType((4,), F32, ir.DeviceVar("d")))
    pair = body.call("MakeTuple", x, x, name="pair")
    body_f = body.finish([body.call("Sum", pair, name="s")])
    b = ir.FunctionBuilder("f")
    xs = b.input("xs", ir.TupleType(tuple(ir.TensorType((4,), F32, d) for d in (0, 1))))
    (ss,) = b.add_op("Pmap", [xs], {"device_var": "d"}, names=["ss"], subfunctions=[body_f]).outputs
    return b.finish([ss])


def test_a_tuple_operand_is_keyed_without_its_devices_so_a_pmap_body_finds_its_entry():
    g = _pmapped_sum_of_a_tuple()
    keys = [k for k, _ in compute_ops(g)]
    assert len(keys) == 1  # device 0's and device 1's copies cost alike: one entry
    table = OpCosts({keys[0]: 1e-3}, {}, processes=2)
    assert table.missing(g) == []
    result = ir.simulate(g, ir.Topology.uniform(2, peak_flops=1e12), costs=table)
    sums = [e for e in result.events if e.op.op_type == "Sum"]
    assert len(sums) == 2 and all(e.dur_s == on_clock(1e-3) for e in sums)
