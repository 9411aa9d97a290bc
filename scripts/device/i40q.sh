#!/usr/bin/env bash
# Issue 40's fold redone (branch i40q) on one H100/H200, from the repository root, after
#   source scripts/device/setup.sh
# The built-in conv2d and matmul families' kernels are conv_epi's and the gemm family's again, at parity this time:
# conv2d's direct and igemm compile to main's machine code instruction for instruction (tests/agent/test_fold_parity.py
# checks it on the CPU), matmul's tiled kernel is gemm_tiled.cu.j2 with sgemm's float4 stores, one address per operand
# in its loaders (127 registers: 4 blocks of 128 threads per SM, as sgemm's 126) and sgemm's commit order; the gemm
# family's own tiled specs get the same loaders and stores. About 5.5 minutes in all:
# 0. THIS tree's kerngen, whatever the host's editable install points at (a lane of a multi-lane call shares that
#    install with the other lanes: on 2026-11-28 this script's first run imported kerngen.agent from the device
#    copy's root, main, and measured main against main): kerngen's folders are laid out under a temporary folder
#    first on PYTHONPATH, PYTHONSAFEPATH keeps the current folder off sys.path (its ./kerngen lacks the
#    subpackages), pytest imports kerngen first (-p kerngen), the workers inherit all of it; checked before anything
#    runs, and the bench's header names the tree it imported;
# 1. alone on the GPU, scripts/device/i40p_bench.py: main's specs (tests/data/playbook/fold_before.json.gz, main
#    3bec180) against this tree's, both fully checked, timed in turns (old, new, new, old) twice, the best of each
#    kept: the built-ins' rows (the gate: new / old <= 1.01), level 1's 8 (main's simple -> this tree's tiled),
#    three rows whose code is unchanged (matmul tf32x3 and wgmma, conv_relu_maxpool: the bench's noise), level 1's
#    55, files whose conv_epi igemm or gemm tiled kernel changed; level 2's 14 streamed (a 1-in-1024 mismatch seen
#    once, in main's spec) 6 rounds: each spec on 24 input sets. No case starts past 125 s;
# 2. the GPU tests, four pytest runs side by side on the GPU (correctness only; each boxed at 150 s, what ran still
#    reported): this fold's shapes (test_gpu_fold_parity.py); the built-ins' every variant and idea branch (conv2d,
#    conv_relu_maxpool, matmul); the gemm and gemm_rows families' kernels; conv_epi's and the 3xTF32 matmul.
# Everything lands under $OUT (logs, the bench JSON); the bench table comes last.
set -u
OUT=${OUT:-/tmp/i40q_out}
mkdir -p "$OUT"
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

echo "== 0. this tree's kerngen ($PWD)"
pkgs=$(mktemp -d)
mkdir "$pkgs/kerngen"
ln -s "$PWD"/kerngen/* "$pkgs/kerngen/"
for d in agent harness problems prompts; do ln -s "$PWD/$d" "$pkgs/kerngen/$d"; done  # pyproject's package-dir
export PYTHONPATH="$pkgs${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
python3 - "$PWD" <<'EOF' || { echo "not this tree's kerngen: nothing measured"; exit 1; }
import sys
from pathlib import Path
import kerngen.agent, kerngen.harness, kerngen.problems, kerngen.agent.playbook.gemm.build_tf32 as t
root = Path(sys.argv[1]).resolve()
where = {m.__name__: Path(m.__file__).resolve() for m in (kerngen.agent, kerngen.harness, kerngen.problems, t)}
for name, path in where.items():
    print(f"{name}: {path}")
sys.exit(0 if all(p.is_relative_to(root) for p in where.values()) and hasattr(t, "TERMS_PLAIN") else 1)
EOF

echo "== 1. main's specs against this tree's ($(since))"
CASES="matmul|tiled,conv2d_wide|igemm,conv2d_wide|direct,conv2d|igemm,conv2d|direct"
CASES+=",level1/8_Matmul_with_irregular_shapes_.py|simple,level2/14_Gemm_Divide_Sum_Scaling.py|streamed*6"
CASES+=",matmul|tf32x3,matmul|wgmma,conv_relu_maxpool|fused"
CASES+=",level1/55_conv_standard_2D__asymmetric_input__square_kernel.py|igemm,level2/17_Conv2d_InstanceNorm_Divide.py|igemm"
CASES+=",level2/12_Gemm_Multiply_LeakyReLU.py|tiled,level1/17_Matmul_with_transposed_B.py|tiled"
CASES+=",level1/16_Matmul_with_transposed_A.py|tiled,level1/3_Batched_matrix_multiplication.py|tiled"
CASES+=",level2/54_Conv2d_Multiply_LeakyReLU_GELU.py|igemm,level1/14_Matmul_for_upper_triangular_matrices.py|tiled"
timeout 170 python3 scripts/device/i40p_bench.py --before tests/data/playbook/fold_before.json.gz --cases "$CASES" \
  --rounds 2 --budget-s 125 --tag i40q --out "$OUT" > "$OUT/i40q_bench.txt" 2>&1
echo "bench exit $? after $(since)"

echo "== 2. GPU tests, side by side ($(since))"
gpu_tests() {  # LABEL ARGS...: one boxed pytest run into $OUT/i40q_tests_LABEL.txt
  local label=$1; shift
  timeout --signal=INT --kill-after=10 150 python3 -m pytest -q -m gpu -p kerngen -p no:cacheprovider -o timeout=140 \
    "$@" > "$OUT/i40q_tests_$label.txt" 2>&1
  echo "$label: pytest exit $? after $(since)"
}
gpu_tests fold tests/agent/test_gpu_fold_parity.py &
gpu_tests builtins tests/agent/test_gpu_playbook.py -k "conv2d or conv_relu or matmul" &
gpu_tests gemm tests/agent/test_gpu_fam_gemm.py tests/agent/test_gpu_fam_gemm_rows.py &
gpu_tests conv_tf32 tests/agent/test_gpu_fam_conv_epi.py "tests/agent/test_gpu_tf32.py::test_3xtf32_passes_the_harness" &
wait
grep -hE "^(FAILED|ERROR)|passed|failed|no tests ran|Interrupt" "$OUT"/i40q_tests_*.txt | cut -c1-300 | tail -24
rm -rf "$pkgs"
echo "== table ($(since))"
tail -23 "$OUT/i40q_bench.txt" | cut -c1-300  # the table, or the cases measured before a time limit
