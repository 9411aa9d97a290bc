#!/usr/bin/env bash
# Issue 40's fold redone (branch i40q) on one H100/H200, from the repository root, after
#   source scripts/device/setup.sh
# The built-in conv2d and matmul families' kernels are conv_epi's and the gemm family's again, at parity this time:
# conv2d's direct and igemm compile to main's machine code instruction for instruction (tests/agent/test_fold_parity.py
# checks it on the CPU), matmul's tiled kernel is gemm_tiled.cu.j2 with sgemm's float4 stores, one address per operand
# in its loaders (127 registers: 4 blocks of 128 threads per SM, as sgemm's 126; the first fold's 145 kept 3) and
# sgemm's commit order; the gemm family's own tiled specs get the same loaders and stores. Two parts, time-boxed
# (at most 5.6 minutes in all):
# 1. scripts/device/i40p_bench.py: main's specs (tests/data/playbook/fold_before.json.gz, main 3bec180) against this
#    tree's, both fully checked, timed in turns (old, new, new, old) twice, the best of each kept: the built-ins'
#    rows (the gate: new / old <= 1.01), level 1's 8 (simple -> tiled), three rows whose code is unchanged (matmul
#    tf32x3 and wgmma, conv_relu_maxpool: the bench's noise), level 1's 55 (the conv2d family's igemm tile, the
#    former code again), then files whose conv_epi igemm or gemm tiled kernel changed (the one-group folds and the
#    bias read; the loaders and stores) (no case started past 150 s);
# 2. GPU tests (pytest stopped at its box, what ran still reported): this fold's shapes (test_gpu_fold_parity.py), the
#    built-ins' every variant and idea branch (conv2d, conv_relu_maxpool, matmul), the gemm, gemm_rows and conv_epi
#    families' round-0 kernels, the 3xTF32 matmul.
# Everything lands under $OUT (logs, the bench JSON); the bench table comes last.
set -u
OUT=${OUT:-/tmp/i40q_out}
mkdir -p "$OUT"
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
CASES="matmul|tiled,conv2d_wide|igemm,conv2d_wide|direct,conv2d|igemm,conv2d|direct"
CASES+=",level1/8_Matmul_with_irregular_shapes_.py|simple,matmul|tf32x3,matmul|wgmma,conv_relu_maxpool|fused"
CASES+=",level1/55_conv_standard_2D__asymmetric_input__square_kernel.py|igemm,level2/17_Conv2d_InstanceNorm_Divide.py|igemm"
CASES+=",level2/12_Gemm_Multiply_LeakyReLU.py|tiled,level1/17_Matmul_with_transposed_B.py|tiled"
CASES+=",level1/16_Matmul_with_transposed_A.py|tiled,level1/3_Batched_matrix_multiplication.py|tiled"
CASES+=",level2/54_Conv2d_Multiply_LeakyReLU_GELU.py|igemm,level2/14_Gemm_Divide_Sum_Scaling.py|streamed"
CASES+=",level1/14_Matmul_for_upper_triangular_matrices.py|tiled"
echo "== 1. main's specs against this tree's"
timeout 200 python3 scripts/device/i40p_bench.py --before tests/data/playbook/fold_before.json.gz --cases "$CASES" \
  --rounds 2 --budget-s 150 --tag i40q --out "$OUT" > "$OUT/i40q_bench.txt" 2>&1
echo "bench exit $? after $(since)"
echo "== 2. GPU tests"
timeout --signal=INT 45 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=40 tests/agent/test_gpu_fold_parity.py \
  > "$OUT/i40q_tests_fold.txt" 2>&1
echo "fold: pytest exit $? after $(since)"
timeout --signal=INT 45 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=40 tests/agent/test_gpu_playbook.py \
  -k "conv2d or conv_relu or matmul" > "$OUT/i40q_tests_builtins.txt" 2>&1
echo "built-ins: pytest exit $? after $(since)"
timeout --signal=INT 45 python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=40 tests/agent/test_gpu_fam_gemm.py \
  tests/agent/test_gpu_fam_gemm_rows.py tests/agent/test_gpu_fam_conv_epi.py \
  tests/agent/test_gpu_tf32.py::test_3xtf32_passes_the_harness > "$OUT/i40q_tests_families.txt" 2>&1
echo "families: pytest exit $? after $(since)"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/i40q_tests_*.txt | cut -c1-300 | tail -20
echo "== table ($(since))"
tail -22 "$OUT/i40q_bench.txt" | cut -c1-260  # the table, or the cases measured before a time limit
