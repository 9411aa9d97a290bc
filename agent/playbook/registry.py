"""The playbook's families, and the choice among them.

:func:`choose` gives a region's graph to the families that accept its lead (:func:`.region.lead_of`), the most
specific first (the number of constraints its predicate checks, then its declared priority; never the order
of :data:`FAMILIES`): the first that claims the graph decides, with its match or with its reason
(:class:`NotCovered`). :mod:`.regions` does it for a whole problem, cut into regions.
"""

from __future__ import annotations

from kerngen.agent.playbook.attention.family import ATTENTION
from kerngen.agent.playbook.conv.conv16 import CONV16
from kerngen.agent.playbook.conv.conv2d import CONV2D, CONV_RELU_MAXPOOL
from kerngen.agent.playbook.conv.epi import CONV_EPI
from kerngen.agent.playbook.conv.nd import CONV_ND
from kerngen.agent.playbook.conv.tail import CONV_TAIL
from kerngen.agent.playbook.elementwise.family import ELEMENTWISE
from kerngen.agent.playbook.gemm.gemm import GEMM
from kerngen.agent.playbook.gemm.gemm16 import GEMM16
from kerngen.agent.playbook.gemm.rows import GEMM_ROWS
from kerngen.agent.playbook.loss.family import LOSS
from kerngen.agent.playbook.gemm.matmul import MATMUL
from kerngen.agent.playbook.norm.family import NORM
from kerngen.agent.playbook.pool.family import POOL
from kerngen.agent.playbook.reduce.family import REDUCE
from kerngen.agent.playbook.rows.family import LAYERNORM, RMSNORM, SOFTMAX
from kerngen.agent.playbook.rnn.family import LSTM
from kerngen.agent.playbook.scan.family import SCAN
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import why
from kerngen.agent.playbook.region import lead_of

__all__ = ["FAMILIES", "by_name", "candidates", "choose"]

FAMILIES: tuple[Family, ...] = (ELEMENTWISE, SOFTMAX, LAYERNORM, RMSNORM, CONV2D, CONV_RELU_MAXPOOL, MATMUL,
                                ATTENTION, GEMM_ROWS, GEMM16, GEMM, CONV_TAIL, CONV16, CONV_EPI, CONV_ND, REDUCE, NORM, LOSS, POOL,
                                SCAN, LSTM)
_BY_NAME = {f.name: f for f in FAMILIES}


def by_name(name: str) -> Family | None:
    return _BY_NAME.get(name)


def candidates(g: Graph, skip: frozenset[str] = frozenset()) -> list[Family]:
    """The families that accept the graph's lead, the most specific first (none named in ``skip``)."""
    lead = lead_of(g)
    return sorted((f for f in FAMILIES if lead in f.leads and f.name not in skip), key=lambda f: f.specificity,
                  reverse=True)


def choose(g: Graph, skip: frozenset[str] = frozenset()) -> FamilyMatch:
    """The match of the first family (most specific first, none named in ``skip``) that claims ``g``;
    :class:`NotCovered` with its reason when it cannot serve it, or naming the first op no family takes."""
    for fam in candidates(g, skip):
        m = fam.recognise(g)
        if m is not None:
            m.family = fam.name
            return m
    for d in sorted(g.dtypes):
        if d not in ("float32", "bfloat16", "float16"):
            raise NotCovered(f"dtype {d} is not covered by the playbook")
    live = g.live()
    first = next((n for n in live if n.op not in ("getitem",)), None)
    if first is None:
        raise NotCovered("the forward computes nothing the playbook can write a kernel for")
    raise NotCovered(f"{why(first.op, 'the playbook')} (at {first.name}): NotCovered")
