"""GPU tier of the agent and the tuner: a short ``kerngen generate`` for softmax against a local
chat-completions server that serves scripted ideas and kernels finds a correct kernel faster
than eager, ``replay`` reproduces it on the GPU, and a real tuning run finds a configuration at
least as fast as the spec's default with every configuration correct or carrying its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kerngen.harness.gpu.calibrate import naive_softmax_spec
from tests.fakes.llm_server import ChatServer, Reply

pytestmark = pytest.mark.gpu
SHAPE = "1024x8192"


def _scripted_endpoint(req) -> Reply:
    fmt = (req.body.get("response_format") or {}).get("json_schema", {}).get("name", "")
    text = json.dumps(req.body.get("messages", []))
    if fmt == "IdeaList" or "ideas" in text.lower() and "IdeaList" in text:
        ideas = [{"text": "one block per row; reduce max and sum with warp shuffles; 16-byte loads later",
                  "category": "memory_access", "expected_effect": "about 2 passes over memory"}]
        return Reply.completion(json.dumps({"ideas": ideas}))
    block = 1024 if "branch 2" in text.lower() or "2 of" in text.lower() else 512
    spec = naive_softmax_spec("x").model_dump(mode="json")
    spec["defaults"] = {"BLOCK": block}
    return Reply.completion(json.dumps(spec))


def _kerngen(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerngen", *args], capture_output=True, text=True,
                          env=env, timeout=900)


def test_generate_with_llm_endpoint_then_replay(tmp_path):
    from kerngen.agent.replay import replay_run
    from kerngen.agent.tree import load_run
    from kerngen.harness.pool.local import WorkerPool

    with ChatServer() as server:
        server.default = _scripted_endpoint
        env = dict(os.environ, OPENAI_API_KEY="sk-test-not-a-real-key")
        proc = _kerngen("generate", "softmax", "--shape", SHAPE, "--proposer", "llm", "--model", "scripted",
                        "--base-url", server.url, "--rounds", "1", "--beam", "1", "--ideas", "1",
                        "--branches", "2", "--repairs", "0", "--no-tune", "--no-playbook-seed",
                        "--runs-dir", str(tmp_path), env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert server.chat_requests, "the search never asked the endpoint"
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "sk-test-not-a-real-key" not in (run_dir / "events.jsonl").read_text()
    run = load_run(run_dir)
    best = run.best
    assert best is not None and best.result.ok
    assert best.ms < run.baseline.eager.median_ms, "the scripted kernel should beat eager softmax here"
    with WorkerPool() as pool:
        rep = replay_run(run, pool, runs_dir=tmp_path)
    assert rep.proposer_calls == 0
    again = load_run(rep.run_dir)
    assert sorted(again.nodes) == sorted(run.nodes)
    assert again.best is not None and again.best.spec == best.spec and again.best.result.ok


def test_tuning_run_beats_or_ties_the_default():
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.harness.results import Verdict
    from kerngen.harness.tune.tuner import tune
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    ref = ProblemRef(source="softmax", shape=(1024, 8192))
    info = load_problem(ref).info
    spec = naive_softmax_spec("x")
    with WorkerPool() as pool:
        res = tune(pool, ref, spec, sizes=info.sizes, tensors=info.tensor_facts(), gpu=pool.gpu_facts(),
                   strategy="exhaustive", max_evals=10, cache=None)
    assert res.best is not None and res.best.ok
    assert len(res.evaluated) == spec.space_size()
    for tc in res.evaluated:
        assert tc.result is not None and tc.result.verdict in set(Verdict)
        assert tc.result.ok, tc.result.message  # every config of this kernel is correct
    default = next(tc for tc in res.evaluated if tc.config == spec.default_config())
    spread = default.result.timing.iqr_ms
    assert res.best.timing.median_ms <= default.result.timing.median_ms + spread
