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
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from kerngen.agent.proposer import Idea
from kerngen.harness.errors import KerngenError

M = TypeVar("M", bound=BaseModel)

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
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
    body = _THINK.sub("", text).strip()
    blocks = [(lang.lower(), content) for lang, content in _FENCE.findall(body)]
    code = _code_block(blocks)
    candidates: list[Any] = []
    decode_errors: list[str] = []

    def consider(raw: str) -> None:
        try:
            candidates.append(json.loads(raw, strict=False))
        except json.JSONDecodeError as exc:
            decode_errors.append(f"{exc.msg} at line {exc.lineno} column {exc.colno}")

    if body[:1] in "{[":
        consider(body)
    for lang, content in blocks:
        if lang in _JSON_LANGS and content.strip()[:1] in "{[":
            consider(content.strip())
    if not candidates:
        candidates.extend(_embedded_json(body))
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
    raise AnswerError(f"answer is not a valid {name}: {first_error}", text)


def _code_block(blocks: list[tuple[str, str]]) -> str | None:
    for lang, content in blocks:
        if lang in _CODE_LANGS and content.strip():
            return content.strip("\n") + "\n"
    return None


def _embedded_json(text: str) -> list[Any]:
    """Every top-level JSON object or array that decodes, scanning left to right."""
    decoder = json.JSONDecoder(strict=False)
    found: list[Any] = []
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            if isinstance(value, (dict, list)) and value:
                found.append(value)
            i = end
        else:
            i += 1
    found.sort(key=lambda v: isinstance(v, list))  # objects first
    return found


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


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).replace("\n", " ")
    if len(msg) > _MAX_SHOWN:
        msg = msg[:_MAX_SHOWN] + "..."
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


__all__ = ["AnswerError", "IdeaList", "parse_answer"]
