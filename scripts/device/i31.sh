#!/usr/bin/env bash
# Issue #31 on the GPU host (run from the repository root after `source scripts/device/setup.sh`;
# the carried wheels must include libclang: shared/tools/offline-wheels.sh .whl libclang).
# Prints which confinement mechanisms hold on this host (its kernel may be gVisor or Firecracker's,
# without Landlock), runs the untrusted-source tests there and takes one kernel through the
# confined compile path onto the GPU. Under 4 minutes. Files: $OUT/i31_host.txt, $OUT/i31_tests.txt.
set -uo pipefail
OUT=${OUT:-/tmp/i31-out}
mkdir -p "$OUT"
python3 - > "$OUT/i31_host.txt" 2>&1 <<'PY'
import os, platform
from kerngen.harness.compile import landlock, pp_lexer, sandbox, seccomp
print("kernel", platform.release(), platform.machine())
print("landlock ABI", landlock.abi_version())
try:
    seccomp.program(); print("seccomp table: yes")
except seccomp.SeccompUnavailable as exc:
    print("seccomp table: no,", exc)
try:
    pp_lexer.lex("int x;"); print("libclang lexer: yes")
except Exception as exc:  # noqa: BLE001
    print("libclang lexer: NO,", type(exc).__name__, exc)
try:
    reply = sandbox.sandbox().compile('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n',
                                      ["--gpu-architecture=sm_90"], "sm_90", timeout=120)
    print("worker compile ok:", reply.ok)
except Exception as exc:  # noqa: BLE001
    print("worker compile FAILED:", exc)
print("confinement:", sandbox.confinement())
PY
cat "$OUT/i31_host.txt"
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/harness/test_confinement.py tests/harness/test_lifeline.py \
  tests/harness/test_policy_fuzz.py tests/harness/test_sandbox.py > "$OUT/i31_tests.txt" 2>&1
rc=$?
tail -15 "$OUT/i31_tests.txt"
echo
echo "| check | result |"
echo "|---|---|"
grep -E "^(kernel|landlock ABI|seccomp table|libclang lexer|worker compile|confinement)" "$OUT/i31_host.txt" \
  | sed 's/^\([^:0-9]*\)[: ]\(.*\)$/| \1 | \2 |/'
echo "| tests (exit $rc) | $(tail -1 "$OUT/i31_tests.txt") |"
