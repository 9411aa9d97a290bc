"""``kerngen generate DIR`` (or several problems): one search per problem, one run folder each,
with its own budget, a progress bar over the problems and a summary table at the end.

A batch is the list of problems given and the runs folder: its state is
``<runs>/batches/<name>-<hash>.json`` (the hash of the sorted problem list), written after every
change. Running the same command again continues it: a problem whose search finished (or that
cannot be searched, e.g. the playbook has nothing for it) is not done again, one whose search was
interrupted is resumed in its own run folder (nothing evaluated is evaluated again), the others
start. ``--fresh`` starts a new batch. One problem's failure is its row of the summary, never the
end of the batch. The problems share one evaluator; where it has several GPU workers (a pool on
a host of several GPUs, a Ray cluster), each problem's search gets one of them to itself and the
problems run side by side, one per GPU (a search keeps its GPU busy only part of the time: its
proposer, its baseline and its compiles run between the batches it times).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kerngen.agent.budget import StopKind
from kerngen.problems.torch_modes import DEFAULTS_LABEL
from kerngen.results.speedups import SHORT_NOTE
from kerngen.agent.journal import has_journal, write_atomic
from kerngen.agent.safe_paths import UnsafePathError, inside, refuse_symlinks, regular_file, shown
from kerngen.agent.tree import Run, load_run
from kerngen.errors import JournalError, KerngenError
from kerngen.results.show import no_kernel_why
from kerngen.results.suite import reference_metrics
from kerngen.text import one_line, strict_json

BATCHES = "batches"
MAX_BATCH_BYTES = 16 << 20  # a state file of thousands of problems is well under 1 MB


class Status(str, Enum):
    pending = "pending"
    running = "running"  # a run folder exists; its search has not finished (interrupted): resumed next time
    finished = "finished"
    failed = "failed"  # the problem could not be searched (does not load, nothing to propose, no room)


class Entry(BaseModel):
    problem: str
    status: Status = Status.pending
    run: str | None = None  # the run folder's name under the runs folder
    reason: str = ""  # why it stopped, or why it failed
    wall_s: float = 0.0  # this batch's seconds on it, over sessions


class Batch(BaseModel):
    problems: list[str]
    minutes: float | None = None  # each problem's wall-clock budget (as given the first time)
    entries: list[Entry] = Field(default_factory=list)

    def entry(self, problem: str) -> Entry:
        return next(e for e in self.entries if e.problem == problem)


def batch_path(problems: Sequence[str], runs_dir: Path, kind: str = "") -> Path:
    """``kind``: "dry-run" keeps a dry run's batch apart from the one that measures the same problems."""
    digest = hashlib.sha256("\n".join(sorted(problems)).encode()).hexdigest()[:10]
    first = Path(problems[0]).parent.name if len({str(Path(p).parent) for p in problems}) == 1 else "mixed"
    slug = re.sub(r"[^a-z0-9_-]+", "-", (first or "problems").lower()).strip("-")[:40] or "problems"
    return runs_dir / BATCHES / f"{slug}{'-' + kind if kind else ''}-{digest}.json"


def open_batch(problems: Sequence[str], runs_dir: Path, minutes: float | None, fresh: bool,
               kind: str = "") -> tuple[Batch, Path]:
    """The batch of these problems (continued unless ``fresh``); a corrupt or unsafe state file is
    refused (:func:`check_entries`)."""
    path = batch_path(problems, runs_dir, kind)
    if path.is_file() and not fresh:
        try:
            batch = Batch.model_validate_json(regular_file(path, "batch state", MAX_BATCH_BYTES).read_bytes())
        except UnsafePathError as exc:
            raise JournalError(f"{exc}; use --fresh") from None
        except (ValidationError, OSError, ValueError) as exc:
            raise JournalError(f"batch state {path} is unreadable ({type(exc).__name__}); use --fresh") from None
        if sorted(batch.problems) == sorted(problems):
            check_entries(batch, path, runs_dir)
            return batch, path
    batch = Batch(problems=list(problems), minutes=minutes, entries=[Entry(problem=p) for p in problems])
    return batch, path


def check_entries(batch: Batch, path: Path, runs_dir: Path) -> None:
    """A state file in a runs folder someone handed over names the run folders the batch resumes
    and appends to: each must be a plain name inside ``runs_dir``, neither it nor what a search
    writes in it a symbolic link (as a single resume checks), and each entry one of the batch's
    problems. :class:`JournalError` (one line) otherwise."""
    problems = set(batch.problems)
    for e in batch.entries:
        try:
            if e.problem not in problems:
                raise UnsafePathError(f"entry {shown(e.problem)} is not one of the batch's problems")
            if e.run is not None:
                folder = inside(runs_dir, e.run, "run folder")
                if folder.is_symlink():
                    raise UnsafePathError(f"run folder {shown(e.run)} is a symbolic link")
                refuse_symlinks(folder)
        except UnsafePathError as exc:
            raise JournalError(f"batch state {path}: {exc}; refused (use --fresh)") from None


def save(batch: Batch, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, batch.model_dump_json(indent=1))


# (problem, the run folder to resume or None, called with the run folder once it exists, the slot
# it runs on: an evaluator of its own) -> the run folder of its search; raises KerngenError when the
# problem cannot be searched
SearchOne = Callable[[str, "Path | None", Callable[[Path], None], Any], Path]


def todo(batch: Batch) -> list[Entry]:
    """The entries still to search: pending, or interrupted (resumed)."""
    return [e for e in batch.entries if e.status in (Status.pending, Status.running)]


def run_batch(batch: Batch, path: Path, runs_dir: Path, search_one: SearchOne, *, slots: Sequence[Any] = (None,),
              quiet: bool = False) -> Batch:
    """Search the batch's pending and interrupted problems, one per slot at a time (a slot is an
    evaluator: one GPU worker of the pool or one actor of a Ray cluster; one slot: in turn, in this
    thread). The state file has one writer: entries change and are saved under one lock. A slot
    whose GPU is lost (its Ray node gone) takes no more problems, and the one it had goes back to
    the others, which resume it in its run folder (nothing evaluated is evaluated again)."""
    left = deque(todo(batch))
    err = Console(stderr=True, highlight=False)
    lock = threading.Lock()
    turn = threading.Condition(lock)  # a slot waits for the problems that others may hand back
    busy = [0]  # slots searching now
    stopped = threading.Event()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=quiet) as bar:
        task = bar.add_task("problems", total=len(batch.entries), completed=len(batch.entries) - len(left))

        def next_entry() -> Entry | None:
            with turn:
                while not left and busy[0] and not stopped.is_set():
                    turn.wait()
                if not left or stopped.is_set():
                    return None
                entry = left.popleft()
                busy[0] += 1
                bar.update(task, description=one_line(Path(entry.problem).stem, 40))
                return entry

        def work(slot: Any) -> None:
            while (entry := next_entry()) is not None:
                gone = ""
                try:
                    gone = _search_entry(batch, path, runs_dir, entry, search_one, slot, lock)
                finally:
                    with turn:
                        busy[0] -= 1
                        if gone:
                            left.appendleft(entry)
                        turn.notify_all()
                if gone:
                    then = "resumed in its run folder" if entry.run else "searched there"
                    err.print(one_line(f"{Path(entry.problem).stem}: its GPU was lost ({gone}): handed to "
                                       f"another GPU, {then}", 300), markup=False)
                    return  # this slot takes no more problems
                bar.advance(task)

        def stop() -> None:  # under the lock
            stopped.set()
            left.clear()
            turn.notify_all()

        if len(slots) == 1:
            work(slots[0])
        else:
            _in_threads(work, slots, stop=stop, lock=lock)
    return batch


def _search_entry(batch: Batch, path: Path, runs_dir: Path, entry: Entry, search_one: SearchOne, slot: Any,
                  lock: threading.Lock) -> str:
    """One problem's search, its entry updated and the state saved as it goes. Returns why the
    slot lost its GPU ("" while it has one): the entry is then left to resume, whatever the
    search ended with (its candidates in flight came back as the harness's, not the kernels')."""
    t0 = time.monotonic()
    resume = runs_dir / entry.run if entry.run and has_journal(runs_dir / entry.run) else None

    def update(**fields: Any) -> None:
        with lock:
            for name, value in fields.items():
                setattr(entry, name, value)
            save(batch, path)

    def started(run_dir: Path) -> None:  # interrupted from here on: resumed
        update(run=run_dir.name, status=Status.running)

    def lost() -> str:
        check = getattr(slot, "workers_lost", None)
        gone = check() if callable(check) else ""
        if gone:
            update(status=Status.running if entry.run else Status.pending, reason=one_line(f"GPU lost: {gone}", 300),
                   wall_s=entry.wall_s + time.monotonic() - t0)
        return gone

    try:
        run_dir = search_one(entry.problem, resume, started, slot)
        run = load_run(run_dir)
        # stopped because the harness could not evaluate: its GPU may be gone (then resumed elsewhere)
        if run.finished is not None and run.finished.stop is StopKind.harness and (gone := lost()):
            return gone
        update(run=run_dir.name, status=Status.finished, reason=run.finished.reason if run.finished else "",
               wall_s=entry.wall_s + time.monotonic() - t0)
    except KeyboardInterrupt:
        update(wall_s=entry.wall_s + time.monotonic() - t0)
        raise
    except KerngenError as exc:
        if gone := lost():
            return gone
        update(status=Status.failed, reason=one_line(str(exc), 300), wall_s=entry.wall_s + time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - one problem's crash is its row, not the batch's end
        if gone := lost():
            return gone
        update(status=Status.failed, reason=one_line(f"{type(exc).__name__}: {exc}", 300),
               wall_s=entry.wall_s + time.monotonic() - t0)
    return ""


def _in_threads(work: Callable[[Any], None], slots: Sequence[Any], *, stop: Callable[[], None],
                lock: threading.Lock) -> None:
    """``work(slot)`` in one thread per slot. A Ctrl-C (here, or raised in a search) stops handing
    out problems and is raised here; the searches under way are left to the process's exit, their
    entries saved as running (resumed next time)."""
    interrupts: list[BaseException] = []

    def run(slot: Any) -> None:
        try:
            work(slot)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            with lock:
                stop()
                interrupts.append(exc)

    threads = [threading.Thread(target=run, args=(s,), daemon=True, name=f"kerngen-batch-{i}")
               for i, s in enumerate(slots)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive() and not interrupts:
                t.join(0.2)
    except KeyboardInterrupt:
        with lock:
            stop()
        raise
    if interrupts:
        raise interrupts[0]


def _finite(value: Any) -> float | None:
    """A time or ratio for a table: None for what was not measured (a dry run's NaN) or is not a number."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def summary_rows(batch: Batch, runs_dir: Path) -> list[dict]:
    rows = []
    for e in batch.entries:
        row = {"problem": e.problem, "status": e.status.value, "run": e.run, "reason": e.reason,
               "wall_min": round(e.wall_s / 60, 3), "best_ms": None, "eager_ms": None, "compile_ms": None,
               "vs_eager": None, "vs_compile": None, "vs_compile_defaults": None}
        run: Run | None = None
        if e.run and has_journal(runs_dir / e.run):
            try:
                run = load_run(runs_dir / e.run)
            except KerngenError:
                run = None
        if run is not None:
            base, best = run.baseline, run.best
            if base is not None:
                row["eager_ms"] = _finite(base.eager.median_ms)
                row["compile_ms"] = _finite(base.compiled.median_ms) if base.compiled else None
            if best is not None:
                row["best_ms"] = _finite(best.ms)
                row["vs_eager"] = row["eager_ms"] / best.ms if row["eager_ms"] and row["best_ms"] else None
                row["vs_compile"] = row["compile_ms"] / best.ms if row["compile_ms"] and row["best_ms"] else None
                row["vs_compile_defaults"] = run.tree.figures(best)["speedup_compile_defaults"]
            elif e.status is Status.finished and not run.started.dry_run:
                row["reason"] = f"{e.reason}; " + no_kernel_why(run)
        rows.append(row)
    return rows


def render_summary(rows: list[dict], minutes: float | None, wall_s: float, *, dry_run: bool = False) -> Table:
    """The batch's table: a problem's name whole (folded, never cut: ``--json`` has every field),
    with why it stopped under it, then its times. A dry run measured nothing: no fast_p line."""
    from rich import box

    def ms(v):
        return "-" if v is None else f"{v:.4f}"

    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    t = Table(title="generate: one search per problem" + (" (dry run: compiled, nothing run)" if dry_run else ""),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=0)  # the box puts a space between
    t.add_column("problem\nstop / why", overflow="fold", ratio=1, min_width=20)
    t.add_column("status", no_wrap=True)
    for col in ("best\nms", "eager\nms", "compile\nms", "fp32\neager", "fp32\ncompile", "dflt\ncompile", "min"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        name = Text(Path(r["problem"]).stem, style="bold")
        name.append("\n" + one_line(r["reason"], 300), style="dim")
        t.add_row(name, r["status"], ms(r["best_ms"]), ms(r["eager_ms"]), ms(r["compile_ms"]), x(r["vs_eager"]),
                  x(r["vs_compile"]), x(r["vs_compile_defaults"]), f"{r['wall_min']:.2f}")
    with_kernel = sum(1 for r in rows if r["best_ms"] is not None)
    budget = f" (budget {minutes * len(rows):.1f} = {len(rows)} x {minutes:g})" if minutes else ""
    done = (f"{sum(1 for r in rows if r['status'] == Status.finished.value)} of {len(rows)} problems searched"
            if dry_run else f"{with_kernel} of {len(rows)} problems have a correct kernel")
    t.caption = f"{done}; wall {wall_s / 60:.2f} min this session{budget}"
    if not dry_run:
        t.caption += "\n" + SHORT_NOTE.format(label=DEFAULTS_LABEL)
    t.caption_justify = "left"
    ran = [r for r in rows if r["status"] != Status.pending.value]
    if ran and not dry_run:
        t.caption += "\n" + metrics_line(ran)
    return t


def metrics_line(rows: list[dict]) -> str:
    """fast_1 and the geometric-mean speedup of the problems that ran, against eager and against
    torch.compile, from each run's own baseline (measured in the same worker as its kernels; a
    problem without a kernel is a miss, one the playbook could not search too). Only a problem whose
    baseline was measured and torch.compile failed on is left out of the torch.compile figures, as in
    ``kerngen suite``, which re-measures them side by side."""
    def ref(key: str, ms_key: str) -> str:
        counted = [r for r in rows if not (ms_key == "compile_ms" and r["eager_ms"] is not None
                                           and r["compile_ms"] is None)]
        outcomes = [(r["best_ms"] is not None, r[key]) for r in counted]
        m = reference_metrics(key, outcomes)
        geo = "-" if m.geomean_speedup is None else f"{m.geomean_speedup:.2f}x"
        return f"fast_1 {m.fast_p['1']:.2f} (geomean {geo} over {m.geomean_of})"

    wall = sum(r["wall_min"] for r in rows)
    return (f"{len(rows)} ran, {wall:.1f} min in all: vs eager {ref('vs_eager', 'eager_ms')}; "
            f"vs torch.compile {ref('vs_compile', 'compile_ms')}")


def summary_json(rows: list[dict]) -> str:
    return json.dumps(strict_json(rows), indent=2)
