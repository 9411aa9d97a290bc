#!/usr/bin/env bash
# Split-K for the wgmma convolution (issues 35 and 34) on one H200/H100, from the repository root, after
#   source scripts/device/setup.sh
# 1. the GPU tests: tests/agent/test_gpu_conv_wgmma_splitk.py (ResNet18 layer3/layer4 conv + BN [+ add] + ReLU at
#    SPLIT_K 1-8, an odd shape with bias + BN + add + ReLU, bf16) and the existing wgmma conv tests (the one-launch
#    path, unchanged) — each pytest time-boxed;
# 2. scripts/device/i41k_bench.py: ResNet18's regions r12-r20 (batch 16, eval BN) as problem files: eager (true
#    fp32, cuDNN), our wgmma conv at today's default (SPLIT_K 1), the new filling default, split 2/4/8, CWG 1, every
#    kernel checked before it is timed (L2 flushed, median); torch.compile where time is left.
# Under 5 minutes; results under $OUT (logs, JSON); the table comes last.
set -u
OUT=${OUT:-/tmp/i41k_out}
mkdir -p "$OUT"
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
echo "== 1. GPU tests"
timeout --signal=INT 75 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=60 \
  tests/agent/test_gpu_conv_wgmma_splitk.py > "$OUT/i41k_tests_splitk.txt" 2>&1
echo "split-K: pytest exit $? after $(since)"
timeout --signal=INT 80 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=60 \
  tests/agent/test_gpu_conv_wgmma.py -k "odd_sizes or kernelbench_conv" > "$OUT/i41k_tests_conv_wgmma.txt" 2>&1
echo "conv wgmma (one launch): pytest exit $? after $(since)"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/i41k_tests_*.txt | cut -c1-300 | tail -20
echo "== 2. ResNet18 r12-r20 side by side"
timeout 170 python3 scripts/device/i41k_bench.py --out "$OUT" --budget-s 150 > "$OUT/i41k_bench.txt" 2>&1
echo "bench exit $? after $(since)"
grep -E "^r[0-9]+: " "$OUT/i41k_bench.txt" | cut -c1-400
echo "== table ($(since))"
tail -14 "$OUT/i41k_bench.txt" | cut -c1-400
