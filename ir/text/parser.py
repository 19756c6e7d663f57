"""The parser: the seeds' syntax (and the printer's output) into a verified Function.

Grammar in brief (docs/text-format.md has it in full)::

    function  := 'def' NAME '(' [NAME ':' type [layout], ...] ')' ':' statement*
                 'return' [operand [layout], ...]
    layout    := 'layout' '[' STRING, ... ']'      (a steady-state step's, ir/layout.py)
    statement := results '=' call
    results   := NAME [':' type] | '(' NAME [':' type], ... ')' [':' Tuple[...]]
    call      := OpName '(' [operand | literal, ...] [NAME '=' literal, ...] ')' | pmap(...)
    operand   := NAME | NAME '[' INT ']' | '(' operand, ... ')'
    pmap(...) := pmap(device_var=d, [device_map={...},] fn=lambda (x: T), ...: {
                     statement* return NAME, ... }, (xs, ...))
               | pmap(lambda d: lambda (x: T, ...): {...}, [device_map={...},] (xs, ...))

Ops are built with :class:`ir.FunctionBuilder`, so every op is checked by its
type rule as it is read; declared types must equal the inferred ones. Each
error is an :class:`ir.errors.ParseError` with line, column and a caret.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arguments import mapping_arg, str_arg
from ..builder import FunctionBuilder
from ..errors import ArgumentError, RegistryError, TypeRuleError, UnknownOpError, VerifyError
from ..function import Function
from ..registry import OpDef, get_op, has_op
from ..types import TupleType
from ..value import Value
from .lexer import Cursor, Token, describe
from .pmap import parse_pmap
from .terms import BLANK, DTYPE_NAMES, ResultTuple, Terms

_RESERVED = ("def", "return", "lambda")
_PMAP_NAMES = ("pmap",)
_BUILD_ERRORS = (VerifyError, UnknownOpError, TypeRuleError, RegistryError)
_RULE_ERRORS = (TypeError, ValueError, KeyError, IndexError)


def parse(text: str, sizes: Mapping[str, int] | None = None) -> Function:
    """Parse one ``def`` in the text format into a verified Function.

    ``sizes`` binds the symbolic dimensions (``B``, ``N``, ...) the text uses.
    Raises :class:`ir.errors.ParseError` (line, column, caret) on any problem.

    >>> f = parse('''
    ... def f(x: Tensor[(B, F), 0], w: Tensor[(F, 3), 0]):
    ...     y: Tensor[(B, 3), 0] = MatMul(x, w)
    ...     return y
    ... ''', sizes={"B": 8, "F": 4})
    >>> print(f)
    def f(x: Tensor[(8, 4), 0], w: Tensor[(4, 3), 0]):
        y: Tensor[(8, 3), 0] = MatMul(x, w)
        return y
    """
    str_arg("parse", "text", text)
    if sizes is not None:
        mapping_arg("parse", "sizes", sizes, "a dict from size name to integer")
        for key, value in sizes.items():
            str_arg("parse", "sizes' keys", key)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ArgumentError(
                    f"parse: sizes[{key!r}] must be an integer, got {value!r} "
                    f"({type(value).__name__})"
                )
    return _Parser(text, sizes or {}).function()


@dataclass
class _Scope:
    """The values visible in one function or pmap (or task) body, and the device variables
    bound."""

    builder: FunctionBuilder
    device_vars: tuple[str, ...]
    parent: _Scope | None = None
    kind: str = "pmap"  # what a body belongs to (error messages): "pmap" or "task"
    values: dict[str, tuple[Value, Token]] = field(default_factory=dict)
    tuple_gets: dict[tuple[Value, int], Value] = field(default_factory=dict)

    def outer_definition(self, name: str) -> Token | None:
        scope = self.parent
        while scope is not None:
            if name in scope.values:
                return scope.values[name][1]
            scope = scope.parent
        return None


@dataclass
class _Result:
    """One name on the left of '=' with its declared type (None: not written)."""

    token: Token
    declared: Any = None
    type_token: Token | None = None


class _Parser:
    def __init__(self, text: str, sizes: Mapping[str, int]) -> None:
        self.cur = Cursor(text)
        self.terms = Terms(self.cur, sizes)
        self.bodies = 0
        # a steady-state step's layouts (ir/layout.py): input name -> (levels, token), and
        # one per returned value (None where it has none)
        self.in_layouts: dict[str, tuple[tuple[str, ...], Token]] = {}
        self.out_layouts: list[tuple[tuple[str, ...], Token] | None] = []

    # -- functions ----------------------------------------------------------------

    def function(self) -> Function:
        cur = self.cur
        cur.expect_keyword("def", "at the start of the program")
        name = cur.expect_name("after 'def' (the function's name)")
        scope = _Scope(FunctionBuilder(name.text), ())
        opener = cur.expect("(", f"after 'def {name.text}'")
        while not cur.tok.is_punct(")"):
            self.parameter(scope, "function parameter")
            if not cur.accept(","):
                break
        cur.close(opener, "after the function's parameters")
        cur.expect(":", f"after the parameters of {name.text!r}")
        outputs = self.statements(scope, closer=None)
        if outputs is None:
            raise cur.error(f"function {name.text!r} ends without a 'return' statement")
        if cur.tok.kind != "EOF":
            raise cur.error(
                f"expected the end of the text after 'return', found {describe(cur.tok)} "
                "(one def per program; return comes last)"
            )
        return self._with_layouts(self.finish(scope, outputs, name), name)

    def _layout(self) -> tuple[tuple[str, ...], Token] | None:
        """An optional ``layout ["R@2", "S(1)@2"]`` after a parameter or a returned value."""
        cur = self.cur
        if not cur.tok.is_name("layout"):
            return None
        at = cur.advance()
        start = cur.tok
        levels = self.terms.literal(())
        if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
            raise cur.error(
                'a layout is a list of levels such as ["R@2", "S(1)@2"] (see ir/layout.py)',
                start,
            )
        return tuple(levels), at

    def _with_layouts(self, f: Function, where: Token) -> Function:
        from ..layout import LayoutError, check_levels, with_layouts

        if not self.in_layouts and not any(self.out_layouts):
            return f
        for v in f.inputs:
            found = self.in_layouts.get(v.name)
            if found is not None:
                try:
                    check_levels(found[0], v.type, f"input {v.name!r}")
                except LayoutError as e:
                    raise self.cur.error(str(e), found[1]) from None
        for v, found in zip(f.outputs, self.out_layouts):
            if found is not None:
                try:
                    check_levels(found[0], v.type, f"output {v.name!r}")
                except LayoutError as e:
                    raise self.cur.error(str(e), found[1]) from None
        inputs = {k: levels for k, (levels, _) in self.in_layouts.items()}
        outputs = [None if x is None else x[0] for x in self.out_layouts]
        return with_layouts(f, inputs, outputs)

    def parameter(self, scope: _Scope, what: str) -> None:
        cur = self.cur
        tok = cur.expect_name(f"(a {what})")
        if tok.text in _RESERVED or tok.text == "_":
            raise cur.error(f"{tok.text!r} cannot name a {what}", tok)
        cur.expect(":", f"and a type after the {what} {tok.text!r}")
        type_ = self.terms.type(scope.device_vars)
        if what == "function parameter":
            layout = self._layout()
            if layout is not None:
                self.in_layouts[tok.text] = layout
        self._define(scope, tok)
        scope.values[tok.text] = (scope.builder.input(tok.text, type_), tok)

    def finish(self, scope: _Scope, outputs: list[Value], where: Token) -> Function:
        try:
            return scope.builder.finish(outputs)
        except _BUILD_ERRORS as e:
            raise self.cur.error(str(e), where) from None

    def statements(self, scope: _Scope, closer: str | None) -> list[Value] | None:
        """Statements up to 'return' (its values returned) or ``closer`` (None returned)."""
        cur = self.cur
        while True:
            tok = cur.tok
            if tok.is_name("return"):
                cur.advance()
                return self._return_values(scope, closer)
            if tok.kind == "EOF" or (closer is not None and tok.is_punct(closer)):
                return None
            if tok.kind == "NAME" or tok.is_punct("("):
                self._statement(scope)
            else:
                raise cur.error(
                    "expected a statement (name: Type = Op(...)) or 'return', "
                    f"found {describe(tok)}"
                )

    def _return_values(self, scope: _Scope, closer: str | None) -> list[Value]:
        cur = self.cur
        values: list[Value] = []
        while cur.tok.kind != "EOF" and not (closer and cur.tok.is_punct(closer)):
            values.append(self.operand(scope))
            if closer is None:  # the function's own outputs may carry layouts
                self.out_layouts.append(self._layout())
            if not cur.accept(","):
                break
        return values

    # -- statements ----------------------------------------------------------------------

    def _statement(self, scope: _Scope) -> None:
        cur = self.cur
        start = cur.tok
        if start.kind == "NAME" and cur.peek().is_punct("("):
            known = "" if has_op(start.text) else f"; and {start.text!r} is not a known op"
            raise cur.error(
                f"expected a statement that names its results (name: Type = Op(...)), found the "
                f"bare call {start.text}(...){known}"
            )
        results = self._results(scope)
        cur.expect("=", "after the results of a statement (name: Type = Op(...))")
        for result in results:
            if result.token.text != "_":
                self._define(scope, result.token)
        op_tok = cur.tok
        if op_tok.kind != "NAME":
            raise cur.error(
                f"expected an op call such as MatMul(x, w) after '=', found {describe(op_tok)}"
            )
        if op_tok.text.lower() in _PMAP_NAMES:
            outputs = parse_pmap(self, scope, results, start)
        elif op_tok.text == "task" and self.cur.peek().is_punct("("):
            outputs = parse_pmap(self, scope, results, start, task=True)
        else:
            outputs = self._call(scope, results, start)
        for result, value in zip(results, outputs):
            declared = result.declared
            if declared is not None and declared is not BLANK and declared != value.type:
                raise cur.error(
                    f"{result.token.text!r} is declared {declared} but "
                    f"{op_tok.text} gives {value.type}",
                    result.type_token,
                )
            if result.token.text != "_":
                scope.values[result.token.text] = (value, result.token)

    def _results(self, scope: _Scope) -> list[_Result]:
        """``name[: T]`` or ``(a[: T], b[: T], ...)[: Tuple[...]]``; names checked unique."""
        cur = self.cur
        if cur.tok.kind == "NAME":
            result = _Result(self._result_name(scope, []))
            if cur.accept(":"):
                result.type_token = cur.tok
                result.declared = self.terms.type(scope.device_vars)
            return [result]
        opener = cur.advance()
        results: list[_Result] = []
        while not cur.tok.is_punct(")"):
            result = _Result(self._result_name(scope, results))
            if cur.accept(":"):
                result.type_token = cur.tok
                result.declared = self.terms.type(scope.device_vars, allow_blank=True)
            results.append(result)
            if not cur.accept(","):
                break
        cur.close(opener, "after the result names")
        if cur.tok.is_punct(":"):
            colon = cur.advance()
            if any(r.declared is not None for r in results):
                raise cur.error(
                    "the results are typed twice: give either each name a type or the group "
                    "one Tuple[...] type",
                    colon,
                )
            type_token = cur.tok
            group = self.terms.type(scope.device_vars, blank_elements=True)
            is_tuple = isinstance(group, (TupleType, ResultTuple))
            if not is_tuple or len(group.elements) != len(results):
                found = (
                    f"a Tuple of {len(group.elements)}" if is_tuple else f"the tensor type {group}"
                )
                raise cur.error(
                    f"{len(results)} results need a Tuple type of {len(results)} elements, "
                    f"found {found}",
                    type_token,
                )
            for r, t in zip(results, group.elements):
                r.declared, r.type_token = t, type_token
        return results

    def _result_name(self, scope: _Scope, earlier: list[_Result]) -> Token:
        cur = self.cur
        tok = cur.expect_name("for a result")
        if tok.text in _RESERVED:
            raise cur.error(f"{tok.text!r} is a keyword and cannot name a value", tok)
        if tok.text != "_" and any(r.token.text == tok.text for r in earlier):
            raise cur.error(f"the statement names {tok.text!r} twice", tok)
        return tok

    def _define(self, scope: _Scope, tok: Token) -> None:
        if tok.text in scope.values:
            first = scope.values[tok.text][1]
            raise self.cur.error(
                f"duplicate definition of {tok.text!r} (first defined at line {first.line}, "
                f"column {first.column}); a value is defined once, so give this one a new name",
                tok,
            )

    # -- op calls ------------------------------------------------------------------------

    def _lookup(self, tok: Token) -> OpDef:
        try:
            return get_op(tok.text)
        except UnknownOpError as e:
            raise self.cur.error(str(e), tok) from None

    def check_result_count(
        self, op_name: str, names: tuple[str, ...], results: list[_Result], start: Token
    ) -> None:
        """The statement must name each result of the op (``_`` for a discarded one)."""
        if len(names) == len(results):
            return
        shown = ", ".join(names)
        if op_name == "pmap":
            raise self.cur.error(
                f"the pmap body returns {len(names)} value(s) ({shown}) but the statement "
                f"names {len(results)} result(s); return one value per result",
                start,
            )
        raise self.cur.error(
            f"{op_name} defines {len(names)} result(s) ({shown}) but the statement names "
            f"{len(results)}; name each one: ({shown}): Tuple[...] = {op_name}(...)",
            start,
        )

    def _call(self, scope: _Scope, results: list[_Result], start: Token) -> tuple[Value, ...]:
        cur = self.cur
        op_tok = cur.advance()
        if not cur.tok.is_punct("("):
            hint = ""
            if cur.tok.is_punct("+", "-", "*", "/", "@"):
                hint = " (infix operators are not part of the format; write Add(a, b), ...)"
            raise cur.error(
                f"expected '(' after the op name {op_tok.text!r}, found {describe(cur.tok)}{hint}"
            )
        opdef = self._lookup(op_tok)
        operands, attrs = self._arguments(scope, opdef, op_tok)
        self.check_result_count(opdef.name, opdef.results, results, start)
        names = [self.value_name(r, opdef, i) for i, r in enumerate(results)]
        op = self.add_op(scope, op_tok, opdef.name, operands, attrs, names, ())
        return op.outputs

    def _arguments(
        self, scope: _Scope, opdef: OpDef, op_tok: Token
    ) -> tuple[list[Value], dict[str, Any]]:
        """``(operands..., literals..., name=literal...)``: positional literals take the
        op's attributes in declared order; keywords may use an attribute's aliases."""
        cur = self.cur
        opener = cur.advance()
        operands: list[Value] = []
        attrs: dict[str, Any] = {}
        attr_order = list(opdef.attributes)
        spelled = {alias: a.name for a in opdef.attributes for alias in (a.name, *a.aliases)}
        keywords = False
        while not cur.tok.is_punct(")"):
            tok = cur.tok
            if tok.kind == "NAME" and cur.peek().is_punct("="):
                keywords = True
                cur.advance()
                cur.advance()
                name = spelled.get(tok.text, tok.text)
                if name in attrs:
                    raise cur.error(f"{opdef.name} is given the attribute {name!r} twice", tok)
                attrs[name] = self.terms.literal(scope.device_vars)
            elif keywords:
                raise cur.error(
                    f"positional argument after keyword arguments in {op_tok.text}(...): "
                    "operands come first, then attributes",
                    tok,
                )
            elif self._is_operand(scope, tok):
                if attrs:
                    raise cur.error(
                        f"operand after a positional attribute value in {op_tok.text}(...)", tok
                    )
                operands.append(self.operand(scope))
            else:
                free = [a for a in attr_order if a.name not in attrs]
                if not free:
                    known = ", ".join(opdef.attribute_names) or "none"
                    raise cur.error(
                        f"{opdef.name} has no attribute left for the positional value "
                        f"{tok.text!r} (its attributes: {known})",
                        tok,
                    )
                attrs[free[0].name] = self.terms.literal(scope.device_vars)
            if not cur.accept(","):
                break
        cur.close(opener, f"after the arguments of {op_tok.text}")
        return operands, attrs

    def _is_operand(self, scope: _Scope, tok: Token) -> bool:
        """A positional argument is an operand unless it is a literal (number, size, ...)."""
        if tok.is_punct("("):
            return True
        if tok.kind != "NAME":
            return False
        if tok.text in scope.values or scope.outer_definition(tok.text):
            return True
        literal_names = {"True", "False", "None", "inf", "nan", *scope.device_vars}
        known = tok.text in literal_names or tok.text in DTYPE_NAMES or tok.text in self.terms.sizes
        return not known

    def operand(self, scope: _Scope) -> Value:
        """``name``, ``name[i]`` (a TupleGet) or ``(a, b, ...)`` (a MakeTuple)."""
        cur = self.cur
        tok = cur.tok
        if tok.is_punct("("):
            opener = cur.advance()
            items: list[Value] = []
            while not cur.tok.is_punct(")"):
                items.append(self.operand(scope))
                if not cur.accept(","):
                    break
            cur.close(opener, "after the tuple's elements")
            (op,) = [self.add_op(scope, tok, "MakeTuple", items, {}, None, ())]
            return op.outputs[0]
        if tok.kind != "NAME":
            raise cur.error(f"expected a value name, found {describe(tok)}")
        cur.advance()
        value = self._value(scope, tok)
        while cur.tok.is_punct("["):
            opener = cur.advance()
            index = self.terms.dim_signed()
            cur.close(opener, "after the tuple index")
            key = (value, index)
            if key not in scope.tuple_gets:
                name = f"{tok.text}_{index}" if index >= 0 else f"{tok.text}_m{-index}"
                op = self.add_op(scope, tok, "TupleGet", [value], {"index": index}, [name], ())
                scope.tuple_gets[key] = op.outputs[0]
            value = scope.tuple_gets[key]
        return value

    def _value(self, scope: _Scope, tok: Token) -> Value:
        if tok.text in scope.values:
            return scope.values[tok.text][0]
        outer = scope.outer_definition(tok.text)
        if outer is not None:
            raise self.cur.error(
                f"undefined value {tok.text!r} in this {scope.kind} body: a body reads only "
                f"its own parameters ({tok.text!r} is defined outside it, at line "
                f"{outer.line}); pass it in through the {scope.kind}'s operands",
                tok,
            )
        close = difflib.get_close_matches(tok.text, list(scope.values), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise self.cur.error(f"undefined value {tok.text!r}{hint}", tok)

    @staticmethod
    def value_name(result: _Result, opdef: OpDef, i: int) -> str:
        if result.token.text != "_":
            return result.token.text
        results = opdef.results
        return "_" + (results[i] if i < len(results) else f"{results[-1]}{i}")

    def add_op(
        self,
        scope: _Scope,
        where: Token,
        op_type: str,
        operands: list[Value],
        attrs: dict[str, Any],
        names: list[str] | None,
        subfunctions: tuple[Function, ...],
    ):
        try:
            return scope.builder.add_op(
                op_type, operands, attrs, names=names, subfunctions=subfunctions
            )
        except _BUILD_ERRORS as e:
            raise self.cur.error(str(e), where) from None
        except _RULE_ERRORS as e:
            raise self.cur.error(
                f"{op_type} rejected its operands or attributes: {type(e).__name__}: {e}", where
            ) from None

    # -- pmap ---------------------------------------------------------------------------

    def body_scope(self, scope: _Scope, device_var: str | None) -> _Scope:
        """A fresh scope for a pmap body inside ``scope``, binding ``device_var`` (None: a
        task's body, which binds none)."""
        self.bodies += 1
        builder = FunctionBuilder(f"{scope.builder.name}_body{self.bodies}")
        if device_var is None:
            return _Scope(builder, scope.device_vars, parent=scope, kind="task")
        return _Scope(builder, (*scope.device_vars, device_var), parent=scope)
