#!/usr/bin/env bash
# Run HERE (the development machine, which reaches PyPI), in the repository root, before a device call that runs
# the mutation testing of the harness on the GPU host's many CPU cores (scripts/device/mutation.sh): puts into .mut/
# (git-ignored) cosmic-ray and what its init and exec need that the offline host lacks (the host has click, attrs,
# rich, pyyaml; yattag and anybadge, for its HTML report and badge only, have no wheels and are left out).
# Usage: bash scripts/device/mutation-wheels.sh   then carry [".whl", ".mut"]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.mut
rm -rf "$out" && mkdir -p "$out"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$out" \
  cosmic-ray==8.7.0 decorator exit-codes gitpython gitdb smmap parso sqlalchemy greenlet stevedore pbr toml \
  aiohttp multidict yarl frozenlist aiosignal aiohappyeyeballs propcache
f=/.mut/
grep -qxF "$f" "$(git rev-parse --git-common-dir)/info/exclude" || echo "$f" >> "$(git rev-parse --git-common-dir)/info/exclude"
du -sh "$out"
