"""What the LLM client and proposer tell the truth about (issue 36, item 2 and the prompt side of
item 3), against the local chat server: reasoning-channel answers, the output budget kept after
a cut-off, the cost of requests that never answered, the check counted, an interrupt that loses
no paid answer, two specs in one answer, a prompt too long for the context, and the repair prompt
of a huge source."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from kerngen.agent.budget import StopKind
from kerngen.agent.llm.answers import IdeaList, read_answers
from kerngen.agent.llm.prompting import SOURCE_LIMIT
from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.proposer import Category, Failure, Idea
from kerngen.errors import LLMError
from kerngen.harness.results import EvalResult, Verdict
from kerngen.harness.spec.spec import KernelSpec
from tests.fakes.llm_server import (SOFTMAX_CUDA, ChatServer, Reply, make_context, make_test_client,
                                    softmax_spec_dict, user_messages)

IDEA = Idea(text="one block per row", category=Category.memory_access)
SPEC = json.dumps(softmax_spec_dict("from-reasoning"))


@pytest.fixture
def server():
    with ChatServer() as s:
        yield s


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_answer_only_in_the_reasoning_channel_is_read(server, field):
    server.push(Reply.completion("", reasoning="Let me think. The spec:\n```json\n" + SPEC + "\n```",
                                 reasoning_field=field))
    client = make_test_client(server.url)
    spec, call = client.complete(user_messages(), KernelSpec, purpose="implement")
    assert spec.name == "from-reasoning" and call.channel == "reasoning"


def test_content_wins_over_the_reasoning_channel(server):
    server.push(Reply.completion(SPEC, reasoning="thinking about something else"))
    spec, call = make_test_client(server.url).complete(user_messages(), KernelSpec, purpose="implement")
    assert spec.name == "from-reasoning" and call.channel == "content"


def test_an_unreadable_reasoning_answer_says_where_it_was_read(server):
    server.push(Reply.completion(None, reasoning="I would use one block per row."))
    with pytest.raises(Exception) as info:
        make_test_client(server.url).complete(user_messages(), KernelSpec, purpose="implement")
    assert "reasoning channel" in str(info.value) and "empty" not in str(info.value).split("(")[0]


def test_a_cut_off_answer_raises_the_budget_for_the_rest_of_the_search(server):
    asked: list[int | None] = []

    def model(req):
        budget = req.body.get("max_completion_tokens")
        asked.append(budget)
        if budget is None:
            return Reply.completion(SPEC[:300], finish_reason="length", completion_tokens=4096)
        return Reply.completion(SPEC)

    server.default = model
    client = make_test_client(server.url)
    client.complete(user_messages(), KernelSpec, purpose="implement")
    client.complete(user_messages(), KernelSpec, purpose="implement")
    assert asked == [None, 8192, 8192]  # the second call starts at the raised budget
    (warning,) = [w for w in client.warnings if "--max-output-tokens" in w]
    assert "--max-output-tokens 8192" in warning and "4096" in warning


def test_timed_out_requests_count_in_tokens_and_cost_as_estimates(server):
    """Every attempt timed out (a request the endpoint probably billed): each is counted in
    the call's tokens and cost, marked estimated; a reply read is not an estimate."""
    server.default = Reply.completion("late", delay_s=1.0)
    calls = []
    client = make_test_client(server.url, timeout_s=0.2, max_retries=1, price_in_per_mtok=1.0, price_out_per_mtok=2.0)
    client.on_call = calls.append
    with pytest.raises(LLMError):
        client.complete(user_messages("x" * 3000), None, purpose="chat")
    (call,) = calls
    assert call.attempts == 2 and call.cause == "timeout"
    assert call.usage.estimated_tokens == call.usage.total_tokens > 2 * 1000  # two ~1000-token prompts, at least
    assert call.usage.cost_usd is not None and call.usage.cost_usd > 0
    assert client.usage_total.cost_usd == pytest.approx(call.usage.cost_usd)


def test_the_check_is_journaled_once_the_journal_exists(server):
    server.default = Reply.completion("OK", prompt_tokens=12, completion_tokens=1)
    client = make_test_client(server.url)
    client.check()
    seen = []
    p = LLMProposer(client, on_call=seen.append)
    assert seen == []  # the journal does not exist yet
    p.report_earlier_calls()
    assert [c.purpose for c in seen] == ["check"] and seen[0].usage.prompt_tokens == 12
    p.report_earlier_calls()
    assert len(seen) == 1  # once


def test_an_interrupt_reports_the_calls_in_flight_and_nothing_after(server):
    """Ctrl-C with two requests in flight: both are reported at once (estimated), their
    requests are cut within a second, and nothing more is reported or sent."""
    server.default = Reply.completion(SPEC, delay_s=5.0)
    seen = []
    client = make_test_client(server.url, timeout_s=30.0, max_concurrency=2, price_in_per_mtok=1.0,
                              price_out_per_mtok=1.0)
    client.on_call = seen.append
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            client.complete(user_messages(), KernelSpec, purpose="implement")
        except BaseException as exc:  # noqa: BLE001 - what the thread ended with
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while server.in_flight < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    reported = client.abandon()
    for t in threads:
        t.join(5)
    assert time.monotonic() - t0 < 2.0 and not any(t.is_alive() for t in threads)  # not the 5 s reply
    assert len(reported) == 2 and seen == reported
    assert all(c.cause == "interrupted" and c.usage.estimated_tokens > 0 and c.usage.cost_usd > 0 for c in seen)
    assert len(errors) == 2 and len(server.chat_requests) == 2
    with pytest.raises(LLMError) as info:
        client.complete(user_messages(), KernelSpec, purpose="implement")
    assert info.value.kind == "interrupted" and len(server.chat_requests) == 2 and len(seen) == 2


# ----- two specs in one answer ----------------------------------------------------------------
FIRST, SECOND = softmax_spec_dict("first"), softmax_spec_dict("second")
PLAN2 = {k: v for k, v in SECOND.items() if k != "source"}


def test_two_specs_the_text_points_to_the_second():
    text = (f"First try:\n```json\n{json.dumps(FIRST)}\n```\nOn reflection that one is wrong; use the "
            f"corrected version below.\n```json\n{json.dumps(SECOND)}\n```")
    chosen, siblings = read_answers(text, KernelSpec)
    assert chosen.name == "second" and siblings == []


def test_two_specs_without_a_pointer_are_siblings_each_with_its_own_code_block():
    other = SOFTMAX_CUDA.replace("softmax_rows", "softmax_two")
    plan1 = {k: v for k, v in FIRST.items() if k != "source"}
    plan2 = {**PLAN2, "steps": [{**PLAN2["steps"][0], "kernel": "softmax_two"}]}
    text = (f"Option A:\n```cuda\n{SOFTMAX_CUDA}```\n```json\n{json.dumps(plan1)}\n```\n"
            f"Option B:\n```cuda\n{other}```\n```json\n{json.dumps(plan2)}\n```")
    chosen, siblings = read_answers(text, KernelSpec)
    assert chosen.name == "first" and "softmax_rows(" in chosen.source
    assert [s.name for s in siblings] == ["second"] and "softmax_two(" in siblings[0].source


def test_implement_gives_a_second_spec_as_a_sibling_branch(server):
    context, parent, _ = make_context()
    server.default = Reply.completion(f"A:\n```json\n{json.dumps(FIRST)}\n```\nB:\n```json\n{json.dumps(SECOND)}\n```")
    p = LLMProposer(make_test_client(server.url, max_concurrency=1))
    branches = p.implement(context, parent, IDEA, m=1)
    assert [b.spec.name for b in branches] == ["first", "second"]


# ----- the prompt: the ideas' analysis, a context too small, a huge source --------------------
def test_the_ideas_answer_has_its_analysis_first_and_it_is_kept(server):
    context, parent, _ = make_context()
    answer = {"analysis": "three DRAM passes; one would do", "ideas": [IDEA.model_dump(mode="json")]}
    server.push(Reply.completion(json.dumps(answer)))
    seen = []
    p = LLMProposer(make_test_client(server.url), on_call=seen.append)
    assert p.ideas(context, parent, 3) == [IDEA]
    schema = server.chat_requests[0].body["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == ["analysis", "ideas"]
    assert "three DRAM passes" in seen[0].response_text  # journaled with the call
    assert IdeaList.model_validate_json(json.dumps({"ideas": []})).analysis == ""  # optional when read


def test_a_context_length_refusal_shrinks_the_prompt_instead_of_repeating_it(server):
    context, parent, failing = make_context()
    big = softmax_spec_dict("big")
    big["source"] = SOFTMAX_CUDA + "// padding\n" * 8000  # ~90 kB
    spec = KernelSpec.model_validate(big)
    sizes: list[int] = []

    def model(req):
        text = "".join(m["content"] for m in req.body["messages"])
        sizes.append(len(text))
        if len(text) > 30_000:
            return Reply.error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded")
        return Reply.completion(SPEC)

    server.default = model
    p = LLMProposer(make_test_client(server.url))
    branch = p.repair(context, Failure(spec=spec, result=failing), attempt=1)
    assert branch.spec is not None and len(sizes) == 2 and sizes[0] > 30_000 > sizes[1] + 10_000
    assert p.stop_reason() is None and p.clip_limit < SOURCE_LIMIT


def test_a_prompt_too_long_even_shrunk_stops_the_search_with_the_reason(server):
    context, parent, _ = make_context()
    server.default = Reply.error(400, "prompt is too long: 300000 tokens > 200000 maximum")
    p = LLMProposer(make_test_client(server.url))
    assert p.ideas(context, parent, 3) is None
    reason = p.stop_reason()
    assert reason.kind is StopKind.llm_error and "does not fit the model's context" in reason.text
    assert "prompt is too long" in reason.text and len(server.chat_requests) == 3  # 24000 -> 6000 -> 1500 characters


def test_the_repair_prompt_of_a_300kb_source_stays_under_its_clip_budget_with_a_true_count(server):
    context, _, failing = make_context()
    big = softmax_spec_dict("huge")
    big["source"] = SOFTMAX_CUDA + "".join(f"// line {i} of a very long answer\n" for i in range(9000))
    assert len(big["source"]) > 300_000
    spec = KernelSpec.model_validate(big)
    server.push(Reply.completion(SPEC))
    LLMProposer(make_test_client(server.url)).repair(context, Failure(spec=spec, result=failing), attempt=1)
    user = server.chat_requests[0].body["messages"][1]["content"]
    assert len(user) < SOURCE_LIMIT + 8_000, len(user)  # the source's budget plus the evidence
    shown = user.split("Its source:\n```cuda\n")[1].split("\n```")[0]
    note = re.search(r"\n/\* \.\.\. ([\d,]+) of ([\d,]+) characters cut \.\.\. \*/\n", shown)
    cut, total = (int(g.replace(",", "")) for g in note.groups())
    kept = len(shown) - len(note.group())
    assert total == len(spec.source.strip()) and cut == total - kept  # the count is true


def test_a_host_code_answer_gets_all_its_problems_named_at_once(server):
    context, _, _ = make_context()
    host = ('#include <torch/extension.h>\n' + SOFTMAX_CUDA +
            'void launch(float* x, float* o) { float* t; cudaMalloc(&t, 4); softmax_rows<<<1, 256>>>(x, o, 4); }\n')
    spec = KernelSpec.model_validate({**softmax_spec_dict("host"), "source": host})
    refused = EvalResult(verdict=Verdict.compile_error, message="source refused: line 1: include of "
                         "'torch/extension.h' is not allowed", log="line 1: include of 'torch/extension.h' is not allowed")
    server.push(Reply.completion(SPEC))
    LLMProposer(make_test_client(server.url)).repair(context, Failure(spec=spec, result=refused), attempt=1)
    user = server.chat_requests[0].body["messages"][1]["content"]
    section = user.split("fix all of them at once")[1]
    for named in ("`#include <torch/extension.h>`", "`cudaMalloc(...)`", "`<<<...>>>` launch"):
        assert named in section, named
