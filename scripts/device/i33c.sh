#!/usr/bin/env bash
# i33c (issue 33, item 5): plain TF32 from the playbook at --precision tf32, on one GPU.
# From the repository root, after `source scripts/device/setup.sh`:   bash scripts/device/i33c.sh
# Under 3 minutes on one H100:
#   1. the GPU tests: the TERMS 1 kernel the playbook offers at tf32 passes there and is rejected at true fp32,
#      TERMS 3 of the same spec passes true fp32 (tf32x3 and wgmma matmul, wgmma conv_epi)          <= 100 s
#   2. matmul 4096^3 at --precision tf32, side by side in one worker: the offered tf32x3 / wgmma specs at
#      TERMS 1 and TERMS 3, and PyTorch's own TF32 matmul (cuBLAS), each checked at tf32          <= 70 s
# Results come back under $OUT: i33c-tests.txt, i33c-table.txt (the table is printed last).
set -u
OUT=${OUT:-/tmp/i33c-out}
mkdir -p "$OUT"
log() { echo "[i33c $(date -u +%T)] $*"; }

log "1/2 GPU tests"
timeout 100 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/agent/test_gpu_tf32_terms.py \
  > "$OUT/i33c-tests.txt" 2>&1
echo "pytest exit $?" >> "$OUT/i33c-tests.txt"
grep -E "TERMS|passed|failed|error|skipped|exit" "$OUT/i33c-tests.txt" | tail -12

log "2/2 matmul 4096 at --precision tf32"
timeout 70 python3 - > "$OUT/i33c-table.txt" 2>&1 <<'EOF'
import torch

from kerngen.agent.playbook.proposer import PlaybookProposer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

ref = ProblemRef(source="matmul", precision="tf32")  # 4096^3
prop = PlaybookProposer(load_problem(ref))
hopper = torch.cuda.get_device_capability() == (9, 0)
rows = []  # (what, config, candidate)
for variant in ("tf32x3", "wgmma") if hopper else ("tf32x3",):
    spec = prop.offer.get(variant).spec
    configs = [{"TERMS": 1}, {"TERMS": 3}]
    if variant == "wgmma":  # TERMS 1 halves the ring's bytes: deeper rings fit (untuned; the tuner's to pick)
        configs += [{"TERMS": 1, "STAGES": 5}, {"TERMS": 1, "BK": 64, "STAGES": 3}]
    for cfg in configs:
        try:
            plan.resolve(spec, sizes={}, tensors=prop.match.tensor_facts(), config=cfg)
        except Exception as exc:  # noqa: BLE001 - not admissible at this shape: say so
            print(f"{variant} {cfg}: not admissible ({exc})")
            continue
        rows.append((variant, cfg, Candidate(spec=spec, config=cfg)))
with WorkerPool(timeout_s=300) as pool:
    base = pool.baseline(ref, budget_ms=200, with_compile=False)
    results = pool.evaluate(ref, [c for _, _, c in rows], EvalOptions(seeds=1, bench=True, budget_ms=200, timeout_s=60))
    gpu = pool.gpu_facts().name
tf32_ms = base.eager_defaults.median_ms if base.eager_defaults else None
print(f"\nmatmul 4096^3 at --precision tf32 on {gpu} ({base.tolerance.note() if base.tolerance else ''})")
print(f"{'kernel':<34} {'ms':>8} {'vs torch TF32':>14}  check")
print(f"{'torch fp32 (TF32 off, cuBLAS)':<34} {base.eager.median_ms:8.4f} "
      f"{(tf32_ms / base.eager.median_ms) if tf32_ms else float('nan'):13.2f}x  reference of the default")
if tf32_ms:
    print(f"{'torch TF32 (' + base.defaults_label[:20] + ')':<34} {tf32_ms:8.4f} {1.0:13.2f}x  reference at tf32")
for (variant, cfg, _), res in zip(rows, results):
    ms = res.timing.median_ms if res.timing else None
    what = f"{variant} " + ",".join(f"{k}={v}" for k, v in cfg.items())
    speed = f"{tf32_ms / ms:13.2f}x" if ms and tf32_ms else f"{'-':>14}"
    print(f"{what:<34} {ms if ms else float('nan'):8.4f} {speed}  {res.verdict.value}"
          + (f": {res.message[:80]}" if not res.ok else ""))
EOF
echo "bench exit $?" >> "$OUT/i33c-table.txt"
cat "$OUT/i33c-table.txt"
