"""Parsing ``pmap``: its device variable, optional device map, body (a lambda) and data.

Two spellings from the seeds are accepted, and may be mixed with keywords::

    pmap(device_var=d, fn=lambda (xi: T), (wi: T): { ...; return yi }, (xs, ws))
    pmap(lambda d: lambda (xi: T, wi: T): { ...; return yi }, device_map={...}, (xs, ws))

``body=`` is a synonym of ``fn=``. The body sees only its parameters; its types
may use the device variable (``Tensor[(B/N, F), d]``) and, with a device map,
sub-devices (``d.1``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..function import Function
from ..registry import get_op
from ..value import Value
from .lexer import Token, describe

if TYPE_CHECKING:
    from .parser import _Parser, _Result, _Scope

_BODY_KEYWORDS = ("fn", "body")


def parse_pmap(
    p: _Parser, scope: _Scope, results: list[_Result], start: Token, task: bool = False
) -> tuple[Value, ...]:
    """Parse ``pmap(...)`` at the cursor, add the Pmap op to ``scope`` and return its results.
    ``task``: parse ``task(fn=lambda (x: T), ...: {...}, (xs, ...))``, a Task op (its body
    typed on concrete devices: no device variable, no device map)."""
    cur = p.cur
    what = "task" if task else "pmap"
    op_tok = cur.advance()
    opener = cur.expect("(", f"after '{what}'")
    first_use = len(p.terms.subdevice_uses)
    device_var: str | None = None
    device_map: Any = None
    body: Function | None = None
    data: list[Value] | None = None
    while not cur.tok.is_punct(")"):
        tok = cur.tok
        if tok.kind == "NAME" and cur.peek().is_punct("="):
            cur.advance()
            cur.advance()
            if task and tok.text not in _BODY_KEYWORDS:
                raise cur.error(
                    f"task has no argument {tok.text!r}: it takes fn= (or body=) and a tuple "
                    "of operands such as (x, w)",
                    tok,
                )
            if tok.text == "device_var":
                name = cur.expect_name("for the pmap's device variable").text
                _same_var(p, tok, device_var, name)
                device_var = name
            elif tok.text == "device_map":
                map_tok = cur.tok
                device_map = p.terms.literal(scope.device_vars)
                if not isinstance(device_map, dict):
                    raise cur.error(
                        f"device_map must be a dict such as {{1: [1, 3], 2: [2, 4]}}, "
                        f"found {map_tok.text!r}",
                        map_tok,
                    )
            elif tok.text in _BODY_KEYWORDS:
                _no_second_body(p, body, tok)
                body, device_var = _lambda(p, scope, device_var, task)
            else:
                raise cur.error(
                    f"pmap has no argument {tok.text!r}: it takes device_var=, device_map=, "
                    "fn= (or body=) and a tuple of operands such as (xs, ys)",
                    tok,
                )
        elif tok.is_name("lambda"):
            _no_second_body(p, body, tok)
            body, device_var = _lambda(p, scope, device_var, task)
        elif tok.is_punct("(") or tok.kind == "NAME":
            if data is not None:
                raise cur.error(f"{what} is given its operands twice", tok)
            data = _data(p, scope)
        else:
            raise cur.error(
                f"expected a pmap argument (device_var=, device_map=, fn=lambda ..., or the "
                f"operands (xs, ...)), found {describe(tok)}"
            )
        if not cur.accept(","):
            break
    cur.close(opener, f"after the arguments of {what}")
    if body is None:
        raise cur.error(f"{what} needs a body: fn=lambda (x: T), ...: {{ ... return y }}", op_tok)
    if data is None:
        if task:
            raise cur.error("task needs its operands, e.g. (x, w)", op_tok)
        raise cur.error("pmap needs the per-device tuples it maps over, e.g. (xs, ws)", op_tok)
    if task:
        p.check_result_count("task", tuple(v.name for v in body.outputs), results, start)
        opdef = get_op("Task")
        names = [p.value_name(r, opdef, i) for i, r in enumerate(results)]
        return p.add_op(scope, op_tok, "Task", data, {}, names, (body,)).outputs
    if device_map is None:
        for sub, tok in p.terms.subdevice_uses[first_use:]:
            if sub.name == device_var:
                raise cur.error(
                    f"the sub-device {sub} needs a device map: give this pmap "
                    "device_map={device: [sub-devices], ...} (e.g. {1: [1, 3], 2: [2, 4]})",
                    tok,
                )
    p.check_result_count("pmap", tuple(v.name for v in body.outputs), results, start)
    opdef = get_op("Pmap")
    names = [p.value_name(r, opdef, i) for i, r in enumerate(results)]
    attrs: dict[str, Any] = {"device_var": device_var}
    if device_map is not None:
        attrs["device_map"] = device_map
    op = p.add_op(scope, op_tok, "Pmap", data, attrs, names, (body,))
    return op.outputs


def _same_var(p: _Parser, tok: Token, old: str | None, new: str) -> None:
    if old is not None and old != new:
        raise p.cur.error(f"the pmap binds two device variables, {old!r} and {new!r}", tok)


def _no_second_body(p: _Parser, body: Function | None, tok: Token) -> None:
    if body is not None:
        raise p.cur.error("pmap is given two bodies", tok)


def _data(p: _Parser, scope: _Scope) -> list[Value]:
    cur = p.cur
    if not cur.tok.is_punct("("):
        return [p.operand(scope)]
    opener = cur.advance()
    values: list[Value] = []
    while not cur.tok.is_punct(")"):
        values.append(p.operand(scope))
        if not cur.accept(","):
            break
    cur.close(opener, "after the pmap's operands")
    return values


def _lambda(
    p: _Parser, scope: _Scope, device_var: str | None, task: bool = False
) -> tuple[Function, str]:
    """``lambda [d: lambda] params: { statements return ... }`` -> (body, device variable).
    ``task``: ``lambda params: {...}``, a task's body (it binds no device variable)."""
    cur = p.cur
    what = "task" if task else "pmap"
    lambda_tok = cur.expect_keyword("lambda", f"for the {what} body")
    # (a task's body binds no device variable: lambda (x: T), ...: {...})
    if not task and cur.tok.kind == "NAME" and cur.peek().is_punct(":"):
        binder = cur.advance()
        cur.advance()
        _same_var(p, binder, device_var, binder.text)
        device_var = binder.text
        cur.expect_keyword("lambda", f"after 'lambda {binder.text}:' (the body's lambda)")
    if device_var is None and not task:
        raise cur.error(
            "the pmap body's device variable is not bound yet: write device_var=d before fn=, "
            "or lambda d: lambda (...): {...}",
            lambda_tok,
        )
    body_scope = p.body_scope(scope, None if task else device_var)
    _parameters(p, body_scope)
    brace = cur.expect("{", f"to open the {what} body")
    outputs = p.statements(body_scope, closer="}")
    if outputs is None:
        if cur.tok.kind == "EOF":
            cur.close(brace, f"after the {what} body")
        raise cur.error(
            f"the {what} body ends without 'return': a body must return its results (return y, ...)"
        )
    if not outputs and not task:
        raise cur.error("the pmap body returns nothing: return at least one value")
    cur.close(brace, "after the body's return")
    return p.finish(body_scope, outputs, lambda_tok), device_var


def _parameters(p: _Parser, scope: _Scope) -> None:
    """``(x: T), (y: T)`` or ``(x: T, y: T)`` (or unparenthesised ``x: T``), then ':'."""
    cur = p.cur
    while True:
        if cur.tok.is_punct("("):
            opener = cur.advance()
            while not cur.tok.is_punct(")"):
                p.parameter(scope, "body parameter")
                if not cur.accept(","):
                    break
            cur.close(opener, "after the body's parameters")
        else:
            p.parameter(scope, "body parameter")
        if cur.accept(":"):
            return
        if not cur.accept(","):
            hint = " (a missing ',' between parameters?)" if cur.tok.is_punct("(") else ""
            raise cur.error(
                "expected ',' or ':' after a parameter of the pmap body, "
                f"found {describe(cur.tok)}{hint}"
            )
