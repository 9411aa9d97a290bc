"""Honest coverage: which variants of a recognised family the playbook offers for a problem.

A variant is offered only when, built at the problem's shape, it admits at least one configuration
for the GPU's limits (and a ``wgmma`` variant only for Hopper, sm_90): the same resolution as ``kerngen check``
(:func:`kerngen.harness.tune.admissible.admissible`, static pruning only: constraints, plans that
resolve, threads and dynamic shared memory per block; compiling every configuration of every
variant would cost seconds to minutes per problem, and the compiled resources are judged later on
anyway by the tuner and the evaluator). Variants that admit nothing are dropped with the reason;
a family none of whose variants admits anything is not offered at all (:attr:`Offer.reason`).

An offered variant's default configuration is admissible: when the builder's own default is
pruned at this shape, the spec's ``defaults`` become the admissible configuration closest to it
(fewest tunables changed). Only ``defaults`` change: the source, the tunables and the defines are
the builder's, so every configuration compiles to the same kernel as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from jinja2 import TemplateError

from kerngen.errors import KerngenError
from kerngen.expr import TensorFacts
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import Admissible, admissible, closest, limits_for
from kerngen.text import one_line

from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.registry import by_name

__all__ = ["DEFAULT_ARCH", "Offer", "VariantOffer", "closest", "default_limits", "offer"]

DEFAULT_ARCH = "sm_90"  # whose limits count when no GPU is known
WGMMA_ARCHS = ("sm_90", "sm_90a")  # wgmma exists on Hopper alone: variants named *wgmma* are offered there only


def default_limits() -> GpuFacts:
    return limits_for(DEFAULT_ARCH)


@dataclass
class VariantOffer:
    """One variant at the problem's shape: its spec (defaults admissible), its count, or why not."""

    variant: str
    spec: KernelSpec | None
    counted: Admissible | None
    why: str = ""  # why the variant is dropped; empty when it is offered
    brief: str = ""  # the same, shorter (for the family's one-line reason)
    moved_from: dict[str, int] | None = None  # the builder's default, when it was pruned and replaced
    defaults: dict[str, int] = field(default_factory=dict)  # what to build it with: ``build(match, variant, defaults)`` is ``spec``

    @property
    def offered(self) -> bool:
        return not self.why

    @property
    def count(self) -> int:
        return self.counted.count if self.counted is not None else 0

    @property
    def total(self) -> int:
        return self.counted.total if self.counted is not None else 0

    def summary(self) -> dict:
        """JSON-ready: counts, the default configuration used, why dropped."""
        c = self.counted
        out: dict = {"variant": self.variant, "offered": self.offered, "admissible": self.count, "total": self.total,
                     "sampled": bool(c and c.sampled)}
        if self.offered and self.spec is not None:
            out["default"] = self.spec.default_config()
            if self.moved_from is not None:
                out["builder_default"] = self.moved_from
        if c is not None and c.stopped:  # not counted: at least this many
            out["admissible_at_least"] = out.pop("admissible")
        if c is not None and c.pruned:
            out["pruned"] = c.report()["pruned"]
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class Offer:
    """What the playbook offers for one recognised problem, for one GPU's limits."""

    family: str
    where: str  # the problem's inputs and their shapes, e.g. "A 2048x1048576, B 1048576x1"
    limits: str  # whose limits counted, e.g. "sm_90 limits" or the GPU's name
    variants: list[VariantOffer] = field(default_factory=list)

    @property
    def offered(self) -> list[VariantOffer]:
        return [v for v in self.variants if v.offered]

    @property
    def dropped(self) -> list[VariantOffer]:
        return [v for v in self.variants if not v.offered]

    def get(self, variant: str) -> VariantOffer | None:
        """The variant when it is offered, else None."""
        return next((v for v in self.offered if v.variant == variant), None)

    def why_not(self, variant: str) -> str:
        """One line: why ``variant`` is not offered ("" when it is)."""
        v = next((v for v in self.variants if v.variant == variant), None)
        if v is None or v.offered:
            return ""
        return f"variant {variant} of the playbook's {self.family} family is not offered at {self.where} ({self.limits}): {v.why}"

    @property
    def reason(self) -> str:
        """Why the family is not offered ("" when some variant is)."""
        if self.offered:
            return ""
        tried = "; ".join(f"{v.variant}: {v.brief or v.why}" for v in self.variants)
        return f"no {self.family} variant admits a configuration at {self.where} ({self.limits}): {tried}"


def _where(match: FamilyMatch, tensors: Mapping[str, TensorFacts]) -> str:
    parts = []
    for t in match.inputs:
        shape = tensors[t.name].shape if t.name in tensors else t.shape
        parts.append(f"{t.name} {'x'.join(map(str, shape)) or 'scalar'}")
    return ", ".join(parts)


def _pins_text(pins: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in pins.items())


def offer(
    match: FamilyMatch,
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    gpu: GpuFacts | None = None,
    pinned: Mapping[str, Mapping[str, int]] | None = None,
    exhaustive: bool = True,
    family: Family | None = None,
) -> Offer:
    """Build every variant of ``match``'s family at the problem's shape and count its admissible
    configurations for ``gpu``'s limits (default: sm_90's). ``pinned``: per variant, tunables the
    device fixes (the cooperative grid's NB, one block per SM): those are built in as defaults and
    only admissible configurations with those values count as usable. Not ``exhaustive``: each
    variant's judging stops at its first usable configuration, nearest its default
    (:func:`kerngen.harness.tune.admissible.admissible`'s ``usable``): the same variants offered,
    dropped with the same reasons and built with the same defaults, but an offered variant's count
    is a lower bound (``counted.stopped``); what ``kerngen playbook DIR`` lists. ``family``: the record whose
    variants are offered (default: the registry's, without the variants it declares for the layer above,
    :class:`.family.Partitioned`; :func:`.regions.family_of` gives the record with them, as the proposer offers)."""
    gpu = gpu or default_limits()
    if family is None:
        family = match.facts.family if match.family == "regions" else by_name(match.family)
    out = Offer(match.family, _where(match, tensors), gpu.name)
    for name in family.variants:
        pins = dict((pinned or {}).get(name, {}))
        try:
            spec = family.build(match, name, pins)
        except (KerngenError, TemplateError, KeyError, ValueError) as exc:
            why = f"cannot be rendered for this problem: {exc}"
            out.variants.append(VariantOffer(name, None, None, why=why, brief=one_line(why, 160)))
            continue
        if "wgmma" in name and gpu.arch not in WGMMA_ARCHS:
            why = f"a Hopper kernel (sm_90a: wgmma, TMA), not offered for {gpu.arch}"
            out.variants.append(VariantOffer(name, spec, None, why=why, brief=why))
            continue
        def fits(c: Mapping[str, int], pins: dict[str, int] = pins) -> bool:
            return all(c.get(k) == v for k, v in pins.items())

        counted = admissible(spec, sizes=sizes, tensors=tensors, gpu=gpu, usable=None if exhaustive else fits)
        usable = [c for c in counted.configs if fits(c)]
        if not counted.configs:
            out.variants.append(VariantOffer(name, spec, counted, why=counted.why(), brief=counted.brief()))
            continue
        if not usable:
            why = f"none with {_pins_text(pins)} (fixed by the GPU)"
            out.variants.append(VariantOffer(name, spec, counted, why=f"{counted.why()}; {why}",
                                             brief=f"{counted.count} of {counted.total} configurations, {why}"))
            continue
        default = spec.default_config()
        moved = None
        if default not in usable:
            moved, pins = default, closest(default, usable, spec.tunables)
            spec = family.build(match, name, pins)
        out.variants.append(VariantOffer(name, spec, counted, moved_from=moved, defaults=pins))
    return out
