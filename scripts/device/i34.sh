#!/usr/bin/env bash
# i34 (from ops to models): whole models as plans on the GPU.
# From the repository root, after `source scripts/device/setup.sh`:
#   bash scripts/device/i34.sh          GPU tests (tests/harness/test_gpu_models.py), then part 1 of the benchmark
#   bash scripts/device/i34.sh part 2   only part 2 of the benchmark
#   bash scripts/device/i34.sh part 3   only part 3
# Part 1: the GPU tests (at most 4 min), mlp, resnet_block; part 2: vgg_stack, mobilenetv2_block, resnet18;
# part 3: vit_block, gpt_block, lstm, then `kerngen replay` of the vit_block run (re-checked and re-timed end to end),
# its report and export (i34-replay.txt, i34-runs.txt). Each part stays under 9 minutes on one H100/H200.
# Each region: its variants, then a short tune (up to 8 more configurations of the best), in its share of the
# budget (share of eager time x time over its roofline floor); the table counts the tuned configurations.
# Each model: `kerngen generate problems/models/M.py --as-model --minutes 0.75` (offline playbook, true fp32), at
# most 150 s; its record under /tmp/i34-runs. Results under $OUT: i34-gpu.txt, i34-gen-M.txt, i34-table.txt
# (printed last): correct end to end, share of eager time on kerngen kernels, ms for eager, torch.compile, kerngen,
# kerngen + compile, and the best kerngen figure's ratio to torch.compile.
set -u
OUT=${OUT:-/tmp/i34-out}
mkdir -p "$OUT"
RUNS=/tmp/i34-runs
mkdir -p "$RUNS"
PART=1
[ "${1:-}" = "part" ] && PART=${2:-1}

if [ "$PART" = 1 ] && [ -z "${1:-}" ]; then
  echo "[i34 $(date -u +%T)] GPU tests"
  timeout "${KG_TESTS_S:-240}" python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/harness/test_gpu_models.py > "$OUT/i34-gpu.txt" 2>&1
  tail -3 "$OUT/i34-gpu.txt"
fi

case "$PART" in
  1) MODELS=(mlp resnet_block) ;;
  2) MODELS=(vgg_stack mobilenetv2_block resnet18) ;;
  *) MODELS=(vit_block gpt_block lstm) ;;
esac
for m in "${MODELS[@]}"; do
  echo "[i34 $(date -u +%T)] $m"
  timeout "${KG_MODEL_S:-150}" kerngen generate "problems/models/$m.py" --as-model --minutes 0.75 --runs-dir "$RUNS" \
    > "$OUT/i34-gen-$m.txt" 2>&1
  echo "  rc=$? $(grep -E 'end to end|eager .* ms, torch.compile' "$OUT/i34-gen-$m.txt" | head -2 | tr '\n' ' ' | cut -c1-300)"
done

if [ "$PART" = 3 ]; then  # the model-run verbs on one run: replay (re-check, re-time on this GPU), report, export
  last=$(ls -d "$RUNS"/*-vit_block-model 2>/dev/null | tail -1)
  if [ -n "$last" ]; then
    echo "[i34 $(date -u +%T)] replay $last"
    timeout "${KG_MODEL_S:-150}" kerngen replay "$last" --runs-dir "$RUNS" > "$OUT/i34-replay.txt" 2>&1
    echo "  rc=$? $(grep -E 'end to end|eager .* ms, torch.compile' "$OUT/i34-replay.txt" | head -2 | tr '\n' ' ' | cut -c1-300)"
    kerngen report "$last" -o /tmp/i34-report.html > /dev/null 2>&1 && echo "  report: $(grep -c '<rect' /tmp/i34-report.html) bars' segments"
    rm -rf /tmp/i34-export && kerngen export "$last" -o /tmp/i34-export 2>&1 | tail -1 | cut -c1-200
    kerngen runs --runs-dir "$RUNS" --width 160 > "$OUT/i34-runs.txt" 2>&1
  fi
fi

python3 - "$RUNS" "${MODELS[@]}" > "$OUT/i34-table.txt" <<'PY'
import sys
from pathlib import Path
from kerngen.agent.model_run import read_model_run
runs, models = Path(sys.argv[1]), sys.argv[2:]
f = lambda v: f"{v:.3f}" if v is not None else "-"
print("| model | correct | kerngen share | tuned ok/tried | eager ms | compile ms | kerngen ms | kerngen+compile ms | vs compile |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    found = sorted(runs.glob(f"*-{m}-model"))
    if not found or not (found[-1] / "model.json").is_file():
        print(f"| {m} | no run | | | | | | | |"); continue
    r = read_model_run(found[-1]); t = r.timing
    ok = "yes" if r.check and r.check.ok else "NO"
    ratio = f"{t.compile_ms / t.best_ms:.2f}x" if t and t.compile_ms else "-"
    tuned = [v for g in r.regions for v in g.tried if v.config is not None]
    print(f"| {m} | {ok} | {100 * r.kernel_share:.1f}% | {sum(v.ok for v in tuned)}/{len(tuned)} | "
          f"{f(t and t.eager_ms)} | {f(t and t.compile_ms)} | "
          f"{f(t and t.kerngen_ms)} | {f(t and t.kerngen_compile_ms)} | {ratio} |")
PY
echo "[i34 $(date -u +%T)] table (part $PART)"
cat "$OUT/i34-table.txt"
