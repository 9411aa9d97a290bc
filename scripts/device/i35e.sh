#!/usr/bin/env bash
# Issue 35, the stores staged through shared memory (EPI_SMEM) in the Hopper GEMM core, on one H100/H200, from the
# repository root after `source scripts/device/setup.sh`:
#   bash scripts/device/i35e.sh tests   the GPU tiers of the core and its modes (tests/agent/test_gpu_gemm_wgmma*.py)
#   bash scripts/device/i35e.sh bench   1. `kerngen generate linear_gelu` (the bf16 Linear + bias + GELU, 8192 x 8192
#                                          x 2048) with the playbook, then `kerngen bench linear_gelu --kernel` its best
#                                          spec: eager, torch.compile, the kernel and the exported op's path side by side;
#                                       2. scripts/device/i35d_bench.py --square: the core's modes on bf16 matmul 4096^3,
#                                          8192^3 and the GEMM alone / + bias / + bias + GELU at 8192 x 8192 x 2048.
# Everything lands under $OUT; the tables come last.
set -u
OUT=${OUT:-/tmp/i35e_out}
mkdir -p "$OUT"
start=$(date +%s)
case "${1:-}" in
tests)
  timeout "${KG_TEST_S:-420}" python3 -m pytest -q -m gpu -s -p no:cacheprovider --timeout 300 \
    tests/agent/test_gpu_gemm_wgmma_modes.py tests/agent/test_gpu_gemm_wgmma.py > "$OUT/i35e_tests.txt" 2>&1
  echo "pytest exit $? after $(( $(date +%s) - start )) s"
  grep -E "configurations pass|^(FAILED|ERROR)|passed|failed|Error" "$OUT/i35e_tests.txt" | cut -c1-300 | tail -40
  ;;
bench)
  timeout 200 env COLUMNS=200 kerngen generate linear_gelu --proposer playbook --minutes 2 --runs-dir /tmp/rlg \
    > "$OUT/lg-generate.txt" 2>&1
  echo "generate rc=$? after $(( $(date +%s) - start )) s"
  best=$(ls -d /tmp/rlg/*/best 2>/dev/null | head -1)
  timeout 150 env COLUMNS=200 kerngen bench linear_gelu --kernel "$best/spec.json" > "$OUT/lg-bench.txt" 2>&1
  echo "bench rc=$? after $(( $(date +%s) - start )) s"
  tar czf "$OUT/rlg.tgz" -C /tmp rlg 2>/dev/null
  timeout 220 python3 scripts/device/i35d_bench.py --out "$OUT" --budget-s 170 --square > "$OUT/i35d_bench.txt" 2>&1
  echo "i35d bench rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^best|^status|^spent" "$OUT/lg-generate.txt" | cut -c1-200
  cut -c1-200 "$OUT/lg-bench.txt" | tail -22
  grep -vE "^\|" "$OUT/i35d_bench.txt" | cut -c1-300 | tail -22
  grep -E "^\|" "$OUT/i35d_bench.txt"
  ;;
*) echo "usage: i35e.sh tests|bench" >&2; exit 2 ;;
esac
