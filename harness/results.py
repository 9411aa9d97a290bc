"""What an evaluation produces: a closed set of verdicts, each with its evidence.

Everything here crosses a process boundary (worker -> caller) or lands in a journal, so it is a
pydantic model. Times are milliseconds everywhere.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kerngen.problems.torch_modes import Precision

TF32_MARGIN = 4.0  # a tf32 check's tolerance: this many times PyTorch's own TF32 error (harness/gpu/precision.py)


class _Record(BaseModel):
    # errors and times may be inf or NaN (a failed kernel scores inf): keep them through JSON
    model_config = ConfigDict(ser_json_inf_nan="constants")


class Verdict(str, Enum):
    invalid_spec = "invalid_spec"  # the launch plan does not resolve (bad grid, define, argument ...): no compile ran;
    # or (after the compile) the launcher refuses a tensor it binds (a tensormap argument the tensor has no map for)
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    incorrect = "incorrect"
    ok = "ok"
    # not the candidate's doing: the harness itself could not evaluate it (its own buffers did not
    # fit in GPU memory); the search stops on it instead of blaming the kernel
    harness_error = "harness_error"
    # compiled and statically checked, not run: ``kerngen generate --dry-run`` (no GPU)
    not_run = "not_run"
    # not started: the caller's deadline (``EvalOptions.deadline``) passed first. No verdict on the
    # kernel: a search keeps no result for it (a resume evaluates it), a tuner caches nothing
    cancelled = "cancelled"


class CheckFailure(str, Enum):
    """Which correctness check failed (the evidence of an ``incorrect`` verdict)."""

    mismatch = "mismatch"  # values differ from the reference beyond atol/rtol
    nan_mismatch = "nan_mismatch"  # NaN/Inf where the reference has none (or the reverse)
    unwritten_output = "unwritten_output"  # poison left in the output: elements never written
    guard_overwritten = "guard_overwritten"  # a write landed outside an output or scratch buffer
    input_mutated = "input_mutated"  # an input or model parameter changed
    nondeterministic = "nondeterministic"  # two runs on the same inputs disagree (race, uninit read)
    timed_output_mismatch = "timed_output_mismatch"  # output of the timed runs is wrong
    precision_loss = "precision_loss"  # within atol/rtol, but ||out-ref||/||ref|| too large for the dtype
    shape_mismatch = "shape_mismatch"  # output of another shape or dtype than the reference


class KernelResources(_Record):
    """One kernel's entry of the ptxas report."""

    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    shared_bytes: int = 0  # static shared memory
    stack_bytes: int = 0
    const_bytes: int = 0


class CompileInfo(_Record):
    key: str  # content address of the cubin in the cache
    arch: str  # e.g. "sm_90"
    nvrtc_version: str
    options: list[str]
    seconds: float  # 0 when served from cache
    cached: bool
    log: str = ""
    kernels: dict[str, KernelResources] = Field(default_factory=dict)

    def worst(self) -> KernelResources:
        """The heaviest figures over all kernels (what a prompt or a table shows)."""
        ks = list(self.kernels.values()) or [KernelResources()]
        return KernelResources(**{f: max(getattr(k, f) for k in ks) for f in KernelResources.model_fields})


class Timing(_Record):
    """A distribution of per-call times measured with CUDA events, L2 flushed before each rep."""

    median_ms: float
    q25_ms: float
    q75_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    reps: int
    warmup: int
    samples_ms: list[float] = Field(default_factory=list)
    l2_flushed: bool = True
    clocks: "ClockReading | None" = None
    late_reps: int = 0  # reps whose start the GPU reached before the call was enqueued (host time inside)
    lead_cycles: int = 0  # GPU spin queued before each rep so the host stayed ahead (0: none needed)

    @property
    def iqr_ms(self) -> float:
        return self.q75_ms - self.q25_ms

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


class ClockReading(_Record):
    """NVML readings before and after a measurement; ``sagged`` flags a drop of the SM clock
    (or an active thermal/power slowdown) while it ran. Nothing is ever set, only read."""

    sm_mhz_before: int | None = None
    sm_mhz_after: int | None = None
    sm_mhz_max: int | None = None
    mem_mhz: int | None = None
    temp_c_before: int | None = None
    temp_c_after: int | None = None
    power_w: float | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    sagged: bool = False
    available: bool = True


class CheckEvidence(_Record):
    """Why a candidate is (in)correct. ``failed`` names the first check that failed."""

    seeds: list[int] = Field(default_factory=list)
    atol: float = 0.0
    rtol: float = 0.0
    max_abs_err: float = 0.0
    max_err_index: list[int] = Field(default_factory=list)
    max_err_output: str = ""
    got: float | None = None
    expected: float | None = None
    rel_err: float = 0.0  # ||out - ref|| / ||ref||, worst over seeds and outputs
    max_rel_err: float = 0.0  # the limit on rel_err for the output dtype (0: none)
    mismatches: int = 0
    deterministic: bool = True
    failed: CheckFailure | None = None
    message: str = ""
    pattern: str = ""  # where the wrong elements are and how wrong (rows, columns, scale): for the repair prompt


class MemoryPlan(_Record):
    """What one evaluation holds in GPU memory at once (:mod:`kerngen.harness.gpu.memory_plan`):
    decided from the problem's bytes and the memory free on the GPU, said in the evidence."""

    free_bytes: int  # free for the harness when the evaluation started (driver-free + torch's cache)
    input_bytes: int  # one input set
    output_bytes: int  # one set of outputs
    scratch_bytes: int = 0
    flush_bytes: int = 0  # the L2 flush buffer (allocated before, so already out of free_bytes)
    pristine_on_gpu: bool = True  # False: the pristine inputs are made again from their seed when needed
    refs_on_gpu: bool = True  # False: references and the first run's outputs wait in host memory
    check_peak_bytes: int = 0  # the most the check of one input set holds
    timed_sets: int = 1  # input sets the timed runs rotate over
    set_bytes: int = 0  # what one set kept for the timed runs holds
    reference_bytes: int = 0  # what PyTorch's reference allocates on one input set
    make_bytes: int = 0  # what get_inputs allocates at most while it makes one input set
    reference_measured: bool = False  # reference_bytes/make_bytes measured on this GPU (else estimated)
    measured_peak_bytes: int | None = None  # the most the evaluation allocated, measured (None: not measured)

    @property
    def peak_bytes(self) -> int:
        """The most the plan expects the evaluation to hold: one set checked while the others kept
        for the timed runs wait (the timed runs themselves hold less)."""
        return self.check_peak_bytes + (self.timed_sets - 1) * self.set_bytes

    def summary(self) -> str:
        gb = 1e9
        where = ("on the GPU" if self.refs_on_gpu else "in host memory")
        measured = "" if self.measured_peak_bytes is None else f", {self.measured_peak_bytes / gb:.1f} GB measured"
        return (f"memory: {self.timed_sets} timed input set(s); references {where}; pristine inputs "
                f"{'kept' if self.pristine_on_gpu else 'regenerated from their seeds'}; peak "
                f"{self.peak_bytes / gb:.1f} GB planned{measured} of {self.free_bytes / gb:.1f} GB free")


class EvalResult(_Record):
    """The outcome of evaluating one (spec, config) on one problem."""

    verdict: Verdict
    message: str = ""  # one line a human (or the LLM) reads first
    spec_hash: str = ""
    config: dict[str, int] = Field(default_factory=dict)
    compile: CompileInfo | None = None
    check: CheckEvidence | None = None
    timing: Timing | None = None
    log: str = ""  # compile log, or the error text of a runtime failure
    gpu: str = ""
    worker: int | None = None
    wall_s: float = 0.0  # seconds in the worker (load, check, bench, verify)
    phases_s: dict[str, float] = Field(default_factory=dict)  # seconds per phase, for overhead figures
    memory: MemoryPlan | None = None  # what the evaluation held in GPU memory (None: older records)

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.ok

    @property
    def ms(self) -> float:
        """Median ms, or ``inf`` for anything that is not a correct, timed kernel."""
        return self.timing.median_ms if (self.ok and self.timing) else float("inf")


class Tolerance(_Record):
    """What a check compares with: allclose's atol and rtol, and per output dtype the limit on
    ``||out - ref|| / ||ref||`` where it differs from :data:`kerngen.harness.gpu.compare.REL_ERR_LIMITS`
    (kerngen.harness.gpu.precision chooses it)."""

    precision: Precision = Precision.fp32
    atol: float
    rtol: float
    rel_limits: dict[str, float] = Field(default_factory=dict)
    measured_abs: float | None = None  # tf32: max |PyTorch TF32 - fp64| over the fp32 outputs
    measured_rel: float | None = None  # tf32: ||PyTorch TF32 - fp64|| / ||fp64||, the worst output
    against: str = ""  # tf32: "fp64" or "true fp32 (...)" when the model does not run in fp64

    def rel_limit(self, dtype: Any) -> float | None:
        """The limit for an output of ``dtype`` when it is not the dtype's default, else None."""
        return self.rel_limits.get(str(dtype).removeprefix("torch."))

    def note(self) -> str:
        """One line: how the tolerance was chosen (shown with a tf32 check)."""
        if self.precision is Precision.fp32:
            return f"true fp32: atol {self.atol:g}, rtol {self.rtol:g}"
        limit = self.rel_limits.get("float32")
        return (f"TF32: PyTorch's TF32 output is off by {self.measured_abs:.3g} at most ({self.measured_rel:.3g} "
                f"relative) against {self.against}; tolerance {TF32_MARGIN:g}x that: atol {self.atol:.3g}, "
                f"||out-ref||/||ref|| <= {limit:.3g}")


class Baseline(_Record):
    """PyTorch's own times for a problem on one GPU, and the roofline floor. ``eager`` and
    ``compiled`` run in true fp32 (TF32 off everywhere: "vs PyTorch (true fp32)"); the
    ``*_defaults`` ones at PyTorch's default settings (cuDNN convolutions in TF32, matmuls as a fresh
    process has them; TF32 matmuls too for a problem checked at --precision tf32), labelled
    ``defaults_label``. ``defaults_same``: the outputs at the defaults were bitwise those of true
    fp32 (no op of the problem uses TF32), so the same timings stand for both."""

    problem: str
    gpu: str
    eager: Timing
    compiled: Timing | None = None
    compile_error: str = ""
    eager_defaults: Timing | None = None
    compiled_defaults: Timing | None = None
    defaults_label: str = ""
    defaults_same: bool = False
    floor_ms: float | None = None
    floor_bound: str = ""  # "memory" | "compute"
    # what the floor is made of (the data sheet's rate or bandwidth, named: FFMA, 3xTF32, tensor cores;
    # kerngen.harness.gpu.roofline), and the floor the measured ceilings give, beside it; "" / None in older runs
    floor_basis: str = ""
    floor_measured_ms: float | None = None
    flops: float | None = None
    min_bytes: int | None = None
    degenerate: bool = False
    degenerate_reason: str = ""
    launch_bound: bool = False
    # the tolerance the check applies (at --precision tf32: measured on this GPU before the baseline,
    # harness/gpu/precision.py); None in older runs and where nothing was measured (a dry run)
    tolerance: Tolerance | None = None


Timing.model_rebuild()


OP_GAP_WARN_PCT = 3.0  # the exported op slower than its kernel by more than this: a warning with the number


class OpTiming(_Record):
    """The exported op's path timed beside its kernel, side by side in one worker on the same inputs
    (:mod:`kerngen.harness.gpu.op_bench`): ``kernel`` is the harness launching the plan on buffers it
    holds, ``op`` is ``torch.ops`` calling the op as a user does (outputs allocated per call, the
    launch path of :mod:`kerngen.harness.gpu.op_runtime`)."""

    kernel: Timing
    op: Timing
    gap_pct: float  # (op - kernel) / kernel, in % of the kernel's median
    host_us: float  # host time of one op call (no synchronisation), microseconds
    matches: bool  # the op's output equals the kernel's on the same inputs (within the check's tolerance)
    # 1: one series, the paths interleaved rep by rep (since 2026-11-28); 2: records timed as two counterbalanced
    # rounds (kernel, op, op, kernel), each figure its faster round's
    rounds: int = 2

    @property
    def slow(self) -> bool:
        return self.gap_pct > OP_GAP_WARN_PCT

    def warning(self) -> str:
        """"" or one line: the op's gap over the kernel (or an output that differs)."""
        if not self.matches:
            return "the exported op's output differs from its kernel's on the same inputs"
        if not self.slow:
            return ""
        return (f"the exported op is {self.gap_pct:.1f}% slower than its kernel ({self.op.median_ms:.4f} ms against "
                f"{self.kernel.median_ms:.4f}; host {self.host_us:.0f} us a call)")


class GpuFacts(_Record):
    """What the worker reports of its device at start, plus the measured ceilings."""

    name: str
    index: int = 0
    arch: str = "sm_90"  # NVRTC target, from the compute capability
    sm_count: int = 0
    max_threads_per_block: int = 1024
    max_shared_per_block: int = 48 * 1024  # without opt-in
    max_shared_per_block_optin: int = 227 * 1024
    shared_per_sm: int = 228 * 1024
    regs_per_block: int = 65536
    regs_per_sm: int = 65536
    l2_bytes: int = 50 * 1024 * 1024
    mem_bytes: int = 0
    driver: str = ""
    copy_gbps: float | None = None  # measured device copy bandwidth (read + write bytes)
    fp32_tflops: float | None = None  # measured fp32 (no TF32) matmul rate
    bf16_tflops: float | None = None  # measured bf16 matmul rate
    datasheet: bool = False  # the three rates above are a data sheet's peaks (a preset GPU), not measured


# ----- profiler feedback (Nsight Compute) ----------------------------------------------------
class StallShare(_Record):
    """One warp-stall reason of a profiled kernel: warp cycles per issued instruction stalled on
    it, and its share of all stall cycles (what a prompt reads)."""

    reason: str  # e.g. "long_scoreboard" (global memory), "barrier", "mio_throttle"
    cycles: float  # warp cycles stalled on it per issued instruction
    pct: float  # % of the stall cycles of all reasons measured


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


class KernelProfile(_Record):
    """What Nsight Compute measured of one kernel launch of a plan (:mod:`kerngen.harness.gpu.profile`).
    A metric the profiler did not report (another architecture, an older ncu) is None, never 0."""

    name: str
    launch: int = 0  # index among the profiled launches of one call of the plan
    duration_ms: float | None = None
    dram_pct: float | None = None  # achieved DRAM throughput, % of peak
    l2_pct: float | None = None  # L2 (lts) throughput, % of peak
    sm_pct: float | None = None  # SM throughput, % of peak
    tensor_pct: float | None = None  # tensor pipe (HMMA, or GMMA on sm_90) active, % of peak
    occupancy_pct: float | None = None  # achieved occupancy: active warps, % of the SM's maximum
    theoretical_occupancy_pct: float | None = None
    stalls: list[StallShare] = Field(default_factory=list)  # the largest first
    local_bytes: int | None = None  # local-memory traffic (loads + stores): register spills, local arrays

    def line(self) -> str:
        """One line of the metrics that decide the next idea (prompt, show, report)."""
        parts = [f"DRAM {_pct(self.dram_pct)} of peak, L2 {_pct(self.l2_pct)}, SM {_pct(self.sm_pct)}, "
                 f"tensor pipe {_pct(self.tensor_pct)}"]
        occ = f"occupancy {_pct(self.occupancy_pct)}"
        if self.theoretical_occupancy_pct is not None:
            occ += f" (theoretical {_pct(self.theoretical_occupancy_pct)})"
        parts.append(occ)
        if self.stalls:
            parts.append("top stalls (% of stall cycles): "
                         + ", ".join(f"{s.reason} {s.pct:.0f}%" for s in self.stalls))
        if self.local_bytes is not None:
            parts.append(f"local-memory traffic {self.local_bytes:,} B (register spills or local arrays)"
                         if self.local_bytes else "no local-memory spills")
        return "; ".join(parts)


class ProfileOutcome(_Record):
    """The outcome of profiling one (spec, config): kernels, or why none (``error``: one line).
    ``available`` False: this host cannot profile at all (no ncu, no access to the GPU's
    counters); nothing was run and the search stops asking."""

    profiles: list[KernelProfile] = Field(default_factory=list)
    error: str = ""
    available: bool = True
    seconds: float = 0.0  # wall seconds the GPU was held for it (counted as GPU time)
