"""LLMProposer against the scripted local chat-completions server."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import SecretStr

from kerngen.agent.llm.client import LLMCall, LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.proposer import Category, Failure, Idea, Proposer
from kerngen.errors import LLMError
from tests.fakes.llm_server import ChatServer, Reply, make_context, softmax_spec_dict

IDEA = Idea(text="Cache the row in registers and do one pass", category=Category.memory_access)


@pytest.fixture
def server():
    with ChatServer() as s:
        yield s


@pytest.fixture
def ctx():
    return make_context()


def proposer(server, **knobs):
    cfg = dict(backoff_base_s=0.001, backoff_max_s=0.01, timeout_s=5.0, max_concurrency=3)
    cfg.update(knobs)
    calls: list[LLMCall] = []
    client = LLMClient(LLMConfig(model="m", base_url=server.url, api_key=SecretStr("sk-x"), **cfg))
    return LLMProposer(client, on_call=calls.append), calls


def user_text(req) -> str:
    return req.body["messages"][-1]["content"]


def test_is_a_proposer(server):
    p, _ = proposer(server)
    assert p.name == "llm"
    assert isinstance(p, object) and all(hasattr(p, n) for n in ("ideas", "implement", "repair"))
    _: Proposer = p  # structural typing


def test_ideas(server, ctx):
    context, parent, _ = ctx
    ideas = [{"text": f"idea {i}", "category": c.value, "expected_effect": "faster"} for i, c in enumerate(Category)]
    server.push(Reply.completion(json.dumps({"ideas": ideas})))
    p, calls = proposer(server)
    got = p.ideas(context, parent, k=4)
    assert [i.text for i in got] == ["idea 0", "idea 1", "idea 2", "idea 3"]
    assert len(calls) == 1 and calls[0].purpose == "ideas"
    body = server.chat_requests[0].body
    assert body["response_format"]["json_schema"]["name"] == "IdeaList"
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert "NVIDIA H200" in system and "propose 4" in user and "1.573 ms" in user


def test_ideas_asks_again_after_an_unreadable_answer(server, ctx):
    context, parent, _ = ctx
    server.push(Reply.completion("no idea, sorry"), Reply.completion(json.dumps({"ideas": [IDEA.model_dump()]})))
    p, calls = proposer(server)
    assert p.ideas(context, parent, k=3) == [IDEA]
    assert len(calls) == 2 and calls[0].error and not calls[1].error
    assert "could not be read" in user_text(server.chat_requests[1])


def test_ideas_gives_up_with_empty_list(server, ctx):
    context, parent, _ = ctx
    server.default = Reply.completion("still no JSON")
    p, calls = proposer(server)
    assert p.ideas(context, None, k=3) == []
    assert len(calls) == 2


def test_implement_branches_concurrently_and_never_raises_on_bad_answers(server, ctx):
    context, parent, _ = ctx
    good = softmax_spec_dict("branch_ok")
    invalid = softmax_spec_dict("branch_invalid")
    del invalid["steps"]

    def endpoint(req):
        branch = int(re.search(r"branch (\d) of 3", user_text(req)).group(1))
        text = {1: json.dumps(good), 2: "```json\n{\"name\": \"oops\",\n```", 3: json.dumps(invalid)}[branch]
        return Reply.completion(text, delay_s=0.2)

    server.default = endpoint
    p, calls = proposer(server)
    branches = p.implement(context, parent, IDEA, m=3)
    assert len(branches) == 3 and len(server.chat_requests) == 3
    assert branches[0].spec is not None and branches[0].spec.name == "branch_ok" and not branches[0].error
    assert branches[1].spec is None and "invalid JSON" in branches[1].error
    assert branches[2].spec is None and "steps" in branches[2].error
    assert server.max_in_flight == 3  # the three branches ran at once
    assert len(calls) == 3 and sum(bool(c.error) for c in calls) == 2
    approaches = {user_text(r).split("different from the other branches: ")[1].split(".")[0] for r in server.chat_requests}
    assert len(approaches) == 3  # each branch is asked for a different approach


def test_implement_first_kernel_without_parent(server, ctx):
    context, _, _ = ctx
    server.default = Reply.completion(json.dumps(softmax_spec_dict()))
    p, _ = proposer(server)
    (branch,) = p.implement(context, None, IDEA, m=1)
    assert branch.spec is not None and branch.notes == "one block per row, three passes"
    assert "no parent kernel" in user_text(server.chat_requests[0])


def test_implement_transient_failure_is_a_branch_error(server, ctx):
    context, parent, _ = ctx
    server.default = Reply.error(503, "overloaded")
    p, calls = proposer(server, max_retries=1)
    branches = p.implement(context, parent, IDEA, m=2)
    assert all(b.spec is None and "LLM call failed" in b.error for b in branches)
    assert len(calls) == 2 and all(c.attempts == 2 for c in calls)


def test_implement_fatal_error_propagates(server, ctx):
    context, parent, _ = ctx
    server.default = Reply.error(401, "Incorrect API key provided")
    p, calls = proposer(server)
    with pytest.raises(LLMError, match="authentication failed"):
        p.implement(context, parent, IDEA, m=2)
    assert calls and all(c.error for c in calls)


def test_repair_one_call_with_the_evidence(server, ctx):
    context, parent, failing = ctx
    fixed = softmax_spec_dict("fixed")
    server.push(Reply.completion(json.dumps(fixed)))
    p, calls = proposer(server)
    branch = p.repair(context, Failure(spec=parent.spec, result=failing), attempt=1)
    assert branch.spec is not None and branch.spec.name == "fixed"
    assert len(server.chat_requests) == 1 and calls[0].purpose == "repair"
    text = user_text(server.chat_requests[0])
    assert "failed check: mismatch" in text and "at index [17, 4095]" in text and "characters cut" in text
    assert len(text) < 20_000  # the 62 kB log was trimmed


def test_repair_unreadable_answer_is_a_branch_error(server, ctx):
    context, parent, failing = ctx
    server.push(Reply.completion("I think the bug is in line 3."))
    p, _ = proposer(server)
    branch = p.repair(context, Failure(spec=parent.spec, result=failing), attempt=2)
    assert branch.spec is None and "no JSON found" in branch.error and "line 3" in branch.notes


def test_usage_over_a_round(server, ctx):
    context, parent, _ = ctx
    server.default = Reply.completion(json.dumps(softmax_spec_dict()), prompt_tokens=1000, completion_tokens=200)
    p, _ = proposer(server)
    p.implement(context, parent, IDEA, m=3)
    total = p.client.usage_total
    assert (total.prompt_tokens, total.completion_tokens, total.calls) == (3000, 600, 3)
