"""The LLM proposer: ideas, branches and repairs asked of a chat model.

Messages are a system prompt (``prompts/system.j2``: role, problem, GPU, rules, launch plan, how
to answer) that stays the same for the whole search, so endpoints with prefix caching reuse it,
and one user prompt per request (``ideas.j2``, ``implement.j2``, ``repair.j2``). How to answer is
said once, by whether the endpoint takes structured output: with it, the kernel spec's schema
(trimmed to what the problem can use: :mod:`.spec_schema`) goes in ``response_format`` only and
the answer is one JSON object; without it, the schema is in the system prompt and the answer is a
```` ```cuda ```` block plus a JSON plan. Every call, failed or not, is journaled by the client
(``on_call``).

A malformed answer never raises: ``implement`` and ``repair`` return ``Branch(error=...)``, and
``ideas`` asks once more (with the reason) before it returns ``[]``. An answer with two kernel
specs gives the one its text points to, else the first (and, in ``implement``, the others as
sibling branches). Errors of the endpoint that no other request could get past (wrong key,
unknown model, bad request: ``LLMError.fatal``) propagate. A prompt the endpoint refuses as too
long for the context is not sent again as it was: sources and logs are clipped to a quarter and
it is asked again; refused still, the search stops (:meth:`LLMProposer.stop_reason`). A request
that spent its retries, got malformed or too large replies becomes a ``Branch(error="LLM call
failed (CAUSE): ...")`` in ``implement`` / ``repair``, and ``None`` from ``ideas`` (no answer:
the search journals nothing for it, a resume asks again). A question a budget kept from being
sent is answered ``None`` too.

:meth:`LLMProposer.stop_reason` is why the search should stop, as this proposer knows it: a
budget that kept a request back (by name), a prompt too long even when shrunk, and, when a round
produced nothing (``idle``), the endpoint's error or the reason the ideas could not be read.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kerngen.agent.budget import StopKind, StopReason
from kerngen.agent.llm.answers import AnswerError, IdeaList, read_answers
from kerngen.agent.llm.client import NOT_SENT_KINDS, LLMCall, LLMClient, Message
from kerngen.agent.llm.prompting import LOG_LIMIT, SOURCE_LIMIT, arch_limits, clip, fp32_bounds, reference_source, render
from kerngen.agent.llm.source_notes import refused_constructs
from kerngen.agent.llm.spec_schema import lean_schema, spec_schema, spec_schema_text, tma_usable
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
ANSWER_CLIP = 12_000  # characters of an unreadable answer shown back to the model
MIN_CLIP = 1_500  # sources are not clipped below this when a prompt is too long for the context
_NOT_SENT_STOP = {"budget": StopKind.llm_calls, "cost": StopKind.cost, "deadline": StopKind.wall_minutes,
                  "interrupted": StopKind.interrupted}


class LLMProposer:
    """A :class:`kerngen.agent.proposer.Proposer` backed by an :class:`LLMClient`."""

    name = "llm"

    def __init__(self, client: LLMClient, on_call: Callable[[LLMCall], None] | None = None) -> None:
        self.client = client
        if on_call is not None:  # the client hands every call it sent to the journal
            client.on_call = on_call
        self.not_sent: LLMError | None = None  # why a request was not sent (a budget)
        self.fatal: StopReason | None = None  # why no request can succeed any more (a prompt too long even shrunk)
        self.idle_reason: StopReason | None = None  # why the last ideas question got no ideas
        self.clip_limit = SOURCE_LIMIT  # characters of one source or log a prompt shows (shrinks on context errors)
        self._context_warned = False
        self._warnings: list[str] = []

    @property
    def warnings(self) -> list[str]:
        """What the user should hear of the endpoint once the search is over: a context smaller
        than the prompts, a prompt the endpoint seems to have truncated, a raised output budget."""
        return [*self._warnings, *(w for w in self.client.warnings if w not in self._warnings)]

    # ----- what the search asks of a proposer beside the questions --------------------------------
    def stop_reason(self, idle: bool = False) -> StopReason | None:
        """Why the search should stop (None: it need not): a budget that kept a request back, a
        prompt no shrinking made fit; with ``idle`` (the round produced nothing), also why the
        ideas got no answer (the endpoint's error, or why they could not be read)."""
        if self.not_sent is not None:
            kind = _NOT_SENT_STOP.get(getattr(self.not_sent, "kind", ""), StopKind.llm_calls)
            return StopReason(kind, f"budget: {' '.join(str(self.not_sent).split())[:300]}")
        if self.fatal is not None:
            return self.fatal
        return self.idle_reason if idle else None

    def report_earlier_calls(self) -> None:
        """Journal the calls made before the journal existed (the endpoint check)."""
        pending, self.client.unreported[:] = list(self.client.unreported), []
        for call in pending:
            if self.client.on_call is not None:
                self.client.on_call(call)

    def limit_requests(self, more: int | None) -> None:
        """At most ``more`` HTTP requests from now on (what is left of ``--max-llm-calls``)."""
        self.client.limit_requests(None if more is None else self.client.requests_made + max(0, more))

    def limit_cost(self, usd: float | None) -> None:
        """Spend at most ``usd`` more (``--max-cost`` less what the journal says was spent)."""
        self.client.limit_cost(usd)

    def limit_time(self, seconds: float | None) -> None:
        """Send nothing past ``seconds`` from now (what is left of ``--minutes``)."""
        self.client.limit_time(seconds)

    def abandon(self) -> None:
        """Ctrl-C: the calls in flight are journaled now (estimated), nothing is sent after."""
        self.client.abandon()

    @property
    def concurrency(self) -> int:
        """Questions the search may ask at once (``--llm-concurrency``)."""
        return self.client.config.max_concurrency

    # ----- Proposer ---------------------------------------------------------------------------
    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea] | None:
        categories = [(c.value, CATEGORY_HELP[c]) for c in Category]
        build = self.messages_for(ctx, "ideas", parent=parent, k=k, categories=categories)
        extra: list[Message] = []
        last = ""
        for attempt in range(2):
            try:
                answer, _ = self._ask(lambda s: build(s) + extra, IdeaList, "ideas", None)
            except AnswerError as exc:
                last = str(exc)
                if attempt == 0:
                    extra = [{"role": "assistant", "content": clip(exc.text, 16_000)},
                             {"role": "user", "content": f"That answer could not be read: {exc}. "
                                                         "Answer again with the JSON object only."}]
                continue
            except LLMError as exc:
                self._failed(exc)
                self.idle_reason = StopReason(StopKind.llm_error, f"LLM endpoint: {_line(exc)}")
                log.warning("no ideas from the LLM: %s", exc)
                return None
            assert isinstance(answer, IdeaList)
            self.idle_reason = None
            return answer.ideas[:k]
        self.idle_reason = StopReason(StopKind.no_candidates,
                                      f"the model's ideas could not be read (2 answers): {_line(last)}")
        log.warning("no readable ideas from the LLM after 2 answers")
        return []

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea,
                  m: int) -> list[Branch] | None:
        if m <= 0:
            return []

        def one(i: int) -> list[Branch] | None:
            build = self.messages_for(ctx, "implement", parent=parent, idea=idea, branch=i, m_branches=m,
                                  approach=BRANCH_APPROACHES[i % len(BRANCH_APPROACHES)])
            return self._spec_call(ctx, build, purpose="implement", siblings=True)

        workers = max(1, min(m, self.client.config.max_concurrency))
        if workers == 1:
            answers = [one(i) for i in range(m)]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kerngen-llm") as pool:
                answers = list(pool.map(one, range(m)))
        if all(a is None for a in answers):
            return None  # nothing could be sent: no answer (a resume with more budget asks again)
        why = f"LLM call not sent ({getattr(self.not_sent, 'cause', '') or 'budget'}): {_line(self.not_sent)}"
        primary = [a[0] if a else Branch(error=why) for a in answers]
        extra = [b for a in answers if a for b in a[1:]][:m]  # a second spec in one answer: a sibling
        return primary + extra

    def repair(self, ctx: SearchContext, failure: Failure, attempt: int) -> Branch | None:
        """A failed kernel goes back with its evidence (``repair.j2``); an answer that could not be
        read goes back with the reason and its start (``repair_answer.j2``). Both show the idea,
        the parent of the branch and its earlier attempts, so that the fix keeps its point."""
        if failure.unreadable:
            build = self.messages_for(ctx, "repair_answer", failure=failure, attempt=attempt,
                                  answer=clip(failure.answer, ANSWER_CLIP))
        else:
            source = failure.spec.source if failure.spec is not None else ""
            verdict = failure.result.verdict.value if failure.result is not None else ""
            notes = refused_constructs(source) if verdict == "compile_error" else []
            # a compile error's log is the evidence; after a compile, it is ptxas's register counts (shown apart)
            logs = LOG_LIMIT if verdict == "compile_error" else LOG_LIMIT // 4
            build = self.messages_for(ctx, "repair", failure=failure, attempt=attempt, host_problems=notes,
                                      log_cap=logs)
        branches = self._spec_call(ctx, build, purpose="repair", siblings=False)
        return branches[0] if branches else None

    def ask_spec(self, ctx: SearchContext, template: str, **variables: Any) -> Branch | None:
        """One kernel question of ``prompts/<template>.j2`` (a model run's region: ``region``) under the system
        prompt of ``ctx``, read as the op questions are: a Branch with the spec, or with why there is none (an
        unreadable answer, a failed call); None when nothing was sent (a budget, the deadline)."""
        got = self._spec_call(ctx, self.messages_for(ctx, template, **variables), purpose=template, siblings=False)
        return got[0] if got else None

    # ----- prompts ----------------------------------------------------------------------------
    def system_prompt(self, ctx: SearchContext, structured: bool = False) -> str:
        b = ctx.baseline
        fp32 = bool(ctx.dtypes) and all(str(d) in ("float32", "torch.float32") for d in ctx.dtypes.values())
        bounds = (fp32_bounds(b.flops, b.min_bytes, ctx.gpu)
                  if b is not None and fp32 and b.floor_bound == "compute" else None)
        return render("system", ctx=ctx, structured=structured, spec_schema="" if structured else spec_schema_text(ctx),
                      headers=ALLOWED_HEADERS, tma=tma_usable(ctx), limits=arch_limits(ctx.gpu.arch), bounds=bounds,
                      reference=reference_source(ctx.problem_source), clip_limit=self.clip_limit)

    def messages_for(self, ctx: SearchContext, template: str, **variables: Any) -> Callable[[bool], list[Message]]:
        """The messages of a question as a function of "structured output", rendered at send time
        (so that a prompt shrunk after a context error is rendered shrunk)."""
        cap = variables.pop("log_cap", LOG_LIMIT)

        def build(structured: bool) -> list[Message]:
            user = render(template, ctx=ctx, structured=structured, clip_limit=self.clip_limit,
                          log_limit=min(cap, max(MIN_CLIP // 2, self.clip_limit // 4)), **variables)
            system = self.system_prompt(ctx, structured)
            self._warn_context(len(system) + len(user))
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return build

    def _warn_context(self, chars: int) -> None:
        if self._context_warned or self.client is None:  # said once: a prompt larger than the endpoint's context
            return
        warning = self.client.warn_if_context_small(chars)
        if warning:
            self._context_warned = True
            self._warnings.append(warning)
            log.warning("%s", warning)

    # ----- asking -----------------------------------------------------------------------------
    def _ask(self, build: Callable[[bool], list[Message]], model: type, purpose: str,
             ctx: SearchContext | None) -> tuple[Any, LLMCall]:
        """One question; a prompt the endpoint refuses as too long for the context is shrunk
        (sources and logs clipped to a quarter) and asked again, until it cannot shrink more."""
        schema = spec_schema(ctx) if ctx is not None else lean_schema(model)
        while True:
            try:
                return self.client.complete(build, model, purpose=purpose, schema=schema)
            except LLMError as exc:
                if getattr(exc, "kind", "") != "context_length":
                    raise
                if self.clip_limit <= MIN_CLIP:
                    self.fatal = StopReason(StopKind.llm_error, (
                        f"LLM endpoint: the prompt does not fit the model's context even with sources and logs "
                        f"clipped to {self.clip_limit} characters: {_line(exc)}"))
                    raise
                self.clip_limit = max(MIN_CLIP, self.clip_limit // 4)
                log.warning("the prompt is too long for the model's context: sources and logs now clipped to %d "
                            "characters", self.clip_limit)

    def _spec_call(self, ctx: SearchContext, build: Callable[[bool], list[Message]], *, purpose: str,
                   siblings: bool) -> list[Branch] | None:
        """The answer to a kernel question as branches (the chosen spec first, then, with
        ``siblings``, the other specs the same answer held); None when nothing was sent."""
        try:
            spec, call = self._ask(build, KernelSpec, purpose, ctx)
        except AnswerError as exc:
            return [Branch(error=f"{UNREADABLE}: {exc}", notes=_notes(exc.text), answer=clip(exc.text, 16_000))]
        except LLMError as exc:
            if self._failed(exc):
                return None
            return [Branch(error=f"LLM call failed ({getattr(exc, 'cause', '') or 'error'}): {exc}")]
        assert isinstance(spec, KernelSpec)
        out = [Branch(spec=spec, notes=spec.description)]
        if siblings:
            try:
                _, others = read_answers(call.response_text, KernelSpec)
            except AnswerError:  # read once already: cannot happen, but an answer is untrusted
                others = []
            out += [Branch(spec=o, notes=f"a second spec in the same answer: {o.description}") for o in others]
        return out

    def _failed(self, exc: LLMError) -> bool:
        """Note an endpoint error; raise it again when it is fatal. True when it kept the
        request from being sent (a budget)."""
        if getattr(exc, "fatal", True):
            raise exc
        if getattr(exc, "kind", "") in NOT_SENT_KINDS:
            self.not_sent = exc
            return True
        return False


def _line(text: object, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def _notes(text: str, limit: int = 500) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["BRANCH_APPROACHES", "CATEGORY_HELP", "LLMProposer"]
