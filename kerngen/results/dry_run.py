"""What a dry run (``kerngen generate --dry-run``) found: how many answers the model gave (ideas
and kernels), how many compiled, how many could not be read or did not compile, how many a repair
brought to a compiled kernel, which questions got no answer and why, and what the LLM cost (the
tokens of requests billed but never answered estimated, and said so). Read off the run's journal."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table

from kerngen.agent.proposer import UNREADABLE
from kerngen.agent.tree import Run
from kerngen.harness.results import Verdict
from kerngen.results.llm_record import causes_text, estimated_tokens, ideas_answers, no_answer_causes


class DryRunSummary(BaseModel):
    ideas_answers: int = 0  # answers to ideas questions
    ideas_unreadable: int = 0  # ... of which could not be read
    answers: int = 0  # kernel specs asked of the proposer (branches and repairs; the seed not counted)
    compiled: int = 0  # compiled and passed every static check (not run: no GPU)
    unreadable: int = 0  # kernel answers that could not be read as a kernel spec
    invalid_spec: int = 0  # launch plans that do not resolve
    compile_error: int = 0  # refused by the source policy, NVRTC or the argument check
    no_answer: int = 0  # questions with no answer (the endpoint failed, a budget was spent)
    no_answer_causes: dict[str, int] = Field(default_factory=dict)  # cause -> questions
    repair_requests: int = 0  # answers that went back to the model with their error
    repaired: int = 0  # branches that failed first and compiled after a repair
    llm_calls: int = 0
    tokens: int = 0
    estimated_tokens: int = 0  # of tokens: estimated (requests billed, never answered)
    cost_usd: float | None = None
    stop: str = ""  # why the search stopped (the journal's words)


def dry_run_summary(run: Run) -> DryRunSummary:
    s = DryRunSummary()
    nodes = [n for n in run.nodes.values() if n.kind != "seed"]
    for n in nodes:
        s.answers += 1
        s.repair_requests += n.kind == "repair"
        if n.spec is None:
            if n.error.startswith(UNREADABLE):
                s.unreadable += 1
        elif n.result is not None:
            v = n.result.verdict
            s.compiled += v is Verdict.not_run
            s.invalid_spec += v is Verdict.invalid_spec
            s.compile_error += v is Verdict.compile_error
    for head in (n for n in nodes if n.kind == "branch"):
        chain = [n for n in nodes if n.repair_of == head.id]
        first_ok = head.result is not None and head.result.verdict is Verdict.not_run
        if chain and not first_ok and any(n.result is not None and n.result.verdict is Verdict.not_run for n in chain):
            s.repaired += 1
    s.ideas_answers, s.ideas_unreadable = ideas_answers(run)
    causes = no_answer_causes(run)
    s.no_answer, s.no_answer_causes = sum(causes.values()), dict(causes)
    usage: dict[str, Any] = dict(run.finished.usage) if run.finished is not None else {}
    s.llm_calls = int(usage.get("llm_calls", 0))
    s.tokens = int(usage.get("tokens", 0))
    s.estimated_tokens = estimated_tokens(usage)
    s.cost_usd = usage.get("cost_usd")
    s.stop = run.finished.reason if run.finished is not None else "unfinished"
    return s


def render_dry_run(s: DryRunSummary) -> Table:
    table = Table(title="dry run (no GPU: compiled, not run)", show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    estimated = f" ({s.estimated_tokens:,} estimated: requests billed, never answered)" if s.estimated_tokens else ""
    no_answer = f"{s.no_answer} ({causes_text(Counter(s.no_answer_causes))})" if s.no_answer else "0"
    rows = [
        ("ideas answers", f"{s.ideas_answers}" + (f" ({s.ideas_unreadable} unreadable)" if s.ideas_unreadable else "")),
        ("kernel answers", s.answers), ("compiled (not run)", s.compiled),
        ("unreadable answers", s.unreadable + s.ideas_unreadable),
        ("launch plans that do not resolve", s.invalid_spec), ("compile errors", s.compile_error),
        ("no answer", no_answer), ("repair requests", s.repair_requests),
        ("branches repaired to a compiled kernel", s.repaired), ("LLM requests", s.llm_calls),
        ("tokens", f"{s.tokens:,}{estimated}"),
        ("cost", "no prices given" if s.cost_usd is None else f"${s.cost_usd:.4f}" + (" (part estimated)" if estimated else "")),
    ]
    for what, count in rows:
        table.add_row(what, str(count))
    return table


__all__ = ["DryRunSummary", "dry_run_summary", "render_dry_run"]
