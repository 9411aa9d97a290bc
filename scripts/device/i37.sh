#!/usr/bin/env bash
# Issue 37 on the GPU host (after `source scripts/device/setup.sh`, from the repository root), well
# under 8 minutes: the first problem of a folder at the same budget as the rest (3 KernelBench files,
# --minutes 0.4 each), `kerngen bench --solution`, and the roofline floor against PyTorch's own times.
# Prints a short table last; the figures land in $OUT/i37/ (one tar).
set -uo pipefail
OUT=${OUT:-/tmp/out}
export I37_OUT="$OUT/i37"
mkdir -p "$I37_OUT"
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/cli/test_gpu_first_hour.py -m gpu 2>&1 | tail -15
rc=${PIPESTATUS[0]}
python3 - <<'PY'
import json, os
from pathlib import Path
out = Path(os.environ["I37_OUT"])
def load(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None
print("\n| what | figure |\n|---|---|")
for r in load("first_problem") or []:
    print(f"| generate --minutes 0.4: {r['problem']} | {r['evaluated']} evaluated, best {r['best_ms']} ms, "
          f"{r['wall_min']} min; {r['reason'][:60]} |")
s = load("solution")
if s:
    print(f"| bench --solution softmax_good.py | {s['verdict']}, {s['median_ms']:.4f} ms, "
          f"{s['speedup_vs_eager']:.2f}x eager |")
for problem, f in (load("floors") or {}).items():
    print(f"| floor {problem} | {f['floor_ms']:.4f} ms ({f['basis']}); measured ceilings {f['measured_floor_ms']}; "
          f"PyTorch {', '.join(f'{t:.4f}' for t in f['pytorch_ms'])} ms |")
PY
tar -cf "$OUT/i37.tar" -C "$OUT" i37 2>/dev/null && rm -rf "$I37_OUT"
echo "i37: pytest exit $rc, $(( $(date +%s) - t0 )) s"
exit $rc
