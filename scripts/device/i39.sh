#!/usr/bin/env bash
# The WHOLE GPU tier (issue 39), from the repository root on the GPU host, after
#   source scripts/device/setup.sh
# Usage: bash scripts/device/i39.sh [all|1|2]   (default all; 1 and 2 are halves of the GPU test files,
# for two device calls when the whole tier does not fit in one), or  i39.sh LABEL FILE...  (those files: the
# tier shared among the lanes of a multi-GPU host, scripts/device/lanes.sh). pytest is stopped at $KG_TIMEOUT
# seconds (default 560) so that what ran still comes back; prints the counts last, and leaves the
# JUnit XML and the log in $OUT.
set -uo pipefail
part="${1:-all}"
shift || true
out="${OUT:-/tmp/i39-out}"
mkdir -p "$out"
mapfile -t files < <(grep -rlE "pytest\.mark\.gpu|mark\.multigpu" tests --include='test_*.py' | sort)
half=$(( (${#files[@]} + 1) / 2 ))
case "$part" in
  1) files=("${files[@]:0:$half}") ;;
  2) files=("${files[@]:$half}") ;;
  all) ;;
  *) [ $# -gt 0 ] || { echo "usage: $0 [all|1|2|LABEL FILE...]" >&2; exit 2; }
     files=("$@") ;;
esac
echo "GPU tier, part $part: ${#files[@]} files"
start=$(date +%s)
timeout --signal=INT "${KG_TIMEOUT:-560}" python3 -m pytest -q -m gpu -p no:cacheprovider -o timeout=300 \
  --junitxml="$out/gpu-tier-$part.xml" "${files[@]}" 2>&1 | tee "$out/gpu-tier-$part.log" | tail -60
rc=${PIPESTATUS[0]}
python3 - "$out/gpu-tier-$part.xml" "$rc" "$(( $(date +%s) - start ))" <<'EOF'
import sys
import xml.etree.ElementTree as ET
path, rc, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    suites = ET.parse(path).getroot()
except (OSError, ET.ParseError):
    print(f"no JUnit XML (pytest exit {rc}, {secs} s): see the log"); sys.exit(0)
n = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
failed = []
for s in suites.iter("testsuite"):
    for k in n:
        n[k] += int(s.get(k, 0))
    failed += [f"{c.get('classname')}::{c.get('name')}" for c in s.iter("testcase")
               if c.find("failure") is not None or c.find("error") is not None]
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print("\n| GPU tier | items | passed | failed | errors | skipped | seconds | pytest exit |")
print("|---|---|---|---|---|---|---|---|")
print(f"| {sys.argv[1].rsplit('/', 1)[-1]} | {n['tests']} | {passed} | {n['failures']} | {n['errors']} | "
      f"{n['skipped']} | {secs} | {rc}{' (stopped at the time limit)' if rc in (2, 124, 130) and int(secs) >= 500 else ''} |")
for f in failed[:40]:
    print(f"FAILED {f}")
EOF
