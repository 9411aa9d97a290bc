#!/usr/bin/env bash
# i34r (whole models: a model run's journal, resume and re-tune on another GPU), on the GPU host.
# From the repository root, after `source scripts/device/setup.sh`:   bash scripts/device/i34r.sh
# Runs tests/harness/test_gpu_model_resume.py (regions_resblock, small size, torch.compile left out; at most 180 s):
# a model run stopped by Ctrl-C in its second region, resumed (the finished region not searched again, the cut one
# going on from its journaled tries), correct end to end; `replay --tune` of it (each kernel region tuned again from
# its recorded variant and configuration), correct end to end. Results under $OUT: i34r-gpu.txt (the tests' output,
# with each region's progress lines), i34r-table.txt (printed last: each test and its result).
set -u
OUT=${OUT:-/tmp/i34r-out}
mkdir -p "$OUT"
echo "[i34r $(date -u +%T)] GPU tests: resume and replay --tune of a model run"
timeout "${KG_TESTS_S:-180}" python3 -m pytest -q -rA -s -m gpu -p no:cacheprovider tests/harness/test_gpu_model_resume.py \
  > "$OUT/i34r-gpu.txt" 2>&1
echo "  rc=$?"
{
  echo "| test | result |"
  echo "|---|---|"
  grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' "$OUT/i34r-gpu.txt" | sed -E 's/^([A-Z]+) [^:]*::([^ ]*).*/| \2 | \1 |/'
  grep -E '^changed:' "$OUT/i34r-gpu.txt" | head -1 | sed -E 's/^/| replay --tune, regions whose kernel changed | /; s/$/ |/'
} > "$OUT/i34r-table.txt"
tail -3 "$OUT/i34r-gpu.txt"
cat "$OUT/i34r-table.txt"
