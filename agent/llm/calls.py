"""What the LLM client records of its calls, and the book it keeps of those still running.

:class:`LLMCall` is one logical request (all its attempts) as the journal records it.
:class:`CallBook` knows which calls are running and which request each has in flight, so that
an interrupt (:meth:`CallBook.abandon`) can report every one of them at once (the tokens of the
request in flight estimated: it was sent, so probably billed) before the journal closes, and so
that no call is ever reported twice, nor after that.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pydantic import BaseModel, Field

from kerngen.agent.llm.answers import AnswerError, AnswerProblem, parse_answer
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.cost import LLMUsage
from kerngen.agent.llm.replies import Message, Reply, one_line, retry_after

log = logging.getLogger("kerngen.llm")

NOT_SENT_KINDS = frozenset({"budget", "cost", "deadline", "interrupted"})  # refused here, before it was sent
Messages = Sequence[Message] | Callable[[bool], Sequence[Message]]  # or: a function of "structured output"
INTERRUPTED = "interrupted (Ctrl-C) before the answer came; its tokens are estimated"
CUT_OFF_MIN_TOKENS = 8192  # the least output budget a cut-off answer is asked again with
MAX_ANSWER_CHARS = 1_000_000  # an answer longer than this is not read (nor journaled past it)


@dataclass(frozen=True)
class Form:
    """What a call asks for: ``model`` (None: plain text), the JSON ``schema`` sent for it in
    ``response_format`` (None: the model's own) and ``render`` (the messages as a function of
    whether the request goes with ``response_format``; None: fixed messages)."""

    model: type[BaseModel] | None
    schema: dict[str, Any] | None = None
    render: Callable[[bool], Sequence[Message]] | None = None


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
    cause: str = ""  # a few words for why it got no answer ("HTTP 500", "timeout", "unreadable: no_json")
    channel: str = "content"  # where the answer was read: "content", or "reasoning" (content empty)
    started_at: float = 0.0  # unix time


class CallBook:
    """The calls of one client: running, their requests in flight, and the hook that reports
    them (``on_call``; calls made while it is None wait in :attr:`unreported`). Thread-safe."""

    def __init__(self, on_call: Callable[[LLMCall], None] | None = None) -> None:
        self.on_call = on_call
        self.unreported: list[LLMCall] = []
        self._lock = threading.Lock()
        self._running: dict[int, LLMCall] = {}
        self._sending: dict[int, dict[str, Any]] = {}  # call id -> the body of its request in flight
        self.closed = False

    def start(self, call: LLMCall) -> None:
        with self._lock:
            self._running[id(call)] = call

    def end(self, call: LLMCall) -> None:
        """A call that ends without being reported (nothing was sent)."""
        with self._lock:
            self._running.pop(id(call), None)

    def sending(self, call: LLMCall, body: dict[str, Any] | None) -> bool:
        """``call`` has the request ``body`` in flight (None: no longer). False when an
        interrupt came first: the request must not be sent."""
        with self._lock:
            if body is None:
                self._sending.pop(id(call), None)
            elif self.closed:
                return False
            else:
                self._sending[id(call)] = body
            return True

    def report(self, call: LLMCall, tally: Callable[[LLMCall], None]) -> None:
        """Count (``tally``) and hand over a finished call, unless an interrupt came first (it
        reported the call already, and the journal is closing)."""
        with self._lock:
            if self.closed:
                return
            self._running.pop(id(call), None)
            tally(call)
            self._hand_over(call)

    def abandon(self, estimate: Callable[[dict[str, Any]], LLMUsage],
                tally: Callable[[LLMCall], None]) -> list[LLMCall]:
        """Report every running call now (``estimate``: the usage of a request in flight), and
        nothing after. Returns the calls reported."""
        reported: list[LLMCall] = []
        with self._lock:
            if self.closed:
                return reported
            self.closed = True
            for key, call in list(self._running.items()):
                body = self._sending.get(key)
                if call.attempts == 0 and body is None:  # waiting for a slot: nothing was sent, nothing spent
                    continue
                rec = call.model_copy(deep=True)
                if body is not None:
                    rec.usage.add_tokens(estimate(body))
                rec.error, rec.cause = rec.error or INTERRUPTED, "interrupted"
                rec.latency_ms = (time.time() - rec.started_at) * 1e3 if rec.started_at else 0.0
                tally(rec)
                self._hand_over(rec)
                reported.append(rec)
            self._running.clear()
        return reported

    def _hand_over(self, call: LLMCall) -> None:
        if self.on_call is None:
            self.unreported.append(call)
            return
        try:
            self.on_call(call)
        except Exception as exc:  # a journaling hook must not break the search
            log.warning("on_call hook failed: %s", one_line(str(exc) or type(exc).__name__))


def take_reply(call: LLMCall, reply: Reply, text: str, cost_usd: float | None) -> None:
    """Record ``reply`` in ``call`` (``text``: its answer as it may be recorded; its tokens added
    to those of an earlier, cut-off one)."""
    call.error = ""
    call.response_text = text
    call.channel = reply.channel
    call.finish_reason = reply.finish_reason
    call.usage.add_tokens(LLMUsage(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                                   cached_tokens=reply.cached_tokens, reasoning_tokens=reply.reasoning_tokens,
                                   cost_usd=cost_usd))
    call.usage.calls = 1


def read_answer(call: LLMCall, reply: Reply, response_model: type[BaseModel] | None,
                refusal: str) -> tuple[BaseModel | str, AnswerError | None]:
    """The answer of ``call`` read as ``response_model`` (the text when None), or why it cannot be."""
    if response_model is None:
        return call.response_text, None
    if len(reply.text) > MAX_ANSWER_CHARS:  # read no further: its start is what the journal keeps
        call.response_text = call.response_text[:MAX_ANSWER_CHARS]
        return call.response_text, answer_error_of(
            call, f"the answer is {len(reply.text):,} characters; at most {MAX_ANSWER_CHARS:,} are read "
                  "(a kernel spec is a few thousand)", AnswerProblem.too_large)
    try:
        return parse_answer(call.response_text, response_model), None
    except AnswerError as exc:
        why, kind = str(exc), exc.kind
    if reply.refusal:
        return call.response_text, answer_error_of(call, f"the model refused: {one_line(refusal)}",
                                                   AnswerProblem.refused)
    if reply.finish_reason == "length":
        return call.response_text, answer_error_of(call, f"{why} (answer cut off: finish_reason=length)",
                                                   AnswerProblem.truncated)
    if reply.channel == "reasoning":
        why += " (read from the reasoning channel: the answer's content was empty)"
    # the parser may see a cut-off answer the endpoint reported as "stop": asked again too
    return call.response_text, answer_error_of(call, why, kind)


def answer_error_of(call: LLMCall, why: str, kind: AnswerProblem) -> AnswerError:
    err = AnswerError(why, call.response_text, kind=kind)
    err.truncated = kind is AnswerProblem.truncated  # type: ignore[attr-defined]  # cut off by the output budget
    call.error = why
    call.cause = f"unreadable: {kind.value}"
    return err


def larger_budget(asked: int | None, completion_tokens: int, cap: int) -> int | None:
    """The output budget to ask a cut-off answer again with (twice what was asked, else twice
    what the endpoint counted and at least :data:`CUT_OFF_MIN_TOKENS`; at most ``cap``), None
    when none larger can be."""
    wanted = 2 * asked if asked else max(CUT_OFF_MIN_TOKENS, 2 * completion_tokens)
    budget = min(wanted, cap)
    return budget if budget > (asked or completion_tokens) else None


def backoff_s(cfg: LLMConfig, retry_state: Any) -> float:
    """Seconds before the next attempt: exponential with jitter (base * 2^(n-1) capped, plus up to
    one base of noise), at least the server's Retry-After (capped)."""
    n = max(1, retry_state.attempt_number)
    seconds = min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (n - 1)) + random.uniform(0, cfg.backoff_base_s)
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    after = retry_after(exc)
    if after is not None:
        seconds = max(seconds, min(after, cfg.retry_after_max_s))
    return seconds


def stop_when_past(deadline: Callable[[], float | None]) -> Callable[[Any], bool]:
    """A tenacity stop: no retry once ``deadline()`` (``time.monotonic()``) has passed."""
    def stop(_retry_state: Any) -> bool:
        when = deadline()
        return when is not None and time.monotonic() >= when
    return stop


__all__ = ["INTERRUPTED", "MAX_ANSWER_CHARS", "NOT_SENT_KINDS", "CallBook", "Form", "LLMCall", "Messages", "answer_error_of",
           "backoff_s", "larger_budget", "read_answer", "stop_when_past", "take_reply"]
