"""The LLM proposer: ideas, branches and repairs asked of a chat model.

Messages are a system prompt (``prompts/system.j2``: role, problem, GPU, rules, launch plan,
the KernelSpec schema) that stays the same for the whole search, so endpoints with prefix
caching reuse it, and one user prompt per request (``ideas.j2``, ``implement.j2``,
``repair.j2``). Every call, failed or not, goes to ``on_call`` for the journal.

A malformed answer never raises: ``implement`` and ``repair`` return ``Branch(error=...)``, and
``ideas`` asks once more (with the reason) before it returns ``[]``. Errors of the endpoint that
no other request could get past (wrong key, unknown model, bad request: ``LLMError.fatal``)
propagate; a request that spent its retries, got malformed replies or overflowed the context
becomes a ``Branch(error=...)`` in ``implement`` / ``repair``, and ``None`` from ``ideas`` (no
answer: the search journals nothing for it and a resume asks again). A question the request
budget (:meth:`LLMProposer.limit_requests`) no longer allows to be sent is answered ``None`` too.
"""

from __future__ import annotations

import functools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from kerngen.agent.llm.answers import AnswerError, IdeaList
from kerngen.agent.llm.client import NOT_SENT_KINDS, LLMCall, LLMClient, Message
from kerngen.agent.llm.prompting import render
from kerngen.agent.proposer import UNREADABLE, Branch, Category, Failure, Idea, NodeSummary, SearchContext
from kerngen.errors import LLMError
from kerngen.harness.compile.source_policy import ALLOWED_HEADERS
from kerngen.harness.spec.spec import KernelSpec

log = logging.getLogger("kerngen.llm")

CATEGORY_HELP: dict[Category, str] = {
    Category.memory_access: "data movement between global memory, shared memory and registers: coalescing, "
    "vector loads, reuse through shared memory or registers, fewer passes, no bank conflicts",
    Category.async_latency: "hide the latency of slow operations: overlap loads with compute (cp.async, "
    "double buffering, prefetching), more independent work in flight per thread",
    Category.precision: "data types and precision: narrower loads/stores or packed types where the "
    "tolerance allows, wider accumulators where accuracy needs them",
    Category.compute: "fewer or cheaper instructions: fused operations, fast intrinsics, strength reduction, "
    "warp shuffles instead of shared memory, tensor cores where the dtype allows",
    Category.parallelism: "parallelism and occupancy: work per thread/block, grid shape, registers and "
    "shared memory per block, enough warps per SM, splitting or fusing launches",
    Category.control_flow: "control flow and loops: unrolling, fewer branches and divergence, cheaper index "
    "arithmetic, specialising on the fixed sizes",
}

# What distinguishes branch i of an idea from its siblings (cycled when m is larger).
BRANCH_APPROACHES = (
    "the most direct, robust implementation of the idea",
    "a different work decomposition (how elements, rows or tiles map to threads, warps and blocks)",
    "a different memory path (vector widths, shared-memory staging or registers, cache hints)",
    "the most aggressive version of the idea, with the key choices exposed as tunables",
    "a different algorithmic variant of the idea (e.g. one pass instead of several, or the reverse)",
    "minimal synchronization: warp-level primitives instead of block-level barriers where possible",
)


class LLMProposer:
    """A :class:`kerngen.agent.proposer.Proposer` backed by an :class:`LLMClient`."""

    name = "llm"

    def __init__(self, client: LLMClient, on_call: Callable[[LLMCall], None] | None = None) -> None:
        self.client = client
        self.on_call = on_call
        # why a request was not sent (a budget: kind ``budget`` or ``cost``), for the search to stop on
        self.not_sent: LLMError | None = None
        self._context_warned = False
        self._warnings: list[str] = []

    @property
    def warnings(self) -> list[str]:
        """What the user should hear of the endpoint once the search is over: a context smaller
        than the prompts, a prompt the endpoint seems to have truncated (its token count)."""
        return [*self._warnings, *(w for w in self.client.warnings if w not in self._warnings)]

    # ----- Proposer ---------------------------------------------------------------------------
    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea] | None:
        user = render(
            "ideas",
            ctx=ctx,
            parent=parent,
            k=k,
            categories=[(c.value, CATEGORY_HELP[c]) for c in Category],
            answer_schema=_schema_text(IdeaList),
        )
        messages = self._messages(ctx, user)
        for attempt in range(2):
            try:
                answer, call = self.client.complete(messages, IdeaList, purpose="ideas")
            except AnswerError as exc:
                self._journal(exc)
                if attempt == 0:
                    messages = messages + [
                        {"role": "assistant", "content": _clipped(exc.text)},
                        {"role": "user", "content": f"That answer could not be read: {exc}. Answer again with JSON only."},
                    ]
                continue
            except LLMError as exc:
                self._journal(exc)
                if getattr(exc, "fatal", True):
                    raise
                if getattr(exc, "kind", "") in NOT_SENT_KINDS:
                    self.not_sent = exc
                log.warning("no ideas from the LLM: %s", exc)
                return None
            self._report(call)
            assert isinstance(answer, IdeaList)
            return answer.ideas[:k]
        log.warning("no readable ideas from the LLM after 2 answers")
        return []

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea,
                  m: int) -> list[Branch] | None:
        if m <= 0:
            return []

        def one(i: int) -> Branch | None:
            user = render(
                "implement",
                ctx=ctx,
                parent=parent,
                idea=idea,
                branch=i,
                m_branches=m,
                approach=BRANCH_APPROACHES[i % len(BRANCH_APPROACHES)],
            )
            return self._spec_call(self._messages(ctx, user), purpose="implement")

        workers = max(1, min(m, self.client.config.max_concurrency))
        if workers == 1:
            branches = [one(i) for i in range(m)]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kerngen-llm") as pool:
                branches = list(pool.map(one, range(m)))
        if all(b is None for b in branches):
            return None  # nothing could be sent: no answer (a resume with more budget asks again)
        return [b if b is not None else Branch(error=f"LLM call not sent: {_BUDGET_SPENT}") for b in branches]

    def repair(self, ctx: SearchContext, failure: Failure, attempt: int) -> Branch | None:
        """A failed kernel goes back with its evidence (``repair.j2``); an answer that could not be
        read goes back with the reason and its start (``repair_answer.j2``). Both show the idea
        and the parent of the branch, so that the fix keeps its point."""
        if failure.unreadable:
            user = render("repair_answer", ctx=ctx, failure=failure, attempt=attempt,
                          answer=_clipped(failure.answer, 12_000))
        else:
            user = render("repair", ctx=ctx, failure=failure, attempt=attempt)
        return self._spec_call(self._messages(ctx, user), purpose="repair")

    @property
    def concurrency(self) -> int:
        """Questions the search may ask at once: every request of a wave is in flight together,
        up to ``--llm-concurrency`` (the client's semaphore bounds the HTTP requests)."""
        return self.client.config.max_concurrency

    def limit_requests(self, total: int | None) -> None:
        """At most ``total`` HTTP requests over the client's life (see
        :meth:`LLMClient.limit_requests`); the search sets it from ``--max-llm-calls``."""
        self.client.limit_requests(total)

    def limit_cost(self, usd: float | None) -> None:
        """Spend at most ``usd`` more (see :meth:`LLMClient.limit_cost`); the search sets it from
        ``--max-cost`` less what its journal says was spent."""
        self.client.limit_cost(usd)

    # ----- helpers ----------------------------------------------------------------------------
    def system_prompt(self, ctx: SearchContext) -> str:
        return render("system", ctx=ctx, spec_schema=_schema_text(KernelSpec), headers=ALLOWED_HEADERS)

    def _messages(self, ctx: SearchContext, user: str) -> list[Message]:
        system = self.system_prompt(ctx)
        if not self._context_warned:  # said once: a prompt larger than the endpoint's context
            warning = self.client.warn_if_context_small(len(system) + len(user))
            if warning:
                self._context_warned = True
                self._warnings.append(warning)
                log.warning("%s", warning)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _spec_call(self, messages: list[Message], *, purpose: str) -> Branch | None:
        try:
            spec, call = self.client.complete(messages, KernelSpec, purpose=purpose)
        except AnswerError as exc:
            self._journal(exc)
            return Branch(error=f"{UNREADABLE}: {exc}", notes=_notes(exc.text), answer=_clipped(exc.text))
        except LLMError as exc:
            self._journal(exc)
            if getattr(exc, "fatal", True):
                raise
            if getattr(exc, "kind", "") in NOT_SENT_KINDS:  # a budget kept it from being sent
                self.not_sent = exc
                return None
            return Branch(error=f"LLM call failed: {exc}")
        self._report(call)
        assert isinstance(spec, KernelSpec)
        return Branch(spec=spec, notes=spec.description)

    def _report(self, call: LLMCall) -> None:
        if self.on_call is None:
            return
        try:
            self.on_call(call)
        except Exception:  # the journal hook must not break the search
            log.exception("on_call hook failed")

    def _journal(self, exc: Exception) -> None:
        call = getattr(exc, "call", None)
        if isinstance(call, LLMCall) and call.attempts > 0:  # a call the budget kept from being sent is none
            self._report(call)


_BUDGET_SPENT = "the LLM request budget is spent"


@functools.cache
def _schema_text(model_cls: type) -> str:
    return json.dumps(model_cls.model_json_schema())


def _clipped(text: str, limit: int = 16_000) -> str:
    """A bad answer as it is shown back to the model: its start (a 400 kB answer is not sent
    again whole)."""
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} characters cut]"


def _notes(text: str, limit: int = 500) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["BRANCH_APPROACHES", "CATEGORY_HELP", "LLMProposer"]
