"""prompts/*.j2 rendered by agent/llm/prompting.py with a realistic SearchContext."""

from __future__ import annotations

import json
from importlib import resources

import jinja2
import pytest

from kerngen.agent.llm.answers import IdeaList
from kerngen.agent.llm.proposer import BRANCH_APPROACHES, CATEGORY_HELP, LLMProposer
from kerngen.agent.llm.prompting import TEMPLATES, render, trim_log
from kerngen.agent.llm.spec_schema import spec_schema_text
from kerngen.agent.proposer import Category, Failure, Idea
from tests.fakes.llm_server import make_context

IDEA = Idea(text="Cache the row in registers; one read pass", category=Category.memory_access,
            expected_effect="DRAM traffic from 3 reads to 1: ~2x")


@pytest.fixture
def ctx():
    return make_context()


def schema_text(model) -> str:
    return json.dumps(model.model_json_schema())


def render_all(ctx, structured: bool = False):
    """Every prompt as the proposer renders it (the user message; the system message apart)."""
    context, parent, failing = ctx
    p = LLMProposer(client=None)  # type: ignore[arg-type]

    def user(template, **variables):
        return p.messages_for(context, template, **variables)(structured)[1]["content"]

    return {
        "system": p.system_prompt(context, structured),
        "ideas": user("ideas", parent=parent, k=5, categories=[(c.value, CATEGORY_HELP[c]) for c in Category]),
        "implement": user("implement", parent=parent, idea=IDEA, branch=1, m_branches=4, approach=BRANCH_APPROACHES[1]),
        "repair": user("repair", failure=Failure(spec=parent.spec, result=failing), attempt=2, host_problems=[]),
    }


def test_templates_are_package_data():
    files = resources.files("kerngen.prompts")
    for name in TEMPLATES:
        assert files.joinpath(f"{name}.j2").is_file()


def test_strict_undefined_raises_on_a_missing_variable(ctx):
    context, parent, _ = ctx
    with pytest.raises(jinja2.UndefinedError):
        render("ideas", ctx=context, parent=parent)  # no k, categories, structured
    with pytest.raises(jinja2.UndefinedError):
        render("system", ctx=context)


def test_unknown_template():
    with pytest.raises(jinja2.TemplateNotFound):
        render("nope")


def test_system_prompt(ctx):
    text = render_all(ctx)["system"]
    context = ctx[0]
    assert spec_schema_text(context) in text  # the kernel spec schema, trimmed: no TMA for an fp32 softmax
    assert "TensorMapArg" not in text and "tensormap" not in text and len(spec_schema_text(context)) < 4500
    assert "NVIDIA H200" in text and "132 SMs" in text and "4280 GB/s" in text and "51.0 TFLOP/s" in text
    assert "torch.softmax(x, dim=1)" in text and "`x`: [4096, 65536], float32" in text
    assert "eager 1.067 ms" in text and "torch.compile 0.781 ms" in text and "Roofline floor: 0.5 ms" in text
    for rule in ('extern "C" __global__', "No host code", "no libraries", "No mutable `__device__`",
                 "-DNAME=value", "`out0`", "scratch", "cdiv", "x.shape[i]", "x.numel"):
        assert rule in text, rule
    # the GPU limits no device query gives
    for fact in ("at most 255 registers", "warps of 32 threads", "up to 32 resident blocks, 64 warps (2048 threads)",
                 "`__cluster_dims__"):
        assert fact in text, fact


def test_one_answer_format_by_structured_output(ctx):
    """With structured output the schema goes in response_format only and the answer is one JSON
    object; without it, the schema is in the system prompt and the answer a cuda block + JSON plan.
    Never both instructions in one prompt."""
    plain, structured = render_all(ctx), render_all(ctx, structured=True)
    assert "the CUDA source in one ```cuda block, then the rest of the spec" in plain["system"]
    assert "one JSON object" not in plain["system"].split("# How to answer")[1].split("An example")[0]
    assert "as one JSON object" in structured["system"] and "```cuda block" not in structured["system"]
    assert spec_schema_text(ctx[0]) not in structured["system"] and '"source": "#ifndef BLOCK' in structured["system"]
    for kind in ("implement", "repair"):
        assert "as one JSON object" in structured[kind] and "```cuda block" in plain[kind]
        assert "as one JSON object" not in plain[kind] and "```cuda block" not in structured[kind]


def test_ideas_prompt(ctx):
    text = render_all(ctx)["ideas"]
    assert "propose 5" in text
    for c in Category:
        assert f"`{c.value}`" in text
    assert "median 1.573 ms" in text and "0.68x" in text and "32% of the floor" in text
    assert "40 registers/thread" in text and "8 B spill stores" in text
    assert "Use float4 vector loads for every pass -> ok 1.18x over parent" in text
    assert "incorrect after 2 repairs" in text
    assert "first `analysis`" in text and "expected_effect" in text and schema_text(IdeaList) not in text


def test_ideas_prompt_without_parent(ctx):
    context, _, _ = ctx
    text = render("ideas", ctx=context, parent=None, k=3, structured=True, clip_limit=1000,
                  categories=[(c.value, CATEGORY_HELP[c]) for c in Category])
    assert "no kernel yet" in text


def test_implement_prompt(ctx):
    text = render_all(ctx)["implement"]
    assert "branch 2 of 4" in text and BRANCH_APPROACHES[1] in text
    assert IDEA.text in text and IDEA.expected_effect in text
    assert "median 1.573 ms" in text and "softmax_rows" in text and '"tunables": {"BLOCK": [128, 256, 512, 1024]}' in text
    assert "Online softmax: fuse max and sum into one pass" in text


def test_repair_prompt(ctx):
    text = render_all(ctx)["repair"]
    assert "attempt 2" in text and "verdict: incorrect" in text and "failed check: mismatch" in text
    assert "max abs error 0.0123 at index [17, 4095] of `out`: got 0.0311, expected 0.0188" in text
    assert "configuration: {\"BLOCK\": 512}" in text and "characters cut" in text


def test_repair_prompt_compile_error(ctx):
    from kerngen.harness.results import EvalResult, Verdict

    context, parent, _ = ctx
    result = EvalResult(verdict=Verdict.compile_error, message="NVRTC failed",
                        log='kernel.cu(3): error: identifier "INFINITY" is undefined\n1 error detected')
    p = LLMProposer(client=None)  # type: ignore[arg-type]
    text = p.messages_for(context, "repair", failure=Failure(spec=parent.spec, result=result), attempt=1,
                          host_problems=[])(False)[1]["content"]
    assert "## Log (NVRTC)" in text and 'identifier "INFINITY" is undefined' in text
    assert "max abs error" not in text


def test_every_message_carries_schema_gpu_parent_and_tried(ctx):
    """What the model sees per request (system + user) has all the facts the issue lists."""
    r = render_all(ctx)
    schema = spec_schema_text(ctx[0])
    for purpose in ("ideas", "implement"):
        seen = r["system"] + r[purpose]
        for needle in (schema, "NVIDIA H200", "1.573 ms", "Use float4 vector loads"):
            assert needle in seen, (purpose, needle[:40])
    assert schema in r["system"] + r["repair"] and "NVIDIA H200" in r["system"]


def test_proposer_system_prompt_is_stable(ctx):
    """The system prompt does not depend on the round or the tried ideas (prefix caching)."""
    context, _, _ = ctx
    p = LLMProposer(client=None)  # type: ignore[arg-type]
    first = p.system_prompt(context)
    later = context.model_copy(update={"round": 9, "tried": []})
    assert p.system_prompt(later) == first


def test_trim_log():
    log = "\n".join(f"line {i}" for i in range(3000)) + "\nkernel.cu(9): error: bad thing\n" + "tail\n" * 10
    out = trim_log(log, limit=1000)
    assert len(out) < 1200 and "error: bad thing" in out and "characters cut" in out and out.endswith("tail")
    assert trim_log("short") == "short" and trim_log(None) == ""


def _matmul_system(precision: str | None, tolerance=None) -> str:
    """The system prompt of a 1024^3 matmul on an H200 at ``precision`` (default_context, as a search builds it)."""
    from kerngen.agent.context import default_context
    from kerngen.harness.results import Baseline, GpuFacts, Timing
    from kerngen.problems.ref import parse_problem_ref

    t = Timing(median_ms=2.0, q25_ms=2.0, q75_ms=2.0, min_ms=2.0, max_ms=2.0, mean_ms=2.0, reps=10, warmup=1)
    gpu = GpuFacts(name="NVIDIA H200", arch="sm_90", sm_count=132, copy_gbps=4280.0, fp32_tflops=51.0,
                   bf16_tflops=800.0)
    b = Baseline(problem="matmul", gpu=gpu.name, eager=t, floor_ms=0.01, floor_bound="compute", flops=2 * 1024**3,
                 min_bytes=3 * 4 * 1024**2, tolerance=tolerance)
    ctx = default_context(parse_problem_ref("matmul", shape="1024", precision=precision), gpu, b)
    return LLMProposer(client=None).system_prompt(ctx)  # type: ignore[arg-type]


def test_the_check_is_stated_at_the_precision_and_tolerance_the_harness_applies():
    from kerngen.harness.results import Tolerance
    from kerngen.problems.torch_modes import Precision

    fp32 = _matmul_system(None)
    assert "with atol = 0.0001, rtol = 0.0001" in fp32 and "(1e-05 for float32)" in fp32
    assert "for fp32 this rules out TF32" in fp32 and "TF32 precision" not in fp32 and "1xTF32 kernel" not in fp32
    # --precision tf32, the tolerance measured on the GPU (the baseline carries it)
    measured = Tolerance(precision=Precision.tf32, atol=3e-3, rtol=1e-4, rel_limits={"float32": 2e-3},
                         measured_abs=7.5e-4, measured_rel=5e-4, against="fp64")
    tf32 = _matmul_system("tf32", measured)
    check = tf32.split("# The correctness check")[1].split("# The launch plan")[0]
    assert "checked at TF32 precision (`--precision tf32`)" in check and "off by 0.00075 at most" in check
    assert "with atol = 0.003, rtol = 0.0001" in check and "(0.002 for float32)" in check
    assert "rules out TF32" not in tf32 and "atol = 0.0001" not in tf32 and "tolerance: atol=" not in tf32
    assert "1xTF32 on the tensor cores" in check
    # 2*1024^3 FLOP at TF32's 400 TFLOP/s (half the measured bf16 rate): the bound TF32 allows, beside FFMA's
    assert "a 1xTF32 kernel (400 TFLOP/s) at least 0.005369 ms" in tf32
    # a dry run measured nothing: it says so, and that the problem's numbers are the least the tolerance can be
    dry = _matmul_system("tf32")
    check = dry.split("# The correctness check")[1].split("# The launch plan")[0]
    assert "not known here (a dry run measures nothing)" in check and "the least it can be" in check
    assert "rules out TF32" not in dry and "atol = 0.0001" in check
