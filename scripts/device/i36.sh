#!/usr/bin/env bash
# i36 (issue 36, with the LLM parts of 31 and 37): the LLM path on the GPU host, through the new
# client (total deadline, body caps, interrupt bookkeeping) and the new prompts.
# From the repository root, after `source scripts/device/setup.sh`:   bash scripts/device/i36.sh
# Two stages, each with its own time limit; the whole script stays under 6 minutes on one H100:
#   1. the GPU tier of the LLM path (tests/agent/test_gpu_llm_session.py): a short `kerngen generate`
#      of a KernelBench level-2 GEMM against the local chat server; the first answer forgets the bias,
#      the repair prompt shows where the output is wrong, the repaired kernel is correct on the GPU;
#      where ncu is installed, the next round's prompt carries the profile                    <= 240 s
#   2. this issue's CPU tests, on the GPU host's own Python and carried wheels (openai 3 / httpx2):
#      the trickling endpoint and the body caps, the faults' stop causes, the truth of tokens and
#      cost, Ctrl-C mid-search                                                                  <= 120 s
# Results come back under $OUT: i36-gpu.txt, i36-cpu.txt, i36-table.txt (the table is printed last).
set -u
OUT=${OUT:-/tmp/i36-out}
mkdir -p "$OUT"
log() { echo "[i36 $(date -u +%T)] $*"; }

log "1/2 GPU tier of the LLM path"
t0=$(date +%s)
timeout 240 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/agent/test_gpu_llm_session.py -rA \
  > "$OUT/i36-gpu.txt" 2>&1
gpu_rc=$?
gpu_s=$(( $(date +%s) - t0 ))
tail -5 "$OUT/i36-gpu.txt"

log "2/2 the issue's CPU tests on this host"
t0=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/agent/test_llm_limits.py tests/agent/test_llm_truth.py \
  tests/cli/test_llm_faults.py tests/cli/test_llm_interrupt.py tests/cli/test_dry_run_prompts.py \
  > "$OUT/i36-cpu.txt" 2>&1
cpu_rc=$?
cpu_s=$(( $(date +%s) - t0 ))
tail -3 "$OUT/i36-cpu.txt"

summary() { grep -Eo "[0-9]+ (passed|failed|skipped|error)[^=]*" "$1" | tail -1; }
{
  echo "| stage | result | exit | seconds |"
  echo "|---|---|---|---|"
  echo "| GPU LLM session (repair to a correct kernel; profile in the next prompt) | $(summary "$OUT/i36-gpu.txt") | $gpu_rc | $gpu_s |"
  echo "| CPU tests of issue 36 on the GPU host | $(summary "$OUT/i36-cpu.txt") | $cpu_rc | $cpu_s |"
} | tee "$OUT/i36-table.txt"
