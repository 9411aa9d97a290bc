#!/usr/bin/env bash
# Issue 35: the space-to-depth convolution (conv_wgmma_s2d.cu.j2, variant wgmma_s2d) on one H100/H200, from the
# repository root, after
#   source scripts/device/setup.sh
#   bash scripts/device/i35f.sh tests   # its GPU tests (odd sizes, strides 1-4, 16-bit, conv1d; the error vs fp64)
#   bash scripts/device/i35f.sh bench   # scripts/device/i35b_bench.py cases 4-5: s2d beside the gathered wgmma conv
#   bash scripts/device/i35f.sh user    # the user's path: generate conv2d, kerngen bench its best, op_retime.py
# Logs under $OUT; the short table last.
set -u
OUT=${OUT:-/tmp/i35f_out}
mkdir -p "$OUT"
start=$(date +%s)
case "${1:-tests}" in
tests)
  timeout 300 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/agent/test_gpu_conv_wgmma.py \
    -k "${2:-space_to_depth}" > "$OUT/i35f_tests.txt" 2>&1
  echo "pytest exit $? after $(( $(date +%s) - start )) s"
  grep -E "vs fp64|configurations pass|^(FAILED|ERROR)|passed|failed|Error" "$OUT/i35f_tests.txt" | cut -c1-600 | tail -40
  ;;
bench)
  timeout 290 python3 scripts/device/i35b_bench.py --out "$OUT" --cases "${2:-4,5}" --budget-s 240 \
    > "$OUT/i35f_bench.txt" 2>&1
  echo "bench exit $? after $(( $(date +%s) - start )) s"
  grep -vE "^\|" "$OUT/i35f_bench.txt" | cut -c1-700 | tail -20
  grep -E "^\|" "$OUT/i35f_bench.txt"
  ;;
user)
  rm -rf runs/i35f
  timeout 150 kerngen generate conv2d --proposer playbook --minutes "${2:-1}" --runs-dir runs/i35f > "$OUT/i35f_gen.txt" 2>&1
  echo "generate exit $? after $(( $(date +%s) - start )) s"; tail -5 "$OUT/i35f_gen.txt"
  run=$(ls -d runs/i35f/*/ | head -1)
  timeout 150 kerngen bench conv2d --kernel "$run/best/spec.json" > "$OUT/i35f_userbench.txt" 2>&1
  echo "bench exit $? after $(( $(date +%s) - start )) s"; tail -14 "$OUT/i35f_userbench.txt"
  timeout 150 python3 scripts/device/op_retime.py "$run" > "$OUT/i35f_retime.txt" 2>&1
  echo "retime exit $? after $(( $(date +%s) - start )) s"; tail -12 "$OUT/i35f_retime.txt"
  tar czf "$OUT/i35f_run.tgz" runs/i35f 2>/dev/null
  ;;
esac
