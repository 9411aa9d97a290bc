"""The LLM per region of a model run (issue 34) on the CPU: the model search with the emulator as the launcher, a
stand-in timer and a scripted chat model (the local test server: no network) answering each region's question.
A correct, faster answer is chosen; a wrong one is a failed try and the model stays correct end to end; hostile
answers are refused with their reason and recorded; the region prompt renders (StrictUndefined) for every region of
every test model; the trajectory holds no API key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.journal import read_events
from kerngen.agent.llm.client import LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.model_llm import LLM_DIR, RegionAsk, RegionLLM, bind_names
from kerngen.agent.model_run import RegionRow
from kerngen.agent.model_search import search_model
from kerngen.problems.load import load_problem
from tests.fakes.llm_server import ChatServer, Reply
from tests.resources import ROOT, TINY_MODELS, tiny_model

KEY = "sk-fake-REGIONSECRET-0123456789abcdef"
# the playbook tests' transpose model (r0: the permute, no family covers it; r1: relu * 2, the elementwise
# family) at a size the emulator runs in a second
MODEL = (ROOT / "tests" / "data" / "playbook" / "kb_permute.py").read_text().replace("torch.randn(256, 512)",
                                                                                   "torch.randn(16, 32)")
assert "torch.randn(16, 32)" in MODEL
TRANSPOSE = r'''extern "C" __global__ void transpose(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) { int r = i / cols, c = i % cols; out[c * rows + r] = x[i]; }
}
'''
RELU2 = r'''extern "C" __global__ void relu2(const float* __restrict__ permute, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = permute[i]; out[i] = (v > 0.f ? v : 0.f) * SCALE; }
}
'''


def spec(name: str, source: str, kernel: str, args: list, tensor: str, scale: str = "2.0f") -> str:
    return json.dumps({"name": name, "description": f"{name} by the scripted model",
                       "source": source.replace("SCALE", scale), "tunables": {"BLOCK": [128, 256]},
                       "defaults": {"BLOCK": 128},
                       "steps": [{"kernel": kernel, "grid": [f"cdiv({tensor}.numel, BLOCK)"], "block": ["BLOCK"],
                                  "args": args}]})


GOOD_T = spec("llm-transpose", TRANSPOSE, "transpose", [{"name": "x"}, {"name": "out"},
              {"kind": "int32", "value": "x.shape[0]"}, {"kind": "int32", "value": "x.shape[1]"}], "x")
RELU_ARGS = [{"name": "permute"}, {"name": "out"}, {"kind": "int32", "value": "permute.numel"}]
GOOD_R = spec("llm-relu2", RELU2, "relu2", RELU_ARGS, "permute")
WRONG_R = spec("llm-relu1", RELU2, "relu2", RELU_ARGS, "permute", scale="1.0f")  # forgets the * 2


class Counted:
    """The emulator as the launcher; the stand-in timer says 0.2 ms for a call that launched an LLM's kernel,
    0.5 ms for a playbook kernel, 1 ms for PyTorch (emulated times say nothing: this orders the paths)."""

    def __init__(self) -> None:
        self.launched: list[str] = []

    def launch(self, i, spec, plan, tensors):
        from tests.emu.runner import run_plan

        self.launched.append(spec.name)
        run_plan(spec, plan, tensors, timeout_s=600)

    def timer(self, fn):
        before = len(self.launched)
        fn()
        names = self.launched[before:]
        return 1.0 if not names else 0.2 if all(n.startswith("llm") for n in names) else 0.5


def user_text(req) -> str:
    return req.body["messages"][-1]["content"]


def answers(**by_op):
    """A scripted chat model: the answers to a region whose prompt names ``aten.<op>``, one per question in turn
    (the last one repeated)."""
    asked: dict[str, int] = {}

    def reply(req):
        text = user_text(req)
        op = next((op for op in by_op if f"aten.{op}." in text), None)
        if op is None:  # the endpoint check
            return Reply.completion("OK")
        n = asked[op] = asked.get(op, -1) + 1
        got = by_op[op][min(n, len(by_op[op]) - 1)]
        return Reply.completion(got(req) if callable(got) else got)
    return reply


def model_run(tmp_path, server, rounds=1, **search):
    path = tmp_path / "permute_relu.py"
    path.write_text(MODEL)
    problem = load_problem(str(path))
    llm = LLMProposer(LLMClient(LLMConfig(model="scripted", base_url=server.url, api_key=SecretStr(KEY),
                                          backoff_base_s=0.001, backoff_max_s=0.01, timeout_s=30.0)))
    c = Counted()
    run_dir = tmp_path / "run"
    propose = RegionLLM(llm, run_dir, problem, rounds=rounds)
    run = search_model(problem, run_dir, device="cpu", launcher=c.launch, timer=c.timer, compile=False,
                       log=lambda line: None, tune=0, propose=propose, **search)
    return run, run_dir, propose


needs_cxx = pytest.mark.needs_cxx


@needs_cxx
def test_a_correct_faster_answer_is_chosen_for_a_covered_and_an_uncovered_region(tmp_path):
    with ChatServer() as server:
        server.default = answers(permute=[GOOD_T], relu=[GOOD_R])
        run, run_dir, _ = model_run(tmp_path, server)
    assert run.check is not None and run.check.ok, run.check
    r0, r1 = run.regions
    assert r0.family is None and r0.chosen == "kernel" and r0.variant == "llm-1" and r0.kernel_ms == 0.2
    assert r1.family == "elementwise" and r1.chosen == "kernel" and r1.variant == "llm-1" and r1.kernel_ms == 0.2
    assert [t.variant for t in r1.tried][-1] == "llm-1" and r1.tried[0].ok and r1.tried[0].kernel_ms == 0.5
    assert [s.family for s in run.plan.kernel_steps] == ["llm", "llm"]
    assert run.timing is not None and run.timing.kerngen_ms == 0.2
    prompts = [user_text(r) for r in server.chat_requests]
    covered = next(p for p in prompts if "aten.relu" in p)
    assert "the playbook's elementwise family" in covered and "0.5 ms" in covered  # the bar to beat
    assert "strides [1, 32]" in covered and "not contiguous" in covered  # the permuted view it reads
    uncovered = next(p for p in prompts if "aten.permute" in p)
    assert "No playbook family covers it" in uncovered and "no correct kernel for it yet" in uncovered
    for r in (0, 1):  # the trajectory: the exchange, the answer, its outcome
        events, _ = read_events(run_dir / LLM_DIR / f"r{r}")
        assert [e.type for e in events] == ["run_started", "llm_call", "node_created", "node_evaluated",
                                            "run_finished"]
        assert events[2].spec is not None and events[3].result.verdict.value == "ok" and events[4].best == 0


@needs_cxx
def test_a_run_the_llm_chose_kernels_for_resumes_without_it(tmp_path):
    """A resume does not ask the LLM: a region whose kernel was an answer (its source not in the journal) is searched
    again from the playbook's offer, a region only the LLM was asked about stays PyTorch; the model is correct."""
    with ChatServer() as server:
        server.default = answers(permute=[GOOD_T], relu=[GOOD_R])
        run, run_dir, _ = model_run(tmp_path, server)
    assert [r.variant for r in run.regions] == ["llm-1", "llm-1"]
    problem = load_problem(str(tmp_path / "permute_relu.py"))
    c = Counted()
    lines: list[str] = []
    again = search_model(problem, run_dir, device="cpu", launcher=c.launch, timer=c.timer, compile=False,
                         log=lines.append, tune=0, resume=True)
    assert again.check is not None and again.check.ok, again.check
    r0, r1 = again.regions
    assert r0.chosen == "pytorch" and r1.chosen == "kernel" and not r1.variant.startswith("llm")
    assert any("LLM is not asked on a resume" in line for line in lines)
    assert any("searched again" in line for line in lines)


@needs_cxx
def test_a_wrong_answer_is_a_failed_try_repaired_next_round_and_the_model_stays_correct(tmp_path):
    with ChatServer() as server:
        server.default = answers(permute=["I'm sorry, I can't help with that."], relu=[WRONG_R, WRONG_R])
        run, run_dir, _ = model_run(tmp_path, server, rounds=2)
    r0, r1 = run.regions
    assert r1.chosen == "kernel" and r1.variant != "llm-1" and r1.kernel_ms == 0.5  # the playbook's kernel kept
    wrong = [t for t in r1.tried if t.variant.startswith("llm")]
    assert [t.ok for t in wrong] == [False, False] and wrong[0].message
    assert r0.chosen == "pytorch" and "Refused" in r0.why
    assert run.check is not None and run.check.ok
    repair = [user_text(r) for r in server.chat_requests if "aten.relu" in user_text(r)][1]
    assert "The last answer (llm-1) failed" in repair and "llm-1: failed" in repair and "relu2" in repair
    events, _ = read_events(run_dir / LLM_DIR / "r1")
    created = [e for e in events if e.type == "node_created"]
    assert [e.kind for e in created] == ["branch", "repair"] and created[1].parent == 0
    assert [e.result.verdict.value for e in events if e.type == "node_evaluated"] == ["incorrect", "incorrect"]


@needs_cxx
def test_hostile_answers_are_refused_with_their_reason_and_recorded(tmp_path):
    host_include = spec("llm-evil", '#include "/etc/passwd"\n' + TRANSPOSE, "transpose",
                        [{"name": "x"}, {"name": "out"}], "x")
    with ChatServer() as server:
        server.default = answers(permute=[host_include, "lorem ipsum " * 50, "{" + "x" * 1_100_000],
                                 relu=["not json at all"])
        run, run_dir, _ = model_run(tmp_path, server, rounds=3)
    r0, r1 = run.regions
    msgs = [t.message for t in r0.tried]
    assert [t.variant for t in r0.tried] == ["llm-1", "llm-2", "llm-3"] and not any(t.ok for t in r0.tried)
    assert msgs[0].startswith("CompileError: source refused") and "/etc/passwd" in msgs[0]
    assert msgs[1].startswith("Refused:") and "no JSON" in msgs[1]
    assert msgs[2].startswith("Refused:") and "characters" in msgs[2]
    assert r0.chosen == "pytorch" and "source refused" in r0.why
    assert r1.chosen == "kernel" and r1.variant != "llm-1"  # the playbook's, the garbage answer a failed try
    assert run.check is not None and run.check.ok
    events, _ = read_events(run_dir / LLM_DIR / "r0")
    assert [e.type for e in events].count("llm_call") == 3
    created = [e for e in events if e.type == "node_created"]
    assert created[0].spec is not None and "no JSON" in created[1].error and created[2].spec is None
    assert [e.result.verdict.value for e in events if e.type == "node_evaluated"] == ["compile_error"]


@needs_cxx
def test_the_trajectory_and_the_record_hold_no_secret(tmp_path, monkeypatch):
    """The key in the environment and the one the client sends; the scripted model even repeats the request's
    Authorization header in its answer."""
    monkeypatch.setenv("KERNGEN_FAKE_API_KEY", KEY)
    echo = lambda req: f"my key is {req.authorization}"  # noqa: E731
    with ChatServer() as server:
        server.default = answers(permute=[echo], relu=[echo])
        run, run_dir, _ = model_run(tmp_path, server)
        assert KEY in server.chat_requests[0].authorization  # it was sent to the endpoint, and only there
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.parent.parent.name == LLM_DIR for p in files) and (run_dir / "model.json").is_file()
    for p in files:
        text = p.read_text()
        assert KEY not in text and "REGIONSECRET" not in text, p
    assert "my key is Bearer" in (run_dir / LLM_DIR / "r0" / "events.jsonl").read_text()  # the answer, scrubbed


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_the_region_prompt_renders_for_every_region_of_every_test_model(name):
    import torch

    from kerngen.agent.playbook.graph import trace
    from kerngen.agent.playbook.model_plan import plan_partition
    from kerngen.agent.playbook.partition import partition
    from kerngen.harness.model.execute import PlanRunner

    problem = load_problem(str(tiny_model(name)))
    part = partition(trace(problem))  # the regions, without the playbook's offers (seconds a region for ResNet18)
    eager = plan_partition(part, {}, pytorch={r.index: "eager" for r in part.regions}).plan
    values = problem.bindings(problem.build_model("cpu", 0), problem.make_inputs("cpu", 0), [])
    with torch.no_grad():
        _, env = PlanRunner(eager, launcher=None)(values, keep=True)
    llm = LLMProposer(LLMClient(LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", api_key=SecretStr(KEY))))
    region_llm = RegionLLM(llm, Path("/nonexistent"), problem)
    for r in part.regions:
        row = RegionRow(region=r.index, nodes=list(r.nodes), family=r.match.family if r.match else None, eager_ms=0.25,
                        share=0.1,
                        floor_ms=0.05 if r.index % 2 else None)
        ask = RegionAsk(r, row, None, env, dict(problem.info.sizes or {}), None, 0.0)
        names = bind_names(r)
        ctx = region_llm.context(ask, names)
        for structured in (True, False):
            build = llm.messages_for(ctx, "region", **region_llm.variables(ask, names, region_llm_state(), 1))
            system, user = (m["content"] for m in build(structured))
            assert f"region r{r.index}" in system and f"# Region r{r.index}" in user
            assert all(f"`{n}`" in user for n in names) and "`out`" in user
            assert all(f"aten.{n.op}.{n.overload}(" in user for n in r.graph.live())


def region_llm_state():
    from kerngen.agent.model_llm import _Region

    return _Region(journal=None)  # type: ignore[arg-type]  # rendering writes nothing


def test_every_test_model_has_a_tiny_copy():
    assert set(TINY_MODELS.values()) == {p.stem for p in (ROOT / "problems" / "models").glob("*.py")}


def test_generate_as_model_with_an_llm_needs_a_gpu_before_any_request(tmp_path):
    """On a machine with no GPU, ``--as-model --model`` refuses in one line before it asks the endpoint anything."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = tmp_path / "permute_relu.py"
    path.write_text(MODEL)
    with ChatServer() as server:
        res = CliRunner().invoke(kerngen.cli.app.app, ["generate", str(path), "--as-model", "--model", "m",
                                                       "--base-url", server.url, "--runs-dir", str(tmp_path / "runs")])
        assert not server.requests
    assert res.exit_code == 2 and "needs a CUDA GPU" in res.output and "Traceback" not in res.output


@pytest.mark.gpu
def test_on_a_gpu_the_answers_compile_with_nvrtc_and_the_model_stays_correct(tmp_path):
    """The same scripted answers through ``kerngen generate --as-model --model`` on a GPU (NVRTC, the CUDA launcher,
    CUDA-event times): each asked region's answer is correct there, the model correct end to end."""
    import torch

    from kerngen.agent.model_run import read_model_run

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    path = tmp_path / "permute_relu.py"
    path.write_text(MODEL.replace("torch.randn(16, 32)", "torch.randn(2048, 4096)"))
    runs = Path(os.environ.get("KG_I34L_RUNS") or tmp_path / "runs")  # scripts/device/i34l.sh shows the run after
    with ChatServer() as server:
        server.default = answers(permute=[GOOD_T], relu=[GOOD_R])
        res = CliRunner().invoke(kerngen.cli.app.app, ["generate", str(path), "--as-model", "--model", "scripted",
                                                       "--base-url", server.url, "--minutes", "2",
                                                       "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    run_dir = max(runs.glob("*-permute_relu-model"))
    run = read_model_run(run_dir)
    assert run.check is not None and run.check.ok, run.check
    llm = [t for r in run.regions for t in r.tried if t.variant.startswith("llm")]
    assert llm and all(t.ok for t in llm), llm
    assert (run_dir / LLM_DIR / "r1" / "events.jsonl").is_file()
