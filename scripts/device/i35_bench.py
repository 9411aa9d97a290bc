"""Issue 35's measurements of the Hopper GEMM core on one GPU (run by scripts/device/i35.sh; sm_90 only):

1. side by side in one worker pool (what ``kerngen bench`` and ``kerngen tune`` do): PyTorch eager (cuBLAS),
   torch.compile and the ``wgmma`` variant, its default and the best of a short tune (the harness's tuner, model
   strategy, a time budget) or of a few fixed configurations, for fp32 matmul 4096^3 (3xTF32), bf16 matmul 4096^3
   and 8192^3, and the bf16 Linear + bias + GELU built-in; every kernel fully checked before it is timed;
2. the 3xTF32 plan's cost split: the pre-pass of A, of B and the GEMM, each timed alone (triton's do_bench, L2
   flushed), beside the whole plan;
3. Nsight Compute (``--clock-control none``) on the fp32 and bf16 matmul kernels: tensor pipe active and the top
   stalls;

and prints a table last. ``--out DIR`` also writes every number as JSON there. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.gpu.profile import ProfileRequest, find_ncu, run_ncu
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.spec import plan
from kerngen.harness.tune.tuner import tune
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef


def build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)

# (label, problem, which baseline the target is against, target ratio, tune minutes, fixed configurations)
CASES = [
    ("matmul fp32 4096^3 (3xTF32)", ProblemRef(source="matmul"), "eager", 1.6, 0.6,
     [{"FLUSH": 0}, {"FLUSH": 0, "BN": 256, "STAGES": 2}, {"FLUSH": 0, "WGM": 2, "BN": 128, "STAGES": 2}]),
    ("matmul bf16 4096^3", ProblemRef(source="matmul", dtype="bfloat16"), "eager", 0.9, 0.6,
     [{"WGM": 2, "BN": 128}, {"STAGES": 3}, {"GROUP_M": 16}]),
    ("matmul bf16 8192^3", ProblemRef(source="matmul", shape=(8192,), dtype="bfloat16"), "eager", 0.9, 0.0,
     [{}, {"WGM": 2, "BN": 128}, {"STAGES": 3}, {"GROUP_M": 16}, {"WGM": 2, "BN": 128, "GROUP_M": 16}]),
    ("linear+bias+gelu bf16 8192x8192x2048", ProblemRef(source="linear_gelu"), "compile", 1.1, 0.0,
     [{}, {"WGM": 2, "BN": 128}, {"STAGES": 3}, {"GROUP_M": 16}, {"BN": 128}]),
]
CHECK = dict(seeds=2, budget_ms=60.0, timeout_s=90.0)


def _spec(ref: ProblemRef):
    m = explain(load_problem(ref))
    return m, build(m, "wgmma")


def measure(pool: WorkerPool, case: tuple) -> dict:
    """Baseline (eager, torch.compile) and the default and fixed configurations, side by side."""
    label, ref, against, target, _, fixed = case
    m, spec = _spec(ref)
    t0 = time.monotonic()
    base = pool.baseline(ref, budget_ms=100.0, with_compile=True)
    row = {"label": label, "eager_ms": base.eager.median_ms,
           "compile_ms": base.compiled.median_ms if base.compiled else None, "against": against, "target": target}
    results = pool.evaluate(ref, [Candidate(spec=spec, config=c) for c in [{}, *fixed]], EvalOptions(**CHECK))
    row["tried"] = [{"config": r.config, "ms": r.ms, "verdict": r.verdict.value, "why": "" if r.ok else r.message[:200]}
                    for r in results]
    row["default_ms"] = results[0].ms
    row["default_verdict"] = f"{results[0].verdict.value} {results[0].message}"[:300]
    _best(row)
    print(f"{label}: eager {row['eager_ms']:.4f} ms, compile {row['compile_ms']}, default {row['default_ms']:.4f} "
          f"({row['default_verdict'][:160]}), best {row['best_ms']} at {row['best_config']} "
          f"[{time.monotonic() - t0:.0f} s]", flush=True)
    return row


def _best(row: dict) -> None:
    ok = [t for t in row["tried"] if t["ms"] != float("inf")]
    best = min(ok, key=lambda t: t["ms"]) if ok else None
    row["best_config"], row["best_ms"] = (best["config"], best["ms"]) if best else (None, None)


def tune_more(pool: WorkerPool, case: tuple, row: dict, minutes: float) -> None:
    """The harness's tuner (model strategy) for ``minutes`` more; its configurations join the row's."""
    label, ref = case[0], case[1]
    _, spec = _spec(ref)
    info = load_problem(ref).info
    tuned = tune(pool, ref, spec, sizes=info.sizes, tensors=info.tensor_facts(), gpu=pool.gpu_facts(),
                 strategy="model", max_evals=64, minutes=minutes, options=EvalOptions(**CHECK))
    row["tried"] += [{"config": t.config, "ms": t.ms, "verdict": t.result.verdict.value if t.result else "-",
                      "why": ""} for t in tuned.evaluated]
    _best(row)
    print(f"{label}: tuned {len(tuned.evaluated)} configurations in {tuned.seconds:.0f} s, best {row['best_ms']} at "
          f"{row['best_config']}", flush=True)


def prep_split(ref: ProblemRef, config: dict | None) -> dict:
    """The 3xTF32 plan's launches timed alone and together (in this process, do_bench with L2 flushed)."""
    from triton.testing import do_bench

    p = load_problem(ref)
    m, spec = _spec(ref)
    a, b = p.make_inputs("cuda", 0)
    out = torch.empty(a.shape[0], b.shape[1], device="cuda")
    tensors = {"A": a, "B": b, "out": out}
    facts = {k: TensorFacts(tuple(v.shape)) for k, v in tensors.items()}
    resolved = plan.resolve(spec, sizes={}, tensors=facts, config=config or {})
    for s in resolved.scratch:
        tensors[s.name] = torch.empty(s.size, device="cuda", dtype=getattr(torch, s.dtype))
    major, minor = torch.cuda.get_device_capability()
    compiled = compile_job(job_for(spec, resolved, f"sm_{major}{minor}"), cache=None)
    module = LoadedModule(compiled.cubin, sorted({launch.kernel for launch in resolved.launches}))
    stream = torch.cuda.current_stream()
    whole = PlanRunner(module, resolved, tensors, stream)
    parts = [PlanRunner(module, resolved.model_copy(update={"steps": [s]}), tensors, stream) for s in resolved.steps]
    whole()
    torch.cuda.synchronize()
    ms = {"whole": do_bench(whole, rep=100)}
    for name, runner in zip(("prep_a", "prep_b", "gemm"), parts):
        ms[name] = do_bench(runner, rep=100)
    ms["prep_share"] = (ms["prep_a"] + ms["prep_b"]) / ms["whole"]
    print(f"3xTF32 plan split at {config}: {json.dumps({k: round(v, 4) for k, v in ms.items()})}", flush=True)
    return ms


def profile(ref: ProblemRef, config: dict | None) -> dict:
    ncu = find_ncu()
    if ncu is None:
        return {"error": "no ncu on this host"}
    m, spec = _spec(ref)
    resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config or {})
    major, minor = torch.cuda.get_device_capability()
    compiled = compile_job(job_for(spec, resolved, f"sm_{major}{minor}"), cache=None)
    req = ProfileRequest(problem=ref, plan=resolved, cubin_b64=ProfileRequest.encode(compiled.cubin))
    outcome = run_ncu(ncu, req, device="0", arch=f"sm_{major}{minor}", timeout_s=100.0)
    if outcome.error:
        return {"error": outcome.error}
    main = [k for k in outcome.profiles if k.name.startswith("gemm_wgmma") and "prep" not in k.name]
    lines = {k.name: k.line() for k in outcome.profiles}
    print(f"ncu {ref.label()} {config}: " + " | ".join(f"{n}: {line}" for n, line in lines.items()), flush=True)
    k = main[0] if main else outcome.profiles[0]
    return {"kernel": k.name, "tensor_pct": k.tensor_pct, "sm_pct": k.sm_pct, "l2_pct": k.l2_pct,
            "dram_pct": k.dram_pct, "stalls": [(s.reason, round(s.pct, 1)) for s in k.stalls], "lines": lines}


def table(rows: list[dict], split: dict | None, profiles: dict) -> str:
    out = ["", "| problem | eager (cuBLAS) ms | torch.compile ms | wgmma default ms | wgmma best ms | best vs target "
           "baseline | target | met |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref_ms = r["eager_ms"] if r["against"] == "eager" else r["compile_ms"]
        ratio = ref_ms / r["best_ms"] if r["best_ms"] and ref_ms else None
        shown = f"{ratio:.2f}x {r['against']}" if ratio else "-"
        met = "yes" if ratio and ratio >= r["target"] else "no"
        comp = f"{r['compile_ms']:.4f}" if r["compile_ms"] else "-"
        best = f"{r['best_ms']:.4f} {r['best_config']}" if r["best_ms"] else "none correct"
        out.append(f"| {r['label']} | {r['eager_ms']:.4f} | {comp} | {r['default_ms']:.4f} | {best} | {shown} | "
                   f">= {r['target']}x | {met} |")
    if split:
        out.append(f"3xTF32 cost split (ms): pre-pass A {split['prep_a']:.4f}, B {split['prep_b']:.4f}, GEMM "
                   f"{split['gemm']:.4f}, whole plan {split['whole']:.4f} (pre-pass {100 * split['prep_share']:.1f}%)")
    for label, prof in profiles.items():
        if "error" in prof:
            out.append(f"ncu {label}: {prof['error']}")
        else:
            out.append(f"ncu {label}: tensor pipe {prof['tensor_pct']}% active, SM {prof['sm_pct']}%, L2 "
                       f"{prof['l2_pct']}%, DRAM {prof['dram_pct']}%; top stalls {prof['stalls']}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cases", default="0,1,2,3", help="which CASES, by index")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip the short tunes past this")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"needs an sm_90 GPU; this is {torch.cuda.get_device_name()}", file=sys.stderr)
        return 1
    rows, cases = [], [CASES[int(x)] for x in args.cases.split(",")]
    split, profiles = None, {}
    with WorkerPool(timeout_s=600) as pool:
        print(f"GPU: {pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        for case in cases:
            try:
                rows.append(measure(pool, case))
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                print(f"{case[0]}: failed: {type(exc).__name__}: {exc}", flush=True)
        by_label = {r["label"]: r for r in rows}
        for case in cases:
            row = by_label.get(case[0])
            left = (deadline - time.monotonic()) / 60 - 1.5  # keep ~90 s for the split and ncu
            if row is not None and case[4] > 0 and left > 0.2:
                try:
                    tune_more(pool, case, row, min(case[4], left))
                except Exception as exc:  # noqa: BLE001
                    print(f"{case[0]}: tune failed: {type(exc).__name__}: {exc}", flush=True)
    best = {r["label"]: r["best_config"] for r in rows}
    try:
        split = prep_split(CASES[0][1], best.get(CASES[0][0]))
    except Exception as exc:  # noqa: BLE001
        print(f"cost split failed: {type(exc).__name__}: {exc}", flush=True)
    for case in CASES[:2]:
        try:
            profiles[case[0]] = profile(case[1], best.get(case[0]))
        except Exception as exc:  # noqa: BLE001
            profiles[case[0]] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i35_bench.json").write_text(json.dumps({"rows": rows, "split": split, "ncu": profiles},
                                                            indent=1, default=str))
    print(table(rows, split, profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
