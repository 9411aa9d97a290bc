#!/usr/bin/env bash
# Issue 38 on ONE host of TWO GPUs (nvidia-h100-x2 or nvidia-h200-x2): Ray with two nodes on it,
# each owning one GPU (tests/harness/ray_nodes.py), against the local pool; a node lost mid-run.
#
# Here first, in the checkout the device call sends:  bash scripts/device/ray-wheels.sh
# (.ray/: Ray's wheel cut to ~40 MB, and jsonschema's; with .whl as well a call exceeds 64 MiB: carry .whl in the lease's first call).
# Then each device call carries [".ray"] (after one that carried [".whl"] on the same warm machine) and runs:
#   source scripts/device/setup.sh && bash scripts/device/i38.sh PART
# PART (a call each; send the next as soon as one returns: the machine stays warm 30 s, and then
# the same GPUs serve every part, Ray is installed once under /tmp and the table compares them all):
#   one      ~8 min: the head (GPU 0): tune through Ray on 1 GPU, the local pool on 1 GPU; the second
#            node (GPU 1): tune through Ray on 2 GPUs, the local pool on 2 GPUs; then the GPU tests
#            of a node lost mid-run (tests/harness/test_gpu_ray_nodes.py, a cluster of their own)
#   folder1  ~6 min: `generate DIR --minutes 0.4` of 12 KernelBench files through Ray on 1 GPU
#   folder2  ~4.5 min: the same through Ray on 2 GPUs (wall time and verdicts against folder1's); a
#            GPU model the cluster lacks refused in one line; an unreachable address in one line (< 15 s)
#   folders  both folder runs in one call: fits at I38_MINUTES=0.3, not at 0.4 (then folder2 is skipped)
# or PHASE[,PHASE...] (the names below). A phase starts only if its estimate fits the command's 10
# minutes (I38_LIMIT_S, 560 s of this script; setup.sh takes the rest); one left out says so.
# Knobs: I38_MINUTES (0.4, each file's budget), I38_EVALS (96 configurations a tune).
# Prints a table last; $OUT gets i38-results.jsonl, i38-figures.jsonl and the logs (i38-logs.tgz).
set -uo pipefail
PARTS=${1:-one}
case "$PARTS" in
  one) PARTS=install,head,tune_ray1,tune_local1,node,tune_ray2,tune_local2,stop,node_loss ;;
  folder1) PARTS=install,head,folder_ray1,stop ;;
  folder2) PARTS=install,head,node,folder_ray2,refused,unreachable,stop ;;
  folders) PARTS=install,head,folder_ray1,node,folder_ray2,stop ;;
esac
MIN=${I38_MINUTES:-0.4}
EVALS=${I38_EVALS:-96}
LIMIT=${I38_LIMIT_S:-560}
OUT=${OUT:-/tmp/i38-out}
W=/tmp/i38  # kept between the calls on a warm machine: figures, runs, the Ray install
L=$OUT/logs
mkdir -p "$W" "$L"
export RAY_AUTH_MODE=disabled  # a closed host of ours: Ray's token auth off for the nodes and drivers
export COLUMNS=200 PYTHONUNBUFFERED=1
FILES="19_ReLU 21_Sigmoid 25_Swish 23_Softmax 24_LogSoftmax 40_LayerNorm 41_Max_Pooling_1D
       12_Matmul_with_diagonal_matrices_ 100_HingeLoss 94_MSELoss 47_Sum_reduction_over_a_dimension 89_cumsum"
NFILES=$(echo $FILES | wc -w)
HEAD=127.0.0.1:6390
RES=$W/results.jsonl
[ -d /tmp/ray-site/ray ] && export PYTHONPATH=/tmp/ray-site:${PYTHONPATH:-}

# estimates (s) on an H100 pair, with a margin: a phase is started only if it fits before LIMIT. A file
# of a folder takes its budget and ~1.5 s (measured: 6 files at 0.4 min, 149 s), the command ~40 s more
est() {
  case $1 in
    install) echo 30 ;; head|node) echo 15 ;; stop) echo 5 ;; refused) echo 30 ;; unreachable) echo 20 ;;
    tune_*) echo 40 ;;
    folder_ray1) python3 -c "print(int(40 + $NFILES * ($MIN * 60 + 1.5) * 1.05))" ;;
    folder_ray2) python3 -c "print(int(45 + ($NFILES + 1) // 2 * ($MIN * 60 + 1.5) * 1.1))" ;;
    node_loss) echo 300 ;;
    *) echo 30 ;;
  esac
}
record() { echo "$1" >> "$RES"; }  # one JSON object a line

run_phase() {
  local name=$1 need t0
  need=$(est "$name")
  if (( SECONDS + need > LIMIT )); then
    echo "== $name: SKIPPED (needs ~${need} s, $((LIMIT - SECONDS)) s left of this command)"
    record "{\"phase\": \"$name\", \"skipped\": true}"
    return
  fi
  echo "== $name (~${need} s) at ${SECONDS} s"
  t0=$SECONDS
  "p_$name"
  echo "== $name: $((SECONDS - t0)) s"
}

# ----- the phases -------------------------------------------------------------------------------
p_install() {
  if python3 -c "import ray" 2>/dev/null; then echo "ray is there: $(python3 -c 'import ray; print(ray.__version__)')"; return; fi
  ls .ray/*.whl >/dev/null 2>&1 || { echo "no .ray/ carried (bash scripts/device/ray-wheels.sh, then carry .ray)"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ray-site .ray/*.whl \
    > "$L/install.log" 2>&1 || { tail -5 "$L/install.log"; exit 1; }
  export PYTHONPATH=/tmp/ray-site:${PYTHONPATH:-}
  python3 -c "import ray; print('ray', ray.__version__, 'installed from .ray/')"
}
p_head() {  # what a call cut short may have left of this cluster goes first
  python3 -m tests.harness.ray_nodes "$W/ray" stop
  python3 -m tests.harness.ray_nodes "$W/ray" head 2>&1 | tail -1
}
p_node() { python3 -m tests.harness.ray_nodes "$W/ray" node 2>&1 | tail -1 && python3 -m tests.harness.ray_nodes "$W/ray" wait 2; }
p_stop() { python3 -m tests.harness.ray_nodes "$W/ray" stop; }

spec() {
  [ -f "$W/softmax.json" ] || kerngen playbook softmax --shape 4096x8192 -o "$W/softmax.json" > "$L/playbook.log" 2>&1
}
tune() {  # tune NAME [--ray ADDRESS]: softmax 4096x8192, EVALS random configurations, seeded, no cache
  local name=$1; shift
  spec
  local t0=$SECONDS
  kerngen tune softmax --shape 4096x8192 --kernel "$W/softmax.json" --max-evals "$EVALS" --strategy random \
    --seed 0 --no-cache --json "$@" > "$L/$name.json" 2> "$L/$name.err"
  local rc=$?
  python3 - "$name" "$L/$name.json" "$rc" "$((SECONDS - t0))" >> "$RES" <<'EOF'
import json, sys
name, path, rc, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
try:
    text = open(path).read()
    s = json.loads(text[text.index("{"):])["summary"]
    print(json.dumps({"phase": name, "rc": rc, "command_s": wall, "evaluated": s["evaluated"], "seconds": s["seconds"],
                      "per_min": s["evals_per_minute"], "best_ms": s["best_ms"], "failed": s["failed"]}))
except Exception as exc:
    print(json.dumps({"phase": name, "rc": rc, "command_s": wall, "error": f"{type(exc).__name__}: {exc}"}))
EOF
  tail -1 "$RES"
}
p_tune_ray1() { tune tune_ray1 --ray "$HEAD"; }
p_tune_ray2() { tune tune_ray2 --ray "$HEAD"; }
p_tune_local1() { CUDA_VISIBLE_DEVICES=0 tune tune_local1; }
p_tune_local2() { CUDA_VISIBLE_DEVICES=0,1 tune tune_local2; }

folder() {  # folder NAME: the 12 files through Ray, each --minutes MIN, in a runs folder of its own
  local name=$1 t0
  rm -rf "$W/kb12" "$W/$name" && mkdir -p "$W/kb12"
  for f in $FILES; do cp "tests/data/kernelbench/level1/$f.py" "$W/kb12/"; done
  t0=$SECONDS
  kerngen generate "$W/kb12" --minutes "$MIN" --runs-dir "$W/$name" --json --ray "$HEAD" \
    > "$L/$name.json" 2> "$L/$name.err"
  local rc=$?
  python3 - "$name" "$L/$name.json" "$rc" "$((SECONDS - t0))" >> "$RES" <<'EOF'
import json, sys
from pathlib import Path
name, path, rc, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
try:
    rows = json.loads(open(path).read())
    verdicts = {Path(r["problem"]).stem: (r["status"], r["best_ms"] is not None) for r in rows}
    print(json.dumps({"phase": name, "rc": rc, "wall_s": wall, "files": len(rows),
                      "kernels": sum(k for _, k in verdicts.values()), "verdicts": verdicts,
                      "best_ms": {Path(r["problem"]).stem: r["best_ms"] for r in rows}}))
except Exception as exc:
    print(json.dumps({"phase": name, "rc": rc, "wall_s": wall, "error": f"{type(exc).__name__}: {exc}"}))
EOF
  tail -1 "$RES" | cut -c1-300
}
p_folder_ray1() { folder folder_ray1; }
p_folder_ray2() { folder folder_ray2; }

one_line_exit2() {  # NAME SECONDS_MAX CMD...: the command fails in one line, exit 2, within SECONDS_MAX
  local name=$1 max=$2 t0 rc; shift 2
  t0=$(date +%s.%N)
  "$@" > "$L/$name.out" 2> "$L/$name.err"; rc=$?
  python3 - "$name" "$max" "$rc" "$t0" "$(date +%s.%N)" "$L/$name.err" >> "$RES" <<'EOF2'
import json, sys
name, most, rc, t0, t1, err = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), *map(float, sys.argv[4:6]), sys.argv[6]
lines = [l for l in open(err).read().splitlines() if l.strip()]
s = round(t1 - t0, 1)
print(json.dumps({"phase": name, "rc": rc, "seconds": s, "stderr_lines": len(lines),
                  "ok": rc == 2 and len(lines) == 1 and s < most, "line": (lines or [""])[-1][:300]}))
EOF2
  tail -1 "$RES"
}
p_refused() {  # a GPU model the cluster does not have: one line naming the ones it has
  spec
  one_line_exit2 refused 60 kerngen tune softmax --shape 4096x8192 --kernel "$W/softmax.json" --max-evals 1 \
    --ray "$HEAD" --ray-gpu-model A100
}
p_unreachable() {  # nothing listens there: one line within 15 s, not Ray's client retrying for minutes
  spec
  one_line_exit2 unreachable 15 kerngen tune softmax --shape 4096x8192 --kernel "$W/softmax.json" --max-evals 1 \
    --ray 127.0.0.1:6999
}
p_node_loss() {  # the GPU tests: two nodes of their own, the second lost mid-run (a folder, a tune)
  rm -f "$W/figures.jsonl"
  KERNGEN_FIGURES=$W/figures.jsonl timeout $((LIMIT - SECONDS + 20)) python3 -m pytest -q -s -x -p no:cacheprovider \
    -m gpu tests/harness/test_gpu_ray_nodes.py > "$L/node_loss.log" 2>&1
  local rc=$?
  tail -3 "$L/node_loss.log"
  record "{\"phase\": \"node_loss\", \"rc\": $rc, \"summary\": $(tail -1 "$L/node_loss.log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()[:200]))')}"
}

# ----- run them ----------------------------------------------------------------------------------
echo "i38 $PARTS on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs), $(date -u +%FT%TZ)"
for phase in ${PARTS//,/ }; do
  run_phase "$phase"
done

# ----- the table ----------------------------------------------------------------------------------
cp "$RES" "$OUT/i38-results.jsonl" 2>/dev/null
[ -f "$W/figures.jsonl" ] && cp "$W/figures.jsonl" "$OUT/i38-figures.jsonl"
tar -czf "$OUT/i38-logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$L"
python3 - "$RES" "$W/figures.jsonl" <<'EOF'
import json, sys
from pathlib import Path
res = {}
for line in Path(sys.argv[1]).read_text().splitlines() if Path(sys.argv[1]).exists() else []:
    r = json.loads(line)
    res[r["phase"]] = r  # the latest of each
def get(phase, key, fmt="{}"):
    r = res.get(phase)
    if r is None:
        return "not run"
    if r.get("skipped"):
        return "SKIPPED"
    v = r.get(key)
    return "error: " + r.get("error", "?")[:40] if v is None and "error" in r else fmt.format(v)
def ratio(a, b):
    try:
        return res[a][ "per_min"] / res[b]["per_min"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
print("\n| measure | value | target |\n|---|---|---|")
for p in ("tune_ray1", "tune_ray2", "tune_local1", "tune_local2"):
    print(f"| {p}: configs/min (configs, tuning s, command s) | {get(p, 'per_min', '{:.1f}')} "
          f"({get(p, 'evaluated')}, {get(p, 'seconds', '{:.1f}')}, {get(p, 'command_s')}); failed {get(p, 'failed')} | |")
r = ratio("tune_ray2", "tune_ray1")
print(f"| Ray 2 GPUs / Ray 1 GPU | {'-' if r is None else f'{r:.2f}x'} | >= 1.8x |")
for n in ("1", "2"):
    r = ratio(f"tune_ray{n}", f"tune_local{n}")
    print(f"| Ray's overhead vs local pool, {n} GPU(s) | {'-' if r is None else f'{100 * (1 - r):+.1f}%'} | < 10% |")
f1, f2 = res.get("folder_ray1", {}), res.get("folder_ray2", {})
for p in ("folder_ray1", "folder_ray2"):
    print(f"| generate DIR, {p}: wall s (files, with a kernel) | {get(p, 'wall_s')} ({get(p, 'files')}, {get(p, 'kernels')}) | |")
if f1.get("wall_s") and f2.get("wall_s"):
    print(f"| 2 GPUs / 1 GPU wall | {f2['wall_s'] / f1['wall_s']:.2f}x | <= 0.55x |")
if f1.get("verdicts") and f2.get("verdicts"):
    diff = sorted(k for k in f1["verdicts"] if f1["verdicts"][k] != f2["verdicts"].get(k))
    print(f"| same verdicts (status, kernel or not) | {'yes' if not diff else 'no: ' + ', '.join(diff)} | same |")
for p in ("refused", "unreachable"):
    print(f"| {p}: one line, exit 2 (s) | {get(p, 'ok')} ({get(p, 'seconds')} s) | {'< 15 s' if p == 'unreachable' else 'one line'} |")
print(f"| node lost mid-run (GPU tests) | rc {get('node_loss', 'rc')}: {get('node_loss', 'summary')} | pass |")
figs = Path(sys.argv[2])
for line in figs.read_text().splitlines() if figs.exists() else []:
    print(f"| {json.loads(line).get('case')} | {line[:260]} | |")
EOF
