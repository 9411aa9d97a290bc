#!/usr/bin/env bash
# Issue 33 on the GPU host (after `source scripts/device/setup.sh`):  bash scripts/device/i33e.sh NUM...
# For KernelBench level-2 files NUM... (e.g. 8 89): `kerngen generate --minutes 0.4`, then `kerngen suite`, which
# times each run's best kernel beside its exported op: does "the exported op's output differs" (or an illegal
# instruction) come back? Its cause, op_bench's runners launching into scratch freed under them, was found on an
# H200 on 2026-11-28 (docs/measurements/2026-11-28-h200-b.md). Results: $OUT/i33e-gen.txt, $OUT/i33e-suite.txt.
set -u
OUT=${OUT:-/tmp/i33e-out}
KB=${KB:-shared/kernelbench}
[ -d "$KB" ] || KB=../shared/kernelbench
dir=/tmp/i33e-files-$$ runs=/tmp/i33e-runs-$$
mkdir -p "$OUT" "$dir" "$runs"
for n in "$@"; do cp "$KB"/level2/${n}_*.py "$dir/"; done
timeout 300 env COLUMNS=200 kerngen generate "$dir" --proposer playbook --minutes 0.4 --runs-dir "$runs" > "$OUT/i33e-gen.txt" 2>&1
echo "generate rc=$?"
timeout 150 env COLUMNS=200 kerngen suite "$dir" --runs-dir "$runs" --budget-ms 100 > "$OUT/i33e-suite.txt" 2>&1
echo "suite rc=$?; op warnings: $(grep -ciE 'differs|illegal' "$OUT/i33e-suite.txt")"
grep -iE "differs|illegal" "$OUT/i33e-suite.txt" | cut -c1-220
