#!/usr/bin/env bash
# Two independent jobs side by side on a two-GPU host, one GPU each, within one device call:
#   bash scripts/device/lanes.sh SECONDS "COMMAND FOR GPU 0" "COMMAND FOR GPU 1"
# Each lane sees only its GPU (CUDA_VISIBLE_DEVICES), writes under $OUT/lane0 or $OUT/lane1 (its own $OUT)
# and is stopped (SIGINT, then SIGKILL 15 s later) at SECONDS; the tail of each lane's log comes last.
# Timings taken in one lane are compared only with timings of the same lane (same GPU, same call).
set -u
limit=$1; shift
root=${OUT:-/tmp/lanes}
for i in 0 1; do
  mkdir -p "$root/lane$i"
  ( export CUDA_VISIBLE_DEVICES=$i OUT="$root/lane$i"
    timeout --signal=INT --kill-after=15 "$limit" bash -c "$1" > "$root/lane$i/lane.log" 2>&1
    echo "lane $i exit $? after $SECONDS s" >> "$root/lane$i/lane.log" ) &
  shift
done
wait
for i in 0 1; do echo "===== lane $i"; tail -n "${LANE_TAIL:-40}" "$root/lane$i/lane.log"; done
