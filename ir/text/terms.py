"""The small terms of the text format: types, shapes, dimensions, devices, attribute values.

Dimensions may be symbolic (``B/N``); they are evaluated at once from the sizes
given to ``ir.parse``, with ``+ - * /`` where ``/`` must divide exactly. Device
ids are integers, sizes (``N``), device variables in scope (``d``, ``d.1``) or
``?`` (unassigned). ``Tuple[A, ..., Z]`` expands the ellipsis from the devices of
its neighbours.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidTypeError
from ..limits import MAX_DEVICES, MAX_INT
from ..types import DeviceRef, DeviceVar, DType, TensorType, TupleType, Type
from .lexer import Cursor, Token, describe

SCALAR_TYPES = {"Float": DType.float32, "Int": DType.int64, "Bool": DType.bool}
DTYPE_NAMES = {d.value: d for d in DType}
CONSTANT_NAMES = {"True": True, "False": False, "None": None}
FLOAT_NAMES = {"inf": float("inf"), "nan": float("nan")}
_ARITH = ("+", "-", "*", "/")


class _Blank:
    """The ``_`` type: a discarded result whose type is not written."""

    def __repr__(self) -> str:
        return "_"


BLANK: Any = _Blank()


@dataclass(frozen=True)
class ResultTuple:
    """The type of a statement's results where some are ``_`` (BLANK): no value has it."""

    elements: tuple[Any, ...]


class Terms:
    """Parses terms at a Cursor, evaluating sizes from ``sizes``."""

    def __init__(self, cursor: Cursor, sizes: Mapping[str, int]) -> None:
        self.cur = cursor
        self.sizes = dict(sizes)
        # Where each sub-device (d.1) was written, so a pmap without a device map can say so.
        self.subdevice_uses: list[tuple[DeviceVar, Token]] = []

    # -- types ------------------------------------------------------------------

    def type(
        self, device_vars: Collection[str], allow_blank: bool = False, blank_elements: bool = False
    ) -> Type:
        """A type. ``_`` (BLANK, a discarded result) may be the whole type where
        ``allow_blank``, or an element of this Tuple type where ``blank_elements``."""
        cur = self.cur
        tok = cur.tok
        if allow_blank and tok.is_name("_"):
            cur.advance()
            return BLANK
        if tok.is_name("Tensor"):
            cur.advance()
            opener = cur.expect("[", "after 'Tensor' (write Tensor[shape, device])")
            if cur.tok.is_punct("]"):
                raise cur.error("expected a shape and a device in Tensor[shape, device], found ']'")
            shape = self.shape()
            cur.expect(",", "and a device after the tensor's shape (an integer, d, or ?)")
            dtype = DType.float32
            if cur.tok.kind == "NAME" and cur.tok.text in DTYPE_NAMES:
                dtype = DTYPE_NAMES[cur.advance().text]
                cur.expect(",", "and a device after the dtype")
            device = self.device(device_vars)
            cur.close(opener, "after the tensor's device")
            try:
                return TensorType(shape, dtype, device)
            except InvalidTypeError as e:
                raise cur.error(str(e), tok) from None
        if tok.kind == "NAME" and tok.text in SCALAR_TYPES:
            cur.advance()
            opener = cur.expect("[", f"after {tok.text!r} (write {tok.text}[device])")
            device = self.device(device_vars)
            cur.close(opener, "after the scalar's device")
            try:
                return TensorType((), SCALAR_TYPES[tok.text], device)
            except InvalidTypeError as e:
                raise cur.error(str(e), tok) from None
        if tok.is_name("Tuple"):
            cur.advance()
            return self._tuple(device_vars, blank_elements)
        raise cur.error(
            f"expected a type (Tensor[...], Float[...], Int[...], Bool[...] or Tuple[...]), "
            f"found {describe(tok)}"
        )

    def _tuple(self, device_vars: Collection[str], blank_elements: bool) -> Type:
        cur = self.cur
        opener = cur.expect("[", "after 'Tuple' (write Tuple[T1, T2, ...])")
        items: list[Any] = []
        while not cur.tok.is_punct("]"):
            if cur.tok.is_punct("..."):
                items.append(cur.advance())
            else:
                items.append(self.type(device_vars, allow_blank=blank_elements))
            if not cur.accept(","):
                break
        cur.close(opener, "after the tuple's element types")
        try:
            elements = tuple(self._expand(items))
            if any(e is BLANK for e in elements):
                TupleType(tuple(e for e in elements if e is not BLANK))  # the checks, still
                return ResultTuple(elements)
            return TupleType(elements)
        except InvalidTypeError as e:
            raise cur.error(str(e), opener) from None

    def _expand(self, items: list[Any]) -> list[Type]:
        out: list[Type] = []
        for i, item in enumerate(items):
            if not isinstance(item, Token):
                out.append(item)
                continue
            left = items[i - 1] if i > 0 else None
            right = items[i + 1] if i + 1 < len(items) else None
            if not isinstance(left, TensorType) or not isinstance(right, TensorType):
                raise self.cur.error(
                    "'...' stands for the tensors between its two neighbours, so it needs a "
                    "tensor type on each side (Tuple[T@1, ..., T@N])",
                    item,
                )
            lo, hi = left.device, right.device
            if not isinstance(lo, int) or not isinstance(hi, int):
                raise self.cur.error(
                    f"cannot expand '...' between devices {_dev(lo)} and {_dev(hi)}: both ends "
                    "must be on known integer devices, so that the tuple's length is known",
                    item,
                )
            if hi == lo:
                raise self.cur.error(
                    f"cannot tell how many tensors '...' stands for: both of its neighbours are "
                    f"on device {lo} (write the tuple's elements out)",
                    item,
                )
            if hi < lo:
                raise self.cur.error(
                    f"cannot expand '...' between devices {lo} and {hi}: the device ids must "
                    "increase from left to right",
                    item,
                )
            if left.with_device(None) != right.with_device(None):
                raise self.cur.error(
                    f"the tensors around '...' must differ only in their device, got {left} "
                    f"and {right}",
                    item,
                )
            if len(out) + hi - lo > MAX_DEVICES:
                raise self.cur.error(
                    f"'...' between devices {lo} and {hi} makes the tuple longer than "
                    f"{MAX_DEVICES} elements (the limit, ir.limits.MAX_DEVICES)",
                    item,
                )
            out.extend(left.with_device(k) for k in range(lo + 1, hi))
        return out

    # -- shapes and dimensions -----------------------------------------------------

    def shape(self) -> tuple[int, ...]:
        """``(d1, d2, ...)``, ``()``, or one dimension without parentheses (``B``)."""
        cur = self.cur
        if not cur.tok.is_punct("("):
            return (self.dim(),)
        opener = cur.advance()
        dims: list[int] = []
        trailing_comma = False
        while not cur.tok.is_punct(")"):
            dims.append(self.dim())
            trailing_comma = bool(cur.accept(","))
            if not trailing_comma:
                break
        cur.close(opener, "after the shape's dimensions")
        if len(dims) == 1 and not trailing_comma and cur.tok.is_punct(*_ARITH):
            # "(B/N)*2": the parentheses grouped an expression, not a shape.
            return (self._arith(opener, dims[0]),)
        return tuple(dims)

    def dim(self) -> int:
        """One dimension: an integer expression over sizes, evaluated now."""
        start = self.cur.tok
        value = self._arith(start, self._term(self._unary()))
        if value < 0:
            raise self.cur.error(f"the dimension evaluates to {value}, which is negative", start)
        return value

    def _arith(self, start: Token, left: int) -> int:
        """Continue ``left`` with ``* /`` then ``+ -`` operators."""
        cur = self.cur
        left = self._term(left)
        while cur.tok.is_punct("+", "-"):
            sign = cur.advance()
            right = self._term(self._unary())
            left = self._bounded(left + right if sign.text == "+" else left - right, sign)
        return left

    def _bounded(self, value: int, where: Token) -> int:
        """``value``, or a ParseError at ``where`` when it is beyond ``MAX_INT``."""
        if abs(value) > MAX_INT:
            raise self.cur.error(
                f"the expression evaluates to {_short(value)}, beyond the limit {MAX_INT} "
                "(2**63 - 1, ir.limits.MAX_INT)",
                where,
            )
        return value

    def _term(self, left: int) -> int:
        cur = self.cur
        while cur.tok.is_punct("*", "/"):
            op = cur.advance()
            right = self._unary()
            if op.text == "*":
                left = self._bounded(left * right, op)
            elif right == 0:
                raise cur.error("division by zero in a dimension", op)
            elif left % right:
                raise cur.error(
                    f"the dimension does not divide: {left} / {right} leaves a remainder of "
                    f"{left % right} (choose sizes that divide evenly)",
                    op,
                )
            else:
                left //= right
        return left

    def _unary(self) -> int:
        cur = self.cur
        negate = False
        while cur.tok.is_punct("-"):  # a loop, not recursion: "- - - 1" may be long
            cur.advance()
            negate = not negate
        value = self._unsigned()
        return -value if negate else value

    def _unsigned(self) -> int:
        cur = self.cur
        tok = cur.tok
        if tok.kind == "INT":
            return cur.advance().value
        if tok.kind == "NAME":
            return self.size(cur.advance())
        if tok.is_punct("("):
            opener = cur.advance()
            value = self._arith(tok, self._term(self._unary()))
            cur.close(opener, "after the parenthesised dimension")
            return value
        raise cur.error(
            f"expected a dimension (an integer or a size name such as B), found {describe(tok)}"
        )

    def size(self, tok: Token) -> int:
        """The value of size symbol ``tok``, or a ParseError naming it."""
        if tok.text in self.sizes:
            value = self.sizes[tok.text]
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                value = int(value)
            if type(value) is not int or not 0 <= value <= MAX_INT:
                raise self.cur.error(
                    f"size {tok.text!r} is {_short(value)}: sizes must be integers from 0 to "
                    f"{MAX_INT} (ir.limits.MAX_INT)",
                    tok,
                )
            return value
        known = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.sizes.items())) or "none"
        raise self.cur.error(
            f"unbound size {tok.text!r}: pass sizes={{{tok.text!r}: ...}} to ir.parse "
            f"(sizes given: {known})",
            tok,
        )

    # -- devices ------------------------------------------------------------------------

    def device(self, device_vars: Collection[str]) -> DeviceRef:
        """``?``, an integer, a size, or a device variable in scope with sub-devices (``d.1``)."""
        cur = self.cur
        tok = cur.tok
        if cur.accept("?"):
            return None
        if tok.kind == "NAME" and tok.text in device_vars:
            cur.advance()
            sub: list[int] = []
            while cur.tok.is_punct("."):
                cur.advance()
                if cur.tok.kind != "INT":
                    raise cur.error(
                        f"expected a sub-device number after '{tok.text}.', "
                        f"found {describe(cur.tok)}"
                    )
                sub.append(cur.advance().value)
            if sub:
                self.subdevice_uses.append((DeviceVar(tok.text, tuple(sub)), tok))
            if cur.tok.is_punct(*_ARITH):
                raise cur.error(
                    f"device arithmetic on the device variable {tok.text!r} is not supported; "
                    f"name a sub-device ({tok.text}.1) and give the pmap a device_map"
                )
            return DeviceVar(tok.text, tuple(sub))
        if tok.kind == "NAME" and tok.text not in self.sizes:
            hint = _did_you_mean(tok.text, [*device_vars, *self.sizes])
            raise cur.error(
                f"unknown device {tok.text!r}: not a device variable in scope nor a size{hint}"
            )
        if tok.kind in ("INT", "NAME") or tok.is_punct("(", "-"):
            return self.dim()
        raise cur.error(
            f"expected a device (an integer, a device variable such as d, or ? for unassigned), "
            f"found {describe(tok)}"
        )

    # -- attribute values -------------------------------------------------------------

    def literal(self, device_vars: Collection[str]) -> Any:
        """An attribute value: number, string, bool, None, ``?``, list, dict, dtype, size or
        device."""
        cur = self.cur
        tok = cur.tok
        if cur.accept("?"):
            return None
        if tok.kind == "STRING":
            return cur.advance().value
        if tok.is_punct("["):
            return self._list(device_vars)
        if tok.is_punct("{"):
            return self._dict(device_vars)
        if tok.kind == "FLOAT":
            return cur.advance().value
        if tok.is_punct("-") and (cur.peek().kind == "FLOAT" or cur.peek().is_name(*FLOAT_NAMES)):
            cur.advance()
            return -self.literal(device_vars)
        if tok.kind == "NAME":
            if tok.text in device_vars:
                return self.device(device_vars)
            if tok.text in CONSTANT_NAMES:
                return CONSTANT_NAMES[cur.advance().text]
            if tok.text in DTYPE_NAMES:
                return DTYPE_NAMES[cur.advance().text]
            if tok.text in FLOAT_NAMES and tok.text not in self.sizes:
                return FLOAT_NAMES[cur.advance().text]
            if tok.text not in self.sizes:
                hint = _did_you_mean(tok.text, [*device_vars, *self.sizes])
                raise cur.error(
                    f"undefined name {tok.text!r} in an attribute value (expected a number, a "
                    f"string, a list, a dict, True/False/None, a dtype, a size or a device "
                    f"variable){hint}"
                )
        if tok.kind in ("INT", "NAME") or tok.is_punct("-", "("):
            return self.dim_signed()
        raise cur.error(f"expected an attribute value, found {describe(tok)}")

    def dim_signed(self) -> int:
        """An integer expression that may be negative (``axis=-1``)."""
        start = self.cur.tok
        return self._arith(start, self._term(self._unary()))

    def _list(self, device_vars: Collection[str]) -> list[Any]:
        cur = self.cur
        opener = cur.advance()
        items: list[Any] = []
        while not cur.tok.is_punct("]"):
            start = cur.tok
            item = self.literal(device_vars)
            if cur.tok.is_punct(".."):
                dots = cur.advance()
                end = self.literal(device_vars)
                items.extend(self._range(item, end, start, dots))
            else:
                items.append(item)
            if not cur.accept(","):
                break
        cur.close(opener, "after the list's items")
        return items

    def _range(self, lo: Any, hi: Any, start: Token, dots: Token) -> list[int]:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi))
        if not ints:
            raise self.cur.error(
                f"cannot expand the device range {_dev(lo)}..{_dev(hi)}: both ends must be "
                "known integer devices ([1..N] with N given in sizes)",
                dots,
            )
        if hi < lo:
            raise self.cur.error(
                f"the range {lo}..{hi} is empty (its end is below its start)", start
            )
        if hi - lo + 1 > MAX_DEVICES:
            raise self.cur.error(
                f"the range {lo}..{hi} has {hi - lo + 1} items, more than {MAX_DEVICES} "
                "(the limit, ir.limits.MAX_DEVICES)",
                dots,
            )
        return list(range(lo, hi + 1))

    def _dict(self, device_vars: Collection[str]) -> dict[Any, Any]:
        cur = self.cur
        opener = cur.advance()
        out: dict[Any, Any] = {}
        while not cur.tok.is_punct("}"):
            key_tok = cur.tok
            key = self.literal(device_vars)
            if isinstance(key, (list, dict)):
                kind = "list" if isinstance(key, list) else "dict"
                raise cur.error(
                    f"a dict key must be a number, a string or a device, not a {kind}", key_tok
                )
            if key in out:
                raise cur.error(f"the dict lists the key {key!r} twice", key_tok)
            cur.expect(":", "between a dict key and its value")
            out[key] = self.literal(device_vars)
            if not cur.accept(","):
                break
        cur.close(opener, "after the dict's items")
        return out


def _short(value: Any) -> str:
    """A value for a message, shortened when it is a huge integer."""
    if type(value) is int and abs(value) > 10**30:
        return f"about 10**{len(str(abs(value))) - 1}" if abs(value) < 10**4000 else "huge"
    return repr(value)


def _dev(ref: Any) -> str:
    return "?" if ref is None else str(ref)


def _did_you_mean(name: str, candidates: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
