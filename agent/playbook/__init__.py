"""The offline playbook: one graph front end, fused regions and typed families of CUDA-C templates.

``PlaybookProposer(problem)`` answers the :class:`kerngen.agent.proposer.Proposer` Protocol with no LLM;
``explain(problem)`` says which family a problem's graph belongs to (``why_not`` says why none);
``seed_specs(problem)`` gives the round-0 kernels (seeds for an LLM's first round).
"""

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import PlaybookProposer, seed_specs
from kerngen.agent.playbook.registry import FAMILIES, by_name, explain, recognise_family, why_not

__all__ = ["FAMILIES", "FamilyMatch", "NotCovered", "PlaybookProposer", "by_name", "explain", "recognise_family",
           "seed_specs", "why_not"]
