"""Issue 35 (ping-pong consumers and thread-block clusters in the Hopper GEMM core), side by side on one GPU (run by
scripts/device/i35c.sh; sm_90 only). In one worker pool (what ``kerngen bench`` does: L2 flushed before every timed
run, CUDA events, the median): PyTorch eager (cuBLAS), torch.compile, and the ``wgmma`` variant at its default, with
PINGPONG 1, with CLUSTER 2 and with both (each mode at a couple of fixed configurations, the best kept), every kernel
fully checked before it is timed, for bf16 matmul 4096^3 and 8192^3 (against cuBLAS), the bf16 Linear + bias + GELU
built-in (against torch.compile) and fp32 matmul 4096^3 as 3xTF32 (against cuBLAS fp32). Prints a table last;
``--out DIR`` also writes every number as JSON there. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

# (label, problem, the baseline of the target, target ratio)
CASES = [
    ("matmul bf16 4096^3", ProblemRef(source="matmul", dtype="bfloat16"), "eager", 0.9),
    ("matmul bf16 8192^3", ProblemRef(source="matmul", shape=(8192,), dtype="bfloat16"), "eager", 0.9),
    ("linear+bias+gelu bf16", ProblemRef(source="linear_gelu"), "compile", 1.1),
    ("matmul fp32 4096^3 (3xTF32)", ProblemRef(source="matmul"), "eager", 1.6),
]
# (column, the spec's defaults, configurations tried with it)
MODES = [
    ("default", {}, [{}]),
    ("PINGPONG=1", {"PINGPONG": 1}, [{}, {"WGM": 2, "BN": 128}]),
    ("CLUSTER=2", {"CLUSTER": 2}, [{}, {"GROUP_M": 16}]),
    ("both", {"PINGPONG": 1, "CLUSTER": 2}, [{}, {"WGM": 2, "BN": 128}]),
]
CHECK = dict(seeds=2, budget_ms=60.0, timeout_s=90.0)


def measure(pool: WorkerPool, case: tuple) -> dict:
    label, ref, against, target = case
    m = explain(load_problem(ref))
    t0 = time.monotonic()
    base = pool.baseline(ref, budget_ms=100.0, with_compile=True)
    row = {"label": label, "eager_ms": base.eager.median_ms, "against": against, "target": target,
           "compile_ms": base.compiled.median_ms if base.compiled else None, "modes": {}}
    cands = [(col, Candidate(spec=family_of(m).build(m, "wgmma", d), config=c)) for col, d, cfgs in MODES for c in cfgs]
    results = pool.evaluate(ref, [c for _, c in cands], EvalOptions(**CHECK))
    for (col, cand), r in zip(cands, results):
        tried = row["modes"].setdefault(col, [])
        tried.append({"config": cand.spec.full_config(r.config), "ms": r.ms, "verdict": r.verdict.value,
                      "why": "" if r.ok else r.message[:200]})
    for col, tried in row["modes"].items():
        ok = [t for t in tried if t["ms"] != float("inf")]
        best = min(ok, key=lambda t: t["ms"]) if ok else None
        print(f"{label} {col}: " + "; ".join(f"{t['ms']:.4f} ms {t['verdict']} {t['why'][:120]}" for t in tried),
              flush=True)
        row[col] = best["ms"] if best else None
    print(f"{label}: eager {row['eager_ms']:.4f} ms, compile {row['compile_ms']} [{time.monotonic() - t0:.0f} s]",
          flush=True)
    return row


def table(rows: list[dict], gpu: str) -> str:
    cols = [c for c, _, _ in MODES]
    out = ["", f"GPU: {gpu}; ms (median, L2 flushed); ratio = target baseline / best wgmma",
           "| problem | eager ms | torch.compile ms | " + " | ".join(f"wgmma {c} ms" for c in cols) +
           " | best vs baseline | target | met |", "|---" * (len(cols) + 6) + "|"]
    for r in rows:
        ref_ms = r["eager_ms"] if r["against"] == "eager" else r["compile_ms"]
        times = [r.get(c) for c in cols]
        best = min((t for t in times if t), default=None)
        ratio = ref_ms / best if best and ref_ms else None
        comp = f"{r['compile_ms']:.4f}" if r["compile_ms"] else "-"
        shown = " | ".join(f"{t:.4f}" if t else "failed" for t in times)
        out.append(f"| {r['label']} | {r['eager_ms']:.4f} | {comp} | {shown} | "
                   f"{f'{ratio:.2f}x ' + r['against'] if ratio else '-'} | >= {r['target']}x | "
                   f"{'yes' if ratio and ratio >= r['target'] else 'no'} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no case past this")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"needs an sm_90 GPU; this is {torch.cuda.get_device_name()}", file=sys.stderr)
        return 1
    rows = []
    with WorkerPool(timeout_s=600) as pool:
        gpu = f"{pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        print(f"GPU: {gpu}", flush=True)
        for case in CASES:
            if time.monotonic() > deadline:
                print(f"{case[0]}: skipped (time budget)", flush=True)
                continue
            try:
                rows.append(measure(pool, case))
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                print(f"{case[0]}: failed: {type(exc).__name__}: {exc}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i35c_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
