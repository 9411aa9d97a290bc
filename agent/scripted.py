"""A deterministic proposer, evaluator and tuner, shipped for tests and demos (no LLM, no GPU).

Nothing here measures anything. :class:`ScriptedProposer` writes toy CUDA-C specs whose first
line carries a marker (``// kerngen-scripted ms=0.8123 bug=compile:1``); :class:`ScriptedEvaluator`
reads the marker back and answers with a made-up but deterministic :class:`EvalResult`: a
``compile_error`` or ``incorrect`` verdict while a bug is left, else a time that depends on the
marker and the ``BLOCK`` tunable (256 is best, so the tuner has something to find). Repairs
remove one level of a bug; a bug with a level above the repair budget never gets fixed.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any, Sequence


from kerngen.problems.torch_modes import DEFAULTS_LABEL
from kerngen.agent.proposer import Branch, Category, Failure, Idea, NodeSummary, SearchContext
from kerngen.harness.evaluator import Candidate, EvalOptions, OnResult
from kerngen.harness.results import (
    Baseline, CheckEvidence, CheckFailure, CompileInfo, EvalResult, GpuFacts, KernelResources, Timing, Verdict,
)
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.outcome import TuneOutcome, TunePoint
from kerngen.problems.ref import ProblemRef

SCRIPTED_GPU = "scripted evaluator (deterministic, no GPU, times are made up)"
_MARK = re.compile(r"//\s*kerngen-scripted\s+ms=([0-9.]+)(?:\s+bug=(compile|incorrect|runtime):(\d+))?")

CATALOGUE: list[tuple[Category, str, str]] = [
    (Category.memory_access, "Vectorize global loads and stores with float4 so each thread moves 16 bytes.",
     "fewer memory transactions, ~1.2x on a memory-bound op"),
    (Category.parallelism, "Give each row to one warp and reduce with __shfl_xor_sync instead of shared memory.",
     "no block barriers, better occupancy"),
    (Category.memory_access, "Fuse the passes into one: keep the row in registers between the max, the sum and "
     "the normalization.", "one read of the input instead of three"),
    (Category.compute, "Use exp2f with a pre-multiplied log2(e) and __frcp_rn for the reciprocal.",
     "fewer instructions in the inner loop"),
    (Category.async_latency, "Prefetch the next tile with cp.async into shared memory while the current one "
     "is reduced.", "hides global latency"),
    (Category.control_flow, "Unroll the inner loop by 4 with #pragma unroll and hoist the bounds checks.",
     "less loop overhead"),
    (Category.parallelism, "Launch enough blocks to fill every SM twice (grid-stride loop).",
     "better load balance on the tail"),
    (Category.precision, "Accumulate in fp32 but load and store in the input's dtype with packed conversions.",
     "halves bytes for half-precision inputs"),
    (Category.memory_access, "Use an online (single-pass) max and sum so the input is read once.",
     "one pass fewer over global memory"),
    (Category.control_flow, "Specialize the kernel on the row length as a compile-time constant.",
     "constant trip counts, full unrolling"),
]


def _h(*parts: Any) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def scripted_spec(ms: float, bug: str | None = None, level: int = 0, name: str = "candidate",
                  description: str = "") -> KernelSpec:
    """A toy spec whose marker the scripted evaluator reads back."""
    marker = f"// kerngen-scripted ms={ms:.6f}" + (f" bug={bug}:{level}" if bug and level > 0 else "")
    source = (
        f"{marker}\n"
        'extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int n) {\n'
        "    int i = blockIdx.x * BLOCK + threadIdx.x;\n"
        "    if (i < n) out[i] = x[i];\n"
        "}\n"
    )
    return KernelSpec(
        name=name, description=description, source=source, tunables={"BLOCK": [128, 256, 512]},
        defaults={"BLOCK": 128},
        steps=[{"kernel": "kernel", "grid": ["cdiv(x.numel, BLOCK)"], "block": ["BLOCK"],
                "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}]}],
    )


def read_marker(spec: KernelSpec) -> tuple[float, str | None, int]:
    m = _MARK.search(spec.source)
    if not m:  # a spec from elsewhere: a time from its content
        return 0.5 + (_h(spec.content_hash()) % 1000) / 1000.0, None, 0
    return float(m.group(1)), m.group(2), int(m.group(3) or 0)


class ScriptedProposer:
    """Deterministic answers; counts every question in ``calls`` and keeps the ``tried`` lists."""

    name = "scripted"
    demo = True  # a run with it is a demo (journaled in run_started)

    def __init__(self, start_ms: float = 1.2, fail_every: int = 3) -> None:
        self.start_ms = start_ms
        self.fail_every = fail_every
        self.calls: dict[str, int] = {"ideas": 0, "implement": 0, "repair": 0}
        self.seen_tried: list[list[str]] = []  # ctx.tried texts at each ideas call

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea]:
        self.calls["ideas"] += 1
        tried = {t.idea.text for t in ctx.tried}
        self.seen_tried.append(sorted(tried))
        pid = parent.node_id if parent else -1
        start = _h("ideas", ctx.round, pid) % len(CATALOGUE)
        out: list[Idea] = []
        for n in range(len(CATALOGUE) * 2):
            cat, text, effect = CATALOGUE[(start + n) % len(CATALOGUE)]
            if n >= len(CATALOGUE):
                text = f"{text} (variant {ctx.round})"
            if text in tried or any(i.text == text for i in out):
                continue
            out.append(Idea(text=text, category=cat, expected_effect=effect))
            if len(out) == k:
                break
        return out

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea, m: int) -> list[Branch]:
        self.calls["implement"] += 1
        base = read_marker(parent.spec)[0] if parent else self.start_ms
        pid = parent.node_id if parent else -1
        out = []
        for j in range(m):
            h = _h("impl", ctx.round, pid, idea.text, j)
            if h % 11 == 5:
                out.append(Branch(error="the answer held no JSON spec (scripted failure)", notes=f"branch {j}"))
                continue
            factor = 0.72 + (h % 45) / 100.0  # 0.72 .. 1.16
            bug, level = None, 0
            if self.fail_every and h % self.fail_every == 0:
                bug = ("compile", "incorrect", "runtime")[(h // 7) % 3]
                level = 1 + (h // 13) % 3  # 3 means never fixed within 2 repairs
            ms = max(base * factor, 0.42 + (h % 7) / 1000.0)  # never below the made-up floor (0.4)
            spec = scripted_spec(ms, bug, level, name=f"r{ctx.round}-{j}",
                                 description=idea.text[:80])
            out.append(Branch(spec=spec, notes=f"branch {j} of: {idea.text[:60]}"))
        return out

    def repair(self, ctx: SearchContext, failure: Failure, attempt: int) -> Branch:
        self.calls["repair"] += 1
        spec, result = failure.spec, failure.result
        if spec is None or result is None:
            return Branch(error="the scripted proposer repairs kernels, not unreadable answers")
        ms, bug, level = read_marker(spec)
        if bug is None:
            return Branch(spec=spec, notes="nothing to repair")
        fixed = scripted_spec(ms * 1.01, bug, level - 1, name=spec.name + f"-fix{attempt}",
                              description=spec.description)
        return Branch(spec=fixed, notes=f"repair {attempt}: addressed {result.verdict.value}")


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, q25_ms=ms * 0.99, q75_ms=ms * 1.01, min_ms=ms * 0.98, max_ms=ms * 1.05,
                  mean_ms=ms, reps=50, warmup=3, samples_ms=[], l2_flushed=True)


def _block_factor(config: dict[str, int]) -> float:
    return {128: 1.08, 256: 1.0, 512: 1.04}.get(config.get("BLOCK", 256), 1.0)


class ScriptedEvaluator:
    """Implements :class:`~kerngen.harness.evaluator.Evaluator` without a GPU, deterministically.

    ``calls``: evaluate() calls; ``evaluated``: candidates; ``delay_s``: sleep per candidate
    (kill tests); ``gpu_name``: the name it reports (to tell two "GPUs" apart in replays)."""

    demo = True  # made-up times: a run with it is a demo (journaled in run_started)

    def __init__(self, delay_s: float = 0.0, gpu_name: str = SCRIPTED_GPU, scale: float = 1.0,
                 degenerate: bool = False) -> None:
        self.delay_s = delay_s
        self.concurrency = 1  # one candidate at a time (Evaluator.concurrency)
        self.gpu_name = gpu_name
        self.scale = scale
        self.degenerate = degenerate
        self.calls = 0
        self.evaluated = 0
        self.batches: list[int] = []
        self.seen: list[str] = []  # content hashes, in order

    def gpu_facts(self) -> GpuFacts:
        return GpuFacts(name=self.gpu_name, sm_count=132, copy_gbps=4280.0, fp32_tflops=51.0, bf16_tflops=800.0)

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        return Baseline(problem=problem.label(), gpu=self.gpu_name, eager=_timing(1.0 * self.scale),
                        compiled=_timing(0.8 * self.scale), eager_defaults=_timing(0.9 * self.scale),
                        compiled_defaults=_timing(0.7 * self.scale), defaults_label=DEFAULTS_LABEL,
                        floor_ms=0.4 * self.scale, floor_bound="memory",
                        degenerate=self.degenerate,
                        degenerate_reason="scripted: marked degenerate" if self.degenerate else "")

    def evaluate(self, problem: ProblemRef, candidates: Sequence[Candidate], options: EvalOptions | None = None,
                 on_result: OnResult | None = None) -> list[EvalResult]:
        self.calls += 1
        self.batches.append(len(candidates))
        out = []
        deadline = options.deadline if options is not None else None
        for i, cand in enumerate(candidates):
            if deadline is not None and time.monotonic() >= deadline:  # as the pool: nothing new past it
                res = EvalResult(verdict=Verdict.cancelled, message="not evaluated: the time budget ran out",
                                 spec_hash=cand.spec.content_hash(), config=dict(cand.config))
                if on_result:
                    on_result(i, res)
                out.append(res)
                continue
            if self.delay_s:
                time.sleep(self.delay_s)
            res = self.evaluate_one(cand)
            self.evaluated += 1
            self.seen.append(cand.spec.content_hash())
            if on_result:
                on_result(i, res)
            out.append(res)
        return out

    def evaluate_one(self, cand: Candidate) -> EvalResult:
        spec = cand.spec
        config = spec.full_config(cand.config)
        ms, bug, _level = read_marker(spec)
        regs = 24 + _h("regs", spec.content_hash()) % 48
        comp = CompileInfo(key=spec.content_hash(), arch="sm_90", nvrtc_version="scripted", options=[],
                           seconds=0.0, cached=False, kernels={"kernel": KernelResources(registers=regs)})
        common = dict(spec_hash=spec.content_hash(), config=config, gpu=self.gpu_name, worker=0, wall_s=0.25)
        if bug == "compile":
            return EvalResult(verdict=Verdict.compile_error, message="NVRTC: identifier \"BLOCKS\" is undefined",
                              log="kernel.cu(3): error: identifier \"BLOCKS\" is undefined", **common)
        if bug == "runtime":
            return EvalResult(verdict=Verdict.runtime_error, message="CUDA_ERROR_ILLEGAL_ADDRESS during launch",
                              log="an illegal memory access was encountered", compile=comp, **common)
        if bug == "incorrect":
            ev = CheckEvidence(seeds=[0, 1, 2], atol=1e-4, rtol=1e-4, max_abs_err=0.31, max_err_index=[17, 4],
                               max_err_output="out", got=0.12, expected=0.43, rel_err=0.2, mismatches=4096,
                               failed=CheckFailure.mismatch, message="4096 elements differ; worst at out[17, 4]")
            return EvalResult(verdict=Verdict.incorrect, message=ev.message, compile=comp, check=ev, **common)
        t = ms * _block_factor(config) * self.scale
        return EvalResult(verdict=Verdict.ok, message=f"ok {t:.4f} ms", compile=comp,
                          check=CheckEvidence(seeds=[0, 1, 2], atol=1e-4, rtol=1e-4), timing=_timing(t), **common)

    def close(self) -> None:
        return None


ScriptedTuneOutcome = TuneOutcome  # the one tuning outcome type (kerngen.harness.tune.outcome)


class ScriptedTuner:
    """Exhaustive over the spec's configs through the given evaluator; the best correct one."""

    def __init__(self, evaluator: Any) -> None:
        self.evaluator = evaluator
        self.calls = 0

    def __call__(self, problem: ProblemRef, spec: KernelSpec, result: EvalResult, *,
                 minutes: float | None) -> ScriptedTuneOutcome | None:
        """A :class:`~kerngen.agent.search_settings.Tuner`; ``minutes`` is not needed (it is quick)."""
        self.calls += 1
        configs = spec.configs()
        if len(configs) <= 1:
            return None
        results = self.evaluator.evaluate(problem, [Candidate(spec=spec, config=c) for c in configs])
        curve, best = [], None
        for i, (c, r) in enumerate(zip(configs, results)):
            if r.ok and (best is None or r.ms < best[1].ms):
                best = (c, r)
            curve.append(TunePoint(evals=i + 1, config=c, ms=r.ms if r.ok else None, verdict=r.verdict.value,
                                   wall_s=r.wall_s, best_ms=best[1].ms if best else None))
        if best is None:
            return None
        return TuneOutcome(config=best[0], result=best[1], evaluated=len(configs), curve=curve)
