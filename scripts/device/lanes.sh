#!/usr/bin/env bash
# Independent jobs side by side on a multi-GPU host, GPUs of their own each, within one device call:
#   bash scripts/device/lanes.sh SECONDS "COMMAND FOR LANE 0" "COMMAND FOR LANE 1" ...
# Lane i sees GPU i (CUDA_VISIBLE_DEVICES), or the i-th word of LANE_GPUS (e.g. LANE_GPUS="0,1 2 3": lane 0 owns
# GPUs 0 and 1, a Ray pair), writes under $OUT/lane<i> (its own $OUT) and is stopped (SIGINT, then SIGKILL 15 s
# later) at SECONDS; the tail of each lane's log comes last.
# Timings taken in one lane are compared only with timings of the same lane (same GPU, same call).
set -u
limit=$1; shift
root=${OUT:-/tmp/lanes}
read -r -a gpus <<< "${LANE_GPUS:-}"
n=$#
for ((i = 0; i < n; i++)); do
  mkdir -p "$root/lane$i"
  ( export CUDA_VISIBLE_DEVICES=${gpus[$i]:-$i} OUT="$root/lane$i"
    timeout --signal=INT --kill-after=15 "$limit" bash -c "$1" > "$root/lane$i/lane.log" 2>&1
    echo "lane $i exit $? after $SECONDS s" >> "$root/lane$i/lane.log" ) &
  shift
done
wait
for ((i = 0; i < n; i++)); do echo "===== lane $i"; tail -n "${LANE_TAIL:-40}" "$root/lane$i/lane.log"; done
