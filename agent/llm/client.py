"""One chat-completions client for any OpenAI-compatible endpoint (the openai SDK).

- Structured output: with a ``response_model`` the request carries ``response_format`` =
  ``json_schema`` (``strict`` when the schema can be: every object closed, no open dict;
  ``IdeaList`` is, ``KernelSpec`` is not). :meth:`LLMClient.complete` takes the messages or a
  function of whether the request goes with ``response_format`` (the prompt says how to answer
  once, by that). Any HTTP 400/422 to such a request is asked again once without it, rendered
  anew; when that succeeds the endpoint is remembered as refusing ``response_format``. Every
  answer goes through :func:`kerngen.agent.llm.answers.parse_answer` (fenced JSON in free text
  too), so a server that ignores ``response_format`` works as well.
- A cut-off answer (``finish_reason == "length"`` and unreadable) is asked again once, in the
  same :class:`LLMCall`, with twice the output budget (twice the configured one, else twice what
  the endpoint counted and at least 8192, at most ``max_output_tokens_cap`` and what the context
  leaves); that budget is kept for every later request (:attr:`LLMClient.warnings` suggests
  ``--max-output-tokens``). An answer still cut off: :class:`AnswerError` with ``truncated``.
- Reasoning models: an answer whose content is empty but whose reasoning channel
  (``reasoning_content`` / ``reasoning``) holds text is read from there (``LLMCall.channel``).
- Request fields: ``reasoning_effort`` and ``extra_body`` go in every request. ``timeout_s`` is
  the TOTAL time of one HTTP request (what trickles in is cut there: :mod:`.transport`), and no
  request starts, nor retry waits, past the search's deadline (:meth:`LLMClient.limit_time`). A
  body past :data:`~kerngen.agent.llm.transport.MAX_BODY_BYTES` is refused unread (``too_large``),
  an answer past :data:`MAX_ANSWER_CHARS` is unreadable (``AnswerProblem.too_large``).
- Retries (tenacity, the SDK's own off): 429, 408, 409, 5xx, timeouts, connection errors and
  malformed replies (not JSON, not UTF-8, no chat completion: then kind ``bad_reply``), backoff
  with jitter from ``backoff_base_s``, at least the server's ``Retry-After`` / ``retry-after-ms``
  (capped). 401/403, 404 and 400 (context length included) abort at once with :class:`LLMError`.
- A request sent but never answered (a timeout, a malformed or too large body, an interrupt)
  was probably billed: its tokens are estimated (:meth:`CostMeter.estimate_usage`) and counted
  in the call's usage and cost, marked ``estimated_tokens``.
- Concurrency: a semaphore bounds the requests in flight over all threads (``max_concurrency``).
- Budgets: :meth:`LLMClient.limit_requests` caps the HTTP requests over the client's life (every
  attempt, the ``check`` included; kind ``budget``); ``max_cost_usd`` caps what they cost
  (:class:`~kerngen.agent.llm.cost.CostMeter`; kind ``cost``).
- Context: :meth:`LLMClient.check` also asks the endpoint for the model's context window
  (:mod:`kerngen.agent.llm.endpoint`); :meth:`LLMClient.warn_if_context_small` says when a
  prompt will not fit; a reply that counted far fewer prompt tokens than sent warns once.
- Secrets: every message text goes through :func:`kerngen.redact.redact` before it is sent or
  recorded, and the API key is registered with it; errors are rebuilt from scrubbed text,
  outside the SDK exception's context.
- Every call yields an :class:`LLMCall` (messages, answer, usage, cost, latency, attempts,
  error, cause): returned, attached to every error raised (``err.call``) and, when it was sent,
  given to ``on_call`` (the journal; calls made before it is set wait in ``unreported``).
  :meth:`LLMClient.abandon` (Ctrl-C) reports every call in flight at once (estimated, cause
  ``interrupted``), cuts their requests, and nothing is sent or reported after it.

:class:`LLMError` carries ``kind``: ``auth``, ``not_found``, ``bad_request``, ``no_endpoint`` (a
404 not about the model: a wrong base_url), ``context_length``, ``unreachable``, ``gave_up``
(retries spent), ``bad_reply``, ``too_large``; and, for a request refused here before it was
sent, ``budget``, ``cost``, ``deadline`` (the search's time is up) and ``interrupted``. ``fatal``
is true for the kinds after which no other request can succeed; ``cause`` is its few words for
"no answer" counts.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import openai
from pydantic import BaseModel
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from kerngen.agent.llm.answers import AnswerError, AnswerProblem
from kerngen.agent.llm.calls import (MAX_ANSWER_CHARS, NOT_SENT_KINDS, CallBook, Form, LLMCall, Messages,
                                     answer_error_of,
                                     backoff_s, larger_budget, read_answer, stop_when_past, take_reply)
from kerngen.agent.llm.config import LLMConfig, scrub
from kerngen.agent.llm.cost import BudgetSpent, CostMeter, CostSpent, LLMUsage, NotSent, Reservation
from kerngen.agent.llm.endpoint import (PROBE_DEADLINE_S, ContextInfo, context_warning, probe_context, prompt_chars,
                                        truncation_warning)
from kerngen.agent.llm.replies import (FATAL_KINDS, BadReply, Message, Reply, classify, describe, error_text, one_line,
                                       read_reply, redact_json, redacted_messages, response_schema, to_llm_error, transient)
from kerngen.agent.llm.transport import http_client, request_deadline
from kerngen.errors import LLMError
from kerngen.redact import redact, register_secret

log = logging.getLogger("kerngen.llm")



class LLMClient:
    """Thread-safe client: ``complete()`` may be called from many threads at once."""

    def __init__(self, config: LLMConfig, *, on_call: Callable[[LLMCall], None] | None = None,
                 max_requests: int | None = None) -> None:
        self.config = config
        self._book = CallBook(on_call)
        register_secret(config.api_key.get_secret_value())  # redacted from everything sent or recorded
        self._requests = 0  # HTTP requests sent over the client's life
        self._max_requests = max_requests
        self._sdk = openai.OpenAI(
            api_key=config.api_key.get_secret_value(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=0,  # tenacity does it, with our classification
            http_client=http_client(config.timeout_s),  # a total deadline per request, bodies capped
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
        self._output_floor = 0  # the output budget a cut-off answer was raised to: kept from then on
        self._deadline: float | None = None  # time.monotonic() past which nothing is sent (the search's end)
        self._cancel = threading.Event()  # set by abandon(): requests in flight stop reading

    def __repr__(self) -> str:
        return f"LLMClient(model={self.config.model!r}, base_url={self.config.base_url!r})"

    # ----- public ---------------------------------------------------------------------------
    @property
    def on_call(self) -> Callable[[LLMCall], None] | None:
        """What every call sent is handed to when it ends (the journal)."""
        return self._book.on_call

    @on_call.setter
    def on_call(self, hook: Callable[[LLMCall], None] | None) -> None:
        self._book.on_call = hook

    @property
    def unreported(self) -> list[LLMCall]:
        """Calls made while no ``on_call`` was set (the check, made before the journal exists)."""
        return self._book.unreported

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

    def limit_time(self, seconds: float | None) -> None:
        """Send nothing, and wait for no retry, past ``seconds`` from now (None: no limit): the
        search gives what is left of ``--minutes``. Each request also ends by then."""
        self._deadline = None if seconds is None else time.monotonic() + max(0.0, seconds)

    def abandon(self) -> list[LLMCall]:
        """Ctrl-C: report every call still running (its tokens so far, the request it has in
        flight estimated; cause ``interrupted``), then send nothing more and report nothing more;
        the requests in flight are cut. Returns the calls reported."""
        reported = self._book.abandon(lambda body: self._meter.estimate_usage({**body, **self._extra_body}),
                                      lambda call: self._tally(call, failed=True))
        self._cancel.set()  # requests in flight stop within a quarter second, not at their deadline
        return reported

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
        messages: Messages,
        response_model: type[BaseModel] | None = None,
        *,
        purpose: str,
        schema: dict[str, Any] | None = None,
    ) -> tuple[BaseModel | str, LLMCall]:
        """Send ``messages`` (or ``messages(structured)``: rendered for a request with or without
        ``response_format``); return the parsed ``response_model`` (or the text) and the record.
        ``schema``: the JSON schema sent in ``response_format`` instead of the model's own (one
        trimmed to what the problem can use).

        Raises :class:`LLMError` (the endpoint failed) or :class:`AnswerError` (it answered, but
        not with a valid ``response_model``); both carry ``.call``.
        """
        form = Form(response_model, schema, messages if callable(messages) else None)
        first = form.render(response_model is not None and self._structured_ok) if form.render else messages
        call = LLMCall(purpose=purpose, model=self.config.model, messages=redacted_messages(first))  # type: ignore[arg-type]
        return self._run(call, form, max_attempts=self.config.max_retries + 1)

    def check(self) -> LLMCall:
        """One cheap request, so that a search fails at once with a clear line when the endpoint
        is unreachable, the key is wrong or the model unknown; then the model's context window
        is asked of the endpoint (best-effort: :attr:`context_tokens`)."""
        messages = [{"role": "user", "content": "Reply with the single word OK."}]
        attempts = min(2, self.config.max_retries + 1)
        call = LLMCall(purpose="check", model=self.config.model, messages=messages)
        try:
            _, call = self._run(call, Form(None), max_attempts=attempts, extra={"max_completion_tokens": 16})
        except LLMError as exc:  # an endpoint that does not know max_completion_tokens
            if getattr(exc, "kind", "") != "bad_request" or "max_completion_tokens" not in str(exc):
                raise
            self._tokens_field = "max_tokens"  # the older name, for the output budgets sent later
            call = LLMCall(purpose="check", model=self.config.model, messages=messages)
            _, call = self._run(call, Form(None), max_attempts=attempts)
        with request_deadline(time.monotonic() + PROBE_DEADLINE_S):  # a courtesy: bounded, whatever the endpoint does
            self.context = probe_context(self._sdk, self.config)
        if self.context.tokens is not None:
            log.info("%s at %s: context of %d tokens (%s)", self.config.model, self.config.base_url,
                     self.context.tokens, self.context.source)
        return call

    # ----- the call -------------------------------------------------------------------------
    def _run(self, call: LLMCall, form: Form, *, max_attempts: int,
             extra: dict[str, Any] | None = None) -> tuple[BaseModel | str, LLMCall]:
        call.started_at = time.time()
        t0 = time.perf_counter()
        extra = dict(extra or {})
        self._book.start(call)
        try:
            return self._run_call(call, form, max_attempts, extra, t0)
        finally:
            self._book.end(call)

    def _run_call(self, call: LLMCall, form: Form, max_attempts: int, extra: dict[str, Any],
                  t0: float) -> tuple[BaseModel | str, LLMCall]:
        result: BaseModel | str = ""
        answer_error: AnswerError | None = None
        reply: Reply | None = None
        retried = False  # a cut-off answer is asked again once
        while True:
            got, failure = self._exchange(call, form, extra, max_attempts)
            if failure is not None:
                if answer_error is not None:  # the cut-off retry failed: the call ends with the cut-off answer
                    answer_error = answer_error_of(
                        call, f"{answer_error}; asked again with {self._tokens_field}="
                              f"{extra.get(self._tokens_field)}: {failure}", AnswerProblem.truncated)
                    failure = None
                break
            reply = got
            take_reply(call, reply, self._clean(reply.text[:MAX_ANSWER_CHARS + 1]),
                       self.config.cost_usd(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens))
            result, answer_error = read_answer(call, reply, form.model, self._clean(reply.refusal))
            cut_off = answer_error is not None and getattr(answer_error, "truncated", False)
            budget = self._larger_budget(reply, extra) if cut_off and not retried else None
            if budget is None:
                break
            log.info("LLM %s answer cut off after %d tokens; asking again with %s=%d", call.purpose,
                     reply.completion_tokens, self._tokens_field, budget)
            extra = {**extra, self._tokens_field: budget}
            retried = True
            self._keep_budget(reply.completion_tokens, budget)
        call.latency_ms = (time.perf_counter() - t0) * 1e3

        if failure is not None:
            call.error = str(failure)
            call.cause = getattr(failure, "cause", "") or getattr(failure, "kind", "")
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

    def _until_deadline(self, seconds: float) -> float:
        """``seconds``, but no wait past the search's deadline."""
        return seconds if self._deadline is None else max(0.0, min(seconds, self._deadline - time.monotonic()))

    def _keep_budget(self, cut_at: int, budget: int) -> None:
        """A cut-off answer was asked again with ``budget`` output tokens: every later request
        starts there, and the user hears once how to start there next time."""
        with self._lock:
            raised = budget > self._output_floor
            self._output_floor = max(self._output_floor, budget)
            if not raised or any("--max-output-tokens" in w for w in self.warnings):
                return
            self.warnings.append(
                f"answers were cut off at {cut_at} output tokens: the output budget was raised to {budget} for the "
                f"rest of the search; start there next time with --max-output-tokens {budget}")

    def _exchange(self, call: LLMCall, form: Form, extra: dict[str, Any],
                  max_attempts: int) -> tuple[Reply | None, LLMError | None]:
        """One request and its retries (transient errors): the reply read, or the error (built
        outside the SDK exception's context, so that it cannot carry the SDK's text along)."""
        retryer = Retrying(
            stop=stop_after_attempt(max_attempts) | stop_when_past(lambda: self._deadline),
            wait=lambda rs: self._until_deadline(backoff_s(self.config, rs)),
            retry=retry_if_exception(transient),
            sleep=self._sleep,
            before_sleep=lambda rs: self._log_retry(call, rs),
            reraise=True,
        )
        failure: BaseException | None = None
        try:
            for attempt in retryer:
                with attempt:
                    return self._request(call, form, extra), None
        except (openai.OpenAIError, BadReply, BudgetSpent, CostSpent, NotSent) as exc:
            failure = exc
        assert failure is not None  # the retryer either returned a reply or raised
        return None, to_llm_error(failure, call.attempts, self.config)

    def _larger_budget(self, reply: Reply, extra: dict[str, Any]) -> int | None:
        """The output budget to ask a cut-off answer again with, None when none larger can be."""
        cap = self.config.max_output_tokens_cap
        if self.context.tokens and self.context.served and reply.prompt_tokens:  # what the context leaves
            cap = min(cap, self.context.tokens - reply.prompt_tokens)
        return larger_budget(extra.get(self._tokens_field) or self._output_budget(), reply.completion_tokens, cap)

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

    def _output_budget(self) -> int | None:
        """The output budget every request asks for: the configured one, or the larger one a
        cut-off answer was asked again with (None: the endpoint's default)."""
        budget = max(self.config.max_output_tokens or 0, self._output_floor)
        return budget or None

    def _request(self, call: LLMCall, form: Form, extra: dict[str, Any]) -> Reply:
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": call.messages}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self._output_budget() is not None:
            kwargs[self._tokens_field] = self._output_budget()
        kwargs.update(extra)
        structured = form.model is not None and self._structured_ok
        if structured:
            assert form.model is not None
            schema, strict = response_schema(form.model, form.schema)
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": form.model.__name__[:64], "schema": schema, "strict": strict},
            }
        try:
            reply = self._send(call, kwargs)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if not structured or classify(exc) == "context_length":  # a prompt too long is too long either way
                raise
            # any 400/422: providers word a refusal of response_format every which way, so the
            # plain request decides; if it fails as well, its error is the one raised
            refusal = f"HTTP {exc.status_code}: {one_line(scrub(error_text(exc), self.config.api_key), 160)}"
            del kwargs["response_format"]
            if form.render is not None:  # the prompt said "JSON per the schema sent": now it carries the schema
                call.messages = redacted_messages(form.render(False))
                kwargs["messages"] = call.messages
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
            deadline, by_search = self._count_request(reservation)
            sent = time.monotonic()
            call.attempts += 1  # before the request is in the book: an interrupt counts it
            if not self._book.sending(call, kwargs):  # interrupted since: not sent
                call.attempts -= 1
                self._meter.settle(reservation, 0.0)
                raise NotSent("interrupted", "the search was interrupted: nothing more is sent")
            reply: Reply | None = None
            billed = False  # sent, and possibly billed, without a reply read: its estimate counts
            try:
                with request_deadline(deadline, self._cancel):
                    response = self._sdk.chat.completions.create(
                        **kwargs, extra_body=self._extra_body or None, timeout=self.config.timeout_s)
                reply = read_reply(response, self.config.base_url)
                return reply
            except openai.APITimeoutError as exc:
                billed = True
                if by_search:  # the search's end came before --llm-timeout's: --minutes cut it
                    exc.kerngen_cut_by_search = time.monotonic() - sent  # type: ignore[attr-defined]
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
                self._book.sending(call, None)
                self._settle(call, kwargs, reservation, reply, billed)

    def _count_request(self, reservation: Reservation | None) -> tuple[float, bool]:
        """Raise :class:`BudgetSpent` when the request budget is spent, :class:`NotSent` when
        the search's time is up or the client was abandoned (then a reservation made is given
        back); with a reservation, count the request as sent. Returns its deadline, and whether it
        is the search's (before ``--llm-timeout``'s)."""
        with self._lock:
            refusal: Exception | None = None
            if self._book.closed:
                refusal = NotSent("interrupted", "the search was interrupted: nothing more is sent")
            elif self._deadline is not None and time.monotonic() >= self._deadline:
                refusal = NotSent("deadline", "the search's time budget (--minutes) is spent: nothing more is sent")
            elif self._max_requests is not None and self._requests >= self._max_requests:
                refusal = BudgetSpent(f"LLM request budget spent ({self._requests} requests made, at most "
                                      f"{self._max_requests}, the endpoint check included: --max-llm-calls)")
            if refusal is not None:
                if reservation is not None:
                    self._meter.settle(reservation, 0.0)
                raise refusal
            deadline = time.monotonic() + self.config.timeout_s
            if reservation is not None:
                self._requests += 1
            by_search = self._deadline is not None and self._deadline < deadline
            return (self._deadline if by_search and self._deadline is not None else deadline), by_search

    def _settle(self, call: LLMCall, body: dict[str, Any], reservation: Reservation, reply: Reply | None,
                billed: bool) -> None:
        if reply is not None:
            cost = self.config.cost_usd(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
            self._meter.settle(reservation, cost, completion_tokens=reply.completion_tokens)
        elif billed:  # sent and probably billed, never answered: counted as estimated
            estimate = self._meter.estimate_usage({**body, **self._extra_body})
            call.usage.add_tokens(estimate)
            self._meter.settle(reservation, estimate.cost_usd or 0.0)
        else:
            self._meter.settle(reservation, 0.0)

    # ----- retries ----------------------------------------------------------------------------
    def _log_retry(self, call: LLMCall, retry_state: Any) -> None:
        wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning("LLM %s attempt %d failed (%s); retrying in %.2fs", call.purpose, retry_state.attempt_number,
                    describe(retry_state.outcome.exception(), self.config), wait)

    def _account(self, call: LLMCall, *, failed: bool) -> None:
        """Count ``call`` and hand it to ``on_call`` (unless an interrupt reported it already)."""
        self._book.report(call, lambda c: self._tally(c, failed=failed))

    def _tally(self, call: LLMCall, *, failed: bool) -> None:
        with self._lock:
            u = self._usage
            u.add_tokens(call.usage)
            u.calls += 1
            u.failed_calls += int(failed)


__all__ = ["FATAL_KINDS", "MAX_ANSWER_CHARS", "NOT_SENT_KINDS", "LLMCall", "LLMClient", "LLMUsage", "Message",
           "response_schema"]
