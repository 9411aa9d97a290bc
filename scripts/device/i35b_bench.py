"""Issue 35 (second part): the Hopper GEMM core under the convolutions and gemm_rows, side by side on one GPU (run by
scripts/device/i35b.sh; sm_90 only). In one worker pool (what ``kerngen bench`` does): PyTorch eager, torch.compile,
the new ``wgmma`` variant (its default and a few fixed configurations) and the mma.sync variant it is meant to beat
(its default), every kernel fully checked before it is timed, for

- the suite's conv2d (fp32, k11 s4, 3 -> 96 channels): 3xTF32 on wgmma against the mma.sync 3xTF32 conv (target:
  >= 3.5x eager fp32);
- KernelBench level-2 54 (conv2d + multiply + LeakyReLU + GELU) in fp32 and as a bf16 copy (conv16);
- KernelBench level-2 99 (GEMM + GELU + softmax), gemm_rows' wgmma_streamed against tf32x3_streamed;

and prints a table last. ``--out DIR`` also writes every number as JSON there. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.problems.dtype_copy import dtype_copy, dtype_copy_name
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

# the KernelBench copy where tests/resources.py finds it: KERNGEN_KERNELBENCH, beside the tree, or inside it
KB = next((p for p in (Path(os.environ.get("KERNGEN_KERNELBENCH", "-")), Path("../shared/kernelbench"),
                       Path("shared/kernelbench")) if (p / "level2").is_dir()), Path("../shared/kernelbench"))
L2_54 = "level2/54_Conv2d_Multiply_LeakyReLU_GELU.py"
L2_99 = "level2/99_Matmul_GELU_Softmax.py"
# (label, problem (a suite name, a KernelBench file, or file@dtype for a copy), [(variant, configurations)], target
# ratio of the best wgmma time against eager, or None)
CASES = [
    ("conv2d fp32 suite k11 s4 (3xTF32)", "conv2d",
     [("wgmma", [{}, {"VEC": 4}, {"BN": 128}, {"STAGES": 2, "BK": 64}, {"GROUP_M": 16}]), ("tf32x3", [{}])], 3.5),
    ("KB L2 54 conv+mul+lrelu+gelu fp32", L2_54, [("wgmma", [{}, {"VEC": 2}, {"GROUP_M": 16}]), ("tf32x3", [{}])],
     None),
    ("KB L2 54 conv... bf16 copy", L2_54 + "@bfloat16", [("wgmma", [{}, {"WGM": 2, "BN": 128}, {"STAGES": 3}])], None),
    ("KB L2 99 gemm+gelu+softmax fp32", L2_99,
     [("wgmma_streamed", [{}, {"GROUP_M": 16}, {"BN": 64}]), ("tf32x3_streamed", [{}])], None),
    # 4-5 (issue 35, 2026-11-29): the space-to-depth convolution (wgmma_s2d: TMA boxes, no gather) beside the gathered one
    ("conv2d fp32 suite k11 s4: s2d (3xTF32)", "conv2d",
     [("wgmma_s2d", [{}, {"HALO": 0, "FLUSH": 1, "STAGES": 3}, {"HALO": 1, "FLUSH": 1, "STAGES": 3}, {"STAGES": 3},
                     {"GROUP_M": 16}]),
      ("wgmma", [{}])], 3.5),
    ("conv2d bf16 suite k11 s4: s2d", "conv2d@bfloat16",
     [("wgmma_s2d", [{}, {"HALO": 1}, {"STAGES": 5}, {"BN": 128}]), ("wgmma", [{}])], None),
    # 6-7: stride-1 convolutions of 64 channels (space-to-depth is then x channels-last, spatially padded)
    ("KB L2 1 conv3x3 64->128 +relu+bias fp32", "level2/1_Conv2D_ReLU_BiasAdd.py",
     [("wgmma_s2d", [{}, {"STAGES": 4}, {"BN": 64}]), ("wgmma", [{}])], None),
    ("KB L1 55 conv3x3 64ch 512x1024 fp32", "level1/55_conv_standard_2D__asymmetric_input__square_kernel.py",
     [("wgmma_s2d", [{}, {"BN": 64}]), ("wgmma", [{}])], None),
]
CHECK = EvalOptions(seeds=2, budget_ms=60.0, timeout_s=90.0)


def problem_ref(source: str, folder: Path) -> ProblemRef:
    name, _, dtype = source.partition("@")
    if "/" not in source:  # a built-in, or built-in@dtype (its --dtype)
        return ProblemRef(source=name, dtype=dtype or None)
    path = KB / name
    if dtype:  # the copy `kerngen problems --to-dtype` writes
        path = folder / dtype_copy_name(KB / name, dtype)
        path.write_text(dtype_copy(KB / name, dtype))
    return ProblemRef(source=str(path))


def measure(pool: WorkerPool, case: tuple, folder: Path) -> dict:
    label, source, variants, target = case
    ref = problem_ref(source, folder)
    m = explain(load_problem(ref))
    t0 = time.monotonic()
    base = pool.baseline(ref, budget_ms=100.0, with_compile=True)
    row = {"label": label, "family": m.family, "target": target, "eager_ms": base.eager.median_ms,
           "compile_ms": base.compiled.median_ms if base.compiled else None, "variants": {}}
    for variant, configs in variants:
        spec = family_of(m).build(m, variant, {})
        results = pool.evaluate(ref, [Candidate(spec=spec, config=c) for c in configs], CHECK)
        tried = [{"config": r.config, "ms": r.ms, "verdict": r.verdict.value, "why": "" if r.ok else r.message[:200]}
                 for r in results]
        ok = [t for t in tried if t["verdict"] == "ok"]
        best = min(ok, key=lambda t: t["ms"]) if ok else None
        row["variants"][variant] = {"tried": tried, "default_ms": tried[0]["ms"] if tried[0]["verdict"] == "ok" else None,
                                    "best_ms": best["ms"] if best else None, "best_config": best["config"] if best else None}
        print(f"{label} [{variant}]: " + "; ".join(f"{t['config']} {t['verdict']} {t['ms']:.4f} ms {t['why'][:120]}"
                                                 for t in tried), flush=True)
    print(f"{label}: eager {row['eager_ms']:.4f} ms, compile {row['compile_ms']} [{time.monotonic() - t0:.0f} s]",
          flush=True)
    return row


def table(rows: list[dict]) -> str:
    out = ["", "| problem (family) | eager ms | torch.compile ms | variant | default ms | best ms (config) | best vs "
           "eager | best vs compile | target vs eager |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for variant, v in r["variants"].items():
            def ratio(base):
                return f"{base / v['best_ms']:.2f}x" if base and v["best_ms"] else "-"
            met = "-" if r["target"] is None or "wgmma" not in variant else (
                f">= {r['target']}x: {'met' if v['best_ms'] and r['eager_ms'] / v['best_ms'] >= r['target'] else 'not met'}")
            default = f"{v['default_ms']:.4f}" if v["default_ms"] else "failed"
            best = f"{v['best_ms']:.4f} {v['best_config']}" if v["best_ms"] else "none correct"
            comp = f"{r['compile_ms']:.4f}" if r["compile_ms"] else "-"
            out.append(f"| {r['label']} ({r['family']}) | {r['eager_ms']:.4f} | {comp} | {variant} | {default} | {best} "
                       f"| {ratio(r['eager_ms'])} | {ratio(r['compile_ms'])} | {met} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cases", default="0,1,2,3", help="which CASES, by index")
    ap.add_argument("--budget-s", type=float, default=210.0, help="start no case past this (a table still comes)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"needs an sm_90 GPU; this is {torch.cuda.get_device_name()}", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(timeout_s=600) as pool:
        print(f"GPU: {pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        for i in args.cases.split(","):
            case = CASES[int(i)]
            if time.monotonic() > deadline - 40:  # a case takes ~40 s (torch.compile's baseline most of it)
                print(f"{case[0]}: skipped (time budget)", flush=True)
                continue
            try:
                rows.append(measure(pool, case, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                print(f"{case[0]}: failed: {type(exc).__name__}: {exc}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i35b_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
