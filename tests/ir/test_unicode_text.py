"""Non-ASCII program text: names follow Python's identifier rules, anything else is a
located ParseError (issue 17, class 1).

Before, any character for which ``str.isalpha`` or ``str.isdigit`` held but the ASCII
patterns did not (``π`` alone, ``yé``, ``²``) crashed the lexer with an AttributeError.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ir

GOLDEN_TEXTS = [p.read_text() for p in sorted((Path(__file__).parent / "golden").glob("*.txt"))]
SIZES = {"B": 8, "F": 4, "N": 2}
_RESERVED = {"def", "return", "lambda", "_"}

# Any code point but surrogates (which a str from a file cannot hold alone).
ANY_CHAR = st.characters(exclude_categories=("Cs",))
NON_ASCII = st.characters(min_codepoint=0x80, exclude_categories=("Cs",))
NAME_START = st.characters(exclude_categories=("Cs",)).filter(str.isidentifier)
NAME_PART = st.characters(exclude_categories=("Cs",)).filter(lambda c: ("_" + c).isidentifier())
NAMES = st.builds(lambda a, b: a + "".join(b), NAME_START, st.lists(NAME_PART, max_size=6)).filter(
    lambda s: unicodedata.normalize("NFKC", s) not in _RESERVED
)


def assert_located(e: ir.ParseError, text: str) -> None:
    """The error's line and column exist in ``text`` and its caret is drawn under them."""
    lines = text.split("\n")
    assert 1 <= e.line <= len(lines)
    assert e.source_line == lines[e.line - 1]
    assert 1 <= e.column <= len(e.source_line) + 1
    assert str(e).split("\n")[-1] == "    " + " " * (e.column - 1) + "^"


@pytest.mark.parametrize("text", ["π", "yé = 1", "def f(x: Tensor[(²,), 0]):", "x\u00a0y", "٣"])
def test_the_reported_non_ascii_texts_are_parse_errors(text: str):
    with pytest.raises(ir.ParseError) as info:
        ir.parse(text)
    assert_located(info.value, text)


@settings(max_examples=300, deadline=None)
@given(st.text(ANY_CHAR, max_size=40))
def test_any_text_is_a_function_or_a_located_parse_error(text: str):
    try:
        ir.parse(text, SIZES)
    except ir.ParseError as e:
        assert_located(e, text)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(GOLDEN_TEXTS),
    st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.text(ANY_CHAR, min_size=1)), max_size=3
    ),
)
def test_unicode_inserted_into_valid_programs_gives_located_parse_errors(text: str, edits):
    for where, debris in edits:
        i = int(where * len(text))
        text = text[:i] + debris + text[i:]
    try:
        ir.parse(text, SIZES)
    except ir.ParseError as e:
        assert_located(e, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(NAMES, NAMES)
def test_python_identifiers_name_values_and_print_back(a: str, b: str):
    text = f"def f({a}: Tensor[(2,), 0]):\n    {b}x: Tensor[(2,), 0] = Relu({a})\n    return {b}x"
    f = ir.parse(text)
    assert f.inputs[0].name == unicodedata.normalize("NFKC", a)  # Python's own rule
    printed = str(f)
    again = ir.parse(printed)
    assert again.is_equivalent(f)
    assert str(again) == printed


@settings(max_examples=150, deadline=None)
@given(NAMES, NON_ASCII.filter(lambda c: not ("_" + c).isidentifier()))
def test_a_non_identifier_character_in_a_name_is_located_at_it(name: str, bad: str):
    line = f"def f(x{bad}{name}: Tensor[(2,), 0]):"
    text = line + "\n    return x"
    with pytest.raises(ir.ParseError) as info:
        ir.parse(text)
    assert_located(info.value, text)
    assert (info.value.line, info.value.column) == (1, line.index(bad) + 1)


@settings(max_examples=100, deadline=None)
@given(st.text(ANY_CHAR, min_size=1, max_size=12))
def test_any_value_name_from_a_builder_prints_as_text_that_parses_back(name: str):
    b = ir.FunctionBuilder("f")
    x = b.input(name, ir.TensorType((2,), device=0))
    f = b.finish([b.call("Relu", x, name=name)])
    printed = str(f)
    again = ir.parse(printed)
    assert again.is_equivalent(f)
    assert str(again) == printed
