"""Asking the proposer a wave of questions at once (all ideas of a round, all implementations of
its ideas, one attempt of every repair), answers reused where the journal (or a record) has them.

A question is ``(key, ask, done)``: its answer-book key, how to ask it, and what to do with the
answer. ``done(answer, journaled)`` is called in the caller's thread (the journal is written
from one thread), as each answer comes; ``answer`` None means not asked (a budget is spent, or
a strict replay has no recorded answer). With ``concurrency`` above one the questions that must
be asked are all in flight together, up to that many (the LLM proposer: ``--llm-concurrency``,
whose client also caps the requests sent); with one, they are asked in order and the budgets
are checked before each (the playbook and scripted proposers: deterministic).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable

from kerngen.agent.budget import SearchBudget, Usage, remaining_wall_s
from kerngen.agent.tree import AnswerBook, Key

Question = tuple[Key, Callable[[], Any], Callable[[Any, bool], None]]


def ask_wave(questions: list[Question], *, own: AnswerBook, external: AnswerBook, usage: Usage,
             may_ask: Callable[[], bool], concurrency: int) -> None:
    """Answer every question: from ``own`` (already in this journal: ``journaled`` True), from
    ``external`` (a record followed), else by asking when ``may_ask()`` (checked at each one)."""
    pending: list[tuple[Callable[[], Any], Callable[[Any, bool], None]]] = []
    for key, ask, done in questions:
        if key in own or key in external:
            usage.reused_answers += 1
            done(*((own.get(key), True) if key in own else (external.get(key), False)))
            continue
        if not may_ask():
            done(None, False)
            continue
        usage.proposer_calls += 1
        if concurrency <= 1:
            done(ask(), False)
        else:
            pending.append((ask, done))
    if not pending:
        return
    pool = ThreadPoolExecutor(max_workers=min(concurrency, len(pending)), thread_name_prefix="kerngen-ask")
    try:
        futures = {pool.submit(ask): done for ask, done in pending}
        for future in as_completed(futures):
            futures[future](future.result(), False)  # a fatal error of one question ends the search
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def give_limits(proposer: Any, budget: SearchBudget, usage: Usage) -> None:
    """The calls a proposer made before the journal existed (the LLM endpoint's check) are
    journaled, and counted; then a proposer that can cap its own HTTP requests, their cost and
    their time (the LLM proposer) gets what is left of ``max_llm_calls``, ``max_cost_usd`` and
    ``wall_minutes``: the check before each question cannot see that question's retries or
    parallel branches, nor a request that trickles past the deadline; the caps can (``usage``:
    what the journal holds so far)."""
    earlier = getattr(proposer, "report_earlier_calls", None)
    if callable(earlier):
        earlier()
    limit = getattr(proposer, "limit_requests", None)
    if callable(limit):
        cap = budget.max_llm_calls
        limit(None if cap is None else max(0, cap - usage.calls))
    limit_cost = getattr(proposer, "limit_cost", None)
    if callable(limit_cost):
        usd = budget.max_cost_usd
        limit_cost(None if usd is None else max(0.0, usd - (usage.cost_usd or 0.0)))
    limit_time = getattr(proposer, "limit_time", None)
    if callable(limit_time):
        left = remaining_wall_s(budget, usage)
        limit_time(None if left is None else max(0.0, left))


__all__ = ["Question", "ask_wave", "give_limits"]
