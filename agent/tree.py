"""The search tree, rebuilt from journal events: nodes, their results, the best, the beam.

:func:`load_run` is what other features (show, replay, resume, reports, export) use::

    run = load_run("runs/20261122-153000-softmax-ab12")
    run.tree.nodes        # id -> Node (idea, spec, result, tuned config and result)
    run.best              # the fastest correct Node, or None
    run.events            # every journal event, in order
    run.book              # recorded proposer answers, keyed per question
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, Field

from kerngen.agent.journal import (
    BaselineEvent, IdeasEvent, ImplementedEvent, NodeCreated, NodeEvaluated, NodeProfiled, NodeTuned,
    RoundFinished, RoundStarted, RunFinished, RunResumed, RunStarted, has_journal, read_events, started_at,
)
from kerngen.agent.proposer import Branch, Idea, NodeSummary, TriedIdea
from kerngen.errors import JournalError
from kerngen.harness.gpu.presets import PRESET_SUFFIX, PRESETS
from kerngen.harness.gpu.roofline import refloor
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef
from kerngen.problems.registry import builtin_facts, is_builtin

FAILED = (Verdict.invalid_spec, Verdict.compile_error, Verdict.incorrect, Verdict.runtime_error, Verdict.timeout)


Tuned = NodeTuned  # a node's tuning is the journal's record of it (its outcome(): THE tuning outcome type)


class Node(BaseModel):
    id: int
    parent: int | None = None
    round: int = 0
    kind: str = "branch"  # seed | branch | repair
    idea: Idea | None = None
    idea_index: int | None = None
    branch_index: int | None = None
    spec: KernelSpec | None = None
    error: str = ""
    notes: str = ""
    answer: str = ""  # the raw answer when it could not be read
    repair_of: int | None = None
    attempt: int = 0
    result: EvalResult | None = None
    tuned: Tuned | None = None
    profile: NodeProfiled | None = None  # Nsight Compute's metrics at its best config (or why none)
    children: list[int] = Field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``invalid`` (no spec), ``pending`` (not evaluated) or the evaluation's verdict."""
        if self.spec is None:
            return "invalid"
        if self.result is None:
            return "pending"
        return self.result.verdict.value

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def failed(self) -> bool:
        return self.result is not None and self.result.verdict in FAILED

    @property
    def tuned_ok(self) -> bool:
        return bool(self.tuned and self.tuned.config is not None and self.tuned.result and self.tuned.result.ok)

    @property
    def best_result(self) -> EvalResult | None:
        """The tuned result when tuning found a faster correct config, else the evaluation."""
        if self.tuned_ok and (self.result is None or self.tuned.result.ms <= self.result.ms):  # type: ignore[union-attr]
            return self.tuned.result  # type: ignore[union-attr]
        return self.result

    @property
    def ms(self) -> float:
        r = self.best_result
        return r.ms if r is not None else math.inf

    @property
    def config(self) -> dict[str, int]:
        r = self.best_result
        if r is not None and r is not self.result and self.tuned and self.tuned.config is not None:
            return dict(self.tuned.config)
        if self.spec is None:
            return {}
        return self.spec.full_config(r.config if r is not None and r.config else None)

    def best_spec(self) -> KernelSpec | None:
        """The spec with its best config as defaults (what best/ and a next prompt see)."""
        if self.spec is None:
            return None
        cfg = {k: v for k, v in self.config.items() if k in self.spec.tunables}
        return self.spec.model_copy(update={"defaults": cfg}) if cfg else self.spec


class Tree:
    """Nodes and what the search knew, rebuilt event by event (:meth:`apply`)."""

    def __init__(self) -> None:
        self.started: RunStarted | None = None
        self.problem: ProblemRef | None = None
        self.gpu: GpuFacts | None = None
        self.baseline: Baseline | None = None
        self.nodes: dict[int, Node] = {}
        self.ideas: dict[tuple[int, int | None], list[Idea]] = {}
        self.beams: dict[int, list[int | None]] = {}
        self.rounds_finished: dict[int, RoundFinished] = {}
        self.tried: list[TriedIdea] = []
        self.finished: RunFinished | None = None

    # ----- building ---------------------------------------------------------------------------
    def apply(self, ev: Any) -> None:
        if isinstance(ev, RunStarted):
            self.started, self.problem, self.gpu = ev, ev.problem, ev.gpu
        elif isinstance(ev, RunResumed):
            self.finished = None
        elif isinstance(ev, BaselineEvent):
            # an older run's floor came from the measured ceilings, which kernels beat: the peaks' one
            self.baseline = refloor(ev.baseline, self.gpu, self.dtype())
        elif isinstance(ev, RoundStarted):
            self.beams[ev.round] = list(ev.beam)
        elif isinstance(ev, IdeasEvent):
            self.ideas[(ev.round, ev.parent)] = list(ev.ideas)
        elif isinstance(ev, NodeCreated):
            node = Node(**ev.model_dump(exclude={"type", "seq", "t"}))
            self.nodes[node.id] = node
            if node.parent is not None and node.parent in self.nodes:
                self.nodes[node.parent].children.append(node.id)
        elif isinstance(ev, NodeEvaluated):
            self._node(ev.id, ev).result = ev.result
        elif isinstance(ev, NodeTuned):
            self._node(ev.id, ev).tuned = ev
        elif isinstance(ev, NodeProfiled):
            self._node(ev.id, ev).profile = ev
        elif isinstance(ev, RoundFinished):
            self.rounds_finished[ev.round] = ev
            self.tried.extend(ev.tried)
        elif isinstance(ev, RunFinished):
            self.finished = ev

    def dtype(self) -> str | None:
        """The problem's dtype as the run recorded it (a built-in's default when it gave none)."""
        st = self.started
        if st is not None and st.problem_info is not None:
            return st.problem_info.info.dtype
        if self.problem is None:
            return None
        if self.problem.dtype or not is_builtin(self.problem.source):
            return self.problem.dtype
        return builtin_facts(self.problem.source)["dtype"]

    def _node(self, node_id: int, ev: Any) -> Node:
        if node_id not in self.nodes:
            name = self.started.run_id if self.started else "?"
            raise JournalError(f"run {name}: event {ev.seq} ({ev.type}) names node {node_id}, never created")
        return self.nodes[node_id]

    @classmethod
    def from_events(cls, events: Iterable[Any]) -> "Tree":
        tree = cls()
        for ev in events:
            tree.apply(ev)
        return tree

    # ----- queries ----------------------------------------------------------------------------
    def ranked(self) -> list[Node]:
        """Correct nodes, fastest first (ties: older first)."""
        return sorted((n for n in self.nodes.values() if n.ok), key=lambda n: (n.ms, n.id))

    def best(self) -> Node | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def beam(self, width: int) -> list[Node]:
        return self.ranked()[:width]

    def roots(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.parent is None or n.parent not in self.nodes]

    def next_id(self) -> int:
        return max(self.nodes, default=-1) + 1

    def figures(self, node: Node) -> dict[str, Any]:
        """Speedups of a node vs eager and torch.compile in true fp32 (``speedup_eager``,
        ``speedup_compile``) and at PyTorch's defaults (``*_defaults``, labelled ``defaults_label``;
        None for a baseline recorded before they were measured), and its % of the roofline floor."""
        ms = node.ms
        out: dict[str, Any] = {"ms": None if math.isinf(ms) else ms, "speedup_eager": None,
                               "speedup_compile": None, "speedup_eager_defaults": None,
                               "speedup_compile_defaults": None, "defaults_label": None, "pct_roofline": None}
        if math.isinf(ms) or ms <= 0 or self.baseline is None:
            return out
        b = self.baseline
        out["speedup_eager"] = b.eager.median_ms / ms
        if b.compiled is not None:
            out["speedup_compile"] = b.compiled.median_ms / ms
        if b.eager_defaults is not None:
            out["defaults_label"] = b.defaults_label or None
            out["speedup_eager_defaults"] = b.eager_defaults.median_ms / ms
            if b.compiled_defaults is not None:
                out["speedup_compile_defaults"] = b.compiled_defaults.median_ms / ms
        if b.floor_ms:
            out["pct_roofline"] = b.floor_ms / ms * 100
        return out

    def summary(self, node: Node) -> NodeSummary | None:
        """The node as a prompt sees it (best config as the spec's defaults, best result)."""
        spec, result = node.best_spec(), node.best_result
        if spec is None or result is None:
            return None
        f = self.figures(node)
        return NodeSummary(node_id=node.id, idea=node.idea, spec=spec, result=result,
                           speedup_eager=f["speedup_eager"], speedup_compile=f["speedup_compile"],
                           pct_roofline=f["pct_roofline"],
                           profile=list(node.profile.profiles) if node.profile is not None else [])

    def lineage(self, node: Node) -> list[Node]:
        out, cur, seen = [], node, set()
        while cur is not None and cur.id not in seen:
            out.append(cur)
            seen.add(cur.id)
            cur = self.nodes.get(cur.parent) if cur.parent is not None else None
        return list(reversed(out))

    def to_json(self) -> dict[str, Any]:
        best = self.best()
        nodes = []
        for n in sorted(self.nodes.values(), key=lambda n: n.id):
            r = n.best_result
            nodes.append({
                "id": n.id, "parent": n.parent, "round": n.round, "kind": n.kind,
                "idea": n.idea.model_dump(mode="json") if n.idea else None,
                "idea_index": n.idea_index, "branch_index": n.branch_index,
                "repair_of": n.repair_of, "attempt": n.attempt, "verdict": n.verdict,
                "message": (n.result.message if n.result else n.error)[:300],
                "spec_hash": n.spec.content_hash() if n.spec else None,
                "config": n.config, "tuned": n.tuned_ok, "children": n.children,
                "registers": _registers(r), **self.figures(n),
                "profile": _profile_json(n.profile),
            })
        return {
            "run_id": self.started.run_id if self.started else None,
            "problem": self.problem.model_dump(mode="json") if self.problem else None,
            "gpu": self.gpu.name if self.gpu else None,
            "baseline": {"eager_ms": self.baseline.eager.median_ms,
                         "compile_ms": self.baseline.compiled.median_ms if self.baseline.compiled else None,
                         "floor_ms": self.baseline.floor_ms} if self.baseline else None,
            "best": best.id if best else None,
            "rounds": len(self.rounds_finished),
            "finished": self.finished.reason if self.finished else None,
            "nodes": nodes,
        }


def _profile_json(ev: NodeProfiled | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {"config": dict(ev.config), "error": ev.error, "seconds": ev.seconds,
            "kernels": [p.model_dump(mode="json") for p in ev.profiles]}


def _registers(result: EvalResult | None) -> int | None:
    if result is None or result.compile is None or not result.compile.kernels:
        return None
    return result.compile.worst().registers


# ----- recorded proposer answers ------------------------------------------------------------
Key = tuple


def ideas_key(round_: int, parent: int | None) -> Key:
    return ("ideas", round_, parent)


def implement_key(round_: int, parent: int | None, idea_index: int) -> Key:
    return ("implement", round_, parent, idea_index)


def repair_key(node_id: int, attempt: int) -> Key:
    return ("repair", node_id, attempt)


def repair_answer(ev: NodeCreated) -> Branch:
    """The proposer's answer a repair node records (the journal keeps repairs as nodes only)."""
    return Branch(spec=ev.spec, notes=ev.notes, error=ev.error, answer=ev.answer)


class AnswerBook:
    """Every proposer answer a journal holds, keyed by a deterministic key per question:
    ``("ideas", round, parent)``, ``("implement", round, parent, idea_index)``,
    ``("repair", failed_node, attempt)``."""

    def __init__(self) -> None:
        self.answers: dict[Key, Any] = {}

    @classmethod
    def from_events(cls, events: Iterable[Any]) -> "AnswerBook":
        book = cls()
        for ev in events:
            if isinstance(ev, IdeasEvent):
                book.answers[ideas_key(ev.round, ev.parent)] = list(ev.ideas)
            elif isinstance(ev, ImplementedEvent):
                book.answers[implement_key(ev.round, ev.parent, ev.idea_index)] = list(ev.branches)
            elif isinstance(ev, NodeCreated) and ev.kind == "repair" and ev.repair_of is not None:
                book.answers[repair_key(ev.repair_of, ev.attempt)] = repair_answer(ev)
        return book

    def get(self, key: Key) -> Any:
        return self.answers.get(key)

    def __contains__(self, key: Key) -> bool:
        return key in self.answers

    def __len__(self) -> int:
        return len(self.answers)


# ----- a loaded run -------------------------------------------------------------------------
class Run:
    """A run folder, loaded: its events, the tree they build, the recorded answers."""

    def __init__(self, path: Path, events: list[Any], truncated: int) -> None:
        self.path = path
        self.events = events
        self.truncated = truncated
        self.tree = Tree.from_events(events)
        self.book = AnswerBook.from_events(events)
        self.started: RunStarted = _mark_legacy_dry_run(path, events[0])
        self.evaluated: dict[int, EvalResult] = {e.id: e.result for e in events if isinstance(e, NodeEvaluated)}
        self.tuned: dict[int, NodeTuned] = {e.id: e for e in events if isinstance(e, NodeTuned)}

    @property
    def id(self) -> str:
        return self.started.run_id

    @property
    def nodes(self) -> dict[int, Node]:
        return self.tree.nodes

    @property
    def best(self) -> Node | None:
        return self.tree.best()

    @property
    def baseline(self) -> Baseline | None:
        return self.tree.baseline

    @property
    def finished(self) -> RunFinished | None:
        return self.tree.finished

    @property
    def sessions(self) -> int:
        return 1 + sum(isinstance(e, RunResumed) for e in self.events)

    def elapsed_s(self) -> float:
        """Wall seconds the search spent over all sessions: from the start of each session (from
        its baseline, where the session measured it: the budget's clock starts there) to its last
        event."""
        total, start, last = 0.0, None, None
        for ev in self.events:
            if isinstance(ev, (RunStarted, RunResumed)):
                if start is not None and last is not None:
                    total += max(0.0, last - start)
                start = ev.t
            elif isinstance(ev, BaselineEvent) and start is not None:
                start = ev.t
            last = ev.t
        if start is not None and last is not None:
            total += max(0.0, last - start)
        return total


LATEST = "latest"  # names the newest run under runs_dir wherever a RUN is taken
# where kerngen before issue 37 wrote its dry runs (runs/dry-run/<id>): still listed, reached by id and
# as latest, and marked as dry runs though their journals predate RunStarted.dry_run
LEGACY_DRY_RUNS = "dry-run"


def resolve_run(run: str | Path, runs_dir: str | Path = "runs") -> Path:
    """RUN as a path to a run folder, a run id under ``runs_dir`` (or under its old dry-run folder),
    or ``latest``: the newest run there (:func:`latest_run`; a folder of that name comes first)."""
    p = Path(run)
    if p.is_dir():
        return p
    q = Path(runs_dir) / str(run)
    if q.is_dir():
        return q
    if has_journal(old := Path(runs_dir) / LEGACY_DRY_RUNS / str(run)):
        return old
    if str(run) == LATEST:
        return latest_run(runs_dir)
    raise JournalError(f"run {run}: not found (neither a folder nor a run id under {runs_dir}/)")


def run_folders(runs_dir: str | Path = "runs") -> list[Path]:
    """The folders under ``runs_dir`` (and under its old dry-run folder, :data:`LEGACY_DRY_RUNS`)
    that hold a journal, oldest first (by the start time the journal records, else the journal's
    mtime; then by name). Nothing is parsed beyond that."""
    found: list[Path] = []
    for root in (Path(runs_dir), Path(runs_dir) / LEGACY_DRY_RUNS):
        try:
            found += [d for d in root.iterdir() if d.is_dir() and has_journal(d)]
        except OSError:
            continue
    return sorted(found, key=lambda d: (started_at(d), d.name))


def _mark_legacy_dry_run(path: Path, started: RunStarted) -> RunStarted:
    """A run in the old dry-run folder, journaled before ``dry_run`` was recorded: marked as one,
    with the preset its GPU facts name (``h100``; the preset's name where none matches)."""
    if started.dry_run is not None or path.parent.name != LEGACY_DRY_RUNS or started.gpu is None:
        return started
    if not started.gpu.name.endswith(PRESET_SUFFIX):
        return started
    preset = next((k for k, f in PRESETS.items() if f.name == started.gpu.name), started.gpu.name)
    return started.model_copy(update={"dry_run": preset})


def latest_run(runs_dir: str | Path = "runs") -> Path:
    """The newest run folder under ``runs_dir`` (``latest``); :class:`JournalError` when none."""
    found = run_folders(runs_dir)
    if not found:
        raise JournalError(f"run {LATEST}: no runs under {runs_dir}/")
    return found[-1]


def load_run(path: str | Path, runs_dir: str | Path = "runs") -> Run:
    p = resolve_run(path, runs_dir)
    events, truncated = read_events(p)
    return Run(p, events, truncated)
