"""The playbook's front door for a whole problem: its graph traced (:mod:`.graph`), cut into regions
(:mod:`.partition`), and either one family's match (one region: what the playbook always offered) or the match of
the ``regions`` family, built for this problem: each region served by its own family at its own shapes, the
variants a few choices of one variant per region, each spec their kernels joined in order (:mod:`.regions_spec`).
The same joining builds the variants a family declares as :class:`.family.Partitioned` (the family, below the
registry, cannot): :func:`family_of` gives the family's record with them built.

This is also the API the whole-model work calls (issue 34):

- :func:`trace` (``problem -> Graph``), :func:`partition` (``Graph -> Partition``: the regions, each with its
  inputs, parameters, output and family match, or why no family takes it),
- :func:`family_for` (``Region -> FamilyMatch``, NotCovered with the reason),
- :func:`region_spec` (one region's kernel spec at its shapes, a variant offered there, its default admissible).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping

from kerngen.expr import TensorFacts
from kerngen.harness.spec.spec import KernelSpec

import random

from pydantic import ValidationError

from kerngen.harness.results import GpuFacts
from kerngen.harness.tune.admissible import Admissible
from kerngen.harness.tune.prune import static_reason

from kerngen.agent.playbook.coverage import Offer, VariantOffer, default_limits, offer
from kerngen.agent.playbook.entry import C, Entry
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch, Partitioned
from kerngen.agent.playbook.graph import Graph, trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.partition import Partition, partition
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.region import Region
from kerngen.agent.playbook.regions_spec import join
from kerngen.agent.playbook.registry import FAMILIES

__all__ = ["REGIONS", "RegionsFacts", "explain", "family_for", "family_of", "partition", "region_spec", "regions_match",
           "trace"]

REGIONS = "regions"
MAX_CHOICES = 4  # variants of a regions problem: the first offered variant of each region, then one region changed
_HEAVY = (Lead.rnn, Lead.conv, Lead.contraction, Lead.attention)


class RegionsFacts(Facts):
    partition: Partition
    offers: tuple[Offer, ...]  # each region's variants offered at its shapes (sm_90 limits)
    choices: tuple[tuple[str, ...], ...]  # a variant per region, per variant of the problem ("v0", "v1", ...)
    family: Family  # the problem's own regions family (its variants are the choices)


RegionsFacts.model_rebuild()  # Family's fields name FamilyMatch


def family_for(region: Region) -> FamilyMatch:
    """The family match that serves ``region``, or :class:`NotCovered` with why none does."""
    if region.match is None:
        raise NotCovered(region.why)
    return region.match


def family_of(m: FamilyMatch) -> Family:
    """The family record of a match (a regions problem's own): the registry's, with the variants it declares as
    :class:`.family.Partitioned` built (:func:`_partitioned`)."""
    if m.family == REGIONS:
        return m.facts.family
    fam = _FAMILIES.get(m.family)
    if fam is None:
        raise NotCovered(f"no playbook family {m.family!r}")
    return fam


def _tensors(g: Graph) -> dict[str, TensorFacts]:
    d = {t.name: TensorFacts(t.shape) for t in (*g.inputs, *g.params)}
    d["out"] = TensorFacts(g.shape(g.output) or ())
    return d


def region_offer(region: Region, sizes: dict[str, Any], gpu: GpuFacts | None = None, exhaustive: bool = True) -> Offer:
    m = family_for(region)
    return offer(m, sizes=sizes, tensors=_tensors(region.graph), gpu=gpu, exhaustive=exhaustive, family=family_of(m))


SAMPLE = 200  # joined configurations listed as admissible (each region's own are counted in its offer)


def offer_regions(m: FamilyMatch, sizes: dict[str, Any], gpu: GpuFacts | None = None, exhaustive: bool = True) -> Offer:
    """What a regions problem offers for ``gpu``'s limits: a choice (variant) is offered when every region's
    variant is offered at the region's shapes; its admissible configurations are the regions' admissible ones
    side by side (the regions' tunables and constraints are their own), a seeded sample of them listed (of
    those judged, when a region's offer is not ``exhaustive``: :func:`.coverage.offer`)."""
    f: RegionsFacts = m.facts
    gpu = gpu or default_limits()
    same = gpu == default_limits()  # the regions' offers made with the match are for sm_90's limits
    offers = list(f.offers) if same else [region_offer(r, sizes, gpu, exhaustive) for r in f.partition.regions]
    fam = f.family
    out = Offer(REGIONS, ", ".join(f"{t.name} {'x'.join(map(str, t.shape))}" for t in m.inputs), gpu.name)
    for k, choice in enumerate(f.choices):
        name = f"v{k}"
        vos = [o.get(v) for o, v in zip(offers, choice)]
        missing = next((i for i, vo in enumerate(vos) if vo is None), None)
        if missing is not None:
            why = f"region {missing} ({choice[missing]}): {offers[missing].why_not(choice[missing])}"
            out.variants.append(VariantOffer(name, None, None, why=why, brief=why[:160]))
            continue
        defaults = {f"r{i}_{key}": v for i, vo in enumerate(vos) for key, v in vo.defaults.items()}
        try:
            spec = fam.build(m, name, defaults)
        except ValueError as exc:  # past a spec's limits (defines, steps, source): a model plan runs the regions
            first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else " ".join(str(exc).split())
            why = (f"its {len(vos)} regions' kernels do not fit one spec ({first[:160]}); "
                   "`kerngen generate` runs them as a model plan, one kernel per region")
            out.variants.append(VariantOffer(name, None, None, why=why, brief=why[:160]))
            continue
        tensors = {t.name: TensorFacts(t.shape) for t in (*m.inputs, *m.params, *m.outputs)}
        plan, _, reason = static_reason(spec, spec.default_config(), sizes=sizes, tensors=tensors, gpu=gpu)
        if plan is None:
            out.variants.append(VariantOffer(name, spec, None, why=reason, brief=reason[:160]))
            continue
        rng = random.Random(k)
        configs = [spec.default_config()]
        for _ in range(SAMPLE - 1):
            cfg = {f"r{i}_{key}": v for i, vo in enumerate(vos) for key, v in rng.choice(vo.counted.configs).items()}
            cfg = {key: v for key, v in cfg.items() if key in spec.tunables}
            if cfg not in configs:
                configs.append(cfg)
        counted = Admissible(total=spec.space_size(), enumerated=len(configs), configs=configs,
                             stopped=any(vo.counted.stopped for vo in vos))
        out.variants.append(VariantOffer(name, spec, counted, defaults=spec.default_config()))
    return out


def region_spec(region: Region, variant: str | None = None, defaults: dict[str, int] | None = None,
                sizes: dict[str, Any] | None = None) -> KernelSpec:
    """The kernel spec of ``region`` at its shapes: ``variant`` (default: the first offered) with its offered
    default configuration, updated by ``defaults``; tensors named as the region's graph names them (``out``:
    its output)."""
    m = family_for(region)
    off = region_offer(region, dict(sizes or {}))
    vo = off.get(variant) if variant else (off.offered[0] if off.offered else None)
    if vo is None:
        raise NotCovered(off.why_not(variant) if variant else off.reason)
    return family_of(m).build(m, vo.variant, {**vo.defaults, **(defaults or {})})


# ---------------------------------------------------------------------------------------------
def _build(choice: tuple[str, ...], m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f: RegionsFacts = m.facts
    part = f.partition
    specs, labels = [], []
    for i, (region, variant) in enumerate(zip(part.regions, choice)):
        mine = {k[len(f"r{i}_"):]: v for k, v in defaults.items() if k.startswith(f"r{i}_")}
        vo = f.offers[i].get(variant)
        base = vo.defaults if vo is not None else {}
        specs.append(family_of(region.match).build(region.match, variant, {**base, **mine}))
        labels.append(f"{region.match.family} {variant}")
    problem = {t.name: t.shape for t in (*part.graph.inputs, *part.graph.params)}
    problem["out"] = part.graph.shape(part.graph.output) or ()
    name = "playbook-regions-" + "-".join(c.replace("_", "") for c in choice)
    return join(list(part.regions), specs, part.storage, problem, labels, name[:120])


def _choices(regions: tuple[Region, ...], offers: list[Offer]) -> list[tuple[str, ...]]:
    first = tuple(o.offered[0].variant for o in offers)
    out = [first]
    order = sorted(range(len(regions)), key=lambda i: (regions[i].lead not in _HEAVY, i))
    for i in order:
        for vo in offers[i].offered[1:]:
            if len(out) < MAX_CHOICES:
                out.append(first[:i] + (vo.variant,) + first[i + 1:])
    return out


def _ideas(regions: tuple[Region, ...], choices: list[tuple[str, ...]]) -> tuple[Entry, ...]:
    ideas = []
    for k, choice in enumerate(choices):
        steps = ", then ".join(f"r{i} {r.match.family} {v}" for i, (r, v) in enumerate(zip(regions, choice)))
        ideas.append(Entry(f"regions-v{k}", f"Run the regions' kernels in order, each region's output in a scratch "
                           f"buffer the next reads: {steps}.", C, "each region as fast as its family's kernel alone; "
                           "one read and one write of every intermediate", f"v{k}", ({},), round0=True))
    for i, r in enumerate(regions):
        fam = family_of(r.match)
        for e in fam.ideas:
            if e.round0 or (e.variant != choices[0][i]):
                continue
            branches = tuple({f"r{i}_{key}": v for key, v in b.items()} for b in e.branches)
            ideas.append(Entry(f"r{i}-{e.id}", f"Region {i} ({r.match.family}): {e.text}", e.category, e.effect,
                               "v0", branches, after=frozenset({"v0"})))
    return tuple(ideas)


Pick = Callable[[tuple[Region, ...], list[Offer]], list[tuple[str, ...]]]


def regions_match(part: Partition, sizes: dict[str, Any], exhaustive: bool = True, pick: Pick | None = None) -> FamilyMatch:
    """The ``regions`` family's match of a partition whose every region is covered (``exhaustive``: of
    :func:`.coverage.offer`); ``pick``: its choices of a variant per region from the regions' offers (default: the
    first offered of each, then one region changed)."""
    offers = [region_offer(r, sizes, exhaustive=exhaustive) for r in part.regions]
    bare = [i for i, o in enumerate(offers) if not o.offered]
    if bare:
        raise NotCovered(f"region {bare[0]} ({part.regions[bare[0]].match.family}): {offers[bare[0]].reason}")
    choices = (pick or _choices)(part.regions, offers)
    fam = Family(name=REGIONS, leads=frozenset(Lead), constraints=(), recognise=lambda g: None,
                 variants={f"v{k}": partial(_build, c) for k, c in enumerate(choices)},
                 ideas=_ideas(part.regions, choices))
    facts = RegionsFacts(partition=part, offers=tuple(offers), choices=tuple(choices), family=fam)
    m = FamilyMatch.of(part.graph, facts, f"{len(part.regions)} regions: {_summary(part)}")
    m.family = REGIONS
    return m


def _summary(part: Partition) -> str:
    return " | ".join(f"{r.match.family}[{', '.join(r.nodes)}]" for r in part.regions)


# ----- the variants a family declares as partitioned (family.Partitioned) ----------------------------------------
_JOINED: dict[tuple, tuple[Graph, FamilyMatch]] = {}  # (graph id, family, variant, precision) -> (graph, its match)


def _preferred(prefer: Mapping[Lead, tuple[str, ...]], regions: tuple[Region, ...],
               offers: list[Offer]) -> list[tuple[str, ...]]:
    """One choice: a region whose lead ``prefer`` names on the first of those variants offered, any other on its
    first offered."""
    choice = []
    for r, o in zip(regions, offers):
        mine = prefer.get(r.lead, ())
        v = next((p for p in mine if o.get(p) is not None), None) if mine else o.offered[0].variant
        if v is None:
            raise NotCovered(f"region {r.index} ({r.match.message}): {o.why_not(mine[0]) or o.reason}")
        choice.append(v)
    return [tuple(choice)]


def _joined(m: FamilyMatch, variant: str, p: Partitioned) -> FamilyMatch:
    """The regions match of ``m``'s graph partitioned without ``m``'s family (cached per graph)."""
    key = (id(m.graph), m.family, variant, m.precision)
    hit = _JOINED.get(key)
    if hit is not None and hit[0] is m.graph:
        return hit[1]
    part = partition(m.graph, frozenset({m.family}))
    if not part.covered:
        raise NotCovered(f"not cut into regions without the {m.family} family: {part.why}")
    if tuple(r.lead for r in part.regions) != p.leads:
        raise NotCovered(f"not cut into {p.what}: {_summary(part)}")
    for r in part.regions:
        r.match.precision = m.precision
    rm = regions_match(part, {}, exhaustive=False, pick=partial(_preferred, p.prefer))
    if len(_JOINED) > 16:
        _JOINED.clear()
    _JOINED[key] = (m.graph, rm)
    return rm


def _partitioned(variant: str, p: Partitioned, m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The builder of a variant ``m``'s family declares as ``p``: the joined spec of its regions (v0)."""
    why = p.why_not(m) or ("" if m.graph is not None else f"{variant} needs the problem's graph")
    if why:
        raise ValueError(why)
    try:
        rm = _joined(m, variant, p)
    except NotCovered as exc:
        raise ValueError(str(exc)) from None
    return rm.facts.family.variants["v0"](rm, defaults)


def _built(fam: Family) -> Family:
    """``fam`` with its partitioned variants built, offered after its own."""
    if not fam.partitioned:
        return fam
    built = {v: partial(_partitioned, v, p) for v, p in fam.partitioned.items()}
    return fam.model_copy(update={"variants": {**fam.variants, **built}})


_FAMILIES = {f.name: _built(f) for f in FAMILIES}


def explain(problem: Any, exhaustive: bool = True) -> FamilyMatch:
    """The problem's match: one family's where one region covers it, else the regions family's (its regions'
    offers ``exhaustive`` or not: :func:`.coverage.offer`); or :class:`NotCovered` naming what no family takes."""
    part = partition(trace(problem))
    if not part.covered:
        raise NotCovered(part.why)
    precision = getattr(getattr(problem, "ref", None), "precision", None)  # --precision: what the builders may offer
    for r in part.regions:
        r.match.precision = precision
    if len(part.regions) == 1:
        return part.regions[0].match
    info = getattr(problem, "info", None)
    m = regions_match(part, dict(getattr(info, "sizes", None) or {}), exhaustive)
    m.precision = precision
    return m
