"""One idea of the playbook's catalogue: natural-language text, its category, the expected
effect, the template variant that implements it and the configurations (branches) to render.
``round0`` ideas make the first kernel from nothing; the others apply to a parent built from one of
the variants in ``after`` (empty: any)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kerngen.agent.proposer import Category

__all__ = ["A", "C", "CF", "Entry", "M", "P", "PAR"]


@dataclass(frozen=True)
class Entry:
    id: str
    text: str
    category: Category
    effect: str
    variant: str
    branches: tuple[dict, ...] = ({},)
    round0: bool = False
    after: frozenset[str] = field(default_factory=frozenset)  # parent variants it improves (empty: any)


M, A, P, C, PAR, CF = (Category.memory_access, Category.async_latency, Category.precision, Category.compute,
                       Category.parallelism, Category.control_flow)
