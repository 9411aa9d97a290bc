"""Deterministic stand-ins for the autotuner's tests: a fake Evaluator (a smooth synthetic cost
with noise and a share of failing configs), fake GPU facts, a fake compile probe with resource
reports. Also run as a script by the kill -9 test (a slow tune writing a cache)."""

from __future__ import annotations

import hashlib
import itertools
import math
import sys
import threading
import time

from kerngen.errors import CompileError
from kerngen.harness.evaluator import Candidate
from kerngen.expr import TensorFacts
from kerngen.harness.results import (
    Baseline, CheckEvidence, CheckFailure, CompileInfo, EvalResult, GpuFacts, KernelResources, Timing, Verdict,
)
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

N = 1 << 20
SIZES = {"N": N}
TENSORS = {"x": TensorFacts((N,)), "out": TensorFacts((N,))}
PROBLEM = ProblemRef(source="softmax", shape=(1024, 1024))
GPU = GpuFacts(name="Fake H200", arch="sm_90", sm_count=132, driver="580.00")

# 6 * 5 * 4 * 3 * 4 = 1440 configurations
BIG_TUNABLES = {
    "BLOCK": [32, 64, 128, 256, 512, 1024],
    "TILE": [1, 2, 4, 8, 16],
    "UNROLL": [1, 2, 4, 8],
    "VEC": [1, 2, 4],
    "STAGES": [1, 2, 3, 4],
}
SMALL_TUNABLES = {"BLOCK": [64, 128, 256, 512], "TILE": [1, 2, 4], "VEC": [1, 2, 4, 8]}  # 48


def make_spec(tunables=None, *, constraints=(), shared="0", grid="cdiv(N, BLOCK * TILE)", source_extra=""):
    tunables = tunables or SMALL_TUNABLES
    return KernelSpec(
        name="fake",
        source='extern "C" __global__ void k(const float* x, float* out, int n) {}' + source_extra,
        tunables=tunables,
        constraints=list(constraints),
        steps=[{
            "kernel": "k", "grid": [grid], "block": ["BLOCK"], "shared_mem": shared,
            "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "N"}],
        }],
    )


def _h(config: dict, salt: str) -> float:
    digest = hashlib.sha256((salt + repr(sorted(config.items()))).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def synthetic_ms(config: dict, *, noise: float = 0.02, multimodal: bool = True) -> float:
    """Smooth in log2 of each tunable, an interaction term, a ripple (several local optima),
    multiplicative noise."""
    lg = {k: math.log2(v) for k, v in config.items() if k != "STAGES"}
    st = config.get("STAGES", 2)
    base = (1.0 + 0.08 * (lg.get("BLOCK", 7) - 7.3) ** 2 + 0.05 * (lg.get("TILE", 2) - 2.4) ** 2
            + 0.03 * (lg.get("UNROLL", 1.5) - 1.5) ** 2 + 0.12 * (lg.get("VEC", 2) - 2) ** 2
            + 0.04 * (st - 2.6) ** 2 + 0.03 * (lg.get("BLOCK", 7) - 7) * (lg.get("TILE", 2) - 2))
    if multimodal:
        base += 0.25 * math.sin(1.7 * lg.get("BLOCK", 7) + lg.get("TILE", 2)) * math.cos(
            lg.get("UNROLL", 1) + 0.5 * st) ** 2
    return base * (1.0 + noise * (_h(config, "noise") - 0.5))


FAIL_VERDICTS = (Verdict.incorrect, Verdict.runtime_error, Verdict.timeout, Verdict.compile_error)


def synthetic_verdict(config: dict, fail_share: float) -> Verdict:
    u = _h(config, "fail")
    if u < fail_share:
        return FAIL_VERDICTS[int(u / fail_share * len(FAIL_VERDICTS)) % len(FAIL_VERDICTS)]
    return Verdict.ok


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, q25_ms=ms * 0.99, q75_ms=ms * 1.01, min_ms=ms * 0.98, max_ms=ms * 1.05,
                  mean_ms=ms, reps=50, warmup=3)


def grid_optimum(tunables: dict, fail_share: float) -> float:
    names = list(tunables)
    best = math.inf
    for combo in itertools.product(*tunables.values()):
        cfg = dict(zip(names, combo))
        if synthetic_verdict(cfg, fail_share) is Verdict.ok:
            best = min(best, synthetic_ms(cfg))
    return best


class FakeEvaluator:
    """The Evaluator Protocol over the synthetic cost. Records every candidate it is given."""

    def __init__(self, *, fail_share: float = 0.1, delay_s: float = 0.0, drift: float = 0.0,
                 raise_on_batch: int | None = None, n_gpus: int = 1) -> None:
        self.fail_share, self.delay_s, self.drift = fail_share, delay_s, drift
        self.raise_on_batch = raise_on_batch
        self.calls: list[dict] = []  # configs, in order
        self.batches: list[int] = []
        self.concurrency = n_gpus
        self._lock = threading.Lock()

    def gpu_facts(self) -> GpuFacts:
        return GPU

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        return Baseline(problem=problem.label(), gpu=GPU.name, eager=timing(2.0), floor_ms=0.5, floor_bound="memory")

    def evaluate(self, problem, candidates, options=None, on_result=None):
        self.batches.append(len(candidates))
        if self.raise_on_batch is not None and len(self.batches) == self.raise_on_batch:
            raise RuntimeError("worker pool exploded")
        out = []
        for i, cand in enumerate(candidates):
            assert isinstance(cand, Candidate)
            cfg = dict(cand.config)
            with self._lock:
                self.calls.append(cfg)
            if self.delay_s:
                time.sleep(self.delay_s)
            verdict = synthetic_verdict(cfg, self.fail_share)
            if verdict is Verdict.ok:
                ms = synthetic_ms(cfg) * (1.0 + self.drift)
                res = EvalResult(verdict=verdict, config=cfg, spec_hash=cand.spec.content_hash(), timing=timing(ms),
                                 check=CheckEvidence(seeds=[0, 1, 2], atol=1e-4, rtol=1e-4))
            else:
                check = CheckEvidence(failed=CheckFailure.mismatch, max_abs_err=math.inf) \
                    if verdict is Verdict.incorrect else None
                res = EvalResult(verdict=verdict, config=cfg, message=f"synthetic {verdict.value}", check=check)
            out.append(res)
            if on_result is not None:
                on_result(i, res)
        return out

    def close(self) -> None:
        pass


def fake_info(registers: int = 32, shared_bytes: int = 0, kernel: str = "k") -> CompileInfo:
    return CompileInfo(key="fake", arch="sm_90", nvrtc_version="13.0", options=[], seconds=0.0, cached=True,
                       kernels={kernel: KernelResources(registers=registers, shared_bytes=shared_bytes)})


class FakeProbe:
    """Resource reports per config: ``regs(config)``, ``smem(config)``; ``bad(config)`` -> compile
    error. Counts the configs it compiled."""

    def __init__(self, regs=lambda c: 32, smem=lambda c: 0, bad=lambda c: False) -> None:
        self.regs, self.smem, self.bad = regs, smem, bad
        self.seen: list[dict] = []

    def __call__(self, spec, items, gpu):
        out = []
        for cfg, _plan in items:
            self.seen.append(cfg)
            if self.bad(cfg):
                out.append(CompileError("kernel.cu(3): error: identifier \"oops\" is undefined", "full log"))
            else:
                out.append(fake_info(self.regs(cfg), self.smem(cfg)))
        return out


def _slow_tune(cache_dir: str) -> None:
    """The child of the kill -9 test: an exhaustive tune with a slow evaluator."""
    from kerngen.harness.tune.cache import TuneCache
    from kerngen.harness.tune.tuner import tune

    ev = FakeEvaluator(fail_share=0.1, delay_s=0.05)
    print("started", flush=True)
    tune(ev, PROBLEM, make_spec(), sizes=SIZES, tensors=TENSORS, gpu=GPU, strategy="exhaustive",
         max_evals=1000, batch=4, cache=TuneCache(cache_dir), probe=None, nvrtc="13.0")
    print("finished", flush=True)


if __name__ == "__main__":
    _slow_tune(sys.argv[1])
