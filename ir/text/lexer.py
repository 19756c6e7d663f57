"""The lexer of the text format, and the token cursor the parser reads through.

Newlines are not tokens: statements end where their op call's ``)`` closes, so
a statement may span lines freely (the seeds break long ``pmap`` calls and
parameter lists anywhere). ``#`` starts a comment that runs to the end of the
line. Every token keeps its line and column, so every error can point at it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from ..errors import ParseError
from ..limits import MAX_INT, MAX_TEXT_NESTING

# Longest punctuation first: "..." (tuple ellipsis) before ".." (device range) before ".".
_PUNCT = ("...", "..", "(", ")", "[", "]", "{", "}", ",", ":", "=", ".", "?", "+", "-", "*")
_PUNCT += ("/", "@", "%", "&", "|", "!", "<", ">", ";")
# Numbers are ASCII digits only, as in Python source ("²" or "٣" is not a digit here).
# A float needs digits on both sides of its point, so "1..N" lexes as 1, .., N.
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[0-9]+")
_ASCII_NAME_PART = re.compile(r"[A-Za-z0-9_]*")
_STRING_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "b": "\b",
    "f": "\f",
    "/": "/",
    "\\": "\\",
    '"': '"',
    "'": "'",
}

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}


@dataclass(frozen=True)
class Token:
    """One token. ``kind`` is NAME, INT, FLOAT, STRING, PUNCT or EOF; ``text`` is as written."""

    kind: str
    text: str
    line: int
    column: int
    value: object = None

    def is_punct(self, *texts: str) -> bool:
        return self.kind == "PUNCT" and self.text in texts

    def is_name(self, *texts: str) -> bool:
        return self.kind == "NAME" and (not texts or self.text in texts)


def tokenize(source: str) -> list[Token]:
    """The tokens of ``source``, ending with EOF; a stray character is a ParseError."""
    lines = source.split("\n")
    tokens: list[Token] = []
    depth = 0  # brackets open: the parser recurses once per bracket, so it is bounded
    for line_no, text in enumerate(lines, start=1):
        col = 0
        while col < len(text):
            ch = text[col]
            if ch in " \t\r\f":
                col += 1
                continue
            if ch == "#":
                break
            start = col + 1
            if ch.isidentifier():  # a letter or "_" that may start a Python identifier
                end = _name_end(text, col)
                word = text[col:end]
                if not word.isascii():  # ASCII names are NFKC already
                    word = unicodedata.normalize("NFKC", word)
                tokens.append(Token("NAME", word, line_no, start))
                col = end
            elif "0" <= ch <= "9":
                # After a "." (sub-device d.1.2) only an integer can follow.
                after_dot = bool(tokens) and tokens[-1].is_punct(".")
                m = (_INTEGER if after_dot else _NUMBER).match(text, col)
                word = m.group()
                if _INTEGER.fullmatch(word):
                    tokens.append(
                        Token("INT", word, line_no, start, _integer(word, line_no, start, text))
                    )
                else:
                    tokens.append(Token("FLOAT", word, line_no, start, float(word)))
                col = m.end()
            elif ch in "\"'":
                value, end = _string(text, col, line_no, source)
                tokens.append(Token("STRING", text[col:end], line_no, start, value))
                col = end
            else:
                punct = next((p for p in _PUNCT if text.startswith(p, col)), None)
                if punct is None:
                    raise ParseError(
                        f"unexpected character {_show_char(ch)}: expected a name (Python's "
                        "identifier rules), an ASCII number, a string or punctuation",
                        line_no,
                        start,
                        text,
                    )
                if punct in OPENERS:
                    depth += 1
                    if depth > MAX_TEXT_NESTING:
                        raise ParseError(
                            f"brackets nest more than {MAX_TEXT_NESTING} deep here (the limit, "
                            "ir.limits.MAX_TEXT_NESTING); flatten the expression",
                            line_no,
                            start,
                            text,
                        )
                elif punct in CLOSERS:
                    depth = max(depth - 1, 0)
                tokens.append(Token("PUNCT", punct, line_no, start))
                col += len(punct)
    # The end of the text is reported just after the last token, not on a trailing blank line.
    if tokens:
        end = tokens[-1]
        tokens.append(Token("EOF", "", end.line, end.column + len(end.text)))
    else:
        tokens.append(Token("EOF", "", 1, 1))
    return tokens


def _integer(word: str, line_no: int, column: int, text: str) -> int:
    """The value of an integer literal, refused past ``MAX_INT`` (checked on its length
    first: Python will not even convert an integer of more than 4,300 digits)."""
    value = int(word) if len(word) <= 20 else MAX_INT + 1
    if value > MAX_INT:
        shown = word if len(word) <= 30 else f"{word[:12]}...({len(word)} digits)"
        raise ParseError(
            f"the integer {shown} is above the limit {MAX_INT} (2**63 - 1, ir.limits.MAX_INT)",
            line_no,
            column,
            text,
        )
    return value


def _name_end(text: str, col: int) -> int:
    """Where the identifier starting at ``col`` ends: Python's rules (``str.isidentifier``)."""
    end = _ASCII_NAME_PART.match(text, col + 1).end()  # the common case at regex speed
    while end < len(text) and not text[end].isascii() and ("_" + text[end]).isidentifier():
        end = _ASCII_NAME_PART.match(text, end + 1).end()
    return end


def _show_char(ch: str) -> str:
    """A character for an error message: itself and, past ASCII, its code point and name."""
    if ch.isascii():
        return repr(ch)
    name = unicodedata.name(ch, "")
    return f"{ch!r} (U+{ord(ch):04X}{' ' + name if name else ''})"


def _string(text: str, col: int, line_no: int, source: str) -> tuple[str, int]:
    quote = text[col]
    out: list[str] = []
    i = col + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\" and i + 1 < len(text):
            code = text[i + 2 : i + 6]
            if text[i + 1] == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", code):
                out.append(chr(int(code, 16)))
                i += 6
                continue
            out.append(_STRING_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ParseError(
        f"unterminated string: expected a closing {quote} before the end of the line",
        line_no,
        col + 1,
        text,
    )


def describe(token: Token) -> str:
    """How an error message names a token it found."""
    if token.kind == "EOF":
        return "the end of the text"
    if token.kind == "PUNCT" and token.text in CLOSERS:
        return f"{token.text!r} (an unmatched closing bracket?)"
    return repr(token.text)


class Cursor:
    """A position in the token list, with the checks and errors the parser needs."""

    def __init__(self, source: str) -> None:
        self.lines = source.split("\n")
        self.tokens = tokenize(source)
        self.pos = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "EOF":
            self.pos += 1
        return token

    def accept(self, text: str) -> Token | None:
        """Consume the punctuation ``text`` if it is next."""
        if self.tok.is_punct(text):
            return self.advance()
        return None

    def expect(self, text: str, context: str) -> Token:
        """Consume the punctuation ``text`` or fail with 'expected ... found ...'."""
        if self.tok.is_punct(text):
            return self.advance()
        raise self.error(f"expected {text!r} {context}, found {describe(self.tok)}")

    def expect_name(self, context: str) -> Token:
        if self.tok.kind == "NAME":
            return self.advance()
        raise self.error(f"expected a name {context}, found {describe(self.tok)}")

    def expect_keyword(self, word: str, context: str) -> Token:
        if self.tok.is_name(word):
            return self.advance()
        raise self.error(f"expected {word!r} {context}, found {describe(self.tok)}")

    def close(self, opener: Token, context: str) -> Token:
        """Consume the bracket that closes ``opener``; say where ``opener`` was if it is missing."""
        want = OPENERS[opener.text]
        if self.tok.is_punct(want):
            return self.advance()
        raise self.error(
            f"expected {want!r} {context} to close the {opener.text!r} at line {opener.line}, "
            f"column {opener.column}, found {describe(self.tok)}"
        )

    def error(self, message: str, token: Token | None = None) -> ParseError:
        """A ParseError at ``token`` (the current one by default)."""
        token = token or self.tok
        return ParseError(message, token.line, token.column, self.source_line(token.line))

    def source_line(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""
