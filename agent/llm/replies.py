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

from kerngen.redact import redact

_MAX_ERROR_CHARS = 300


class BadReply(Exception):
    """The endpoint answered 200 with something that is not a readable chat completion."""
Message = dict[str, Any]


def response_schema(model_cls: type[BaseModel]) -> tuple[dict[str, Any], bool]:
    """The JSON schema to send, and whether it can be sent as ``strict``.

    Strict mode wants every object closed (``additionalProperties: false``) with all its
    properties required, and no ``default``/``oneOf``. A schema with an open dict (a free-form
    mapping such as ``KernelSpec.tunables``) cannot be; it goes as is, non-strict.
    """
    schema = model_cls.model_json_schema()
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


def redacted_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages as they may be sent and recorded: every text redacted (no secret of the
    environment, no API key), whatever a prompt quoted (a compile log, a problem file)."""
    out: list[Message] = []
    for m in messages:
        out.append({k: redact(v) if isinstance(v, str) else v for k, v in dict(m).items()})
    return out


class Reply(BaseModel):
    """What is read of a chat completion, every field checked."""

    text: str = ""
    refusal: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0


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
        reply.refusal = refusal if isinstance(refusal, str) else ""
        reply.finish_reason = finish if isinstance(finish, str) else ""
    usage = getattr(response, "usage", None)
    reply.prompt_tokens = _count(getattr(usage, "prompt_tokens", 0))
    reply.completion_tokens = _count(getattr(usage, "completion_tokens", 0))
    return reply


def _count(value: Any) -> int:
    """A token count as reported, or 0 when it is not a sane one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**40 else 0


def one_line(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
