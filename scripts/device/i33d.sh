#!/usr/bin/env bash
# Issue 33, the defect found on 4x H200 (2026-11-28): for conv-led "regions" specs of KernelBench level 2 (6, 8, 23,
# 27, 72, 74, 79) `kerngen suite` warned that the exported op's output differs from its kernel's on the same inputs,
# and for 11 and 13 the op path hit "CUDA error: an illegal instruction". This script tells which variants do it:
# every regions variant of those files at its default configuration through `kerngen bench --kernel` (the harness's
# check, then the exported op timed beside the kernel on the same inputs: "ok" or "differs" in the op row).
# From the repository root, after `source scripts/device/setup.sh`:
#   bash scripts/device/i33d.sh [FILES...]      (default: 8 13 23 6 11; each variant in its own process)
# Results under $OUT: i33d-<file>-<variant>.txt, and i33d-table.txt (printed last). About 40 s a variant.
set -u
OUT=${OUT:-/tmp/i33d-out}
mkdir -p "$OUT/specs"
KB=${KB:-/work/shared/kernelbench}
[ -d "$KB" ] || KB=../shared/kernelbench
[ -d "$KB" ] || KB=shared/kernelbench
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(8 13 23 6 11)
rows=("| file | variant | check | op |" "|---|---|---|---|")
for n in "${FILES[@]}"; do
  f=$(ls "$KB"/level2/${n}_*.py | head -1)
  python3 - "$f" "$OUT/specs/$n" <<'PY'
import sys
from pathlib import Path
from kerngen.agent.playbook import seed_specs
from kerngen.problems.load import load_problem
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
for s in seed_specs(load_problem(sys.argv[1])):
    if s.origin is not None and s.origin.family == "regions":
        (out / f"{s.origin.variant}.json").write_text(s.model_dump_json())
PY
  for spec in "$OUT/specs/$n"/*.json; do
    [ -f "$spec" ] || continue
    v=$(basename "$spec" .json)
    log="$OUT/i33d-$n-$v.txt"
    timeout "${KG_VARIANT_S:-150}" env COLUMNS=200 kerngen bench "$f" --kernel "$spec" --no-compile --budget-ms 50 > "$log" 2>&1
    check=$(grep -m1 -oE "kernel[^|]*\| *(ok|incorrect|[a-z_]+)" "$log" | tail -1 | tr -s ' ' | cut -c1-60)
    op=$(grep -m1 -E "exported op" "$log" | tr -s ' ' | cut -c1-120)
    rows+=("| $n | $v | ${check:-see log} | ${op:-see log (exit $?)} |")
    echo "[i33d $(date -u +%T)] $n $v done"
  done
done
printf '%s\n' "${rows[@]}" | tee "$OUT/i33d-table.txt"
