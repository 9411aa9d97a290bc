"""Turning a model's answer into a pydantic model, whatever shape the answer came in.

An endpoint with structured output answers with bare JSON. One without answers in free text,
from which :func:`parse_answer` takes, in order:

1. the whole text as JSON (after dropping ``<think>...</think>`` reasoning);
2. each fenced block: ```` ```json ```` (or ``jsonc``/``json5``/unlabelled) that holds a JSON
   value, ```` ```yaml ```` (or an unlabelled block that starts like a mapping of the model's
   fields) that holds a YAML mapping;
3. the whole text as a bare YAML mapping, when it starts like one (``name: ...``, ``source: |``);
4. the first balanced ``{...}`` (or ``[...]``) that decodes, anywhere in the text.

JSON is read as models write it (:mod:`.answer_forms`): raw newlines in strings, ``//`` and
``/* */`` comments, trailing commas, JSON5. For a kernel spec the CUDA source may come apart from
the JSON (or YAML), in a ```` ```cuda ```` (or ``c``/``cpp``/``cu``) block, with a launch plan that
lacks ``source`` (or says e.g. ``"see above"``, or holds the code broken by an unescaped quote):
the code block is put in as ``source``. A JSON list answered where a model with one list field
is expected (``IdeaList``) is wrapped.

An answer that holds two or more valid, different kernel specs (a first try, then a "fixed"
one): :func:`read_answers` takes the one the text points to ("use the second", "the corrected
version", "ignore the first"), else the first, and gives the others as siblings; each JSON plan
takes the ```` ```cuda ```` block written before it (else the first one).

Anything that still does not validate raises :class:`AnswerError` with one clear line that names
the cause, and a machine-readable :class:`AnswerProblem` (``kind``) with which the caller decides
what to do: ask again with a larger output budget when the answer was cut off (``truncated``:
JSON or a code block still open where the answer ends), show the model its mistake when it was
not valid, and so on (a short prose answer that opens like "I'm sorry, I can't ..." is
``refused``). Lines in messages count the answer's lines. The search records it as an invalid
node and goes on.

An answer is untrusted text: reading it is linear in its size (no regular expression that
backtracks, each character is decoded as JSON a bounded number of times, the pure-Python JSON5
and YAML parsers get bounded pieces only), and whatever it provokes (nesting deeper than a parser
goes, a number of more than 4,300 digits, a lone surrogate ``"\\ud800"`` that no journal could
write, a YAML alias bomb) is an :class:`AnswerError` naming the cause. When the JSON is broken,
that is the error reported, not a fragment of it that happened to decode.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from kerngen.agent.llm.answer_forms import (
    Decoded,
    Fence,
    LineCounter,
    SlowBudget,
    decode_json,
    decode_yaml,
    drop_thinking,
    fences,
    is_jsonish,
    top_level_spans,
    yaml_mapping_start,
)
from kerngen.agent.proposer import Idea
from kerngen.errors import KerngenError

M = TypeVar("M", bound=BaseModel)

_CODE_LANGS = {"cuda", "cu", "c", "cpp", "c++", "cxx", "h", "hpp"}
_JSON_LANGS = {"json", "jsonc", "json5", "javascript", "js", ""}
_YAML_LANGS = {"yaml", "yml"}
_MAX_SHOWN = 200
_MAX_ERRORS_SHOWN = 3  # validation errors named in one message
_REFUSAL_WINDOW = 160  # characters at the start of a prose answer looked at for a refusal
_REFUSAL_MAX = 2000  # a longer prose answer is not taken for a refusal
_REFUSALS = ("i'm sorry", "i am sorry", "i apologize", "i cannot", "i can't", "i can not", "i won't",
             "i will not", "i'm unable", "i am unable", "i'm not able", "i am not able", "as an ai",
             "i must decline", "unable to comply", "cannot assist", "can't assist", "can't help with")


class AnswerProblem(StrEnum):
    """What is wrong with an answer, for a caller that decides what to do about it."""

    empty = "empty"  # nothing (or only <think> reasoning) was answered
    no_json = "no_json"  # prose or code, but no JSON or YAML object
    invalid_json = "invalid_json"  # JSON (or YAML) that does not decode
    truncated = "truncated"  # cut off: the JSON ends with brackets or a string still open
    not_valid = "not_valid"  # decodes, but does not validate as the expected model
    refused = "refused"  # the model declined
    too_large = "too_large"  # longer than any answer is read


class AnswerError(KerngenError):
    """A model's answer could not be read as the expected model. ``str()`` is one line;
    ``text`` is the answer, ``kind`` what is wrong with it."""

    def __init__(self, message: str, text: str = "",
                 kind: AnswerProblem | str = AnswerProblem.not_valid) -> None:
        super().__init__(" ".join(message.splitlines()))  # one line, whatever a caller passes
        self.text = text
        self.kind = AnswerProblem(kind)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a worker, a thread pool): text and kind kept
        return (type(self), (str(self), self.text, self.kind))


class IdeaList(BaseModel):
    """The answer to the ideas prompt: the model's reasoning first (journaled with the answer),
    then the ideas."""

    analysis: str = Field(default="", description="where the time goes and why, before the ideas")
    ideas: list[Idea] = Field(description="distinct optimization ideas, best first")


def parse_answer(text: str | None, model_cls: type[M]) -> M:
    """Read ``text`` as ``model_cls``; raise :class:`AnswerError` if it cannot be done."""
    return read_answers(text, model_cls)[0]


def read_answers(text: str | None, model_cls: type[M]) -> tuple[M, list[M]]:
    """``(chosen, siblings)``: the answer ``text`` holds as ``model_cls`` and, where it holds
    several different valid ones and points to none, the others; :class:`AnswerError` if none."""
    name = model_cls.__name__
    if text is None or not text.strip():
        raise AnswerError(f"empty answer (expected a {name} as JSON)", text or "", AnswerProblem.empty)
    unstripped = drop_thinking(text)
    body = unstripped.strip()
    if not body:
        raise AnswerError(f"the answer holds only <think> reasoning, no {name}", text, AnswerProblem.empty)
    # messages count the answer's lines (after <think> spans): the body starts below its blank lines
    skipped = unstripped.count("\n", 0, len(unstripped) - len(unstripped.lstrip()))
    reader = _Reader(body, model_cls, skipped)
    candidates, problems, embedded = reader.read()
    if not candidates:
        if problems:
            raise _decode_error(problems[0], text)
        raise _nothing_found(body, reader.blocks, name, text)

    first_error = ""
    valid: list[M] = []
    for data, code in candidates[:_MAX_CANDIDATES]:
        data = _adapt(data, model_cls, code)
        try:
            model = model_cls.model_validate(data)
        except ValidationError as exc:
            first_error = first_error or _describe(exc, model_cls)
            continue
        except RecursionError:  # deeper than any model is: the validator gave up
            first_error = first_error or "nested too deeply"
            continue
        if all(model != v for v in valid):
            valid.append(model)
    if valid:
        pick = _pointed(body, reader.blocks, len(valid))
        if pick is not None:
            return valid[pick], []
        return valid[0], valid[1:]
    if embedded and problems:
        # the JSON the model meant is broken; a fragment that decoded is not what it meant
        raise _decode_error(problems[0], text)
    raise AnswerError(f"answer is not a valid {name}: {first_error}", text, AnswerProblem.not_valid)


_MAX_CANDIDATES = 8  # valid answers looked at in one text
_LATER = re.compile(r"\b(?:(?:use|take|pick|prefer|go with)\s+(?:the\s+)?(?:second|last|final|latter|corrected|updated|"
                    r"fixed|revised)|(?:second|final|corrected|updated|revised|fixed)\s+(?:version|spec|kernel|one|"
                    r"answer)|ignore\s+the\s+(?:first|former|previous)|(?:first|previous)\s+(?:one|version|spec|kernel)"
                    r"\s+(?:is|was|has)\s+(?:wrong|broken|buggy|incorrect))\b")
_FIRST = re.compile(r"\b(?:(?:use|take|pick|prefer|go with)\s+(?:the\s+)?(?:first|former)|ignore\s+the\s+"
                    r"(?:second|last|latter))\b")


def _pointed(body: str, blocks: list[Fence], n: int) -> int | None:
    """The index of the answer the prose points to among ``n`` (the last or the first), None
    when it points to none (or to both)."""
    if n < 2:
        return None
    parts, pos = [], 0
    for block in blocks[:64]:  # the words outside the code and JSON blocks
        at = body.find(block.content, pos)
        if at < 0:
            break
        parts.append(body[pos:at])
        pos = at + len(block.content)
    parts.append(body[pos:])
    prose = " ".join(parts).lower()[:20_000]
    later, first = _LATER.search(prose) is not None, _FIRST.search(prose) is not None
    if later != first:
        return n - 1 if later else 0
    return None


class _Reader:
    """The values an answer holds, in the order of the module's docstring, and why the pieces
    that looked like JSON or YAML did not decode."""

    def __init__(self, body: str, model_cls: type[BaseModel], skipped_lines: int) -> None:
        self.body = body
        self.skipped = skipped_lines
        self.fields = set(model_cls.model_fields)
        self.wraps_lists = len(_list_fields(model_cls)) == 1
        self.blocks = fences(body)
        self.code = _code_block(self.blocks)
        self.budget = SlowBudget()
        self.candidates: list[tuple[Any, str | None]] = []  # (value, the code block it takes as its source)
        self.problems: list[Decoded] = []

    def read(self) -> tuple[list[tuple[Any, str | None]], list[Decoded], bool]:
        if self.body[:1] in ("{", "["):
            self._consider(decode_json(self.body, self.budget, code_given=self.code is not None,
                                       first_line=1 + self.skipped))
        code = self.code  # the code block written before a plan (else the first one)
        for block in self.blocks:
            if block.lang in _CODE_LANGS and block.content.strip():
                code = block.content.strip("\n") + "\n"
            content = block.content.strip()
            leading = len(block.content) - len(block.content.lstrip())
            first = self.skipped + block.line + block.content.count("\n", 0, leading)
            if block.lang in _JSON_LANGS and content[:1] in ("{", "["):
                self._consider(decode_json(content, self.budget, code_given=self.code is not None,
                                           first_line=first, at_end=not block.closed), code=code)
            elif block.lang in _YAML_LANGS or (block.lang == "" and yaml_mapping_start(content, self.fields)):
                self._consider(decode_yaml(content, self.budget, first_line=first), mapping=True, code=code)
        if not self.candidates and not self.problems and yaml_mapping_start(self.body, self.fields):
            self._consider(decode_yaml(self.body, self.budget, first_line=1 + self.skipped), mapping=True)
        if self.candidates:
            return self.candidates, self.problems, False
        self._embedded()
        return self.candidates, self.problems, True

    def _consider(self, decoded: Decoded, *, mapping: bool = False, code: str | None = None) -> None:
        if not decoded.ok:
            self.problems.append(decoded)
        elif not mapping or isinstance(decoded.value, dict):
            self.candidates.append((decoded.value, code or self.code))

    def _embedded(self) -> None:
        """Every top-level ``{...}`` or ``[...]`` that decodes to a non-empty object (or array,
        where the model wraps one), objects first; why the JSON-looking others did not decode.

        Only the outermost spans are decoded, each once, so the work is linear in the text. A
        span that does not decode is not searched for smaller ones inside it: a fragment of
        broken JSON is not an answer."""
        spans, unclosed = top_level_spans(self.body)
        lines = LineCounter(self.body)
        found: list[Any] = []
        for start, end in spans:
            jsonish = is_jsonish(self.body, start, end)  # not C code such as "{ int i = 0; }"
            decoded = decode_json(self.body[start:end], self.budget, code_given=self.code is not None,
                                  first_line=self.skipped + lines.line_of(start))
            if not decoded.ok:
                if jsonish:
                    self.problems.append(decoded)
            elif isinstance(decoded.value, dict) and decoded.value:
                found.append(decoded.value)
            elif isinstance(decoded.value, list) and decoded.value and self.wraps_lists:
                found.append(decoded.value)
        if unclosed >= 0:  # JSON that never closes: the answer was cut off inside it
            self.problems.append(decode_json(self.body[unclosed:], self.budget,
                                             first_line=self.skipped + lines.line_of(unclosed)))
        found.sort(key=lambda v: isinstance(v, list))  # objects first
        self.candidates.extend((v, self.code) for v in found)


def _decode_error(problem: Decoded, text: str) -> AnswerError:
    if problem.truncated:
        return AnswerError(problem.error, text, AnswerProblem.truncated)
    return AnswerError(f"invalid {problem.form} in the answer: {problem.error}", text, AnswerProblem.invalid_json)


def _nothing_found(body: str, blocks: list[Fence], name: str, text: str) -> AnswerError:
    if blocks and not blocks[-1].closed and blocks[-1].lang in _CODE_LANGS:
        return AnswerError(f"the answer was cut off inside its ```{blocks[-1].lang} block, before any JSON "
                           f"launch plan (expected a {name})", text, AnswerProblem.truncated)
    refusal = _refusal(body, blocks)
    if refusal:
        return AnswerError(f"the model declined: {refusal!r} (no JSON found, expected a {name})", text,
                           AnswerProblem.refused)
    return AnswerError(f"no JSON found in the answer (expected a {name} in a ```json block)", text,
                       AnswerProblem.no_json)


def _refusal(body: str, blocks: list[Fence]) -> str:
    """The first line of a short prose answer that declines, else ""."""
    if blocks or len(body) > _REFUSAL_MAX:
        return ""
    head = body[:_REFUSAL_WINDOW].lower().replace("\u2019", "'")
    if not any(phrase in head for phrase in _REFUSALS):
        return ""
    first = body.strip().splitlines()[0]
    return first if len(first) <= 120 else first[:117] + "..."


def _code_block(blocks: list[Fence]) -> str | None:
    for block in blocks:
        if block.lang in _CODE_LANGS and block.content.strip():
            return block.content.strip("\n") + "\n"
    return None


def _list_fields(model_cls: type[BaseModel]) -> list[str]:
    return [n for n, f in model_cls.model_fields.items() if getattr(f.annotation, "__origin__", None) is list]


def _adapt(data: Any, model_cls: type[BaseModel], code: str | None) -> Any:
    fields = model_cls.model_fields
    if isinstance(data, list):
        list_fields = _list_fields(model_cls)
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


def _describe(exc: ValidationError, model_cls: type[BaseModel]) -> str:
    """The first few validation errors, each as ``where: why``; an unknown top-level field
    lists the fields the model has (a model that wrote ``launch`` for ``steps`` sees both)."""
    errors = exc.errors()
    parts: list[str] = []
    for err in errors[:_MAX_ERRORS_SHOWN]:
        loc = tuple(err.get("loc", ()))
        where = ".".join(str(p) for p in loc)
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
            if len(loc) == 1:
                msg += f" ({model_cls.__name__} has: {', '.join(model_cls.model_fields)})"
        else:
            msg = str(err.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
        if len(msg) > _MAX_SHOWN:
            msg = msg[:_MAX_SHOWN] + "..."
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


__all__ = ["AnswerError", "AnswerProblem", "IdeaList", "parse_answer", "read_answers"]
