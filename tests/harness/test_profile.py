"""Profiler feedback (harness/gpu/profile.py): ncu's CSV parsed into KernelProfile records, the
runner end to end against a fake ``ncu`` on PATH (no GPU), every failure an outcome with an
error line; and, on a GPU host with ncu, one real profile."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kerngen.harness.gpu.profile import (
    DURATION, LOCAL, TENSOR_GMMA, TENSOR_HMMA, ProfileRequest, find_ncu, metrics_for, ncu_command, ncu_env,
    parse_ncu_csv, run_ncu, stall_metric,
)
from kerngen.expr import TensorFacts
from kerngen.harness.results import KernelProfile, ProfileOutcome, StallShare
from kerngen.harness.spec.plan import resolve
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

REF = ProblemRef(source="softmax", shape=(4, 32))

# ----- what ncu 2024/2025 prints for `--csv --page raw --print-units base --metrics ...` ------
# (its own messages first; then the header of fixed columns and metric names in alphabetical
# order; a units row; a row per profiled launch, every field quoted, thousands separated)
_METRICS = sorted([
    DURATION, "dram__throughput.avg.pct_of_peak_sustained_elapsed", *LOCAL,
    "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__maximum_warps_per_active_cycle_pct",
    TENSOR_GMMA, TENSOR_HMMA, "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    *(stall_metric(r) for r in ("barrier", "long_scoreboard", "mio_throttle", "not_selected", "short_scoreboard",
                                "wait")),
])
_UNITS = {DURATION: "nsecond", LOCAL[0]: "byte", LOCAL[1]: "byte"}
_FIXED = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC"]


def _row(cells) -> str:
    return ",".join(f'"{c}"' for c in cells)


def _launch(i: int, name: str, values: dict[str, str]) -> str:
    fixed = [str(i), "41237", "python3.11", "127.0.0.1", name, "1", "13", "(256, 1, 1)", "(4,096, 1, 1)", "0", "9.0"]
    return _row(fixed + [values.get(m, "n/a") for m in _METRICS])


SOFTMAX = {
    DURATION: "12,352", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "78.42",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "31.07", "sm__throughput.avg.pct_of_peak_sustained_elapsed":
    "22.18", TENSOR_HMMA: "0", TENSOR_GMMA: "0", "sm__warps_active.avg.pct_of_peak_sustained_active": "47.91",
    "sm__maximum_warps_per_active_cycle_pct": "50", LOCAL[0]: "0", LOCAL[1]: "0",
    stall_metric("long_scoreboard"): "18.31", stall_metric("barrier"): "3.62", stall_metric("wait"): "1.94",
    stall_metric("short_scoreboard"): "1.2", stall_metric("mio_throttle"): "0.88", stall_metric("not_selected"): "4.05",
}
GEMM = {  # a second kernel of the plan: spills, tensor pipe, one metric "n/a" (another arch)
    DURATION: "1,204,736", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "12.5",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "44", "sm__throughput.avg.pct_of_peak_sustained_elapsed":
    "71.3", TENSOR_HMMA: "63.2", TENSOR_GMMA: "n/a", "sm__warps_active.avg.pct_of_peak_sustained_active": "12.3",
    "sm__maximum_warps_per_active_cycle_pct": "12.5", LOCAL[0]: "1,048,576", LOCAL[1]: "524,288",
    stall_metric("long_scoreboard"): "2", stall_metric("math_pipe_throttle"): "9", stall_metric("barrier"): "5",
}
CSV = "\n".join([
    "==PROF== Connected to process 41237 (/usr/bin/python3.11)",
    '==PROF== Profiling "softmax_rows" - 0: 0%....50%....100% - 19 passes',
    '==PROF== Profiling "sgemm_tile" - 1: 0%....50%....100% - 19 passes',
    "==PROF== Disconnected from process 41237",
    _row(_FIXED + _METRICS),
    _row([""] * len(_FIXED) + [_UNITS.get(m, "%" if "pct" in m else "") for m in _METRICS]),
    _launch(0, "softmax_rows", SOFTMAX),
    _launch(1, "sgemm_tile", GEMM),
]) + "\n"


def test_parse_raw_csv_into_kernel_profiles():
    a, b = parse_ncu_csv(CSV)
    assert (a.name, a.launch, b.name, b.launch) == ("softmax_rows", 0, "sgemm_tile", 1)
    assert a.duration_ms == pytest.approx(0.012352) and b.duration_ms == pytest.approx(1.204736)
    assert (a.dram_pct, a.l2_pct, a.sm_pct, a.tensor_pct) == (78.42, 31.07, 22.18, 0.0)
    assert (a.occupancy_pct, a.theoretical_occupancy_pct) == (47.91, 50.0)
    assert a.local_bytes == 0 and b.local_bytes == 1_572_864
    assert b.tensor_pct == 63.2  # HMMA read, GMMA "n/a": absent, not an error
    assert [s.reason for s in a.stalls] == ["long_scoreboard", "not_selected", "barrier"]
    total = 18.31 + 3.62 + 1.94 + 1.2 + 0.88 + 4.05
    assert a.stalls[0].pct == pytest.approx(100 * 18.31 / total, abs=0.05) and a.stalls[0].cycles == 18.31
    # math_pipe_throttle is no column of this CSV: the stall metric is simply missing
    assert [s.reason for s in b.stalls] == ["barrier", "long_scoreboard"]
    line = a.line()
    assert line.startswith("DRAM 78% of peak, L2 31%, SM 22%, tensor pipe 0%; occupancy 48% (theoretical 50%)")
    assert "top stalls (% of stall cycles): long_scoreboard 61%, not_selected 14%, barrier 12%" in line and line.endswith("no local-memory spills")
    assert "local-memory traffic 1,572,864 B" in b.line()


def test_parse_tolerates_missing_metrics_units_and_other_layouts():
    # only two metrics asked (another arch dropped the rest), units auto-scaled, unquoted numbers
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","gpu__time_duration.sum",'
        '"dram__throughput.avg.pct_of_peak_sustained_elapsed"',
        '"","","","","","usecond","%"',
        '0,9,"python","h","void k<128>(float*, int)","1,500.5","n/a"',
    ])
    (p,) = parse_ncu_csv(text)
    assert p.name == "void k<128>" and p.duration_ms == pytest.approx(1.5005)
    assert p.dram_pct is None and p.l2_pct is None and p.stalls == [] and p.local_bytes is None
    assert "DRAM n/a of peak" in p.line()
    # the details page's long form (a row per metric) reads too
    long = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","py","h","k","1","7","(256, 1, 1)","(8, 1, 1)","0","8.0","Command line profiler metrics",'
        '"gpu__time_duration.sum","msecond","2.00"',
        '"0","1","py","h","k","1","7","(256, 1, 1)","(8, 1, 1)","0","8.0","Command line profiler metrics",'
        '"sm__throughput.avg.pct_of_peak_sustained_elapsed","%","91.5"',
    ])
    (q,) = parse_ncu_csv(long)
    assert q.duration_ms == 2.0 and q.sm_pct == 91.5
    # no table at all: nothing (the runner says why), never an exception
    for garbage in ("", "==ERROR== something\n", "ID,Kernel Name\n\x00\xff", "a,b\n1,2\n", '"ID","Kernel Name"\n'):
        assert parse_ncu_csv(garbage) == []


def test_metrics_and_command_never_touch_clocks():
    m80, m90 = metrics_for("sm_80"), metrics_for("sm_90a")
    assert TENSOR_GMMA not in m80 and TENSOR_GMMA in m90 and TENSOR_HMMA in m80
    assert all(stall_metric(r) in m80 for r in ("long_scoreboard", "barrier", "mio_throttle", "lg_throttle"))
    cmd = ncu_command("/x/ncu", m80, ["softmax_rows", "fix"], count=2, skip=2, request_path="/t/r.json",
                      python="/py")
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("-k") + 1] == "regex:^(softmax_rows|fix)$"
    assert cmd[cmd.index("--launch-skip") + 1] == "2" and cmd[cmd.index("--launch-count") + 1] == "2"
    assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd and "all" in cmd
    assert cmd[-4:] == ["/py", "-m", "kerngen.harness.gpu.profile_target", "/t/r.json"]
    env = ncu_env("3", {"PATH": "/bin", "OPENAI_API_KEY": "sk-secret", "HOME": "/h", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin" and "OPENAI_API_KEY" not in env


def test_find_ncu(tmp_path):
    fake = _fake_ncu(tmp_path / "bin", "csv")
    assert find_ncu({"PATH": str(tmp_path / "bin")}) == str(fake)
    other = _fake_ncu(tmp_path / "elsewhere", "csv")
    assert find_ncu({"PATH": str(tmp_path / "bin"), "NCU": str(other)}) == str(other)  # an explicit choice wins
    if not any(Path(p).is_file() for p in ["/usr/local/cuda/bin/ncu", *map(str, Path("/opt").glob("nvidia/nsight-compute/*/ncu"))]):
        assert find_ncu({"PATH": str(tmp_path / "empty")}) is None


# ----- the runner against a fake ncu ---------------------------------------------------------
FAKE = '''#!{python}
import json, os, sys, time
mode = {mode!r}
log = {log!r}
args = sys.argv[1:]
request = json.load(open(args[-1]))
with open(log, "a") as fh:
    fh.write(json.dumps({{"args": args, "env": dict(os.environ), "request": request}}) + "\\n")
if mode == "hang":
    print("==PROF== Connected to process 1", flush=True)
    time.sleep(600)
elif mode == "garbage":
    sys.stdout.write("\\x00\\x01 not a table " * 200000)  # megabytes, kept bounded
    sys.stderr.write("Segmentation fault\\n")
    sys.exit(139)
elif mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
elif mode == "target":
    open(request["status_path"], "w").write(json.dumps({{"ok": False, "error": "OutOfMemoryError: 64 GiB"}}))
    print("==WARNING== No kernels were profiled.")
elif mode == "reject" and "{gmma}" in args[args.index("--metrics") + 1]:
    print("==ERROR== Failed to access the following 1 metrics: {gmma}")
    sys.exit(1)
elif mode == "slow":
    open(log + ".running", "w").close()
    time.sleep(1.0)
    sys.stdout.write(open({csv!r}).read())
else:
    sys.stdout.write(open({csv!r}).read())
'''


def _fake_ncu(folder: Path, mode: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    csv_file = folder / "report.csv"
    csv_file.write_text(CSV)
    path = folder / "ncu"
    path.write_text(FAKE.format(python=sys.executable, mode=mode, log=str(folder / "calls.jsonl"),
                                csv=str(csv_file), gmma=TENSOR_GMMA))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _calls(folder: Path) -> list[dict]:
    return [json.loads(l) for l in (folder / "calls.jsonl").read_text().splitlines()]


def _spec(kernel: str = "softmax_rows") -> KernelSpec:
    src = f'extern "C" __global__ void {kernel}(float* out) {{ out[threadIdx.x] = 1.f; }}'
    return KernelSpec.model_validate(
        {"source": src, "steps": [{"kernel": kernel, "grid": [1], "block": [32], "args": [{"name": "out"}]},
                                  {"kernel": kernel, "grid": [1], "block": [32], "args": [{"name": "out"}]}]})


def _request() -> ProfileRequest:
    plan = resolve(_spec(), sizes={}, tensors={"out": TensorFacts((32,))}, config={})
    return ProfileRequest(problem=REF, plan=plan, cubin_b64=ProfileRequest.encode(b"\x7fELF fake"))


def test_runner_end_to_end_with_a_fake_ncu(tmp_path):
    ncu = _fake_ncu(tmp_path / "bin", "csv")
    out = run_ncu(str(ncu), _request(), device="5", arch="sm_90", timeout_s=60)
    assert out.error == "" and out.available and out.seconds > 0
    assert [p.name for p in out.profiles] == ["softmax_rows", "sgemm_tile"]
    (call,) = _calls(tmp_path / "bin")
    args, env = call["args"], call["env"]
    assert args[args.index("--clock-control") + 1] == "none"
    assert args[args.index("--launch-skip") + 1] == "2" and args[args.index("--launch-count") + 1] == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and "OPENAI_API_KEY" not in env
    request = ProfileRequest.model_validate(call["request"])  # what the target would read
    assert request.plan.launches[0].kernel == "softmax_rows" and request.cubin() == b"\x7fELF fake"
    assert not Path(args[-1]).exists()  # the temporary folder is gone


@pytest.mark.parametrize("mode, error", [
    ("garbage", "ncu exited with code 139 and no readable report: Segmentation fault"),
    ("target", "profile target: OutOfMemoryError: 64 GiB"),
])
def test_runner_failures_are_records(tmp_path, mode, error):
    ncu = _fake_ncu(tmp_path / "bin", mode)
    out = run_ncu(str(ncu), _request(), device="0", arch="sm_90", timeout_s=60)
    assert out.profiles == [] and out.available and out.error == error


def test_runner_kills_a_hung_ncu(tmp_path):
    ncu = _fake_ncu(tmp_path / "bin", "hang")
    t0 = time.monotonic()
    out = run_ncu(str(ncu), _request(), device="0", arch="sm_90", timeout_s=2)
    assert time.monotonic() - t0 < 20
    assert out.error == "ncu did not finish within 2 s (killed)" and out.profiles == []


def test_runner_drops_metrics_the_arch_lacks_and_reports_no_permission(tmp_path):
    ncu = _fake_ncu(tmp_path / "bin", "reject")
    out = run_ncu(str(ncu), _request(), device="0", arch="sm_90", timeout_s=60)
    assert len(out.profiles) == 2
    first, second = (c["args"] for c in _calls(tmp_path / "bin"))
    assert TENSOR_GMMA in first[first.index("--metrics") + 1]
    assert TENSOR_GMMA not in second[second.index("--metrics") + 1]
    perm = run_ncu(str(_fake_ncu(tmp_path / "perm", "perm")), _request(), device="0", arch="sm_90")
    assert not perm.available and "ERR_NVGPUCTRPERM" in perm.error  # this host cannot profile: stop asking


def test_runner_never_raises_without_an_ncu(tmp_path):
    out = run_ncu(str(tmp_path / "no-such-ncu"), _request(), device="0", arch="sm_90", timeout_s=10)
    assert out.profiles == [] and "cannot start" in out.error


def test_records_round_trip_through_json():
    out = ProfileOutcome(profiles=parse_ncu_csv(CSV), seconds=3.5)
    again = ProfileOutcome.model_validate_json(out.model_dump_json())
    assert again == out and isinstance(again.profiles[0].stalls[0], StallShare)
    assert KernelProfile(name="k").line() == "DRAM n/a of peak, L2 n/a, SM n/a, tensor pipe n/a; occupancy n/a"


# ----- the pool: ncu on the GPU of a worker taken out of the free queue ----------------------
def test_pool_profiles_on_a_worker_gpu_that_nothing_else_uses(tmp_path, monkeypatch):
    from kerngen.harness.pool import local
    from kerngen.harness.pool.local import WorkerPool

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    ncu = _fake_ncu(tmp_path / "bin", "slow")
    monkeypatch.setattr(local, "find_ncu", lambda: str(ncu))
    with WorkerPool(devices=["7"], timeout_s=5.0, worker_module="tests.fakes.fake_worker") as pool:
        pool.gpu_facts()
        box: dict[str, ProfileOutcome] = {}
        t = threading.Thread(target=lambda: box.setdefault("out", pool.profile(REF, _spec(), {})))
        t.start()
        running = tmp_path / "bin" / "calls.jsonl.running"
        deadline = time.monotonic() + 60
        while not running.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.exists() and pool._free.qsize() == 0  # no timing can take that GPU meanwhile
        t.join(60)
        assert pool._free.qsize() == 1
        out = box["out"]
        assert out.error == "" and [p.name for p in out.profiles] == ["softmax_rows", "sgemm_tile"]
        assert _calls(tmp_path / "bin")[0]["env"]["CUDA_VISIBLE_DEVICES"] == "7"
        # a spec that does not compile is an outcome too
        bad = KernelSpec.model_validate({**_spec().model_dump(), "source": "oops"})
        failed = pool.profile(REF, bad)
        assert failed.profiles == [] and failed.error.startswith("not profiled: ")
    monkeypatch.setattr(local, "find_ncu", lambda: None)
    with WorkerPool(devices=["0"], worker_module="tests.fakes.fake_worker") as pool:
        none = pool.profile(REF, _spec())
        assert not none.available and "ncu" in none.error


# ----- a real GPU with ncu -------------------------------------------------------------------
@pytest.mark.gpu
def test_profile_one_kernel_on_the_gpu(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if find_ncu() is None:
        pytest.skip("no ncu (Nsight Compute) on this host")
    from kerngen.harness.pool.local import WorkerPool

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    src = textwrap.dedent('''
        extern "C" __global__ void scale_copy(const float* x, float* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = x[i];
        }''')
    spec = KernelSpec.model_validate({"source": src, "steps": [{
        "kernel": "scale_copy", "grid": ["cdiv(x.numel, 256)"], "block": [256],
        "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}]}]})
    problem = ProblemRef(source="gelu", shape=(4096, 4096), dtype="float32")
    with WorkerPool(devices=[os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]]) as pool:
        out = pool.profile(problem, spec)
    if not out.available:
        pytest.skip(f"this host cannot profile: {out.error}")
    assert out.error == "", out.error
    (p,) = out.profiles
    assert p.name == "scale_copy" and isinstance(p.dram_pct, float) and p.duration_ms and p.duration_ms > 0

