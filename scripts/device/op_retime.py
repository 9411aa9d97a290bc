"""An independent re-timing of what a user gets (issue 35's Linear + bias + GELU, any run): each run's best kernel
exported and loaded with ``kerngen.load``, then ``triton.testing.do_bench`` (its own L2 clearing, warm-up and median;
none of kerngen's timer) of the loaded op, of the problem's PyTorch module eager and of ``torch.compile`` of it, on the
same inputs, in three rounds of that order so that drifting clocks fall on all three alike; beside them the same
kernel through the harness's launcher, on those arguments and on standard-normal parameters; then the op, compile and
eager each run back to back for 2 s, with NVML's SM clock, power and throttle reasons (read only). Prints a table last.
Not packaged: a developer's tool, run on the GPU host from the repository root:

    python3 scripts/device/op_retime.py RUN_FOLDER...
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton.testing

import kerngen
from kerngen.agent.tree import load_run
from kerngen.harness.gpu.clocks import ClockMonitor
from kerngen.problems.load import load_problem
from kerngen.results.export import export_run
from kerngen.results.manifest import read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from direct_launch import direct_runner  # noqa: E402 - a sibling script, not a package

ROUNDS = 3
SUSTAIN_S = 2.0


def sustained(fn) -> dict:
    """``fn`` back to back for SUSTAIN_S seconds (no L2 flush): ms a call over the last half, and NVML's lowest SM
    clock, highest power and throttle reasons over the whole (read only)."""
    mon = ClockMonitor(torch.cuda.current_device())
    mon.start()
    began, calls, half = time.perf_counter(), 0, None
    while (now := time.perf_counter()) - began < SUSTAIN_S:
        if half is None and now - began >= SUSTAIN_S / 2:
            torch.cuda.synchronize()
            half, calls = time.perf_counter(), 0
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
        mon.sample()
    ms = (time.perf_counter() - half) / calls * 1e3
    r = mon.stop()
    return {"ms": ms, "sm_min": r.sm_mhz_after if mon._min_sm is None else min(mon._min_sm, r.sm_mhz_after or 10**6),
            "power_w": r.power_w, "reasons": ",".join(r.throttle_reasons) or "-"}


def retime(folder: Path, out: Path) -> dict:
    run = load_run(folder, folder.parent)
    problem = load_problem(run.started.problem)
    model = problem.build_model("cuda")
    inputs = [a for a in problem.make_inputs("cuda", 1)]
    ref = problem.run_reference(model, inputs)
    bound = problem.bindings(model, inputs, ref)
    res = export_run(run, out / folder.name)
    op = kerngen.load(res.dir)
    args = [bound[t.name] for t in read_manifest(res.manifest).arguments]
    got = op(*args)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    same = all(torch.allclose(g.float(), r.float(), atol=problem.info.atol, rtol=problem.info.rtol)
               for g, r in zip(got, ref))
    compiled = torch.compile(model)
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)  # compiled before it is timed
        # the same kernel through the harness's launcher on the same arguments (the op path's own cost), and on
        # standard-normal parameters (the data's share: a power-capped GPU's clock follows what the operands hold)
        direct, _, _ = direct_runner(op, args)
        normal = [torch.randn_like(a) if i >= len(problem.info.inputs) else a for i, a in enumerate(args)]
        direct_n, _, _ = direct_runner(op, normal)
        paths = {"op": lambda: op(*args), "eager": lambda: model(*inputs), "compile": lambda: compiled(*inputs),
                 "launcher": direct, "launcher, normal params": direct_n}
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(ROUNDS):
            for name, fn in paths.items():
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
        held = {k: sustained(paths[k]) for k in ("op", "compile", "eager")}
    row = {k: statistics.median(v) for k, v in times.items()}
    for k, h in held.items():
        print(f"sustained {k}: {h['ms']:.4f} ms a call (no flush), SM clock down to {h['sm_min']} MHz, power up to "
              f"{h['power_w']} W, reasons {h['reasons']}", flush=True)
    return {"problem": problem.name, "kernel": run.best.ms if run.best else None, "same": same, **row,
            "spread": {k: (min(v), max(v)) for k, v in times.items()}}


def main() -> int:
    out = Path(tempfile.mkdtemp())
    rows = []
    for arg in sys.argv[1:]:
        try:
            rows.append(retime(Path(arg), out))
        except Exception as exc:  # noqa: BLE001 - one run failing leaves the others timed
            print(f"{arg}: {type(exc).__name__}: {exc}", flush=True)
    print(f"\nGPU: {torch.cuda.get_device_name()}; triton.testing.do_bench medians (ms), {ROUNDS} rounds of op, eager, "
          "compile; the kernel as its run timed it")
    print("| problem | run's kernel | loaded op | eager | torch.compile | launcher | launcher, normal params | op vs eager | "
          "op vs compile | op outputs ok | spread (min-max of the rounds) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        spread = "; ".join(f"{k} {a:.4f}-{b:.4f}" for k, (a, b) in r["spread"].items())
        print(f"| {r['problem']} | {r['kernel']:.4f} | {r['op']:.4f} | {r['eager']:.4f} | {r['compile']:.4f} | "
              f"{r['launcher']:.4f} | {r['launcher, normal params']:.4f} | "
              f"{r['eager'] / r['op']:.2f}x | {r['compile'] / r['op']:.2f}x | {r['same']} | {spread} |")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
