"""A run's problem as data, and when a run's problem file may be run again.

A run folder may come from someone else, and its journal names a problem by a built-in name or
by the path of a KernelBench ``.py`` file. Importing that file runs its code, so:

* When a search starts, :func:`record_for_run` keeps what ``show``, ``report``, ``export``,
  ``suite`` and ``kerngen.load`` need as data in the ``run_started`` event
  (:class:`ProblemRecord`: the problem's :class:`~kerngen.problems.info.ProblemInfo`, the
  file's text and its sha256). Those commands read :func:`recorded_info` and never import a
  problem file: for an older run without the record they fall back only to a built-in (kerngen's
  own file), else they say what is missing.
* ``replay`` and ``generate --resume`` run the problem again; :func:`rerun_ref` says which file
  and refuses unless it is a built-in, or named on the command line, or unchanged since the run
  started: its sha256 equals the one recorded AND kerngen itself ran that content on this machine
  (``$KERNGEN_CACHE_DIR/trusted-problems.txt``, written when a search starts on a file). The
  second half matters: a run folder from elsewhere carries its own record, so a crafted folder
  could name a ``.py`` it ships together with that file's true sha256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from kerngen.agent.safe_paths import UnsafePathError, regular_file, shown
from kerngen.errors import KerngenError, ProblemError
from kerngen.problems.info import ProblemInfo
from kerngen.problems.ref import ProblemRef

TRUST_FILE = "trusted-problems.txt"
MAX_PROBLEM_BYTES = 16 << 20
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class ProblemRecord(BaseModel):
    """What a run keeps of its problem (``run_started.problem_info``)."""

    model_config = ConfigDict(extra="ignore")

    info: ProblemInfo  # name, description, inputs/params/outputs (shapes, dtypes), sizes, FLOPs, bytes
    source: str = ""  # the problem file's text when the run started
    sha256: str = ""  # of the file's bytes

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if value and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("not a sha256 hex digest")
        return value


# ----- recording ----------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    return hashlib.sha256(_read(path)).hexdigest()


def _read(path: Path) -> bytes:
    try:
        return regular_file(path, "problem file", MAX_PROBLEM_BYTES).read_bytes()
    except OSError as exc:
        raise ProblemError(f"problem file {path}: cannot be read ({exc})") from None


def record_problem(ref: ProblemRef) -> ProblemRecord:
    """Load ``ref`` (this imports the file: only for a problem the user named) and record it."""
    from kerngen.problems.load import load_problem

    problem = load_problem(ref)
    data = _read(problem.path)
    return ProblemRecord(info=problem.info, source=data.decode("utf-8", "replace"),
                         sha256=hashlib.sha256(data).hexdigest())


def record_for_run(ref: ProblemRef) -> ProblemRecord | None:
    """The record of a search that starts now on ``ref`` (None when the problem does not load:
    the scripted demo runs on any name). A file's content is remembered as run by kerngen here."""
    try:
        record = record_problem(ref)
    except (KerngenError, OSError):
        return None
    if not record.info.builtin and record.sha256:
        remember(record.sha256, Path(record.info.path))
    return record


# ----- reading, never importing -------------------------------------------------------------
def builtin_ref(ref: ProblemRef) -> ProblemRef | None:
    """``ref`` as a built-in by its bare name (kerngen's own file), or None for anything else."""
    from kerngen.problems import registry

    src = ref.source
    if not isinstance(src, str) or not src or _CONTROL.search(src):
        return None
    if "/" not in src and "\\" not in src and not src.endswith(".py"):
        return ref if registry.is_builtin(src) else None
    path = _path_or_none(src)
    if path is not None and path.parent == registry.SUITE_DIR and registry.is_builtin(path.stem) and path.is_file():
        return ref.model_copy(update={"source": path.stem})
    return None


def recorded_info(started: Any) -> ProblemInfo:
    """The problem of a run (its ``run_started`` event) as data: the record, else a built-in's
    own description. Never imports a problem file that a run names."""
    record = getattr(started, "problem_info", None)
    if record is not None:
        return record.info
    ref = builtin_ref(started.problem)
    if ref is not None:
        from kerngen.problems.load import load_problem

        return load_problem(ref).info
    raise ProblemError(
        f"run {started.run_id} records no data of its problem {shown(started.problem.source)} (a run from before "
        "kerngen kept it), and kerngen does not import a problem file that a run folder names; make a run that "
        "records it with `kerngen replay RUN --problem FILE`"
    )


# ----- running again ------------------------------------------------------------------------
def rerun_ref(started: Any, named: str | None = None, hint: str = "--problem FILE") -> tuple[ProblemRef, str]:
    """(the problem to run again for a run's ``run_started`` event, a line saying which file and
    why). ``named``: the problem the user gave on this command line. :class:`ProblemError` (one
    line, ``hint`` says how to name the file) for a file kerngen may not run."""
    ref: ProblemRef = started.problem
    rid = started.run_id
    record = getattr(started, "problem_info", None)
    want = record.sha256 if record is not None else ""
    builtin = builtin_ref(ref)
    if named is not None:
        named_builtin = builtin_ref(ProblemRef(source=named))
        if builtin is not None or named_builtin is not None:
            if builtin is None or named_builtin is None or builtin.source != named_builtin.source:
                raise ProblemError(f"run {rid} searched {shown(ref.source)}, not {shown(named)}")
            return builtin, f"problem: the built-in {builtin.source}"
        path = _path_or_none(named)
        if path is None or not path.is_file():
            raise ProblemError(f"problem file {shown(named)} not found")
        sha = file_sha256(path)
        if want and sha != want and _path_or_none(ref.source) != path:
            raise ProblemError(f"run {rid} searched {shown(ref.source)} (sha256 {want[:12]}), not {path} "
                               f"(sha256 {sha[:12]})")
        remember(sha, path)
        why = ("" if sha == want else ", changed since the run recorded it" if want
               else ", the run recorded no sha256 of it")
        return ref.model_copy(update={"source": str(path)}), f"problem file: {path} (named on the command line{why})"
    if builtin is not None:
        return builtin, f"problem: the built-in {builtin.source}"
    path = _path_or_none(ref.source)
    if path is None or not path.is_file():
        if path is not None and not path.exists() and not ref.source.endswith(".py"):
            # neither a built-in nor a file: nothing to import (the scripted demo runs on any name)
            return ref, f"problem: {ref.label()} (neither a built-in nor a file)"
        raise ProblemError(f"run {rid}: its problem file {shown(ref.source)} is not here; name the file with {hint}")
    if not want:
        raise ProblemError(f"run {rid} recorded no sha256 of its problem file {path} (an older run), and kerngen "
                           f"does not run a file on a run folder's word; read it, then name it with {hint}")
    sha = file_sha256(path)
    if sha != want:
        raise ProblemError(f"problem file {path} changed since run {rid} started (sha256 {want[:12]} then, "
                           f"{sha[:12]} now); name it with {hint} to run it anyway")
    if not trusted(sha):
        raise ProblemError(f"problem file {path} matches run {rid}'s record, but kerngen never ran it on this "
                           f"machine (the record came with the run folder); read it, then name it with {hint}")
    return ref.model_copy(update={"source": str(path)}), f"problem file: {path} (unchanged since the run started)"


def _path_or_none(source: str) -> Path | None:
    if not isinstance(source, str) or not source or _CONTROL.search(source):
        return None
    try:
        return Path(source).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None


# ----- the problem files kerngen ran on this machine ----------------------------------------
def _trust_path() -> Path:
    from kerngen.harness.cache_dir import cache_root

    return cache_root() / TRUST_FILE


def trusted(sha: str) -> bool:
    """Whether a search started on a file with this content on this machine."""
    try:
        text = regular_file(_trust_path(), "trust list", 16 << 20).read_text(errors="replace")
    except (OSError, UnsafePathError):
        return False
    return any(line.split(" ", 1)[0] == sha for line in text.splitlines())


def remember(sha: str, path: Path) -> None:
    """Add a content hash to the trust list (best effort: a read-only cache only means the user
    names the file next time)."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha) or trusted(sha):
        return
    where = _CONTROL.sub("?", str(path))
    try:
        trust = _trust_path()
        trust.parent.mkdir(parents=True, exist_ok=True)
        with open(trust, "a", encoding="utf-8") as fh:
            fh.write(f"{sha} {where}\n")
    except OSError:
        pass


__all__ = ["ProblemRecord", "builtin_ref", "file_sha256", "record_for_run", "record_problem", "recorded_info",
           "remember", "rerun_ref", "trusted"]
