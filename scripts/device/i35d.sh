#!/usr/bin/env bash
# Issue 35 (the bf16 Linear + bias + GELU) and issue 32's fp32 attention regions, on one H100/H200, from the
# repository root after
#   source scripts/device/setup.sh
# 1. the GPU tests of the shared-memory staged epilogue (EPI_SMEM) in tests/agent/test_gpu_gemm_wgmma_modes.py;
# 2. scripts/device/i35d_bench.py: the GEMM at 8192 x 8192 x 2048 alone, + bias, + bias + GELU, cooperative,
#    ping-pong and staged, beside eager and torch.compile;
# 3. KernelBench level1/97 (fp32 SDPA, head dim 1024): `kerngen generate` with the playbook (its regions candidates
#    beside the attention kernel) and `kerngen suite` (eager, torch.compile).
# Everything lands under $OUT; the tables come last. At most ~9 minutes.
set -u
OUT=${OUT:-/tmp/i35d_out}
mkdir -p "$OUT"
start=$(date +%s)
echo "== GPU tests (EPI_SMEM)"
timeout 150 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/agent/test_gpu_gemm_wgmma_modes.py -k "staged or erf" \
  > "$OUT/i35d_tests.txt" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s"
grep -E "configurations pass|^(FAILED|ERROR)|passed|failed|Error" "$OUT/i35d_tests.txt" | cut -c1-400 | tail -20
echo "== benchmarks"
timeout 200 python3 scripts/device/i35d_bench.py --out "$OUT" --budget-s 150 ${BENCH_ARGS:-} > "$OUT/i35d_bench.txt" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
echo "== level1/97"
f=shared/kernelbench/level1/97_ScaledDotProductAttention.py
timeout 130 env COLUMNS=200 kerngen generate "$f" --proposer playbook --minutes 1.5 --runs-dir /tmp/r97 \
  > "$OUT/l97-generate.txt" 2>&1
echo "generate rc=$? after $(( $(date +%s) - start )) s"
timeout 100 kerngen suite "$f" --runs-dir /tmp/r97 --budget-ms 100 --json > "$OUT/l97-suite.json" 2> "$OUT/l97-suite.err"
echo "suite rc=$? after $(( $(date +%s) - start )) s"
tar czf "$OUT/r97.tgz" -C /tmp r97 2>/dev/null
tail -25 "$OUT/l97-generate.txt" | cut -c1-220
python3 scripts/levels_merge.py "$OUT/l97-suite.json" 2>&1 | tail -6
grep -vE "^\|" "$OUT/i35d_bench.txt" | cut -c1-300 | tail -16
grep -E "^\|" "$OUT/i35d_bench.txt"
