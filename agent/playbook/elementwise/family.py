"""Playbook family ``elementwise``: a graph of pointwise ops. Over one input tensor of the output's shape (a
single op such as ``relu(x)``, or a fused chain such as ``gelu(x) * sigmoid(x)``): one 16-byte-vector pass
(variant ``vec``, :func:`.elementwise.build.elementwise_vec`; a single unary op over the input is written as its
formula directly). Over several fp32 tensors broadcast to the output (a region's inputs, parameters such as a
per-channel bias, a reduced tensor such as ``x - mean``): a thread an element (variant ``map``). The chain is
the one translation of :mod:`.pointwise`."""

from __future__ import annotations

from kerngen.agent.playbook.elementwise.build import elementwise_map, elementwise_vec
from kerngen.agent.playbook.chain_ir import INPUT, Chain, Operand
from kerngen.agent.playbook.entry import A, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.rows.family import one_input
from kerngen.agent.playbook.graph import Graph, Node, Ref, Tensor
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import UNARY_C
from kerngen.agent.playbook.pointwise import Translator, live_chain, translate
from kerngen.agent.playbook.leads import Lead

__all__ = ["ELEMENTWISE", "ElementwiseFacts"]

_VIEWS = ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "expand")
# unary ops whose kernel returns the formula of v itself (no statements)
_SINGLE = ("relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "neg", "abs", "exp")


class ElementwiseFacts(Facts):
    op: str  # a C-identifier fragment naming the ops ("gelu", "gelu_sigmoid_mul")
    expr: str  # the C value kg_op returns
    body: tuple[str, ...] = ()  # a fused chain's statements before it
    formula: str = ""
    chain: Chain | None = None
    operands: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a map: the tensors m0, m1, ... and their shapes


class _Map(Translator):
    """Every tensor the graph reads (an input, a parameter) is an operand ``m<i>`` broadcast to the output."""

    def __init__(self, g: Graph) -> None:
        super().__init__(g)
        self.operands: list[tuple[str, tuple[int, ...]]] = []

    def leaf(self, ref: Ref) -> Operand:
        t = self.g.tensor(ref)
        if t is None:
            return super().leaf(ref)
        return self.operand_of(t, t.shape)

    def operand_of(self, t: Tensor, shape: tuple[int, ...]) -> str:
        if t.dtype != "float32":
            raise NotCovered(f"a map of the {t.dtype} tensor {t.name!r} is not covered (fp32 operands only)")
        out = self.g.out.shape
        if len(shape) > len(out) or any(s not in (1, o) for s, o in zip(shape[::-1], out[::-1])):
            raise NotCovered(f"{t.name!r} of shape {shape} does not broadcast to the output {out}")
        if (t.name, shape) not in self.operands:
            self.operands.append((t.name, shape))
        return f"m{self.operands.index((t.name, shape))}"

    def visit(self, n: Node) -> None:
        """A tensor viewed with size-1 dims added or dropped is that tensor broadcast as the view's shape."""
        src = n.args.get("self")
        t = self.g.tensor(src) if isinstance(src, Ref) else None
        if n.op in _VIEWS and t is not None and n.shape is not None and \
                [d for d in n.shape if d != 1] == [d for d in t.shape if d != 1]:
            self.env[n.name] = self.operand_of(t, n.shape)
            return
        super().visit(n)


def _map(g: Graph) -> FamilyMatch:
    if g.out.dtype != "float32" or not g.out.shape:
        raise NotCovered(f"a pointwise map to a {g.out.dtype} {g.out.shape} output is not covered (fp32 tensors)")
    t = _Map(g)
    for n in g.live():
        t.visit(n)
    r = t.ref(g.output)
    if t.dtype(r) != "float" or not isinstance(r, str):
        raise NotCovered("the map returns a boolean tensor or a constant: not covered")
    chain = live_chain(t.nodes, r)
    f = chain.facts()
    facts = ElementwiseFacts(op=f["op"], expr=f["expr"], body=tuple(f["body"]), formula=f["formula"], chain=chain,
                             operands=tuple(t.operands))
    return FamilyMatch.of(g, facts)


def _single(g: Graph) -> bool:
    """One input of the output's shape and dtype, no parameters: the vector kernel's chain of ``v``."""
    used = {r for n in g.live() for r in n.refs}
    ins = [t for t in g.inputs if t.name in used]
    return len(g.inputs) == 1 and not any(g.is_param(r) for r in used) and len(ins) == 1 and \
        ins[0].shape == g.out.shape and ins[0].dtype == g.out.dtype


def _recognise(g: Graph) -> FamilyMatch | None:
    if not _single(g) and len(g.inputs) >= 1 and all(t.dtype == "float32" for t in g.inputs):
        return _map(g)
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

MAP_IDEAS = (
    Entry("ew-map", "A thread an output element in one pass: its coordinates from the flat index, each operand "
          "read at its broadcast offset (a per-channel parameter or a reduced tensor is read again from L1/L2), "
          "the fused ops in fp32 registers, one store.", M,
          "one read of every operand and one write: memory-bound, ~60-80% of the copy bandwidth",
          "map", ({}, {"BLOCK": 512}), round0=True),
    Entry("ew-map-grid", "Grid-stride over a capped grid (a few waves of blocks) instead of a block per BLOCK "
          "elements.", PAR, "0-5%", "map", ({"GRID_CAP": 1056}, {"GRID_CAP": 4224}), after=frozenset({"map"})),
)

ELEMENTWISE = Family(name="elementwise", leads=frozenset({Lead.map}), recognise=_recognise,
                     constraints=("pointwise ops only", "over tensors broadcast to the output"),
                     variants={"vec": elementwise_vec, "map": elementwise_map}, ideas=IDEAS + MAP_IDEAS,
                     spec_names={"vec": "playbook-elementwise-", "map": "playbook-elementwise-map-"})
