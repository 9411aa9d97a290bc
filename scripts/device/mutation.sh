#!/usr/bin/env bash
# Mutation testing of the harness (issue 39) on the GPU host's CPU cores: every mutant of check, compare, buffers,
# integrity and evaluate, the workers side by side (scripts/mutation.py --jobs). Prepare here with
# `bash scripts/device/mutation-wheels.sh`, carry [".whl", ".mut"], then on the host from the repository root after
# `source scripts/device/setup.sh`:   bash scripts/device/mutation.sh [JOBS] [ARGS...]
# (JOBS: default the host's cores less two; ARGS go to scripts/mutation.py, e.g. --module compare). The emulator's
# tests need g++: without it they would skip and their mutants survive, so the script stops first.
# Results under $OUT: mutation.txt (survivors with their diffs, the score last), mutation-db.tgz (the sessions).
set -u
OUT=${OUT:-/tmp/mutation-out}
mkdir -p "$OUT"
command -v g++ > /dev/null || { echo "no g++ on this host: the emulator's tests would skip"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .mut/*.whl \
  || { echo "the wheels in .mut/ did not install"; exit 2; }
jobs=${1:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
shift || true
echo "[mutation $(date -u +%T)] $jobs workers on $(nproc) cores; $(g++ --version | head -1)"
python3 scripts/mutation.py --jobs "$jobs" --out /tmp/mutation "$@" > "$OUT/mutation.txt" 2>&1
echo "rc=$?" >> "$OUT/mutation.txt"
dbs=$(cd /tmp/mutation 2>/dev/null && ls -d worker*/*.sqlite 2>/dev/null)
[ -n "$dbs" ] && tar czf "$OUT/mutation-db.tgz" -C /tmp/mutation $dbs  # none when no worker started
grep -E "^SURVIVED" "$OUT/mutation.txt" | sort | uniq -c | sort -rn | head -40
tail -3 "$OUT/mutation.txt"
