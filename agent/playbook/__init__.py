"""The offline playbook: one graph front end, fused regions and typed families of CUDA-C templates.

``PlaybookProposer(problem)`` answers the :class:`kerngen.agent.proposer.Proposer` Protocol with no LLM;
``explain(problem)`` says which family a problem's graph belongs to (``why_not`` says why none);
``seed_specs(problem)`` gives the round-0 kernels (seeds for an LLM's first round).
For whole models (issue 34): ``trace``/``trace_module`` -> ``Graph``, ``partition(graph)`` -> regions,
``family_for(region)``, ``region_spec(region)`` (docs/playbook.md lists them).
"""

from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node, Tensor, trace, trace_module
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.partition import Partition, partition
from kerngen.agent.playbook.proposer import PlaybookProposer, seed_specs
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.region import Region
from kerngen.agent.playbook.regions import explain, family_for, family_of, region_spec
from kerngen.agent.playbook.registry import FAMILIES, by_name

__all__ = ["FAMILIES", "Family", "FamilyMatch", "Graph", "Lead", "Node", "NotCovered", "Partition",
           "PlaybookProposer", "Region", "Tensor", "by_name", "explain", "family_for", "family_of", "partition",
           "recognise_family", "region_spec", "seed_specs", "trace", "trace_module", "why_not"]


def recognise_family(problem: object) -> FamilyMatch | None:
    """The playbook family of ``problem``, or None (``explain`` says why)."""
    try:
        return explain(problem)
    except NotCovered:
        return None


def why_not(problem: object) -> str:
    """One line: the family found, or why the playbook has nothing for the problem."""
    try:
        m = explain(problem)
    except NotCovered as exc:
        return str(exc)
    return f"playbook family {m.family}"
