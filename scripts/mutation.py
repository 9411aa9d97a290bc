"""Mutation testing of the harness's correctness code with cosmic-ray (``pip install -e '.[test]'``).

Each mutant of check, compare, buffers, integrity and evaluate (harness/gpu/) is applied to the
source in place, one at a time, and that module's CPU tests run against it (the emulator suite
tests/harness/test_emu_check.py runs the real protocol end to end). A mutant the tests do not
kill either gets a test that kills it or an entry in EQUIVALENT below, with why it cannot change
a verdict. docs/harness-tests.md has the last scores.

    python scripts/mutation.py                    # every mutant: about 1,960, hours on 2 cores
    python scripts/mutation.py --sample 40        # a random sample (CI: --sample 4 --no-fail)
    python scripts/mutation.py --module compare   # one module
    python scripts/mutation.py --jobs 32          # 32 workers side by side (a many-core host: minutes)

With ``--jobs N`` the project is never mutated in place: each worker gets its own copy of the tree
(tracked and untracked files, ``shared`` linked) with kerngen installed from it, not editable, into
the copy's ``site/`` (first on PYTHONPATH); the worker mutates that copy's modules and runs the
copy's tests, on its share of the mutants.

Exits 1 when a mutant outside EQUIVALENT survives (and prints it), 0 otherwise. cosmic-ray edits
the files and restores them after each mutant; sessions land in --out (default
/tmp/kerngen-mutation).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly"
EMU = "tests/harness/test_emu_check.py"
COSMIC_RAY = [sys.executable, "-m", "cosmic_ray.cli"]
# test_harness_cpu.py without its worker-pool tests (seconds each, and no code of these modules)
CPU = "tests/harness/test_harness_cpu.py -k 'not pool and not worker and not interrupted and not problem_setup'"
# the chunked comparison (every other test compares in one chunk): seconds, and no KernelBench file
CHUNKED = " ".join(f"tests/harness/test_memory_plan.py::test_{t}" for t in (
    "chunked_compare_is_the_whole_tensor_comparison", "compare_runs_on_the_chosen_device_with_a_host_reference"))
# module -> the CPU tests that must kill its mutants
TESTS = {
    "check": f"tests/harness/test_check_mutants.py tests/harness/test_integrity.py {EMU}",
    "evaluate": f"tests/harness/test_check_mutants.py {EMU}",
    "integrity": f"tests/harness/test_integrity.py {EMU}",
    "compare": f"tests/harness/test_check_mutants.py tests/harness/test_error_pattern.py {CHUNKED} {CPU} {EMU}",
    "buffers": f"tests/harness/test_check_mutants.py tests/harness/test_buffers_scalar.py {CPU} {EMU}",
}
# (module, operator, line) of mutants that cannot change a verdict, and why (docs/harness-tests.md); a key
# with a fourth item, cosmic-ray's occurrence number, names one mutant of that operator on that line where
# others of them are killed; mutants inside annotations are found by _annotations()
_DIGEST = ("the seal's digest stays a keyed function of the tensor's bytes that is the same for the same bytes "
           "and changes with any one word, so a seal breaks exactly when it did")
_CHUNKS = ("the verdict and every figure are those of the whole-tensor comparison whatever the chunk (test_memory_plan.py::"
           "test_chunked_compare_is_the_whole_tensor_comparison, in compare's tests), only the time and memory differ")
EQUIVALENT: dict[tuple, str] = {
    ("integrity", "core/NumberReplacer", 26): f"_MASK 2**64 - 1 -> another width (2**63, 2**65, - 2): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_BitAnd", 26): f"_MASK -> -1 (no mask, an unbounded int): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_FloorDiv", 26): f"_MASK -> -1 (no mask): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_RShift", 26): f"_MASK -> -1 (no mask): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_Sub", 26): "_MASK -> -64 (the low 6 bits cleared): a change of "
    "the sum by d*r (r >= 1 drawn from 2**31 values) stays visible unless it lands in the same 64-block, which for "
    "a weight of that size practically never happens; measured: a one-bit change seen under 500 of 500 keys",
    ("integrity", "core/ReplaceBinaryOperator_BitAnd_Add", 46): f"the sum plus a constant instead of masked: {_DIGEST}",
    ("integrity", "core/NumberReplacer", 30): f"a key of 6 or 8 random bytes instead of 7: {_DIGEST}",
    ("integrity", "core/ReplaceComparisonOperator_NotEq_IsNot", 36): "`dtype != torch.bool` -> `is not`: torch "
    "dtypes are singletons",
    ("integrity", "core/ReplaceComparisonOperator_Eq_LtE", 37): "`x % 4 == 0` -> `x % 4 <= 0`: a remainder is never "
    "negative",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Div", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Mul", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Pow", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_LShift", 37): f"words only at storage offset 0, bytes elsewhere: "
    f"{_DIGEST}",
    ("integrity", "core/NumberReplacer", 43): "sample positions drawn from [-1, n) (-1 indexes the last word) or [1, n) "
    "(word 0 never among the sampled: it is read whole below SAMPLE words, and one word of a larger tensor is read "
    "with probability SAMPLE/n either way)",
    ("integrity", "core/NumberReplacer", 45): "weights drawn from [0 or 2, 2**31), [1, 2**30) or [1, 2**32): any one "
    "word still moves the digest (a zero weight: with probability 2**-31) and two swapped words still differ",
    ("integrity", "core/ReplaceBinaryOperator_BitAnd_Mod", 46): f"the sum reduced mod 2**64 - 1 instead of 2**64: "
    f"{_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mul_BitXor", 46): f"sum of word ^ weight instead of word * weight: {_DIGEST} "
    "(and a swap of two words too, as tests/harness/test_integrity.py checks under 200 keys)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Pow", 158): "ceil(n / B) -> n // B + 1: one more loop turn, "
    "over an empty slice with an empty block",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitOr", 132): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) | 1) "
    "// B: the same block, or (b a multiple of B) one block more past the chunk's end, sliced off (its size "
    "total - k * B is never negative: k * B <= b <= total)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitXor", 158): "(n + B - 1) -> (n + B) ^ 1: ceil(n / B) or one "
    "more loop turn, over an empty slice with an empty block",
    ("evaluate", "core/ReplaceBinaryOperator_BitOr_Add", 42): "fresh seeds `| 1` -> `+ 1`: still never the "
    "default seed 0 (test_emu_check.py::test_fresh_seeds_are_never_the_default_seed), still fresh random values",
    ("evaluate", "core/NumberReplacer", 135): "a launch plan's refusal kept to 999 characters instead of 1000 in "
    "the message: the verdict is invalid_spec either way",
    ("evaluate", "core/ReplaceBinaryOperator_Sub_Mod", 145): "wall_s `now - started` -> `now % started`: the same "
    "while now < 2 * started, i.e. while an evaluation lasts less than the clock's whole count so far",
    ("evaluate", "core/ReplaceBinaryOperator_Sub_Mod", 213): "a phase `now - last` -> `now % last`: the same while "
    "a phase lasts less than the clock's whole count so far",
    ("evaluate", "core/ReplaceOrWithAnd", 151, 2): "`or not refs_on_gpu or not pristine_on_gpu` -> `or (not refs and "
    "not pristine)`: differs only for a plan with every timed set (3) and exactly one copy off the GPU, which "
    "plan_memory never gives (off-GPU copies come before fewer sets; 200,000 random sizes and free bytes tried)",
    ("evaluate", "core/NumberReplacer", 42, 2): "fresh seeds from 5 random bytes instead of 4: still fresh, never 0",
    ("evaluate", "core/NumberReplacer", 42, 3): "fresh seeds from 3 random bytes instead of 4: 2**24 input sets a "
    "kernel cannot know in advance, never 0",
    ("evaluate", "core/NumberReplacer", 42, 4): "fresh seeds `| 1` -> `| 2`: still never the default seed 0",
    ("evaluate", "core/ReplaceComparisonOperator_Lt_NotEq", 151): "`timed_sets < ROTATE_SETS` -> `!=`: the memory "
    "plan never gives more timed sets than ROTATE_SETS (rotate_max)",
    ("evaluate", "core/ReplaceComparisonOperator_Lt_IsNot", 151): "`timed_sets < ROTATE_SETS` -> `is not`: at most "
    "ROTATE_SETS, and small ints are one object each",
    ("evaluate", "core/NumberReplacer", 213, 20): "phases rounded to 7 digits instead of 6: finer, no verdict",
    ("evaluate", "core/NumberReplacer", 133): "the out-of-memory text kept to 199 or 201 characters instead of 200 in "
    "a harness_error's message: the verdict is the same",
    ("evaluate", "core/NumberReplacer", 165): "keep_max 0 -> 1 or -1 when the evaluation does not time: at most one set "
    "kept in memory for a timing that never comes, or none; the check and its verdict are the same",
    ("evaluate", "core/NumberReplacer", 237, 39): "`self.k < 0` -> `< -1` in _Rotation.call: timing.bench calls "
    "before_each (prepare) before every call of fn, so call() never meets k < 0",
    ("evaluate", "core/NumberReplacer", 37): "ROTATE_SETS 3 -> 4: one more input set to rotate over (memory, no "
    "verdict): any count from 2 defeats a kernel that caches by pointer or content; the memory plan still caps it",
    ("check", "core/ReplaceComparisonOperator_Is_Eq", 236): "`failed is CheckFailure.input_mutated` -> `==`: "
    "failed is a member of the enum or None, and a member equals only itself",
    ("check", "core/ReplaceComparisonOperator_Eq_LtE", 311): "`a.device.type == \"cpu\"` -> `<= \"cpu\"`: no "
    "torch device type sorts before \"cpu\" (cuda, meta, mps, xpu, hip, ... all sort after it)",
    ("compare", "core/ReplaceBinaryOperator_LShift_Mul", 60): "CHUNK_ELEMENTS `1 << 25` -> `1 * 25`: chunks of 25 "
    "elements give the whole-tensor verdict, only slower (test_memory_plan.py::"
    "test_chunked_compare_is_the_whole_tensor_comparison; CI's sample of 2026-11-28, seed 3047662003)",
    ("compare", "core/ReplaceBinaryOperator_LShift_BitXor", 60): "CHUNK_ELEMENTS `1 << 25` -> `1 ^ 25` (24): chunks "
    f"of 24 elements: {_CHUNKS}",
    ("compare", "core/ReplaceBinaryOperator_LShift_Add", 60): f"CHUNK_ELEMENTS `1 << 25` -> `1 + 25` (26): {_CHUNKS}",
    ("compare", "core/ReplaceBinaryOperator_Mul_Div", 66): "compare(out, ref, *, atol, ...) -> (out, ref, /, atol, "
    "...): every caller passes out and ref by position and the rest by name, which both signatures take alike",
    ("compare", "core/NumberReplacer", 89): "describe(..., atol=0.0, rtol=0.0, exact=True): with exact the pattern "
    "reads `out != ref` and `a == b` (error_pattern.py), never atol or rtol, so any numbers there give the same text",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 185): "`nbad == 0` -> `nbad <= 0`: nbad is a count of "
    "elements, never negative",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 174): "`worst.numel() == 0` -> `<= 0`: a count of "
    "elements, never negative",
    ("compare", "core/NumberReplacer", 94, 40): "`range(0, max(numel, 1), step)` -> `max(numel, 2)`: one more "
    "loop turn at most (numel 0 or 1), over empty slices, which add nothing to the totals",
    ("compare", "core/NumberReplacer", 146): "_Totals.bad_worst's start (-1.0, 0, 0.0, 0.0), any number changed: "
    "it is read only when an element mismatched, and the first chunk with one replaces it (`err > best[0]`), its "
    "error being > 0 (isclose holds for equal values; a NaN's error counts as inf)",
    ("compare", "core/ReplaceUnaryOperator_USub_Not", 146): "_Totals.bad_worst's start error -1.0 -> `not 1.0` "
    "(False, 0): a mismatched element's error is > 0, so the first chunk with one replaces it as before",
    **{("compare", "core/NumberReplacer", 145, k): "_Totals.ok_worst's starting index, got or expected changed: the "
       "first chunk replaces the whole start (its error >= 0 > -1.0), and an empty output reports none of it (_result)"
       for k in range(66, 72)},
    ("compare", "core/NumberReplacer", 145, 64): "_Totals.ok_worst's start error -1.0 -> -2.0: an element's error is "
    ">= 0, above either, so the first chunk replaces the start as before",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 188): "`still_poisoned(...) & bad` -> `*` in _compare_exact: "
    "both are bool tensors, whose product is their logical and, of dtype bool",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 99): "`acc.nbad == 0` -> `<= 0`: a count, never negative",
    ("compare", "core/ReplaceComparisonOperator_NotEq_IsNot", 79): "`out.dtype != ref.dtype` -> `is not`: torch "
    "dtypes are singletons",
    ("compare", "core/NumberReplacer", 60, 29): f"CHUNK_ELEMENTS `1 << 25` -> `1 << 24`: {_CHUNKS}",
    ("compare", "core/NumberReplacer", 198, 111): "`max(max_err, 0.0)` -> `-1.0`: the worst error is never "
    "negative there (an element's error >= 0, an exact mismatch's 1.0, an empty output's 0.0)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 153): "`isfinite(o) & isfinite(r)` -> `*`: both are bool "
    "tensors, whose product is their logical and, of dtype bool",
    ("compare", "core/NumberReplacer", 94, 41): "`range(0, max(numel, 1), step)` -> `max(numel, 0)`: an empty output "
    "gets no loop turn instead of one over empty slices, which adds nothing to the totals",
    ("compare", "core/NumberReplacer", 94, 43): "`max(1, chunk)` -> `max(0, chunk)`: differs only for chunk <= 0, "
    "which no caller gives (CHUNK_ELEMENTS; the tests' chunks are >= 1)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 161): "`bad & ~finite` -> `*`: both are bool tensors, "
    "whose product is their logical and, of dtype bool (CI's sample of 2026-11-28, seed 2748359795)",
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


def _still_pending(sessions: list) -> set[str]:
    """The job ids of every session still pending (after the sample's skips)."""
    from cosmic_ray.work_db import WorkDB, use_db

    ids: set[str] = set()
    for _, _, db in sessions:
        with use_db(str(db), WorkDB.Mode.open) as work:
            ids |= {w.job_id for w in work.pending_work_items}
    return ids


def _skip(db, job_ids: list[str], why: str = "not sampled") -> None:
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if job_ids:
        db.set_multiple_results(job_ids, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why))


# top-level folders never copied into a worker's tree: shared is linked, the rest hold carried wheels and builds
_NOT_COPIED = (".git", ".whl", ".mut", ".ray", "shared")
OTHER_WORKER = "another worker's"  # the result a worker's copy of a session gives the mutants it does not run


def copied(listed: list[str], tracked: list[str]) -> list[str]:
    """The files of ``git ls-files -co --exclude-standard`` (``listed``) a worker's tree gets: not shared (linked) nor
    the carried folders, and no untracked top-level dot folder (the GPU host's copy lacks .git/info/exclude's
    lines, so its carried wheels and trees show there as untracked files)."""
    tops = {name.split("/", 1)[0] for name in tracked if name}
    keep = []
    for name in filter(None, listed):
        top = name.split("/", 1)[0]
        if top not in _NOT_COPIED and not (top.startswith(".") and top not in tops):
            keep.append(name)
    return keep


def _worker_tree(out: Path, j: int) -> Path:
    """Worker ``j``'s copy of the project (see the module docstring); returns its folder."""
    w = out / f"worker{j}"
    shutil.rmtree(w, ignore_errors=True)
    tree = w / "tree"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True).stdout.decode().split("\0")
    if listed.returncode == 0:
        for name in copied(listed.stdout.decode().split("\0"), tracked):
            src = ROOT / name
            if src.is_file():  # a tracked file deleted in the work tree is not copied
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, tree / name)
    else:  # no git here (the GPU host's copy of the tree): everything but carried wheels, builds and runs
        shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
            *_NOT_COPIED, "build", "runs", "*.egg-info", "__pycache__"))
    if (ROOT / "shared").exists():
        (tree / "shared").symlink_to((ROOT / "shared").resolve())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
                    "--target", str(w / "site"), str(tree)], check=True, capture_output=True)
    # the tests run from the tree, whose own kerngen/ folder would come first on sys.path and hand every
    # subpackage it lacks (kerngen.harness, ...) to the editable install at ROOT: the installed copy is the package
    shutil.rmtree(tree / "kerngen")
    return w


def _worker_session(w: Path, m: str, db: Path, mine: set[str], timeout_s: float) -> tuple[Path, Path]:
    """A copy of module ``m``'s session for worker folder ``w``: only the job ids ``mine`` left pending,
    the mutants pointed at the copy's installed module."""
    wdb, cfg = w / f"{m}.sqlite", w / f"{m}.toml"
    shutil.copy2(db, wdb)
    module = w / "site" / "kerngen" / "harness" / "gpu" / f"{m}.py"
    cfg.write_text(_config(m, timeout_s).replace(f'"harness/gpu/{m}.py"', f'"{module}"'))
    with sqlite3.connect(wdb) as con:
        con.execute("UPDATE mutation_specs SET module_path = ?", (str(module),))
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(wdb), WorkDB.Mode.open) as work:
        _skip(work, [w_.job_id for w_ in work.pending_work_items if w_.job_id not in mine], OTHER_WORKER)
    return wdb, cfg


def _run_workers(sessions: list, pending: list[tuple[Path, str]], jobs: int, out: Path, timeout_s: float,
                 budget_s: float = 0.0) -> list:
    """The pending mutants shared among ``jobs`` workers, each in its own copy, side by side; the
    sessions to read the results from: (module, worker's db) for every worker and module. With
    ``budget_s`` the workers are stopped then (their sessions keep every mutant judged so far: a device
    call has a time limit, and a run killed from outside would hand back nothing)."""
    shares = [set(job for _, job in pending[j::jobs]) for j in range(jobs)]
    results: list[tuple[str, Path]] = []
    failures: list[str] = []
    running: list[subprocess.Popen] = []
    stop = threading.Event()

    def worker(j: int) -> None:
        try:
            w = _worker_tree(out, j)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(w / "site"),
                                                                             os.environ.get("PYTHONPATH")]))}
            for m, _, db in sessions:
                mine = {job for d, job in pending if d == db} & shares[j]
                if not mine or stop.is_set():
                    continue
                wdb, cfg = _worker_session(w, m, db, mine, timeout_s)
                results.append((m, wdb))
                seen = subprocess.run([sys.executable, "-c", f"import kerngen.harness.gpu.{m} as m; print(m.__file__)"],
                                      cwd=w / "tree", env=env, capture_output=True, text=True).stdout.strip()
                if Path(seen) != w / "site" / "kerngen" / "harness" / "gpu" / f"{m}.py":
                    failures.append(f"worker {j}: its tests would import {seen or 'nothing'}, not its copy of {m}")
                    return
                if subprocess.run(f"{PYTEST} {TESTS[m]}", shell=True, cwd=w / "tree", env=env,
                                  capture_output=True).returncode != 0:
                    failures.append(f"worker {j}: the tests of {m} fail on its unmutated copy ({w / 'tree'})")
                    return
                if stop.is_set():
                    return
                proc = subprocess.Popen([*COSMIC_RAY, "exec", str(cfg), str(wdb)], cwd=w / "tree", env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                running.append(proc)
                err = proc.communicate()[1]
                if proc.returncode != 0 and not stop.is_set():
                    raise subprocess.CalledProcessError(proc.returncode, "cosmic-ray exec", stderr=err)
        except (OSError, subprocess.CalledProcessError) as exc:
            tail = (getattr(exc, "stderr", b"") or b"")[-600:]
            failures.append(f"worker {j}: {type(exc).__name__}: {exc} {tail.decode(errors='replace')}")

    threads = [threading.Thread(target=worker, args=(j,), daemon=True) for j in range(jobs)]
    deadline = time.monotonic() + budget_s if budget_s > 0 else None
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        stop.set()
        print(f"budget of {budget_s:.0f} s spent: the workers are stopped, the mutants judged so far count", flush=True)
        for proc in list(running):
            proc.kill()
        grace = time.monotonic() + 30  # a worker still setting up its copy is a daemon: it dies with the process
        for t in threads:
            t.join(max(0.0, grace - time.monotonic()))
    if failures:
        raise SystemExit("\n".join(failures))
    return results


def main() -> int:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="run this many mutants, drawn at random (0: all)")
    ap.add_argument("--seed", type=int, default=None, help="the sample's seed (default: a fresh one, printed)")
    ap.add_argument("--module", action="append", choices=sorted(TESTS), help="only these modules")
    ap.add_argument("--out", default="/tmp/kerngen-mutation")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    ap.add_argument("--jobs", type=int, default=1, help="workers side by side, each on its own copy of the tree")
    ap.add_argument("--budget-s", type=float, default=0.0, help="with --jobs: stop the workers after this many "
                    "seconds and report the mutants judged by then (0: no limit)")
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
                          or (m, s.operator_name, s.start_pos[0], s.occurrence) in EQUIVALENT
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
    if args.jobs > 1:
        still = _still_pending(sessions)  # once: read per mutant, the sessions took minutes before any worker ran
        pending = [(db, job) for db, job in pending if job in still]
        read = _run_workers(sessions, pending, args.jobs, out, args.timeout, args.budget_s)
    else:
        read = [(m, db) for m, _, db in sessions]
        for m, cfg, db in sessions:
            with use_db(str(db), WorkDB.Mode.open) as work:
                if not list(work.pending_work_items):
                    continue
            # a test command that fails unmutated would "kill" every mutant
            base = subprocess.run(f"{PYTEST} {TESTS[m]}", shell=True, cwd=ROOT, capture_output=True, text=True)
            if base.returncode != 0:
                print(f"the tests of {m} fail on the unmutated source: fix them first ({PYTEST} {TESTS[m]})\n"
                      f"{(base.stdout + base.stderr)[-3000:]}")
                return 2
            subprocess.run([*COSMIC_RAY, "exec", str(cfg), str(db)], cwd=ROOT, check=True)
    killed = survived = other = unjudged = 0
    for m, db in read:
        with use_db(str(db), WorkDB.Mode.open) as work:
            unjudged += sum(1 for _ in work.pending_work_items)
            for item, result in work.completed_work_items:
                if result.output in ("not sampled", "equivalent", "gpu-only", OTHER_WORKER) or result.test_outcome is None:
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
    print(f"mutants run: {total + other}; killed {killed}, survived {survived}, incompetent {other}; score {score}"
          + (f"; {unjudged} not judged (the budget)" if unjudged else ""))
    return 1 if survived and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
