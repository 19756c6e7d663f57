"""Printer -> parser round trips: ``ir.parse(str(f))`` is equivalent to ``f`` and prints the same.

Builder-made programs cover pmap (nested, with a device map and sub-devices),
tuples, scalars, every dtype and attributes of every kind; property tests
cover types and attribute values on their own; golden files in
tests/ir/golden/ must parse and print back byte for byte.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir import DeviceVar, DType, FunctionBuilder, TensorType, TupleType
from ir.text.lexer import Cursor
from ir.text.printer import format_attribute, format_type
from ir.text.terms import Terms

GOLDEN = Path(__file__).parent / "golden"


def T(*shape: int, dtype: DType = DType.float32, device=0) -> TensorType:
    return TensorType(tuple(shape), dtype, device)


def round_trip(f: ir.Function) -> ir.Function:
    text = str(f)
    back = ir.parse(text)
    assert back.is_equivalent(f), f"not equivalent after parsing:\n{text}\n---\n{back}"
    assert str(back) == text
    return back


# -- builder-made programs ------------------------------------------------------------------


def data_parallel_mlp(n: int = 2) -> ir.Function:
    b = FunctionBuilder("mlp_dp")
    wa, x = b.input("wA", T(4, 6)), b.input("x", T(8, 4))
    devices = list(range(1, n + 1))
    xs = b.call("Scatter", x, dim=0, devices=devices, name="xs")
    was = b.call("Broadcast", wa, devices=devices, name="wAs")
    body = FunctionBuilder("body")
    xi = body.input("xi", T(8 // n, 4, device=DeviceVar("d")))
    wai = body.input("wAi", T(4, 6, device=DeviceVar("d")))
    ai = body.call("MatMul", xi, wai, name="ai")
    ri = body.call("Relu", ai, name="ri")
    body_f = body.finish([ri, ai])
    rs, ais = b.call("Pmap", xs, was, device_var="d", subfunctions=[body_f], name=["rs", "as"])
    summed = b.call("AllReduce", ais, name="summed")
    y = b.call("Gather", rs, dim=0, to_device=0, name="y")
    return b.finish([y, summed])


def nested_pmap() -> ir.Function:
    """Seed 002's program: data parallel outside, horizontal inside on sub-devices d, d.1."""
    d, d1 = DeviceVar("d"), DeviceVar("d", (1,))
    inner = FunctionBuilder("inner")
    xij = inner.input("xij", T(4, 4, device=DeviceVar("dd")))
    waij = inner.input("wAij", T(4, 3, device=DeviceVar("dd")))
    inner_f = inner.finish([inner.call("MatMul", xij, waij, name="aij")])

    outer = FunctionBuilder("outer")
    xi = outer.input("xi", T(4, 4, device=d))
    wai = outer.input("wAi", T(4, 6, device=d))
    xis = outer.call("Broadcast", xi, devices=[d, d1], name="xis")
    wais = outer.call("Scatter", wai, dim=1, devices=[d, d1], name="wAis")
    ais = outer.call("Pmap", xis, wais, device_var="dd", subfunctions=[inner_f], name="ais")
    ai = outer.call("Gather", ais, dim=1, to_device=d, name="ai")
    outer_f = outer.finish([ai])

    b = FunctionBuilder("nested_pmap_tuple")
    wa, x = b.input("wA", T(4, 6)), b.input("x", T(8, 4))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2], name="xs")
    was = b.call("Broadcast", wa, devices=[1, 2], name="wAs")
    as_ = b.call(
        "Pmap",
        xs,
        was,
        device_var="d",
        device_map={1: [1, 3], 2: [2, 4]},
        subfunctions=[outer_f],
        name="as",
    )
    return b.finish([b.call("Gather", as_, dim=0, to_device=0, name="a")])


def every_dtype() -> ir.Function:
    b = FunctionBuilder("dtypes")
    outs = []
    for i, dtype in enumerate(DType):
        x = b.input(f"x_{dtype.value}", T(2, 3, dtype=dtype, device=i))
        s = b.input(f"s_{dtype.value}", TensorType.scalar(dtype, device=i))
        outs += [b.call("Identity", x, name=f"y_{dtype.value}"), b.call("Identity", s)]
    return b.finish(outs)


def every_attribute_kind() -> ir.Function:
    b = FunctionBuilder("attributes")
    x = b.input("x", T(8, 4))
    w = b.input("w", T(4, 4))
    labels = b.input("labels", T(8, 4))
    outs = [
        b.call("Cast", x, dtype="float16"),  # string
        b.call("Softmax", x, axis=0),  # int (not the default)
        b.call("Slice", x, axis=1, start=1, end=None),  # None (elided: it is the default)
        b.call("ReduceSum", x, axes=[0, 1], keepdims=True),  # list and bool
        b.call("Reshape", x, shape=(2, 16)),  # tuple
        b.call("SGDOptimizer", w, w, lr=0.25),  # float
        b.call("Loss", x, labels, kind="mse", denominator=8),  # string, int
        b.call("Send", x, to_device=None),  # None that is not a default
        b.call("Scatter", x, dim=1, devices=[3, 1, 2, 0]),  # unordered list
        *b.call("Adam", w, w, w, w, lr=2e-3, epsilon=1e-07, beta1=0.5),  # e-notation
    ]
    return b.finish(outs)


def device_var_attributes() -> ir.Function:
    """DeviceVar attributes (to_device=d.1) and scalars inside a pmap body."""
    d = DeviceVar("d")
    body = FunctionBuilder("body")
    xi = body.input("xi", T(2, 2, device=d))
    moved = body.call("Send", xi, to_device=DeviceVar("d", (1,)), name="moved")
    total = body.call("ReduceSum", xi, name="total")
    back = body.call("Send", moved, to_device=d, name="back")
    body_f = body.finish([back, total])
    b = FunctionBuilder("device_vars")
    x = b.input("x", T(4, 2))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2], name="xs")
    ys, totals = b.call(
        "Pmap",
        xs,
        device_var="d",
        device_map={1: [1, 3], 2: [2, 4]},
        subfunctions=[body_f],
        name=["ys", "totals"],
    )
    first = b.call("TupleGet", totals, index=0, name="first")
    pair = b.call("MakeTuple", first, b.call("TupleGet", totals, index=-1), name="pair")
    return b.finish([ys, pair])


PROGRAMS = {
    "data_parallel": data_parallel_mlp,
    "data_parallel_8": lambda: data_parallel_mlp(8),
    "nested_pmap": nested_pmap,
    "every_dtype": every_dtype,
    "every_attribute_kind": every_attribute_kind,
    "device_var_attributes": device_var_attributes,
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_builder_programs_round_trip(name: str):
    round_trip(PROGRAMS[name]())


def test_round_trip_preserves_what_the_program_computes():
    f = nested_pmap()
    back = round_trip(f)
    inputs = ir.random_inputs(f, seed=1)
    for got, want in zip(ir.execute(back, inputs), ir.execute(f, inputs)):
        np.testing.assert_array_equal(got, want)


def test_printer_writes_long_uniform_tuples_with_an_ellipsis():
    text = str(data_parallel_mlp(8))
    assert "xs: Tuple[Tensor[(1, 4), 1], ..., Tensor[(1, 4), 8]] = Scatter(" in text
    assert "devices=[1, 2, 3, 4, 5, 6, 7, 8]" in text


def test_printer_leaves_out_default_attributes_and_keeps_the_rest():
    text = str(every_attribute_kind())
    assert "= Slice(x, axis=1, start=1)" in text
    assert '= Loss(x, labels, kind="mse", denominator=8)' in text
    assert "= Send(x, to_device=None)" in text
    assert "= AllReduce(" not in text and "= Softmax(x, axis=0)" in text


def test_pmap_bodies_have_their_own_names():
    # Both bodies call their parameter xi; neither is renamed, as each body is its own scope.
    d = DeviceVar("d")
    bodies = []
    for _ in range(2):
        body = FunctionBuilder("body")
        xi = body.input("xi", T(2, device=d))
        bodies.append(body.finish([body.call("Relu", xi, name="yi")]))
    b = FunctionBuilder("two")
    xs = b.call("Broadcast", b.input("x", T(2)), devices=[1, 2], name="xs")
    ys = b.call("Pmap", xs, device_var="d", subfunctions=[bodies[0]], name="ys")
    zs = b.call("Pmap", ys, device_var="d", subfunctions=[bodies[1]], name="zs")
    f = b.finish([zs])
    text = str(round_trip(f))
    assert text.count("fn=lambda (xi: Tensor[(2,), d]): {") == 2


def test_reserved_and_odd_names_are_printed_as_identifiers():
    b = FunctionBuilder("names")
    x = b.input("return", T(2))
    y = b.call("Relu", x, name="_")
    z = b.call("Relu", y, name="a b")
    w = b.call("Relu", z, name="lambda")
    text = str(round_trip(b.finish([w])))
    assert "def names(return_: Tensor[(2,), 0]):" in text
    assert "v_: Tensor[(2,), 0] = Relu(return_)" in text
    assert "a_b: Tensor[(2,), 0] = Relu(v_)" in text
    assert "lambda_: Tensor[(2,), 0] = Relu(a_b)" in text


def test_a_function_without_outputs_round_trips():
    b = FunctionBuilder("nothing")
    b.input("x", T(2))
    f = b.finish([])
    assert str(f).endswith("    return")
    round_trip(f)


# -- golden files --------------------------------------------------------------------------

GOLDEN_FILES = sorted(GOLDEN.glob("*.txt"))


def test_there_are_golden_files():
    assert len(GOLDEN_FILES) >= 4


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_file_prints_back_byte_identical(path: Path):
    text = path.read_text()
    assert str(ir.parse(text)) + "\n" == text


@pytest.mark.parametrize("name", ["data_parallel", "nested_pmap", "every_attribute_kind"])
def test_golden_files_are_the_builder_programs(name: str):
    f = PROGRAMS[name]()
    assert ir.parse((GOLDEN / f"{name}.txt").read_text()).is_equivalent(f)


# -- properties of the small terms -------------------------------------------------------------

scalars = (
    st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.booleans()
    | st.none()
    | st.sampled_from(list(DType))
    | st.sampled_from([DeviceVar("d"), DeviceVar("d", (1,)), DeviceVar("d", (0, 2))])
)
attribute_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.integers(-5, 5) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def parse_literal(text: str):
    cursor = Cursor(text)
    value = Terms(cursor, {}).literal(("d",))
    assert cursor.tok.kind == "EOF", f"{text!r} was not read to its end"
    return value


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=120, deadline=None)
@given(attribute_values)
def test_every_attribute_value_reads_back_as_printed(value):
    assert same(parse_literal(format_attribute(value)), value)


def test_infinities_read_back():
    assert parse_literal(format_attribute(float("inf"))) == float("inf")
    assert parse_literal(format_attribute(float("-inf"))) == float("-inf")


devices = st.integers(0, 8) | st.none() | st.just(DeviceVar("d")) | st.just(DeviceVar("d", (1,)))
tensor_types = st.builds(
    TensorType,
    st.lists(st.integers(0, 9), max_size=3).map(tuple),
    st.sampled_from(list(DType)),
    devices,
)
uniform_tuples = st.builds(
    lambda t, first, n: TupleType(tuple(t.with_device(first + i) for i in range(n))),
    tensor_types,
    st.integers(0, 4),
    st.integers(1, 9),
)
types = st.recursive(
    tensor_types | uniform_tuples,
    lambda inner: st.lists(inner, max_size=4).map(lambda es: TupleType(tuple(es))),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(types)
def test_every_type_reads_back_as_printed(t):
    text = format_type(t)
    cursor = Cursor(text)
    assert Terms(cursor, {}).type(("d",)) == t
    assert cursor.tok.kind == "EOF"


# -- the syntax the seeds use, read as meant ------------------------------------------------


def parse(text: str, **sizes: int) -> ir.Function:
    return ir.parse(text, sizes)


def test_symbolic_dimensions_evaluate_with_integer_arithmetic():
    f = parse(
        "def f(x: Tensor[(B/N, F*2, (B+F)/4, (B/N)*2, B-F), 0], y: Tensor[(B/N)*2, 0]):\n"
        "    return x, y",
        B=8,
        F=4,
        N=2,
    )
    assert [v.type.shape for v in f.inputs] == [(4, 8, 3, 8, 4), (8,)]


def test_device_ranges_expand_inclusively_among_other_devices():
    f = parse(
        "def f(x: Tensor[(8, 2), 0]):\n"
        "    xs: Tuple[Tensor[(2, 2), 0], ..., Tensor[(2, 2), 3]] = scatter(x, devices=[0, 1..N])\n"
        "    return xs",
        N=3,
    )
    assert tuple(f.ops[0].attributes["devices"]) == (0, 1, 2, 3)


def test_positional_literals_bind_to_the_next_attribute():
    a = parse(
        "def f(x: Tensor[(4, 3), 0], z: Tensor[(4, 3), 0]):\n"
        "    y: Tensor[(4, 3), 1] = send(x, 1)\n"
        "    d: Tensor[(4, 3), 0] = LossGrad(x, z, 2, 'mse')\n"
        "    return y, d",
    )
    b = parse(
        "def f(x: Tensor[(4, 3), 0], z: Tensor[(4, 3), 0]):\n"
        "    y: Tensor[(4, 3), 1] = Send(x, to_device=1)\n"
        '    d: Tensor[(4, 3), 0] = LossGrad(x, z, scale=2, kind="mse")\n'
        "    return y, d",
    )
    assert a.is_equivalent(b)
    assert dict(b.ops[1].attributes)["kind"] == "mse"


def test_result_forms_discards_comments_and_aliases():
    f = parse(
        "# the seed's backward step\n"
        "def f(x: Tensor[(8, 4), 0], w: Tensor[(4, 6), 0], dy: Tensor[(8, 6), 0]):\n"
        "    (dw, _): Tuple[Tensor[(4, 6), 0], _] = MatMulGrad(x, w, dy)  # da unused\n"
        "    (\n"
        "        dw2: Tensor[(4, 6), 0],\n"
        "        dx2: Tensor[(8, 4), 0],\n"
        "    ) = matmulgrad(x, w, dy)\n"
        "    w1 = opt(w, dw)  # untyped: the type is inferred\n"
        "    return w1, dx2\n",
    )
    assert [op.op_type for op in f.ops] == ["MatMulGrad", "MatMulGrad", "SGDOptimizer"]
    assert f.outputs[0].type == T(4, 6)


def test_tuple_elements_are_tuple_gets_made_once():
    f = parse(
        "def f(xs: Tuple[Tensor[(2,), 1], Tensor[(2,), 2]]):\n"
        "    a: Tensor[(2,), 1] = Relu(xs[0])\n"
        "    b: Tensor[(2,), 1] = Add(xs[0], a)\n"
        "    c: Tensor[(2,), 2] = Relu(xs[-1])\n"
        "    return b, c",
    )
    assert [op.op_type for op in f.ops] == ["TupleGet", "Relu", "Add", "TupleGet", "Relu"]
    assert f.ops[3].attributes["index"] == -1


PMAP_FN = """\
def f(xs: Tuple[Tensor[(2,), 1], Tensor[(2,), 2]]):
    ys: Tuple[Tensor[(2,), 1], Tensor[(2,), 2]] = pmap(
        device_var=d, device_map={1: [1, 3], 2: [2, 4]},
        SPELLING (xi: Tensor[(2,), d]): {
            yi: Tensor[(2,), d] = Relu(xi)
            return yi
        },
        (xs)
    )
    return ys
"""


@pytest.mark.parametrize("spelling", ["body=lambda", "lambda d: lambda", "fn=lambda d: lambda"])
def test_pmap_spellings_agree(spelling: str):
    want = parse(PMAP_FN.replace("SPELLING", "fn=lambda"))
    got = parse(PMAP_FN.replace("SPELLING", spelling))
    assert got.is_equivalent(want)
    assert dict(got.ops[0].attributes["device_map"]) == {1: (1, 3), 2: (2, 4)}


def test_seed_002_pmap_with_the_device_map_after_the_body():
    f = parse(
        "def f(xs: Tuple[Tensor[(2,), 1], Tensor[(2,), 2]]):\n"
        "    ys: Tuple[Tensor[(4,), 1], Tensor[(4,), 2]] = pmap(\n"
        "        lambda d:\n"
        "        lambda (xi: Tensor[(2,), d]): {\n"
        "            zs: Tuple[Tensor[(2,), d], Tensor[(2,), d.1]] =\n"
        "                broadcast(xi, devices=[d, d.1])\n"
        "            yi: Tensor[(4,), d] = gather(zs, to_device=d)\n"
        "            return yi\n"
        "        },\n"
        "        device_map={1: [1, 3], 2: [2, 4]},  # this tells simulator what d.1 is\n"
        "        (xs)\n"
        "    )\n"
        "    return ys\n"
    )
    (body,) = f.ops[0].subfunctions
    assert tuple(body.ops[0].attributes["devices"]) == (DeviceVar("d"), DeviceVar("d", (1,)))
    (ys,) = ir.execute(f, {"xs": (np.ones(2, np.float32), np.zeros(2, np.float32))})
    np.testing.assert_array_equal(ys[0], np.ones(4, np.float32))
    np.testing.assert_array_equal(ys[1], np.zeros(4, np.float32))


def test_the_docs_example_prints_back_identically():
    doc = (Path(__file__).parents[2] / "docs" / "text-format.md").read_text()
    example = doc.split("## Example")[1].split("```\n")[1]
    assert str(ir.parse(example)) + "\n" == example


def test_a_steady_state_steps_layouts_print_and_parse_back() -> None:
    from ir import models, transforms

    t = transforms.training(models.mlp(8, 4, 4, 2, layers=2), "adam")
    for g in (
        transforms.megatron(t, 2, 2, 1, 2, zero=1),
        transforms.megatron(t, 1, 1, 2, 2),
        transforms.data_parallel(t, 2),
    ):
        text = ir.format(g)
        assert " layout [" in text
        back = ir.parse(text)
        assert back.input_layouts == g.input_layouts
        assert back.output_layouts == g.output_layouts
        assert ir.format(back) == text


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ('["Q"]', "is not 'R', 'P', 'S(k)' or 'Z(k)'"),
        ("[1, 2]", "a layout is a list of levels"),
        ('["R", "R"]', "more levels than its type"),
        ('["R@3"]', "multiply to 3"),
        (f'["R@{"9" * 5000}"]', "is not 'R', 'P', 'S(k)' or 'Z(k)'"),  # was int()'s ValueError
        ('["R@٢"]', "is not 'R', 'P', 'S(k)' or 'Z(k)'"),  # an Arabic-Indic two: ASCII digits only
    ],
)
def test_a_bad_layout_is_a_located_parse_error(layout, message) -> None:
    text = f"def f(x: Tuple[Tensor[(2, 2), 0], Tensor[(2, 2), 1]] layout {layout}):\n    return x\n"
    with pytest.raises(ir.ParseError, match=re.escape(message)) as e:
        ir.parse(text)
    assert e.value.line == 1
