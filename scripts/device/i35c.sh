#!/usr/bin/env bash
# Issue 35, ping-pong consumers (PINGPONG) and thread-block clusters with TMA multicast (CLUSTER) in the Hopper GEMM
# core, on one H100/H200, from the repository root, after
#   source scripts/device/setup.sh
# 1. the GPU tests: tests/agent/test_gpu_gemm_wgmma_modes.py (odd M, N, K, batched, transposed, masked, fused,
#    split-K, bf16 / fp16 / 3xTF32, each mode alone and both; the launcher's cluster check);
# 2. scripts/device/i35c_bench.py: eager (cuBLAS), torch.compile and the wgmma kernel at its default, PINGPONG=1,
#    CLUSTER=2 and both, side by side in one worker pool: bf16 matmul 4096^3 and 8192^3, bf16 Linear + bias + GELU,
#    fp32 matmul 4096^3 (3xTF32).
# Everything lands under $OUT (two text logs and one JSON); the table comes last. At most ~4.7 minutes (150 s of
# tests, 130 s of benchmarks, which start no case past 100 s).
set -u
OUT=${OUT:-/tmp/i35c_out}
mkdir -p "$OUT"
start=$(date +%s)
echo "== GPU tests"
timeout 150 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/agent/test_gpu_gemm_wgmma_modes.py \
  > "$OUT/i35c_tests.txt" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s"
grep -E "configurations pass|^(FAILED|ERROR)|passed|failed|Error" "$OUT/i35c_tests.txt" | cut -c1-400 | tail -30
echo "== benchmarks"
timeout 130 python3 scripts/device/i35c_bench.py --out "$OUT" --budget-s 100 > "$OUT/i35c_bench.txt" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\|" "$OUT/i35c_bench.txt" | cut -c1-400 | tail -24
grep -E "^\|" "$OUT/i35c_bench.txt"
