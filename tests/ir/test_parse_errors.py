"""Malformed text gets a specific ParseError: what was expected, what was found, and where.

Each case marks the fault with the text it expects the caret under (``at``) on
its line; the test checks the line, the column, the phrase and the caret drawn
in the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir

SIZES = {"B": 8, "F": 4, "N": 2}

GOOD = """\
def f(x: Tensor[(B, F), 0], w: Tensor[(F, 3), 0]):
    y: Tensor[(B, 3), 0] = MatMul(x, w)
    return y
"""


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    line: int
    at: str  # the caret sits under the first occurrence of this text on the line
    phrase: str
    nth: int = 1  # or under its nth occurrence
    at_end: bool = False  # the caret sits just after the line's last character


def edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


PMAP = """\
def f(x: Tensor[(B, F), 0]):
    xs: Tuple[Tensor[(B/N, F), 1], ..., Tensor[(B/N, F), N]] = scatter(x, dim=0, devices=[1..N])
    (
        ys: Tuple[Tensor[(B/N, F), 1], ..., Tensor[(B/N, F), N]],
    ) = pmap(
        device_var=d,
        fn=lambda (xi: Tensor[(B/N, F), d]): {
            yi: Tensor[(B/N, F), d] = Relu(xi)
            BODY
        },
        (xs)
    )
    return ys
"""


def pmap_with(body: str) -> str:
    return PMAP.replace("BODY", body)


CASES = [
    Case("empty text", "", 1, "", "expected 'def' at the start of the program, found the end"),
    Case(
        "unbalanced bracket: not closed",
        edit("Tensor[(F, 3), 0]", "Tensor[(F, 3), 0"),
        1,
        ")",
        "expected ']' after the tensor's device to close the '[' at line 1, column 38, found ')'",
        nth=3,
    ),
    Case(
        "unbalanced bracket: one too many",
        edit("MatMul(x, w)", "MatMul(x, w))"),
        2,
        ")",
        "expected a statement (name: Type = Op(...)) or 'return', found ')' (an unmatched",
        nth=3,
    ),
    Case(
        "unbalanced bracket: wrong closer",
        edit("MatMul(x, w)", "MatMul(x, w]"),
        2,
        "]",
        "expected ')' after the arguments of MatMul to close the '(' at line 2, column 34",
        nth=2,
    ),
    Case(
        "unknown op with a suggestion",
        edit("MatMul(x, w)", "MatMull(x, w)"),
        2,
        "MatMull",
        "unknown op 'MatMull'; did you mean MatMul",
    ),
    Case(
        "wrong arity",
        edit("MatMul(x, w)", "MatMul(x)"),
        2,
        "MatMul",
        "MatMul takes 2 operand(s) (a, b), got 1",
    ),
    Case(
        "undefined value with a suggestion",
        edit("MatMul(x, w)", "MatMul(x, ww)"),
        2,
        "ww",
        "undefined value 'ww'; did you mean 'w'?",
    ),
    Case(
        "duplicate definition",
        edit("    return y", "    y: Tensor[(B, 3), 0] = MatMul(x, w)\n    return y"),
        3,
        "y",
        "duplicate definition of 'y' (first defined at line 2, column 5)",
    ),
    Case(
        "duplicate parameter",
        edit("w: Tensor[(F, 3), 0]", "x: Tensor[(F, 3), 0]"),
        1,
        "x",
        "duplicate definition of 'x'",
        nth=2,
    ),
    Case(
        "mismatched declared type",
        edit("y: Tensor[(B, 3), 0]", "y: Tensor[(B, 4), 0]"),
        2,
        "Tensor",
        "'y' is declared Tensor[(8, 4), 0] but MatMul gives Tensor[(8, 3), 0]",
    ),
    Case(
        "declared on the wrong device",
        edit("y: Tensor[(B, 3), 0]", "y: Tensor[(B, 3), 1]"),
        2,
        "Tensor",
        "but MatMul gives Tensor[(8, 3), 0]",
    ),
    Case(
        "shape rule error keeps its sentence",
        edit("MatMul(x, w)", "MatMul(w, w)"),
        2,
        "MatMul",
        "MatMul: contraction dimensions differ",
    ),
    Case(
        "unbound size",
        edit("(F, 3), 0]):", "(F, G), 0]):"),
        1,
        "G",
        "unbound size 'G': pass sizes={'G': ...} to ir.parse",
    ),
    Case(
        "dimension that does not divide",
        edit("(B, F), 0], w", "(B/3, F), 0], w"),
        1,
        "/",
        "the dimension does not divide: 8 / 3 leaves a remainder of 2",
    ),
    Case(
        "negative dimension",
        edit("(B, F), 0], w", "(B-9, F), 0], w"),
        1,
        "B-9",
        "the dimension evaluates to -1, which is negative",
    ),
    Case(
        "tensor without a device",
        edit("w: Tensor[(F, 3), 0]", "w: Tensor[(F, 3)]"),
        1,
        "]):",
        "expected ',' and a device after the tensor's shape",
    ),
    Case(
        "Tensor(...) for Tensor[...]",
        edit("w: Tensor[(F, 3), 0]", "w: Tensor((F, 3), 0)"),
        1,
        "((F",
        "expected '[' after 'Tensor'",
    ),
    Case(
        "not a type",
        edit("w: Tensor[(F, 3), 0]", "w: Matrix[(F, 3), 0]"),
        1,
        "Matrix",
        "expected a type (Tensor[...], Float[...], Int[...], Bool[...] or Tuple[...]), found",
    ),
    Case(
        "unknown device name",
        edit("w: Tensor[(F, 3), 0]", "w: Tensor[(F, 3), d]"),
        1,
        "d]",
        "unknown device 'd': not a device variable in scope nor a size",
    ),
    Case(
        "unknown attribute",
        edit("MatMul(x, w)", "Relu(x, slope=2)"),
        2,
        "Relu",
        "Relu has no attribute 'slope'",
    ),
    Case(
        "positional value without an attribute to take it",
        edit("MatMul(x, w)", "MatMul(x, w, 3)"),
        2,
        "3",
        "MatMul has no attribute left for the positional value '3'",
        nth=2,
    ),
    Case(
        "operand after a keyword",
        edit("MatMul(x, w)", "send(x, to_device=1, w)"),
        2,
        "w)",
        "positional argument after keyword arguments in send(...)",
    ),
    Case(
        "attribute given twice through an alias",
        edit("MatMul(x, w)", "send(x, to_device=1, device=2)"),
        2,
        "device=2",
        "Send is given the attribute 'to_device' twice",
    ),
    Case(
        "too few result names",
        edit("y: Tensor[(B, 3), 0] = MatMul(x, w)", "y: Tensor[(B, 3), 0] = MatMulGrad(x, w, x)"),
        2,
        "y",
        "MatMulGrad defines 2 result(s) (db, da) but the statement names 1",
    ),
    Case(
        "group type of the wrong length",
        edit("y: Tensor[(B, 3), 0] =", "(y, z): Tuple[Tensor[(B, 3), 0]] ="),
        2,
        "Tuple",
        "2 results need a Tuple type of 2 elements",
    ),
    Case(
        "infix operator",
        edit("MatMul(x, w)", "x + x"),
        2,
        "+",
        "infix operators are not part of the format; write Add(a, b)",
    ),
    Case(
        "bare call",
        edit("    return y", "    free(y)\n    return y"),
        3,
        "free",
        "found the bare call free(...); and 'free' is not a known op",
    ),
    Case(
        "statement after return",
        GOOD + "    z: Tensor[(B, 3), 0] = Relu(y)\n",
        4,
        "z",
        "expected the end of the text after 'return', found 'z'",
    ),
    Case(
        "no return",
        GOOD.replace("    return y\n", ""),
        2,
        "",
        "function 'f' ends without a 'return' statement",
        at_end=True,
    ),
    Case(
        "return of an undefined value",
        edit("return y", "return q"),
        3,
        "q",
        "undefined value 'q'",
    ),
    Case(
        "unexpected character",
        edit("MatMul(x, w)", "MatMul(x, $w)"),
        2,
        "$",
        "unexpected character '$'",
    ),
    Case(
        "unterminated string",
        edit("MatMul(x, w)", 'Loss(y, x, kind="mse)'),
        2,
        '"',
        'unterminated string: expected a closing "',
    ),
    Case(
        "tuple index on a tensor",
        edit("MatMul(x, w)", "MatMul(x[0], w)"),
        2,
        "x[0]",
        "TupleGet: operand 0 must be a non-empty per-device tuple, got Tensor[(8, 4), 0]",
    ),
    Case(
        "tuple ellipsis between unknown devices",
        edit("w: Tensor[(F, 3), 0]", "w: Tuple[Tensor[(F, 3), ?], ..., Tensor[(F, 3), ?]]"),
        1,
        "...",
        "cannot expand '...' between devices ? and ?",
    ),
    Case(
        "tuple ellipsis around different shapes",
        edit("w: Tensor[(F, 3), 0]", "w: Tuple[Tensor[(F, 3), 1], ..., Tensor[(F, 4), 4]]"),
        1,
        "...",
        "the tensors around '...' must differ only in their device",
    ),
    Case(
        "device range with unknown ends",
        edit("MatMul(x, w)", "scatter(x, dim=0, devices=[?..?])"),
        2,
        "..",
        "cannot expand the device range ?..?",
    ),
    # -- pmap --
    Case(
        "pmap body without return",
        pmap_with(""),
        10,
        "}",
        "the pmap body ends without 'return'",
    ),
    Case(
        "pmap body reads an outer value",
        pmap_with("return x"),
        9,
        "x",
        "undefined value 'x' in this pmap body: a body reads only its own parameters",
    ),
    Case(
        "type error inside a pmap body",
        pmap_with("zi: Tensor[(3, 3), d] = Reshape(xi, shape=[3, 3])\n            return zi"),
        9,
        "Reshape",
        "Reshape: cannot reshape (4, 4) (16 elements) to [3, 3] (9 elements)",
    ),
    Case(
        "sub-device arithmetic",
        pmap_with("zi: Tensor[(B/N, F), d+1] = Send(xi, to_device=1)\n            return zi"),
        9,
        "+",
        "device arithmetic on the device variable 'd' is not supported",
    ),
    Case(
        "sub-device without a device map",
        pmap_with("zi: Tensor[(B/N, F), d.1] = Send(xi, to_device=d.1)\n            return zi"),
        9,
        "d.1",
        "the sub-device d.1 needs a device map: give this pmap device_map=",
    ),
    Case(
        "pmap result count",
        pmap_with("return yi, yi"),
        3,
        "(",
        "the pmap body returns 2 value(s) (yi, yi) but the statement names 1 result(s)",
    ),
    Case(
        "pmap with an unknown argument",
        PMAP.replace("device_var=d,", "device_var=d, devices=[1, 2],").replace("BODY", "return yi"),
        6,
        "devices",
        "pmap has no argument 'devices'",
    ),
    Case(
        "pmap without a device variable",
        PMAP.replace("device_var=d,", "").replace("BODY", "return yi"),
        7,
        "lambda",
        "the pmap body's device variable is not bound yet",
    ),
    Case(
        "missing comma between lambda parameters",
        PMAP.replace(
            "(xi: Tensor[(B/N, F), d]):", "(xi: Tensor[(B/N, F), d]) (zi: Float[d]):"
        ).replace("BODY", "return yi"),
        7,
        "(zi",
        "a missing ',' between parameters?",
    ),
    Case(
        "pmap operand that does not match the body",
        PMAP.replace("(xi: Tensor[(B/N, F), d])", "(xi: Tensor[(B, F), d])")
        .replace("yi: Tensor[(B/N, F), d]", "yi: Tensor[(B, F), d]")
        .replace("BODY", "return yi"),
        5,
        "pmap",
        "element 0 of pmap operand 0 is Tensor[(4, 4), 1], but the body's input 'xi'",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_malformed_text_names_line_and_column(case: Case):
    with pytest.raises(ir.ParseError) as info:
        ir.parse(case.text, SIZES)
    e = info.value
    assert case.phrase in e.message, str(e)
    lines = case.text.split("\n")
    source = lines[case.line - 1] if case.line <= len(lines) else ""
    column = len(source) + 1 if case.at_end else 1
    if case.at:
        column = -1
        for _ in range(case.nth):
            column = source.index(case.at, column + 1)
        column += 1
    assert (e.line, e.column) == (case.line, column), str(e)
    assert e.source_line == source
    # The message shows the line and a caret under the fault.
    shown_source, caret = str(e).split("\n")[-2:]
    assert shown_source == "    " + source
    assert caret == "    " + " " * (column - 1) + "^"


def test_parse_error_is_a_distir_error():
    with pytest.raises(ir.DistIRError):
        ir.parse("def f(:")


def test_the_good_program_parses():
    assert str(ir.parse(GOOD, SIZES)).startswith("def f(x: Tensor[(8, 4), 0]")
    assert str(ir.parse(pmap_with("return yi"), SIZES)).count("pmap(") == 1


# -- whatever the damage, the answer is a Function or a ParseError ---------------------------

GOLDEN_TEXTS = [p.read_text() for p in sorted((Path(__file__).parent / "golden").glob("*.txt"))]
DEBRIS = [*"()[]{},:=.?+-*/_#\"'0123 \nadN", "...", "..", "lambda", "return", "d.1", "@"]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(GOLDEN_TEXTS),
    st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 4), st.sampled_from(DEBRIS)),
        min_size=1,
        max_size=3,
    ),
)
def test_damaged_text_raises_only_parse_errors(text: str, edits):
    for where, cut, debris in edits:
        i = int(where * len(text))
        text = text[:i] + debris + text[i + cut :]
    try:
        ir.parse(text, SIZES)
    except ir.ParseError as e:
        assert e.line >= 1 and e.column >= 1
        assert str(e).split("\n")[-1].strip() == "^"
