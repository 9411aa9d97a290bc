"""Issue 40 (the playbook made smaller: conv2d's and matmul's kernels are conv_epi's and gemm's, one Chan header, the
attention kernel on the shared Hopper PTX, one wgmma pre-pass store), before and after on one GPU (run by
scripts/device/i40p.sh). ``i40p_before.json.gz`` holds the specs main (f7ea679) offered for a few changed problems,
at their offered defaults; this tree builds the same problems' specs now. In one worker pool (what ``kerngen bench``
does: every kernel fully checked against PyTorch first, then timed with the L2 flushed, the median) each pair is
evaluated twice, old and new in turns (old, new, new, old), and the better time of each kept. Prints a table last;
``--out DIR`` also writes every number as JSON there. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

BEFORE = Path(__file__).with_name("i40p_before.json.gz")
# the device copy of the tree carries KernelBench inside it; a checkout has it beside
KB = next((p for p in (Path("shared/kernelbench"), Path("../shared/kernelbench")) if p.is_dir()), Path("shared/kernelbench"))
# the variant that serves an old one now (matmul's bounds-checked "simple" GEMM is the predicated "tiled" one)
NOW = {"simple": "tiled"}
# the cases of i40p_before.json.gz, the most telling first (a time limit cuts the last)
ORDER = ("matmul|tiled", "level1/8_Matmul_with_irregular_shapes_.py|simple", "conv2d_wide|direct", "conv2d_wide|igemm",
         "attention|wgmma", "layernorm|coop", "layernorm|split", "level2/17_Conv2d_InstanceNorm_Divide.py|igemm",
         "matmul|tf32x3", "conv_relu_maxpool|fused")
CHECK = dict(seeds=2, budget_ms=80.0, timeout_s=120.0)


def _problem(name: str) -> ProblemRef | str:
    return str(KB / name) if name.endswith(".py") else ProblemRef(source=name)


def measure(pool: WorkerPool, key: str, old: KernelSpec) -> dict:
    name, variant = key.split("|")
    ref = _problem(name)
    prop = PlaybookProposer(load_problem(ref))
    offered = prop.offer.get(NOW.get(variant, variant)) if prop.offer is not None else None
    if offered is None:
        return {"case": key, "error": f"{NOW.get(variant, variant)} not offered now: {prop.reason[:160]}"}
    new = offered.spec
    pref = ref if isinstance(ref, ProblemRef) else ProblemRef(source=ref)
    cands = [Candidate(spec=s) for s in (old, new, new, old)]
    results = pool.evaluate(pref, cands, EvalOptions(**CHECK))
    row = {"case": key, "old": old.name, "new": new.name}
    for tag, picks in (("old", (0, 3)), ("new", (1, 2))):
        rs = [results[i] for i in picks]
        ok = [r.ms for r in rs if r.ok]
        row[f"{tag}_ms"] = min(ok) if ok else None
        row[f"{tag}_verdict"] = "ok" if len(ok) == len(rs) else "; ".join(f"{r.verdict.value}: {r.message[:120]}"
                                                                            for r in rs if not r.ok)
    print(f"{key}: {row}", flush=True)
    return row


def table(rows: list[dict], gpu: str) -> str:
    out = ["", f"GPU: {gpu}; ms (median, L2 flushed, the better of two turns); new / old < 1.03 counts as not slower",
           "| case | old spec | old ms | new spec | new ms | new / old | both correct |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        case = r["case"].replace("|", ": ")  # a cell of the table
        if "error" in r:
            out.append(f"| {case} | - | - | - | - | - | {r['error']} |")
            continue
        o, n = r["old_ms"], r["new_ms"]
        ratio = f"{n / o:.3f}" if o and n else "-"
        ok = "yes" if r["old_verdict"] == r["new_verdict"] == "ok" else f"old {r['old_verdict']}; new {r['new_verdict']}"
        out.append(f"| {case} | {r['old']} | {o if o is None else f'{o:.4f}'} | {r['new']} | "
                   f"{n if n is None else f'{n:.4f}'} | {ratio} | {ok[:200]} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=120.0, help="start no case past this")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    before = {k: KernelSpec.model_validate(v) for k, v in json.loads(gzip.decompress(BEFORE.read_bytes())).items()}
    rows = []
    with WorkerPool(timeout_s=600) as pool:
        gpu = f"{pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        print(f"GPU: {gpu}", flush=True)
        for key in ORDER:
            old = before[key]
            if old.arch_specific and pool.gpu_facts().arch != "sm_90":
                continue
            if time.monotonic() > deadline:
                rows.append({"case": key, "error": "skipped (time budget)"})
                continue
            try:
                rows.append(measure(pool, key, old))
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                rows.append({"case": key, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i40p_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
