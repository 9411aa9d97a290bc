"""Issue 35, the bf16 Linear + bias + GELU (8192 x 8192 x 2048) against torch.compile: where the wgmma kernel's time
goes and what the shared-memory staged epilogue (EPI_SMEM) gains, side by side on one GPU (run by
scripts/device/i35d.sh; sm_90 only). In one worker pool (as ``kerngen bench``: L2 flushed before every timed run,
CUDA events, the median; every kernel fully checked before it is timed): the same GEMM with no epilogue (matmul at
M N K), with the bias alone (a Linear), and with bias + GELU (the built-in), each at the cooperative default, with
ping-pong consumers, and with EPI_SMEM; PyTorch eager and torch.compile beside them. Prints a table last; ``--out DIR``
also writes every number as JSON there. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

LINEAR = '''"""nn.Linear (bias, no activation) in bf16: the GELU problem without its GELU."""
import torch
import torch.nn as nn
M, N, K = 8192, 8192, 2048
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(K, N, dtype=torch.bfloat16)
    def forward(self, x):
        return self.linear(x)
def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''
# (column, the spec's defaults, configurations tried with it)
MODES = [
    ("coop", {}, [{}]),
    ("pingpong", {"PINGPONG": 1}, [{}]),
    ("coop+smem", {"EPI_SMEM": 1}, [{}, {"GROUP_M": 16}]),
    ("pingpong+smem", {"PINGPONG": 1, "EPI_SMEM": 1}, [{"GROUP_M": 16}]),
]
CHECK = dict(seeds=2, budget_ms=80.0, timeout_s=120.0)


def measure(pool: WorkerPool, label: str, ref: ProblemRef, modes: list) -> dict:
    problem = load_problem(ref)
    m = explain(problem)
    t0 = time.monotonic()
    base = pool.baseline(ref, budget_ms=150.0, with_compile=True)
    row = {"label": label, "flops": problem.info.flops, "eager_ms": base.eager.median_ms,
           "compile_ms": base.compiled.median_ms if base.compiled else None, "modes": {}}
    cands = [(col, Candidate(spec=family_of(m).build(m, "wgmma", d), config=c)) for col, d, cfgs in modes for c in cfgs]
    results = pool.evaluate(ref, [c for _, c in cands], EvalOptions(**CHECK))
    for (col, cand), r in zip(cands, results):
        row["modes"].setdefault(col, []).append({"config": cand.spec.full_config(r.config), "ms": r.ms,
                                                 "verdict": r.verdict.value, "why": "" if r.ok else r.message[:200]})
    for col, tried in row["modes"].items():
        ok = [t for t in tried if t["ms"] != float("inf") and t["verdict"] == "ok"]
        row[col] = min(t["ms"] for t in ok) if ok else None
        print(f"{label} {col}: " + "; ".join(f"{t['ms']:.4f} ms {t['verdict']} {t['why'][:120]}" for t in tried),
              flush=True)
    print(f"{label}: eager {row['eager_ms']:.4f} ms, compile {row['compile_ms']} [{time.monotonic() - t0:.0f} s]",
          flush=True)
    return row


def table(rows: list[dict], gpu: str, modes: list) -> str:
    cols = [c for c, _, _ in modes]
    out = ["", f"GPU: {gpu}; ms (median, L2 flushed); TFLOP/s of the best; ratios: eager (cuBLAS) or torch.compile / the best wgmma",
           "| problem (bf16; 8192 x 8192 x 2048 unless named) | eager | torch.compile | " + " | ".join(cols) +
           " | best TFLOP/s | best vs eager | best vs compile |", "|---" * (len(cols) + 6) + "|"]
    for r in rows:
        times = [r.get(c) for c in cols]
        best = min((t for t in times if t), default=None)
        comp = r["compile_ms"]
        tflops = f"{r['flops'] / best / 1e9:.0f}" if best and r.get("flops") else "-"
        ratio = f"{comp / best:.2f}x" if best and comp else "-"
        vs_eager = f"{r['eager_ms'] / best:.2f}x" if best else "-"
        shown = " | ".join(f"{t:.4f}" if t else "failed" for t in times)
        out.append(f"| {r['label']} | {r['eager_ms']:.4f} | {f'{comp:.4f}' if comp else '-'} | {shown} | {tflops} | "
                   f"{vs_eager} | {ratio} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no case past this")
    ap.add_argument("--square", action="store_true", help="also bf16 matmul 4096^3 and 8192^3 (against cuBLAS)")
    ap.add_argument("--fp32", action="store_true", help="only fp32 matmul 4096^3 (3xTF32), default and EPI_SMEM")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"needs an sm_90 GPU; this is {torch.cuda.get_device_name()}", file=sys.stderr)
        return 1
    folder = Path(tempfile.mkdtemp())
    (folder / "linear_bias_bf16.py").write_text(LINEAR)
    cases = [("GEMM alone", ProblemRef(source="matmul", shape=(8192, 8192, 2048), dtype="bfloat16")),
             ("+ bias", ProblemRef(source=str(folder / "linear_bias_bf16.py"))),
             ("+ bias + GELU", ProblemRef(source="linear_gelu"))]
    if args.square:
        cases = [("matmul 8192^3", ProblemRef(source="matmul", shape=(8192,), dtype="bfloat16")),
                 ("matmul 4096^3", ProblemRef(source="matmul", shape=(4096,), dtype="bfloat16")), *cases]
    modes = MODES
    if args.fp32:  # 3xTF32's default ring leaves no room for the staging tiles: 2 stages beside them
        cases = [("matmul fp32 4096^3 (3xTF32)", ProblemRef(source="matmul"))]
        modes = [("coop", {}, [{}, {"STAGES": 2}]), ("coop+smem", {"EPI_SMEM": 1}, [{"STAGES": 2}])]
    rows = []
    with WorkerPool(timeout_s=600) as pool:
        gpu = f"{pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        print(f"GPU: {gpu}", flush=True)
        for label, ref in reversed(cases):  # the target first
            if time.monotonic() > deadline:
                print(f"{label}: skipped (time budget)", flush=True)
                continue
            try:
                rows.append(measure(pool, label, ref, modes))
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                print(f"{label}: failed: {type(exc).__name__}: {exc}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i35d_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows[::-1], gpu, modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
