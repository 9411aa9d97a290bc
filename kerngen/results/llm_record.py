"""What a run's journal says of its LLM calls, for ``show``, ``--json`` and the dry run's table:
why questions got no answer (with counts), how the ideas answers went, the tokens estimated.

A journal may come from anyone: every field is read as untrusted data (wrong types are skipped,
counts are sane), never trusted to be well formed."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterator

from kerngen.agent.tree import Run
from kerngen.text import sane_count

# how a node's error names the cause when its question got no answer ("LLM call failed (HTTP 500): ...")
_NO_ANSWER = re.compile(r"^LLM call (failed|not sent)(?: \(([^()]{1,40})\))?:")


def no_answer_cause(error: str) -> str | None:
    """The cause a node's error gives for a question that got no answer, None for any other error."""
    m = _NO_ANSWER.match(error or "")
    if m is None:
        return None
    return m.group(2) or m.group(1)  # a journal of an older kerngen: "failed" / "not sent"


def call_records(run: Run) -> Iterator[dict[str, Any]]:
    """The LLM call records of a run's journal (each a dict, as journaled)."""
    for ev in run.events:
        record = getattr(ev, "record", None) if getattr(ev, "type", "") == "llm_call" else None
        if isinstance(record, dict):
            yield record


def no_answer_causes(run: Run) -> Counter[str]:
    """Questions that got no answer, by cause: the branches and repairs whose node says so, and
    the ideas requests that failed (an ideas question has no node)."""
    causes: Counter[str] = Counter()
    for n in run.nodes.values():
        if n.spec is None:
            cause = no_answer_cause(n.error)
            if cause:
                causes[cause] += 1
    for rec in call_records(run):
        cause = rec.get("cause")
        if rec.get("purpose") == "ideas" and isinstance(cause, str) and cause and not cause.startswith("unreadable"):
            causes[cause[:40]] += 1
    return causes


def ideas_answers(run: Run) -> tuple[int, int]:
    """(answers to ideas questions, of which unreadable)."""
    answered = unreadable = 0
    for rec in call_records(run):
        if rec.get("purpose") != "ideas":
            continue
        cause = rec.get("cause")
        if isinstance(cause, str) and cause.startswith("unreadable"):
            answered, unreadable = answered + 1, unreadable + 1
        elif not rec.get("error"):
            answered += 1
    return answered, unreadable


def estimated_tokens(usage: dict[str, Any] | None) -> int:
    """Of a recorded usage's tokens, those estimated (requests billed but never answered); the
    journal records a usage's counts as numbers (``18938.0``)."""
    value = (usage or {}).get("estimated_tokens")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return sane_count(value)


def causes_text(causes: Counter[str]) -> str:
    """``HTTP 500 x2, timeout x1`` (most frequent first)."""
    return ", ".join(f"{cause} x{n}" for cause, n in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))


__all__ = ["call_records", "causes_text", "estimated_tokens", "ideas_answers", "no_answer_cause", "no_answer_causes"]
