#!/usr/bin/env bash
# i34l (the LLM per region of a model run) on the GPU host, from the repository root after
# `source scripts/device/setup.sh`. The host is offline: the LLM is the tests' scripted chat model (a local server,
# tests/fakes/llm_server.py) answering a transpose kernel for the permute region and a relu*2 kernel for the
# elementwise one. The GPU test runs `kerngen generate MODEL.py --as-model --model scripted --base-url ...` on a
# 2048x4096 permute -> relu * 2 model: the answers compiled by NVRTC, checked, timed with CUDA events, the model
# correct end to end. Under 3 minutes. Results under $OUT: i34l-gpu.txt (pytest), i34l-show.txt (the run's
# per-region table and every try of each region, the playbook's and the LLM's, with its time: printed last).
set -u
OUT=${OUT:-/tmp/i34l-out}
mkdir -p "$OUT"
export KG_I34L_RUNS=/tmp/i34l-runs
rm -rf "$KG_I34L_RUNS"
timeout 240 python3 -m pytest -q -rf -m gpu -p no:cacheprovider \
  "tests/agent/test_model_llm.py::test_on_a_gpu_the_answers_compile_with_nvrtc_and_the_model_stays_correct" \
  > "$OUT/i34l-gpu.txt" 2>&1
tail -3 "$OUT/i34l-gpu.txt"
RUN=$(ls -d "$KG_I34L_RUNS"/*-model 2>/dev/null | tail -1)
if [ -n "$RUN" ]; then
  tar -C "$KG_I34L_RUNS" -czf "$OUT/i34l-run.tgz" "$(basename "$RUN")"
  kerngen show "$RUN" --width 160 > "$OUT/i34l-show.txt" 2>&1
  kerngen show "$RUN" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("region  try            correct  ms (alone)  message")
for r in d["regions"]:
    for t in r["tried"]:
        ms = "%.4f" % t["kernel_ms"] if t["kernel_ms"] is not None else "-"
        print("r%-6d %-14s %-8s %-11s %s" % (r["region"], t["variant"], t["ok"], ms, t["message"][:60]))
' >> "$OUT/i34l-show.txt" 2>&1
  cat "$OUT/i34l-show.txt"
else
  echo "no model run was written (see i34l-gpu.txt)"
fi
