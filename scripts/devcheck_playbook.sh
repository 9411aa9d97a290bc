#!/bin/bash
# On a GPU machine, from the repository root: make `kerngen` importable without installing it
# (pydantic wheels carried in .whl_pb when missing), then bench the playbook's kernels, e.g.
#   scripts/devcheck_playbook.sh --configs=scripts/devcheck_playbook_configs.json tests/data/playbook/suite_gelu.py
set -e
if ! python3 -c "import pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_pb/*.whl
  export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import kerngen.problems" 2>/dev/null; then
  rm -rf /tmp/kg && mkdir -p /tmp/kg/kerngen
  cp kerngen/*.py /tmp/kg/kerngen/
  for d in harness agent problems prompts; do ln -s "$PWD/$d" /tmp/kg/kerngen/$d; done
  export PYTHONPATH=/tmp/kg:${PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
python3 -P scripts/devcheck_playbook.py "$@"
