#!/usr/bin/env bash
# Issue 33 (and 34) checks after the op_bench fix (launcher.PlanRunner holds what it is bound to), on one GPU, from the
# repository root after `source scripts/device/setup.sh`:  bash scripts/device/i33f.sh   (about 8 minutes)
#   1. tests/harness/test_gpu_op_regions.py -k suites_op_timing: op_bench at the configurations the suite failed on
#   2. tests/agent/test_gpu_fam_conv_pool.py (conv_relu_maxpool wgmma_pool / tf32x3_pool through the harness)
#   3. generate + suite on level-2 8 and 89: does "the exported op's output differs" come back?
#   4. a model run (mlp, --as-model --minutes 0.3), then `kerngen replay` of it (re-checked, re-timed end to end)
# Results under $OUT (i33f-*.txt); a table last.
set -u
OUT=${OUT:-/tmp/i33f-out}
mkdir -p "$OUT"
rows=()
row() { rows+=("| $1 | $2 |"); }
timeout 150 python3 -m pytest -q -s -rA -m gpu -p no:cacheprovider tests/harness/test_gpu_op_regions.py -k suites_op_timing \
  > "$OUT/i33f-op.txt" 2>&1
row "op_bench at the suite's failing configs" "rc $? $(tail -1 "$OUT/i33f-op.txt")"
grep "^I33D" "$OUT/i33f-op.txt"
timeout 130 python3 -m pytest -q -rA -m gpu -p no:cacheprovider tests/agent/test_gpu_fam_conv_pool.py > "$OUT/i33f-pool.txt" 2>&1
row "test_gpu_fam_conv_pool.py" "rc $? $(tail -1 "$OUT/i33f-pool.txt")"
OUT="$OUT" timeout 200 bash scripts/device/i33e.sh 8 89 > "$OUT/i33f-suite-log.txt" 2>&1
cp "$OUT/i33e-suite.txt" "$OUT/i33f-suite.txt" 2>/dev/null
row "suite on 8, 89: op warnings" "$(grep -ciE 'differs|illegal' "$OUT/i33f-suite.txt") ($(grep -cE '^│ /tmp' "$OUT/i33f-suite.txt") rows)"
rm -f "$OUT/i33e-gen.txt" "$OUT/i33e-suite.txt"
RUNS=/tmp/i33f-runs
timeout 120 kerngen generate problems/models/mlp.py --as-model --minutes 0.3 --runs-dir "$RUNS" > "$OUT/i33f-model.txt" 2>&1
row "mlp --as-model generate" "rc $? $(grep -m1 -E 'end to end' "$OUT/i33f-model.txt" | cut -c1-150)"
last=$(ls -d "$RUNS"/*/ 2>/dev/null | tail -1)
timeout 120 kerngen replay "${last%/}" --runs-dir "$RUNS" >> "$OUT/i33f-model.txt" 2>&1
row "mlp replay" "rc $? $(grep -E 'end to end' "$OUT/i33f-model.txt" | tail -1 | cut -c1-150)"
tail -25 "$OUT/i33f-model.txt"
grep -E "warning|differs|illegal" "$OUT/i33f-suite.txt" | cut -c1-200
echo "| step | result |"; echo "|---|---|"; printf '%s\n' "${rows[@]}"
