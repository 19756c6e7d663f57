"""Depth and size limits (issue 17, class 2): beyond each limit in ``ir.limits`` a program is
refused with a located error, at once, rather than exhausting recursion, memory or time.

Before: ~500 nested brackets raised RecursionError, integer literals over 4,300 digits a
ValueError, ``[0..100000000]`` and ``Tuple[..., N]`` expanded without bound, and a tensor of
10**4000 elements parsed and then broke ``simulate``.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir.errors import ArgumentError, InvalidTypeError
from ir.limits import (
    MAX_DEVICES,
    MAX_ELEMENTS,
    MAX_INT,
    MAX_PMAP_NESTING,
    MAX_TEXT_NESTING,
    MAX_TOPOLOGY_DEVICES,
    MAX_TUPLE_NESTING,
)
from ir.types import DeviceVar, TensorType, TupleType

FAST_S = 2.0  # every refusal below comes at once; this bound only catches a hang


def refused_at(text: str, sizes=None) -> ir.ParseError:
    """The ParseError ``text`` raises, checked to be located and quick."""
    start = time.perf_counter()
    with pytest.raises(ir.ParseError) as info:
        ir.parse(text, sizes)
    assert time.perf_counter() - start < FAST_S
    e = info.value
    lines = text.split("\n")
    assert e.source_line == lines[e.line - 1]
    assert 1 <= e.column <= len(e.source_line) + 1
    return e


def program(param_type: str, body: str = "") -> str:
    return f"def f(x: Tensor[(8, 4), 0], p: {param_type}):\n{body}    return x"


# Each template nests brackets ``depth`` deep in a different part of the grammar.
NESTINGS = {
    "operand": lambda n: program(
        "Float[0]", "    y = MakeTuple(" + "(" * n + "x" + ",)" * n + ")\n"
    ),
    "dimension": lambda n: program("Tensor[(" + "(" * n + "1" + ")" * n + ",), 0]"),
    "tuple type": lambda n: program("Tuple[" * n + "Float[0]" + "]" * n),
    "list attribute": lambda n: program(
        "Float[0]", "    y = Reshape(x, shape=" + "[" * n + "32" + "]" * n + ")\n"
    ),
    "dict attribute": lambda n: program(
        "Float[0]", "    y = Reshape(x, shape={1: " * n + "2" + "}" * n + ")\n"
    ),
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(NESTINGS)), st.integers(MAX_TEXT_NESTING - 5, 5000))
def test_deep_nesting_of_any_bracket_is_refused_where_it_passes_the_limit(kind: str, depth: int):
    text = NESTINGS[kind](depth)
    try:
        ir.parse(text)
    except ir.ParseError as e:
        lines = text.split("\n")
        assert e.source_line == lines[e.line - 1]
        assert depth < MAX_TEXT_NESTING or "nest more than" in e.message
        if "nest more than" in e.message:
            opened = e.source_line[: e.column]
            assert sum(opened.count(c) for c in "([{") - sum(opened.count(c) for c in ")]}") == (
                MAX_TEXT_NESTING + 1
            )
            assert e.source_line[e.column - 1] in "([{"


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000))
def test_a_long_chain_of_minus_signs_is_read_without_recursion(n: int):
    f = ir.parse(program("Float[0]", f"    y = Slice(x, axis=1, start={'-' * n}1)\n"))
    (op,) = [op for op in f.ops if op.op_type == "Slice"]
    assert op.attributes["start"] == (-1 if n % 2 else 1)


BIG_LITERALS = st.one_of(
    st.integers(MAX_INT + 1, 10**3000).map(str),
    st.integers(4000, 20_000).map(lambda n: "9" * n),  # past Python's own 4,300-digit limit
)


@settings(max_examples=60, deadline=None)
@given(BIG_LITERALS)
def test_an_integer_literal_above_max_int_is_refused_at_the_literal(digits: str):
    line = f"def f(x: Tensor[(0, {digits}), 0]):"
    e = refused_at(line + "\n    return x")
    assert (e.line, e.column) == (1, line.index(digits) + 1)
    assert "MAX_INT" in e.message


def test_max_int_itself_is_a_dimension():
    f = ir.parse(f"def f(x: Tensor[(0, {MAX_INT}), 0]):\n    return x")
    assert f.inputs[0].type.shape == (0, MAX_INT)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, MAX_INT), st.integers(0, MAX_INT), st.sampled_from("+*"))
def test_dimension_arithmetic_is_bounded_by_max_int(a: int, b: int, op: str):
    text = f"def f(x: Tensor[(0, A {op} B), 0]):\n    return x"
    result = a * b if op == "*" else a + b
    if result <= MAX_INT:
        assert ir.parse(text, {"A": a, "B": b}).inputs[0].type.shape == (0, result)
    else:
        assert "MAX_INT" in refused_at(text, {"A": a, "B": b}).message


@settings(max_examples=80, deadline=None)
@given(st.one_of(st.integers(MAX_INT + 1, 10**5000), st.integers(max_value=-1)))
def test_a_size_out_of_range_is_refused_where_it_is_used(size):
    line = "def f(x: Tensor[(0, N), 0]):"
    e = refused_at(line + "\n    return x", {"N": size})
    assert (e.line, e.column) == (1, line.index("N") + 1)
    assert "size 'N'" in e.message


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.none()))
def test_a_size_that_is_not_an_integer_is_refused_naming_it(size):
    with pytest.raises(ArgumentError, match=r"^parse: sizes\['N'\] must be an integer"):
        ir.parse("def f(x: Tensor[(0, N), 0]):\n    return x", {"N": size})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**30), st.integers(0, 10**30))
def test_device_ranges_expand_only_within_max_devices(lo: int, span: int):
    hi = lo + span
    body = "    y = Scatter(x, dim=1, devices=[L..H])\n"
    text = program("Float[0]", body)
    sizes = {"L": lo, "H": hi}
    if hi < MAX_DEVICES and span < 4:
        ir.parse(text, sizes)
    else:
        e = refused_at(text, sizes)
        assert any(w in e.message for w in ("MAX_DEVICES", "MAX_INT", "shards", "not a device"))


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(2, 3000), st.integers(MAX_DEVICES, 10**30)))
def test_a_tuple_ellipsis_expands_only_within_max_devices(n: int):
    text = program("Tuple[Tensor[(2,), 0], ..., Tensor[(2,), N]]")
    if n < MAX_DEVICES:
        assert len(ir.parse(text, {"N": n}).inputs[1].type.elements) == n + 1
    else:
        e = refused_at(text, {"N": n})
        assert "MAX_DEVICES" in e.message or "MAX_INT" in e.message


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, MAX_INT), min_size=1, max_size=6))
def test_a_tensor_has_at_most_max_elements(shape: list[int]):
    text = program(f"Tensor[({', '.join(map(str, shape))},), 0]")
    if math.prod(shape) <= MAX_ELEMENTS:
        assert ir.parse(text).inputs[1].type.shape == tuple(shape)
    else:
        assert "MAX_ELEMENTS" in refused_at(text).message
        with pytest.raises(InvalidTypeError, match="MAX_ELEMENTS"):
            TensorType(tuple(shape))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, MAX_TUPLE_NESTING + 3))
def test_nested_tuples_up_to_the_limit_print_and_parse_back(depth: int):
    b = ir.FunctionBuilder("f")
    v = b.input("x", TensorType((2,), device=0))
    try:
        for _ in range(depth):
            v = b.call("MakeTuple", v)
    except ir.VerifyError as e:
        assert depth > MAX_TUPLE_NESTING and "MAX_TUPLE_NESTING" in str(e)
        return
    assert depth <= MAX_TUPLE_NESTING
    f = b.finish([v])
    assert ir.parse(str(f)).is_equivalent(f)


def test_a_tuple_type_beyond_the_nesting_limit_is_refused():
    t = TensorType((2,), device=0)
    for _ in range(MAX_TUPLE_NESTING):
        t = TupleType((t,))
    with pytest.raises(InvalidTypeError, match="MAX_TUPLE_NESTING"):
        TupleType((t,))


@pytest.mark.parametrize("n", [MAX_DEVICES + 1, 10**6, 10**30])
def test_topologies_beyond_the_device_limit_are_refused_at_once(n: int):
    start = time.perf_counter()
    with pytest.raises(ir.DistIRError, match=rf"from 1 to {MAX_DEVICES}"):
        ir.Topology.uniform(n)
    with pytest.raises(ir.DistIRError, match=rf"from 1 to {MAX_DEVICES}"):
        ir.Topology.preset("a100-hgx", n)
    assert time.perf_counter() - start < FAST_S


def test_a_dense_link_matrix_beyond_its_limit_is_refused_before_it_is_read():
    n = MAX_TOPOLOGY_DEVICES + 1
    devices = tuple(ir.Device(i) for i in range(n))
    row = (1.0,) * n
    with pytest.raises(ir.TopologyError, match="MAX_TOPOLOGY_DEVICES"):
        ir.Topology(devices, (row,) * n, (row,) * n)


def nested_pmaps(depth: int) -> ir.Function:
    """A pmap whose body holds a pmap ... ``depth`` deep, each over one device."""
    body = None
    for level in reversed(range(depth)):
        var = f"d{level}"
        b = ir.FunctionBuilder(f"body{level}")
        x = b.input("x", TensorType((2,), device=DeviceVar(var)))
        y = b.call("Relu", x)
        if body is not None:
            xs = b.call("MakeTuple", x)
            (y,) = [b.call("Pmap", xs, subfunctions=[body], device_var=f"d{level + 1}")]
            y = b.call("TupleGet", y, index=0)
        body = b.finish([y])
    b = ir.FunctionBuilder("f")
    xs = b.input("xs", TupleType((TensorType((2,), device=0),)))
    return b.finish([b.call("Pmap", xs, subfunctions=[body], device_var="d0")])


@pytest.mark.parametrize("depth", [1, MAX_PMAP_NESTING])
def test_pmaps_nested_up_to_the_limit_print_and_parse_back(depth: int):
    f = nested_pmaps(depth)
    assert f.pmap_nesting == depth
    assert ir.parse(str(f)).is_equivalent(f)


def test_pmaps_nested_beyond_the_limit_are_refused():
    with pytest.raises(ir.VerifyError, match="MAX_PMAP_NESTING"):
        nested_pmaps(MAX_PMAP_NESTING + 1)
