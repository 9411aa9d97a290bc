"""The offline playbook: catalogues of ideas and CUDA-C templates per op family.

``PlaybookProposer(problem)`` answers the :class:`kerngen.agent.proposer.Proposer` Protocol with
no LLM; ``recognise_family(problem)`` says which family a problem belongs to (``why_not`` says
why none); ``seed_specs(problem)`` gives the round-0 kernels (seeds for an LLM's first round).
"""

from kerngen.agent.playbook.families import FAMILIES, FamilyMatch, explain, recognise_family, why_not
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import PlaybookProposer, seed_specs

__all__ = ["FAMILIES", "FamilyMatch", "NotCovered", "PlaybookProposer", "explain", "recognise_family", "seed_specs", "why_not"]
