"""A playbook family as one typed record: the region leads it accepts, the constraints its predicate checks
(their number is how specific it is), a declared priority, its recogniser (a predicate over a region's graph
that returns the match with the family's typed :class:`Facts`), its template variants, its ideas and the names
its specs carry, and the variants it declares for the layer above to build (:class:`Partitioned`). :mod:`.registry`
chooses among them by fit (:func:`.registry.choose`), never by list order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict

from kerngen.expr import TensorFacts
from kerngen.harness.spec.spec import KernelSpec, Origin

from kerngen.agent.playbook.entry import Entry
from kerngen.agent.playbook.graph import Graph, Tensor
from kerngen.agent.playbook.leads import Lead

__all__ = ["Builder", "Facts", "Family", "FamilyMatch", "Partitioned"]


class Facts(BaseModel):
    """What a family's builders read about one region (its own fields per family)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")


@dataclass
class FamilyMatch:
    """A recognised region: the family, its tensors as the builders bind them (``out`` is the output), and
    the family's typed facts."""

    family: str
    inputs: list[Tensor]
    params: list[Tensor]
    outputs: list[Tensor]
    facts: Any = None  # the family's Facts
    message: str = ""
    graph: Graph | None = field(default=None, repr=False)
    # what the kernels are checked against (``--precision``): None true fp32; "tf32" PyTorch's TF32 with a measured
    # tolerance, where the tensor-core variants offer plain TF32 (TERMS 1, their default there)
    precision: str | None = None

    @classmethod
    def of(cls, g: Graph, facts: Facts, message: str = "") -> "FamilyMatch":
        return cls("", list(g.inputs), list(g.params), [g.out], facts, message, g)

    @property
    def tf32(self) -> bool:
        """Checked at ``--precision tf32``: plain TF32 is admissible."""
        return self.precision == "tf32"

    @property
    def x(self) -> Tensor:
        return self.inputs[0]

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Bindable name -> shape (inputs, params, outputs as ``out``/``out0``...)."""
        d = {t.name: t.shape for t in self.inputs + self.params}
        for i, t in enumerate(self.outputs):
            d["out" if len(self.outputs) == 1 else f"out{i}"] = t.shape
        return d

    def tensor_facts(self) -> dict[str, TensorFacts]:
        """The same, as what a spec's expressions read (for resolving its plan at these shapes)."""
        return {k: TensorFacts(tuple(v)) for k, v in self.tensors().items()}


Builder = Callable[[FamilyMatch, dict[str, int]], KernelSpec]


class Partitioned(BaseModel):
    """A variant a family declares but cannot build (a family sits below the registry, the partition above it):
    the match's graph partitioned without the family, cut into regions of ``leads`` (in order; ``what`` says it in
    words), their kernels joined into one spec. A region whose lead ``prefer`` names runs the first of those
    variants offered at its shapes, any other region its first offered. ``why_not(match)``: why the match does not
    admit the variant ("" when it does). Built above the registry: :func:`.regions.family_of` gives the family's
    record with them."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    what: str
    leads: tuple[Lead, ...]
    prefer: Mapping[Lead, tuple[str, ...]]
    why_not: Callable[[FamilyMatch], str]


class Family(BaseModel):
    """``recognise(graph)`` returns the match for the regions this family serves, raises
    :class:`~.not_covered.NotCovered` with a one-line reason for a region it claims but cannot serve (a shape
    or an option it has no kernel for), and returns None for every other region. Among the families that
    accept a region's lead, the most specific asks first (``len(constraints)``, then ``priority``); the first
    that claims the region decides. ``variants`` are offered in order; ``spec_names[variant]`` names the
    variant's specs (a prefix ending in ``-`` where the spec's name adds what it computes). ``partitioned``: more
    variants, offered after ``variants`` where the layer above builds them (:class:`Partitioned`)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    leads: frozenset[Lead]
    constraints: tuple[str, ...]
    recognise: Callable[[Graph], FamilyMatch | None]
    variants: Mapping[str, Builder]
    ideas: tuple[Entry, ...]
    priority: int = 0
    spec_names: Mapping[str, str] = {}
    partitioned: Mapping[str, Partitioned] = {}

    @property
    def specificity(self) -> tuple[int, int]:
        return len(self.constraints), self.priority

    def spec_name(self, variant: str) -> str:
        return self.spec_names.get(variant, f"playbook-{self.name.replace('_', '-')}-{variant.replace('_', '-')}")

    def build(self, m: FamilyMatch, variant: str, defaults: Mapping[str, int] | None = None) -> KernelSpec:
        """The variant's spec for ``m``; the spec records the family and the variant it came from."""
        spec = self.variants[variant](m, dict(defaults or {}))
        update: dict[str, Any] = {"origin": Origin(family=self.name, variant=variant)}
        if m.graph is not None and m.graph.scalars:  # the trace took a Python number passed to forward as a constant
            update["constraints"] = [*spec.constraints, *(f"{k} == {v!r}" for k, v in sorted(m.graph.scalars.items()))]
        return spec.model_copy(update=update)
