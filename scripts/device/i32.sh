#!/usr/bin/env bash
# i32 (one graph front end, regions): the KernelBench files the partitioner newly covers, on the GPU.
# From the repository root, after `source scripts/device/setup.sh`:
#   bash scripts/device/i32.sh          GPU tests (every regions variant of 6 multi-region files passes the
#                                       harness at the file's own size), then part 1 below; ~8 minutes on an H100
#   bash scripts/device/i32.sh part N   only `kerngen generate --minutes 0.4` + `kerngen suite` on part N
#                                       (N = 1..7, 5 files each) of the 35 newly covered files; ~6 minutes a part
# The files are copied into /tmp/i32-files/partN (a folder per part); runs go to /tmp/i32-runs (a part run
# again resumes). Results under $OUT: i32-gpu.txt, i32-generate-N.txt, i32-suite-N.txt, i32-table.txt (printed last).
set -u
OUT=${OUT:-/tmp/i32-out}
mkdir -p "$OUT"
KB=${KB:-/work/shared/kernelbench}
[ -d "$KB" ] || KB=../shared/kernelbench
[ -d "$KB" ] || KB=shared/kernelbench  # the device copy of the tree carries it inside
RUNS=/tmp/i32-runs
# newly covered since 1646dd4 (tests/data/playbook/kernelbench_families.json): L1 2 files, L2 33
NEW=(level1/86_ level2/45_ level2/23_ level2/61_ level1/5_
     level2/34_ level2/6_ level2/36_ level2/11_ level2/19_
     level2/3_ level2/8_ level2/10_ level2/13_ level2/15_
     level2/24_ level2/27_ level2/38_ level2/42_ level2/43_
     level2/44_ level2/49_ level2/50_ level2/58_ level2/60_
     level2/72_ level2/74_ level2/77_ level2/78_ level2/79_
     level2/83_ level2/89_ level2/91_ level2/93_ level2/96_)
rows=()

stage() {  # NAME LIMIT_S TITLE CMD...: one command, its log in $OUT/i32-NAME.txt, one table row
  local name=$1 limit=$2 title=$3 t0 rc
  shift 3
  echo "[i32 $(date -u +%T)] $title"
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/i32-$name.txt" 2>&1
  rc=$?
  tail -4 "$OUT/i32-$name.txt"
  rows+=("| $title | $(grep -Eo "[0-9]+ (passed|failed|skipped|error)[^=]*" "$OUT/i32-$name.txt" | tail -1) | $rc | $(( $(date +%s) - t0 )) |")
}

part() {  # N: generate + suite on part N of NEW
  local n=$1 dir="/tmp/i32-files/part$1" i
  mkdir -p "$dir"
  for i in "${NEW[@]:$(( (n - 1) * 5 )):5}"; do cp "$KB"/${i}*.py "$dir/"; done
  stage "generate-$n" "${KG_GEN_S:-330}" "generate --minutes 0.4, part $n ($(ls "$dir" | cut -d_ -f1 | tr '\n' ' '))" \
    env COLUMNS=240 kerngen generate "$dir" --proposer playbook --minutes 0.4 --runs-dir "$RUNS"
  stage "suite-$n" "${KG_SUITE_S:-200}" "suite, part $n" env COLUMNS=240 kerngen suite "$dir" --runs-dir "$RUNS" --budget-ms 100
  rows+=("| suite part $n: see below | | | |")
}

if [ "${1:-}" = part ]; then
  part "${2:-1}"
else
  stage gpu "${KG_TESTS_S:-240}" "GPU: every regions variant of 6 multi-region files, own size" \
    python3 -m pytest -v -p no:cacheprovider -m gpu -rf --tb=short -o timeout="${KG_TEST_S:-150}" tests/agent/test_gpu_regions.py
  part 1
fi

{
  echo "| stage | result | exit | seconds |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  for f in "$OUT"/i32-suite-*.txt; do [ -f "$f" ] && { echo; echo "## $(basename "$f")"; tail -25 "$f"; }; done
} | tee "$OUT/i32-table.txt"
