#!/usr/bin/env bash
# Run a command with ANOTHER tree of kerngen (a branch's copy carried beside the repository, e.g. `.i41k`, made with
# `git archive BRANCH | tar x -C .i41k`) on the GPU host, after `source scripts/device/setup.sh`:
#   bash scripts/device/in_tree.sh DIR "COMMAND"
# Why: setup.sh installs the device copy's root editable, with package-dir mappings (kerngen.agent = agent/, ...).
# A tree merely put first on PYTHONPATH has a kerngen/ folder without those subpackages, so `kerngen.agent` and the
# rest silently came from the root's install: a first run of a branch's bench timed main against main. Here the
# tree is copied to /tmp, installed (not editable) into its own folder first on PYTHONPATH, its source kerngen/
# folder removed from the copy (the current directory must not shadow the installed package), and the command runs
# in the copy only once every subpackage is seen to come from that install.
set -u
src=$(cd "$1" && pwd) || exit 2
name=$(basename "$src" | tr -d .)
tree=/tmp/tree-$name-$$ site=/tmp/site-$name-$$  # per call: two lanes of one host may run the same tree at once
rm -rf "$tree" "$site"
cp -r "$src" "$tree"
[ -e "$tree/shared" ] || [ ! -d shared ] || cp -r shared "$tree/"
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --no-index --target "$site" "$tree" \
  > "$tree.log" 2>&1 || { echo "in_tree: installing $src failed: $(tail -1 "$tree.log")"; exit 2; }
rm -rf "$tree/kerngen"
cd "$tree" || exit 2
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
python3 - "$site" <<'PY' || { echo "in_tree: not this tree's kerngen: nothing run"; exit 1; }
import sys
from pathlib import Path
import kerngen, kerngen.agent, kerngen.harness, kerngen.problems, kerngen.results
site = Path(sys.argv[1]).resolve()
where = {m.__name__: Path(m.__file__).resolve() for m in (kerngen, kerngen.agent, kerngen.harness, kerngen.problems, kerngen.results)}
print("in_tree:", ", ".join(f"{k} <- {v.parent}" for k, v in where.items()))
sys.exit(0 if all(p.is_relative_to(site) for p in where.values()) else 1)
PY
bash -c "$2"
