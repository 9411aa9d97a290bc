"""The USD budget (--max-cost): no request is sent past it, even from many threads at once."""

from __future__ import annotations

import threading

import pytest
from pydantic import SecretStr

from kerngen.agent.llm.client import LLMCall, LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.cost import DEFAULT_COMPLETION_ESTIMATE, CostMeter, CostSpent, LLMUsage
from kerngen.errors import LLMError
from tests.fakes.llm_server import Reply, TEST_IDEAS, TEST_KEY, make_test_client, user_messages

PRICES = dict(price_in_per_mtok=1.0, price_out_per_mtok=2.0)
PROMPT_TOKENS, COMPLETION_TOKENS = 1000, 500
REQUEST_COST = (PROMPT_TOKENS * 1.0 + COMPLETION_TOKENS * 2.0) / 1e6  # $0.002 a request
# a prompt of 3000 characters, which the fake endpoint counts as 1000 tokens (3 characters a token)
PROMPT = [{"role": "user", "content": "x" * 2900}]


make_client = make_test_client  # the shared fixture ``server`` is in conftest.py
KEY, IDEAS, user = TEST_KEY, TEST_IDEAS, user_messages


def hammer(client: LLMClient, n: int) -> tuple[list[LLMCall], list[LLMError]]:
    """``n`` calls from ``n`` threads at once: (answered calls, errors)."""
    done: list[LLMCall] = []
    errors: list[LLMError] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def one() -> None:
        start.wait()
        try:
            _, call = client.complete(PROMPT, None, purpose="chat")
            with lock:
                done.append(call)
        except LLMError as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done, errors


# ----- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize("prices", [{}, {"price_in_per_mtok": 1.0}, {"price_out_per_mtok": 1.0}])
def test_max_cost_needs_both_prices(prices):
    with pytest.raises(ValueError, match="--max-cost needs --price-in and --price-out"):
        LLMConfig(model="m", api_key=SecretStr(KEY), max_cost_usd=1.0, **prices)
    with pytest.raises(LLMError, match=r"^--max-cost needs --price-in and --price-out$"):
        LLMConfig.from_env("m", "http://localhost:8000/v1", max_cost_usd=1.0, **prices)
    # what the CLI passes when no price is given
    with pytest.raises(LLMError, match=r"^--max-cost needs"):
        LLMConfig.from_env("m", "http://localhost:8000/v1", max_cost_usd=1.0, price_in_per_mtok=None)


def test_max_cost_with_prices_is_fine():
    cfg = LLMConfig.from_env("m", "http://localhost:8000/v1", max_cost_usd=0.5, **PRICES)
    assert cfg.max_cost_usd == 0.5


# ----- the budget with many threads ----------------------------------------------------------------
@pytest.mark.parametrize("knobs", [{}, {"max_output_tokens": COMPLETION_TOKENS}])
def test_cost_budget_holds_with_many_threads(server, knobs):
    server.default = Reply.completion("ok", prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS)
    server.delay_s = 0.05
    max_cost = 0.02  # ten requests
    client = make_client(server.url, max_concurrency=4, max_cost_usd=max_cost, **PRICES, **knobs)
    journal: list[LLMCall] = []
    client.on_call = journal.append
    done, errors = hammer(client, 40)

    sent = len(server.chat_requests)
    assert sent == len(done) == client.requests_made  # every call sent was answered; no refused one was sent
    assert sent * REQUEST_COST <= max_cost + REQUEST_COST + 1e-12
    assert client.usage_total.cost_usd == pytest.approx(sent * REQUEST_COST)
    assert client.usage_total.cost_usd <= max_cost + REQUEST_COST
    assert sent >= 5  # the budget was used, not refused wholesale
    assert len(errors) == 40 - sent and errors
    for err in errors:
        assert err.kind == "cost" and not err.fatal and err.attempts == 0 and err.call.attempts == 0
        assert str(err).startswith("LLM cost budget spent:") and "--max-cost" in str(err)
    assert len(journal) == sent  # a call that was not sent is not journaled as one
    assert server.max_in_flight > 1  # the calls did run concurrently
    assert client.cost_committed_usd == pytest.approx(sent * REQUEST_COST)


def test_budget_refuses_before_sending_once_spent(server):
    server.default = Reply.completion("ok", prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS)
    client = make_client(server.url, max_cost_usd=3.5 * REQUEST_COST, max_output_tokens=COMPLETION_TOKENS, **PRICES)
    for _ in range(3):
        client.complete(PROMPT, None, purpose="chat")
    with pytest.raises(LLMError) as info:
        client.complete(PROMPT, None, purpose="chat")
    assert info.value.kind == "cost" and len(server.chat_requests) == 3
    assert client.usage_total.calls == 3 and client.usage_total.failed_calls == 0


def test_a_request_larger_than_the_whole_budget_is_never_sent(server):
    server.default = Reply.completion("ok")
    client = make_client(server.url, max_cost_usd=0.001, max_output_tokens=10**6, **PRICES)
    with pytest.raises(LLMError) as info:
        client.complete(PROMPT, None, purpose="chat")
    assert info.value.kind == "cost" and server.chat_requests == []


def test_unreadable_replies_count_their_estimate(server):
    server.default = Reply(200, b"\xff\xfe not json")
    client = make_client(server.url, max_retries=0, max_cost_usd=1.0, max_output_tokens=100, **PRICES)
    with pytest.raises(LLMError) as info:
        client.complete(PROMPT, None, purpose="chat")
    assert info.value.kind == "bad_reply"
    assert client.cost_committed_usd > 0  # it may have been billed: its estimate stays spent


def test_http_errors_cost_nothing(server):
    server.default = Reply.error(400, "bad request")
    client = make_client(server.url, max_cost_usd=1.0, max_output_tokens=100, **PRICES)
    with pytest.raises(LLMError):
        client.complete(PROMPT, None, purpose="chat")
    assert client.cost_committed_usd == 0.0


# ----- the meter ------------------------------------------------------------------------------------
def config(**knobs) -> LLMConfig:
    return LLMConfig(model="m", base_url="http://localhost:8000/v1", api_key=SecretStr(KEY), **PRICES, **knobs)


def test_estimate_uses_the_output_budget_then_the_mean():
    meter = CostMeter(config(max_cost_usd=1.0))
    body = {"model": "m", "messages": PROMPT}
    first = meter.estimate(body)
    assert first == pytest.approx((1000 + 2 * DEFAULT_COMPLETION_ESTIMATE) / 1e6, rel=0.05)
    assert meter.estimate({**body, "max_completion_tokens": 10}) == pytest.approx((1000 + 2 * 11) / 1e6, rel=0.05)
    r = meter.reserve(body)
    meter.settle(r, 0.001, completion_tokens=200)
    sized = meter.reserve({**body, "max_completion_tokens": 16})
    meter.settle(sized, 0.0001, completion_tokens=1)  # a sized request says nothing of the mean
    assert meter.estimate(body) == pytest.approx((1000 + 2 * 201) / 1e6, rel=0.05)
    assert meter.spent_usd == pytest.approx(0.0011) and meter.reserved_usd == 0.0


def test_reserve_waits_for_requests_in_flight():
    meter = CostMeter(config(max_cost_usd=0.01))
    body = {"model": "m", "messages": PROMPT, "max_completion_tokens": 1000}  # ~$0.003 each
    held = [meter.reserve(body) for _ in range(3)]
    assert meter.reserved_usd == pytest.approx(3 * held[0].usd)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(meter.reserve(body)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and got == []  # it would break the budget with those in flight
    meter.settle(held[0], 0.0005)  # one came back cheaper than feared
    waiter.join(2)
    assert len(got) == 1
    for r in held[1:] + got:
        meter.settle(r, held[0].usd)  # type: ignore[arg-type]
    with pytest.raises(CostSpent):  # spent + estimate > budget: nothing to wait for
        for _ in range(10):
            meter.settle(meter.reserve(body), held[0].usd)


def test_usage_add_tokens():
    total = LLMUsage(cost_usd=0.0)
    total.add_tokens(LLMUsage(prompt_tokens=5, completion_tokens=2, cached_tokens=3, reasoning_tokens=1, cost_usd=0.5))
    total.add_tokens(LLMUsage(prompt_tokens=1))
    assert (total.prompt_tokens, total.completion_tokens, total.cached_tokens, total.reasoning_tokens) == (6, 2, 3, 1)
    assert total.cost_usd == 0.5 and total.total_tokens == 8
    unpriced = LLMUsage()
    unpriced.add_tokens(LLMUsage(prompt_tokens=1))
    assert unpriced.cost_usd is None
