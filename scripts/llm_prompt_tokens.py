"""Prompt tokens per request kind and per default search, measured against the local chat
server (``tests/fakes/llm_server.py``; no GPU, no network), two ways:

- ``--contexts``: the same information both ways: one ideas, two implement and one repair
  question asked of ``LLMProposer`` for a fixed context (the problem's own description, an H200
  with measured rates, a measured baseline, the playbook's kernel as the parent, a failed repair
  target with a 60 kB compile log). Only the proposer's public API is used, so the script
  measures any version of kerngen (run it in a checkout of the old one for "before").
- default: ``kerngen generate PROBLEM --dry-run`` with the default search.

The scripted model answers every ideas question with three ideas and every kernel question with
a spec that compiles (or, for one branch in four, with a kernel the compiler refuses, so that the
repair prompt is measured too). Every request body the server receives is kept: its prompt is
the text of its messages plus its ``response_format`` JSON (a schema sent there is read by the
model as prompt tokens too).

Tokens are ESTIMATED without a tokenizer: characters / 4 (OpenAI's rule of thumb for English and
code; tiktoken is not installed here). The characters are printed beside them.

    python scripts/llm_prompt_tokens.py [--contexts] [softmax|matmul|...] [--json OUT]
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typer.testing import CliRunner  # noqa: E402

import kerngen.cli.app  # noqa: E402
from tests.fakes.llm_server import SOFTMAX_CUDA, ChatServer, Reply, softmax_spec_dict  # noqa: E402

CHARS_PER_TOKEN = 4.0
GOOD = softmax_spec_dict("fixed")
PLAN = {k: v for k, v in GOOD.items() if k != "source"}
BROKEN = SOFTMAX_CUDA.replace("float inv = 1.f / red[0];", "float inv = 1.f / red[0]")  # a compile error


def _blocks(source: str) -> str:
    return f"Here is the kernel.\n```cuda\n{source}```\n```json\n{json.dumps(PLAN, indent=2)}\n```\n"


def kind_of(body: dict) -> str:
    messages = body.get("messages") or []
    user = messages[-1]["content"] if messages else ""
    if "single word OK" in user:
        return "check"
    if user.lstrip().startswith("# Round"):
        return "ideas"
    if "Repair" in user[:200] or "could not be read" in user[:200]:
        return "repair"
    return "implement"


def prompt_chars(body: dict) -> int:
    chars = sum(len(m.get("content") or "") for m in body.get("messages") or [])
    if "response_format" in body:
        chars += len(json.dumps(body["response_format"]))
    return chars


class Model:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, req) -> Reply:
        body = req.body if isinstance(req.body, dict) else {}
        kind = kind_of(body)
        if kind == "check":
            return Reply.completion("OK")
        if kind == "ideas":
            ideas = [{"text": f"idea {i}: one block per row with float4 loads, variant {i}",
                      "category": "memory_access", "expected_effect": "fewer DRAM passes"} for i in range(3)]
            return Reply.completion(json.dumps({"analysis": "three passes over DRAM; one would do", "ideas": ideas}))
        self.n += 1
        source = BROKEN if (kind == "implement" and self.n % 4 == 0) else SOFTMAX_CUDA
        return Reply.completion(_blocks(source))


def measure(problem: str, extra: list[str]) -> dict:
    model = Model()
    with ChatServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.default = model
        res = CliRunner().invoke(kerngen.cli.app.app, [
            "generate", problem, "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
            "--runs-dir", tmp, *extra])
        if res.exit_code != 0:
            raise SystemExit(f"generate failed ({res.exit_code}): {res.output[-2000:]}")
        per_kind: dict[str, list[int]] = defaultdict(list)
        for req in server.chat_requests:
            body = req.body if isinstance(req.body, dict) else {}
            per_kind[kind_of(body)].append(prompt_chars(body))
    rows = {k: {"requests": len(v), "mean_chars": round(sum(v) / len(v)), "total_chars": sum(v),
                "mean_tokens_est": round(sum(v) / len(v) / CHARS_PER_TOKEN),
                "total_tokens_est": round(sum(v) / CHARS_PER_TOKEN)} for k, v in sorted(per_kind.items())}
    total = sum(r["total_chars"] for r in rows.values())
    stopped = re.search(r"stopped: (.*)", res.output)
    return {"problem": problem, "kinds": rows, "search_total_chars": total,
            "search_total_tokens_est": round(total / CHARS_PER_TOKEN),
            "stopped": stopped.group(1).strip() if stopped else ""}


def measure_contexts(problem: str) -> dict:
    """The prompts of the four questions for one fixed context (see the module)."""
    from pydantic import SecretStr

    from kerngen.agent.context import default_context
    from kerngen.agent.llm.client import LLMClient
    from kerngen.agent.llm.config import LLMConfig
    from kerngen.agent.llm.proposer import LLMProposer
    from kerngen.agent.proposer import Category, Failure, Idea, NodeSummary
    from kerngen.cli.compose import playbook_seed
    from kerngen.harness.results import (Baseline, CheckEvidence, CheckFailure, CompileInfo, EvalResult, GpuFacts,
                                         KernelResources, Timing, Verdict)
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    def timing(ms: float) -> Timing:
        return Timing(median_ms=ms, q25_ms=ms, q75_ms=ms, min_ms=ms, max_ms=ms, mean_ms=ms, reps=100, warmup=3)

    ref = parse_problem_ref(problem)
    info = load_problem(ref).info
    gpu = GpuFacts(name="NVIDIA H200", arch="sm_90", sm_count=132, mem_bytes=150_000_000_000, copy_gbps=4280.0,
                   fp32_tflops=51.0, bf16_tflops=800.0)
    floor = 1.0
    baseline = Baseline(problem=info.name, gpu=gpu.name, eager=timing(2.0), compiled=timing(1.5), floor_ms=floor,
                        floor_bound="compute" if info.flops and info.flops > 1e10 else "memory", flops=info.flops,
                        min_bytes=info.min_bytes)
    ctx = default_context(ref, gpu, baseline)
    spec = playbook_seed(ref)
    compiled = CompileInfo(key="k", arch="sm_90", nvrtc_version="13.0", options=[], seconds=0.1, cached=False,
                           kernels={"k": KernelResources(registers=40)})
    ok = EvalResult(verdict=Verdict.ok, spec_hash=spec.content_hash(), compile=compiled, timing=timing(1.2))
    parent = NodeSummary(node_id=0, spec=spec, result=ok, speedup_eager=1.6, speedup_compile=1.25, pct_roofline=83.0)
    failing = EvalResult(verdict=Verdict.incorrect, message="output differs from the reference",
                         check=CheckEvidence(seeds=[0, 1, 2], atol=1e-4, rtol=1e-4, max_abs_err=0.01,
                                             max_err_index=[1, 2], max_err_output="out", got=0.5, expected=0.4,
                                             rel_err=0.02, mismatches=100, failed=CheckFailure.mismatch),
                         log="ptxas info: Used 40 registers\n" * 2000)
    idea = Idea(text="Cache the row in registers; one read pass", category=Category.memory_access,
                expected_effect="DRAM traffic from 3 reads to 1: ~2x")
    with ChatServer() as server:
        server.default = Model()
        client = LLMClient(LLMConfig(model="m", base_url=server.url, api_key=SecretStr("EMPTY"), max_concurrency=1,
                                     backoff_base_s=0.001, timeout_s=10.0))
        p = LLMProposer(client)
        p.ideas(ctx, parent, 3)
        p.implement(ctx, parent, idea, 2)
        p.repair(ctx, Failure(spec=spec, result=failing), 1)
        per_kind: dict[str, list[int]] = defaultdict(list)
        for req in server.chat_requests:
            body = req.body if isinstance(req.body, dict) else {}
            per_kind[kind_of(body)].append(prompt_chars(body))
    return {"problem": problem, "kinds": {k: {"requests": len(v), "mean_chars": round(sum(v) / len(v)),
                                               "mean_tokens_est": round(sum(v) / len(v) / CHARS_PER_TOKEN)}
                                           for k, v in sorted(per_kind.items())}}


def main(argv: list[str]) -> None:
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if "--contexts" in argv:
        argv = [a for a in argv if a != "--contexts"]
        found = [measure_contexts(p) for p in argv or ["softmax", "matmul"]]
        for r in found:
            print(f"## {r['problem']} (same context, old and new alike)")
            print("| request | mean chars | mean tokens (est.) |")
            print("|---|---|---|")
            for kind, row in r["kinds"].items():
                print(f"| {kind} | {row['mean_chars']:,} | {row['mean_tokens_est']:,} |")
        if out:
            Path(out).write_text(json.dumps(found, indent=2))
        return
    problems = argv or ["softmax", "matmul"]
    results = [measure(p, []) for p in problems]
    for r in results:
        print(f"## {r['problem']} (default search; stopped: {r['stopped']})")
        print("| request | requests | mean chars | mean tokens (est.) | total tokens (est.) |")
        print("|---|---|---|---|---|")
        for kind, row in r["kinds"].items():
            print(f"| {kind} | {row['requests']} | {row['mean_chars']:,} | {row['mean_tokens_est']:,} | "
                  f"{row['total_tokens_est']:,} |")
        print(f"| whole search | {sum(k['requests'] for k in r['kinds'].values())} | | | "
              f"{r['search_total_tokens_est']:,} |")
    if out:
        Path(out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
