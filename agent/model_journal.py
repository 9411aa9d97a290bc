"""The journal of a model run (issue 34): ``runs/<id>/model_events.jsonl``, the op runs' journal format (one typed
event a line, each written, flushed and fsync'd; a torn last line skipped; locked while a process appends: the
writer and reader of :mod:`.journal`) with a model run's events: the run started or resumed, a region started (its
figures), each variant or configuration tried (its :class:`~.model_run.VariantTry`, written after every
evaluation), a region finished (its row: the choice and why). ``model.json`` is written once, at the end; a run
interrupted before it keeps every region searched here, and ``kerngen generate MODEL.py --as-model --resume RUN``
goes on from it (:func:`.model_search.search_model`).

A journal handed by anyone is data: read with the op journal's bounds (file and line sizes), validated event by
event (pydantic); what it names is only looked up among what the plan offers (:mod:`.model_region`), never built
from its text. A bad one is a one-line :class:`~kerngen.errors.JournalError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter

from kerngen.agent.journal import Journal, RunId, _Event, read_events, versions
from kerngen.agent.model_run import MODEL_EVENTS, RegionRow, VariantTry

__all__ = ["JournalState", "ModelRunResumed", "ModelRunStarted", "RegionFinished", "RegionStarted", "RegionTried",
           "journal_state", "open_model_journal", "read_model_journal", "reopen_model_journal"]


class ModelRunStarted(_Event):
    type: Literal["model_run_started"] = "model_run_started"
    run_id: RunId
    problem: str
    problem_path: str
    problem_sha256: str
    device: str
    minutes: float
    tune: int
    replay_of: str = ""  # kerngen replay --tune: the run whose plan it tunes again
    versions: dict[str, str] = Field(default_factory=dict)


class ModelRunResumed(_Event):
    type: Literal["model_run_resumed"] = "model_run_resumed"
    session: int
    device: str
    minutes: float
    versions: dict[str, str] = Field(default_factory=dict)
    truncated_bytes: int = 0  # a torn last line cut before appending


class RegionStarted(_Event):
    type: Literal["region_started"] = "region_started"
    region: int
    row: RegionRow  # its figures when its search began (share, floor, weight, budget)


class RegionTried(_Event):
    type: Literal["region_tried"] = "region_tried"
    region: int
    tried: VariantTry


class RegionFinished(_Event):
    type: Literal["region_finished"] = "region_finished"
    region: int
    row: RegionRow  # the choice (kernel or PyTorch and why) and every try


ModelEvent = Annotated[Union[ModelRunStarted, ModelRunResumed, RegionStarted, RegionTried, RegionFinished],
                       Field(discriminator="type")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(ModelEvent)


def read_model_journal(run_dir: str | Path) -> tuple[list[Any], int]:
    """A model run's events and the bytes of a torn last line (:func:`.journal.read_events`' rules)."""
    return read_events(run_dir, file=MODEL_EVENTS, parse=_ADAPTER.validate_python, first=ModelRunStarted)


def open_model_journal(run_dir: Path, started: ModelRunStarted) -> Journal:
    journal = Journal(run_dir, file=MODEL_EVENTS)
    journal.append(started.model_copy(update={"versions": versions()}))
    return journal


def reopen_model_journal(run_dir: Path) -> tuple[Journal, list[Any], int]:
    """The journal opened for appending (locked; a torn last line cut), with its events."""
    return Journal.reopen(run_dir, file=MODEL_EVENTS, read=read_model_journal)


@dataclass
class JournalState:
    """What a model run's journal holds: the finished regions' rows, the tries of the regions begun and not
    finished (the search of each goes on from them), the sessions so far."""

    started: ModelRunStarted
    finished: dict[int, RegionRow] = field(default_factory=dict)
    tries: dict[int, list[VariantTry]] = field(default_factory=dict)
    sessions: int = 1
    truncated: int = 0


def journal_state(events: list[Any], truncated: int = 0) -> JournalState:
    state = JournalState(started=events[0], truncated=truncated)
    for e in events[1:]:
        if isinstance(e, ModelRunResumed):
            state.sessions += 1
        elif isinstance(e, RegionStarted):
            state.tries.setdefault(e.region, [])
        elif isinstance(e, RegionTried):
            state.tries.setdefault(e.region, []).append(e.tried)
        elif isinstance(e, RegionFinished):
            state.finished[e.region] = e.row
            state.tries.pop(e.region, None)
    return state
