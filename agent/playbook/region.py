"""The fused-region IR: a region is a piece of a traced graph (:mod:`.graph`) that one kernel spec computes: a
lead operation (:class:`Lead`: a map, a reduction, a scan, a matrix product, a convolution, a pool, attention,
a normalisation's statistics, a softmax, a loss) with pointwise work before and after it over broadcast
operands, and for some families a row stage. A region is itself a :class:`~.graph.Graph`: its inputs are the
problem's inputs or earlier regions' outputs (named by the node that computes them), its parameters are named
as in the module's state, its one output is what the next regions (or the problem) read.

:func:`lead_of` classifies a graph; :func:`.partition.partition` cuts a problem's graph into regions.
"""

from __future__ import annotations

from dataclasses import dataclass

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Graph, Tensor
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.ops import Kind, kind_of

__all__ = ["Region", "lead_of"]


# the op kind that leads a region holding several, heaviest first
_ORDER = ((Kind.rnn, Lead.rnn), (Kind.attention, Lead.attention), (Kind.conv, Lead.conv), (Kind.contraction, Lead.contraction),
          (Kind.loss, Lead.loss), (Kind.norm, Lead.norm), (Kind.pool, Lead.pool), (Kind.scan, Lead.scan),
          (Kind.softmax, Lead.softmax), (Kind.reduction, Lead.reduce))


def lead_of(g: Graph) -> Lead:
    kinds = {kind_of(n.op, n.overload) for n in g.live()}
    return next((lead for kind, lead in _ORDER if kind in kinds), Lead.map)


@dataclass(frozen=True)
class Region:
    """One kernel's worth of a problem's graph: ``graph`` (its inputs, parameters, nodes and output), its lead,
    the names of the problem graph's nodes it computes (in order), and the family's match that serves it (None:
    no family does, ``why`` says which op where)."""

    index: int
    graph: Graph
    lead: Lead
    nodes: tuple[str, ...]
    match: FamilyMatch | None = None
    why: str = ""

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.graph.inputs

    @property
    def params(self) -> tuple[Tensor, ...]:
        return self.graph.params

    @property
    def output(self) -> Tensor:
        """The tensor it writes, named by the node that computes it."""
        g = self.graph
        return Tensor(str(g.output), g.shape(g.output) or (), g.dtype(g.output) or "float32")

    @property
    def ops(self) -> list[str]:
        return self.graph.ops()
