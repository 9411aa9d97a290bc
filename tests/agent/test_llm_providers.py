"""LLMClient with the knobs real providers and reasoning models need, against the scripted local
server (tests/fakes/llm_server.py): request fields, the structured-output fallback whatever a
provider's 400 says, the retry of a cut-off answer, usage details, the model's context."""

from __future__ import annotations

import json
import logging
import time

import pytest
from pydantic import SecretStr

from kerngen.agent.llm.answers import AnswerError, IdeaList
from kerngen.agent.llm.client import LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.endpoint import _Prober, truncation_warning
from kerngen.errors import LLMError
from kerngen.redact import register_secret
from tests.fakes.llm_server import Reply, TEST_IDEAS, TEST_KEY, make_test_client, user_messages



make_client = make_test_client  # the shared fixture ``server`` is in conftest.py
KEY, IDEAS, user = TEST_KEY, TEST_IDEAS, user_messages


def config(**knobs) -> LLMConfig:
    return LLMConfig(model="m", base_url="http://localhost:8000/v1", api_key=SecretStr(KEY), **knobs)


# ----- request fields --------------------------------------------------------------------------------
def test_reasoning_effort_extra_body_and_output_budget_in_every_request(server):
    server.default = Reply.completion(json.dumps(IDEAS))
    client = make_client(server.url, reasoning_effort="High", max_output_tokens=3000,
                         extra_body={"top_p": 0.9, "reasoning": {"exclude": True}})
    client.check()
    client.complete(user(), IdeaList, purpose="ideas")
    client.complete(user(), None, purpose="chat")
    bodies = [r.body for r in server.chat_requests]
    assert len(bodies) == 3
    for body in bodies:
        assert body["reasoning_effort"] == "high" and body["top_p"] == 0.9 and body["reasoning"] == {"exclude": True}
        assert body["model"] == "test-model"
    assert bodies[0]["max_completion_tokens"] == 16  # the check stays cheap
    assert [b["max_completion_tokens"] for b in bodies[1:]] == [3000, 3000]
    assert "response_format" in bodies[1] and "response_format" not in bodies[2]


def test_no_optional_fields_unless_configured(server):
    server.push(Reply.completion("hi"))
    make_client(server.url).complete(user(), None, purpose="chat")
    assert set(server.chat_requests[0].body) == {"model", "messages"}


def test_timeout_is_per_request_and_defaults_to_120():
    assert config().timeout_s == 120.0
    assert config().max_output_tokens_cap == 65536


@pytest.mark.parametrize("extra,needle", [
    ({"model": "other"}, "may not set 'model'"),
    ({"messages": []}, "may not set 'messages'"),
    ({"stream": True}, "may not set 'stream'"),
    ({"max_completion_tokens": 5}, "use the max_output_tokens setting"),
    ({"reasoning_effort": "low"}, "use the reasoning_effort setting"),
    ({"x": float("nan")}, "not JSON-serialisable"),
    ({"x": object()}, "not JSON-serialisable"),
    ({"x": "y" * 20000}, "at most 16384"),
    ({"api_key": KEY}, "holds the API key"),
])
def test_extra_body_rejected(extra, needle):
    with pytest.raises(ValueError, match=needle):
        config(extra_body=extra)
    with pytest.raises(LLMError, match=f"^invalid LLM configuration: .*{needle}"):
        LLMConfig.from_env("m", "http://localhost:8000/v1", api_key=KEY, extra_body=extra)


def test_reasoning_effort_must_be_a_word():
    assert config(reasoning_effort=" Minimal ").reasoning_effort == "minimal"
    with pytest.raises(ValueError, match="reasoning_effort"):
        config(reasoning_effort="high; drop")


def test_extra_body_is_a_copy_and_redacted(server):
    secret = "tok-0123456789-another-secret"
    register_secret(secret)  # a secret of the environment, pasted into an extra field
    extra = {"user": f"id {secret}", "top_p": 0.5}
    server.push(Reply.completion("hi"))
    client = make_client(server.url, extra_body=extra)
    extra["top_p"] = 0.1
    assert client.config.extra_body["top_p"] == 0.5
    client.complete(user(), None, purpose="chat")
    body = server.chat_requests[0].body
    assert body["top_p"] == 0.5 and secret not in json.dumps(body) and "[redacted]" in body["user"]


# ----- structured output fallback ---------------------------------------------------------------------
@pytest.mark.parametrize("status,message", [
    (400, "Invalid parameter: unsupported field 'foo'"),
    (400, "bad request"),
    (422, "Unprocessable Entity"),
])
def test_fallback_whatever_the_refusal_says(server, status, message):
    def endpoint(req):
        if "response_format" in req.body:
            return Reply.error(status, message)
        return Reply.completion("```json\n" + json.dumps(IDEAS) + "\n```")

    server.default = endpoint
    client = make_client(server.url)
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and call.attempts == 2 and not call.structured
    assert not client.structured_supported
    _, call2 = client.complete(user(), IdeaList, purpose="ideas")
    assert call2.attempts == 1 and "response_format" not in server.chat_requests[-1].body


def test_no_fallback_remembered_when_the_plain_request_fails_too(server):
    server.push(Reply.error(400, "bad request"), Reply.error(400, "messages[1]: invalid role"))
    client = make_client(server.url)
    with pytest.raises(LLMError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    assert info.value.kind == "bad_request" and "invalid role" in str(info.value) and info.value.fatal
    assert client.structured_supported
    assert [("response_format" in r.body) for r in server.chat_requests] == [True, False]


def test_fallback_then_transient_error_is_retried(server):
    server.push(Reply.error(400, "nope"), Reply.error(503, "busy"),
                Reply.error(400, "nope"), Reply.completion(json.dumps(IDEAS)))
    client = make_client(server.url)
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and call.attempts == 4 and not client.structured_supported


# ----- a cut-off answer is asked again with a larger output budget ------------------------------------------
def test_cut_off_retry_doubles_the_configured_budget(server):
    server.push(Reply.completion('{"ideas": [{"text": "vec', finish_reason="length", prompt_tokens=100,
                                 completion_tokens=1000, reasoning_tokens=900),
                Reply.completion(json.dumps(IDEAS), prompt_tokens=100, completion_tokens=1500))
    client = make_client(server.url, max_output_tokens=1000, price_in_per_mtok=1.0, price_out_per_mtok=10.0)
    answer, call = client.complete(user(), IdeaList, purpose="ideas")
    assert isinstance(answer, IdeaList) and call.error == "" and call.finish_reason == "stop"
    assert [r.body["max_completion_tokens"] for r in server.chat_requests] == [1000, 2000]
    assert call.attempts == 2 and call.usage.calls == 1
    assert (call.usage.prompt_tokens, call.usage.completion_tokens, call.usage.reasoning_tokens) == (200, 2500, 900)
    assert call.usage.cost_usd == pytest.approx((200 * 1 + 2500 * 10) / 1e6)
    total = client.usage_total
    assert (total.calls, total.failed_calls, total.completion_tokens) == (1, 0, 2500)


@pytest.mark.parametrize("knobs,completion,expected", [
    ({}, 6000, [None, 12000]),  # twice what the endpoint counted
    ({}, 100, [None, 8192]),  # at least 8192
    ({"max_output_tokens": 40000}, 40000, [40000, 65536]),  # at most the cap
    ({"max_output_tokens_cap": 10000}, 7000, [None, 10000]),
    ({"max_output_tokens": 65536}, 65536, [65536]),  # at the cap already: no retry
])
def test_cut_off_retry_budget(server, knobs, completion, expected):
    server.default = Reply.completion("{not json", finish_reason="length", completion_tokens=completion)
    client = make_client(server.url, **knobs)
    with pytest.raises(AnswerError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    assert info.value.truncated and "finish_reason=length" in str(info.value)
    assert [r.body.get("max_completion_tokens") for r in server.chat_requests] == expected


def test_cut_off_retry_refused_by_the_endpoint_ends_with_the_answer_error(server):
    server.push(Reply.completion("{not json", finish_reason="length", completion_tokens=8192),
                Reply.error(400, "max_completion_tokens is too large: 16384. This model supports at most 8192"))
    client = make_client(server.url, structured=False)
    with pytest.raises(AnswerError) as info:
        client.complete(user(), IdeaList, purpose="ideas")
    err = info.value
    assert err.truncated and "asked again with max_completion_tokens=16384" in str(err) and "too large" in str(err)
    assert err.call.attempts == 2 and err.call.usage.completion_tokens == 8192
    assert client.usage_total.failed_calls == 1


def test_cut_off_text_answer_is_not_retried(server):
    server.push(Reply.completion("partial", finish_reason="length"))
    answer, call = make_client(server.url).complete(user(), None, purpose="chat")
    assert answer == "partial" and call.attempts == 1 and call.finish_reason == "length"


def test_refusal_is_not_retried(server):
    body = Reply.completion(None, finish_reason="length")
    body.body["choices"][0]["message"]["refusal"] = "I cannot help with that"
    server.push(body)
    with pytest.raises(AnswerError, match="the model refused") as info:
        make_client(server.url).complete(user(), IdeaList, purpose="ideas")
    assert not info.value.truncated and len(server.chat_requests) == 1


def test_cut_off_retry_stays_within_the_known_context(server):
    server.routes["/v1/models"] = Reply.models({"id": "test-model", "max_model_len": 12000})
    server.push(Reply.completion("OK"),
                Reply.completion("{not json", finish_reason="length", prompt_tokens=4000, completion_tokens=4000),
                Reply.completion(json.dumps(IDEAS)))
    client = make_client(server.url)
    client.check()
    client.complete(user(), IdeaList, purpose="ideas")
    assert server.chat_requests[-1].body["max_completion_tokens"] == 8000  # 12000 - 4000 prompt tokens


def test_output_budget_named_max_tokens_where_max_completion_tokens_is_unknown(server):
    def endpoint(req):
        if "max_completion_tokens" in req.body:
            return Reply.error(400, "Unrecognized request argument supplied: max_completion_tokens")
        return Reply.completion("OK")

    server.default = endpoint
    client = make_client(server.url, max_output_tokens=500)
    client.check()
    client.complete(user(), None, purpose="chat")
    assert server.chat_requests[-1].body["max_tokens"] == 500


# ----- usage details ------------------------------------------------------------------------------------
def test_cached_and_reasoning_tokens_recorded_summed_and_priced(server):
    server.push(Reply.completion("a", prompt_tokens=1000, completion_tokens=300, cached_tokens=800, reasoning_tokens=250),
                Reply.completion("b", prompt_tokens=2000, completion_tokens=100,
                                 usage_extra={"prompt_cache_hit_tokens": 1500, "prompt_cache_miss_tokens": 500}),
                Reply.completion("c", prompt_tokens=10, completion_tokens=1))
    client = make_client(server.url, price_in_per_mtok=2.0, price_cached_in_per_mtok=0.5, price_out_per_mtok=8.0)
    _, c1 = client.complete(user(), None, purpose="chat")
    _, c2 = client.complete(user(), None, purpose="chat")
    _, c3 = client.complete(user(), None, purpose="chat")
    assert (c1.usage.cached_tokens, c1.usage.reasoning_tokens) == (800, 250)
    assert (c2.usage.cached_tokens, c2.usage.reasoning_tokens) == (1500, 0)  # DeepSeek's flat field
    assert (c3.usage.cached_tokens, c3.usage.reasoning_tokens) == (0, 0)
    assert c1.usage.cost_usd == pytest.approx((200 * 2 + 800 * 0.5 + 300 * 8) / 1e6)
    total = client.usage_total
    assert (total.cached_tokens, total.reasoning_tokens, total.prompt_tokens) == (2300, 250, 3010)
    assert total.cost_usd == pytest.approx(c1.usage.cost_usd + c2.usage.cost_usd + c3.usage.cost_usd)
    assert json.loads(c1.model_dump_json())["usage"]["cached_tokens"] == 800


def test_cached_tokens_priced_as_input_without_a_cached_price():
    cfg = config(price_in_per_mtok=2.0, price_out_per_mtok=8.0)
    assert cfg.cost_usd(1000, 100, cached_tokens=600) == pytest.approx((1000 * 2 + 100 * 8) / 1e6)
    assert cfg.cost_usd(1000, 0, cached_tokens=5000) == pytest.approx(1000 * 2 / 1e6)


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": None, "completion_tokens_details": "x"},
    {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": -3}},
    {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": "seven"},
     "completion_tokens_details": {"reasoning_tokens": 1.5}},
    {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": [1, 2]},
])
def test_odd_usage_details_read_as_zero(server, usage):
    reply = Reply.completion("a")
    reply.body["usage"] = usage
    server.push(reply)
    _, call = make_client(server.url).complete(user(), None, purpose="chat")
    assert (call.usage.cached_tokens, call.usage.reasoning_tokens) == (0, 0) and call.usage.prompt_tokens == 10


# ----- the model's context --------------------------------------------------------------------------------
@pytest.mark.parametrize("entry,tokens", [
    ({"id": "test-model", "max_model_len": 32768}, 32768),  # vLLM
    ({"id": "test-model", "context_length": 131072, "pricing": {}}, 131072),  # OpenRouter, LM Studio
    ({"id": "test-model", "context_window": 8192}, 8192),  # Groq
    ({"id": "test-model", "top_provider": {"context_length": 65536}}, 65536),
])
def test_context_from_the_model_listing(server, entry, tokens):
    server.push(Reply.completion("OK"))
    server.routes["/v1/models"] = Reply.models({"id": "other", "max_model_len": 1}, entry)
    client = make_client(server.url)
    assert client.context_tokens is None
    client.check()
    assert client.context_tokens == tokens and not client.context.ollama
    probes = server.other_requests
    assert [(r.method, r.path) for r in probes] == [("GET", "/v1/models")]
    assert probes[0].authorization == f"Bearer {KEY}"
    assert client.requests_made == 1  # probes are no LLM requests


def test_context_from_the_model_route(server):
    server.push(Reply.completion("OK"))
    server.routes["/v1/models"] = Reply.models({"id": "other-model"})
    server.routes["/v1/models/org%2Ftest-model"] = Reply(200, {"id": "org/test-model", "context_length": 200000})
    client = LLMClient(LLMConfig(model="org/test-model", base_url=server.url, api_key=SecretStr(KEY)))
    client.check()
    assert client.context_tokens == 200000


def test_context_unknown_leaves_no_trace(server, caplog):
    caplog.set_level(logging.DEBUG)
    server.push(Reply.completion("OK"))
    server.routes["/v1/models"] = Reply(200, "<html>not json</html>")
    server.routes["/v1/models/test-model"] = Reply(500, {"error": {"message": f"boom {KEY}"}})
    server.routes["/api/version"] = Reply(200, b"{broken")
    client = make_client(server.url)
    call = client.check()
    assert call.response_text == "OK" and client.context_tokens is None and not client.context.ollama
    assert client.warn_if_context_small(10**6) is None
    assert [r.path for r in server.other_requests] == ["/v1/models", "/v1/models/test-model", "/api/version"]
    assert KEY not in caplog.text


def test_probe_timeout_is_bounded(server):
    server.push(Reply.completion("OK"))
    server.routes["/v1/models"] = Reply.models({"id": "test-model", "max_model_len": 4096})
    server.routes["/v1/models"].delay_s = 2.0
    client = make_client(server.url, timeout_s=0.3)
    t0 = time.perf_counter()
    client.check()
    assert client.context_tokens is None and time.perf_counter() - t0 < 1.8


def _ollama(server, *, ps=None, show=None):
    server.routes["/v1/models"] = Reply.models({"id": "test-model", "owned_by": "library"})
    server.routes["/api/version"] = Reply(200, {"version": "0.6.8"})
    if ps is not None:
        server.routes["/api/ps"] = Reply(200, ps)
    if show is not None:
        server.routes["/api/show"] = Reply(200, show)


def test_ollama_num_ctx(server):
    server.push(Reply.completion("OK"))
    _ollama(server, show={"parameters": "stop \"<|im_end|>\"\nnum_ctx                        8192\ntemperature 0.7",
                          "model_info": {"qwen2.context_length": 32768}})
    client = make_client(server.url)
    client.check()
    assert client.context_tokens == 8192 and client.context.ollama and client.context.served
    show = [r for r in server.other_requests if r.path == "/api/show"][0]
    assert show.method == "POST" and show.body == {"model": "test-model"} and show.authorization == f"Bearer {KEY}"
    assert client.warn_if_context_small(8000) is None
    line = client.warn_if_context_small(40000)
    assert line and "8192 tokens" in line and "OLLAMA_CONTEXT_LENGTH" in line and "num_ctx" in line
    assert "\n" not in line


def test_ollama_running_context_wins(server):
    server.push(Reply.completion("OK"))
    _ollama(server, ps={"models": [{"name": "test-model:latest", "model": "test-model:latest", "context_length": 4096}]},
            show={"parameters": "num_ctx 8192"})
    client = make_client(server.url)
    client.check()
    assert client.context_tokens == 4096 and client.context.source.startswith("Ollama /api/ps")


def test_ollama_default_context_warned(server):
    server.push(Reply.completion("OK"))
    _ollama(server, show={"parameters": "stop x", "model_info": {"llama.context_length": 131072}})
    client = make_client(server.url)
    client.check()
    assert client.context_tokens == 131072 and client.context.ollama and not client.context.served
    assert client.warn_if_context_small(5000) is None
    line = client.warn_if_context_small(30000)
    assert line and "Ollama" in line and "OLLAMA_CONTEXT_LENGTH" in line and "num_ctx" in line


def test_ollama_detected_by_port_alone():
    # the detection, without a server on port 11434
    cfg = LLMConfig(model="m", base_url="http://localhost:11434/v1", api_key=SecretStr("EMPTY"))
    prober = _Prober(None, cfg)  # type: ignore[arg-type]
    assert prober.port == 11434 and prober.root == "http://localhost:11434"


def test_a_version_route_alone_is_no_ollama(server):
    server.push(Reply.completion("OK"))
    server.routes["/api/version"] = Reply(200, {"version": "1.0"})
    client = make_client(server.url)
    client.check()
    assert not client.context.ollama and client.warn_if_context_small(10**6) is None


def test_warn_if_context_small(server):
    server.push(Reply.completion("OK"))
    server.routes["/v1/models"] = Reply.models({"id": "test-model", "max_model_len": 4096})
    client = make_client(server.url)
    client.check()
    assert client.warn_if_context_small(14000) is None  # 4000 tokens
    line = client.warn_if_context_small(20000)  # 5714 tokens
    assert line and "about 5714 tokens" in line and "4096 tokens" in line and "max_model_len" in line
    assert "Ollama" not in line


def test_truncated_prompt_warned_once(server, caplog):
    caplog.set_level(logging.WARNING)
    server.default = Reply.completion("ok", prompt_tokens=500)
    client = make_client(server.url)
    client.complete(user("x" * 1000), None, purpose="chat")  # short prompts are not judged
    assert client.warnings == []
    client.complete(user("word " * 2000), None, purpose="chat")  # 10000 chars: about 2500 tokens
    client.complete(user("word " * 2000), None, purpose="chat")
    assert len(client.warnings) == 1
    assert client.warnings[0].startswith("the endpoint counted 500 prompt tokens for a prompt of about 250")
    assert "Ollama's num_ctx" in client.warnings[0]
    assert sum("may have truncated" in r.getMessage() for r in caplog.records) == 1


def test_truncation_heuristic():
    assert truncation_warning(10000, 0) is None  # not reported
    assert truncation_warning(10000, 999) is not None
    assert truncation_warning(10000, 1000) is None
    assert truncation_warning(2000, 10) is None


def test_probe_routes_do_not_take_scripted_replies(server):
    server.push(Reply.completion("first"), Reply.completion("second"))
    client = make_client(server.url)
    client.check()
    _, call = client.complete(user(), None, purpose="chat")
    assert call.response_text == "second" and len(server.other_requests) == 3
