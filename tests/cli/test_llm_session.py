"""A whole LLM session against the local chat server, no GPU (``kerngen generate --dry-run``):
the model makes each mistake real models make, the harness tells it precisely what is wrong, and
it fixes it after the repair prompt. Real parsing, validation, sandboxed NVRTC compiles, static
checks and the search; the GPU is the only thing missing (every compiled kernel is "not run")."""

from __future__ import annotations

import json
import re
import threading

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.tree import load_run
from kerngen.harness.results import Verdict
from kerngen.results.dry_run import dry_run_summary
from tests.fakes.llm_server import SOFTMAX_CUDA, ChatServer, Reply, softmax_spec_dict

runner = CliRunner()

GOOD = softmax_spec_dict("fixed")
PLAN = {k: v for k, v in GOOD.items() if k != "source"}


def _json_with_source(source: str, **changes) -> str:
    return json.dumps({**GOOD, "source": source, **changes})


def _blocks(source: str, plan: dict) -> str:
    return f"Here is the kernel.\n```cuda\n{source}```\n```json\n{json.dumps(plan, indent=2)}\n```\n"


_LAUNCH = GOOD["steps"][0]
# What the model answers first, per (idea, branch); None: it compiles as it is (the harness reads
# the form), else the substring the repair prompt must show (the precise reason).
MISTAKES: dict[str, tuple[str, str | None]] = {
    "comments": (  # JSON with comments and trailing commas
        "```json\n" + json.dumps(GOOD, indent=2).replace('"name": "fixed",', '"name": "fixed", // the kernel\n')
        .replace('"defaults": {\n    "BLOCK": 256\n  }', '"defaults": {"BLOCK": 256,}') + "\n```", None),
    "yaml": ("```yaml\nname: fixed\nsource: |\n" + "".join(f"  {l}\n" for l in SOFTMAX_CUDA.splitlines())
             + "tunables:\n  BLOCK: [128, 256]\nsteps:\n  - kernel: softmax_rows\n    grid: ['x.shape[0]']\n"
             "    block: [BLOCK]\n    args:\n      - {name: x}\n      - {name: out}\n"
             "      - {kind: int32, value: 'x.shape[1]'}\n```\n", None),
    "formula": (_blocks(SOFTMAX_CUDA, {**PLAN, "steps": [{**_LAUNCH, "grid": ["ceil(x.numel / x.shape[1])"],
                                                         "shared_mem": "0 * BLOCK * sizeof(float)"}]}), None),
    "bare_grid": (_blocks(SOFTMAX_CUDA, {**PLAN, "steps": [{**_LAUNCH, "grid": "x.shape[0]"}]}), None),
    "string_tunable": (_blocks(SOFTMAX_CUDA, {**PLAN, "tunables": {"BLOCK": ["128", "256"]}}), None),
    "cut_off": ("", None),  # cut off mid-JSON: the client asks again with a larger output budget
    "prose": ("I would use one block per row and a shared-memory reduction for the max and the sum.", "no JSON"),
    "unescaped": ('{"name": "fixed", "source": "' + SOFTMAX_CUDA.replace("\n", "\\n") + '", "steps": []}',
                  "unescaped"),
    "missing_arg": (_blocks(SOFTMAX_CUDA, {**PLAN, "steps": [{**_LAUNCH, "args": _LAUNCH["args"][:2]}]}),
                    "parameter"),
    "redefined": (_blocks(SOFTMAX_CUDA.replace("#ifndef BLOCK\n#define BLOCK 256\n#endif", "#define BLOCK 256"), PLAN),
                  "redefined"),
    "int_for_long_long": (_blocks(SOFTMAX_CUDA.replace("int cols)", "long long cols)"), PLAN), "8"),
    "unknown_tensor": (_blocks(SOFTMAX_CUDA, {**PLAN, "steps": [{**_LAUNCH, "args": [{"name": "input"}]
                                                                 + _LAUNCH["args"][1:]}]}), "input"),
}
NAMES = list(MISTAKES)
IDEAS = {"ideas": [{"text": f"idea-{i}: one block per row, variant {i}", "category": "memory_access"}
                   for i in range(len(NAMES) // 2)]}


class Model:
    """The scripted model: answers by what the prompt asks; records the repair prompts."""

    def __init__(self) -> None:
        self.repairs: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, req) -> Reply:
        messages = req.body.get("messages", [])
        user = messages[-1]["content"] if messages else ""
        if "single word OK" in user:
            return Reply.completion("OK")
        if user.startswith("# Round"):
            return Reply.completion(json.dumps(IDEAS))
        if user.startswith("# Repair a kernel") or user.startswith("# Your answer could not be read"):
            with self.lock:
                self.repairs.append(user)
            return Reply.completion(_blocks(SOFTMAX_CUDA, PLAN), prompt_tokens=3000, completion_tokens=800,
                                    delay_s=0.05)
        idea = int(re.search(r"idea-(\d+)", user).group(1))
        branch = int(re.search(r"branch (\d+) of", user).group(1)) - 1
        name = NAMES[2 * idea + branch]
        if name == "cut_off":
            if "max_completion_tokens" in req.body:  # the retry with a larger budget
                return Reply.completion(json.dumps(GOOD), prompt_tokens=3000, completion_tokens=900)
            return Reply.completion(json.dumps(GOOD)[:700], finish_reason="length", prompt_tokens=3000,
                                    completion_tokens=4096)
        return Reply.completion(MISTAKES[name][0], prompt_tokens=3000, completion_tokens=800, delay_s=0.05)


@pytest.fixture
def session(tmp_path):
    model = Model()
    with ChatServer() as server:
        server.default = model
        res = runner.invoke(kerngen.cli.app.app, [
            "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
            "--rounds", "1", "--ideas", str(len(NAMES) // 2), "--branches", "2", "--repairs", "1",
            "--no-playbook-seed", "--llm-concurrency", "4", "--price-in", "1", "--price-out", "2",
            "--runs-dir", str(tmp_path)])
        yield res, model, server, tmp_path


def test_every_mistake_is_read_or_repaired_with_a_precise_reason(session):
    res, model, server, tmp_path = session
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "events.jsonl").is_file()]
    run = load_run(run_dir)
    s = dry_run_summary(run)
    needs_repair = [n for n, (_, why) in MISTAKES.items() if why]
    assert s.answers == len(NAMES) + len(needs_repair)
    assert s.repair_requests == len(needs_repair) == len(model.repairs)
    assert s.compiled == len(NAMES) and s.repaired == len(needs_repair)  # every branch ends compiled
    assert s.unreadable == 2 and s.compile_error == 3 and s.invalid_spec == 1
    for name, (_, why) in MISTAKES.items():
        if why is None:
            continue
        i = NAMES.index(name)
        head = next(n for n in run.nodes.values() if n.kind == "branch" and (n.idea_index, n.branch_index) == divmod(i, 2))
        reason = head.error if head.spec is None else head.result.message
        assert why in reason, (name, reason)
        assert any(reason[:60] in p for p in model.repairs), (name, reason)
    # what the dry run says at the end
    for line in ("compiled (not run)", "repair requests", "branches repaired to a compiled kernel", "cost"):
        assert line in res.output
    # the endpoint check, ideas, one answer per branch, the cut-off answer asked again, one per repair
    assert s.llm_calls == 1 + 1 + len(NAMES) + 1 + len(needs_repair) and s.cost_usd is not None and s.cost_usd > 0


def test_the_repair_prompts_carry_the_idea_and_the_evidence(session):
    res, model, _, _ = session
    assert res.exit_code == 0, res.output
    assert all("idea-" in p for p in model.repairs)  # the idea the branch implements
    unreadable = [p for p in model.repairs if p.startswith("# Your answer could not be read")]
    assert len(unreadable) == 2 and all("The start of your answer" in p for p in unreadable)


def test_the_compiled_kernels_are_not_run(session):
    res, _, _, tmp_path = session
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "events.jsonl").is_file()]
    run = load_run(run_dir)
    compiled = [n for n in run.nodes.values() if n.result is not None and n.result.verdict is Verdict.not_run]
    assert compiled and all(n.result.timing is None and n.result.compile is not None for n in compiled)
    assert run.best is None  # nothing was measured: no best kernel


def test_a_wave_of_questions_is_in_flight_at_once_up_to_the_concurrency(tmp_path):
    """12 implement questions (6 ideas x 2 branches) and 6 repairs: with --llm-concurrency 4,
    four requests are answered at once (each reply takes 0.3 s); with 1, one at a time."""
    for concurrency, expected in ((4, 4), (1, 1)):
        model = Model()
        with ChatServer() as server:
            server.default = model
            server.delay_s = 0.3
            res = runner.invoke(kerngen.cli.app.app, [
                "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
                "--rounds", "1", "--ideas", "6", "--branches", "2", "--repairs", "1", "--no-playbook-seed",
                "--llm-concurrency", str(concurrency), "--runs-dir", str(tmp_path / str(concurrency))])
            assert res.exit_code == 0, res.output
            assert server.max_in_flight == expected


def test_max_cost_stops_the_search_within_one_request_of_it(tmp_path):
    """Every answer costs 3000 prompt tokens at $1/M and 800 completion tokens at $2/M = $0.0046:
    a $0.02 budget buys four or five of them; the search stops on the cost, never more than one
    request's cost over, and the journal's total says so."""
    model = Model()
    with ChatServer() as server:
        server.default = model
        res = runner.invoke(kerngen.cli.app.app, [
            "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
            "--rounds", "3", "--ideas", "6", "--branches", "2", "--repairs", "1", "--no-playbook-seed",
            "--llm-concurrency", "4", "--price-in", "1", "--price-out", "2", "--max-cost", "0.02",
            "--runs-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "events.jsonl").is_file()]
    run = load_run(run_dir)
    one_request = (3000 * 1 + 4096 * 2) / 1e6  # the largest single request of this session (the cut-off one)
    spent = run.finished.usage["cost_usd"]
    assert run.finished.stop.value == "cost", run.finished.reason
    assert 0.02 - one_request <= spent <= 0.02 + one_request


def test_max_cost_needs_prices(tmp_path):
    res = runner.invoke(kerngen.cli.app.app, ["generate", "softmax", "--dry-run", "--max-cost", "1",
                                              "--runs-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--price-in" in res.output


def test_a_context_smaller_than_the_prompt_is_said_once(tmp_path, caplog):
    """A vLLM-style endpoint serving the model with a 2,048-token context: the search warns,
    once, that its prompts (several thousand tokens: the rules, the schema, the reference) do
    not fit, before the answers come back wrong."""
    model = Model()
    with ChatServer() as server:
        server.default = model
        server.routes["/v1/models"] = Reply.models({"id": "m", "max_model_len": 2048})
        with caplog.at_level("WARNING", logger="kerngen.llm"):
            res = runner.invoke(kerngen.cli.app.app, [
                "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
                "--rounds", "1", "--ideas", "1", "--branches", "1", "--repairs", "0", "--no-playbook-seed",
                "--runs-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    said = [r.getMessage() for r in caplog.records if "2048" in r.getMessage() or "2,048" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert "warning:" in res.output and said[0][:40] in res.output  # on stderr, whatever the log level


def test_dry_run_refuses_an_unknown_gpu(tmp_path):
    res = runner.invoke(kerngen.cli.app.app, ["generate", "softmax", "--dry-run", "--proposer", "scripted",
                                              "--gpu", "tpu9", "--runs-dir", str(tmp_path)])
    assert res.exit_code == 2 and "unknown GPU 'tpu9'" in res.output and "h100" in res.output
