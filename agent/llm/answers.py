"""Turning a model's answer into a pydantic model, whatever shape the answer came in.

An endpoint with structured output answers with bare JSON. One without answers in free text,
from which :func:`parse_answer` takes, in order:

1. the whole text as JSON (after dropping ``<think>...</think>`` reasoning);
2. each fenced block (```` ```json ````, or unlabelled) that holds a JSON value;
3. the first balanced ``{...}`` (or ``[...]``) that decodes, anywhere in the text.

For a kernel spec the CUDA source may come apart from the JSON, in a ```` ```cuda ```` (or
``c``/``cpp``/``cu``) block, with a JSON launch plan that lacks ``source`` (or says e.g.
``"see above"``): the code block is put in as ``source``. A JSON list answered where a model with
one list field is expected (``IdeaList``) is wrapped. Anything that still does not validate
raises :class:`AnswerError` with one clear line: the search records it as an invalid node and
goes on.

An answer is untrusted text: reading it is linear in its size (no regular expression that
backtracks, each character is decoded as JSON at most a bounded number of times), and whatever it
provokes (nesting deeper than the JSON parser goes, a number of more than 4,300 digits, a lone
surrogate ``"\\ud800"`` that no journal could write) is an :class:`AnswerError` naming the cause.
When the JSON is broken, that is the error reported, not a fragment of it that happened to decode.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from kerngen.agent.proposer import Idea
from kerngen.errors import KerngenError

M = TypeVar("M", bound=BaseModel)

_THINK_OPEN = re.compile(r"<think>", re.I)
_THINK_CLOSE = re.compile(r"</think>", re.I)
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_JSONISH = re.compile(r'\{\s*["}]|\[\s*[\[{"\]]')  # how a JSON object or array of them starts
_CODE_LANGS = {"cuda", "cu", "c", "cpp", "c++", "cxx", "h", "hpp"}
_JSON_LANGS = {"json", "jsonc", "json5", ""}
_MAX_SHOWN = 200


class AnswerError(KerngenError):
    """A model's answer could not be read as the expected model. ``str()`` is one line."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text


class IdeaList(BaseModel):
    """The answer to the ideas prompt."""

    ideas: list[Idea] = Field(description="distinct optimization ideas, best first")


def parse_answer(text: str | None, model_cls: type[M]) -> M:
    """Read ``text`` as ``model_cls``; raise :class:`AnswerError` if it cannot be done."""
    name = model_cls.__name__
    if text is None or not text.strip():
        raise AnswerError(f"empty answer (expected a {name} as JSON)", text or "")
    body = _drop_thinking(text).strip()
    blocks = _fences(body)
    code = _code_block(blocks)
    candidates: list[Any] = []
    decode_errors: list[str] = []

    def consider(raw: str) -> None:
        value, error = _decode(raw)
        if error:
            decode_errors.append(error)
        else:
            candidates.append(value)

    if body[:1] in ("{", "["):
        consider(body)
    for lang, content in blocks:
        if lang in _JSON_LANGS and content.strip()[:1] in ("{", "["):
            consider(content.strip())
    embedded = False
    if not candidates:
        found, errors = _embedded_json(body)
        candidates.extend(found)
        decode_errors.extend(errors)
        embedded = True
    if not candidates:
        if decode_errors:
            raise AnswerError(f"invalid JSON in the answer: {decode_errors[0]}", text)
        raise AnswerError(f"no JSON found in the answer (expected a {name} in a ```json block)", text)

    first_error = ""
    for data in candidates:
        data = _adapt(data, model_cls, code)
        try:
            return model_cls.model_validate(data)
        except ValidationError as exc:
            first_error = first_error or _describe(exc)
        except RecursionError:  # deeper than any model is: the validator gave up
            first_error = first_error or "nested too deeply"
    if embedded and decode_errors:
        # the JSON the model meant is broken; a fragment that decoded is not what it meant
        raise AnswerError(f"invalid JSON in the answer: {decode_errors[0]}", text)
    raise AnswerError(f"answer is not a valid {name}: {first_error}", text)


def _decode(raw: str) -> tuple[Any, str]:
    """(value, "") or (None, why it is not JSON)."""
    try:
        return _valid_unicode(json.loads(raw, strict=False)), ""
    except json.JSONDecodeError as exc:
        msg = exc.msg
        if raw[exc.pos:exc.pos + 1] in ("}", "]") and raw[:exc.pos].rstrip().endswith(","):
            msg = f"trailing comma before {raw[exc.pos]!r}"  # what Python 3.11 calls "Expecting ..."
        return None, f"{msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:  # int('9' * 5000): Python's limit on integer digits
        if "digits" in str(exc):
            return None, f"a number has more than {sys.get_int_max_str_digits()} digits"
        return None, _one_line(exc)


def _valid_unicode(value: Any) -> Any:
    """``value`` with lone surrogates (JSON ``"\\ud800"``) replaced in every string: text that
    cannot be encoded as UTF-8 would break the journal that records it."""
    if isinstance(value, str):
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode()
    if isinstance(value, list):
        return [_valid_unicode(v) for v in value]
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    return value


def _drop_thinking(text: str) -> str:
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


def _fences(text: str) -> list[tuple[str, str]]:
    """(language, content) of each ```-fenced block; an unclosed last block runs to the end.
    Linear: every search starts where the previous one ended."""
    blocks: list[tuple[str, str]] = []
    pos = 0
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
        blocks.append(((lang.group(1) if lang else "").lower(), text[newline + 1:stop]))
        if end < 0:
            break
        pos = end + 3
    return blocks


def _code_block(blocks: list[tuple[str, str]]) -> str | None:
    for lang, content in blocks:
        if lang in _CODE_LANGS and content.strip():
            return content.strip("\n") + "\n"
    return None


def _embedded_json(text: str) -> tuple[list[Any], list[str]]:
    """Every top-level ``{...}`` or ``[...]`` of the text that decodes to a non-empty object or
    array (objects first), and why the others did not decode.

    One pass pairs the brackets (skipping JSON strings inside them); only the outermost spans
    are decoded, each once, so the work is linear in the text. A span that does not decode is
    not searched for smaller ones inside it: a fragment of broken JSON is not an answer."""
    found: list[Any] = []
    errors: list[str] = []
    for start, end in _top_level_spans(text):
        value, error = _decode(text[start:end])
        if error:
            if _JSONISH.match(text, start, end):  # not C code such as "{ int i = 0; }"
                errors.append(error)
        elif isinstance(value, (dict, list)) and value:
            found.append(value)
    found.sort(key=lambda v: isinstance(v, list))  # objects first
    return found, errors


def _top_level_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each outermost balanced bracket pair, in order. Quotes count only inside
    brackets (prose may hold an apostrophe or a lone quote); an opening bracket never closed
    leaves the spans closed inside it as the outermost ones."""
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
    # pairs close inner-first: keep those not inside a later (enclosing) pair
    spans: list[tuple[int, int]] = []
    for start, end in sorted(pairs):
        if spans and start < spans[-1][1]:
            continue  # inside the previous outermost span
        spans.append((start, end))
    return spans


def _adapt(data: Any, model_cls: type[BaseModel], code: str | None) -> Any:
    fields = model_cls.model_fields
    if isinstance(data, list):
        list_fields = [n for n, f in fields.items() if getattr(f.annotation, "__origin__", None) is list]
        if len(list_fields) == 1:
            data = {list_fields[0]: data}
    if isinstance(data, dict) and code is not None:
        if "source" in fields and _needs_source(data):
            data = {**data, "source": code}
        elif "spec" in fields and isinstance(data.get("spec"), dict) and _needs_source(data["spec"]):
            data = {**data, "spec": {**data["spec"], "source": code}}
    return data


def _needs_source(data: dict) -> bool:
    source = data.get("source")
    return not isinstance(source, str) or "__global__" not in source


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:_MAX_SHOWN] if lines else type(exc).__name__


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
    if len(msg) > _MAX_SHOWN:
        msg = msg[:_MAX_SHOWN] + "..."
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


__all__ = ["AnswerError", "IdeaList", "parse_answer"]
