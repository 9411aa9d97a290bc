"""One chat-completions client for any OpenAI-compatible endpoint (the openai SDK).

- Structured output: with a ``response_model`` the request carries ``response_format`` =
  ``json_schema`` with the model's schema (``strict`` when the schema can be made strict:
  every object closed and free of open dicts, e.g. ``IdeaList``; ``KernelSpec`` has open dicts
  and goes non-strict). An endpoint that refuses it (HTTP 400/422 naming ``response_format``,
  ``json_schema``, "structured" or "guided") is remembered and asked again in plain text, and
  every answer goes through :func:`kerngen.agent.llm.answers.parse_answer`, which also reads
  fenced JSON out of free text. So a server that ignores ``response_format`` works too.
- Retries (tenacity, the SDK's own retries off): 429, 408, 409, 5xx, timeouts and connection
  errors, exponential backoff with jitter from ``backoff_base_s``, at least the server's
  ``Retry-After`` / ``retry-after-ms`` (capped at ``retry_after_max_s``). 401/403, 404 and
  400 (context length included) abort at once with :class:`LLMError`.
- A malformed reply (a body that is not JSON or not UTF-8, a 200 that is no chat completion,
  ``choices`` or ``content`` of the wrong type) is retried like a 5xx, then given up
  (``bad_reply``): a recorded failed call, never another exception.
- Concurrency: a semaphore bounds the requests in flight over all threads to
  ``max_concurrency`` (held per HTTP request, not during backoff).
- Budget: :meth:`LLMClient.limit_requests` caps the HTTP requests the client makes over its
  life (every attempt and retry counts, the ``check`` included); a request over it is not sent
  and the call fails with kind ``budget``.
- Secrets: every message text goes through :func:`kerngen.redact.redact` before it is
  sent or recorded, and the API key is registered with it (so no log that quotes a secret of
  the environment is ever sent to the endpoint).
- Every call yields an :class:`LLMCall` (messages, answer, usage, cost, latency, attempts,
  error), returned by :meth:`LLMClient.complete` and also attached to every error it raises
  (``err.call``), so that a search can journal failed calls as well.
- The key never appears in an :class:`LLMCall`, a log line or an error: errors are rebuilt
  from scrubbed text, outside the SDK exception's context.

:class:`LLMError` carries ``kind``: ``auth``, ``not_found``, ``bad_request``,
``no_endpoint`` (a 404 that is not about the model: a wrong base_url), ``context_length``,
``unreachable``, ``gave_up`` (retries spent), ``bad_reply`` (malformed replies until the retries
were spent), ``budget`` (the request budget is spent: nothing was sent); ``fatal`` is
true for the kinds after which no other request can succeed either.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from typing import Any, Callable, Sequence

import openai
from pydantic import BaseModel, Field
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from kerngen.agent.llm.answers import AnswerError, parse_answer
from kerngen.agent.llm.replies import Message
from kerngen.agent.llm.config import LLMConfig, scrub
from kerngen.agent.llm.replies import BadReply, Reply, error_text, one_line, read_reply, redacted_messages, response_schema, retry_after, root_cause, transient
from kerngen.errors import LLMError
from kerngen.redact import redact, register_secret

log = logging.getLogger("kerngen.llm")

FATAL_KINDS = frozenset({"auth", "not_found", "no_endpoint", "bad_request"})
_MAX_ERROR_CHARS = 300
_STRUCTURED_REFUSAL = re.compile(r"response_format|json_schema|structured|guided|json mode", re.I)
_CONTEXT_LENGTH = re.compile(r"context.?length|maximum context|too many tokens|context window|prompt is too long", re.I)
_MODEL_MISSING = re.compile(r"model.*(not found|does not exist|not exist|unknown)|(unknown|invalid) model", re.I)


class LLMUsage(BaseModel):
    """Token counts (and cost where prices are configured) of one call or a whole run."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    failed_calls: int = 0
    cost_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class LLMCall(BaseModel):
    """One logical request (all its attempts) as the journal records it."""

    purpose: str
    model: str
    messages: list[Message]
    response_text: str = ""
    structured: bool = False  # answered under response_format json_schema
    finish_reason: str = ""
    usage: LLMUsage = Field(default_factory=LLMUsage)
    latency_ms: float = 0.0  # wall time of the call, retries and backoff included
    attempts: int = 0  # HTTP requests made
    error: str = ""  # one line; empty when the answer was read
    started_at: float = 0.0  # unix time



class _BudgetSpent(Exception):
    """The request budget is spent: the request was not sent."""


class LLMClient:
    """Thread-safe client: ``complete()`` may be called from many threads at once."""

    def __init__(self, config: LLMConfig, *, on_call: Callable[[LLMCall], None] | None = None,
                 max_requests: int | None = None) -> None:
        self.config = config
        self.on_call = on_call
        register_secret(config.api_key.get_secret_value())  # redacted from everything sent or recorded
        self._requests = 0  # HTTP requests sent over the client's life
        self._max_requests = max_requests
        self._sdk = openai.OpenAI(
            api_key=config.api_key.get_secret_value(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=0,  # tenacity does it, with our classification
        )
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        self._lock = threading.Lock()
        self._usage = LLMUsage(cost_usd=0.0 if config.has_prices else None)
        self._structured_ok = config.structured
        self._sleep: Callable[[float], None] = time.sleep

    def __repr__(self) -> str:
        return f"LLMClient(model={self.config.model!r}, base_url={self.config.base_url!r})"

    # ----- public ---------------------------------------------------------------------------
    @property
    def usage_total(self) -> LLMUsage:
        with self._lock:
            return self._usage.model_copy()

    @property
    def requests_made(self) -> int:
        """HTTP requests sent so far (every attempt and retry)."""
        with self._lock:
            return self._requests

    def limit_requests(self, total: int | None) -> None:
        """Make at most ``total`` HTTP requests over the client's life, those made already
        included (``None``: no limit). A request over it is not sent: its call fails with an
        :class:`LLMError` of kind ``budget``."""
        with self._lock:
            self._max_requests = None if total is None else max(0, int(total))

    @property
    def structured_supported(self) -> bool:
        """False once the endpoint refused ``response_format`` (or when configured off)."""
        return self._structured_ok

    def complete(
        self,
        messages: Sequence[Message],
        response_model: type[BaseModel] | None = None,
        *,
        purpose: str,
    ) -> tuple[BaseModel | str, LLMCall]:
        """Send ``messages``; return the parsed ``response_model`` (or the text) and the record.

        Raises :class:`LLMError` (the endpoint failed) or :class:`AnswerError` (it answered, but
        not with a valid ``response_model``); both carry ``.call``.
        """
        call = LLMCall(purpose=purpose, model=self.config.model, messages=redacted_messages(messages))
        return self._run(call, response_model, max_attempts=self.config.max_retries + 1)

    def check(self) -> LLMCall:
        """One cheap request, so that a search fails at once with a clear line when the endpoint
        is unreachable, the key is wrong or the model unknown."""
        messages = [{"role": "user", "content": "Reply with the single word OK."}]
        attempts = min(2, self.config.max_retries + 1)
        call = LLMCall(purpose="check", model=self.config.model, messages=messages)
        try:
            _, call = self._run(call, None, max_attempts=attempts, extra={"max_completion_tokens": 16})
        except LLMError as exc:  # an endpoint that does not know max_completion_tokens
            if getattr(exc, "kind", "") != "bad_request" or "max_completion_tokens" not in str(exc):
                raise
            call = LLMCall(purpose="check", model=self.config.model, messages=messages)
            _, call = self._run(call, None, max_attempts=attempts)
        return call

    # ----- the call -------------------------------------------------------------------------
    def _run(
        self,
        call: LLMCall,
        response_model: type[BaseModel] | None,
        *,
        max_attempts: int,
        extra: dict[str, Any] | None = None,
    ) -> tuple[BaseModel | str, LLMCall]:
        call.started_at = time.time()
        t0 = time.perf_counter()
        failure: LLMError | None = None
        reply: Reply | None = None
        retryer = Retrying(
            stop=stop_after_attempt(max_attempts),
            wait=self._wait,
            retry=retry_if_exception(transient),
            sleep=self._sleep,
            before_sleep=lambda rs: self._log_retry(call, rs),
            reraise=True,
        )
        try:
            for attempt in retryer:
                with attempt:
                    reply = read_reply(self._request(call, response_model, extra or {}), self.config.base_url)
        except (openai.OpenAIError, BadReply, _BudgetSpent) as exc:
            failure = self._to_llm_error(exc, call.attempts)
        call.latency_ms = (time.perf_counter() - t0) * 1e3

        if failure is not None:
            call.error = str(failure)
            failure.call = call  # type: ignore[attr-defined]
            if getattr(failure, "kind", "") == "budget" and call.attempts == 0:
                log.info("LLM %s call not sent: %s", call.purpose, call.error)
            else:
                self._account(call, failed=True)
                log.warning("LLM %s call failed: %s", call.purpose, call.error)
            raise failure  # raised here, outside the SDK exception's context

        assert reply is not None  # the retryer either read a reply or raised
        call.response_text = self._clean(reply.text)
        call.finish_reason = reply.finish_reason
        call.usage = LLMUsage(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, calls=1)
        call.usage.cost_usd = self.config.cost_usd(call.usage.prompt_tokens, call.usage.completion_tokens)

        result: BaseModel | str = call.response_text
        answer_error: AnswerError | None = None
        if response_model is not None:
            try:
                result = parse_answer(call.response_text, response_model)
            except AnswerError as exc:
                why = str(exc)
                if reply.refusal:
                    why = f"the model refused: {one_line(self._clean(reply.refusal))}"
                elif call.finish_reason == "length":
                    why += " (answer cut off: finish_reason=length)"
                answer_error = AnswerError(why, call.response_text)
                call.error = why
        self._account(call, failed=answer_error is not None)
        if answer_error is not None:
            answer_error.call = call  # type: ignore[attr-defined]
            log.info("LLM %s answer unreadable: %s", call.purpose, call.error)
            raise answer_error
        return result, call

    def _clean(self, text: str) -> str:
        """Text from the endpoint as it may be recorded: valid UTF-8, no key, no secret."""
        text = text.encode("utf-8", "replace").decode()  # a lone surrogate ("\\ud800") cannot be written
        return redact(scrub(text, self.config.api_key))

    def _request(self, call: LLMCall, response_model: type[BaseModel] | None, extra: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": call.messages}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_output_tokens is not None:
            kwargs["max_completion_tokens"] = self.config.max_output_tokens
        kwargs.update(extra)
        structured = response_model is not None and self._structured_ok
        if structured:
            assert response_model is not None
            schema, strict = response_schema(response_model)
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": response_model.__name__[:64], "schema": schema, "strict": strict},
            }
        try:
            response = self._send(call, kwargs)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if not (structured and _STRUCTURED_REFUSAL.search(error_text(exc))):
                raise
            with self._lock:
                if self._structured_ok:
                    log.info("endpoint %s refused response_format; using fenced-JSON answers", self.config.base_url)
                self._structured_ok = False
            del kwargs["response_format"]
            structured = False
            response = self._send(call, kwargs)
        call.structured = structured
        return response

    def _send(self, call: LLMCall, kwargs: dict[str, Any]) -> Any:
        with self._slots:
            with self._lock:
                if self._max_requests is not None and self._requests >= self._max_requests:
                    raise _BudgetSpent(f"LLM request budget spent ({self._requests} requests made, "
                                       f"at most {self._max_requests})")
                self._requests += 1
            call.attempts += 1
            try:
                return self._sdk.chat.completions.create(**kwargs)
            except openai.OpenAIError:
                raise
            except Exception as exc:  # noqa: BLE001 - the reply is untrusted: whatever the SDK trips
                # on while reading it (a truncated or non-UTF-8 body, ...) is a malformed reply,
                # retried and then recorded as a failed call, never a crash of the search
                raise BadReply(f"unreadable reply ({type(exc).__name__}: {one_line(str(exc), 120)})") from None

    # ----- retries ----------------------------------------------------------------------------
    def _wait(self, retry_state: Any) -> float:
        cfg = self.config
        # exponential with jitter: base * 2^(n-1) capped, plus up to one base of noise
        n = max(1, retry_state.attempt_number)
        seconds = min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (n - 1)) + random.uniform(0, cfg.backoff_base_s)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        after = retry_after(exc)
        if after is not None:
            seconds = max(seconds, min(after, cfg.retry_after_max_s))
        return seconds

    def _log_retry(self, call: LLMCall, retry_state: Any) -> None:
        exc = retry_state.outcome.exception()
        wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning(
            "LLM %s attempt %d failed (%s); retrying in %.2fs",
            call.purpose,
            retry_state.attempt_number,
            self._describe(exc),
            wait,
        )

    def _account(self, call: LLMCall, *, failed: bool) -> None:
        with self._lock:
            u = self._usage
            u.prompt_tokens += call.usage.prompt_tokens
            u.completion_tokens += call.usage.completion_tokens
            u.calls += 1
            u.failed_calls += int(failed)
            if u.cost_usd is not None and call.usage.cost_usd is not None:
                u.cost_usd += call.usage.cost_usd
        if self.on_call is not None:
            try:
                self.on_call(call)
            except Exception:  # a journaling hook must not break the search
                log.exception("on_call hook failed")

    # ----- errors -----------------------------------------------------------------------------
    def _describe(self, exc: BaseException | None) -> str:
        """One scrubbed line for any SDK error."""
        if exc is None:
            return "unknown error"
        if isinstance(exc, (BadReply, _BudgetSpent)):
            return one_line(redact(scrub(str(exc), self.config.api_key)))
        if isinstance(exc, openai.APITimeoutError):
            return f"timed out after {self.config.timeout_s:g}s"
        if isinstance(exc, openai.APIConnectionError):
            return scrub(root_cause(exc), self.config.api_key)
        if isinstance(exc, openai.APIStatusError):
            return f"HTTP {exc.status_code}: {one_line(scrub(error_text(exc), self.config.api_key))}"
        return one_line(scrub(str(exc), self.config.api_key)) or type(exc).__name__

    def _classify(self, exc: BaseException) -> str:
        if isinstance(exc, BadReply):
            return "bad_reply"
        if isinstance(exc, _BudgetSpent):
            return "budget"
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

    def _to_llm_error(self, exc: BaseException, attempts: int) -> LLMError:
        cfg = self.config
        what = self._describe(exc)
        model, url = cfg.model, cfg.base_url
        status = getattr(exc, "status_code", None)
        kind = self._classify(exc)
        msg = {
            "auth": f"authentication failed at {url} (check OPENAI_API_KEY): {what}",
            "not_found": f"model {model!r} not found at {url}: {what}",
            "no_endpoint": f"{url}/chat/completions not found (check base_url; it usually ends in /v1): {what}",
            "context_length": f"prompt too long for model {model!r} (context length exceeded): {what}",
            "bad_request": f"bad request to {url}: {what}",
            "unreachable": f"cannot reach {url}: {what}",
            "gave_up": f"LLM endpoint {url} failing: {what}",
            "bad_reply": what if what.startswith(url) else f"{url} sent a malformed reply: {what}",
            "budget": what,
        }[kind]
        if transient(exc) and attempts > 1:
            msg += f" (after {attempts} attempts)"
        err = LLMError(one_line(redact(scrub(msg, cfg.api_key)), limit=2 * _MAX_ERROR_CHARS))
        err.kind = kind  # type: ignore[attr-defined]
        err.fatal = kind in FATAL_KINDS  # type: ignore[attr-defined]
        err.status = status  # type: ignore[attr-defined]
        err.attempts = attempts  # type: ignore[attr-defined]
        return err


__all__ = ["FATAL_KINDS", "LLMCall", "LLMClient", "LLMUsage", "Message", "response_schema"]
