"""The text forms a model's answer comes in, decoded without trusting them.

:mod:`.answers` decides what an answer means; this module only turns pieces of its text into
Python values, or into one line that says precisely why a piece is not one:

- :func:`decode_json`: JSON as :func:`json.loads` reads it (raw control characters in strings
  allowed: models forget to escape newlines), then the same text with ``//`` and ``/* */``
  comments and trailing commas blanked out (JSONC, what models write most often besides JSON),
  then JSON5 (single quotes, unquoted keys) on a bounded piece. What still fails is said
  precisely: cut off (brackets or a string still open where the text ends), a ``source`` string
  broken by an unescaped ``"`` or ``\\`` in the CUDA code, or the decoder's own message;
- :func:`decode_yaml`: a YAML mapping (``yaml.safe_load`` without aliases, on a bounded piece);
- :func:`fences`, :func:`drop_thinking`, :func:`top_level_spans`: where those pieces are.

Everything here is linear in the text, or bounded: the pure-Python parsers (json5, PyYAML) get at
most :data:`SLOW_MAX_CHARS` characters a piece and :data:`SLOW_BUDGET_CHARS` characters /
:data:`SLOW_BUDGET_CALLS` calls an answer (:class:`SlowBudget`), and every exception they can
raise (``RecursionError`` included) becomes an error line.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import json5
import yaml

SLOW_MAX_CHARS = 64_000  # one piece given to json5 or PyYAML (about 0.3 s of json5; a spec is ~5 kB)
SLOW_BUDGET_CHARS = 256_000  # all pieces of one answer
SLOW_BUDGET_CALLS = 16  # calls of one answer (a 400 kB answer of tiny fenced blocks is not 40,000 calls)
_MAX_SHOWN = 200

_THINK_OPEN = re.compile(r"<think>", re.I)
_THINK_CLOSE = re.compile(r"</think>", re.I)
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_JSONISH = re.compile(r'\{\s*["}]|\[\s*[\[{"\]]')  # how a JSON object or array of them starts
# ... and a JSON5 one ({key: ..., {'key': ...); C code such as "{ int i = 0; }" is neither
_JSON5ISH = re.compile(r"""\s*[\[{]\s*(?:["'}\]\[{]|[A-Za-z_$][A-Za-z0-9_$]*\s*:)""")
_SPECIAL = re.compile(r'["{}\[\]/,]')  # what the JSONC scanner stops at outside strings
_STRING_STOP = re.compile(r'["\\]')  # ... and inside a string
_NOT_NEWLINE = re.compile(r"[^\n]")
_SOURCE_KEY = re.compile(r'"source"\s*:\s*"')
# where a member that follows a broken "source" string starts (or the object closes)
_NEXT_MEMBER = re.compile(r'"\s*(?:,\s*(?P<key>"[A-Za-z_][A-Za-z0-9_]*"\s*:)|(?P<close>\}))')
_YAML_KEY = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*:(?:[ \t]|$)")
_MAX_REPAIRS = 4  # candidate ends of a broken "source" string tried when a code block replaces it


@dataclass
class SlowBudget:
    """What the pure-Python parsers may still read for one answer."""

    chars: int = SLOW_BUDGET_CHARS
    calls: int = SLOW_BUDGET_CALLS

    def take(self, n: int) -> bool:
        if n > SLOW_MAX_CHARS or n > self.chars or self.calls <= 0:
            return False
        self.chars -= n
        self.calls -= 1
        return True


@dataclass
class Decoded:
    """A decoded value, or why the text is not one (``truncated``: it ends too early)."""

    value: Any = None
    error: str = ""
    truncated: bool = False
    broken_source: bool = False
    form: str = "JSON"  # what the text was read as, for the message

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class Fence:
    lang: str
    content: str
    closed: bool
    line: int  # the answer's line on which the content starts


@dataclass
class _Scan:
    """One pass over a JSON-ish text: the text with comments and trailing commas blanked (same
    length, same line breaks, so positions stay valid), and what is open where it ends."""

    relaxed: str
    open_brackets: list[int] = field(default_factory=list)
    in_string: bool = False
    in_comment: bool = False

    @property
    def unclosed(self) -> bool:
        return bool(self.open_brackets) or self.in_string or self.in_comment


# ----- JSON ----------------------------------------------------------------------------------
def decode_json(raw: str, budget: SlowBudget, *, code_given: bool = False, first_line: int = 1,
                at_end: bool = True) -> Decoded:
    """``raw`` as JSON, JSONC or JSON5. ``code_given``: the answer has a CUDA code block, so a
    broken ``source`` string is dropped (the block replaces it) rather than reported.
    ``first_line``: the answer's line on which ``raw`` starts (messages count the answer's lines).
    ``at_end``: ``raw`` runs to the end of the answer, so JSON still open where it ends was cut
    off; in a fenced block the model closed, it was left incomplete (not ``truncated``)."""
    value, error, pos = _loads(raw)
    if not error:
        return _clean(value)
    if pos < 0:  # nested too deeply, too many digits: no other reading helps
        return Decoded(error=error)
    scan = _scan(raw)
    if scan.relaxed != raw:
        value, relaxed_error, relaxed_pos = _loads(scan.relaxed)
        if not relaxed_error:
            return _clean(value)
        if relaxed_pos >= 0:  # the JSONC reading's error is the real one: comments are no error
            error, pos = relaxed_error, relaxed_pos
    if scan.unclosed and (pos >= len(scan.relaxed.rstrip()) or error.startswith("Unterminated string")):
        return Decoded(error=_unclosed(raw, scan, first_line, at_end), truncated=at_end)
    # JSON5 reads what JSON does not outside strings (quotes, keys); an escape JSON refuses inside a
    # string, JSON5 would turn into something else (C's '\0' into a NUL byte): a broken string instead
    if not error.startswith("Invalid \\") and _JSON5ISH.match(scan.relaxed) and budget.take(len(raw)):
        try:
            return _clean(json5.loads(raw))
        except Exception:  # ValueError, RecursionError, MemoryError...: a third-party parser on hostile text
            pass  # json5 did not read it either: json's error is the one to report
    broken = _broken_source(raw, pos)
    if broken is not None:
        if code_given:
            repaired = _without_source(raw, broken[0])
            if repaired is not None:
                return repaired
        line, col = _line_col(raw, broken[1], first_line)
        return Decoded(broken_source=True, error=(
            f"the JSON string `source` is broken at line {line} col {col}: an unescaped \" or \\ inside the "
            "CUDA code; put the code in a ```cuda block and leave `source` out of the JSON"))
    line, col = _line_col(raw, pos, first_line)
    return Decoded(error=f"{error} at line {line} column {col}")


def _loads(raw: str) -> tuple[Any, str, int]:
    """(value, "", 0) or (None, the decoder's message, its position; -1 where none applies)."""
    try:
        return json.loads(raw, strict=False), "", 0
    except json.JSONDecodeError as exc:
        return None, exc.msg, exc.pos
    except RecursionError:
        return None, "nested too deeply", -1
    except ValueError as exc:  # int('9' * 5000): Python's limit on integer digits
        if "digits" in str(exc):
            return None, f"a number has more than {sys.get_int_max_str_digits()} digits", -1
        return None, one_line(exc), -1


def _clean(value: Any) -> Decoded:
    try:
        return Decoded(value=valid_unicode(value))
    except RecursionError:
        return Decoded(error="nested too deeply")


def _scan(raw: str) -> _Scan:
    """Blank ``//`` and ``/* */`` comments and trailing commas outside strings; note the
    brackets and the string still open at the end. Linear: every search starts where the last
    one ended, and string contents are skipped by a regular expression without backtracking."""
    blanks: list[tuple[int, int]] = []
    stack: list[int] = []
    comma = -1  # a comma after which only blanks and comments came so far
    gap_from = 0  # where the text after that comma (comments skipped) starts
    i, n = 0, len(raw)
    while True:
        m = _SPECIAL.search(raw, i)
        if m is None:
            return _Scan(_blanked(raw, blanks), stack)
        j, ch = m.start(), m.group()
        if ch == '"':
            k = j + 1
            while True:
                stop = _STRING_STOP.search(raw, k)
                if stop is None:
                    return _Scan(_blanked(raw, blanks), stack, in_string=True)
                if stop.group() == "\\":
                    k = stop.start() + 2
                    continue
                break
            comma, i = -1, stop.start() + 1
            continue
        if ch == "/" and raw[j + 1:j + 2] in ("/", "*"):
            if raw[j + 1] == "/":
                end = raw.find("\n", j)
                end = n if end < 0 else end
            else:
                end = raw.find("*/", j + 2)
                if end < 0:
                    blanks.append((j, n))
                    return _Scan(_blanked(raw, blanks), stack, in_comment=True)
                end += 2
            blanks.append((j, end))
            if comma >= 0:
                if raw[gap_from:j].strip():
                    comma = -1
                else:
                    gap_from = end
            i = end
            continue
        if ch in "}]" and comma >= 0 and not raw[gap_from:j].strip():
            blanks.append((comma, comma + 1))  # a trailing comma
        if ch in "{[":
            stack.append(j)
        elif ch in "}]" and stack:
            stack.pop()
        comma, gap_from = (j, j + 1) if ch == "," else (-1, 0)
        i = j + 1


def _blanked(raw: str, blanks: list[tuple[int, int]]) -> str:
    if not blanks:
        return raw
    parts: list[str] = []
    last = 0
    for start, end in sorted(blanks):
        parts.append(raw[last:start])
        parts.append(_NOT_NEWLINE.sub(" ", raw[start:end]))
        last = end
    parts.append(raw[last:])
    return "".join(parts)


def _unclosed(raw: str, scan: _Scan, first_line: int, at_end: bool) -> str:
    line, _ = _line_col(raw, len(raw.rstrip()), first_line)
    if scan.in_string:
        inside = "inside a string"
    elif scan.in_comment:
        inside = "inside a /* comment"
    else:
        count = len(scan.open_brackets)
        inside = f"with {count} bracket{'s' if count > 1 else ''} still open"
    if at_end:
        return f"the answer was cut off mid-JSON: it ends at line {line} {inside}"
    return f"the JSON ends at line {line} {inside} (the block closes before the JSON does)"


def _broken_source(raw: str, pos: int) -> tuple[int, int] | None:
    """(where the ``source`` member starts, where its string breaks) if the decoder's error at
    ``pos`` comes from that string: an invalid escape inside it (``\\0``, ``\\%``, a ``\\`` at a
    line's end), or a ``"`` that ended it early (the error is the first thing after it)."""
    for count, m in enumerate(_SOURCE_KEY.finditer(raw, 0, max(pos, 0) + 1)):
        if count >= _MAX_REPAIRS:
            break
        k = m.end()
        while True:
            stop = _STRING_STOP.search(raw, k)
            if stop is None:
                return None
            if stop.group() == "\\":
                k = stop.start() + 2
                continue
            break
        end = stop.start()  # the quote that ends the string as JSON reads it
        if m.end() <= pos <= end:
            return m.start(), pos
        if end < pos and not raw[end + 1:pos].strip():
            return m.start(), end
    return None


def _without_source(raw: str, member: int) -> Decoded | None:
    """``raw`` with its broken ``source`` member cut out, decoded; ``None`` if no cut reads."""
    for count, m in enumerate(_NEXT_MEMBER.finditer(raw, member + len('"source"'))):
        if count >= _MAX_REPAIRS:
            break
        end = m.start("key") if m.group("key") else m.start("close")
        text = raw[:member] + raw[end:]
        value, error, _ = _loads(text)
        if error:
            value, error, _ = _loads(_scan(text).relaxed)
        if not error and isinstance(value, dict):
            return _clean(value)
    return None


def _line_col(raw: str, pos: int, first_line: int = 1) -> tuple[int, int]:
    pos = max(0, min(pos, len(raw)))
    return raw.count("\n", 0, pos) + first_line, pos - (raw.rfind("\n", 0, pos) + 1) + 1


def valid_unicode(value: Any) -> Any:
    """``value`` with lone surrogates (JSON ``"\\ud800"``) replaced in every string: text that
    cannot be encoded as UTF-8 would break the journal that records it."""
    if isinstance(value, str):
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode()
    if isinstance(value, list):
        return [valid_unicode(v) for v in value]
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    return value


# ----- YAML ----------------------------------------------------------------------------------
class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without anchors and aliases: ten nested aliases of ten make 10**10
    nodes for the validator to walk (a "billion laughs"); no spec needs one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not accepted", event.start_mark)
        return super().compose_node(parent, index)


def decode_yaml(raw: str, budget: SlowBudget, *, first_line: int = 1) -> Decoded:
    if not budget.take(len(raw)):
        return Decoded(form="YAML", error=f"the YAML is {len(raw):,} characters; at most {SLOW_MAX_CHARS:,} "
                       "are read (or the answer holds too many YAML blocks)")
    try:
        value = yaml.load(raw, Loader=_NoAliasLoader)  # a SafeLoader, aliases refused
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + first_line} column {mark.column + 1}" if mark is not None else ""
        return Decoded(form="YAML", error=f"{one_line(exc.problem or exc.context or 'unreadable')}{where}")
    except RecursionError:
        return Decoded(form="YAML", error="nested too deeply")
    except Exception as exc:  # PyYAML's constructors raise ValueError, TypeError, ... on hostile text
        return Decoded(form="YAML", error=one_line(exc))
    decoded = _clean(value)
    decoded.form = "YAML"
    return decoded


def yaml_mapping_start(text: str, keys: set[str]) -> bool:
    """Whether ``text`` starts like a YAML mapping of one of ``keys`` (``source: |``): its first
    line that is not blank, a comment or ``---``. Prose ("Note: ...") does not."""
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end]
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped != "---":
            m = _YAML_KEY.match(line)
            return m is not None and m.group(1) in keys
        pos = end + 1
    return False


# ----- where the pieces are ------------------------------------------------------------------
def drop_thinking(text: str) -> str:
    """``text`` without its ``<think>...</think>`` spans (an unclosed one is kept). Linear."""
    out: list[str] = []
    pos = 0
    while True:
        start = _THINK_OPEN.search(text, pos)
        if start is None:
            break
        end = _THINK_CLOSE.search(text, start.end())
        if end is None:
            break
        out.append(text[pos:start.start()])
        pos = end.end()
    out.append(text[pos:])
    return "".join(out)


def fences(text: str) -> list[Fence]:
    """Each ```-fenced block; an unclosed last block runs to the end (``closed`` is False).
    Linear: every search starts where the previous one ended."""
    blocks: list[Fence] = []
    pos = 0
    lines = LineCounter(text)
    while True:
        start = text.find("```", pos)
        if start < 0:
            break
        newline = text.find("\n", start + 3)
        if newline < 0:
            break  # no line after the opening fence: no block
        lang = _LANG.match(text, start + 3, newline)
        end = text.find("```", newline + 1)
        stop = len(text) if end < 0 else end
        blocks.append(Fence((lang.group(1) if lang else "").lower(), text[newline + 1:stop], end >= 0,
                            lines.line_of(newline + 1)))
        if end < 0:
            break
        pos = end + 3
    return blocks


class LineCounter:
    """Line numbers of increasing positions in one text, counted once over the whole text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1

    def line_of(self, pos: int) -> int:
        if pos < self.pos:  # not increasing: count from the start (callers ask in order)
            self.pos, self.line = 0, 1
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def top_level_spans(text: str) -> tuple[list[tuple[int, int]], int]:
    """(start, end) of each outermost balanced bracket pair, in order, and where a JSON-looking
    bracket opened and never closed starts (-1 if none): the text was cut off inside it, and
    the spans closed inside it are fragments. Quotes count only inside brackets (prose may hold
    an apostrophe or a lone quote)."""
    closing = {"}": "{", "]": "["}
    stack: list[tuple[str, int]] = []
    pairs: list[tuple[int, int]] = []
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch in "{[":
            stack.append((ch, i))
        elif ch in "}]":
            if stack and stack[-1][0] == closing[ch]:
                _, start = stack.pop()
                pairs.append((start, i + 1))
        elif ch == '"' and stack:
            in_string = True
    unclosed = next((start for _, start in stack if is_jsonish(text, start)), -1)
    # pairs close inner-first: keep those not inside a later (enclosing) pair
    spans: list[tuple[int, int]] = []
    for start, end in sorted(pairs):
        if spans and start < spans[-1][1]:
            continue  # inside the previous outermost span
        if 0 <= unclosed < start:
            break  # inside the bracket that never closed
        spans.append((start, end))
    return spans, unclosed


def is_jsonish(text: str, start: int, end: int | None = None) -> bool:
    """Whether a bracket at ``start`` opens JSON rather than C code such as ``{ int i = 0; }``."""
    return _JSONISH.match(text, start, len(text) if end is None else end) is not None


def one_line(exc: object) -> str:
    lines = str(exc).splitlines()
    return lines[0][:_MAX_SHOWN] if lines else type(exc).__name__


__all__ = [
    "Decoded", "Fence", "LineCounter", "SlowBudget", "decode_json", "decode_yaml", "drop_thinking", "fences",
    "is_jsonish", "one_line", "top_level_spans", "valid_unicode", "yaml_mapping_start",
]
