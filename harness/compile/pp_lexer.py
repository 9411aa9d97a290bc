"""A candidate's source as preprocessing tokens, cut by clang's own lexer (libclang).

The source policy (:mod:`.source_policy`) must see a directive exactly where the compiler sees
one. A hand-written scanner got that wrong (``1.R"x("`` is a pp-number and a one-line string, not
a raw string that hides the next lines), so the tokens come from clang's lexer, which implements
C++17's rules: raw strings with their prefixes, pp-numbers (``1.e+R``), digit separators
(``1'0``), line splices anywhere, digraphs, comments, user-defined literal suffixes.

clang never preprocesses the candidate: it parses a one-line wrapper that holds the source inside
a raw string literal (a delimiter the source does not contain), so it follows no ``#include`` and
expands nothing; :func:`clang_tokenize` then re-lexes the bytes of that literal in raw mode.

Where clang and NVRTC (an EDG front end) could read the same bytes differently, the source is
refused before any lexing (:func:`text_problem`): a NUL, a control character other than tab and
newline, a carriage return not followed by a newline, a trigraph, a backslash followed by spaces
and a newline (clang splices it, NVRTC does not), a line splice inside a raw string (C++ reverts
it, NVRTC does not: the string ends elsewhere), and, outside comments and literals, any character
beyond printable ASCII (``$``, ``@``, a UCN or a UTF-8 identifier). The fuzzer of
``tests/harness/test_policy_fuzz.py`` found the last-but-one; NVRTC also starts a directive at a
``#`` that follows a comment's newline (:attr:`Tok.nbol`).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import threading
from dataclasses import dataclass

os.environ.setdefault("LIBCLANG_DISABLE_CRASH_RECOVERY", "1")  # no signal handlers of clang's in our process

try:
    from clang import cindex
except ImportError:  # the libclang package is a dependency; a broken install refuses every compile
    cindex = None

_LOCK = threading.Lock()  # one libclang index, used from the compile threads in turn
_TRIGRAPH = re.compile(rb"\?\?[=/'()!<>\-]")
_SPACE_SPLICE = re.compile(rb"\\[ \t\f\v]+\r?\n")
_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]|\r(?!\n)")
_CODE_CHARS = re.compile(rb"^[\x20-\x7e]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GAP = re.compile(rb"^(?:[ \t\n]|\r\n|\\\r?\n)*$")
_DIGRAPHS = {"%:": "#", "%:%:": "##", "<:": "[", ":>": "]", "<%": "{", "%>": "}"}
_ENCODING = re.compile(r"^(u8|u|U|L)?(R)?(['\"])")


class LexerUnavailable(RuntimeError):
    """libclang cannot be loaded: no source can be checked, so none is compiled."""


@dataclass(frozen=True)
class Tok:
    """One preprocessing token. ``kind``: ident, number, string, char, punct or comment; ``text``:
    its spelling with line splices removed and a digraph as its ordinary spelling; ``start`` /
    ``end``: byte offsets in the source; ``line``: the physical line it starts on (1-based);
    ``logical``: the index of its logical line; ``bol``: the first non-comment token of its
    logical line; ``nbol``: the first non-comment token after a newline that is not a splice,
    a newline inside a comment counting: NVRTC's front end starts a directive at a ``#`` there
    (``x = 1 /*<newline>*/ #include "f"`` includes ``f``), where the standard sees none."""

    kind: str
    text: str
    start: int
    end: int
    line: int
    logical: int
    bol: bool
    nbol: bool


class Lexed:
    """The tokens of one source, with what a policy asks of them."""

    def __init__(self, data: bytes, toks: list[Tok]) -> None:
        self.data = data
        self.toks = toks
        self.code = [t for t in toks if t.kind != "comment"]

    def line_rest(self, tok: Tok) -> str:
        """The text after ``tok`` to the end of its logical line, splices removed (a header
        name is lexed by the preprocessor from these characters, not from tokens)."""
        end = self.data.find(b"\n", tok.end)
        while end > 0 and self.data[: end].rstrip(b"\r").endswith(b"\\"):
            end = self.data.find(b"\n", end + 1)
        raw = self.data[tok.end : len(self.data) if end < 0 else end]
        return re.sub(rb"\\\r?\n", b"", raw).decode("utf-8", "replace")


def text_problem(data: bytes) -> str | None:
    """Why the raw bytes cannot be lexed the same way by every C++17 preprocessor, or None."""
    m = _CONTROL.search(data)
    if m:
        what = "a carriage return not followed by a newline" if m.group() == b"\r" else \
            f"the control character {m.group()!r}"
        return f"line {_line(data, m.start())}: the source holds {what}"
    m = _TRIGRAPH.search(data)
    if m:
        return f"line {_line(data, m.start())}: trigraph {m.group().decode()} is not allowed"
    m = _SPACE_SPLICE.search(data)
    if m:
        return (f"line {_line(data, m.start())}: a backslash followed by spaces before the end of the "
                "line is not allowed (is it a line continuation or not?)")
    return None


def _unsplice(text: str) -> str:
    return re.sub(r"\\\r?\n", "", text)


def _line(data: bytes, pos: int) -> int:
    return data.count(b"\n", 0, pos) + 1


def _kind(clang_kind: str, text: str) -> str:
    if clang_kind == "COMMENT":
        return "comment"
    if clang_kind in ("IDENTIFIER", "KEYWORD"):
        return "ident"
    if clang_kind == "LITERAL":
        m = _ENCODING.match(text)
        if m:
            return "char" if m.group(3) == "'" else "string"
        return "number"
    return "punct"


def _delimiter(data: bytes) -> str:
    while True:
        d = "k" + secrets.token_hex(7)
        if f"){d}\"".encode() not in data:
            return d


@functools.cache
def _index() -> object:
    if cindex is None:
        raise LexerUnavailable("the source policy needs libclang (pip install libclang)")
    try:
        return cindex.Index.create()
    except Exception as exc:  # noqa: BLE001 - a libclang.so that does not load: one line, refused compiles
        raise LexerUnavailable(f"libclang does not load: {type(exc).__name__}: {exc}") from None


def _clang_tokens(data: bytes) -> list[tuple[str, str, int, int]]:
    """(clang kind, spelling, start, end) of every token of ``data``, offsets into ``data``."""
    delim = _delimiter(data)
    head = f'const char *kerngen_source = R"{delim}('.encode()
    wrapped = head + data + f'){delim}";\n'.encode()
    with _LOCK:
        index = _index()
        tu = index.parse("kerngen_source.cpp", args=["-x", "c++", "-std=c++17", "-nostdinc", "-fsyntax-only"],  # type: ignore[attr-defined]
                         unsaved_files=[("kerngen_source.cpp", wrapped)], options=0)
        f = tu.get_file("kerngen_source.cpp")
        begin = cindex.SourceLocation.from_offset(tu, f, len(head))
        stop = cindex.SourceLocation.from_offset(tu, f, len(head) + len(data))
        out = []
        for t in tu.get_tokens(extent=cindex.SourceRange.from_locations(begin, stop)):
            ext = t.extent
            out.append((t.kind.name, t.spelling, ext.start.offset - len(head), ext.end.offset - len(head)))
    return out


@functools.lru_cache(maxsize=16)  # a tuning batch compiles one source under many configurations
def lex(source: str) -> Lexed:
    """The tokens of ``source``. Raises :class:`ValueError` (its message says where) for a source
    that is not lexed the same way everywhere, :class:`LexerUnavailable` without libclang."""
    data = source.encode("utf-8", "surrogatepass")
    why = text_problem(data)
    if why:
        raise ValueError(why)
    toks: list[Tok] = []
    pos, logical, prev_code_end = 0, 0, -1
    first = True
    for ckind, spelling, start, end in _clang_tokens(data):
        if start >= len(data):
            break  # the wrapper's own closing tokens
        if end > len(data):
            raise ValueError(f"line {_line(data, start)}: a literal or comment is not closed")
        gap = data[pos:start]
        if not _GAP.match(gap):
            raise ValueError(f"line {_line(data, pos)}: text the lexer skipped "
                             f"({gap.strip()[:20].decode('utf-8', 'replace')!r})")
        if b"\n" in re.sub(rb"\\\r?\n", b"", gap):
            logical += 1
            first = True
        # phase 2 done again: clang removes splices from some spellings (identifiers), not from
        # others (punctuators); a raw string keeps those of its body
        text = _unsplice(spelling)
        kind = _kind(ckind, text)
        if kind == "string" and re.match(r'^(u8|u|U|L)?R"', text):
            q = spelling.index('"')
            text = _unsplice(spelling[:q]) + spelling[q:]
            if _unsplice(text) != text:  # C++ reverts a splice in a raw string; NVRTC splices it
                raise ValueError(f"line {_line(data, start)}: a line continuation inside a raw string is not "
                                 "allowed (compilers disagree on where that string ends)")
        raw = data[start:end]
        if kind not in ("comment", "string", "char"):
            if not _CODE_CHARS.match(raw.replace(b"\\\r\n", b"").replace(b"\\\n", b"")):
                raise ValueError(f"line {_line(data, start)}: only printable ASCII may stand "
                                 f"outside comments and literals (got {raw[:20].decode('utf-8', 'replace')!r})")
            if kind == "punct" and ("'" in text or '"' in text or "\\" in text):
                raise ValueError(f"line {_line(data, start)}: a literal is not closed or is malformed "
                                 f"({text[:20]!r})")
            if kind == "ident" and not _IDENT.match(text):
                raise ValueError(f"line {_line(data, start)}: {text[:40]!r} is not a plain identifier")
            text = _DIGRAPHS.get(text, text)
        elif kind in ("string", "char") and not _closed(text):
            raise ValueError(f"line {_line(data, start)}: a literal is not closed ({text[:20]!r})")
        nbol = kind != "comment" and (prev_code_end < 0 or b"\n" in re.sub(rb"\\\r?\n", b"", data[prev_code_end:start]))
        toks.append(Tok(kind, text, start, end, _line(data, start), logical, first and kind != "comment", nbol))
        if kind != "comment":
            first = False
            prev_code_end = end
        pos = end
    tail = data[pos:]
    if not _GAP.match(tail):
        raise ValueError(f"line {_line(data, pos)}: a literal or comment is not closed")
    return Lexed(data, toks)


def _closed(text: str) -> bool:
    """A string or character literal that ends where it should (raw: ``)delim"``; else the quote,
    a user-defined suffix allowed after it)."""
    m = _ENCODING.match(text)
    if m is None:
        return False
    quote, body = m.group(3), text[m.end() :]
    if m.group(2):  # raw string: R"delim( ... )delim"
        delim, paren, rest = body.partition("(")
        return bool(paren) and len(delim) <= 16 and re.fullmatch(r'[^\s()\\"]*', delim) is not None and \
            re.search(re.escape(")" + delim + '"') + r"[A-Za-z0-9_]*$", rest) is not None
    return re.search(re.escape(quote) + r"[A-Za-z0-9_]*$", body) is not None and len(body) >= 1


__all__ = ["Lexed", "LexerUnavailable", "Tok", "lex", "text_problem"]
