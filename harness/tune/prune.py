"""Prune configurations before any GPU time is spent, each with its reason.

Two stages:

1. :func:`static_prune` (pure CPU, no compiler): the spec's constraints over tunables and sizes,
   :func:`kerngen.harness.spec.plan.resolve` failures (bad grid, block, scratch ...), threads per
   block over ``GpuFacts.max_threads_per_block``, dynamic shared memory alone over
   ``GpuFacts.max_shared_per_block_optin``, a cooperative grid that cannot be resident at once on
   ``GpuFacts.sm_count`` SMs even by threads and shared memory alone (registers are known only after
   compiling: the launcher asks the driver's occupancy before every cooperative launch).
2. :func:`resource_reason` (after NVRTC compiled the config, from its ptxas report): static +
   dynamic shared memory over the opt-in limit; registers that cannot fit one block:
   registers per thread x threads per block > ``GpuFacts.regs_per_block`` (with the hardware's
   allocation granularity: per warp, rounded up to 256 registers).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Callable, Iterable, Mapping, Sequence

from pydantic import BaseModel

from kerngen import expr
from kerngen.errors import KerngenError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import ResolvedLaunch, ResolvedPlan, constraints_hold, build_env, resolve
from kerngen.harness.results import CompileInfo, GpuFacts
from kerngen.harness.spec.spec import KernelSpec

# reason kinds, in the order checks run
KINDS = ("constraint", "plan", "threads", "shared_mem", "registers")

REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256 (sm_50 .. sm_90)
WARP = 32
# what one SM holds at most, sm_80 .. sm_90 (CUDA C Programming Guide, "Technical Specifications"): an upper bound
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32


class PrunedConfig(BaseModel):
    config: dict[str, int]
    kind: str  # one of KINDS
    reason: str


def _threads(launch: ResolvedLaunch) -> int:
    return launch.block[0] * launch.block[1] * launch.block[2]


class Memo:
    """What static pruning works out for a spec at one problem's sizes, memoized over the many
    configurations of its space (evaluating them one by one was most of the time of ``kerngen
    playbook DIR``): each constraint's verdict by the values of the tunables it reads (one or two:
    a space of thousands has a few dozen verdicts), and the resolved plan by the values of the
    tunables the plan's expressions read (one that only the source reads, ``UNROLL``, changes no
    grid, block or shared memory). Verdicts, reasons and plans are those of the unmemoized path."""

    def __init__(self, spec: KernelSpec, sizes: Mapping[str, int | float], tensors: Mapping[str, TensorFacts]) -> None:
        self.base = build_env(sizes, tensors, {})
        tunables = set(spec.tunables)

        def reads(text: object) -> set[str]:
            try:
                return expr.names_in(text) & tunables if isinstance(text, str) else set()
            except KerngenError:  # does not parse: judged per configuration, as before
                return tunables

        self.constraints = [(text, tuple(sorted(reads(text)))) for text in spec.constraints]
        plan_texts = [text for where, text in spec.expressions() if not where.startswith("constraints.")]
        self.plan_reads = tuple(sorted(set().union(*(reads(t) for t in plan_texts)) if plan_texts else set()))
        self.verdicts: dict[tuple, tuple[str, str]] = {}
        self.plans: dict[tuple, tuple[ResolvedPlan | None, str, str]] = {}

    def check(self, cfg: Mapping[str, int]) -> tuple[str, str]:
        """("", "") when every constraint holds for the full configuration ``cfg``, else (kind, reason)."""
        env: dict[str, object] | None = None
        for i, (text, used) in enumerate(self.constraints):
            key = (i, *(cfg[n] for n in used))
            verdict = self.verdicts.get(key)
            if verdict is None:
                env = env if env is not None else {**self.base, **cfg}  # tunables win, as in build_env
                try:
                    held = expr.evaluate_bool(text, env)
                    verdict = ("", "") if held else ("constraint", f"constraint violated: {text}")
                except KerngenError as exc:
                    verdict = ("constraint", f"constraint cannot be evaluated: {exc}")
                self.verdicts[key] = verdict
            if verdict[0]:
                return verdict
        return "", ""

    def plan(self, cfg: dict[str, int], work_out: Callable[[], tuple[ResolvedPlan | None, str, str]]
             ) -> tuple[ResolvedPlan | None, str, str]:
        """``work_out()`` for the first configuration of its kind; the others get its verdict and a
        copy of its plan with their own configuration."""
        key = tuple(cfg[n] for n in self.plan_reads)
        if key not in self.plans:
            self.plans[key] = work_out()
        plan, kind, reason = self.plans[key]
        return (plan.model_copy(update={"config": cfg}) if plan is not None else None), kind, reason


def static_reason(
    spec: KernelSpec,
    config: Mapping[str, int],
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    gpu: GpuFacts,
    memo: Memo | None = None,
) -> tuple[ResolvedPlan | None, str, str]:
    """(plan, "", "") when the config survives, else (None, kind, reason). Never raises for
    anything the spec (a model's answer) holds: that is a reason. ``memo``: the spec's, over many
    configurations (:func:`static_prune`)."""
    try:
        cfg = spec.full_config(dict(config))
    except KerngenError as exc:
        return None, "plan", f"configuration does not fit the spec: {exc}"
    if memo is not None:
        kind, why = memo.check(cfg)
        if kind:
            return None, kind, why
        return memo.plan(cfg, lambda: _plan_reason(spec, cfg, sizes, tensors, gpu))
    try:
        ok, why = constraints_hold(spec, build_env(sizes, tensors, cfg))
    except KerngenError as exc:
        return None, "constraint", f"constraint cannot be evaluated: {exc}"
    if not ok:
        return None, "constraint", why
    return _plan_reason(spec, cfg, sizes, tensors, gpu)


def _plan_reason(spec: KernelSpec, cfg: dict[str, int], sizes: Mapping[str, int | float],
                 tensors: Mapping[str, TensorFacts], gpu: GpuFacts) -> tuple[ResolvedPlan | None, str, str]:
    """The plan of a configuration whose constraints hold, or why it does not resolve or fit the GPU."""
    try:
        plan = resolve(spec, sizes=sizes, tensors=tensors, config=cfg, check_constraints=False)
    except KerngenError as exc:
        return None, "plan", f"launch plan does not resolve: {exc}"
    except (ArithmeticError, ValueError, TypeError) as exc:
        return None, "plan", f"launch plan does not resolve: {type(exc).__name__}: {exc}"
    for launch in plan.launches:
        threads = _threads(launch)
        if threads > gpu.max_threads_per_block:
            return None, "threads", (
                f"{launch.kernel}: {threads} threads per block > {gpu.max_threads_per_block}"
            )
        if launch.shared_mem > gpu.max_shared_per_block_optin:
            return None, "shared_mem", (
                f"{launch.kernel}: {launch.shared_mem} B dynamic shared memory > "
                f"{gpu.max_shared_per_block_optin} B per block"
            )
        if launch.cooperative and gpu.sm_count > 0:
            per_sm = min(MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // max(threads, 1),
                         gpu.shared_per_sm // launch.shared_mem if launch.shared_mem else MAX_BLOCKS_PER_SM)
            blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
            if blocks > per_sm * gpu.sm_count:
                return None, "plan", (
                    f"{launch.kernel}: a cooperative grid of {blocks} blocks, but at most {per_sm * gpu.sm_count} "
                    f"can be resident at once ({gpu.sm_count} SMs x {per_sm} of {threads} threads and "
                    f"{launch.shared_mem} B of shared memory)"
                )
    return plan, "", ""


def static_prune(
    spec: KernelSpec,
    configs: Iterable[Mapping[str, int]],
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    gpu: GpuFacts,
    deadline: float | None = None,
    until: Callable[[dict[str, int]], bool] | None = None,
) -> tuple[list[tuple[dict[str, int], ResolvedPlan]], list[PrunedConfig]]:
    """Split configs into survivors (with their resolved plans) and pruned ones; with a
    ``deadline`` (``time.monotonic()``), the configs not examined by then are in neither list;
    with ``until``, none after the first survivor for which ``until(config)`` holds."""
    survivors: list[tuple[dict[str, int], ResolvedPlan]] = []
    pruned: list[PrunedConfig] = []
    memo = Memo(spec, sizes, tensors)
    for n, config in enumerate(configs):
        if deadline is not None and n % 64 == 0 and time.monotonic() >= deadline:
            break
        cfg = dict(config)
        plan, kind, reason = static_reason(spec, cfg, sizes=sizes, tensors=tensors, gpu=gpu, memo=memo)
        if plan is None:
            pruned.append(PrunedConfig(config=cfg, kind=kind, reason=reason))
            continue
        survivors.append((cfg, plan))
        if until is not None and until(cfg):
            break
    return survivors, pruned


def regs_per_block(registers: int, threads: int) -> int:
    """Registers one block claims: per warp, rounded up to the allocation unit."""
    warps = -(-threads // WARP)
    per_warp = -(-(registers * WARP) // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    return warps * per_warp


def resource_reason(plan: ResolvedPlan, info: CompileInfo, gpu: GpuFacts) -> tuple[str, str]:
    """("", "") when every launch fits the GPU with its compiled resources, else (kind, reason).
    Kernels missing from the report are not judged."""
    for launch in plan.launches:
        res = info.kernels.get(launch.kernel)
        if res is None:
            continue
        shared = res.shared_bytes + launch.shared_mem
        if shared > gpu.max_shared_per_block_optin:
            return "shared_mem", (
                f"{launch.kernel}: {res.shared_bytes} B static + {launch.shared_mem} B dynamic "
                f"shared memory > {gpu.max_shared_per_block_optin} B per block"
            )
        threads = _threads(launch)
        need = regs_per_block(res.registers, threads)
        if need > gpu.regs_per_block:
            return "registers", (
                f"{launch.kernel}: {res.registers} registers x {threads} threads = {need} "
                f"(allocated) > {gpu.regs_per_block} registers per block"
            )
    return "", ""


def summarize(pruned: Iterable[PrunedConfig]) -> dict[str, int]:
    """Count per reason kind, in the order of :data:`KINDS`."""
    counts = Counter(p.kind for p in pruned)
    return {k: counts[k] for k in KINDS if counts[k]} | {k: v for k, v in counts.items() if k not in KINDS}


def examples(pruned: Iterable[PrunedConfig]) -> dict[str, str]:
    """The first reason seen of each kind (what a table shows next to the count)."""
    out: dict[str, str] = {}
    for p in pruned:
        out.setdefault(p.kind, p.reason)
    return out


def enumerate_configs(spec: KernelSpec, *, seed: int = 0, limit: int) -> list[dict[str, int]]:
    """Every configuration, or a seeded sample of ``limit`` distinct ones (default config
    included) when the space is larger."""
    if spec.space_size() <= limit:
        return spec.configs()
    rng = random.Random(seed)
    names = list(spec.tunables)
    seen = {tuple(spec.default_config()[n] for n in names)}
    while len(seen) < limit:
        seen.add(tuple(rng.choice(spec.tunables[n]) for n in names))
    return [dict(zip(names, combo)) for combo in seen]


# (spec, [(config, plan)], gpu) -> per item: CompileInfo, or an exception (compile error)
ResourceProbe = Callable[[KernelSpec, Sequence[tuple[dict[str, int], ResolvedPlan]], GpuFacts], list]


def compile_probe(spec: KernelSpec, items: Sequence[tuple[dict[str, int], ResolvedPlan]], gpu: GpuFacts) -> list:
    """Compile the configs with NVRTC (in parallel, cached on disk by the compile layer) and
    return each one's CompileInfo or its CompileError."""
    from kerngen.harness.compile import compiler as nvrtc_compile  # lazy: keeps the tuner importable without NVRTC

    from kerngen.errors import CompileError
    from kerngen.harness.spec.kparams import check_launch_args

    jobs = [nvrtc_compile.job_for(spec, plan, gpu.arch) for _, plan in items]
    out = []
    for (_, plan), res in zip(items, nvrtc_compile.compile_many(jobs)):
        if not isinstance(res, BaseException):
            try:  # a launch whose arguments do not match its kernel's parameters fails like a compile
                check_launch_args(res.cubin, plan, res.info.log)
            except CompileError as exc:
                res = exc
        out.append(res if isinstance(res, BaseException) else getattr(res, "info", res))
    return out
