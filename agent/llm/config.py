"""How to reach an OpenAI-compatible chat-completions endpoint.

The key lives in a :class:`~pydantic.SecretStr` and never leaves it except into the SDK's
``Authorization`` header: it is not in ``repr``, ``model_dump`` (shown as ``**********``), logs,
journaled calls or error messages (:func:`scrub` removes it from any text that comes back).

No key: a remote endpoint needs one, and :meth:`LLMConfig.from_env` raises
``LLMError("no API key: set OPENAI_API_KEY")`` without it. A local server (vLLM, llama.cpp,
Ollama, SGLang on ``localhost`` / ``127.0.0.1`` / ``::1``) usually takes none: for a loopback
``base_url`` the placeholder key ``EMPTY`` (the vLLM convention) is used, and anywhere else
``api_key="EMPTY"`` may be passed explicitly to say "this endpoint needs no key".
"""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from kerngen.errors import LLMError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
NO_KEY = "EMPTY"  # the placeholder key of servers that need none
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
MAX_EXTRA_BODY_CHARS = 16_384  # extra request fields are knobs, not payloads: a bound keeps a typo'd file out
# what identifies the request: an extra field must not swap the model, the prompt, or turn the one
# JSON completion the client reads into a stream
_RESERVED_FIELDS = {"model", "messages", "stream"}
# fields the client sets from a dedicated knob (and changes itself: the cut-off retry raises the
# output budget, the structured-output fallback drops response_format): one way to set each
_DEDICATED_FIELDS = {
    "max_completion_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning_effort",
    "response_format": "structured",
    "temperature": "temperature",
}
_EFFORT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
MAX_COST_NEEDS_PRICES = "--max-cost needs --price-in and --price-out"


class LLMConfig(BaseModel):
    """Endpoint, model and the knobs of every call (timeouts, retries, prices)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    base_url: str = DEFAULT_BASE_URL
    api_key: SecretStr
    max_concurrency: int = Field(default=4, ge=1, description="requests in flight at once, over all threads")
    timeout_s: float = Field(default=120.0, gt=0, description="per HTTP request")
    max_retries: int = Field(default=6, ge=0, description="retries after the first attempt (transient errors)")
    temperature: float | None = Field(default=None, description="None: the endpoint's default (reasoning models want it)")
    max_output_tokens: int | None = Field(default=None, ge=1, description="sent as max_completion_tokens when set")
    max_output_tokens_cap: int = Field(default=65_536, ge=1,
                                       description="the most output tokens the retry of a cut-off answer asks for")
    reasoning_effort: str | None = Field(default=None, description="sent as reasoning_effort: low, medium, high, ...")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="extra request fields merged into every request (JSON)")
    price_in_per_mtok: float | None = Field(default=None, ge=0, description="USD per million prompt tokens")
    price_cached_in_per_mtok: float | None = Field(
        default=None, ge=0, description="USD per million cached prompt tokens (None: the input price)")
    price_out_per_mtok: float | None = Field(default=None, ge=0, description="USD per million completion tokens")
    max_cost_usd: float | None = Field(default=None, ge=0, description="no request is sent past this spend (USD)")
    structured: bool = Field(default=True, description="ask for JSON-schema structured output (falls back if refused)")
    backoff_base_s: float = Field(default=1.0, ge=0, description="first backoff; doubles each retry, jittered")
    backoff_max_s: float = Field(default=60.0, ge=0)
    retry_after_max_s: float = Field(default=120.0, ge=0, description="cap on a server's Retry-After")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url {value!r} is not an http(s) URL")
        return value

    @field_validator("reasoning_effort")
    @classmethod
    def _reasoning_effort(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().lower()
        if not _EFFORT.match(value):  # a word, as every provider spells it ("low", "minimal", "xhigh")
            raise ValueError(f"reasoning_effort {value[:40]!r} is not a word such as low, medium or high")
        return value

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in _RESERVED_FIELDS:
                raise ValueError(f"extra_body may not set {key!r}: the client sets it")
            if key in _DEDICATED_FIELDS:
                raise ValueError(f"extra_body may not set {key!r}: use the {_DEDICATED_FIELDS[key]} setting")
        try:  # the SDK sends it as JSON: anything else would fail at the first request, not here
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"extra_body is not JSON-serialisable: {str(exc)[:120]}") from None
        if len(text) > MAX_EXTRA_BODY_CHARS:
            raise ValueError(f"extra_body is {len(text)} characters of JSON (at most {MAX_EXTRA_BODY_CHARS})")
        return json.loads(text)  # a plain copy: nothing mutable is shared with the caller

    @model_validator(mode="after")
    def _checks(self) -> "LLMConfig":
        if self.max_cost_usd is not None and (self.price_in_per_mtok is None or self.price_out_per_mtok is None):
            raise ValueError(MAX_COST_NEEDS_PRICES)
        key = self.api_key.get_secret_value()
        if key and key != NO_KEY and len(key) >= 8 and key in json.dumps(self.extra_body):
            raise ValueError("extra_body holds the API key: it would be sent in every request body")
        return self

    @property
    def is_local(self) -> bool:
        return is_loopback(self.base_url)

    @property
    def has_prices(self) -> bool:
        return self.price_in_per_mtok is not None or self.price_out_per_mtok is not None

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float | None:
        """USD of a request; ``cached_tokens`` are part of ``prompt_tokens`` (as endpoints count
        them) and priced at the cached-input price where one is set."""
        if not self.has_prices:
            return None
        price_in = self.price_in_per_mtok or 0.0
        price_cached = price_in if self.price_cached_in_per_mtok is None else self.price_cached_in_per_mtok
        cached = min(max(0, cached_tokens), prompt_tokens)
        return ((prompt_tokens - cached) * price_in + cached * price_cached
                + completion_tokens * (self.price_out_per_mtok or 0.0)) / 1e6

    @classmethod
    def from_env(
        cls,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        **knobs: object,
    ) -> "LLMConfig":
        """Build a config from arguments, then ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.

        Raises :class:`LLMError` when no key is found and the endpoint is not on this machine.
        """
        url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not key:
            if not is_loopback(url):
                raise LLMError("no API key: set OPENAI_API_KEY")
            key = NO_KEY
        if knobs.get("max_cost_usd") is not None and (knobs.get("price_in_per_mtok") is None
                                                     or knobs.get("price_out_per_mtok") is None):
            raise LLMError(MAX_COST_NEEDS_PRICES)  # the CLI's words, not pydantic's
        try:
            return cls(model=model, base_url=url, api_key=SecretStr(key), **knobs)  # type: ignore[arg-type]
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            raise LLMError(f"invalid LLM configuration: {_first_line(exc)}") from None


def is_loopback(url: str) -> bool:
    try:
        host = urlparse(url).hostname or ""
    except ValueError:
        return False
    return host.lower() in _LOOPBACK or host.startswith("127.")


_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',}]+")


def scrub(text: str, secret: SecretStr | str | None) -> str:
    """``text`` with the key (and any bearer token) replaced by ``***``."""
    if not text:
        return text
    key = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    if key and key != NO_KEY:
        if len(key) >= 8:
            text = text.replace(key, "***")
        else:  # a short local token: only where it stands alone, so that "k" does not eat "check"
            text = re.sub(rf"(?<![A-Za-z0-9_-]){re.escape(key)}(?![A-Za-z0-9_-])", "***", text)
    return _BEARER.sub(r"\1***", text)


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # "field: message", without pydantic's echo of the input
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    lines = [l for l in str(exc).splitlines() if l.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


__all__ = ["DEFAULT_BASE_URL", "LLMConfig", "MAX_COST_NEEDS_PRICES", "NO_KEY", "is_loopback", "scrub"]
