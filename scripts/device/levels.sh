#!/usr/bin/env bash
# KernelBench level 1 and level 2 re-measured whole (issue 32's gate), one shard per GPU lane, from the repository
# root after `source scripts/device/setup.sh`:
#   bash scripts/device/levels.sh SHARD NSHARDS [MINUTES]
# Shard SHARD of NSHARDS takes every NSHARDS-th of the 200 files (sorted by level, then number), runs
# `kerngen generate FILES --proposer playbook --minutes MINUTES` (default 0.4, as the last whole measurement) and
# `kerngen suite FILES --json` (eager and torch.compile, true fp32 and PyTorch's defaults) into
# $OUT/levels-SHARD.json. Files whose generate did not finish within the lane's time show as "no run" there.
# On 8 GPUs, 24 shards take three calls of about 9 minutes, e.g. for call C (0, 1, 2):
#   LANE_TAIL=6 bash scripts/device/lanes.sh 560 $(for g in 0 1 2 3 4 5 6 7; do echo "'bash scripts/device/levels.sh $((C*8+g)) 24'"; done)
# then, on any machine:  python scripts/levels_merge.py levels-*.json   (per level: correct, fast_1, geomeans)
# LEVELS_SKIP=FILE leaves out the files it lists (one per line, `levelN/NAME.py` or any path ending so: those measured
# in an earlier call) before the sharding, so the rest can be split anew over the lanes left.
set -u
shard=$1 n=$2 minutes=${3:-0.4}
OUT=${OUT:-/tmp/levels-out}
KB=${KB:-shared/kernelbench}
[ -d "$KB" ] || KB=../shared/kernelbench
[ -z "${LEVELS_SKIP:-}" ] || [ -r "$LEVELS_SKIP" ] || { echo "levels: LEVELS_SKIP=$LEVELS_SKIP cannot be read" >&2; exit 2; }
mkdir -p "$OUT"
runs=/tmp/levels-runs-$shard
mapfile -t all < <(for l in level1 level2; do ls "$KB/$l" | grep '\.py$' | sort -V | sed "s|^|$KB/$l/|"; done \
  | { if [ -n "${LEVELS_SKIP:-}" ]; then grep -v -F -f <(sed 's|.*/\(level[12]/\)|\1|' "$LEVELS_SKIP"); else cat; fi; })
files=()
for i in "${!all[@]}"; do (( i % n == shard )) && files+=("${all[$i]}"); done
echo "[levels $shard/$n $(date -u +%T)] ${#files[@]} files: $(for f in "${files[@]}"; do echo "${f%/*}" | grep -o '[12]$' | tr -d '\n'; echo ":$(basename "$f" | cut -d_ -f1)"; done | paste -sd' ')"
timeout "${KG_GEN_S:-330}" env COLUMNS=200 kerngen generate "${files[@]}" --proposer playbook --minutes "$minutes" \
  --runs-dir "$runs" > "$OUT/levels-$shard-generate.txt" 2>&1
echo "  generate rc=$?"
timeout "${KG_SUITE_S:-200}" kerngen suite "${files[@]}" --runs-dir "$runs" --budget-ms 100 --json \
  > "$OUT/levels-$shard.json" 2> "$OUT/levels-$shard-suite.err"
echo "  suite rc=$?"
python3 scripts/levels_merge.py "$OUT/levels-$shard.json" | tail -4
