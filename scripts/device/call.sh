#!/usr/bin/env bash
# One device call of GPU lanes plus a mutation lane on the spare cores, from the repository root on the GPU host
# (carry [".whl", ".mut"]; the mutation lane needs .mut/, scripts/device/mutation-wheels.sh):
#   bash scripts/device/call.sh SECONDS "MUTATION ARGS" "LANE 0 COMMAND" "LANE 1 COMMAND" ...
# Lane i gets GPU i and cores 4i..4i+3 (taskset); the mutation lane (no GPU) runs scripts/device/mutation.sh
# MUT_JOBS (default 46) MUTATION ARGS on cores MUT_CORES (default 16-63: a 4-GPU host; 8-31 on a 2-GPU one), or is
# left out when MUTATION ARGS is "". Every lane stops at SECONDS (scripts/device/lanes.sh); $OUT/lanes.tgz holds
# every lane's folder. E.g. KernelBench shards and check.py's mutants on 4 GPUs:
#   LEVELS_SKIP=docs/measurements/levels-measured.txt KG_GEN_S=400 KG_SUITE_S=120 bash scripts/device/call.sh \
#     540 "--module check --budget-s 420 --no-fail" "bash scripts/device/levels.sh 0 8" ... "bash scripts/device/levels.sh 3 8"
set -u
source scripts/device/setup.sh || exit 2
limit=$1 mut=$2
shift 2
lanes=()
i=0
for c in "$@"; do
  lanes+=("taskset -c $((4 * i))-$((4 * i + 3)) bash -c $(printf %q "$c")")
  i=$((i + 1))
done
[ -n "$mut" ] && lanes+=("export CUDA_VISIBLE_DEVICES=; taskset -c ${MUT_CORES:-16-63} bash scripts/device/mutation.sh ${MUT_JOBS:-46} $mut")
OUT=/tmp/lanes LANE_TAIL=${LANE_TAIL:-14} bash scripts/device/lanes.sh "$limit" "${lanes[@]}"
tar czf "$OUT/lanes.tgz" -C /tmp lanes
