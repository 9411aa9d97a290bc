"""What the endpoint says of the model's context window, and the warnings a prompt deserves.

Probed once (by :meth:`kerngen.agent.llm.client.LLMClient.check`), best-effort: every probe goes
to the configured endpoint's host only, through the SDK's own HTTP client (same auth header, no
retries), with a short timeout; any error, non-JSON body or timeout leaves the context unknown.

- OpenAI-compatible listing ``GET {base_url}/models``, the model's entry: vLLM says
  ``max_model_len``, OpenRouter and LM Studio ``context_length``, Groq ``context_window``; then
  ``GET {base_url}/models/{model}`` with the same fields.
- Ollama (port 11434, or ``GET {root}/api/version`` answers a version): ``GET {root}/api/ps`` (the
  context the loaded model runs with, in recent versions), else ``POST {root}/api/show``:
  ``num_ctx`` of its parameters, else the model's trained ``*.context_length``, which the server
  may cut to its default ``num_ctx`` (2048 or 4096 tokens by version, more by GPU memory in
  recent ones) or ``OLLAMA_CONTEXT_LENGTH``. Ollama truncates a longer prompt silently.
"""

from __future__ import annotations

import re
import time
from typing import Any, Sequence
from urllib.parse import quote, urlparse

import openai
from pydantic import BaseModel

from kerngen.agent.llm.config import LLMConfig

PROBE_TIMEOUT_MAX_S = 10.0  # per probe (or the client's timeout when shorter)
PROBE_DEADLINE_S = 20.0  # all probes together: a search should not wait long on a courtesy
OLLAMA_PORT = 11434
OLLAMA_DEFAULT_CONTEXT = 2048  # the smallest default num_ctx of an Ollama server (older versions)
CHARS_PER_TOKEN_CONTEXT = 3.5  # estimating whether a prompt fits: rather too many tokens than too few
CHARS_PER_TOKEN_TYPICAL = 4.0  # estimating what an endpoint should have counted
TRUNCATION_MIN_CHARS = 2000
TRUNCATION_RATIO = 0.4
# the fields of a model's entry that give its context, as the servers name them
_CONTEXT_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length", "max_input_tokens")
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.M)
OLLAMA_HINT = ("Ollama truncates longer prompts silently: raise its context with OLLAMA_CONTEXT_LENGTH "
               "(server) or num_ctx (Modelfile)")


class ContextInfo(BaseModel):
    """What the endpoint said of the model's context window."""

    tokens: int | None = None  # None: unknown
    source: str = ""  # where it was read, e.g. "GET /models: max_model_len"
    ollama: bool = False  # the endpoint is an Ollama server
    served: bool = True  # ``tokens`` is what the server runs the model with (False: the model's maximum)


def probe_context(sdk: openai.OpenAI, config: LLMConfig) -> ContextInfo:
    """The model's context as the endpoint tells it; never raises."""
    prober = _Prober(sdk, config)
    try:
        return prober.run()
    except Exception:  # noqa: BLE001 - a courtesy probe of an untrusted endpoint must never stop a search
        return ContextInfo()


class _Prober:
    def __init__(self, sdk: openai.OpenAI, config: LLMConfig) -> None:
        self.sdk = sdk
        self.model = config.model
        self.base_url = config.base_url
        parsed = urlparse(config.base_url)
        self.root = f"{parsed.scheme}://{parsed.netloc}"  # the same host, whatever the path
        self.port = parsed.port
        self.timeout = min(config.timeout_s, PROBE_TIMEOUT_MAX_S)
        self.deadline = time.monotonic() + PROBE_DEADLINE_S

    def run(self) -> ContextInfo:
        listing = self._json("GET", "models")
        entry = _entry(listing, self.model)
        found = _context_of(entry) if entry is not None else None
        if found:
            return ContextInfo(tokens=found[0], source=f"GET /models: {found[1]}")
        found = _context_of(self._json("GET", f"models/{quote(self.model, safe='')}"))
        if found:
            return ContextInfo(tokens=found[0], source=f"GET /models/{{model}}: {found[1]}")
        if self.port == OLLAMA_PORT or _is_ollama_version(self._json("GET", f"{self.root}/api/version")):
            return self._ollama()
        return ContextInfo()

    def _ollama(self) -> ContextInfo:
        running = self._json("GET", f"{self.root}/api/ps")
        models = running.get("models") if isinstance(running, dict) else None
        entry = _entry({"data": models}, self.model) or _entry({"data": models}, f"{self.model}:latest")
        tokens = _positive(entry.get("context_length")) if entry is not None else None
        if tokens:
            return ContextInfo(tokens=tokens, source="Ollama /api/ps: context_length", ollama=True)
        shown = self._json("POST", f"{self.root}/api/show", {"model": self.model})
        if not isinstance(shown, dict):  # an Ollama server answers one of the two: else it is none
            return ContextInfo(ollama=True, served=False) if isinstance(models, list) else ContextInfo()
        params = shown.get("parameters")
        match = _NUM_CTX.search(params) if isinstance(params, str) else None
        if match and _positive(int(match.group(1))):
            return ContextInfo(tokens=int(match.group(1)), source="Ollama /api/show: num_ctx", ollama=True)
        info = shown.get("model_info")
        trained = [_positive(v) for k, v in info.items() if str(k).endswith(".context_length")] \
            if isinstance(info, dict) else []
        tokens = next((t for t in trained if t), None)
        return ContextInfo(tokens=tokens, source="Ollama /api/show: model_info context_length" if tokens else "",
                           ollama=True, served=False)

    def _json(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON at ``url`` (relative to the base URL, or absolute on its host), None on any failure."""
        left = self.deadline - time.monotonic()
        if left <= 0.2:
            return None
        options: dict[str, Any] = {"timeout": min(self.timeout, left)}
        try:
            if method == "GET":
                return self.sdk.get(url, cast_to=object, options=options)
            return self.sdk.post(url, cast_to=object, body=body, options=options)
        except Exception:  # noqa: BLE001 - HTTP errors, timeouts, a body that is no JSON: context unknown
            return None


def _entry(listing: Any, model: str) -> dict[str, Any] | None:
    """The entry of ``model`` in a model listing (``{"data": [...]}`` or a bare list)."""
    data = listing.get("data") if isinstance(listing, dict) else listing
    if not isinstance(data, list):
        return None
    for item in data:
        if isinstance(item, dict) and model in (item.get("id"), item.get("name"), item.get("model")):
            return item
    return None


def _context_of(entry: Any) -> tuple[int, str] | None:
    """(tokens, field name) of the first context field of a model's entry."""
    if not isinstance(entry, dict):
        return None
    for name in _CONTEXT_FIELDS:
        tokens = _positive(entry.get(name))
        if tokens:
            return tokens, name
    top = entry.get("top_provider")  # OpenRouter also says it per provider
    tokens = _positive(top.get("context_length")) if isinstance(top, dict) else None
    return (tokens, "top_provider.context_length") if tokens else None


def _positive(value: Any) -> int | None:
    """A sane token count, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 < value < 2**31 else None


def _is_ollama_version(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("version"), str)


def prompt_chars(messages: Sequence[dict[str, Any]]) -> int:
    """Characters of the text of ``messages`` (plain strings or lists of text parts)."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


def context_warning(info: ContextInfo, chars: int, model: str, url: str) -> str | None:
    """One line when a prompt of ``chars`` characters will not fit the context, else None."""
    estimate = int(chars / CHARS_PER_TOKEN_CONTEXT)
    if info.tokens is not None and estimate > info.tokens:
        hint = f"; {OLLAMA_HINT}" if info.ollama else ""
        return (f"the prompt (about {estimate} tokens) exceeds the context of {model} at {url} "
                f"({info.tokens} tokens, {info.source}){hint}")
    if info.ollama and not (info.tokens and info.served) and estimate > OLLAMA_DEFAULT_CONTEXT:
        return (f"the prompt (about {estimate} tokens) may exceed the context Ollama runs {model} with at {url} "
                f"(num_ctx, 2048 or 4096 tokens by default); {OLLAMA_HINT}")
    return None


def truncation_warning(chars: int, prompt_tokens: int) -> str | None:
    """One line when the endpoint counted far fewer prompt tokens than a prompt of ``chars``
    characters has: a server that cut the prompt to its context (Ollama's num_ctx) says so only there."""
    expected = chars / CHARS_PER_TOKEN_TYPICAL
    if chars <= TRUNCATION_MIN_CHARS or prompt_tokens <= 0 or prompt_tokens >= TRUNCATION_RATIO * expected:
        return None
    return (f"the endpoint counted {prompt_tokens} prompt tokens for a prompt of about {int(expected)}: "
            f"it may have truncated the prompt (Ollama's num_ctx?)")


__all__ = ["ContextInfo", "context_warning", "probe_context", "prompt_chars", "truncation_warning"]
