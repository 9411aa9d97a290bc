"""Profiler feedback: run one (spec, config) under Nsight Compute (``ncu``) and keep the few
metrics that decide the next idea (DRAM, L2, SM and tensor-pipe throughput as % of peak,
achieved and theoretical occupancy, the largest warp-stall reasons, local-memory traffic).

The runner never raises into the search: whatever happens (no ncu, no permission on the GPU's
counters, a metric this architecture does not have, a hang, garbage output) comes back as a
:class:`~kerngen.harness.results.ProfileOutcome` with a one-line ``error``.

What it runs (one subprocess, killed with its process group after ``timeout_s``)::

    ncu --csv --page raw --print-units base --metrics ... --clock-control none \\
        --target-processes all -k regex:^(k1|k2)$ --launch-skip W --launch-count C \\
        python -m kerngen.harness.gpu.profile_target request.json

``--clock-control none``: ncu would otherwise lock the GPU's clocks to base for the duration; the
harness only ever reads clocks (:mod:`.clocks`), and the other GPUs' timings must see the clocks
they always see. The target (:mod:`.profile_target`) launches the plan ``warmups + 1`` times;
``--launch-skip`` skips the warm-up launches, ``--launch-count`` bounds the launches profiled.
Nothing here imports torch: the pool process (and ``kerngen show``) read these records.
"""

from __future__ import annotations

import base64
import csv
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pydantic import BaseModel

from kerngen.problems.ref import ProblemRef

from kerngen.harness.results import KernelProfile, ProfileOutcome, StallShare
from kerngen.harness.spec.plan import ResolvedPlan

NCU_TIMEOUT_S = 120.0  # the whole ncu run: target start (torch import, problem build) and replays
OUTPUT_LIMIT = 1 << 20  # bytes of ncu's stdout and of its stderr kept (the tail: the CSV comes last)
MAX_KERNELS = 4  # launches of one call of the plan profiled at most (each is replayed per metric pass)
WARMUP_CALLS = 1  # calls of the plan before the profiled one (module load, first-touch effects)
MAX_STALLS = 3  # stall reasons kept per kernel
TARGET_MODULE = "kerngen.harness.gpu.profile_target"

# ----- the metrics (stable Nsight Compute names, valid on sm_80 and sm_90) -------------------
DURATION = "gpu__time_duration.sum"
FIELDS = {  # KernelProfile field -> metric
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
}
TENSOR_HMMA = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_GMMA = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"  # Hopper's wgmma
LOCAL = ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")
# the WarpStateStats section's reasons ("selected" is the issuing warp, not a stall: left out)
STALL_REASONS = (
    "long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
    "tex_throttle", "math_pipe_throttle", "wait", "not_selected", "no_instruction", "branch_resolving",
    "dispatch_stall", "drain", "imc_miss", "misc", "sleeping",
)


def stall_metric(reason: str) -> str:
    """Warp cycles per issued instruction that warps spent stalled on ``reason``."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def metrics_for(arch: str) -> list[str]:
    """The metrics asked of ncu on ``arch`` (e.g. ``sm_90``); GMMA exists on Hopper only. A metric
    an architecture lacks anyway is dropped by one retry (:func:`rejected_metrics`)."""
    out = [DURATION, *FIELDS.values(), TENSOR_HMMA, *LOCAL, *(stall_metric(r) for r in STALL_REASONS)]
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch.strip())
    if m and 90 <= int(m.group(1)) < 100:
        out.insert(out.index(TENSOR_HMMA) + 1, TENSOR_GMMA)
    return out


# ----- finding ncu ---------------------------------------------------------------------------
def find_ncu(environ: Mapping[str, str] | None = None) -> str | None:
    """Path of the ``ncu`` executable, or None. ``$NCU`` first (an explicit choice wins), then
    PATH, then ``/usr/local/cuda/bin/ncu``, then the newest ``/opt/nvidia/nsight-compute/*/ncu``."""
    env = os.environ if environ is None else environ
    given = env.get("NCU", "").strip()
    if given and _executable(given):
        return given
    on_path = shutil.which("ncu", path=env.get("PATH"))
    if on_path:
        return on_path
    for cand in ["/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), key=_version_key,
                                                    reverse=True)]:
        if _executable(cand):
            return cand
    return None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _version_key(path: str) -> tuple[int, ...]:
    """``/opt/nvidia/nsight-compute/2025.1.0/ncu`` -> (2025, 1, 0): the newest install first."""
    return tuple(int(x) for x in re.findall(r"\d+", Path(path).parent.name))


# ----- the request the target reads ----------------------------------------------------------
class ProfileRequest(BaseModel):
    """What :mod:`.profile_target` runs: the problem (built from its ref, as a worker builds it),
    the resolved plan and its cubin; ``status_path``: where it writes its :class:`TargetStatus`."""

    problem: ProblemRef
    plan: ResolvedPlan
    cubin_b64: str
    warmups: int = WARMUP_CALLS
    status_path: str = ""

    @staticmethod
    def encode(cubin: bytes) -> str:
        return base64.b64encode(cubin).decode()

    def cubin(self) -> bytes:
        return base64.b64decode(self.cubin_b64)


class TargetStatus(BaseModel):
    """The target's own word: it ran the plan (``ok``), or why not (a problem that does not
    build, a launch refused, out of memory ...); the runner reports it when ncu has no kernel."""

    ok: bool = False
    error: str = ""
    calls: int = 0


def ncu_command(ncu: str, metrics: list[str], kernels: list[str], *, count: int, skip: int,
                request_path: str | Path, python: str | None = None) -> list[str]:
    names = "|".join(re.escape(k) for k in kernels)
    return [
        ncu, "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics),
        "--clock-control", "none",  # never change the GPU's clocks
        "--target-processes", "all",
        "--kernel-name-base", "function",  # extern "C" names as written: what the -k regex matches
        "-k", f"regex:^({names})$",
        "--launch-skip", str(skip), "--launch-count", str(count),
        python or sys.executable, "-m", TARGET_MODULE, str(request_path),
    ]


# the environment of ncu and its target: what a Python with kerngen and CUDA needs, nothing else
# (no API key of an LLM endpoint reaches a process that runs a candidate's kernel)
_KEEP_ENV = ("PATH", "HOME", "USER", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
             "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "KERNGEN_CACHE_DIR", "XDG_CACHE_HOME", "TORCH_HOME")


def ncu_env(device: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    out = {k: env[k] for k in _KEEP_ENV if k in env}
    # one GPU, the worker's; the C locale: ncu's numbers without a locale's separators
    out.update(CUDA_VISIBLE_DEVICES=str(device), LC_ALL="C", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return out


# ----- parsing ncu's CSV ---------------------------------------------------------------------
_MS_PER = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
           "second": 1e3, "s": 1e3}
_BYTES_PER = {"byte": 1.0, "b": 1.0, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
              "tbyte": 1e12, "tb": 1e12, "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3}
_MISSING = {"", "n/a", "na", "-", "nan", "(!)"}


def number(text: str) -> float | None:
    """A metric value as ncu prints it ("1,234.5", "n/a", "") as a finite float, else None."""
    t = text.strip().strip('"').strip()
    if t.lower() in _MISSING:
        return None
    t = t.replace(",", "").replace("\u202f", "").replace("\xa0", "").replace(" ", "")
    try:
        value = float(t)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV table of ncu's output: the header (it names "ID" and "Kernel Name") and every later
    line with as many fields; anything else (``==PROF==`` lines, the target's prints) is skipped."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Kernel Name" not in line or "ID" not in line:
            continue
        header = _fields(line)
        if header is None or "ID" not in header or "Kernel Name" not in header:
            continue
        rows = [header]
        for later in lines[i + 1:]:
            if later.startswith("=="):
                continue
            fields = _fields(later)
            if fields is not None and len(fields) == len(header):
                rows.append(fields)
        return rows
    return []


def _fields(line: str) -> list[str] | None:
    try:
        return next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None


@dataclass
class _Launch:
    name: str
    values: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # metric -> (value, unit)


def _launches(rows: list[list[str]]) -> list[_Launch]:
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kid, kname = col["ID"], col["Kernel Name"]
    out: dict[str, _Launch] = {}
    if "Metric Name" in col and "Metric Value" in col:  # the details page's long form: a row per metric
        mname, mval, munit = col["Metric Name"], col["Metric Value"], col.get("Metric Unit")
        for r in body:
            if number(r[kid]) is None or not r[mname].strip():
                continue
            launch = out.setdefault(r[kid].strip(), _Launch(name=r[kname]))
            unit = r[munit].strip() if munit is not None else ""
            launch.values[r[mname].strip()] = (number(r[mval]), unit)
        return list(out.values())
    # the raw page: a column per metric, a units row under the header, a row per launch
    units = next((r for r in body if not r[kid].strip()), [""] * len(header))
    metric_cols = [(i, name.strip()) for i, name in enumerate(header) if "__" in name]
    for r in body:
        if number(r[kid]) is None:
            continue
        launch = out.setdefault(r[kid].strip(), _Launch(name=r[kname]))
        for i, name in metric_cols:
            launch.values[name] = (number(r[i]), units[i].strip())
    return list(out.values())


def _scaled(launch: _Launch, metric: str, per: dict[str, float], default: float) -> float | None:
    value, unit = launch.values.get(metric, (None, ""))
    if value is None:
        return None
    return value * per.get(unit.lower(), default) if unit else value * default


def _pct(launch: _Launch, metric: str) -> float | None:
    value = launch.values.get(metric, (None, ""))[0]
    return None if value is None else round(value, 2)


def _kernel_name(raw: str) -> str:
    name = raw.strip()
    if "(" in name:  # a demangled name with its parameters: the function is what a spec names
        name = name[: name.index("(")].strip()
    return name[:120] or "?"


def _profile(index: int, launch: _Launch) -> KernelProfile:
    dur = _scaled(launch, DURATION, _MS_PER, 1e-6)  # ncu's base unit: nanoseconds
    tensor = [v for v in (_pct(launch, TENSOR_HMMA), _pct(launch, TENSOR_GMMA)) if v is not None]
    local = [v for v in (_scaled(launch, m, _BYTES_PER, 1.0) for m in LOCAL) if v is not None]
    stalls = [(r, v) for r in STALL_REASONS if (v := launch.values.get(stall_metric(r), (None, ""))[0]) and v > 0]
    total = sum(v for _, v in stalls)
    top = sorted(stalls, key=lambda rv: -rv[1])[:MAX_STALLS]
    return KernelProfile(
        name=_kernel_name(launch.name), launch=index,
        duration_ms=round(dur, 6) if dur is not None else None,
        **{f: _pct(launch, m) for f, m in FIELDS.items()},
        tensor_pct=max(tensor) if tensor else None,
        stalls=[StallShare(reason=r, cycles=round(v, 3), pct=round(100.0 * v / total, 1)) for r, v in top],
        local_bytes=int(round(sum(local))) if local else None,
    )


def parse_ncu_csv(text: str) -> list[KernelProfile]:
    """The kernels of ncu's ``--csv --page raw`` output (the ``details`` page's long form reads
    too), in launch order. A metric missing or unreadable ("n/a") is None; output without a
    table is [] (the caller says why from ncu's messages)."""
    rows = _csv_rows(text)
    if len(rows) < 2:
        return []
    return [_profile(i, launch) for i, launch in enumerate(_launches(rows))]


def rejected_metrics(output: str, metrics: list[str]) -> list[str]:
    """The requested metrics ncu's error lines name ("Failed to access the following 2 metrics:
    ...", "Failed to find metric ..."): an architecture without them; one retry goes without."""
    errors = [l for l in output.splitlines() if "==ERROR==" in l or "==WARNING==" in l]
    return [m for m in metrics if any(m in l for l in errors)]


def ncu_messages(output: str, kind: str = "==ERROR==") -> list[str]:
    return [" ".join(l.split())[:300] for l in output.splitlines() if l.lstrip().startswith(kind)]


# ----- running it ----------------------------------------------------------------------------
class _Tail:
    """The last ``limit`` bytes of a stream (a chatty or hostile process cannot fill memory)."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.buf = bytearray()

    def drain(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.buf += chunk
            if len(self.buf) > self.limit:
                del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        return self.buf.decode(errors="replace")


@dataclass
class Ran:
    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0


def run_bounded(cmd: list[str], env: dict[str, str], cwd: str | Path, timeout_s: float) -> Ran:
    """Run ``cmd`` in its own process group; after ``timeout_s`` the whole group is killed.
    Output is kept bounded (:class:`_Tail`)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=str(cwd), start_new_session=True)
    except OSError as exc:
        return Ran(rc=None, stdout="", stderr=f"==ERROR== cannot start {cmd[0]}: {exc}")
    assert proc.stdout is not None and proc.stderr is not None
    tails = (_Tail(), _Tail())
    readers = [threading.Thread(target=t.drain, args=(s.fileno(),), daemon=True)
               for t, s in zip(tails, (proc.stdout, proc.stderr))]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=max(0.1, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    for t, stream in zip(readers, (proc.stdout, proc.stderr)):
        t.join(timeout=5.0)  # a grandchild that left the group may hold the pipe: do not wait on it
        if not t.is_alive():  # (a reader still blocked keeps its fd: closing it under a read could
            stream.close()  # hand the number to another file)
    return Ran(rc=proc.returncode, stdout=tails[0].text(), stderr=tails[1].text(), timed_out=timed_out,
               seconds=time.monotonic() - started)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


PERMISSION = "ERR_NVGPUCTRPERM"  # the driver keeps the GPU's counters to admins on this host


def run_ncu(ncu: str, request: ProfileRequest, *, device: str, arch: str, timeout_s: float = NCU_TIMEOUT_S,
            python: str | None = None) -> ProfileOutcome:
    """Profile one call of ``request.plan`` on GPU ``device`` (what CUDA_VISIBLE_DEVICES names).
    Never raises: a failure is an outcome with an ``error`` line."""
    started = time.monotonic()
    deadline = started + timeout_s
    kernels = list(dict.fromkeys(l.kernel for l in request.plan.launches))
    if not kernels:
        return ProfileOutcome(error="the plan launches no kernel: nothing to profile")
    per_call = len(request.plan.launches)
    metrics = metrics_for(arch)
    try:
        with tempfile.TemporaryDirectory(prefix="kerngen-ncu-") as tmp:
            status_path = Path(tmp) / "status.json"
            request_path = Path(tmp) / "request.json"
            request_path.write_text(request.model_copy(update={"status_path": str(status_path)}).model_dump_json())
            env = ncu_env(device)
            for attempt in (0, 1):
                left = deadline - time.monotonic()
                cmd = ncu_command(ncu, metrics, kernels, count=min(per_call, MAX_KERNELS),
                                  skip=request.warmups * per_call, request_path=request_path, python=python)
                ran = run_bounded(cmd, env, tmp, left)
                seconds = round(time.monotonic() - started, 3)
                if ran.timed_out:
                    return ProfileOutcome(error=f"ncu did not finish within {timeout_s:.0f} s (killed)",
                                          seconds=seconds)
                output = ran.stdout + "\n" + ran.stderr
                if PERMISSION in output:
                    return ProfileOutcome(available=False, seconds=seconds,
                                          error=f"ncu may not read this GPU's performance counters ({PERMISSION})")
                profiles = parse_ncu_csv(ran.stdout)
                if profiles:
                    return ProfileOutcome(profiles=profiles, seconds=seconds)
                rejected = rejected_metrics(output, metrics)
                if attempt == 0 and rejected and len(rejected) < len(metrics):
                    metrics = [m for m in metrics if m not in rejected]  # this arch lacks them
                    continue
                return ProfileOutcome(error=_why(ran, status_path, kernels), seconds=seconds)
    except OSError as exc:  # the temporary folder itself
        return ProfileOutcome(error=f"profile: {exc}"[:300], seconds=round(time.monotonic() - started, 3))
    return ProfileOutcome(error="profile: no attempt ran")  # not reached: the loop returns


def _why(ran: Ran, status_path: Path, kernels: list[str]) -> str:
    """One line: the target's own error, else ncu's first error, else what is known."""
    try:
        status = TargetStatus.model_validate_json(status_path.read_text())
    except (OSError, ValueError):
        status = None
    if status is not None and not status.ok and status.error:
        return f"profile target: {status.error}"[:400]
    output = ran.stdout + "\n" + ran.stderr
    errors = ncu_messages(output)
    if errors:
        return errors[0].replace("==ERROR==", "ncu:", 1)[:400]
    if status is not None and status.ok:
        warn = ncu_messages(output, "==WARNING==")
        extra = f" ({warn[0].replace('==WARNING==', '').strip()})" if warn else ""
        return f"ncu profiled no launch of {', '.join(kernels)}{extra}"[:400]
    tail = [l for l in ran.stderr.splitlines() if l.strip()]
    last = f": {' '.join(tail[-1].split())[:200]}" if tail else ""
    return f"ncu exited with code {ran.rc} and no readable report{last}"[:400]


__all__ = ["MAX_KERNELS", "NCU_TIMEOUT_S", "ProfileRequest", "TargetStatus", "find_ncu", "metrics_for",
           "ncu_command", "parse_ncu_csv", "run_ncu"]
