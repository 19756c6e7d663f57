"""The registry walk: every registered op is checked on its own examples.

Each op record carries ``extra["examples"]`` (``scale -> [TypeContext]``). For
every op and scale 1, 2, 3 the walk runs the kernel on random inputs and
compares each result with the type rule, checks that the cost is non-negative
and grows with the size, and that a one-op program prints and parses back to
an equivalent Function. New ops cannot skip it: an op without examples fails.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ir
from ir.execute import input_value_ranges
from ir.registry import REQUIRED, Attr, CostContext, OpDef, OpKind, TypeContext, register_op
from ir.types import TensorType, TupleType, Type

SCALES = (1, 2, 3)
OPS = ir.all_ops()
OP_NAMES = [op.name for op in OPS]


def _complete(op: OpDef, example: TypeContext) -> TypeContext:
    attrs = op.complete_attributes(example.attributes)
    return TypeContext(example.input_types, attrs, example.subfunctions)


def _examples(op: OpDef, scale: int) -> list[TypeContext]:
    return [_complete(op, e) for e in op.extra["examples"](scale)]


def _random(t: Type, rng: np.random.Generator, value_range=None):
    if isinstance(t, TupleType):
        return tuple(_random(e, rng) for e in t.elements)
    if value_range is not None and value_range[1] is not None:  # class labels, token ids
        return rng.integers(value_range[0], value_range[1], t.shape).astype(t.dtype.numpy)
    if t.dtype.is_float:
        # Positive values keep every kernel in its domain (Div, Adam's sqrt(v)).
        return rng.uniform(0.1, 1.0, t.shape).astype(t.dtype.numpy)
    if t.dtype.value == "bool":
        return rng.integers(0, 2, t.shape).astype(bool)
    return rng.integers(0, 2, t.shape).astype(t.dtype.numpy)  # valid ids and class labels


def _assert_fits(t: Type, value, where: str) -> None:
    if isinstance(t, TupleType):
        assert isinstance(value, tuple) and len(value) == len(t), f"{where}: not a {t}"
        for i, (e, v) in enumerate(zip(t.elements, value)):
            _assert_fits(e, v, f"{where}[{i}]")
        return
    arr = np.asarray(value)
    assert arr.shape == t.shape, f"{where}: kernel shape {arr.shape}, type rule {t.shape}"
    assert arr.dtype == t.dtype.numpy, f"{where}: kernel dtype {arr.dtype}, type rule {t.dtype}"


def _one_op_function(op: OpDef, example: TypeContext) -> ir.Function:
    b = ir.FunctionBuilder(f"walk_{op.name.lower()}")
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(example.input_types)]
    node = b.add_op(op.name, inputs, example.attributes, subfunctions=example.subfunctions)
    return b.finish(list(node.outputs))


def _total(cost: ir.Cost) -> float:
    return cost.flops + cost.bytes_read + cost.bytes_written


def test_every_op_has_a_doc_examples_and_a_kernel_or_a_body():
    assert len(OPS) >= 45
    for op in OPS:
        assert op.doc.strip(), f"{op.name} has no doc"
        assert callable(op.extra.get("examples")), f"{op.name} has no extra['examples']"
        assert op.kernel is not None or op.name in ("Pmap", "Task"), f"{op.name} has no kernel"
        for scale in SCALES:
            assert op.extra["examples"](scale), f"{op.name} has no examples at scale {scale}"


def test_the_issue_op_set_is_registered():
    wanted = " ".join(
        [
            "MatMul Add Sub Mul Div Relu Gelu Tanh Softmax LayerNorm Transpose Reshape Slice",
            "Concat Split Identity Constant ReduceSum Embedding Loss MatMulGrad ReluGrad GeluGrad",
            "LossGrad SoftmaxGrad LayerNormGrad SGDOptimizer Adam Send Scatter Broadcast Gather",
            "AllReduce AllGather ReduceScatter AllToAll Pmap",
        ]
    ).split()
    missing = [name for name in wanted if not ir.registry.has_op(name)]
    assert not missing
    # the seeds' spellings
    assert ir.get_op("opt").name == "SGDOptimizer"
    assert ir.get_op("sum").name == "Sum" and ir.get_op("AddN").name == "Sum"
    assert ir.get_op("concat").name == "Concat" and ir.get_op("split").name == "Split"


@pytest.mark.parametrize("name", OP_NAMES)
def test_kernel_agrees_with_type_rule(name: str):
    op = ir.get_op(name)
    rng = np.random.default_rng(0)
    for scale in SCALES:
        for k, example in enumerate(_examples(op, scale)):
            where = f"{name} example {k} at scale {scale}"
            types = list(op.type_rule(example))
            if not op.extra.get("variadic_results"):
                assert len(types) == len(op.results), where
            ranges = input_value_ranges(_one_op_function(op, example))
            inputs = [_random(t, rng, ranges.get(i)) for i, t in enumerate(example.input_types)]
            if op.kernel is None:  # Pmap, Task: the executor runs the body
                results = ir.execute(_one_op_function(op, example), inputs)
            else:
                snapshot = [np.copy(x) if isinstance(x, np.ndarray) else x for x in inputs]
                results = op.kernel(inputs, example.attributes)
                for before, after in zip(snapshot, inputs):
                    if isinstance(before, np.ndarray):
                        np.testing.assert_array_equal(before, after, err_msg=f"{where} mutated")
            assert len(results) == len(types), where
            for i, (t, r) in enumerate(zip(types, results)):
                _assert_fits(t, r, f"{where}, result {i}")


@pytest.mark.parametrize("name", OP_NAMES)
def test_cost_is_non_negative_and_grows_with_size(name: str):
    op = ir.get_op(name)
    totals = []
    for scale in SCALES:
        total = 0.0
        for example in _examples(op, scale):
            cost = op.cost_rule(
                CostContext(example.input_types, tuple(op.type_rule(example)), example.attributes)
            )
            assert min(cost.flops, cost.bytes_read, cost.bytes_written) >= 0, (name, cost)
            assert 0 <= cost.matrix_flops <= cost.flops, (name, cost)  # a part of the flops
            total += _total(cost)
        totals.append(total)
    if op.kind is OpKind.CONTROL and not any(totals):
        return  # structure only (pmap's cost is its body's; tuple access moves nothing)
    assert totals[0] < totals[1] < totals[2], f"{name}: cost at scales 1, 2, 3 is {totals}"


@pytest.mark.parametrize("name", OP_NAMES)
def test_print_then_parse_gives_an_equivalent_function(name: str):
    if not hasattr(ir, "parse"):
        pytest.skip("ir.parse is missing: ir/text/parser.py has not landed")
    op = ir.get_op(name)
    for scale in SCALES:
        for example in _examples(op, scale):
            f = _one_op_function(op, example)
            text = str(f)
            back = ir.parse(text)
            assert back.is_equivalent(f), f"{name} did not round-trip:\n{text}\n{back}"
            assert str(back) == text


def _dummy(name: str, aliases: tuple[str, ...] = ()) -> OpDef:
    return OpDef(
        name=name,
        operands=("x",),
        results=("y",),
        type_rule=lambda c: [c.input_types[0]],
        kernel=lambda xs, a: [xs[0]],
        cost_rule=lambda c: ir.Cost(),
        attributes=(Attr("n", REQUIRED),),
        aliases=aliases,
        doc="test double",
    )


@pytest.mark.parametrize(
    ("opdef", "message"),
    [
        (_dummy("MatMul"), "'MatMul' is already registered"),
        (_dummy("matmul"), "'matmul' is already registered .by MatMul"),
        (_dummy("BrandNewOp", aliases=("opt",)), "'opt' is already registered .by SGDOptimizer"),
    ],
)
def test_registering_a_taken_name_is_an_error(opdef: OpDef, message: str):
    before = ir.all_ops()
    with pytest.raises(ir.RegistryError, match=message):
        register_op(opdef)
    assert ir.all_ops() == before
    assert not ir.registry.has_op("BrandNewOp")


def test_optimizers_are_marked_for_the_transforms():
    marked = sorted(op.name for op in OPS if op.extra.get("optimizer"))
    assert marked == ["Adam", "MasterAdam", "MasterSGD", "SGDOptimizer"]
    assert ir.get_op("Adam").extra["state"] == ("m", "v")
    assert ir.get_op("MasterAdam").extra["state"] == ("master", "m", "v")


def test_loss_grad_takes_the_seeds_positional_scale_first():
    assert ir.get_op("LossGrad").attribute_names[0] == "scale"
    b = ir.FunctionBuilder("g")
    y = b.input("y", TensorType((4, 3), ir.DType.float32, 0))
    z = b.input("z", TensorType((4,), ir.DType.float32, 0))
    dl = b.call("LossGrad", y, z, scale=1)
    assert dl.type == y.type


def test_docs_ops_md_is_the_generated_table():
    path = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
    assert path.read_text() == ir.registry.op_table_markdown(), (
        "docs/ops.md is out of date with the registry; regenerate it with the command at its top"
    )
