#!/usr/bin/env bash
# i34m (the lstm family): nn.LSTM as kerngen kernels in a model plan, on the GPU.
# From the repository root, after `source scripts/device/setup.sh`: bash scripts/device/i34m.sh
# 1. the recurrences against cuDNN at problems/models/lstm.py's size (scripts/device/i40l_bench.py: every variant at
#    its default and splitk at a sweep of configurations, region and recurrence ms, us a step), at most 90 s;
# 2. the GPU tests of the lstm family (tests/agent/test_gpu_fam_lstm.py: every offered variant through the harness at
#    problems/models/lstm.py's size and at an odd sequence-first size, splitk at more configurations at both; the
#    model's plan end to end), at most 130 s;
# 3. `kerngen generate problems/models/lstm.py --as-model --minutes 1`, at most 120 s.
# Under 6 minutes on one H100/H200. Results under $OUT: i34m-bench.txt (+ .json), i34m-gpu.txt, i34m-gen.txt,
# i34m-table.txt (the run's region table, correct end to end, share of eager time on kerngen kernels, eager / compile /
# kerngen ms); printed last: that table, then the recurrences' table.
set -u
OUT=${OUT:-/tmp/i34m-out}
mkdir -p "$OUT"
RUNS=/tmp/i34m-runs
rm -rf "$RUNS" && mkdir -p "$RUNS"

echo "[i34m $(date -u +%T)] the recurrences against cuDNN"
timeout "${KG_BENCH_S:-90}" python3 scripts/device/i40l_bench.py --out "$OUT/i34m-bench.json" > "$OUT/i34m-bench.txt" 2>&1
echo "  rc=$?"

echo "[i34m $(date -u +%T)] GPU tests"
timeout "${KG_TESTS_S:-130}" python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/agent/test_gpu_fam_lstm.py \
  > "$OUT/i34m-gpu.txt" 2>&1
echo "  rc=$?"; tail -5 "$OUT/i34m-gpu.txt"

echo "[i34m $(date -u +%T)] kerngen generate problems/models/lstm.py --as-model --minutes 1"
timeout "${KG_MODEL_S:-120}" kerngen generate problems/models/lstm.py --as-model --minutes 1 --runs-dir "$RUNS" \
  > "$OUT/i34m-gen.txt" 2>&1
echo "  rc=$?"; tail -8 "$OUT/i34m-gen.txt" | cut -c1-240

python3 scripts/device/model_table.py "$RUNS" lstm > "$OUT/i34m-table.txt" 2>&1
echo "[i34m $(date -u +%T)] table"
cat "$OUT/i34m-table.txt"
echo "[i34m $(date -u +%T)] the recurrences (i34m-bench.txt)"
sed -n '/^| recurrence/,$p' "$OUT/i34m-bench.txt" | grep . || tail -5 "$OUT/i34m-bench.txt"
