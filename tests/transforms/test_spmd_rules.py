"""The SPMD engine's per-op behaviour comes from the ops' records (ir/transforms/_rules.py)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.transforms._rewrite import TransformError, local_attributes
from ir.transforms._rules import candidates, data_rule
from ir.transforms._spmd import P, R, S
from ir.transforms.horizontal import horizontal_parallel

F64 = ir.DType.float64


def _op(op_type: str, *shapes: tuple[int, ...], **attrs) -> ir.Op:
    b = ir.FunctionBuilder("one")
    xs = [b.input(f"x{i}", ir.TensorType(s, F64, 0)) for i, s in enumerate(shapes)]
    f = b.finish([b.call(op_type, *xs, **attrs)])
    return f.ops[-1]


def test_matmul_candidates_are_its_factors() -> None:
    found = {
        c.choice: (c.operands, c.results) for c in candidates(_op("MatMul", (4, 6), (6, 8)), 2)
    }
    assert found[("shard", "n")] == ((R, S(1)), (S(1),))  # column split
    assert found[("shard", "k")] == ((S(1), S(0)), (P,))  # row split: a partial sum
    assert found[("shard", "m")] == ((S(0), R), (S(0),))  # batch rows
    assert found[("replicate",)] == ((R, R), (R,))


@pytest.mark.parametrize(("degree", "splits"), [(2, False), (3, True), (4, False)])
def test_reshape_to_heads_splits_only_by_whole_heads(degree: int, splits: bool) -> None:
    op = _op("Reshape", (4, 12), shape=(4, 3, 4))  # hidden 12 = 3 heads of 4
    moved = [c.results for c in candidates(op, degree) if c.operands == (S(1),)]
    assert moved == ([(S(1),)] if splits else [])


def test_data_rule_keeps_partials_only_through_ops_linear_in_all_operands() -> None:
    assert data_rule(_op("Add", (3,), (3,)), [P, P]).convert == {}
    assert data_rule(_op("Mul", (3,), (3,)), [P, R]).convert == {0: R}
    assert data_rule(_op("Relu", (3,)), [P]).convert == {0: R}
    assert data_rule(_op("Relu", (3,)), [S(0)]).convert == {}


def test_an_op_outside_the_old_tables_is_split_by_its_record() -> None:
    """Embedding had no hand-written horizontal rule: its record's factors split the table by
    columns, and the following MatMul contracts the split (one sum at the end)."""
    b = ir.FunctionBuilder("embed")
    table = b.input("table", ir.TensorType((10, 6), F64, 0))
    w = b.input("w", ir.TensorType((6, 3), F64, 0))
    ids = b.input("ids", ir.TensorType((5,), ir.DType.int64, 0))
    h = b.call("Embedding", table, ids, name="h")
    f = b.finish([b.call("MatMul", h, w, name="y")])
    g = horizontal_parallel(f, 2)
    assert g.input_layouts == (("S(1)",), ("S(0)",), ("R",))  # table by columns, w by rows
    assert [op.op_type for op in g.ops][-1] == "Reduce"
    rng = np.random.default_rng(0)
    args = [rng.normal(size=(10, 6)), rng.normal(size=(6, 3)), rng.integers(0, 10, size=5)]
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=f)))
    np.testing.assert_allclose(got[0], ir.execute(f, args)[0], rtol=1e-12)


def test_local_attributes_come_from_the_records() -> None:
    b = ir.FunctionBuilder("shard")
    reshape = _op("Reshape", (4, 12), shape=(4, 3, 4))
    shard = b.input("x", ir.TensorType((4, 4), F64, 0))
    assert tuple(local_attributes(reshape, [shard], 0)["shape"]) == (4, 1, 4)
    loss = _op("Loss", (8, 3), (8, 3), kind="mse")
    rows = [
        b.input("y", ir.TensorType((4, 3), F64, 0)),
        b.input("z", ir.TensorType((4, 3), F64, 0)),
    ]
    assert local_attributes(loss, rows, 0)["denominator"] == 8  # the global number of rows
    flatten = _op("Reshape", (4, 6), shape=(24,))
    with pytest.raises(TransformError, match="must stay whole"):
        local_attributes(flatten, [b.input("c", ir.TensorType((4, 3), F64, 0))], 0)


def test_transforms_compare_op_types_only_for_the_ir_structure() -> None:
    """Facts about compute ops live in their records: the transforms compare ``op_type`` only
    with the structural ops they build and take apart themselves (pmaps, tasks, tuples,
    the pipeline's output concatenation)."""
    import ast
    from pathlib import Path

    folder = Path(ir.__file__).parent / "transforms"
    named: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(isinstance(s, ast.Attribute) and s.attr == "op_type" for s in sides):
                continue
            for s in sides:
                for c in ast.walk(s):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        named.setdefault(c.value, set()).add(path.name)
    assert set(named) <= {"Pmap", "Task", "TupleGet", "MakeTuple", "Concat"}, named
