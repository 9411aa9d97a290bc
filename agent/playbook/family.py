"""A playbook family as one record: how it recognises its problems, its template variants, its
ideas and the names its specs carry. The families of :mod:`.registry` are built this way; the
first seven (elementwise ... matmul) predate it and live in :mod:`.families`, :mod:`.builders` and
:mod:`.catalog`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.entry import Entry
from kerngen.agent.playbook.match import FamilyMatch, Read

__all__ = ["Builder", "Family"]

Builder = Callable[[FamilyMatch, dict[str, int]], KernelSpec]


@dataclass(frozen=True)
class Family:
    """``recognise(read)`` returns a match (its ``family`` is set to ``name`` by the caller) for the
    problems this family owns, raises :class:`~.not_covered.NotCovered` with a one-line reason for a
    problem it owns but cannot serve (a shape or option it has no kernel for), and returns None for
    every other problem (so that the next family is asked). ``variants`` are offered in order;
    ``spec_names[variant]`` is the name of the variant's specs, or a prefix ending in ``-`` (the
    proposer reads a parent's variant back from its spec's name)."""

    name: str
    recognise: Callable[[Read], FamilyMatch | None]
    variants: Mapping[str, Builder]
    ideas: tuple[Entry, ...]
    spec_names: Mapping[str, str] = field(default_factory=dict)

    def spec_name(self, variant: str) -> str:
        return self.spec_names.get(variant, f"playbook-{self.name.replace('_', '-')}-{variant.replace('_', '-')}")
