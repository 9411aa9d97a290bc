"""LLMClient against a real local HTTP server speaking chat-completions (tests/llm_server.py)."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback

import pytest
from pydantic import SecretStr

from kerngen.agent.llm.answers import AnswerError, IdeaList
from kerngen.agent.llm.client import LLMCall, response_schema
from kerngen.agent.llm.config import LLMConfig, scrub
from kerngen.errors import LLMError
from kerngen.harness.spec.spec import KernelSpec
from tests.fakes.llm_server import Reply, closed_port, softmax_spec_dict, TEST_IDEAS, TEST_KEY, make_test_client, user_messages



make_client = make_test_client  # the shared fixture ``server`` is in conftest.py
KEY, IDEAS, user = TEST_KEY, TEST_IDEAS, user_messages


def assert_no_key(*texts: str) -> None:
    for t in texts:
        assert KEY not in t
        assert "SUPERSECRET" not in t


# ----- answers ---------------------------------------------------------------------------------
def test_structured_output_answer(server):
    server.push(Reply.completion(json.dumps(IDEAS), prompt_tokens=100, completion_tokens=20))
    client = make_client(server.url)
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and answer.ideas[0].category.value == "memory_access"
    assert call.structured and call.attempts == 1 and call.error == ""
    assert call.usage.prompt_tokens == 100 and call.usage.completion_tokens == 20
    body = server.chat_requests[0].body
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "IdeaList"
    assert fmt["json_schema"]["strict"] is True  # IdeaList can be made strict
    assert body["model"] == "test-model" and body["messages"] == user()
    assert server.chat_requests[0].authorization == f"Bearer {KEY}"


def test_kernelspec_schema_is_sent_non_strict():
    schema, strict = response_schema(KernelSpec)
    assert strict is False and schema == KernelSpec.model_json_schema()
    strict_schema, ok = response_schema(IdeaList)
    assert ok and strict_schema["additionalProperties"] is False
    idea = strict_schema["$defs"]["Idea"]
    assert set(idea["required"]) == {"text", "category", "expected_effect"} and "default" not in json.dumps(idea)


def test_fallback_when_response_format_is_rejected(server):
    def endpoint(req):
        if "response_format" in req.body:
            return Reply.error(400, "response_format not supported by this server")
        return Reply.completion("Here you go:\n```json\n" + json.dumps(IDEAS) + "\n```\nDone.")

    server.default = endpoint
    client = make_client(server.url)
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and len(answer.ideas) == 1
    assert call.structured is False and call.attempts == 2
    assert not client.structured_supported
    # remembered: the next call goes straight to plain text
    _, call2 = client.complete(user(), IdeaList, purpose="ideas")
    assert call2.attempts == 1 and "response_format" not in server.chat_requests[-1].body


def test_plain_text_answer_when_response_format_ignored(server):
    spec = softmax_spec_dict()
    source = spec.pop("source")
    text = f"I will use one block per row.\n```cuda\n{source}```\nLaunch plan:\n```json\n{json.dumps(spec)}\n```"
    server.push(Reply.completion(text))
    answer, call = make_client(server.url).complete(user(), KernelSpec, purpose="implement")
    assert isinstance(answer, KernelSpec) and "softmax_rows" in answer.source
    assert call.response_text == text


def test_text_completion_without_model(server):
    server.push(Reply.completion("just text"))
    answer, call = make_client(server.url).complete(user(), None, purpose="chat")
    assert answer == "just text" and "response_format" not in server.chat_requests[0].body


def test_unreadable_answer_raises_answer_error_with_call(server):
    server.push(Reply.completion("{not json"))
    client = make_client(server.url)
    with pytest.raises(AnswerError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    assert "invalid JSON" in str(info.value) and not info.value.truncated
    call = info.value.call
    assert isinstance(call, LLMCall) and call.error == str(info.value) and call.attempts == 1
    assert client.usage_total.failed_calls == 1


def test_answer_still_cut_off_after_the_retry(server):
    server.push(Reply.completion("{not json", finish_reason="length", completion_tokens=5),
                Reply.completion('{"ideas": [', finish_reason="length", completion_tokens=8192))
    client = make_client(server.url)
    with pytest.raises(AnswerError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    err = info.value
    assert "finish_reason=length" in str(err) and err.truncated
    assert err.call.attempts == 2 and err.call.usage.completion_tokens == 5 + 8192 and err.call.error == str(err)
    # nothing configured: twice what the endpoint counted, at least 8192
    assert [r.body.get("max_completion_tokens") for r in server.chat_requests] == [None, 8192]
    assert client.usage_total.failed_calls == 1 and client.usage_total.calls == 1


# ----- retries -----------------------------------------------------------------------------------
def test_429_with_retry_after_then_success(server):
    server.push(Reply.error(429, "rate limited", headers={"Retry-After": "1"}), Reply.completion(json.dumps(IDEAS)))
    client = make_client(server.url)
    t0 = time.perf_counter()
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert call.attempts == 2 and isinstance(answer, IdeaList)
    assert time.perf_counter() - t0 >= 0.9  # Retry-After honoured over the tiny backoff
    assert call.latency_ms >= 900


def test_500_until_retry_budget_ends(server):
    server.default = Reply.error(500, "upstream exploded")
    client = make_client(server.url, max_retries=2)
    with pytest.raises(LLMError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    err = info.value
    assert len(server.chat_requests) == 3 and err.attempts == 3 and err.call.attempts == 3
    assert err.kind == "gave_up" and not err.fatal
    assert "HTTP 500" in str(err) and "upstream exploded" in str(err) and "\n" not in str(err)


def test_timeout_retried_then_success(server):
    server.push(Reply.completion("late", delay_s=1.0), Reply.completion("on time"))
    client = make_client(server.url, timeout_s=0.3, max_retries=2)
    answer, call = client.complete(user(), None, purpose="chat")
    assert answer == "on time" and call.attempts == 2


def test_timeout_until_budget_ends(server):
    server.default = Reply.completion("late", delay_s=1.0)
    client = make_client(server.url, timeout_s=0.2, max_retries=1)
    with pytest.raises(LLMError) as info:
        client.complete(user(), None, purpose="chat")
    assert "timed out after 0.2s" in str(info.value) and info.value.attempts == 2


@pytest.mark.parametrize(
    "status,message,kind,needle",
    [
        (401, "Incorrect API key provided", "auth", "authentication failed"),
        (403, "forbidden", "auth", "authentication failed"),
        (404, "The model `test-model` does not exist", "not_found", "model 'test-model' not found"),
        (400, "This model's maximum context length is 8192 tokens", "context_length", "context length exceeded"),
        (400, "messages: field required", "bad_request", "bad request"),
    ],
)
def test_errors_that_cannot_succeed_abort_at_once(server, status, message, kind, needle):
    server.default = Reply.error(status, message)
    client = make_client(server.url)
    with pytest.raises(LLMError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    err = info.value
    # a 400 to a structured request is asked once more without response_format, which fails too;
    # not a prompt too long for the context: it is too long either way
    sent = 2 if status == 400 and kind != "context_length" else 1
    assert len(server.chat_requests) == sent and err.attempts == sent and err.call.attempts == sent
    assert err.kind == kind and needle in str(err) and "\n" not in str(err)
    assert ("response_format" in server.chat_requests[-1].body) == (sent == 1)
    assert client.structured_supported  # the plain request failed too: response_format was not the cause
    with pytest.raises(LLMError):
        client.complete(user(), None, purpose="chat")  # no response_format: no second request
    assert len(server.chat_requests) == sent + 1


def test_unreachable_endpoint_one_line():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    client = make_client(url, max_retries=1)
    with pytest.raises(LLMError) as info:
        client.complete(user(), None, purpose="chat")
    text = str(info.value)
    assert text.startswith(f"cannot reach {url}: connection refused") and "\n" not in text
    assert info.value.kind == "unreachable"


# ----- the key never leaks ------------------------------------------------------------------------
def test_key_never_leaks_even_when_echoed(server, caplog):
    caplog.set_level(logging.DEBUG)

    def echo(status):
        return lambda req: Reply.error(status, f"bad credentials: got header '{req.authorization}' (key {KEY})")

    client = make_client(server.url, max_retries=1)
    texts: list[str] = []
    calls: list[LLMCall] = []
    client.on_call = calls.append
    for status in (401, 500, 400):
        server.default = echo(status)
        with pytest.raises(LLMError) as info:
            client.complete(user(), IdeaList, purpose="ideas")
        err = info.value
        texts += [str(err), repr(err), err.call.model_dump_json(), repr(err.call)]
        texts.append("".join(traceback.format_exception(err)))
        assert err.__cause__ is None and err.__context__ is None  # the SDK error is not chained
        assert "***" in str(err)
    # an answer that echoes the key is scrubbed too
    server.default = lambda req: Reply.completion(f"your header was {req.authorization}")
    answer, call = client.complete(user(), None, purpose="chat")
    texts += [answer, call.model_dump_json()]
    texts += [c.model_dump_json() for c in calls]
    texts += [repr(client), repr(client.config), client.config.model_dump_json(), str(client.config.model_dump())]
    texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert_no_key(*texts)
    assert any("retrying" in r.getMessage() for r in caplog.records)  # the 500 was logged, scrubbed


def test_scrub_helper():
    assert scrub(f"Authorization: Bearer {KEY}", SecretStr(KEY)) == "Authorization: Bearer ***"
    assert scrub(f"key={KEY}!", KEY) == "key=***!"
    assert scrub("Bearer abc.def", None) == "Bearer ***"


# ----- usage, hooks, concurrency -------------------------------------------------------------------
def test_usage_summed_and_cost(server):
    server.push(
        Reply.completion("a", prompt_tokens=1000, completion_tokens=100),
        Reply.completion("b", prompt_tokens=2000, completion_tokens=300),
    )
    client = make_client(server.url, price_in_per_mtok=2.0, price_out_per_mtok=8.0)
    seen: list[LLMCall] = []
    client.on_call = seen.append
    _, c1 = client.complete(user(), None, purpose="chat")
    _, c2 = client.complete(user(), None, purpose="chat")
    assert c1.usage.cost_usd == pytest.approx((1000 * 2 + 100 * 8) / 1e6)
    total = client.usage_total
    assert (total.prompt_tokens, total.completion_tokens, total.calls) == (3000, 400, 2)
    assert total.total_tokens == 3400
    assert total.cost_usd == pytest.approx((3000 * 2 + 400 * 8) / 1e6)
    assert seen == [c1, c2]


def test_usage_without_prices_has_no_cost(server):
    server.push(Reply.completion("a"))
    client = make_client(server.url)
    _, call = client.complete(user(), None, purpose="chat")
    assert call.usage.cost_usd is None and client.usage_total.cost_usd is None


def test_concurrency_bounded(server):
    server.default = Reply.completion("ok", delay_s=0.2)
    client = make_client(server.url, max_concurrency=2)
    threads = [threading.Thread(target=client.complete, args=(user(),), kwargs={"purpose": "chat"}) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.chat_requests) == 6
    assert server.max_in_flight == 2
    assert client.usage_total.calls == 6


# ----- check() -------------------------------------------------------------------------------------
def test_check_ok(server):
    server.push(Reply.completion("OK"))
    call = make_client(server.url).check()
    assert call.purpose == "check" and call.response_text == "OK"
    assert server.chat_requests[0].body["max_completion_tokens"] == 16


def test_check_wrong_key(server):
    server.default = Reply.error(401, "Incorrect API key provided")
    with pytest.raises(LLMError, match=r"^authentication failed"):
        make_client(server.url).check()
    assert len(server.chat_requests) == 1


def test_check_unknown_model(server):
    server.default = Reply.error(404, "model 'test-model' not found", code="model_not_found")
    with pytest.raises(LLMError, match=r"^model 'test-model' not found"):
        make_client(server.url).check()


def test_check_unreachable():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(LLMError, match=r"^cannot reach http://127\.0\.0\.1:\d+/v1: connection refused"):
        make_client(url).check()


def test_check_without_max_completion_tokens_support(server):
    def endpoint(req):
        if "max_completion_tokens" in req.body:
            return Reply.error(400, "Unrecognized request argument supplied: max_completion_tokens")
        return Reply.completion("OK")

    server.default = endpoint
    assert make_client(server.url).check().response_text == "OK"


# ----- configuration ---------------------------------------------------------------------------------
def test_from_env(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(LLMError, match=r"^no API key: set OPENAI_API_KEY$"):
        LLMConfig.from_env(model="gpt-x")
    # a local server needs no key: the placeholder EMPTY is used
    local = LLMConfig.from_env(model="qwen", base_url="http://localhost:8000/v1")
    assert local.api_key.get_secret_value() == "EMPTY" and local.is_local
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://llm.example.com/v1/")
    cfg = LLMConfig.from_env(model="gpt-x", max_concurrency=8)
    assert cfg.base_url == "https://llm.example.com/v1" and cfg.max_concurrency == 8
    assert cfg.api_key.get_secret_value() == KEY
    assert_no_key(repr(cfg), str(cfg), cfg.model_dump_json())
    explicit = LLMConfig.from_env(model="gpt-x", base_url="https://other.example/v1", api_key="EMPTY")
    assert explicit.api_key.get_secret_value() == "EMPTY"
    with pytest.raises(LLMError, match="invalid LLM configuration"):
        LLMConfig.from_env(model="gpt-x", base_url="not a url")


def test_wrong_base_url_is_not_reported_as_a_missing_model(server):
    server.default = Reply(404, {"detail": "Not Found"})
    with pytest.raises(LLMError, match=r"/chat/completions not found \(check base_url") as info:
        make_client(server.url).complete(user(), None, purpose="chat")
    assert info.value.kind == "no_endpoint" and info.value.fatal and info.value.attempts == 1


def test_a_page_that_is_no_chat_api(server):
    server.default = Reply(200, "<html><body>Welcome</body></html>")
    with pytest.raises(LLMError, match="did not answer like a chat-completions API"):
        make_client(server.url).complete(user(), None, purpose="chat")


def test_short_local_token_scrubbed_only_where_it_stands_alone():
    assert scrub("check token k here", "k") == "check token *** here"


def test_structured_off_sends_no_response_format(server):
    server.push(Reply.completion("```json\n" + json.dumps(IDEAS) + "\n```"))
    answer, call = make_client(server.url, structured=False).complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and not call.structured
    assert "response_format" not in server.chat_requests[0].body
