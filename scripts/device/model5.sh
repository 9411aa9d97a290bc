#!/usr/bin/env bash
# model5 (issue 34's benchmark): one whole model at the issue's budget on one GPU.
# From the repository root, after `source scripts/device/setup.sh`:   bash scripts/device/model5.sh MODEL [MINUTES]
# `kerngen generate problems/models/MODEL.py --as-model --minutes MINUTES` (default 5: "at most 5 minutes a model";
# offline playbook, true fp32), then its region table (scripts/device/model_table.py). Results under $OUT:
# model5-MODEL-gen.txt, model5-MODEL-table.txt (printed last). MINUTES x 60 + ~2 min on one H100/H200.
set -u
M=$1
MIN=${2:-5}
OUT=${OUT:-/tmp/model5-out}
mkdir -p "$OUT"
RUNS=/tmp/model5-runs
mkdir -p "$RUNS"
echo "[model5 $(date -u +%T)] kerngen generate problems/models/$M.py --as-model --minutes $MIN"
kerngen generate "problems/models/$M.py" --as-model --minutes "$MIN" --runs-dir "$RUNS" > "$OUT/model5-$M-gen.txt" 2>&1
echo "  rc=$?"
python3 scripts/device/model_table.py "$RUNS" "$M" > "$OUT/model5-$M-table.txt" 2>&1
echo "[model5 $(date -u +%T)] table"
cat "$OUT/model5-$M-table.txt"
