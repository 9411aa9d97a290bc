#!/usr/bin/env bash
# The WHOLE GPU tier (issue 39), from the repository root on the GPU host, after
#   source scripts/device/setup.sh
# Usage:
#   bash scripts/device/i39.sh [all|1|2]       every GPU test file (default all); 1 and 2 are halves of the files
#   bash scripts/device/i39.sh shared N [A/B]  one GPU shared by N pytest-xdist workers (.whl/ must hold pytest-xdist
#                                              and execnet), whole files to a worker, the slow files first; then the
#                                              tests that failed there again and the files of SERIAL, alone on the
#                                              GPU. A or B: every other file of each list, for two device calls
#   bash scripts/device/i39.sh LABEL FILE...   those files or test ids (the tier shared among the lanes of a multi-GPU
#                                              host, scripts/device/lanes.sh); KG_XDIST=N: over N xdist workers
# KG_APPEND=1 adds to $OUT's table (phases.txt) instead of starting it anew: several runs of one call in one table.
# Each pytest is stopped at $KG_TIMEOUT seconds (default 560; in shared mode the parallel phase gets what is left
# after $KG_SERIAL_S, default 150, for the serial one) so that what ran still comes back. Prints a table of the
# counts and the seconds per file last, and leaves the JUnit XML and the logs in $OUT.
set -uo pipefail
part="${1:-all}"
shift || true
out="${OUT:-/tmp/i39-out}"
mkdir -p "$out"
mapfile -t files < <(grep -rlE "pytest\.mark\.gpu|mark\.multigpu" tests --include='test_*.py' | LC_ALL=C sort)
# run alone on the GPU: timings asserted against other timings (L2 flush, host lag, the exported op against the
# harness's figure, the scripted kernel against eager) and the GPU's measured ceilings
SERIAL=(tests/harness/test_timing.py tests/harness/test_timing_clocks.py tests/harness/test_profile.py
        tests/results/test_export_gpu.py tests/results/test_exported_op_gpu.py tests/agent/test_gpu_agent.py
        tests/harness/test_gpu_facts.py)
# the longest files of the last whole run (2026-11-28, 4x H200), first: xdist hands out files in this order
SLOW=(tests/agent/test_gpu_regions.py tests/harness/test_gpu_op_regions.py tests/harness/test_gpu_models.py
      tests/harness/test_gpu_model_resume.py tests/cli/test_gpu_first_hour.py tests/agent/test_gpu_conv_wgmma.py
      tests/agent/test_gpu_tf32_terms.py tests/agent/test_model_llm.py tests/agent/test_playbook_chain.py)

run_pytest() {  # LABEL SECONDS [PYTEST ARGS...] FILES...
  local label=$1 secs=$2 start rc
  shift 2
  start=$(date +%s)
  timeout --signal=INT "$secs" python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=300 \
    --junitxml="$out/gpu-tier-$label.xml" "$@" > "$out/gpu-tier-$label.log" 2>&1
  rc=$?
  tail -40 "$out/gpu-tier-$label.log"
  echo "$label $rc $(( $(date +%s) - start ))" >> "$out/phases.txt"
}

every_other() {  # PARITY ITEM...: the items at even (0) or odd (1) places, one a line
  local parity=$1 i=0 f
  shift
  for f in "$@"; do (( i++ % 2 == parity )) && echo "$f"; done
}

[ -n "${KG_APPEND:-}" ] || : > "$out/phases.txt"
case "$part" in
  shared)
    n=${1:?usage: $0 shared N [A/B]} half=${2:-}
    [[ "$half" =~ ^[AB]?$ ]] || { echo "i39.sh shared: the half is A or B, not '$half'" >&2; exit 2; }
    par=()
    for f in "${SLOW[@]}" "${files[@]}"; do
      [[ " ${SERIAL[*]} ${par[*]} " == *" $f "* ]] || par+=("$f")
    done
    ser=("${SERIAL[@]}")
    if [ -n "$half" ]; then
      # alternate files between the halves so each gets its share of the slow ones
      parity=$([ "$half" = A ] && echo 0 || echo 1)
      mapfile -t par < <(every_other "$parity" "${par[@]}")
      mapfile -t ser < <(every_other "$parity" "${ser[@]}")
    fi
    total=${KG_TIMEOUT:-560} serial_s=${KG_SERIAL_S:-150}
    echo "GPU tier on one GPU${half:+, half $half}: ${#par[@]} files over $n workers, then their failures and ${#ser[@]} files alone"
    # an empty list would make pytest collect the whole tests/ folder
    [ ${#par[@]} -eq 0 ] || run_pytest "shared$half" $(( total - serial_s )) -n "$n" --dist loadfile "${par[@]}"
    # what failed beside the other workers (the GPU's memory taken by another worker's test) first again, alone; then
    # SERIAL, in what is left of the serial phase's time
    mapfile -t again < <(python3 scripts/device/tier_table.py --failed "$out/gpu-tier-shared$half.xml")
    ser=("${again[@]}" "${ser[@]}")
    [ ${#ser[@]} -eq 0 ] || run_pytest "serial$half" "$serial_s" "${ser[@]}"
    ;;
  1|2|all)
    half=$(( (${#files[@]} + 1) / 2 ))
    [ "$part" = 1 ] && files=("${files[@]:0:$half}")
    [ "$part" = 2 ] && files=("${files[@]:$half}")
    echo "GPU tier, part $part: ${#files[@]} files"
    run_pytest "$part" "${KG_TIMEOUT:-560}" "${files[@]}"
    ;;
  *)
    [ $# -gt 0 ] || { echo "usage: $0 [all|1|2|shared N [A/B]|LABEL FILE...]" >&2; exit 2; }
    echo "GPU tier, $part: $# files or tests${KG_XDIST:+ over $KG_XDIST workers on one GPU}"
    run_pytest "$part" "${KG_TIMEOUT:-560}" ${KG_XDIST:+-n "$KG_XDIST" --dist loadfile} "$@"
    ;;
esac
python3 scripts/device/tier_table.py "$out"
