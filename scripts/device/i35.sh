#!/usr/bin/env bash
# Issue 35 (the Hopper GEMM core: wgmma + TMA) on one H100, from the repository root, after
#   source scripts/device/setup.sh
# 1. the GPU tests: tests/agent/test_gpu_gemm_wgmma.py (correctness at odd M, N, K, batched, transposed, masked,
#    fused, split-K, KernelBench files, bf16 / fp16 / 3xTF32; the error against fp64; plain TF32 rejected) and the
#    TMA descriptor tests (tests/harness/test_gpu_tensormap.py);
# 2. scripts/device/i35_bench.py: eager (cuBLAS), torch.compile and the wgmma kernel side by side (default and a
#    short tune) for fp32 matmul 4096^3, bf16 matmul 4096^3 and 8192^3, bf16 Linear + bias + GELU; the 3xTF32
#    pre-pass's cost; ncu of the fp32 and bf16 matmul kernels (--clock-control none).
# Everything lands under $OUT (two text logs and one JSON); the table comes last. At most ~7.7 minutes.
set -u
OUT=${OUT:-/tmp/i35_out}
mkdir -p "$OUT"
start=$(date +%s)
echo "== GPU tests"
timeout 190 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/harness/test_gpu_tensormap.py \
  tests/agent/test_gpu_gemm_wgmma.py > "$OUT/i35_tests.txt" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s"
grep -E "vs fp64|TERMS 1|configurations pass|^(FAILED|ERROR)|passed|failed" "$OUT/i35_tests.txt" | cut -c1-400 | tail -45
echo "== benchmarks"
timeout 270 python3 scripts/device/i35_bench.py --out "$OUT" --budget-s 225 > "$OUT/i35_bench.txt" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\|" "$OUT/i35_bench.txt" | cut -c1-600 | tail -25
grep -E "^\||^3xTF32 cost|^ncu " "$OUT/i35_bench.txt"
