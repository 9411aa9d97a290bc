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

import os
import re
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from kerngen.errors import LLMError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
NO_KEY = "EMPTY"  # the placeholder key of servers that need none
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


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
    max_output_tokens: int | None = Field(default=None, description="sent as max_completion_tokens when set")
    price_in_per_mtok: float | None = Field(default=None, ge=0, description="USD per million prompt tokens")
    price_out_per_mtok: float | None = Field(default=None, ge=0, description="USD per million completion tokens")
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

    @property
    def is_local(self) -> bool:
        return is_loopback(self.base_url)

    @property
    def has_prices(self) -> bool:
        return self.price_in_per_mtok is not None or self.price_out_per_mtok is not None

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if not self.has_prices:
            return None
        return (prompt_tokens * (self.price_in_per_mtok or 0.0) + completion_tokens * (self.price_out_per_mtok or 0.0)) / 1e6

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
    lines = [l for l in str(exc).splitlines() if l.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


__all__ = ["DEFAULT_BASE_URL", "LLMConfig", "NO_KEY", "is_loopback", "scrub"]
