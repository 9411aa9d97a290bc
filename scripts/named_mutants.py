"""The five harness mutants issue 39 names, each applied alone to the source, then the CPU tests
that must kill it: prints one line per mutant (killed by which test, or SURVIVED) and exits 1 if
any survives. The source is restored after each (also on Ctrl-C).

    python scripts/named_mutants.py            # about 2 minutes on 2 cores

Each mutant is a textual patch that must apply exactly once (a refactor that moves the code makes
this script fail loudly rather than test nothing). docs/harness-tests.md has the last run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/harness/test_emu_check.py", "tests/harness/test_integrity.py"]

# name -> (file, original text, mutated text)
MUTANTS: dict[str, tuple[str, str, str]] = {
    "accept every kernel": (
        "harness/gpu/check.py",
        "    except CandidateFailed as failure:\n        if failure.evidence.failed is CheckFailure.input_mutated:\n"
        "            state.reset_params()\n        return failure.evidence\n",
        "    except CandidateFailed as failure:\n        if failure.evidence.failed is CheckFailure.input_mutated:\n"
        "            state.reset_params()\n        failure.evidence.failed = None\n        return failure.evidence\n",
    ),
    "skip the run after the reference": (
        "harness/gpu/check.py",
        "    second = _run_poisoned(state, bound, runner, POISON_PATTERNS[(i + 1) % 3], sync, RunCopy.none)\n"
        "    _verify_untouched(state, bound, evidence, \"after the reference\")\n",
        "    second = first\n",
    ),
    "no guard check": (
        "harness/gpu/check.py",
        "        if not buf.guards_intact():\n",
        "        if False:\n",
    ),
    "no timed-output verification": (
        "harness/gpu/evaluate.py",
        "        failure = verify_timed_outputs(self.state, sets, rotation.sampler)\n",
        "        failure = None\n",
    ),
    "no input check": (
        "harness/gpu/check.py",
        "        if not torch.equal(bound.inputs[name].view, pristine):\n",
        "        if False:\n",
    ),
}


def run(name: str, path: str, old: str, new: str) -> str:
    file = ROOT / path
    text = file.read_text()
    if text.count(old) != 1:
        return f"NOT APPLIED (the original text is found {text.count(old)} times in {path})"
    file.write_text(text.replace(old, new))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        file.write_text(text)
    failed = [l.split(" ", 1)[1].split(" - ")[0] for l in done.stdout.splitlines() if l.startswith("FAILED ")]
    return f"killed by {failed[0]}" if done.returncode != 0 and failed else "SURVIVED"


def main() -> int:
    survived = 0
    for name, (path, old, new) in MUTANTS.items():
        line = run(name, path, old, new)
        survived += not line.startswith("killed")
        print(f"{name}: {line}", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
