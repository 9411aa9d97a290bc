#!/usr/bin/env bash
# i34v (conv_relu_maxpool on the tensor cores) on the GPU host, from the repository root after
# `source scripts/device/setup.sh`. Under 4 minutes on one H100/H200:
#   1. tests/agent/test_gpu_fam_conv_pool.py: wgmma_pool and tf32x3_pool through the harness at the suite's size and
#      at the VGG-style model's two pool regions' sizes (i34v-gpu.txt);
#   2. `kerngen generate problems/models/vgg_stack.py --as-model --minutes 0.75` (offline playbook, true fp32): the
#      region table (which variant each region chose, kernel vs PyTorch ms) and the end-to-end figures (i34v-gen.txt),
#      printed last.
set -u
OUT=${OUT:-/tmp/i34v-out}
mkdir -p "$OUT"
RUNS=/tmp/i34v-runs
mkdir -p "$RUNS"
echo "[i34v $(date -u +%T)] GPU tests"
timeout 120 python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/agent/test_gpu_fam_conv_pool.py \
  > "$OUT/i34v-gpu.txt" 2>&1
echo "  tests rc=$?: $(tail -1 "$OUT/i34v-gpu.txt")"
grep -E "^(FAILED|ERROR)" "$OUT/i34v-gpu.txt" | head -5
echo "[i34v $(date -u +%T)] vgg_stack as a model"
timeout 110 kerngen generate problems/models/vgg_stack.py --as-model --minutes 0.75 --runs-dir "$RUNS" \
  > "$OUT/i34v-gen.txt" 2>&1
echo "  generate rc=$?"
tail -40 "$OUT/i34v-gen.txt"
