"""What an endpoint sends back, read as untrusted data: the JSON schema a request asks for,
a chat completion read field by field, errors classified and turned into one scrubbed line.

Pure functions of :mod:`kerngen.agent.llm.client` (which drives the requests)."""

from __future__ import annotations

import email.utils
import re
import time
from typing import Any, Sequence

import openai
from pydantic import BaseModel

from kerngen.agent.llm.config import LLMConfig, scrub
from kerngen.agent.llm.cost import BudgetSpent, CostSpent, NotSent
from kerngen.agent.llm.transport import MAX_BODY_BYTES, BodyTooLarge
from kerngen.errors import LLMError
from kerngen.redact import redact
from kerngen.text import sane_count

_MAX_ERROR_CHARS = 300
FATAL_KINDS = frozenset({"auth", "not_found", "no_endpoint", "bad_request"})
_CONTEXT_LENGTH = re.compile(r"context.?length|maximum context|too many tokens|context window|prompt is too long", re.I)
_MODEL_MISSING = re.compile(r"model.*(not found|does not exist|not exist|unknown)|(unknown|invalid) model", re.I)


class BadReply(Exception):
    """The endpoint answered 200 with something that is not a readable chat completion."""


def too_large(exc: BaseException | None) -> BodyTooLarge | None:
    """The refusal of a body for its size that ``exc`` is or wraps (the SDK turns transport
    errors into connection errors), None if it is none: no retry would read such a body."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, BodyTooLarge):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


Message = dict[str, Any]


def response_schema(model_cls: type[BaseModel], schema: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """The JSON schema to send (``schema``, else the model's own), and whether it can be sent as
    ``strict``.

    Strict mode wants every object closed (``additionalProperties: false``) with all its
    properties required, and no ``default``/``oneOf``. A schema with an open dict (a free-form
    mapping such as ``KernelSpec.tunables``) cannot be; it goes as is, non-strict.
    """
    schema = model_cls.model_json_schema() if schema is None else schema
    strict = _make_strict(schema)
    return (strict, True) if strict is not None else (schema, False)


def _make_strict(node: Any) -> Any:
    if isinstance(node, list):
        out = [_make_strict(v) for v in node]
        return None if any(v is None for v in out) else out
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            continue
        if key == "oneOf":
            key = "anyOf"
        if key == "additionalProperties" and value not in (False,):
            return None
        if key in ("properties", "$defs"):
            converted = {k: _make_strict(v) for k, v in value.items()}
            if any(v is None for v in converted.values()):
                return None
            out[key] = converted
            continue
        converted_value = _make_strict(value)
        if converted_value is None and value is not None:
            return None
        out[key] = converted_value
    if out.get("type") == "object" or "properties" in out:
        out["additionalProperties"] = False
        out["required"] = list(out.get("properties", {}))
    return out


def transient(exc: BaseException) -> bool:
    if too_large(exc) is not None:
        return False
    if isinstance(exc, (openai.APIConnectionError, BadReply)):  # timeouts included
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def retry_after(exc: BaseException | None) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1e3)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when is not None else None


def error_text(exc: openai.APIError) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    if isinstance(body, str) and body.strip():
        return body
    return getattr(exc, "message", "") or str(exc)


def root_cause(exc: BaseException) -> str:
    seen = set()
    cur: BaseException | None = exc
    last = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        last = cur
        cur = cur.__cause__ or cur.__context__
    text = str(last)
    if "refused" in text.lower():
        return "connection refused"
    if re.search(r"name or service not known|nodename nor servname|getaddrinfo|name resolution", text, re.I):
        return "host name not found"
    return one_line(text) or "connection error"


def describe(exc: BaseException | None, config: LLMConfig) -> str:
    """One scrubbed line for any SDK error."""
    if exc is None:
        return "unknown error"
    if isinstance(exc, (BadReply, BudgetSpent, CostSpent, NotSent)):
        return one_line(redact(scrub(str(exc), config.api_key)))
    refused = too_large(exc)
    if refused is not None:
        return one_line(str(refused)) or f"the reply is larger than {MAX_BODY_BYTES:,} bytes: refused"
    if isinstance(exc, openai.APITimeoutError):
        waited = getattr(exc, "kerngen_cut_by_search", None)  # set by the client: the search's deadline came first
        if waited is not None:
            return (f"cut after {waited:.1f}s, unanswered, at the end of the search's time budget (--minutes), "
                    f"before --llm-timeout's {config.timeout_s:g}s")
        return f"timed out after {config.timeout_s:g}s (--llm-timeout: the most one request may take)"
    if isinstance(exc, openai.APIConnectionError):
        return scrub(root_cause(exc), config.api_key)
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {one_line(scrub(error_text(exc), config.api_key))}"
    return one_line(scrub(str(exc), config.api_key)) or type(exc).__name__

def classify(exc: BaseException) -> str:
    """The :class:`LLMError` kind of an error of a request (see the client's docstring)."""
    if isinstance(exc, BadReply):
        return "bad_reply"
    if isinstance(exc, BudgetSpent):
        return "budget"
    if isinstance(exc, CostSpent):
        return "cost"
    if isinstance(exc, NotSent):
        return exc.kind
    if too_large(exc) is not None:
        return "too_large"
    status = getattr(exc, "status_code", None)
    text = error_text(exc) if isinstance(exc, openai.APIStatusError) else ""
    code = str(getattr(exc, "code", "") or "")
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return "auth"
    if isinstance(exc, openai.NotFoundError) or code == "model_not_found":
        return "not_found" if (code == "model_not_found" or "model" in text.lower()) else "no_endpoint"
    if status in (400, 413, 422):
        if code == "context_length_exceeded" or _CONTEXT_LENGTH.search(text):
            return "context_length"
        if _MODEL_MISSING.search(text):
            return "not_found"
        return "bad_request"
    if isinstance(exc, openai.APITimeoutError):
        return "gave_up"
    if isinstance(exc, openai.APIConnectionError):
        return "unreachable"
    return "gave_up" if transient(exc) else "bad_request"

def to_llm_error(exc: BaseException, attempts: int, config: LLMConfig) -> LLMError:
    """The one-line, scrubbed :class:`LLMError` of a request's error, built anew (not chained)."""
    cfg = config
    what = describe(exc, config)
    model, url = cfg.model, cfg.base_url
    status = getattr(exc, "status_code", None)
    kind = classify(exc)
    msg = {
        "auth": f"authentication failed at {url} (check OPENAI_API_KEY): {what}",
        "not_found": f"model {model!r} not found at {url}: {what}",
        "no_endpoint": f"{url}/chat/completions not found (check base_url; it usually ends in /v1): {what}",
        "context_length": f"prompt too long for model {model!r} (context length exceeded): {what}",
        "bad_request": f"bad request to {url}: {what}",
        "unreachable": f"cannot reach {url}: {what}",
        "gave_up": (f"no answer from {url}: {what}" if hasattr(exc, "kerngen_cut_by_search")
                    else f"LLM endpoint {url} failing: {what}"),
        "bad_reply": what if what.startswith(url) else f"{url} sent a malformed reply: {what}",
        "too_large": f"{url} sent a reply too large to read: {what}",
        "budget": what,
        "cost": what,
        "deadline": what,
        "interrupted": what,
    }[kind]
    if transient(exc) and attempts > 1:
        msg += f" (after {attempts} attempts)"
    err = LLMError(one_line(redact(scrub(msg, cfg.api_key)), limit=2 * _MAX_ERROR_CHARS))
    err.kind = kind  # type: ignore[attr-defined]
    err.fatal = kind in FATAL_KINDS  # type: ignore[attr-defined]
    err.status = status  # type: ignore[attr-defined]
    err.attempts = attempts  # type: ignore[attr-defined]
    err.cause = cause_label(kind, status, exc)  # type: ignore[attr-defined]
    return err


def cause_label(kind: str, status: int | None, exc: BaseException | None = None) -> str:
    """A few words for why a call got no answer, as "no answer" counts list them (``HTTP 429``,
    ``timeout``, ``context length``...)."""
    if isinstance(exc, openai.APITimeoutError):
        return "timeout (--minutes)" if hasattr(exc, "kerngen_cut_by_search") else "timeout"
    if kind == "gave_up" and status:
        return f"HTTP {status}"
    return {"auth": "authentication", "not_found": "model not found", "no_endpoint": "no such endpoint",
            "context_length": "context length", "bad_request": f"HTTP {status or 400} bad request",
            "unreachable": "unreachable", "gave_up": "endpoint failing", "bad_reply": "malformed reply",
            "too_large": "reply too large", "budget": "request budget", "cost": "cost budget",
            "deadline": "time budget", "interrupted": "interrupted"}.get(kind, kind)


def redacted_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages as they may be sent and recorded: every text redacted (no secret of the
    environment, no API key), whatever a prompt quoted (a compile log, a problem file)."""
    out: list[Message] = []
    for m in messages:
        out.append({k: redact(v) if isinstance(v, str) else v for k, v in dict(m).items()})
    return out


def redact_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string, keys included, redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        return {redact(str(k)): redact_json(v) for k, v in value.items()}
    return value


class Reply(BaseModel):
    """What is read of a chat completion, every field checked."""

    text: str = ""
    refusal: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, read from the endpoint's prompt cache
    reasoning_tokens: int = 0  # of completion_tokens, spent thinking
    channel: str = "content"  # where ``text`` was read: "content", or "reasoning" when the content was empty


def read_reply(response: Any, base_url: str) -> Reply:
    """The first choice's text, refusal, finish reason and token counts of ``response`` (the
    SDK's object, built without validation from the endpoint's JSON). :class:`BadReply` when it
    is no chat completion, has no ``choices`` or a field has the wrong type; a missing usage or
    finish reason is not an error (some servers leave them out), an empty ``choices`` list is an
    empty answer."""
    choices = getattr(response, "choices", None)
    if not hasattr(response, "choices") or isinstance(response, (str, bytes, dict, list)) or response is None:
        raise BadReply(f"{base_url} did not answer like a chat-completions API "
                        "(check base_url; it usually ends in /v1)")
    if choices is None:
        raise BadReply("the reply has no 'choices'")
    if not isinstance(choices, list):
        raise BadReply(f"'choices' is of type {type(choices).__name__}, not a list")
    reply = Reply()
    if choices:
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise BadReply(f"'choices[0]' has no message (it is of type {type(choice).__name__})")
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            raise BadReply(f"'content' is of type {type(content).__name__}, not a string")
        refusal = getattr(message, "refusal", None)
        finish = getattr(choice, "finish_reason", None)
        reply.text = content or ""
        if not reply.text.strip():  # a reasoning model that answered only in its reasoning channel
            thought = _field(message, "reasoning_content") or _field(message, "reasoning")
            if isinstance(thought, str) and thought.strip():
                reply.text, reply.channel = thought, "reasoning"
        reply.refusal = refusal if isinstance(refusal, str) else ""
        reply.finish_reason = finish if isinstance(finish, str) else ""
    usage = getattr(response, "usage", None)
    reply.prompt_tokens = sane_count(getattr(usage, "prompt_tokens", 0))
    reply.completion_tokens = sane_count(getattr(usage, "completion_tokens", 0))
    # OpenAI (and vLLM, OpenRouter, ...) nest the details; DeepSeek reports its cache hits flat
    cached = sane_count(_field(_field(usage, "prompt_tokens_details"), "cached_tokens"))
    cached = cached or sane_count(_field(usage, "prompt_cache_hit_tokens"))
    reply.cached_tokens = min(cached, reply.prompt_tokens) if reply.prompt_tokens else cached
    reply.reasoning_tokens = sane_count(_field(_field(usage, "completion_tokens_details"), "reasoning_tokens"))
    return reply


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` of an SDK object or ``obj[name]`` of a dict (a detail the SDK did not type
    stays a dict), None when absent."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)



def one_line(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
