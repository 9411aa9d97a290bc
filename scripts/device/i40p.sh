#!/usr/bin/env bash
# Issue 40 (the playbook made smaller) on one H100/H200, from the repository root, after
#   source scripts/device/setup.sh
# What changed kernels: conv2d's direct / igemm kernels are conv_epi's, matmul's tiled one is the gemm family's (its
# bounds-checked "simple" one is gone: the tiled GEMM predicates its edges), the 3xTF32 matmul is the gemm family's
# builder, one Chan header (layernorm, norm, conv_tail), the attention kernel on the shared Hopper PTX, one wgmma
# pre-pass store. Three parts, each time-boxed (at most 5.9 minutes in all, less when nothing hangs):
# 1. GPU tests (pytest stopped at 70 + 60 s, what ran still reported): the changed built-ins' every variant and idea
#    branch (tests/agent/test_gpu_playbook.py: conv2d, conv_relu_maxpool, matmul, layernorm); the 3xTF32 matmul and
#    its padded form, conv_tail, norm, the Hopper attention kernel and the GEMM core's KernelBench files;
# 2. scripts/device/i40p_bench.py: main's specs (i40p_before.json.gz) against this tree's, both fully checked, timed
#    in turns: matmul 4096^3 tiled, KernelBench level-1 8 (simple -> tiled), conv2d_wide direct and igemm, attention
#    wgmma, layernorm coop and split, level-2 17 (conv_tail), matmul tf32x3, conv_relu_maxpool (no case started past
#    50 s);
# 3. `kerngen generate P --minutes 0.2` for matmul and level-1 8, then `kerngen suite` over those runs.
# Everything lands under $OUT (logs, the bench JSON, one tar of the runs); the tables come last.
set -u
OUT=${OUT:-/tmp/i40p_out}
mkdir -p "$OUT"
KB=shared/kernelbench
[ -d "$KB" ] || KB=../shared/kernelbench
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
echo "== 1. GPU tests"
timeout --signal=INT 70 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=60 tests/agent/test_gpu_playbook.py \
  -k "conv2d or conv_relu or matmul or layernorm" > "$OUT/i40p_tests_builtins.txt" 2>&1
echo "built-ins: pytest exit $? after $(since)"
timeout --signal=INT 60 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=40 \
  tests/agent/test_gpu_tf32.py::test_3xtf32_passes_the_harness tests/agent/test_gpu_tf32.py::test_padded_3xtf32_passes_where_no_tile_divides \
  tests/agent/test_gpu_fam_conv_tail.py tests/agent/test_gpu_fam_norm.py \
  tests/agent/test_gpu_fam_attention.py::test_the_hopper_kernel_passes_at_a_spread_of_configurations \
  tests/agent/test_gpu_gemm_wgmma.py::test_kernelbench_files_at_their_own_size > "$OUT/i40p_tests_families.txt" 2>&1
echo "families: pytest exit $? after $(since)"
timeout --signal=INT 60 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=40 tests/agent/test_gpu_conv_wgmma.py \
  > "$OUT/i40p_tests_conv_wgmma.txt" 2>&1  # the shared wgmma pre-pass store, on the convolution core
echo "conv wgmma: pytest exit $? after $(since)"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/i40p_tests_*.txt | cut -c1-300 | tail -20
echo "== 2. before / after"
timeout 100 python3 scripts/device/i40p_bench.py --out "$OUT" --budget-s 50 > "$OUT/i40p_bench.txt" 2>&1
echo "bench exit $? after $(since)"
echo "== 3. generate + suite"
runs="$OUT/runs"
problems=(matmul "$KB/level1/8_Matmul_with_irregular_shapes_.py")
for p in "${problems[@]}"; do
  timeout 40 kerngen generate "$p" --minutes 0.2 --runs-dir "$runs" > "$OUT/gen_$(basename "$p" .py).txt" 2>&1
  echo "generate $(basename "$p"): exit $? after $(since)"
done
timeout 45 kerngen suite "${problems[@]}" --runs-dir "$runs" --no-compile --budget-ms 100 > "$OUT/i40p_suite.txt" 2>&1
echo "suite exit $? after $(since)"
tar -cf "$OUT/i40p_runs.tar" -C "$OUT" runs 2>/dev/null && rm -rf "$runs"
echo "== tables ($(since))"
tail -20 "$OUT/i40p_suite.txt" | cut -c1-220
tail -16 "$OUT/i40p_bench.txt" | cut -c1-260  # the table, or the cases measured before a time limit
