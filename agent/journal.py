"""The journal of a search: ``runs/<id>/events.jsonl``, append-only, one event per line.

Every event is a pydantic model with a ``type`` field. Each append is written, flushed and
``os.fsync``'d, so a kill -9 at any moment loses at most the event being written. Reading
tolerates a truncated or unreadable last line (the write a kill interrupted: skipped, counted in
bytes, and cut off by a resume); a corrupt line anywhere else, or a missing ``events.jsonl``, is a
:class:`JournalError`.

Derived files (``tree.json``, ``best/``) are rewritten atomically (tmp file + ``os.replace``);
they can always be rebuilt from the events.

Only this module knows the journal's file name and format: other modules read a run through
:func:`read_events` (or :func:`kerngen.agent.tree.load_run`) and peek at one through
:func:`has_journal`, :func:`started_at` and :func:`is_appending`.
"""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

try:
    import fcntl
except ImportError:  # not POSIX: no flock
    fcntl = None  # type: ignore[assignment]

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from kerngen.agent.budget import SearchBudget, SearchConfig, StopKind
from kerngen.agent.problem_data import ProblemRecord
from kerngen.agent.safe_paths import name_problem
from kerngen.agent.proposer import Branch, Idea, TriedIdea
from kerngen.errors import JournalError
from kerngen.redact import redact
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, KernelProfile
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.outcome import TuneCurve, TuneOutcome, tune_seconds
from kerngen.harness.atomic import write_atomic  # noqa: F401 - re-exported for the run folder writers
from kerngen.agent.run_ids import new_run_id, versions  # noqa: F401 - re-exported: where run folders began
from kerngen.problems.ref import ProblemRef

EVENTS = "events.jsonl"
MAX_JOURNAL_BYTES = 256 << 20  # see max_journal_bytes()
MAX_EVENT_BYTES = 32 << 20  # one line: a node with its clipped compile log is well under 1 MB
TREE = "tree.json"
BEST = "best"


def _plain_run_id(value: str) -> str:  # a run id becomes a folder name: never `../x`, `/x`, NUL
    why = name_problem(value)
    if why is not None:
        raise ValueError(f"run id {why}")
    return value


RunId = Annotated[str, AfterValidator(_plain_run_id)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")

    seq: int = 0
    t: float = Field(default_factory=time.time)


DEMO_LABEL = "DEMO (scripted, not measured on a GPU)"  # what every view of a demo run shows


class RunStarted(_Event):
    type: Literal["run_started"] = "run_started"
    run_id: RunId
    problem: ProblemRef
    config: SearchConfig
    budget: SearchBudget
    proposer: str
    model: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    gpu: GpuFacts | None = None
    seed_spec: KernelSpec | None = None
    replay_of: str | None = None  # run id (and path) this run replays
    argv: list[str] = Field(default_factory=list)
    # the problem as data (show/report/export never import a run's problem file); None in old runs
    problem_info: ProblemRecord | None = None
    # a scripted demo (toy kernels, made-up times, no GPU): every view of the run says so; older
    # journals are recognized by their scripted proposer or evaluator
    demo: bool = False
    # a dry run (--dry-run): the GPU preset it compiled for (``h100``); nothing was run or timed.
    # None: a run on a GPU (or the scripted demo)
    dry_run: str | None = None

    @model_validator(mode="after")
    def _scripted_is_a_demo(self) -> "RunStarted":
        scripted_gpu = self.gpu is not None and self.gpu.name.startswith("scripted")
        if not self.demo and (self.proposer == "scripted" or scripted_gpu):
            self.demo = True
        return self

class RunResumed(_Event):
    type: Literal["run_resumed"] = "run_resumed"
    session: int
    versions: dict[str, str] = Field(default_factory=dict)
    gpu: GpuFacts | None = None
    budget: SearchBudget | None = None
    truncated_bytes: int = 0  # a partial last line dropped before appending


class BaselineEvent(_Event):
    type: Literal["baseline"] = "baseline"
    baseline: Baseline


class LLMCallEvent(_Event):
    type: Literal["llm_call"] = "llm_call"
    record: dict[str, Any] = Field(default_factory=dict)  # the LLM proposer's LLMCall, as data
    calls: int = 0  # running totals after this call
    tokens: int = 0


class RoundStarted(_Event):
    type: Literal["round_started"] = "round_started"
    round: int
    beam: list[int | None]  # parents expanded this round (None: from nothing)


class IdeasEvent(_Event):
    type: Literal["ideas"] = "ideas"
    round: int
    parent: int | None
    ideas: list[Idea]


class ImplementedEvent(_Event):
    """The proposer's whole answer to one implement question (nodes follow as node_created)."""

    type: Literal["implemented"] = "implemented"
    round: int
    parent: int | None
    idea_index: int
    branches: list[Branch]


class NodeCreated(_Event):
    type: Literal["node_created"] = "node_created"
    id: int
    parent: int | None
    round: int
    kind: Literal["seed", "branch", "repair"] = "branch"
    idea: Idea | None = None
    idea_index: int | None = None
    branch_index: int | None = None
    spec: KernelSpec | None = None
    error: str = ""
    notes: str = ""
    answer: str = ""  # the proposer's raw answer when it could not be read (shown back in its repair)
    repair_of: int | None = None  # the node whose failure this repair answers (the chain's head)
    attempt: int = 0  # repair attempt, 1..R


class NodeEvaluated(_Event):
    type: Literal["node_evaluated"] = "node_evaluated"
    id: int
    result: EvalResult


class NodeTuned(_Event):
    type: Literal["node_tuned"] = "node_tuned"
    id: int
    config: dict[str, int] | None = None  # None: the tuner found nothing better / could not tune
    result: EvalResult | None = None
    evaluated: int = 0
    curve: TuneCurve = Field(default_factory=list)  # reads both older shapes (harness.tune_outcome)
    seconds: float = 0.0  # wall seconds of the tuning (0 in older journals)

    def outcome(self) -> TuneOutcome | None:
        """The recorded tuning as THE outcome type (None: the tuner found nothing)."""
        if self.config is None or self.result is None:
            return None
        return TuneOutcome(config=self.config, result=self.result, evaluated=self.evaluated, curve=self.curve,
                           seconds=self.seconds)

    def gpu_seconds(self) -> float:
        return tune_seconds(self.seconds, self.curve, self.result, self.evaluated)


class NodeProfiled(_Event):
    """Nsight Compute's metrics of a node at its best config (the best node of a round, once):
    what the next prompts show of it. ``error``: why there are none (one line)."""

    type: Literal["node_profiled"] = "node_profiled"
    id: int
    config: dict[str, int] = Field(default_factory=dict)
    profiles: list[KernelProfile] = Field(default_factory=list)
    error: str = ""
    seconds: float = 0.0  # wall seconds the GPU was held (counted as GPU time)

    def gpu_seconds(self) -> float:
        return self.seconds


class RoundFinished(_Event):
    type: Literal["round_finished"] = "round_finished"
    round: int
    best: int | None
    best_ms: float | None = None
    improved: bool = False
    tried: list[TriedIdea] = Field(default_factory=list)
    usage: dict[str, float] = Field(default_factory=dict)


class RunFinished(_Event):
    type: Literal["run_finished"] = "run_finished"
    reason: str  # what the user reads (the text of the StopReason)
    stop: StopKind | None = None  # its kind; None in older journals (and for a kind this version does not know)
    best: int | None = None
    best_ms: float | None = None
    usage: dict[str, float] = Field(default_factory=dict)

    @field_validator("stop", mode="before")
    @classmethod
    def _known_kind(cls, value: Any) -> Any:  # a journal of a newer kerngen still reads
        if isinstance(value, str) and value not in StopKind._value2member_map_:
            return None
        return value


Event = Annotated[
    Union[
        RunStarted, RunResumed, BaselineEvent, LLMCallEvent, RoundStarted, IdeasEvent, ImplementedEvent,
        NodeCreated, NodeEvaluated, NodeTuned, NodeProfiled, RoundFinished, RunFinished,
    ],
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)


def parse_event(data: dict[str, Any]) -> Any:
    return _ADAPTER.validate_python(data)


# ----- reading ------------------------------------------------------------------------------
def max_journal_bytes() -> int:
    """The largest journal kerngen reads (``KERNGEN_MAX_JOURNAL_MB``, default 256): a handed run
    folder's ``events.jsonl`` may be a sparse file of any size."""
    try:
        mb = float(os.environ.get("KERNGEN_MAX_JOURNAL_MB", ""))
    except ValueError:
        mb = 0.0
    return int(mb * (1 << 20)) if mb > 0 else MAX_JOURNAL_BYTES


def read_events(run_dir: str | Path, *, file: str = EVENTS, parse: Callable[[dict[str, Any]], Any] = parse_event,
                first: type = RunStarted) -> tuple[list[Any], int]:
    """All events of a run and the number of bytes of a truncated last line (0 if none). ``file``, ``parse``,
    ``first``: another journal of the same format (a model run's: :mod:`kerngen.agent.model_journal`).

    The journal is streamed, one line at a time: a file larger than :func:`max_journal_bytes`
    or a line longer than :data:`MAX_EVENT_BYTES` is refused before it is read whole, so a
    1 GB sparse ``events.jsonl`` costs no memory. Raises :class:`JournalError` for those, for a
    missing folder or file, or a bad line other than a partial last one."""
    path = Path(run_dir)
    name, base, file = path.name, file, path / file
    if not path.is_dir():
        raise JournalError(f"run {name}: no such run folder {path}")
    if not file.is_file():
        raise JournalError(f"run {name}: {base} is missing in {path}")
    limit = max_journal_bytes()
    events: list[Any] = []
    truncated = 0
    bad: tuple[JournalError, int] | None = None  # an unreadable line, and the bytes from it to here
    try:
        with file.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise JournalError(f"run {name}: {file} is {size} bytes, more than the {limit} a journal may have "
                                   "(KERNGEN_MAX_JOURNAL_MB): refused")
            for n in itertools.count(1):
                line = fh.readline(MAX_EVENT_BYTES + 1)
                if not line:
                    break
                if not line.endswith(b"\n"):
                    if len(line) > MAX_EVENT_BYTES:
                        raise JournalError(f"run {name}: {file} line {n} is longer than the {MAX_EVENT_BYTES} bytes an "
                                           "event may have: refused")
                    if bad is not None:
                        raise bad[0]
                    truncated = len(line)  # a write a kill cut short: that event is lost, nothing else
                    break
                if bad is not None:
                    if line.strip():
                        raise bad[0]  # a bad line with events after it: corrupt
                    bad = (bad[0], bad[1] + len(line))
                elif line.strip():
                    try:
                        events.append(_parse_line(name, n, line, base, parse))
                    except JournalError as exc:
                        if n == 1:
                            raise
                        bad = (exc, len(line))
    except OSError as exc:
        raise JournalError(f"run {name}: cannot read {base}: {exc}") from None
    if bad is not None:  # a bad LAST line (a write cut short, then a newline): lost like a cut write
        truncated = bad[1]
    if not events or not isinstance(events[0], first):
        raise JournalError(f"run {name}: {base} does not start with a {first.model_fields['type'].default} event")
    return events, truncated


def _parse_line(name: str, n: int, line: bytes, base: str, parse: Callable[[dict[str, Any]], Any]) -> Any:
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):  # ValueError: bad JSON, a 5000-digit int
        raise JournalError(f"run {name}: {base} line {n} is not valid JSON") from None
    if not isinstance(data, dict) or "type" not in data:
        raise JournalError(f"run {name}: {base} line {n} is not an event (no type)")
    try:
        return parse(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise JournalError(f"run {name}: {base} line {n} is not a valid {str(data.get('type'))[:40]} event "
                           f"({where}: {err.get('msg')})") from None


# ----- peeking at a run folder (nothing parsed beyond what is asked) ------------------------
def has_journal(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a journal (a run, perhaps unfinished or corrupt)."""
    return (Path(run_dir) / EVENTS).is_file()


def started_at(run_dir: str | Path) -> float:
    """When the run started: the time of its first event (``run_started``), read from the first
    line only; else the journal's mtime (0.0 when there is none). Never raises."""
    path = Path(run_dir) / EVENTS
    try:
        with path.open("rb") as fh:
            first = json.loads(fh.readline(1 << 20))
        t = first.get("t") if isinstance(first, dict) and first.get("type") == "run_started" else None
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            return float(t)
        return path.stat().st_mtime
    except (OSError, ValueError, RecursionError):
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0


def is_appending(run_dir: str | Path) -> bool:
    """Whether another process holds the journal's lock (a search running now). A shared lock,
    tried and let go at once, so nothing is written."""
    if fcntl is None:
        return False
    try:
        with (Path(run_dir) / EVENTS).open("rb") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError:
        return False
    return False


# ----- writing ------------------------------------------------------------------------------
def _open_locked(path: Path) -> Any:
    """``path`` opened for appending, with an exclusive ``flock`` on it (held until closed).
    :class:`JournalError` when another open Journal, in this or another process, holds it."""
    fh = open(path, "ab")
    if fcntl is None:  # no flock on this platform: one writer is then the user's business
        return fh
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return fh  # a file system without locks (ENOLCK, EOPNOTSUPP ...): write unlocked, as before
        fh.close()
        raise JournalError(
            f"run {path.parent.name}: another kerngen process is appending to it ({path.name} is locked); "
            "wait for it to finish or stop it, then resume"
        ) from None
    return fh


def ensure_unlocked(run_dir: str | Path) -> None:
    """:class:`JournalError` now if another process appends to the run (a resume checks this
    before it starts GPU workers or asks an LLM endpoint; the Journal itself holds the lock)."""
    path = Path(run_dir) / EVENTS
    if path.is_file():
        _open_locked(path).close()


class Journal:
    """Append-only writer of ``events.jsonl`` (thread-safe; fsync per event).

    ``listeners`` see every event after it is on disk (the live view, the tree)."""

    def __init__(self, run_dir: str | Path, *, next_seq: int = 0, _fh: Any = None, file: str = EVENTS) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / file
        self._lock = threading.Lock()
        self._seq = next_seq
        # one writer per run: the file stays locked (flock) while this Journal is open; the OS
        # drops the lock when the process dies, even by kill -9, so a crashed run can be resumed
        self._fh = _fh if _fh is not None else _open_locked(self.path)
        self.listeners: list[Callable[[Any], None]] = []

    @classmethod
    def reopen(cls, run_dir: str | Path, *, file: str = EVENTS, read: Callable[..., tuple[list[Any], int]] = read_events
               ) -> tuple["Journal", list[Any], int]:
        """Open an existing journal (``read`` reads it) for appending: lock it, read its events and cut a
        partial last line. :class:`JournalError` when another process has it open for appending."""
        path = Path(run_dir) / file
        if not path.is_file():
            read(run_dir)  # raises the missing folder's or file's error; nothing is created
        fh = _open_locked(path)
        try:
            events, truncated = read(run_dir)  # what is on disk now that nobody else writes
            if truncated:
                size = path.stat().st_size
                with open(path, "r+b") as cut:
                    cut.truncate(size - truncated)
                    cut.flush()
                    os.fsync(cut.fileno())
            nxt = max((e.seq for e in events), default=-1) + 1
            return cls(run_dir, next_seq=nxt, _fh=fh, file=file), events, truncated
        except BaseException:
            fh.close()
            raise

    def append(self, event: Any) -> Any:
        with self._lock:
            if self._fh.closed:  # a writer outlived the search (a bug): say so, not "I/O on closed file"
                raise JournalError(f"{self.path}: the journal is closed; {type(event).__name__} not written")
            event.seq = self._seq
            self._seq += 1
            # the last filter before disk: no secret reaches a journal, whatever an event holds
            line = redact(event.model_dump_json(exclude_none=False)) + "\n"
            self._fh.write(line.encode())
            self._fh.flush()
            os.fsync(self._fh.fileno())
        for fn in list(self.listeners):
            fn(event)
        return event

    def on_llm_call(self, usage: Any) -> Callable[[Any], None]:
        """A listener for :class:`~kerngen.agent.budget.Usage`: journal each LLM call."""

        def _write(record: Any) -> None:
            data = record.model_dump(mode="json") if hasattr(record, "model_dump") else record
            if not isinstance(data, dict):
                data = {"repr": repr(data)}
            self.append(LLMCallEvent(record=data, calls=usage.calls, tokens=usage.tokens))

        return _write

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()  # releases the lock

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
