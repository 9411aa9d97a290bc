"""One chat-completions client for any OpenAI-compatible endpoint (the openai SDK).

- Structured output: with a ``response_model`` the request carries ``response_format`` =
  ``json_schema`` with the model's schema (``strict`` when the schema can be made strict:
  every object closed and free of open dicts, e.g. ``IdeaList``; ``KernelSpec`` has open dicts
  and goes non-strict). Any HTTP 400/422 to such a request is asked again once without it
  (providers word their refusal every which way); when that plain request succeeds the endpoint
  is remembered as refusing ``response_format``, when it fails too it was a bad request. Every
  answer goes through :func:`kerngen.agent.llm.answers.parse_answer`, which also reads fenced
  JSON out of free text, so a server that ignores ``response_format`` works too.
- A cut-off answer (``finish_reason == "length"`` and unreadable) is asked again once with twice
  the output budget (``max_completion_tokens``: twice the configured one, else twice what the
  endpoint counted and at least 8192, at most ``max_output_tokens_cap`` and what the context
  leaves), in the same :class:`LLMCall`; the :class:`AnswerError` of an answer still cut off has
  ``truncated = True``.
- Request fields: ``reasoning_effort`` and ``extra_body`` go in every request (the SDK's
  ``extra_body``); ``timeout_s`` is per HTTP request.
- Retries (tenacity, the SDK's own retries off): 429, 408, 409, 5xx, timeouts and connection
  errors, exponential backoff with jitter from ``backoff_base_s``, at least the server's
  ``Retry-After`` / ``retry-after-ms`` (capped at ``retry_after_max_s``). 401/403, 404 and
  400 (context length included) abort at once with :class:`LLMError`.
- A malformed reply (a body that is not JSON or not UTF-8, a 200 that is no chat completion,
  ``choices`` or ``content`` of the wrong type) is retried like a 5xx, then given up
  (``bad_reply``): a recorded failed call, never another exception.
- Concurrency: a semaphore bounds the requests in flight over all threads to
  ``max_concurrency`` (held per HTTP request, not during backoff).
- Budgets: :meth:`LLMClient.limit_requests` caps the HTTP requests the client makes over its
  life (every attempt and retry counts, the ``check`` included; kind ``budget``);
  ``max_cost_usd`` caps what they cost (:class:`~kerngen.agent.llm.cost.CostMeter`: a request
  that would break it with the ones in flight is not sent; kind ``cost``).
- Context: :meth:`LLMClient.check` also asks the endpoint for the model's context window
  (:mod:`kerngen.agent.llm.endpoint`); :meth:`LLMClient.warn_if_context_small` says when a
  prompt will not fit, and a reply that counted far fewer prompt tokens than the prompt has
  adds a line to :attr:`LLMClient.warnings` (once).
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
were spent), ``budget`` (the request budget is spent: nothing was sent), ``cost`` (the USD
budget would be exceeded: nothing was sent); ``fatal`` is true for the kinds after which no
other request can succeed either.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, Sequence

import openai
from pydantic import BaseModel, Field
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from kerngen.agent.llm.answers import AnswerError, AnswerProblem, parse_answer
from kerngen.agent.llm.config import LLMConfig, scrub
from kerngen.agent.llm.cost import BudgetSpent, CostMeter, CostSpent, LLMUsage, Reservation
from kerngen.agent.llm.endpoint import ContextInfo, context_warning, probe_context, prompt_chars, truncation_warning
from kerngen.agent.llm.replies import (FATAL_KINDS, BadReply, Message, Reply, describe, error_text, one_line,
                                       read_reply, redact_json, redacted_messages, response_schema, retry_after,
                                       to_llm_error, transient)
from kerngen.errors import LLMError
from kerngen.redact import redact, register_secret

log = logging.getLogger("kerngen.llm")

NOT_SENT_KINDS = frozenset({"budget", "cost"})  # the request was refused here, before it was sent
CUT_OFF_MIN_TOKENS = 8192  # the least output budget a cut-off answer is asked again with


class LLMCall(BaseModel):
    """One logical request (all its attempts) as the journal records it."""

    purpose: str
    model: str
    messages: list[Message]
    response_text: str = ""
    structured: bool = False  # answered under response_format json_schema
    finish_reason: str = ""
    usage: LLMUsage = Field(default_factory=LLMUsage)  # summed over its requests (a cut-off retry included)
    latency_ms: float = 0.0  # wall time of the call, retries and backoff included
    attempts: int = 0  # HTTP requests made
    error: str = ""  # one line; empty when the answer was read
    started_at: float = 0.0  # unix time


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
        self._meter = CostMeter(config)
        self._structured_ok = config.structured
        self._tokens_field = "max_completion_tokens"  # "max_tokens" for an endpoint that knows no other
        extra = redact_json(config.extra_body)  # a secret of the environment pasted there is not sent
        if config.reasoning_effort is not None:
            extra["reasoning_effort"] = config.reasoning_effort
        self._extra_body: dict[str, Any] = extra
        self._sleep: Callable[[float], None] = time.sleep
        self.context = ContextInfo()  # what check() learnt of the model's context window
        self.warnings: list[str] = []  # one line each, for the user: what the endpoint's replies suggest
        self._truncation_warned = False

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

    @property
    def cost_committed_usd(self) -> float:
        """USD spent, as the cost budget counts it (replies read, and the estimate of those
        probably billed but unreadable), plus the estimates of the requests in flight."""
        return self._meter.spent_usd + self._meter.reserved_usd

    def limit_requests(self, total: int | None) -> None:
        """Make at most ``total`` HTTP requests over the client's life, those made already
        included (``None``: no limit). A request over it is not sent: its call fails with an
        :class:`LLMError` of kind ``budget``."""
        with self._lock:
            self._max_requests = None if total is None else max(0, int(total))

    def limit_cost(self, usd: float | None) -> None:
        """Spend at most ``usd`` from now on (``None``: no limit): the search gives what is left
        of ``--max-cost``. A request over it is not sent: its call fails with kind ``cost``."""
        self._meter.set_limit(None if usd is None else self._meter.spent_usd + max(0.0, usd))

    @property
    def structured_supported(self) -> bool:
        """False once the endpoint refused ``response_format`` (or when configured off)."""
        return self._structured_ok

    @property
    def context_tokens(self) -> int | None:
        """The model's context window as the endpoint told :meth:`check` (None: unknown)."""
        return self.context.tokens

    def warn_if_context_small(self, prompt_chars: int) -> str | None:
        """One line when a prompt of ``prompt_chars`` characters (about chars / 3.5 tokens) will
        not fit the model's known context (or an Ollama server's default one), else None."""
        return context_warning(self.context, prompt_chars, self.config.model, self.config.base_url)

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
        is unreachable, the key is wrong or the model unknown; then the model's context window
        is asked of the endpoint (best-effort: :attr:`context_tokens`)."""
        messages = [{"role": "user", "content": "Reply with the single word OK."}]
        attempts = min(2, self.config.max_retries + 1)
        call = LLMCall(purpose="check", model=self.config.model, messages=messages)
        try:
            _, call = self._run(call, None, max_attempts=attempts, extra={"max_completion_tokens": 16})
        except LLMError as exc:  # an endpoint that does not know max_completion_tokens
            if getattr(exc, "kind", "") != "bad_request" or "max_completion_tokens" not in str(exc):
                raise
            self._tokens_field = "max_tokens"  # the older name, for the output budgets sent later
            call = LLMCall(purpose="check", model=self.config.model, messages=messages)
            _, call = self._run(call, None, max_attempts=attempts)
        self.context = probe_context(self._sdk, self.config)
        if self.context.tokens is not None:
            log.info("%s at %s: context of %d tokens (%s)", self.config.model, self.config.base_url,
                     self.context.tokens, self.context.source)
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
        extra = dict(extra or {})
        result: BaseModel | str = ""
        answer_error: AnswerError | None = None
        reply: Reply | None = None
        retried = False  # a cut-off answer is asked again once
        while True:
            got, failure = self._exchange(call, response_model, extra, max_attempts)
            if failure is not None:
                if answer_error is not None:  # the cut-off retry failed: the call ends with the cut-off answer
                    answer_error = self._answer_error(
                        call, f"{answer_error}; asked again with {self._tokens_field}="
                              f"{extra.get(self._tokens_field)}: {failure}", AnswerProblem.truncated)
                    failure = None
                break
            reply = got
            self._take_reply(call, reply)
            result, answer_error = self._read_answer(call, reply, response_model)
            cut_off = answer_error is not None and getattr(answer_error, "truncated", False)
            budget = self._larger_budget(reply, extra) if cut_off and not retried else None
            if budget is None:
                break
            log.info("LLM %s answer cut off after %d tokens; asking again with %s=%d", call.purpose,
                     reply.completion_tokens, self._tokens_field, budget)
            extra = {**extra, self._tokens_field: budget}
            retried = True
        call.latency_ms = (time.perf_counter() - t0) * 1e3

        if failure is not None:
            call.error = str(failure)
            failure.call = call  # type: ignore[attr-defined]
            if getattr(failure, "kind", "") in NOT_SENT_KINDS and call.attempts == 0:
                log.info("LLM %s call not sent: %s", call.purpose, call.error)
            else:
                self._account(call, failed=True)
                log.warning("LLM %s call failed: %s", call.purpose, call.error)
            raise failure  # raised here, outside the SDK exception's context

        assert reply is not None  # a round either read a reply or failed
        self._watch_prompt(call, reply)
        self._account(call, failed=answer_error is not None)
        if answer_error is not None:
            answer_error.call = call  # type: ignore[attr-defined]
            log.info("LLM %s answer unreadable: %s", call.purpose, call.error)
            raise answer_error
        return result, call

    def _exchange(self, call: LLMCall, response_model: type[BaseModel] | None, extra: dict[str, Any],
                  max_attempts: int) -> tuple[Reply | None, LLMError | None]:
        """One request and its retries (transient errors): the reply read, or the error (built
        outside the SDK exception's context, so that it cannot carry the SDK's text along)."""
        retryer = Retrying(
            stop=stop_after_attempt(max_attempts),
            wait=self._wait,
            retry=retry_if_exception(transient),
            sleep=self._sleep,
            before_sleep=lambda rs: self._log_retry(call, rs),
            reraise=True,
        )
        failure: BaseException | None = None
        try:
            for attempt in retryer:
                with attempt:
                    return self._request(call, response_model, extra), None
        except (openai.OpenAIError, BadReply, BudgetSpent, CostSpent) as exc:
            failure = exc
        assert failure is not None  # the retryer either returned a reply or raised
        return None, to_llm_error(failure, call.attempts, self.config)

    def _take_reply(self, call: LLMCall, reply: Reply) -> None:
        """Record ``reply`` in ``call`` (its tokens added to those of an earlier, cut-off one)."""
        call.error = ""
        call.response_text = self._clean(reply.text)
        call.finish_reason = reply.finish_reason
        usage = LLMUsage(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                         cached_tokens=reply.cached_tokens, reasoning_tokens=reply.reasoning_tokens,
                         cost_usd=self.config.cost_usd(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens))
        call.usage.add_tokens(usage)
        call.usage.calls = 1

    def _read_answer(self, call: LLMCall, reply: Reply,
                     response_model: type[BaseModel] | None) -> tuple[BaseModel | str, AnswerError | None]:
        if response_model is None:
            return call.response_text, None
        try:
            return parse_answer(call.response_text, response_model), None
        except AnswerError as exc:
            why, kind = str(exc), exc.kind
        if reply.refusal:
            return call.response_text, self._answer_error(
                call, f"the model refused: {one_line(self._clean(reply.refusal))}", AnswerProblem.refused)
        if reply.finish_reason == "length":
            return call.response_text, self._answer_error(call, f"{why} (answer cut off: finish_reason=length)",
                                                          AnswerProblem.truncated)
        # the parser may see a cut-off answer the endpoint reported as "stop": asked again too
        return call.response_text, self._answer_error(call, why, kind)

    @staticmethod
    def _answer_error(call: LLMCall, why: str, kind: AnswerProblem) -> AnswerError:
        err = AnswerError(why, call.response_text, kind=kind)
        err.truncated = kind is AnswerProblem.truncated  # type: ignore[attr-defined]  # cut off by the output budget
        call.error = why
        return err

    def _larger_budget(self, reply: Reply, extra: dict[str, Any]) -> int | None:
        """The output budget to ask a cut-off answer again with, None when none larger can be."""
        cfg = self.config
        asked = extra.get(self._tokens_field) or cfg.max_output_tokens
        wanted = 2 * asked if asked else max(CUT_OFF_MIN_TOKENS, 2 * reply.completion_tokens)
        cap = cfg.max_output_tokens_cap
        if self.context.tokens and self.context.served and reply.prompt_tokens:  # what the context leaves
            cap = min(cap, self.context.tokens - reply.prompt_tokens)
        budget = min(wanted, cap)
        return budget if budget > (asked or reply.completion_tokens) else None

    def _watch_prompt(self, call: LLMCall, reply: Reply) -> None:
        """Warn once when the endpoint counted far fewer prompt tokens than the prompt has."""
        if self._truncation_warned:
            return
        line = truncation_warning(prompt_chars(call.messages), reply.prompt_tokens)
        if line is None:
            return
        with self._lock:
            if self._truncation_warned:
                return
            self._truncation_warned = True
            self.warnings.append(line)
        log.warning("%s", line)

    def _clean(self, text: str) -> str:
        """Text from the endpoint as it may be recorded: valid UTF-8, no key, no secret."""
        text = text.encode("utf-8", "replace").decode()  # a lone surrogate ("\\ud800") cannot be written
        return redact(scrub(text, self.config.api_key))

    def _request(self, call: LLMCall, response_model: type[BaseModel] | None, extra: dict[str, Any]) -> Reply:
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": call.messages}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_output_tokens is not None:
            kwargs[self._tokens_field] = self.config.max_output_tokens
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
            reply = self._send(call, kwargs)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if not structured:
                raise
            # any 400/422: providers word a refusal of response_format every which way, so the
            # plain request decides; if it fails as well, its error is the one raised
            refusal = f"HTTP {exc.status_code}: {one_line(scrub(error_text(exc), self.config.api_key), 160)}"
            del kwargs["response_format"]
            reply = self._send(call, kwargs)
            with self._lock:
                if self._structured_ok:
                    log.info("endpoint %s refused response_format (%s); using fenced-JSON answers",
                             self.config.base_url, redact(refusal))
                self._structured_ok = False
            structured = False
        call.structured = structured
        return reply

    def _send(self, call: LLMCall, kwargs: dict[str, Any]) -> Reply:
        with self._slots:
            self._count_request(None)
            # may wait for requests in flight to settle: not under the client's lock
            reservation = self._meter.reserve({**kwargs, **self._extra_body})
            self._count_request(reservation)
            call.attempts += 1
            reply: Reply | None = None
            billed = False  # sent, and possibly billed, without a reply read: its estimate counts
            try:
                response = self._sdk.chat.completions.create(
                    **kwargs, extra_body=self._extra_body or None, timeout=self.config.timeout_s)
                reply = read_reply(response, self.config.base_url)
                return reply
            except openai.APITimeoutError:
                billed = True
                raise
            except openai.OpenAIError:
                raise
            except BadReply:
                billed = True
                raise
            except Exception as exc:  # noqa: BLE001 - the reply is untrusted: whatever the SDK trips
                # on while reading it (a truncated or non-UTF-8 body, ...) is a malformed reply,
                # retried and then recorded as a failed call, never a crash of the search
                billed = True
                raise BadReply(f"unreadable reply ({type(exc).__name__}: {one_line(str(exc), 120)})") from None
            finally:
                self._settle(reservation, reply, billed)

    def _count_request(self, reservation: Reservation | None) -> None:
        """Raise :class:`BudgetSpent` when the request budget is spent (then a reservation made
        is given back); with a reservation, count the request as sent."""
        with self._lock:
            if self._max_requests is not None and self._requests >= self._max_requests:
                if reservation is not None:
                    self._meter.settle(reservation, 0.0)
                raise BudgetSpent(f"LLM request budget spent ({self._requests} requests made, "
                                  f"at most {self._max_requests})")
            if reservation is not None:
                self._requests += 1

    def _settle(self, reservation: Reservation, reply: Reply | None, billed: bool) -> None:
        if reply is not None:
            cost = self.config.cost_usd(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
            self._meter.settle(reservation, cost, completion_tokens=reply.completion_tokens)
        else:
            self._meter.settle(reservation, None if billed else 0.0)

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
            describe(exc, self.config),
            wait,
        )

    def _account(self, call: LLMCall, *, failed: bool) -> None:
        with self._lock:
            u = self._usage
            u.add_tokens(call.usage)
            u.calls += 1
            u.failed_calls += int(failed)
        if self.on_call is not None:
            try:
                self.on_call(call)
            except Exception:  # a journaling hook must not break the search
                log.exception("on_call hook failed")


__all__ = ["FATAL_KINDS", "NOT_SENT_KINDS", "LLMCall", "LLMClient", "LLMUsage", "Message", "response_schema"]
