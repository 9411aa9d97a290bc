#!/usr/bin/env bash
# Issue 35, second part (the Hopper GEMM core under the convolutions and gemm_rows) on one H100/H200, from the
# repository root, after
#   source scripts/device/setup.sh
# 1. the GPU tests: tests/agent/test_gpu_conv_wgmma.py (the wgmma variants of conv2d / conv_epi / conv16 / conv_nd /
#    conv_tail / gemm_rows at odd sizes with epilogues, 3xTF32, bf16 and fp16, several configurations; the conv's
#    error against fp64; plain TF32 rejected on conv2d_wide);
# 2. scripts/device/i35b_bench.py: eager, torch.compile, the wgmma variant and the mma.sync one side by side for the
#    suite conv2d, KernelBench level-2 54 (fp32 and a bf16 copy) and level-2 99 (gemm_rows).
# Everything lands under $OUT (two text logs and one JSON); the table comes last. At most 7.5 minutes (200 s of
# tests, 250 s of benchmarks, which start no case past 200 s).
set -u
OUT=${OUT:-/tmp/i35b_out}
mkdir -p "$OUT"
start=$(date +%s)
echo "== GPU tests"
timeout 200 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/agent/test_gpu_conv_wgmma.py \
  > "$OUT/i35b_tests.txt" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s"
grep -E "vs fp64|TERMS 1|configurations pass|^(FAILED|ERROR)|passed|failed" "$OUT/i35b_tests.txt" | cut -c1-400 | tail -40
echo "== benchmarks"
timeout 250 python3 scripts/device/i35b_bench.py --out "$OUT" --budget-s 200 > "$OUT/i35b_bench.txt" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\|" "$OUT/i35b_bench.txt" | cut -c1-500 | tail -20
grep -E "^\|" "$OUT/i35b_bench.txt"
