"""Mutation testing of the harness's correctness code with cosmic-ray (``pip install -e '.[test]'``).

Each mutant of check, compare, buffers, integrity and evaluate (harness/gpu/) is applied to the
source in place, one at a time, and that module's CPU tests run against it (the emulator suite
tests/harness/test_emu_check.py runs the real protocol end to end). A mutant the tests do not
kill either gets a test that kills it or an entry in EQUIVALENT below, with why it cannot change
a verdict. docs/harness-tests.md has the last scores.

    python scripts/mutation.py                    # every mutant: about 1,960, hours on 2 cores
    python scripts/mutation.py --sample 40        # a random sample (CI: --sample 4 --no-fail)
    python scripts/mutation.py --module compare   # one module

Exits 1 when a mutant outside EQUIVALENT survives (and prints it), 0 otherwise. cosmic-ray edits
the files and restores them after each mutant; sessions land in --out (default
/tmp/kerngen-mutation).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly"
EMU = "tests/harness/test_emu_check.py"
COSMIC_RAY = [sys.executable, "-m", "cosmic_ray.cli"]
# test_harness_cpu.py without its worker-pool tests (seconds each, and no code of these modules)
CPU = "tests/harness/test_harness_cpu.py -k 'not pool and not worker and not interrupted and not problem_setup'"
# module -> the CPU tests that must kill its mutants
TESTS = {
    "check": f"tests/harness/test_check_mutants.py tests/harness/test_integrity.py {EMU}",
    "evaluate": f"tests/harness/test_check_mutants.py {EMU}",
    "integrity": f"tests/harness/test_integrity.py {EMU}",
    "compare": f"tests/harness/test_check_mutants.py tests/harness/test_error_pattern.py {CPU} {EMU}",
    "buffers": f"tests/harness/test_check_mutants.py tests/harness/test_buffers_scalar.py {CPU} {EMU}",
}
# (module, operator, line) of mutants that cannot change a verdict, and why (docs/harness-tests.md);
# mutants inside annotations are found by _annotations()
EQUIVALENT: dict[tuple[str, str, int], str] = {
    ("buffers", "core/ReplaceBinaryOperator_Sub_Pow", 158): "ceil(n / B) -> n // B + 1: one more loop turn, "
    "over an empty slice with an empty block",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitOr", 132): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) | 1) "
    "// B: the same block, or (b a multiple of B) one block more past the chunk's end, sliced off (its size "
    "total - k * B is never negative: k * B <= b <= total)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitXor", 158): "(n + B - 1) -> (n + B) ^ 1: ceil(n / B) or one "
    "more loop turn, over an empty slice with an empty block",
    ("evaluate", "core/NumberReplacer", 37): "ROTATE_SETS 3 -> 4: one more input set to rotate over (memory, no "
    "verdict): any count from 2 defeats a kernel that caches by pointer or content; the memory plan still caps it",
    ("check", "core/ReplaceComparisonOperator_Is_Eq", 236): "`failed is CheckFailure.input_mutated` -> `==`: "
    "failed is a member of the enum or None, and a member equals only itself",
    ("check", "core/ReplaceComparisonOperator_Eq_LtE", 311): "`a.device.type == \"cpu\"` -> `<= \"cpu\"`: no "
    "torch device type sorts before \"cpu\" (cuda, meta, mps, xpu, hip, ... all sort after it)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 162): "`still_poisoned(...) & bad` -> `*`: both are bool "
    "tensors, whose product is their logical and, of dtype bool",
}
# code that runs on a GPU only (CUDA memory queries): its mutants are the GPU tier's (test_memory_plan.py -m gpu)
GPU_ONLY = {"check": ("footprint",), "evaluate": ("CudaDevice",)}


def _config(module: str, timeout_s: float) -> str:
    return (f'[cosmic-ray]\nmodule-path = "harness/gpu/{module}.py"\ntimeout = {timeout_s}\nexcluded-modules = []\n'
            f'test-command = "{PYTEST} {TESTS[module]}"\n[cosmic-ray.distributor]\nname = "local"\n')


def _annotations(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every annotation in the module: with ``from __future__ import annotations``
    (all five modules) they are strings never evaluated, so a mutant inside one is equivalent."""
    import ast

    source = (ROOT / "harness" / "gpu" / f"{module}.py").read_text()
    assert "from __future__ import annotations" in source, module
    spans = []
    for node in ast.walk(ast.parse(source)):
        notes = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            notes = [node.annotation]
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n is not None]
    return spans


def _gpu_only(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    import ast

    tree = ast.parse((ROOT / "harness" / "gpu" / f"{module}.py").read_text())
    return [((n.lineno, 0), (n.end_lineno + 1, 0)) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in GPU_ONLY.get(module, ())]


def _skip(db, job_ids: list[str], why: str = "not sampled") -> None:
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if job_ids:
        db.set_multiple_results(job_ids, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why))


def main() -> int:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="run this many mutants, drawn at random (0: all)")
    ap.add_argument("--seed", type=int, default=None, help="the sample's seed (default: a fresh one, printed)")
    ap.add_argument("--module", action="append", choices=sorted(TESTS), help="only these modules")
    ap.add_argument("--out", default="/tmp/kerngen-mutation")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when a mutant survives (CI's sample: "
                    "a survivor is printed for a person to kill or explain, not a reason to refuse a change)")
    args = ap.parse_args()
    modules = args.module or sorted(TESTS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sessions = []
    for m in modules:
        cfg, db = out / f"{m}.toml", out / f"{m}.sqlite"
        cfg.write_text(_config(m, args.timeout))
        db.unlink(missing_ok=True)
        subprocess.run([*COSMIC_RAY, "init", str(cfg), str(db)], cwd=ROOT, check=True)
        sessions.append((m, cfg, db))
    pending: list[tuple[Path, str]] = []
    skipped = 0
    for m, _, db in sessions:
        with use_db(str(db), WorkDB.Mode.open) as work:
            notes, gpu = _annotations(m), _gpu_only(m)
            equivalent = [w.job_id for w in work.pending_work_items for s in w.mutations
                          if (m, s.operator_name, s.start_pos[0]) in EQUIVALENT
                          or any(a <= tuple(s.start_pos) < b for a, b in notes)]
            _skip(work, equivalent, "equivalent")
            on_gpu = [w.job_id for w in work.pending_work_items for s in w.mutations
                      if any(a <= tuple(s.start_pos) < b for a, b in gpu)]
            _skip(work, on_gpu, "gpu-only")
            skipped += len(set(equivalent)) + len(set(on_gpu))
            pending += [(db, w.job_id) for w in work.pending_work_items]
    print(f"{len(pending) + skipped} mutants; {skipped} skipped: inside annotations, in EQUIVALENT, or in GPU-only "
          "code", flush=True)
    if args.sample and args.sample < len(pending):
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        print(f"sample: {args.sample} of {len(pending)} mutants, seed {seed}", flush=True)
        keep = set(random.Random(seed).sample(range(len(pending)), args.sample))
        for m, _, db in sessions:
            with use_db(str(db), WorkDB.Mode.open) as work:
                _skip(work, [job for i, (d, job) in enumerate(pending) if d == db and i not in keep])
    for m, cfg, db in sessions:
        with use_db(str(db), WorkDB.Mode.open) as work:
            if not list(work.pending_work_items):
                continue
        # a test command that fails unmutated would "kill" every mutant
        if subprocess.run(f"{PYTEST} {TESTS[m]}", shell=True, cwd=ROOT, capture_output=True).returncode != 0:
            print(f"the tests of {m} fail on the unmutated source: fix them first ({PYTEST} {TESTS[m]})")
            return 2
        subprocess.run([*COSMIC_RAY, "exec", str(cfg), str(db)], cwd=ROOT, check=True)
    killed = survived = other = 0
    for m, _, db in sessions:
        with use_db(str(db), WorkDB.Mode.open) as work:
            for item, result in work.completed_work_items:
                if result.output in ("not sampled", "equivalent", "gpu-only") or result.test_outcome is None:
                    continue
                if result.test_outcome is TestOutcome.KILLED:
                    killed += 1
                elif result.test_outcome is TestOutcome.SURVIVED:
                    survived += 1
                    s = item.mutations[0]
                    print(f"SURVIVED {m}.py:{s.start_pos[0]} {s.operator_name} #{s.occurrence}\n{result.diff}",
                          flush=True)
                else:
                    other += 1
    total = killed + survived
    score = f"{killed / total:.1%}" if total else "-"
    print(f"mutants run: {total + other}; killed {killed}, survived {survived}, incompetent {other}; score {score}")
    return 1 if survived and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
