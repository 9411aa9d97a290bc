"""CPU tier of the harness core: expressions, specs, launch plans, comparisons, buffers, and the
worker isolation of the pool (with a fake worker that hangs or crashes)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from kerngen import expr
from kerngen.harness.gpu.buffers import alloc_guarded, poison, still_poisoned
from kerngen.harness.gpu.compare import compare
from kerngen.errors import ExprError, SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import resolve
from kerngen.harness.pool.protocol import EvaluateRequest
from kerngen.harness.results import CheckFailure, CompileInfo, Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.pool.worker_proc import WorkerDied, WorkerProcess, WorkerTimeout

X = {"x": TensorFacts((4096, 65536)), "conv.weight": TensorFacts((96, 3, 11, 11))}


# ----- expressions ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,value",
    [
        ("cdiv(x.numel, 256)", 4096 * 65536 // 256),
        ("x.shape[1] // 4", 16384),
        ("min(1024, x.shape[0]) * 2", 2048),
        ("conv.weight.shape[2] ** 2", 121),
        ("x.ndim", 2),
        ("round_up(1000, 128)", 1024),
        ("1 if x.shape[1] % 4 == 0 else 0", 1),
        ("B * 4 + 1", 1025),
    ],
)
def test_expressions_evaluate(text, value):
    assert expr.evaluate(text, {**X, "B": 256}) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "x.__class__",
        "open('f')",
        "[1, 2]",
        "lambda: 1",
        "'a' * 3",
        "x.shape[0] if True else ()",
        "2 ** 1000",
        "f(x)",
        "",
    ],
)
def test_expressions_reject_unsafe_or_malformed(text):
    with pytest.raises(ExprError):
        expr.evaluate(text, X)


def test_unknown_name_and_bad_index_are_clear():
    with pytest.raises(ExprError, match="unknown name 'y'"):
        expr.evaluate("y + 1", X)
    with pytest.raises(ExprError, match="out of range"):
        expr.evaluate("x.shape[5]", X)
    with pytest.raises(ExprError, match="expected an integer"):
        expr.evaluate_int("x.shape[0] / 3", X)


def test_names_in_reports_dotted_names():
    assert expr.names_in("cdiv(conv.weight.numel, B) + N") == {"conv.weight", "B", "N"}


# ----- specs ---------------------------------------------------------------------------------
def _spec(**over) -> dict:
    base = {
        "source": 'extern "C" __global__ void k(const float* x, float* out, int n) {}',
        "tunables": {"BLOCK": [128, 256, 512]},
        "defaults": {"BLOCK": 256},
        "constraints": ["x.shape[1] % BLOCK == 0"],
        "steps": [
            {"kernel": "k", "grid": ["cdiv(x.numel, BLOCK)"], "block": ["BLOCK"],
             "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel // 2"}]},
        ],
    }
    base.update(over)
    return base


def test_spec_defaults_configs_and_hash():
    spec = KernelSpec.model_validate(_spec())
    assert spec.default_config() == {"BLOCK": 256}
    assert spec.space_size() == 3 and len(spec.configs()) == 3
    renamed = KernelSpec.model_validate(_spec(name="other"))
    assert renamed.content_hash() == spec.content_hash()
    changed = KernelSpec.model_validate(_spec(source="// changed"))
    assert changed.content_hash() != spec.content_hash()


def test_spec_from_yaml_and_json(tmp_path):
    import yaml

    (tmp_path / "k.yaml").write_text(yaml.safe_dump(_spec()))
    (tmp_path / "k.json").write_text(json.dumps(_spec()))
    assert KernelSpec.load(tmp_path / "k.yaml") == KernelSpec.load(tmp_path / "k.json")


@pytest.mark.parametrize(
    "over,match",
    [
        ({"defaults": {"BLOCK": 100}}, "not among its values"),
        ({"tunables": {"1BAD": [1]}}, "not a C identifier"),
        ({"steps": []}, "at least 1"),
        ({"constraints": ["import os"]}, "cannot parse"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_invalid_specs_give_one_line_errors(over, match):
    with pytest.raises(SpecError, match=match) as info:
        KernelSpec.from_text(json.dumps(_spec(**over)))
    assert "\n" not in str(info.value)


def test_spec_file_errors(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        KernelSpec.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="invalid JSON"):
        KernelSpec.load(bad)


def test_schema_is_json_and_names_steps():
    schema = json.loads(KernelSpec.schema_json())
    assert "steps" in schema["properties"] and "Launch" in schema["$defs"]


# ----- launch plans --------------------------------------------------------------------------
def test_resolve_plan_numbers():
    spec = KernelSpec.model_validate(_spec())
    tensors = {"x": TensorFacts((64, 1024)), "out": TensorFacts((64, 1024))}
    plan = resolve(spec, sizes={}, tensors=tensors, config={"BLOCK": 512})
    launch = plan.launches[0]
    assert launch.grid == (128, 1, 1) and launch.block == (512, 1, 1)
    assert launch.args[2].value == 32768 and launch.args[0].name == "x"


def test_cooperative_flag_reaches_the_plan_and_defaults_off():
    tensors = {"x": TensorFacts((64, 1024)), "out": TensorFacts((64, 1024))}
    plain = resolve(KernelSpec.model_validate(_spec()), sizes={}, tensors=tensors)
    assert plain.launches[0].cooperative is False
    raw = _spec()
    raw["steps"] = [{**raw["steps"][0], "cooperative": True}]
    coop = resolve(KernelSpec.model_validate(raw), sizes={}, tensors=tensors)
    assert coop.launches[0].cooperative is True


def test_resolve_rejects_constraint_unknown_tensor_and_limits():
    spec = KernelSpec.model_validate(_spec())
    odd = {"x": TensorFacts((64, 1000)), "out": TensorFacts((64, 1000))}
    with pytest.raises(SpecError, match="constraint violated"):
        resolve(spec, sizes={}, tensors=odd, config={"BLOCK": 256})
    with pytest.raises(SpecError, match="unknown tensor 'out'"):
        resolve(spec, sizes={}, tensors={"x": TensorFacts((64, 1024))})
    big = KernelSpec.model_validate(_spec(tunables={"BLOCK": [2048]}, defaults={}, constraints=[]))
    with pytest.raises(SpecError, match="exceeds the limit|more than 1024"):
        resolve(big, sizes={}, tensors={"x": TensorFacts((64, 2048)), "out": TensorFacts((64, 2048))})


def test_resolve_scratch_memset_and_overflow():
    spec = KernelSpec.model_validate(
        _spec(
            scratch=[{"name": "partial", "dtype": "float32", "size": "x.shape[0] * 2"}],
            steps=[
                {"tensor": "partial"},
                {"kernel": "k", "grid": [1], "block": [32], "args": [{"name": "partial"},
                 {"kind": "int32", "value": "x.numel * 1024"}]},
            ],
            constraints=[],
        )
    )
    tensors = {"x": TensorFacts((4096, 65536))}
    with pytest.raises(SpecError, match="overflows"):
        resolve(spec, sizes={}, tensors=tensors)
    tensors = {"x": TensorFacts((4, 8))}
    plan = resolve(spec, sizes={}, tensors=tensors)
    assert plan.scratch[0].size == 8 and plan.steps[0].tensor == "partial"


# ----- comparison and poison -----------------------------------------------------------------
def test_compare_ok_and_relative_error():
    ref = torch.randn(64, 128)
    out = ref + 1e-6
    c = compare(out, ref, atol=1e-4, rtol=1e-4)
    assert c.ok and c.max_abs_err == pytest.approx(1e-6, rel=0.1)
    assert 0 < c.rel_err < 1e-5


def test_compare_reports_worst_element_and_where():
    ref = torch.randn(8, 16)
    out = ref.clone()
    out[3, 7] += 0.5
    c = compare(out, ref, atol=1e-4, rtol=1e-4)
    assert not c.ok and c.failed is CheckFailure.mismatch and c.index == [3, 7] and c.mismatches == 1
    assert c.got == pytest.approx(float(out[3, 7])) and c.expected == pytest.approx(float(ref[3, 7]))


def test_compare_fp32_tolerance_catches_a_bf16_downgrade():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    ref = a @ b
    cheap = (a.bfloat16().float() @ b.bfloat16().float())
    assert not compare(cheap, ref, atol=1e-4, rtol=1e-4).ok


def test_compare_nan_and_shape():
    ref = torch.ones(4)
    out = ref.clone()
    out[2] = float("nan")
    assert compare(out, ref, atol=1e-4, rtol=1e-4).failed is CheckFailure.nan_mismatch
    both = ref.clone()
    both[1] = float("nan")
    assert compare(both.clone(), both, atol=1e-4, rtol=1e-4).ok
    wrong_shape = compare(torch.ones(5), ref, atol=1, rtol=1)
    assert not wrong_shape.ok and wrong_shape.failed is CheckFailure.shape_mismatch  # a mutant once made it ok
    wrong_dtype = compare(ref.double(), ref, atol=1, rtol=1)
    assert not wrong_dtype.ok and wrong_dtype.failed is CheckFailure.shape_mismatch and "float64" in wrong_dtype.message


def test_unwritten_output_is_named_as_such():
    gen = torch.Generator().manual_seed(0)
    buf = alloc_guarded("out", (32, 32), torch.float32, torch.device("cpu"), gen)
    ref = torch.randn(32, 32)
    for pattern in ("nan", "huge", "random"):
        p = poison(buf, pattern, gen)
        buf.view[:16] = ref[:16]  # half written
        c = compare(buf.view, ref, atol=1e-4, rtol=1e-4, poison=p)
        assert c.failed is CheckFailure.unwritten_output, pattern
        assert still_poisoned(buf.view, p)[16:].all() and not still_poisoned(buf.view, p)[:16].any()


def test_guards_detect_out_of_bounds_writes():
    gen = torch.Generator().manual_seed(1)
    buf = alloc_guarded("out", (100,), torch.float32, torch.device("cpu"), gen)
    assert buf.guards_intact()
    buf.view.fill_(1.0)
    assert buf.guards_intact()
    buf.full[buf.full.numel() - 1] = 0.0  # one element past the end of the guard region's tail
    assert not buf.guards_intact()
    assert buf.view.data_ptr() % 256 == buf.full.data_ptr() % 256  # alignment of the usable view kept


# ----- worker isolation (fake worker, no GPU) ------------------------------------------------
def _request(tag: str) -> EvaluateRequest:
    from kerngen.harness.evaluator import EvalOptions
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.ref import ProblemRef

    return EvaluateRequest(
        problem=ProblemRef(source="softmax"), spec_hash=tag,
        plan=ResolvedPlan(config={}, defines={}, scratch=[], steps=[]), cubin_b64="",
        compile=CompileInfo(key="k", arch="sm_90", nvrtc_version="13.0", options=[], seconds=0, cached=True),
        options=EvalOptions(),
    )


def test_worker_hang_is_killed_and_crash_is_reported_then_next_job_runs():
    w = WorkerProcess(0, "0", start_timeout_s=60, module="tests.fakes.fake_worker")
    try:
        ok = w.request(_request("fine"), timeout_s=30)
        assert ok.result.verdict is Verdict.ok
        first_pid = w.proc.pid
        with pytest.raises(WorkerTimeout):
            w.request(_request("hang"), timeout_s=1.0)
        assert not w.alive
        again = w.request(_request("fine"), timeout_s=30)
        assert again.result.verdict is Verdict.ok and w.proc.pid != first_pid
        with pytest.raises(WorkerDied) as died:
            w.request(_request("crash"), timeout_s=30)
        assert "exit code 11" in str(died.value) and "illegal address" in died.value.log_tail
        assert w.request(_request("fine"), timeout_s=30).result.verdict is Verdict.ok
        assert w.restarts == 2
    finally:
        w.close()


def test_problem_setup_on_a_fresh_worker_does_not_count_against_the_candidate():
    """The fake worker takes 2 s to prepare the (2, 2) problem; the candidate's timeout is 1 s.
    Before the prepare step, the first candidate after every (re)start timed out under load."""
    from kerngen.problems.ref import ProblemRef

    w = WorkerProcess(0, "0", start_timeout_s=60, module="tests.fakes.fake_worker")
    try:
        slow = _request("fine")
        slow.problem = ProblemRef(source="softmax", shape=(2, 2))
        assert w.request(slow, timeout_s=1.0).result.verdict is Verdict.ok
        with pytest.raises(WorkerDied):
            w.request(_request("crash"), timeout_s=30)
        assert w.request(slow, timeout_s=1.0).result.verdict is Verdict.ok  # restarted worker
        assert w.restarts == 1
    finally:
        w.close()


def test_cubin_travels_base64():
    req = _request("x")
    req.cubin_b64 = EvaluateRequest.encode(b"\x7fELF\x00\xff")
    again = EvaluateRequest.model_validate_json(req.model_dump_json())
    assert again.cubin() == b"\x7fELF\x00\xff"
    assert math.isfinite(again.options.budget_ms)


def test_precision_downgrade_hidden_by_atol_is_caught():
    # softmax over 65536 columns: values ~1.5e-5, far under atol=1e-4
    ref = torch.softmax(torch.randn(4, 65536, dtype=torch.float64), dim=1).float()
    downgraded = ref.bfloat16().float()
    assert torch.allclose(downgraded, ref, atol=1e-4, rtol=1e-4)  # allclose alone would pass it
    c = compare(downgraded, ref, atol=1e-4, rtol=1e-4)
    assert not c.ok and c.failed is CheckFailure.precision_loss and c.rel_err > 1e-3
    honest = torch.softmax(torch.log(ref.double()), dim=1).float()  # recomputed in another order
    assert compare(honest, ref, atol=1e-4, rtol=1e-4).ok


def test_inf_errors_survive_the_pipe():
    from kerngen.harness.results import CheckEvidence, EvalResult

    r = EvalResult(verdict=Verdict.incorrect, check=CheckEvidence(max_abs_err=float("inf"), rel_err=float("nan")))
    back = EvalResult.model_validate_json(r.model_dump_json())
    assert back.check.max_abs_err == float("inf") and math.isnan(back.check.rel_err)


def _fake_spec(kernel: str, block: int = 32) -> "KernelSpec":
    src = f'extern "C" __global__ void {kernel}(float* out) {{ out[threadIdx.x] = 1.f; }}'
    return KernelSpec.model_validate(
        {"source": src, "steps": [{"kernel": kernel, "grid": [1], "block": [block], "args": [{"name": "out"}]}]}
    )


def test_pool_spreads_work_isolates_hangs_and_crashes_and_keeps_order(tmp_path, monkeypatch):
    """The real WorkerPool (real NVRTC compile in the parent) over two fake workers."""
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    cands = [Candidate(spec=_fake_spec("fine", 32 * (i + 1))) for i in range(6)]
    cands.insert(2, Candidate(spec=_fake_spec("hang")))
    cands.insert(4, Candidate(spec=_fake_spec("crash")))
    cands.append(Candidate(spec=KernelSpec.model_validate({**_fake_spec("fine").model_dump(), "source": "oops"})))
    seen: list[int] = []
    with WorkerPool(devices=["0", "1"], timeout_s=3.0, worker_module="tests.fakes.fake_worker") as pool:
        results = pool.evaluate(ProblemRef(source="softmax", shape=(4, 32)), cands,
                                EvalOptions(timeout_s=3.0), on_result=lambda i, r: seen.append(i))
    assert sorted(seen) == list(range(len(cands)))
    verdicts = [r.verdict for r in results]
    assert verdicts[2] is Verdict.timeout and verdicts[4] is Verdict.runtime_error
    assert verdicts[-1] is Verdict.compile_error and "oops" in results[-1].log
    fine = [r for r, c in zip(results, cands) if c.spec.steps[0].kernel == "fine" and c.spec.source != "oops"]
    assert all(r.verdict is Verdict.ok for r in fine)
    assert [r.spec_hash for r in fine] == [c.spec.content_hash() for c in cands
                                           if c.spec.steps[0].kernel == "fine" and c.spec.source != "oops"]
    assert {r.worker for r in results if r.worker is not None} == {0, 1}


def test_pool_starts_nothing_past_the_deadline(tmp_path, monkeypatch):
    """A candidate not compiled or started by ``EvalOptions.deadline`` comes back ``cancelled``, in
    its place; one started before it finishes."""
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    problem = ProblemRef(source="softmax", shape=(4, 32))
    slow = [Candidate(spec=_fake_spec("slow", 32 * (i + 1))) for i in range(3)]
    with WorkerPool(devices=["0"], timeout_s=10.0, worker_module="tests.fakes.fake_worker") as pool:
        past = pool.evaluate(problem, slow, EvalOptions(deadline=time.monotonic() - 1.0))
        assert [r.verdict for r in past] == [Verdict.cancelled] * 3  # nothing compiled, nothing run
        assert all(r.worker is None and r.compile is None for r in past)
        pool.evaluate(problem, slow[:1])  # compiled once: the next call's compile is a cache hit
        seen: list[tuple[int, Verdict]] = []
        results = pool.evaluate(problem, slow[:1] * 2 + slow[1:], EvalOptions(deadline=time.monotonic() + 0.5),
                                on_result=lambda i, r: seen.append((i, r.verdict)))
    # the first started before the deadline and took a second; the rest were not started
    assert [r.verdict for r in results] == [Verdict.ok] + [Verdict.cancelled] * 3
    assert sorted(seen) == [(0, Verdict.ok)] + [(i, Verdict.cancelled) for i in (1, 2, 3)]
    assert results[3].spec_hash == slow[2].spec.content_hash()


def test_shards_start_every_worker_before_a_problem_starts_its_clock():
    """A batch runs one problem per shard; a worker that started on its shard's first request paid
    its start (a process, torch, a CUDA context) inside that problem's budget."""
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(devices=["0", "1", "2"], timeout_s=10.0, worker_module="tests.fakes.fake_worker") as pool:
        assert not any(w.alive for w in pool.workers)
        shards = pool.shards()
        assert all(w.alive for w in pool.workers) and len(shards) == 3


def test_an_interrupted_evaluate_lands_nothing_after_it_raises_and_starts_nothing_queued(tmp_path, monkeypatch):
    """Ctrl-C (a time limit's SIGINT) reaches the thread joining the dispatch threads; the search
    then closes its journal. A result that landed after that wrote to a closed journal from a
    dispatch thread (a traceback at the end of a KernelBench batch, H100, session 9). The interrupt
    is made where Python delivers it, in the join of a dispatch thread (a real signal's arrival
    depends on the handlers other tests leave behind)."""
    import threading

    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    problem = ProblemRef(source="softmax", shape=(4, 32))
    slow = [Candidate(spec=_fake_spec("slow", 32 * (i + 1))) for i in range(3)]  # a second each
    seen: list[int] = []
    real_join, armed = threading.Thread.join, {"on": False}

    def join(self, timeout=None):
        if armed["on"] and getattr(getattr(self, "_target", None), "__name__", "") == "drain":
            armed["on"] = False
            real_join(self, 0.5)  # the first candidate is running
            raise KeyboardInterrupt
        return real_join(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    with WorkerPool(devices=["0"], timeout_s=10.0, worker_module="tests.fakes.fake_worker") as pool:
        pool.evaluate(problem, slow)  # compiled: the timed call below runs the three back to back
        armed["on"] = True
        with pytest.raises(KeyboardInterrupt):
            pool.evaluate(problem, slow, EvalOptions(timeout_s=10.0), on_result=lambda i, r: seen.append(i))
        time.sleep(2.5)  # the first candidate finishes in flight; had the queue gone on, all three would
        assert seen == []
        after = pool.evaluate(problem, slow[:1], EvalOptions(timeout_s=10.0))  # the worker serves again
        assert after[0].verdict is Verdict.ok


@pytest.mark.parametrize("user", [None, "max_split_size_mb:512"])
def test_workers_get_expandable_segments_unless_the_user_chose_an_allocator(user, monkeypatch):
    """KernelBench at its own size ran out of memory 10 GB under the memory plan through the
    allocator's fragmentation (35_GroupNorm, H100): workers map memory in pages. A user's own
    PYTORCH_CUDA_ALLOC_CONF is kept."""
    import subprocess

    import kerngen.harness.pool.worker_proc as wp

    seen = {}

    class _Stop(Exception):
        pass

    def fake_popen(args, **kw):
        seen.update(kw["env"])
        raise _Stop

    if user is None:
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", user)
    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    with pytest.raises(_Stop):
        wp.WorkerProcess(0, "3").start()
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == (user or wp.ALLOC_CONF) and "expandable_segments" in wp.ALLOC_CONF


def test_a_worker_killed_from_outside_is_told_apart_from_a_crash(monkeypatch):
    """A SIGKILL this side did not send (a Ray node going down kills its processes) is marked, and the Ray actor relays
    it as KILLED, which the driver takes for a lost actor (the candidate handed on), never a kernel's verdict: under
    load, CI saw the candidate of a killed node come back "runtime error: the worker process died (exit code -9)".
    A crash stays the candidate's; so does our own kill of a hang (a timeout)."""
    import os
    import signal
    import threading

    pytest.importorskip("ray")
    from kerngen.harness.pool import ray_pool
    from kerngen.harness.pool.protocol import HelloRequest

    w = WorkerProcess(0, "0", start_timeout_s=60, module="tests.fakes.fake_worker")
    try:
        assert w.request(_request("fine"), timeout_s=30).result.verdict is Verdict.ok
        threading.Timer(1.0, lambda: os.killpg(w.proc.pid, signal.SIGKILL)).start()
        with pytest.raises(WorkerDied) as killed:
            w.request(_request("hang"), timeout_s=30)
        assert killed.value.killed_outside and "SIGKILL from outside" in str(killed.value)
        assert ray_pool.relay_died(killed.value)[0] == ray_pool.KILLED
        with pytest.raises(WorkerDied) as crashed:
            w.request(_request("crash"), timeout_s=30)
        assert not crashed.value.killed_outside and ray_pool.relay_died(crashed.value)[0] == ray_pool.DIED
        with pytest.raises(WorkerTimeout):  # our own SIGKILL of a hang, then a crash: not from outside
            w.request(_request("hang"), timeout_s=1.0)
        with pytest.raises(WorkerDied) as after:
            w.request(_request("crash"), timeout_s=30)
        assert not after.value.killed_outside
    finally:
        w.close()

    class _Remote:
        @staticmethod
        def remote(*args):
            return "ref"

    class _Actor:
        request = _Remote

    monkeypatch.setattr(ray_pool.ray, "get", lambda ref, timeout=None: (ray_pool.KILLED, str(killed.value), ""))
    actor = ray_pool.ActorWorker(0, _Actor(), "192.0.2.2", "1", "NVIDIA H200")
    with pytest.raises(ray_pool.ActorLost, match="SIGKILL from outside"):
        actor.request(HelloRequest(ceilings=False), 1.0)
    assert actor.down


def test_the_local_pool_gives_a_worker_killed_from_outside_no_kernel_verdict(tmp_path, monkeypatch):
    """The host's OOM killer (or anyone) SIGKILLs the worker under a candidate: a harness error, not the kernel's
    runtime error; the next candidate runs on a restarted worker."""
    import os
    import signal
    import threading

    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    cands = [Candidate(spec=_fake_spec("hang")), Candidate(spec=_fake_spec("fine"))]
    with WorkerPool(devices=["0"], timeout_s=30.0, worker_module="tests.fakes.fake_worker") as pool:
        pool.evaluate(ProblemRef(source="softmax", shape=(4, 32)), [Candidate(spec=_fake_spec("fine"))],
                      EvalOptions(timeout_s=30.0))  # the worker started
        proc = pool.workers[0].proc
        threading.Timer(1.5, lambda: os.killpg(proc.pid, signal.SIGKILL)).start()
        results = pool.evaluate(ProblemRef(source="softmax", shape=(4, 32)), cands, EvalOptions(timeout_s=30.0))
    assert results[0].verdict is Verdict.harness_error and "SIGKILL from outside" in results[0].message
    assert results[1].verdict is Verdict.ok
