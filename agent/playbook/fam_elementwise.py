"""Playbook family ``elementwise``: a graph of pointwise ops over one input tensor (a single op such as
``relu(x)``, or a fused chain such as ``gelu(x) * sigmoid(x)``), output of the input's shape and dtype; one
16-byte-vector pass (:func:`.builders_rows.elementwise_vec`). The chain is the one translation of
:mod:`.pointwise`; a single unary op over the input is written as its formula directly."""

from __future__ import annotations

from kerngen.agent.playbook.builders_rows import elementwise_vec
from kerngen.agent.playbook.chain_ir import INPUT, Chain
from kerngen.agent.playbook.entry import A, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.fam_rows import one_input
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import UNARY_C
from kerngen.agent.playbook.pointwise import translate
from kerngen.agent.playbook.region import Lead

__all__ = ["ELEMENTWISE", "ElementwiseFacts"]

# unary ops whose kernel returns the formula of v itself (no statements)
_SINGLE = ("relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "neg", "abs", "exp")


class ElementwiseFacts(Facts):
    op: str  # a C-identifier fragment naming the ops ("gelu", "gelu_sigmoid_mul")
    expr: str  # the C value kg_op returns
    body: tuple[str, ...] = ()  # a fused chain's statements before it
    formula: str = ""
    chain: Chain | None = None


def _recognise(g: Graph) -> FamilyMatch | None:
    x = one_input(g)
    chain = translate(g)
    one = chain.nodes[0] if len(chain.nodes) == 1 else None
    if one is not None and one.op in _SINGLE and one.args == (INPUT,) and chain.result == one.var:
        facts = ElementwiseFacts(op=one.op, expr=UNARY_C[one.op].format(a=INPUT))
    else:
        f = chain.facts()
        facts = ElementwiseFacts(op=f["op"], expr=f["expr"], body=tuple(f["body"]), formula=f["formula"], chain=chain)
    out = g.out
    if out.shape != x.shape or out.dtype != x.dtype:
        raise NotCovered("elementwise output differs from its input in shape or dtype")
    return FamilyMatch.of(g, facts)


IDEAS = (
    Entry("ew-vec", "One pass over the tensor with 16-byte vector loads and stores (float4, or 8 x 16-bit), "
          "several vectors per thread loaded before the first use, fp32 math in registers.", M,
          "reads and writes each byte once in wide coalesced transactions: ~90-97% of the copy bandwidth",
          "vec", ({}, {"UNROLL": 2, "BLOCK": 512}, {"UNROLL": 8}), round0=True),
    Entry("ew-ilp", "Raise the bytes in flight per thread: unroll to 8 independent 16-byte loads so that DRAM "
          "latency is covered with fewer resident warps.", A, "a few % when the parent is latency-bound",
          "vec", ({"UNROLL": 8, "BLOCK": 128}, {"UNROLL": 8, "BLOCK": 256}), after=frozenset({"vec"})),
    Entry("ew-persistent", "Grid-stride persistent loop over a grid of a few waves (GRID_CAP blocks) instead of "
          "one thread per vector group: fewer block launches and tail effects.", PAR,
          "0-5%: fewer blocks to schedule, steadier occupancy", "vec",
          ({"GRID_CAP": 1056}, {"GRID_CAP": 2112, "UNROLL": 2}), after=frozenset({"vec"})),
    Entry("ew-stream", "Streaming cache hints (ld.global.cs / st.global.cs, evict-first) so that the output "
          "does not displace useful lines in L2.", M, "0-5%, sometimes negative on H100/H200",
          "vec", ({"CACHE_HINT": 1}, {"CACHE_HINT": 1, "UNROLL": 2}), after=frozenset({"vec"})),
)

ELEMENTWISE = Family(name="elementwise", leads=frozenset({Lead.map}), recognise=_recognise,
                     constraints=("pointwise ops only", "one input"), variants={"vec": elementwise_vec}, ideas=IDEAS,
                     spec_names={"vec": "playbook-elementwise-"})
