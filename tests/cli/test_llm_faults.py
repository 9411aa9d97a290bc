"""Every way an LLM search can stop ends with its real cause, in the summary ``generate`` prints,
in ``show``, ``runs`` and ``--json`` (issue 36, item 1): ``kerngen generate --dry-run`` against
the local chat server, one fault each, no GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from tests.fakes.llm_server import ChatServer, Reply, softmax_spec_dict

runner = CliRunner(env={"COLUMNS": "250"})  # the summary's lines unwrapped
IDEAS = {"analysis": "three passes", "ideas": [{"text": "one block per row", "category": "memory_access"}]}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    """Retries without waiting (the faults below spend every retry)."""
    monkeypatch.setattr("kerngen.agent.llm.client.backoff_s", lambda cfg, rs: 0.0)


def ask(req) -> str:
    messages = req.body.get("messages", []) if isinstance(req.body, dict) else []
    user = next((m["content"] for m in messages if m["role"] == "user"), "")  # the question (not a follow-up)
    if "single word OK" in user:
        return "check"
    return "ideas" if user.startswith("# Round") else "kernel"


def script(**by_kind):
    """A model that answers each kind of question (check, ideas, kernel) as told; the check
    and the ideas are answered well unless told otherwise."""
    answers = {"check": Reply.completion("OK"), "ideas": Reply.completion(json.dumps(IDEAS)),
               "kernel": Reply.completion(json.dumps(softmax_spec_dict()))} | by_kind

    def model(req):
        answer = answers[ask(req)]
        return answer(req) if callable(answer) else answer
    return model


def generate(tmp_path: Path, model, *flags: str):
    """``kerngen generate softmax --dry-run`` against ``model``; (result, run folder, show, show --json, runs --json)."""
    with ChatServer() as server:
        server.default = model
        res = runner.invoke(kerngen.cli.app.app, [
            "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
            "--rounds", "1", "--ideas", "1", "--branches", "1", "--repairs", "0", "--no-playbook-seed",
            "--runs-dir", str(tmp_path), *flags])
    journals = list(tmp_path.rglob("events.jsonl"))
    assert len(journals) == 1, res.output
    journal = journals[0]
    run = journal.parent
    show = runner.invoke(kerngen.cli.app.app, ["show", str(run), "--width", "200"])
    shown = json.loads(runner.invoke(kerngen.cli.app.app, ["show", str(run), "--json"]).output)
    listed = json.loads(runner.invoke(kerngen.cli.app.app, ["runs", "--runs-dir", str(run.parent), "--json"]).output)
    assert show.exit_code == 0, show.output
    return res, run, show.output, shown, listed


def stopped(output: str) -> str:
    return re.search(r"stopped: (.*)", output).group(1)


def test_the_ideas_endpoint_down_says_its_error(tmp_path):
    res, _, show, shown, listed = generate(tmp_path, script(ideas=Reply.error(500, "upstream exploded")))
    assert res.exit_code == 0, res.output
    line = stopped(res.output)
    assert line.startswith("LLM endpoint:") and "HTTP 500: upstream exploded" in line and "(after 7 attempts)" in line
    assert "finished (llm_error)" in show and "HTTP 500: upstream exploded" in show and "no answer" in show
    assert shown["stop"]["kind"] == "llm_error" and "HTTP 500: upstream exploded" in shown["stop"]["reason"]
    assert shown["no_answer"] == {"HTTP 500": 1} and listed[0]["stop"] == "llm_error"
    assert re.search(r"no answer\s+│\s+1 \(HTTP 500 x1\)", res.output)


def test_unreadable_ideas_say_why_and_count(tmp_path):
    res, _, show, shown, _ = generate(tmp_path, script(ideas=Reply.completion("I would vectorize the loads.")))
    assert res.exit_code == 0, res.output
    line = stopped(res.output)
    assert line.startswith("the model's ideas could not be read (2 answers)") and "no JSON found" in line
    assert re.search(r"ideas answers\s+│\s+2 \(2 unreadable\)", res.output)
    assert re.search(r"unreadable answers\s+│\s+2", res.output)
    assert "finished (no_candidates): the model's ideas could not be read" in show
    assert shown["stop"]["kind"] == "no_candidates"


def test_max_llm_calls_1_names_the_request_budget(tmp_path):
    res, _, show, shown, listed = generate(tmp_path, script(), "--max-llm-calls", "1")
    assert res.exit_code == 0, res.output
    assert stopped(res.output).startswith("budget: 1 LLM requests (max 1, --max-llm-calls; the endpoint check counts)")
    assert re.search(r"LLM requests\s+│\s+1\b", res.output)  # the check was made, counted and journaled
    assert shown["stop"]["kind"] == "llm_calls" and listed[0]["stop"] == "llm_calls"
    assert "finished (llm_calls): budget: 1 LLM requests" in show


def test_max_cost_names_the_cost_budget_and_counts_the_check(tmp_path):
    """The first ideas request would cost more than $0.02 by its estimate (4096 output tokens at
    $10/M): not sent, and the stop says so; the check was paid for and is counted."""
    res, _, show, shown, _ = generate(tmp_path, script(), "--max-cost", "0.02", "--price-in", "1.25",
                                      "--price-out", "10")
    assert res.exit_code == 0, res.output
    line = stopped(res.output)
    assert line.startswith("budget: LLM cost budget spent") and "--max-cost" in line and "--max-output-tokens" in line
    assert "no prices given" not in res.output and re.search(r"cost\s+│\s+\$0\.0001", res.output)
    assert shown["stop"]["kind"] == "cost" and shown["usage"]["cost_usd"] > 0


def test_no_answer_lists_its_causes_with_counts(tmp_path, monkeypatch):
    """Four branches, four faults of the endpoint, each retried until the retries are spent (two
    attempts here, to keep the timeouts short): the summary, show and --json count them by cause;
    the timed-out and malformed requests (probably billed) are counted in the tokens as estimates."""
    import tenacity

    monkeypatch.setattr("kerngen.agent.llm.client.stop_after_attempt", lambda n: tenacity.stop_after_attempt(2))
    faults = {1: Reply.error(429, "rate limited"), 2: Reply.error(503, "overloaded"),
              3: Reply(200, b"{not json"), 4: Reply.completion("late", delay_s=3.0)}

    def kernel(req):
        return faults[int(re.search(r"branch (\d) of 4", req.body["messages"][-1]["content"]).group(1))]

    res, _, show, shown, _ = generate(tmp_path, script(kernel=kernel), "--branches", "4", "--llm-timeout", "1")
    assert res.exit_code == 0, res.output
    causes = {"HTTP 429": 1, "HTTP 503": 1, "malformed reply": 1, "timeout": 1}
    assert shown["no_answer"] == causes
    assert re.search(r"no answer\s+│\s+4 \(HTTP 429 x1, HTTP 503 x1, malformed reply x1, timeout x1\)", res.output)
    assert re.search(r"no answer\s+4: HTTP 429 x1, HTTP 503 x1, malformed reply x1, timeout x1", show)
    assert re.search(r"tokens\s+│\s+[\d,]+ \([\d,]+ estimated", res.output) and shown["usage"]["estimated_tokens"] > 0


def test_a_prompt_too_long_for_the_context_is_shrunk_then_stops_with_the_reason(tmp_path):
    res, _, show, shown, _ = generate(tmp_path, script(ideas=Reply.error(
        400, "This model's maximum context length is 4096 tokens", code="context_length_exceeded")))
    assert res.exit_code == 0, res.output
    line = stopped(res.output)
    assert "does not fit the model's context even with sources and logs clipped" in line
    assert "maximum context length is 4096 tokens" in line
    assert shown["stop"]["kind"] == "llm_error" and "finished (llm_error)" in show


def test_a_fatal_endpoint_error_mid_search_is_journaled_as_the_endpoint(tmp_path):
    """The key is refused after the check passed (revoked mid-search): one line, exit 2, and the
    run says the endpoint stopped it, in the endpoint's words."""
    res, _, show, shown, _ = generate(tmp_path, script(ideas=Reply.error(401, "Incorrect API key provided")))
    assert res.exit_code == 2 and "authentication failed" in res.output and "Traceback" not in res.output
    assert shown["stop"]["kind"] == "llm_error" and "Incorrect API key provided" in shown["stop"]["reason"]
