"""What LLM calls spend (tokens, USD) and the USD budget that no request may break.

:class:`LLMUsage` is the token count (and cost, where prices are configured) of one call or of a
client's whole life. :class:`CostMeter` enforces ``LLMConfig.max_cost_usd`` before each HTTP
request, over all threads:

- a request is sent only if ``spent + reserved + estimate <= max_cost_usd``, where ``spent`` is the
  cost of the replies read so far, ``reserved`` the estimates of the requests in flight and
  ``estimate`` this request's: its JSON body's characters / 3 as prompt tokens (priced at the full
  input price: a cache hit is a saving, never counted on), and as completion the output budget it
  asks for (``max_completion_tokens``) or else the mean completion seen so far (4096 before any);
- the check and the reservation happen under one lock, so concurrent requests cannot all pass on
  the same remainder: the estimates of what was sent never sum past the budget, which is overrun
  only by what replies cost beyond their estimates (about one request's cost at most, as long as
  the estimates are not far too low: a prompt of fewer than 3 characters a token, answers much
  longer than the mean of those seen, where no output budget is configured);
- a request that fits the budget but not with the ones in flight waits for them to settle; one
  that does not fit even without them is refused (:class:`CostSpent`, the client's kind ``cost``);
- when the reply comes the reservation is replaced by its real cost. A reply that was probably
  billed but could not be read (a timeout, a malformed body) keeps its estimate as its cost; an
  HTTP error (refused before any work) costs nothing.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from pydantic import BaseModel

from kerngen.agent.llm.config import LLMConfig

CHARS_PER_TOKEN_ESTIMATE = 3.0  # fewer than the usual ~4 of English: code and JSON tokenize densely
DEFAULT_COMPLETION_ESTIMATE = 4096  # completion tokens expected before any reply was seen


class LLMUsage(BaseModel):
    """Token counts (and cost where prices are configured) of one call or a whole run.

    ``cached_tokens`` are part of ``prompt_tokens`` (a prompt-cache hit, billed cheaper by most
    providers) and ``reasoning_tokens`` part of ``completion_tokens`` (a reasoning model's
    thinking, billed as output)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    estimated_tokens: int = 0  # of prompt + completion: estimated (a request billed but not answered)
    calls: int = 0
    failed_calls: int = 0
    cost_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add_tokens(self, other: "LLMUsage") -> None:
        """Add ``other``'s tokens and cost to this one (calls are counted by the caller)."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.estimated_tokens += other.estimated_tokens
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd


class Reservation(BaseModel):
    """What one request in flight holds of the budget."""

    usd: float  # its estimated cost
    sized: bool  # it asked for an output budget (its completion says nothing of the mean)


class BudgetSpent(Exception):
    """The request budget (a number of HTTP requests) is spent: the request was not sent."""


class CostSpent(Exception):
    """The USD budget would be exceeded by this request: it was not sent."""


class NotSent(Exception):
    """A request not sent for another reason: ``kind`` ``deadline`` (the search's time is up) or
    ``interrupted`` (Ctrl-C: the client is closed)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class CostMeter:
    """The USD budget of one client (thread-safe). Without ``max_cost_usd`` it only keeps the
    mean completion size; without prices it does nothing."""

    def __init__(self, config: LLMConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a request in flight settled
        self._spent = 0.0  # USD of the replies read (and the estimates of those billed unread)
        self._reserved = 0.0  # USD reserved by the requests in flight
        self._completion_sum = 0
        self._replies = 0
        self._limit = config.max_cost_usd  # USD this client may spend over its life (None: no limit)

    def set_limit(self, usd: float | None) -> None:
        """What this client may spend over its life from now on (a resumed search gives what is
        left of its ``--max-cost``)."""
        with self._changed:
            self._limit = None if usd is None else max(0.0, float(usd))
            self._changed.notify_all()

    @property
    def spent_usd(self) -> float:
        with self._lock:
            return self._spent

    @property
    def reserved_usd(self) -> float:
        with self._lock:
            return self._reserved

    def estimate_usage(self, body: dict[str, Any]) -> LLMUsage:
        """What a request that was sent (and probably billed) but never answered is counted as:
        its prompt estimated from its body, as completion its output budget or the mean so far;
        every token marked estimated."""
        prompt = _prompt_estimate(body)
        budget = _output_budget(body)
        with self._lock:
            completion = budget if budget is not None else self._mean_completion()
        return LLMUsage(prompt_tokens=prompt, completion_tokens=completion, estimated_tokens=prompt + completion,
                        cost_usd=self._config.cost_usd(prompt, completion))

    def _mean_completion(self) -> int:
        return round(self._completion_sum / self._replies) if self._replies else DEFAULT_COMPLETION_ESTIMATE

    def estimate(self, body: dict[str, Any]) -> float:
        """USD that the request ``body`` (the JSON sent, extra fields included) is expected to cost."""
        prompt = _prompt_estimate(body)
        with self._lock:
            return self._estimate(prompt, _output_budget(body))

    def _estimate(self, prompt_tokens: int, output_budget: int | None) -> float:
        completion = output_budget
        if completion is None:  # the mean so far: what an answer of this client costs
            completion = self._mean_completion()
        return self._config.cost_usd(prompt_tokens, completion + 1) or 0.0

    def reserve(self, body: dict[str, Any]) -> Reservation:
        """Reserve the estimate of the request ``body``. While it would break the budget with
        the requests in flight, wait for them to settle (each ends within the request timeout);
        :class:`CostSpent` (nothing reserved) when it would break it even without them."""
        budget = _output_budget(body)
        if self._limit is None:
            return Reservation(usd=0.0, sized=budget is not None)
        prompt = _prompt_estimate(body)
        with self._changed:
            while True:
                limit = self._limit
                if limit is None:
                    return Reservation(usd=0.0, sized=budget is not None)
                estimate = self._estimate(prompt, budget)  # again after a wait: the mean may have moved
                if self._spent + estimate > limit:
                    sized = "" if budget is not None else (
                        f" (its answer estimated at {self._mean_completion()} output tokens: --max-output-tokens "
                        "sizes it)")
                    raise CostSpent(
                        f"LLM cost budget spent: the next request ~${estimate:.4f}{sized}, "
                        f"${max(0.0, limit - self._spent):.4f} left of --max-cost (${self._reserved:.4f} in flight)")
                if self._spent + self._reserved + estimate <= limit:
                    self._reserved += estimate
                    return Reservation(usd=estimate, sized=budget is not None)
                self._changed.wait()  # reserved > 0 here: a request in flight settles and notifies

    def settle(self, reservation: Reservation, cost: float | None, *, completion_tokens: int | None = None) -> None:
        """Replace a reservation with what the request cost: ``cost`` from its reply, or None
        when it was probably billed without a readable reply (the estimate stays spent).
        ``completion_tokens`` of a reply read feed the mean that sizes requests without an
        output budget (only from such requests: a 16-token check says nothing of an answer)."""
        with self._changed:
            self._reserved = max(0.0, self._reserved - reservation.usd)
            self._spent += reservation.usd if cost is None else cost
            if completion_tokens is not None and not reservation.sized:
                self._completion_sum += completion_tokens
                self._replies += 1
            self._changed.notify_all()


def _prompt_estimate(body: dict[str, Any]) -> int:
    """Prompt tokens of a request body, estimated from its JSON (schema and extra fields included)."""
    return int(len(json.dumps(body, ensure_ascii=False, default=str)) / CHARS_PER_TOKEN_ESTIMATE) + 1


def _output_budget(body: dict[str, Any]) -> int | None:
    """The output tokens a request body asks for at most, None when it leaves it to the endpoint."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


__all__ = ["BudgetSpent", "CostMeter", "CostSpent", "LLMUsage", "NotSent", "Reservation"]
