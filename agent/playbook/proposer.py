"""The offline playbook proposer: the same Protocol as the LLM proposer, answers from a catalogue."""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from kerngen.agent.proposer import Branch, Failure, Idea, NodeSummary, SearchContext
from kerngen.expr import TensorFacts
from kerngen.errors import SpecError
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.prune import static_reason

from kerngen.agent.playbook.coverage import Offer, default_limits, offer
from kerngen.agent.playbook.entry import Entry
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.regions import REGIONS, explain, family_of, offer_regions
from kerngen.agent.playbook.render import COOP_NB
from kerngen.agent.playbook.terms import idea_text


class PlaybookProposer:
    """Proposes the catalogue's ideas for the problem's family, round by round, never repeating one.

    Honest coverage (:mod:`.coverage`): a variant is offered only when it admits at least one
    configuration at the problem's shape for the GPU's limits (the search context's GPU, else
    ``gpu``, else sm_90's); ideas of a dropped variant are never proposed. When no variant of the
    family admits anything, ``match`` is None and ``reason`` says which variants were tried and why
    each admits nothing (``kerngen generate`` stops there, before any GPU work). Not ``exhaustive``:
    the offers stop at each variant's first usable configuration (:func:`.coverage.offer`), enough to
    list what is offered and why not (``kerngen playbook DIR``), not to count it."""

    name = "playbook"

    def __init__(self, problem: Any, gpu: GpuFacts | None = None, exhaustive: bool = True) -> None:
        self.problem = problem
        self._exhaustive = exhaustive
        self._gpu = gpu or default_limits()
        self._offers: dict[tuple, Offer] = {}
        self._proposed: set[str] = set()
        self._by_text: dict[str, Entry] = {}
        self.match: FamilyMatch | None = None
        self.recognised: FamilyMatch | None = None  # the family read from the problem, offered or not
        self.offer: Offer | None = None  # what is offered for the GPU's limits known so far
        try:
            self.recognised = explain(problem, exhaustive)
        except NotCovered as exc:
            self.reason = str(exc)
            return
        self.offer = self._offer(None)
        self.reason = self.offer.reason
        if self.offer.offered:
            self.match = self.recognised

    # ----- helpers ---------------------------------------------------------------------------
    @property
    def family(self) -> Family | None:
        m = self.match or self.recognised
        return family_of(m) if m is not None else None

    def _entries(self) -> list[Entry]:
        return list(self.family.ideas) if self.match else []

    def _facts(self, ctx: SearchContext | None) -> dict[str, TensorFacts]:
        m = self.match or self.recognised
        tensors = dict(m.tensors()) if m else {}
        if ctx is not None and ctx.tensors:
            tensors.update({k: tuple(v) for k, v in ctx.tensors.items()})
        return {k: TensorFacts(tuple(v)) for k, v in tensors.items()}

    def _sizes(self, ctx: SearchContext | None) -> dict[str, int | float]:
        info = getattr(self.problem, "info", None)
        sizes = dict(getattr(info, "sizes", None) or {})
        if ctx is not None:
            sizes.update(ctx.sizes)
        return sizes

    def _gpu_of(self, ctx: SearchContext | None) -> GpuFacts:
        return ctx.gpu if ctx is not None else self._gpu

    def _offer(self, ctx: SearchContext | None) -> Offer:
        """The variants offered at the context's shape for its GPU's limits (cached)."""
        gpu, tensors, sizes = self._gpu_of(ctx), self._facts(ctx), self._sizes(ctx)
        pinned = {v: d for v in self.family.variants if (d := self._device_defaults(v, gpu))}
        key = (gpu.arch, gpu.max_threads_per_block, gpu.max_shared_per_block_optin,  # arch: wgmma on sm_90 only
               tuple(sorted((k, f.shape) for k, f in tensors.items())), tuple(sorted(sizes.items())),
               tuple(sorted((v, tuple(sorted(d.items()))) for v, d in pinned.items())))
        if key not in self._offers:
            if self.recognised.family == REGIONS:
                self._offers[key] = offer_regions(self.recognised, sizes, gpu, self._exhaustive)
            else:
                self._offers[key] = offer(self.recognised, sizes=sizes, tensors=tensors, gpu=gpu, pinned=pinned,
                                          exhaustive=self._exhaustive, family=self.family)
        off = self._offers[key]
        if ctx is not None and not off.offered and off.reason:
            self.reason = off.reason  # why this search gets nothing on its GPU
        return off

    def _fits(self, spec: KernelSpec, ctx: SearchContext | None) -> bool:
        """The spec's default configuration is admissible (static pruning for the GPU's limits)."""
        resolved, _, _ = static_reason(spec, spec.default_config(), sizes=self._sizes(ctx), tensors=self._facts(ctx),
                                       gpu=self._gpu_of(ctx))
        return resolved is not None

    @staticmethod
    def _device_defaults(variant: str, gpu: GpuFacts) -> dict[str, int]:
        """Defaults that depend on the GPU: a cooperative grid must be resident at once, so the
        cooperative layernorm's grid is at most one block per SM of the device the search runs on."""
        if variant == "coop" and gpu.sm_count > 0:
            return {"NB": min(COOP_NB, gpu.sm_count)}
        return {}

    def _render(self, entry: Entry, ctx: SearchContext | None, m: int, parent: NodeSummary | None = None) -> list[Branch]:
        out: list[Branch] = []
        if self.match is None:
            return out
        offered = self._offer(ctx).get(entry.variant)
        if offered is None:
            return out  # the variant admits no configuration at this shape for this GPU
        start = offered.defaults
        base: dict[str, int] = start
        if parent is not None and variant_of_spec(parent.spec) == entry.variant:
            base = dict(parent.spec.default_config())
        seen: set[str] = set()
        for overrides in entry.branches:
            if len(out) >= m:
                break
            try:
                spec = self.family.build(self.match, entry.variant, {**base, **overrides})
            except (SpecError, TemplateError, KeyError, ValueError) as exc:  # cannot render for this problem
                out.append(Branch(error=f"playbook could not render {entry.variant}: {exc}"))
                continue
            if not self._fits(spec, ctx):
                spec = self.family.build(self.match, entry.variant, {**start, **overrides})
                if not self._fits(spec, ctx):
                    continue
            key = spec.content_hash()
            if key in seen:
                continue
            seen.add(key)
            out.append(Branch(spec=spec, notes=f"playbook {entry.id}: {entry.variant} with {spec.default_config()}"))
        return out

    def text_of(self, e: Entry, ctx: SearchContext | None = None) -> str:
        """The idea's text as proposed (and as ``kerngen playbook`` lists it): a round-0 idea says so where its
        kernel starts as plain TF32 (``--precision tf32``)."""
        offered = self._offer(ctx).get(e.variant) if e.round0 else None
        return idea_text(e.text, offered.spec if offered is not None else None)

    def _idea(self, e: Entry, ctx: SearchContext | None) -> Idea:
        text = self.text_of(e, ctx)
        idea = Idea(text=text, category=e.category, expected_effect=e.effect)
        self._by_text[text] = e
        return idea

    # ----- Protocol ----------------------------------------------------------------------------
    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea]:
        if self.match is None or k <= 0:
            return []
        tried = {t.idea.text for t in ctx.tried} if ctx is not None else set()
        pvar = variant_of_spec(parent.spec) if parent is not None else None
        picks: list[Entry] = []
        for e in self._entries():
            if e.id in self._proposed or e.text in tried or self.text_of(e, ctx) in tried:
                continue
            if parent is None:
                if not e.round0:
                    continue
            else:
                if e.round0 and pvar is not None:
                    continue  # round-0 kernels are starting points, not refinements of a playbook parent
                if e.after and pvar is not None and pvar not in e.after:
                    continue
            if not self._render(e, ctx, 1):
                continue  # its kernel does not admit this problem's shapes
            picks.append(e)
            if len(picks) >= k:
                break
        for e in picks:
            self._proposed.add(e.id)
        return [self._idea(e, ctx) for e in picks]

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea, m: int) -> list[Branch]:
        if self.match is None:
            return [Branch(error=f"playbook has nothing for this problem: {self.reason}")]
        entry = self._by_text.get(idea.text) or next((e for e in self._entries() if idea.text in (e.text, self.text_of(e, ctx))),
                                                     None)
        if entry is None:
            return [Branch(error="playbook does not know this idea (it implements its own catalogue only)")]
        branches = self._render(entry, ctx, max(1, m), parent)
        if branches:
            return branches
        why = self._offer(ctx).why_not(entry.variant)
        return [Branch(error=f"playbook: {why}" if why else
                       f"playbook: no configuration of {entry.variant} admits this problem's shapes")]

    def repair(self, ctx: SearchContext, failure: Failure, attempt: int) -> Branch:
        """No repair: every variant is offered only where it admits the shape (the GEMMs bounds-check their
        edges themselves), so there is no safer variant of the same family to fall back to."""
        return Branch(error="playbook cannot repair")


def variant_of_spec(spec: KernelSpec | None) -> str | None:
    """The playbook variant that built ``spec`` (recorded on it), or None."""
    return spec.origin.variant if spec is not None and spec.origin is not None else None


def seed_specs(problem: Any) -> list[KernelSpec]:
    """The playbook's round-0 kernels for ``problem`` (empty when it has nothing): seeds for an LLM.
    Only offered variants give seeds, each at an admissible default configuration (sm_90 limits)."""
    prop = PlaybookProposer(problem)
    if prop.match is None:
        return []
    specs: list[KernelSpec] = []
    for e in prop._entries():
        if e.round0:
            for b in prop._render(e, None, 1):
                if b.spec is not None:
                    specs.append(b.spec)
    return specs
