"""Mutation testing of the harness's correctness code with cosmic-ray (``pip install -e '.[test]'``).

Each mutant of check, compare, buffers, integrity and evaluate (harness/gpu/) is applied to the
source in place, one at a time, and that module's CPU tests run against it (the emulator suite
tests/harness/test_emu_check.py runs the real protocol end to end). A mutant the tests do not
kill either gets a test that kills it or an entry in EQUIVALENT (mutation_equivalent.py), with why it cannot change
a verdict. docs/harness-tests.md has the last scores.

    python scripts/mutation.py                    # every mutant: about 1,960, hours on 2 cores
    python scripts/mutation.py --sample 40        # a random sample (CI: --sample 4 --no-fail)
    python scripts/mutation.py --module compare   # one module
    python scripts/mutation.py --jobs 32          # 32 workers side by side (a many-core host: minutes)
    python scripts/mutation.py --jobs 14 --budget-s 480   # stop after 8 minutes (a device call), the judged count
    python scripts/mutation.py --resume --budget-s 480    # ... and go on where it stopped (the next call)

With ``--jobs N`` the project is never mutated in place: each worker gets its own copy of the tree
(tracked and untracked files, ``shared`` linked) with kerngen installed from it, not editable, into
the copy's ``site/`` (first on PYTHONPATH); the worker mutates that copy's modules and runs the
copy's tests, on its share of the mutants.

Exits 1 when a mutant outside EQUIVALENT survives (and prints it), 2 when the tests fail unmutated (with
--jobs, in a worker: the others' results are reported first), 0 otherwise. cosmic-ray edits
the files and restores them after each mutant; sessions land in --out (default
/tmp/kerngen-mutation).
"""

from __future__ import annotations

import argparse
import importlib.util
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


def _load(name: str):
    """A module of this script's own folder, by path (the script is run as a file, or loaded by path in tests)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
# mutants that cannot change a verdict, and why: their own file (a table that grows with every run)
EQUIVALENT: dict[tuple, str] = _load("mutation_equivalent").EQUIVALENT
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


def _mark_skips(work, m: str) -> int:
    """Mark module ``m``'s pending mutants in EQUIVALENT, inside annotations or in GPU-only code as skipped in the
    session ``work``; how many."""
    notes, gpu = _annotations(m), _gpu_only(m)
    equivalent = [w.job_id for w in work.pending_work_items for s in w.mutations
                  if (m, s.operator_name, s.start_pos[0]) in EQUIVALENT
                  or (m, s.operator_name, s.start_pos[0], s.occurrence) in EQUIVALENT
                  or any(a <= tuple(s.start_pos) < b for a, b in notes)]
    _skip(work, equivalent, "equivalent")
    on_gpu = [w.job_id for w in work.pending_work_items for s in w.mutations
              if any(a <= tuple(s.start_pos) < b for a, b in gpu)]
    _skip(work, on_gpu, "gpu-only")
    return len(set(equivalent)) + len(set(on_gpu))


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


def _worker_copy_fails(w: Path, m: str, env: dict[str, str]) -> str:
    """Why worker folder ``w``'s copy cannot judge module ``m``'s mutants ("" when it can): its tests must import
    the copy's module and pass on it unmutated."""
    seen = subprocess.run([sys.executable, "-c", f"import kerngen.harness.gpu.{m} as m; print(m.__file__)"],
                          cwd=w / "tree", env=env, capture_output=True, text=True).stdout.strip()
    if Path(seen) != w / "site" / "kerngen" / "harness" / "gpu" / f"{m}.py":
        return f"its tests would import {seen or 'nothing'}, not its copy of {m}"
    base = subprocess.run(f"{PYTEST} {TESTS[m]}", shell=True, cwd=w / "tree", env=env, capture_output=True, text=True)
    if base.returncode != 0:
        return f"the tests of {m} fail on its unmutated copy ({w / 'tree'}):\n{(base.stdout + base.stderr)[-1500:]}"
    return ""


def _run_workers(sessions: list, pending: list[tuple[Path, str]], jobs: int, out: Path, timeout_s: float,
                 budget_s: float = 0.0, resume: list[Path] | None = None) -> tuple[list, bool]:
    """The pending mutants shared among ``jobs`` workers, each in its own copy, side by side; the
    sessions to read the results from: (module, worker's db) for every worker and module, and whether a
    worker failed (its share then stays unjudged, the rest is read). With
    ``budget_s`` the workers are stopped then (their sessions keep every mutant judged so far: a device
    call has a time limit, and a run killed from outside would hand back nothing). With ``resume`` (the folders of an
    earlier run's workers, one a job) each goes on with its own sessions' pending mutants."""
    shares = [set(job for _, job in pending[j::jobs]) for j in range(jobs)]
    # the cores this process may use shared among the workers: torch's threads per test process otherwise default to
    # all of them (on the GPU host 12 workers x 12 threads on 12 cores had not run compare's tests once in 6 minutes,
    # the likely cause)
    omp_threads = str(max(1, len(os.sched_getaffinity(0)) // jobs))
    results: list[tuple[str, Path]] = []
    failures: list[str] = []
    running: list[subprocess.Popen] = []
    stop = threading.Event()

    def worker(j: int) -> None:
        try:
            w = resume[j] if resume else _worker_tree(out, j)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(w / "site"),
                                                                             os.environ.get("PYTHONPATH")])),
                   "OMP_NUM_THREADS": omp_threads}
            for m, _, db in sessions:
                if resume:  # its own session as left, its module as installed (a killed mutant leaves it mutated)
                    wdb, cfg = w / f"{m}.sqlite", w / f"{m}.toml"
                    if not wdb.exists() or stop.is_set():
                        continue
                    shutil.copy2(w / "tree" / "harness" / "gpu" / f"{m}.py",
                                 w / "site" / "kerngen" / "harness" / "gpu" / f"{m}.py")
                    results.append((m, wdb))
                else:
                    mine = {job for d, job in pending if d == db} & shares[j]
                    if not mine or stop.is_set():
                        continue
                    wdb, cfg = _worker_session(w, m, db, mine, timeout_s)
                    results.append((m, wdb))
                    failure = _worker_copy_fails(w, m, env)
                    if failure:  # its share stays unjudged; the other workers go on
                        failures.append(f"worker {j}: {failure}")
                        return
                    print(f"worker {j}: {m}'s tests pass on its copy at {time.monotonic() - began:.0f} s", flush=True)
                    if stop.is_set():
                        return
                proc = subprocess.Popen([*COSMIC_RAY, "exec", str(cfg), str(wdb)], cwd=w / "tree", env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                running.append(proc)
                err = proc.communicate()[1]
                if proc.returncode != 0 and not stop.is_set():
                    raise subprocess.CalledProcessError(proc.returncode, "cosmic-ray exec", stderr=err)
        except Exception as exc:  # noqa: BLE001 (any failure of a worker is reported, not lost in its thread)
            tail = (getattr(exc, "stderr", b"") or b"")[-600:]
            failures.append(f"worker {j}: {type(exc).__name__}: {exc} {tail.decode(errors='replace')}")

    began = time.monotonic()
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
    for failure in failures:  # reported; the mutants judged by the other workers still count
        print(failure, flush=True)
    return results, bool(failures)


def _baseline_passes(modules: list[str]) -> bool:
    """Whether each module's tests pass on the unmutated source (printing the failing output if not)."""
    for m in modules:
        started = time.monotonic()
        base = subprocess.run(f"{PYTEST} {TESTS[m]}", shell=True, cwd=ROOT, capture_output=True, text=True)
        if base.returncode != 0:
            print(f"the tests of {m} fail on the unmutated source: fix them first ({PYTEST} {TESTS[m]})\n"
                  f"{(base.stdout + base.stderr)[-3000:]}", flush=True)
            return False
        print(f"{m}: its tests pass unmutated in {time.monotonic() - started:.0f} s", flush=True)
    return True


def main() -> int:
    from cosmic_ray.work_db import WorkDB, use_db

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="run this many mutants, drawn at random (0: all)")
    ap.add_argument("--seed", type=int, default=None, help="the sample's seed (default: a fresh one, printed)")
    ap.add_argument("--module", action="append", choices=sorted(TESTS), help="only these modules")
    ap.add_argument("--out", default="/tmp/kerngen-mutation")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    ap.add_argument("--jobs", type=int, default=1, help="workers side by side, each on its own copy of the tree")
    ap.add_argument("--budget-s", type=float, default=0.0, help="with --jobs: stop the workers this many "
                    "seconds after the start (init and the unmutated run included) and report the mutants judged by "
                    "then (0: no limit)")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when a mutant survives (CI's sample: "
                    "a survivor is printed for a person to kill or explain, not a reason to refuse a change)")
    ap.add_argument("--resume", action="store_true", help="go on with the --jobs run left in --out (stopped by its "
                    "budget, e.g. by an earlier device call of the same lease): each worker its own pending mutants")
    args = ap.parse_args()
    started = time.monotonic()  # the budget counts from here: a device call's limit takes in init and the baseline
    modules = args.module or sorted(TESTS)
    out = Path(args.out)
    if args.resume:
        return _resume(modules, out, args, started)
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
            skipped += _mark_skips(work, m)
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
        # once here first: the unmutated tests must pass, and their emulator builds land in the cache the workers
        # share (on the GPU host 46 workers each building the same kernels at once took the whole budget)
        if not _baseline_passes(modules):
            return 2
        read, worker_failed = _run_workers(sessions, pending, args.jobs, out, args.timeout, _budget_left(args, started))
    else:
        read, worker_failed = [(m, db) for m, _, db in sessions], False
        for m, cfg, db in sessions:
            with use_db(str(db), WorkDB.Mode.open) as work:
                if not list(work.pending_work_items):
                    continue
            if not _baseline_passes([m]):  # a test command that fails unmutated would "kill" every mutant
                return 2
            subprocess.run([*COSMIC_RAY, "exec", str(cfg), str(db)], cwd=ROOT, check=True)
    return _report(read, worker_failed, args.no_fail)


def _budget_left(args, started: float) -> float:
    """What is left of ``--budget-s`` (counted from ``started``, the script's start) for the workers; 0: no limit."""
    return max(1.0, args.budget_s - (time.monotonic() - started)) if args.budget_s > 0 else 0.0


def _resume(modules: list[str], out: Path, args, started: float) -> int:
    """``--resume``: the workers of the run in ``out`` go on (new entries of EQUIVALENT skipped first)."""
    from cosmic_ray.work_db import WorkDB, use_db

    workers = sorted(wdb for wdb in out.glob("worker*/*.sqlite") if wdb.stem in modules)
    sessions = [(m, out / f"{m}.toml", out / f"{m}.sqlite") for m in modules if (out / f"{m}.sqlite").exists()]
    if not workers or not sessions:
        print(f"nothing to resume in {out}: no worker's session of {', '.join(modules)}", flush=True)
        return 2
    for wdb in workers:
        with use_db(str(wdb), WorkDB.Mode.open) as work:
            _mark_skips(work, wdb.stem)
    folders = sorted({wdb.parent for wdb in workers})
    print(f"resuming {len(folders)} workers of {out}", flush=True)
    read, worker_failed = _run_workers(sessions, [], len(folders), out, args.timeout, _budget_left(args, started),
                                       resume=folders)
    return _report(read, worker_failed, args.no_fail)


def _report(read: list[tuple[str, Path]], worker_failed: bool, no_fail: bool) -> int:
    """Print every survivor with its diff and the score; the exit status (see the module docstring)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome

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
    if worker_failed:
        return 2
    return 1 if survived and not no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
