"""A model's answer is untrusted: whatever it holds becomes data (a verdict, or a journaled error
with one precise line), never an exception out of the search, never a hang. Each test drives the
real code: expression evaluation, spec parsing, plan resolution, the WorkerPool's compile stage
(over a fake GPU worker), answer parsing, the LLM client against a local chat server, and a whole
search (and its resume) in which the model answers with one hostile answer of each kind."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from pydantic import SecretStr

from kerngen.agent.llm.answers import AnswerError, IdeaList, parse_answer
from kerngen.agent.budget import SearchBudget, SearchConfig, StopKind, Usage
from kerngen.agent.llm.client import LLMCall, LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.proposer import Branch, Category, Failure, Idea
from kerngen import expr
from kerngen.errors import ExprError, KerngenError, LLMError, SpecError
from kerngen.harness.evaluator import Candidate
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import resolve
from kerngen.harness.tune.prune import static_reason
from kerngen.harness.results import Baseline, GpuFacts, Timing, Verdict
from kerngen.harness.spec.spec import MAX_SOURCE_BYTES, KernelSpec
from kerngen.problems.ref import ProblemRef
from tests.fakes.llm_server import ChatServer, Reply, make_context, softmax_spec_dict

X = {"x": TensorFacts((4, 32)), "out": TensorFacts((4, 32))}
KEY = "sk-test-HOSTILE-0123456789abcdef"


# ----- expressions: every intermediate value and the nesting are bounded -----------------------
@pytest.mark.parametrize(
    "text,needle",
    [
        ("(-8)**0.5", "complex"),
        ("-" * 1998 + "1", "nested more than"),
        ("(" * 250 + "1" + ")" * 250, "cannot parse"),
        ("((((9**64)**64)**64)**64)**64", "out of range"),
        ("2**64**64", "out of range"),
        ("10**64 * 10**64 * 10**64 * 10**64 * 10**64", "out of range"),
        ("1 << 65", "shift too large"),
        ("1 << -1", "negative shift"),
        ("int(1e308 * 10)", "not a finite number"),
        ("int(1e300)", "out of range"),
        ("1e400", "not a finite number"),
        ("9" * 1999, "out of range"),
        ("1 / 0", "division by zero"),
        ("7 % 0", "modulo by zero"),
        ("cdiv(1, 0)", "by zero"),
        ("x.shape * 1000000000", "shape where a number is needed"),
        ("-x.shape", "shape where a number is needed"),
        ("sqrt(-1)", "math domain error"),
        ("log2(0)", "math domain error"),
        ("float(2**255) ** 5", "cannot evaluate"),
        ("2.0 ** 300", "exponent too large"),
        ("2 ** 256", "out of range"),
        ("3 ** 162", "out of range"),
        ("x" + ".shape" * 300, "nested more than"),
        ("min()", "cannot evaluate"),
        ("1 +", "cannot parse"),
        ("a" * 2001, "longer than 2000"),
    ],
)
def test_hostile_expressions_fail_fast_with_an_expr_error(text, needle):
    t0 = time.perf_counter()
    with pytest.raises(ExprError) as info:
        expr.evaluate(text, X)
    assert time.perf_counter() - t0 < 1.0
    msg = str(info.value)
    assert needle in msg and "\n" not in msg and len(msg) < 400
    assert isinstance(info.value, KerngenError)
    assert expr.shown(text)[:20] in msg  # the message names the expression


def test_bounds_keep_every_ordinary_expression():
    assert expr.evaluate("2**255 - 1 + 2**255", {}) == 2**256 - 1
    assert expr.evaluate("(2**64) ** 3", {}) == 2**192
    assert expr.evaluate("min(x.shape) * max(x.shape)", X) == 128
    assert expr.evaluate("2 ** -1", {}) == 0.5
    assert expr.evaluate("1 if True else 0", {}) == 1
    assert expr.evaluate_int("cdiv(x.numel, 256) * 256", X) == 256
    assert expr.evaluate("1" + "+1" * 60, {}) == 61  # a long flat sum stays well within the depth


def test_direct_numbers_are_bounded_too():
    assert expr.evaluate(7, {}) == 7
    with pytest.raises(ExprError, match="out of range"):
        expr.evaluate(10**5000, {})  # more digits than Python prints: the message still forms
    with pytest.raises(ExprError, match="finite"):
        expr.evaluate(float("nan"), {})


# ----- specs: what a text can provoke while it is read is a SpecError --------------------------
def _spec(**over) -> dict:
    base = {
        "source": 'extern "C" __global__ void k(const float* x, float* out, int n, float s) {}',
        "steps": [{"kernel": "k", "grid": [1], "block": [32],
                   "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"},
                            {"kind": "float32", "value": "1.5"}]}],
    }
    base.update(over)
    return base


@pytest.mark.parametrize(
    "text,needle",
    [
        (json.dumps(_spec(defines={"BIG": 0})).replace('"BIG": 0', '"BIG": ' + "9" * 5000), "4300"),
        ("defines:\n  BIG: " + "9" * 5000 + "\n", "4300"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
        (json.dumps(_spec(source="x" * (MAX_SOURCE_BYTES + 1))), "1 MB"),
        (json.dumps(_spec(tunables={"B": list(range(2000))})), "at most 1024"),
        (json.dumps(_spec(tunables={f"T{i}": [1, 2] for i in range(40)})), "tunables; at most"),
        (json.dumps(_spec(tunables={"B": [2**63]})), "64 bits"),
        (json.dumps(_spec(steps=[_spec()["steps"][0]] * 100)), "100 steps"),
        (json.dumps(_spec(steps=[{**_spec()["steps"][0], "grid": [2**70]}])), "does not fit 64 bits"),
        (json.dumps(_spec(steps=[{**_spec()["steps"][0], "grid": ["-" * 1998 + "1"]}])), "nested more than"),
        (json.dumps(_spec(description="\ud800")), "not valid Unicode"),
        ("x" * 5_000_000, "characters; at most"),
    ],
)
def test_hostile_spec_texts_raise_one_line_spec_errors(text, needle):
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as info:
        KernelSpec.from_text(text, origin="answer")
    assert time.perf_counter() - t0 < 2.0
    assert needle in str(info.value) and "\n" not in str(info.value)


# ----- launch plans: resolve raises SpecError/ExprError only -----------------------------------
def _step(**over) -> dict:
    return {**_spec()["steps"][0], **over}


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"steps": [_step(grid=["(-8)**0.5"])]}, "complex"),
        ({"steps": [_step(grid=["((((9**64)**64)**64)**64)**64"])]}, "out of range"),
        ({"steps": [_step(grid=["2.5"])]}, "expected an integer"),
        ({"steps": [_step(grid=["0 - 4"])]}, "dimension <= 0"),
        ({"steps": [_step(grid=["2**40"])]}, "exceeds the limit"),
        ({"steps": [_step(block=["1e3 * 1e3"])]}, "exceeds the limit"),
        ({"steps": [_step(shared_mem="2**40")]}, "more than any GPU has"),
        ({"steps": [_step(shared_mem="-1")]}, "< 0"),
        ({"steps": [_step(args=[{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "2**31"},
                                {"kind": "float32", "value": "1"}])]}, "overflows"),
        ({"steps": [_step(args=[{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "1"},
                                {"kind": "float32", "value": "1e39"}])]}, "does not fit a float32"),
        ({"steps": [_step(args=[{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "1"},
                                {"kind": "float32", "value": "2**255"}])]}, "does not fit a float32"),
        ({"steps": [_step(args=[{"name": "x"}, {"name": "nowhere"}])]}, "unknown tensor 'nowhere'"),
        ({"steps": [_step(args=[{"name": "x"}, {"kind": "int32", "value": "nobody + 1"}])]}, "unknown name 'nobody'"),
        ({"steps": [{"tensor": "ghost"}, _step()]}, "unknown tensor 'ghost'"),
        ({"defines": {"BIG": "2**70"}}, "does not fit 64 bits"),
        ({"defines": {"__CUDA_ARCH__": "1"}}, "reserved"),
        ({"tunables": {"_Xv": [1]}}, "reserved"),
        ({"scratch": [{"name": "tmp", "size": "2**50"}]}, "at most 2**40"),
        ({"scratch": [{"name": "tmp", "size": "0"}]}, "has size 0"),
        ({"constraints": ["x.shape < 1"]}, "cannot evaluate"),
    ],
)
def test_hostile_plans_raise_spec_errors_only(over, needle):
    spec = KernelSpec.model_validate(_spec(**over))
    with pytest.raises(SpecError) as info:
        resolve(spec, sizes={"rows": 4, "cols": 32}, tensors=X)
    assert needle in str(info.value) and "\n" not in str(info.value)
    # the tuner's static pruning turns the same into a reason, never an exception
    plan, kind, reason = static_reason(spec, spec.default_config(), sizes={}, tensors=X, gpu=GpuFacts(name="g"))
    assert plan is None and kind in ("plan", "constraint") and reason


def test_a_valid_plan_still_resolves():
    plan = resolve(KernelSpec.model_validate(_spec(defines={"F": "0.5", "N": "2**63"})), sizes={}, tensors=X)
    assert plan.defines == {"F": 0.5, "N": 2**63}
    assert plan.launches[0].args[3].value == 1.5


# ----- the WorkerPool's compile stage: a plan that does not resolve is an invalid_spec verdict --
class _Pool:
    """The real WorkerPool over one fake worker (no GPU), with a made-up baseline."""

    @staticmethod
    def make(timeout_s: float = 10.0):
        from kerngen.harness.pool.local import WorkerPool

        class Pool(WorkerPool):
            def baseline(self, problem, *, budget_ms=300.0, with_compile=True):
                t = Timing(median_ms=1.0, q25_ms=1.0, q75_ms=1.0, min_ms=1.0, max_ms=1.0, mean_ms=1.0,
                           reps=1, warmup=1)
                return Baseline(problem=problem.label(), gpu="fake", eager=t, floor_ms=0.5)

        return Pool(devices=["0"], timeout_s=timeout_s, worker_module="tests.fakes.fake_worker")


SOFTMAX = ProblemRef(source="softmax", shape=(4, 32))
GOOD_SOURCE = ('extern "C" __global__ void k(const float* x, float* out, int n) '
               "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }")


def good_spec(**over) -> dict:
    base = {"name": "copy", "source": GOOD_SOURCE,
            "steps": [{"kernel": "k", "grid": ["cdiv(x.numel, 128)"], "block": [128],
                       "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}]}]}
    base.update(over)
    return base


def test_pool_turns_every_unresolvable_plan_into_an_invalid_spec_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    step = good_spec()["steps"][0]
    hostile = {
        "complex grid": ({"steps": [{**step, "grid": ["(-8)**0.5"]}]}, "complex"),
        "power tower": ({"steps": [{**step, "grid": ["((((9**64)**64)**64)**64)**64"]}]}, "out of range"),
        "huge define": ({"defines": {"D": "2**70"}}, "does not fit 64 bits"),
        "reserved define": ({"defines": {"__nv_x": "1"}}, "reserved"),
        "int32 overflow": ({"steps": [{**step, "args": [{"name": "x"}, {"name": "out"},
                                                        {"kind": "int32", "value": "2**40"}]}]}, "overflows"),
        "unknown tensor": ({"steps": [{**step, "args": [{"name": "x"}, {"name": "y"}]}]}, "unknown tensor 'y'"),
    }
    cands = [Candidate(spec=KernelSpec.model_validate(good_spec(**over))) for over, _ in hostile.values()]
    cands.append(Candidate(spec=KernelSpec.model_validate(good_spec())))
    with _Pool.make() as pool:
        results = pool.evaluate(SOFTMAX, cands)
    for (name, (_, needle)), r in zip(hostile.items(), results):
        assert r.verdict is Verdict.invalid_spec, name
        assert r.message.startswith("launch plan: ") and needle in r.message, (name, r.message)
        assert r.spec_hash
    assert results[-1].verdict is Verdict.ok


def test_pool_turns_a_define_the_compiler_refuses_into_a_verdict(tmp_path, monkeypatch):
    """Defense in depth: should building the -D options fail, that is the candidate's verdict."""
    import kerngen.harness.pool.static_stage as stage_mod
    from kerngen.errors import CompileError

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    real = stage_mod.job_for

    def job_for(spec, plan, arch):
        if spec.name == "refused":
            raise CompileError("define value does not fit 64 bits")
        return real(spec, plan, arch)

    monkeypatch.setattr(stage_mod, "job_for", job_for)
    cands = [Candidate(spec=KernelSpec.model_validate(good_spec(name="refused"))),
             Candidate(spec=KernelSpec.model_validate(good_spec()))]
    with _Pool.make() as pool:
        results = pool.evaluate(SOFTMAX, cands)
    assert results[0].verdict is Verdict.compile_error and "64 bits" in results[0].message
    assert results[1].verdict is Verdict.ok


def test_repair_prompt_shows_the_invalid_spec_verdict_and_its_message():
    from kerngen.agent.llm.prompting import render
    from kerngen.harness.results import EvalResult

    ctx, parent, _ = make_context()
    result = EvalResult(verdict=Verdict.invalid_spec, message="launch plan: expression '(-8)**0.5' has a complex value")
    text = render("repair", ctx=ctx, failure=Failure(spec=parent.spec, result=result), attempt=1, structured=False,
                  clip_limit=24_000, log_limit=4000, host_problems=[])
    assert "verdict: invalid_spec" in text and "'(-8)**0.5' has a complex value" in text


# ----- answers: linear, and every failure names its cause --------------------------------------
N = 400_000
ADVERSARIAL = {
    "unclosed think": "<think>" * (N // 7),
    "backticks": "```" * (N // 3),
    "fence per line": "```json\n{" * (N // 9),
    "open braces": "{" * N,
    "brace quote": '{"' * (N // 2),
    "brace space": "{ " * (N // 2),
    "nested lists": "[" * (N // 2) + "]" * (N // 2),
    "nested objects": '{"a":' * (N // 5),
    "many small objects": '{"a": 1} ' * (N // 9),
    "quotes in prose": 'he said "{" and "[" ' * (N // 20),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_a_400kb_adversarial_answer_is_read_in_linear_time(name):
    text = ADVERSARIAL[name]
    assert len(text) >= N * 0.9
    t0 = time.perf_counter()
    with pytest.raises(AnswerError) as info:
        parse_answer(text, KernelSpec)
    assert time.perf_counter() - t0 < 2.0
    assert "\n" not in str(info.value)


def test_parsing_scales_linearly():
    """Ten times the text takes about ten times as long, not a hundred."""
    def cost(n: int) -> float:
        text = ("prose {" + "x" * 20 + "} ```\n" + '{"a": [1, 2, ' * 3) * n
        t0 = time.perf_counter()
        with pytest.raises(AnswerError):
            parse_answer(text, KernelSpec)
        return time.perf_counter() - t0

    small, big = min(cost(2000) for _ in range(3)), min(cost(20000) for _ in range(3))
    assert big < 40 * max(small, 1e-3)


@pytest.mark.parametrize(
    "text,needle",
    [
        # (trailing commas and comments are read now: what models write)
        (json.dumps(softmax_spec_dict())[:-40], "the answer was cut off mid-JSON"),
        ("Here it is:\n```json\n" + json.dumps(softmax_spec_dict())[:-40], "the answer was cut off mid-JSON"),
        (json.dumps(softmax_spec_dict()).replace('\\"C\\"', '"C"'), "the JSON string `source` is broken at line 1"),
        ('{"name": "x", "source": ' + "9" * 5000 + "}", "more than 4300 digits"),
        ("[" * 100_000, "nested too deeply"),
        ('{"ideas": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
        ("```cuda\n__global__ void k() { if (1) { } }\n```", "no JSON found"),
    ],
)
def test_answer_errors_name_the_real_cause(text, needle):
    with pytest.raises(AnswerError) as info:
        parse_answer(text, KernelSpec)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg
    assert "Field required" not in msg  # a fragment of the broken JSON is not what is reported


def test_an_answer_with_a_lone_surrogate_is_read_and_can_be_journaled():
    data = softmax_spec_dict()
    data["description"] = "fast \ud800 kernel"
    text = json.dumps(data)  # "\ud800" as JSON writes it
    spec = parse_answer(text, KernelSpec)
    assert "\ud800" not in spec.description
    spec.model_dump_json()  # would raise for a lone surrogate
    ideas = parse_answer('{"ideas": [{"text": "a \\udfff b", "category": "compute"}]}', IdeaList)
    ideas.model_dump_json()


# ----- the LLM client: malformed replies are recorded failed calls -----------------------------
@pytest.fixture
def server():
    with ChatServer() as s:
        yield s


def client_for(server, **knobs) -> LLMClient:
    cfg = dict(backoff_base_s=0.001, backoff_max_s=0.01, timeout_s=5.0, max_retries=1)
    cfg.update(knobs)
    return LLMClient(LLMConfig(model="m", base_url=server.url, api_key=SecretStr(KEY), **cfg))


def _good_body() -> dict:
    return Reply.completion("hello").body


def _mutated(fn) -> Reply:
    body = json.loads(json.dumps(_good_body()))
    fn(body)
    return Reply(200, body)


MALFORMED = {
    "truncated body": (Reply(200, json.dumps(_good_body()).encode()[:40]), "JSONDecodeError"),
    "non-UTF-8 bytes": (Reply(200, b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'), "UnicodeDecodeError"),
    "choices is a string": (_mutated(lambda b: b.__setitem__("choices", "x")), "'choices' is of type str"),
    "content is a number": (_mutated(lambda b: b["choices"][0]["message"].__setitem__("content", 5)),
                            "'content' is of type int"),
    "no choices": (_mutated(lambda b: b.pop("choices")), "no 'choices'"),
    "choice without message": (_mutated(lambda b: b.__setitem__("choices", [1])), "has no message"),
    "a JSON list": (Reply(200, [1, 2]), "did not answer like a chat-completions API"),
    "an HTML page": (Reply(200, "<html>hi</html>"), "did not answer like a chat-completions API"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_reply_is_retried_then_a_recorded_failed_call(server, name):
    reply, needle = MALFORMED[name]
    server.default = reply
    client = client_for(server, max_retries=2)
    seen: list[LLMCall] = []
    client.on_call = seen.append
    with pytest.raises(LLMError) as info:
        client.complete([{"role": "user", "content": "hi"}], IdeaList, purpose="ideas")
    err = info.value
    assert err.kind == "bad_reply" and not err.fatal and needle in str(err) and "\n" not in str(err)
    assert len(server.chat_requests) == 3 and err.call.attempts == 3  # retried like a 5xx
    assert len(seen) == 1 and seen[0].error == str(err)  # the failed call is recorded
    assert client.usage_total.failed_calls == 1


def test_odd_but_harmless_fields_are_not_failures(server):
    server.push(_mutated(lambda b: b.__setitem__("usage", "lots")),
                _mutated(lambda b: b["usage"].__setitem__("prompt_tokens", "many")),
                _mutated(lambda b: b["choices"][0].__setitem__("finish_reason", 5)),
                _mutated(lambda b: b.__setitem__("choices", [])))
    client = client_for(server)
    for expected in ("hello", "hello", "hello", ""):
        answer, call = client.complete([{"role": "user", "content": "hi"}], None, purpose="chat")
        assert answer == expected and call.error == ""


def test_the_proposer_never_raises_on_malformed_replies(server):
    ctx, parent, failing = make_context()
    server.default = MALFORMED["truncated body"][0]
    calls: list[LLMCall] = []
    proposer = LLMProposer(client_for(server), on_call=calls.append)
    assert proposer.ideas(ctx, parent, k=2) is None  # no answer: nothing journaled, a resume asks again
    branches = proposer.implement(ctx, parent, Idea(text="x", category=Category.compute), m=2)
    assert len(branches) == 2 and all(b.spec is None and "malformed reply" in b.error for b in branches)
    repaired = proposer.repair(ctx, Failure(spec=parent.spec, result=failing), attempt=1)
    assert repaired.spec is None and "malformed reply" in repaired.error
    assert len(calls) == 4 and all(c.error and c.attempts == 2 for c in calls)


def test_the_sdk_does_not_retry_on_its_own(server):
    assert client_for(server)._sdk.max_retries == 0


def test_request_budget_counts_every_attempt_and_concurrency_is_bounded(server):
    ctx, parent, _ = make_context()
    server.default = Reply.error(503, "overloaded", headers={})
    server.default = lambda req: Reply(503, {"error": {"message": "overloaded"}}, delay_s=0.05)
    calls: list[LLMCall] = []
    proposer = LLMProposer(client_for(server, max_retries=6, max_concurrency=2), on_call=calls.append)
    proposer.limit_requests(3)
    branches = proposer.implement(ctx, parent, Idea(text="x", category=Category.compute), m=4)
    assert len(server.chat_requests) == 3  # not 4 x 7
    assert server.max_in_flight <= 2
    assert branches is None or all(b.spec is None for b in branches)  # no answer before the budget ran out
    assert sum(c.attempts for c in calls) == 3  # every request made is in a journaled call
    # spent: nothing more is sent, and an answer that could not be asked is no answer
    assert proposer.ideas(ctx, parent, k=1) is None
    assert proposer.implement(ctx, parent, Idea(text="y", category=Category.compute), m=2) is None
    assert len(server.chat_requests) == 3


def test_messages_and_records_are_redacted(server, monkeypatch):
    canary = "canary-TOKEN-value-98765"
    monkeypatch.setenv("KERNGEN_TEST_SESSION_TOKEN", canary)
    server.default = lambda req: Reply.completion(f"you said {req.body['messages'][-1]['content']} {KEY}")
    client = client_for(server)
    seen: list[LLMCall] = []
    client.on_call = seen.append
    answer, call = client.complete([{"role": "system", "content": f"log: {canary}"},
                                    {"role": "user", "content": f"key {KEY} and {canary}"}], None, purpose="chat")
    sent = json.dumps(server.chat_requests[0].body)
    assert canary not in sent and KEY not in sent and "[redacted]" in sent
    recorded = call.model_dump_json() + seen[0].model_dump_json() + str(answer)
    assert canary not in recorded and KEY not in recorded


# ----- a whole search: one hostile answer of each kind, then a resume --------------------------
BRANCH = re.compile(r"branch (\d+) of (\d+)")


def _answers() -> list[tuple[str, object, str, str]]:
    """(name, what the server replies, where the outcome lands, what it says). ``where``: "node"
    (the answer is unreadable: a node with an error) or a verdict of the node's evaluation."""
    step = good_spec()["steps"][0]

    def spec_text(**over) -> str:
        return json.dumps(good_spec(**over))

    float_src = GOOD_SOURCE.replace("int n)", "int n, float s)")
    float_args = step["args"] + [{"kind": "float32", "value": "1e39"}]
    return [
        ("complex grid", spec_text(steps=[{**step, "grid": ["(-8)**0.5"]}]), "invalid_spec", "complex"),
        ("unary minus", spec_text(steps=[{**step, "grid": ["-" * 1998 + "1"]}]), "node", "nested more than"),
        ("power tower", spec_text(steps=[{**step, "grid": ["((((9**64)**64)**64)**64)**64"]}]),
         "invalid_spec", "out of range"),
        ("float32 too large", spec_text(source=float_src, steps=[{**step, "args": float_args}]),
         "invalid_spec", "does not fit a float32"),
        ("int32 overflow", spec_text(steps=[{**step, "args": step["args"][:2] + [{"kind": "int32",
                                                                                "value": "2**40"}]}]),
         "invalid_spec", "overflows"),
        ("4300 digits", spec_text(defines={"D": 0}).replace('"D": 0', '"D": ' + "9" * 5000), "node", "4300 digits"),
        ("deep nesting", "[" * 100_000 + "]" * 100_000, "node", "nested too deeply"),
        ("cut off", spec_text()[:-30], "node", "cut off mid-JSON"),
        ("400 kB of braces", "{" * N, "node", "invalid JSON"),
        ("truncated reply", MALFORMED["truncated body"][0], "node", "malformed reply"),
        ("content is a number", MALFORMED["content is a number"][0], "node", "malformed reply"),
        ("reserved define", spec_text(defines={"__CUDA_ARCH__": "1"}), "invalid_spec", "reserved"),
        ("a good one", spec_text(), "ok", ""),
    ]


class _Model:
    """The chat server's script: one idea, then per branch its hostile answer; repairs get the
    good spec (so the repair prompt can be checked for the verdict it shows)."""

    def __init__(self) -> None:
        self.answers = _answers()
        self.repair_prompts: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, req) -> Reply:
        user = req.body["messages"][-1]["content"]
        if "propose optimization ideas" in user:
            return Reply.completion(json.dumps({"ideas": [{"text": "copy it", "category": "memory_access"}]}))
        if "Repair a kernel" in user:
            with self.lock:
                self.repair_prompts.append(user)
            return Reply.completion(json.dumps(good_spec(name="repaired")))
        m = BRANCH.search(user)
        reply = self.answers[int(m.group(1)) - 1][1] if m else "no idea"
        return reply if isinstance(reply, Reply) else Reply.completion(reply)


def _search(tmp_path, server, model, **kw):
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import Search, SearchSettings

    usage = Usage()
    proposer = LLMProposer(client_for(server, max_retries=1, max_concurrency=4), on_call=usage.on_call)
    n = len(model.answers)
    config = SearchConfig(beam=1, ideas=1, branches=n, repairs=1, tune=False)
    budget = SearchBudget(rounds=1, patience=None, max_llm_calls=None, max_tokens=None, wall_minutes=None,
                          gpu_minutes=None)
    settings = SearchSettings.new(SOFTMAX, tmp_path / "runs" / "hostile", config=config, budget=budget)
    return Search(settings, proposer, kw.pop("evaluator"), context_factory=minimal_context, usage=usage, **kw)


def test_a_search_survives_one_hostile_answer_of_each_kind_and_resumes(tmp_path, server, monkeypatch):
    from kerngen.agent.journal import read_events
    from kerngen.agent.search import resume_search
    from kerngen.agent.tree import load_run

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    model = _Model()
    server.default = model
    with _Pool.make() as pool:
        t0 = time.perf_counter()
        out = _search(tmp_path, server, model, evaluator=pool).run()
        assert time.perf_counter() - t0 < 120
        assert out.reason.kind is not StopKind.error, out.reason
        run = load_run(out.run_dir)
        heads = sorted((n for n in run.tree.nodes.values() if n.kind == "branch"), key=lambda n: n.branch_index)
        assert len(heads) == len(model.answers)
        for node, (name, _, where, needle) in zip(heads, model.answers):
            if where == "node":
                assert node.spec is None and needle in node.error, (name, node.error)
            else:
                assert node.result is not None and node.result.verdict.value == where, (name, node.result)
                assert needle in node.result.message, (name, node.result.message)
        # every LLM call is journaled, the failed ones with their error
        events, _ = read_events(out.run_dir)
        llm = [e for e in events if e.type == "llm_call"]
        failed = [e for e in llm if e.record.get("error")]
        assert len(failed) >= sum(1 for _, _, where, _ in model.answers if where == "node")
        assert any("malformed reply" in e.record["error"] for e in failed)
        # the model saw each invalid_spec verdict and its message in its repair prompt
        assert any("verdict: invalid_spec" in p and "complex value" in p for p in model.repair_prompts)
        assert any("does not fit a float32" in p for p in model.repair_prompts)

        # resume passes over every node: nothing crashes, nothing is asked or evaluated again
        asked = len(server.chat_requests)
        budget = SearchBudget(rounds=1, patience=None, max_llm_calls=None, max_tokens=None, wall_minutes=None,
                              gpu_minutes=None)
        proposer = LLMProposer(client_for(server), on_call=Usage().on_call)
        again = resume_search(out.run_dir, proposer, pool, budget=budget)
        assert again.reason.kind is not StopKind.error and len(server.chat_requests) == asked

        # a run cut off after its nodes were created, before they were evaluated: the resume
        # evaluates them (the hostile ones included) and goes on
        cut = tmp_path / "runs" / "cut"
        cut.mkdir()
        lines = (out.run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
        first_eval = next(i for i, line in enumerate(lines) if b'"type":"node_evaluated"' in line)
        (cut / "events.jsonl").write_bytes(b"".join(lines[:first_eval]))
        resumed = resume_search(cut, LLMProposer(client_for(server), on_call=Usage().on_call), pool, budget=budget)
        assert resumed.reason.kind is not StopKind.error, resumed.reason
        verdicts = {n.branch_index: n.verdict for n in load_run(cut).tree.nodes.values() if n.kind == "branch"}
        for i, (name, _, where, _) in enumerate(model.answers):
            assert verdicts[i] == ("invalid" if where == "node" else where), name


def test_search_turns_a_proposer_answer_of_the_wrong_shape_into_data(tmp_path):
    """A proposer that answers with garbage (not only the LLM one): ideas that do not validate
    are dropped, a branch that does not validate is a node with an error."""
    from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import Search, SearchSettings

    class Garbage(ScriptedProposer):
        def ideas(self, ctx, parent, k):
            return [{"text": "ok", "category": "compute"}, {"text": 5, "category": "nonsense"}, "junk"]

        def implement(self, ctx, parent, idea, m):
            return [{"spec": {"source": "x"}}, Branch(notes="\ud800 lone surrogate"), 42]

    settings = SearchSettings.new(ProblemRef(source="softmax"), tmp_path / "g",
                                  config=SearchConfig(beam=1, ideas=3, branches=3, repairs=0, tune=False),
                                  budget=SearchBudget(rounds=1, patience=None, max_llm_calls=None, max_tokens=None,
                                                      wall_minutes=None, gpu_minutes=None))
    out = Search(settings, Garbage(), ScriptedEvaluator(), context_factory=minimal_context).run()
    assert out.reason.kind is StopKind.rounds, out.reason
    nodes = list(out.tree.nodes.values())
    assert len(nodes) == 3 and all(n.spec is None and "not a valid branch" in n.error for n in nodes)


@pytest.mark.parametrize("failing", [False, True])
def test_max_llm_calls_caps_the_http_requests_of_a_whole_search(tmp_path, server, failing):
    """--max-llm-calls 3: at most 3 HTTP requests, the connectivity check, every retry and every
    parallel branch included; no more than --llm-concurrency in flight."""
    from kerngen.agent.scripted import ScriptedEvaluator
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import Search, SearchSettings

    model = _Model()
    server.default = (lambda req: Reply(503, {"error": {"message": "overloaded"}}, delay_s=0.02)) if failing else model
    usage = Usage()
    client = client_for(server, max_retries=6, max_concurrency=2)
    if not failing:
        client.check()  # what make_proposer does before the search (a failing endpoint stops it there)
    proposer = LLMProposer(client, on_call=usage.on_call)
    budget = SearchBudget(rounds=3, patience=None, max_llm_calls=3, max_tokens=None, wall_minutes=None,
                          gpu_minutes=None)
    settings = SearchSettings.new(SOFTMAX, tmp_path / "budget", budget=budget,
                                  config=SearchConfig(beam=2, ideas=3, branches=4, repairs=2, tune=False))
    out = Search(settings, proposer, ScriptedEvaluator(), context_factory=minimal_context, usage=usage).run()
    assert out.reason.kind is not StopKind.error, out.reason
    assert len(server.chat_requests) <= 3
    assert server.max_in_flight <= 2


def test_tune_prunes_configs_whose_plan_does_not_resolve_with_the_reason():
    from kerngen.agent.scripted import ScriptedEvaluator
    from kerngen.harness.tune.tuner import tune

    step = good_spec()["steps"][0]
    spec = KernelSpec.model_validate(good_spec(
        source="// kerngen-scripted ms=1.0\n" + GOOD_SOURCE, tunables={"BLOCK": [128, 256, 512]},
        steps=[{**step, "grid": ["cdiv(x.numel, BLOCK) if BLOCK == 128 else (-8)**0.5"], "block": ["BLOCK"]}]))
    res = tune(ScriptedEvaluator(), SOFTMAX, spec, sizes={}, tensors=X, gpu=GpuFacts(name="g"), max_evals=10,
               probe=None, nvrtc="test", confirm=0)
    assert [t.config for t in res.evaluated] == [{"BLOCK": 128}]
    assert len(res.pruned) == 2 and all(p.prune_kind == "plan" and "complex" in p.pruned for p in res.pruned)
