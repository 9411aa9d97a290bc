"""The partitioner: a traced graph (:mod:`.graph`) cut into fused regions (:mod:`.region`), each one kernel spec of
one family.

The whole graph is asked first: a problem one family covers is one region (what the playbook always offered).
Otherwise the live nodes are cut greedily in execution order: from the first node not yet placed, the longest
run of nodes (at most :data:`WINDOW`) whose graph a family claims and serves (:func:`.registry.choose`) is a
region, provided exactly one value of it is read later (its output). A piece no run covers is taken apart with
PyTorch's own decompositions where the playbook has one (softmax, log_softmax and logsumexp as max, exp and sum;
adaptive pooling to one element as a mean or a max; fp32 scaled_dot_product_attention without a mask or dropout as
``softmax((q @ k^T) * scale) @ v``) and tried again; what is still not covered is a region of its
own without a family, named ``NotCovered: <op> at <node>`` (issue 34 runs it as the model's own ATen op).

Views that keep the data where it is (``view``, ``reshape``, ``unsqueeze``, ``squeeze``, ``flatten``, and
identities such as ``clone`` or eval-mode dropout) need no kernel between regions: a region reads such a view of
an earlier region's output (or of an input) straight from that tensor's memory, under the view's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kerngen.agent.playbook.graph import Graph, Node, Ref, Tensor, aten_node
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import why
from kerngen.agent.playbook.region import Region, lead_of
from kerngen.agent.playbook.registry import choose

__all__ = ["ALIASES", "Partition", "WINDOW", "partition"]

WINDOW = 24  # the longest run of nodes one region is tried with
SDPA = "scaled_dot_product_attention"
ALIASES = ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "clone", "contiguous", "detach",
           "alias", "dropout")


@dataclass(frozen=True)
class Partition:
    """The regions of a graph in order, and where each tensor a region reads or writes lives: ``storage[name]`` is
    a problem tensor (an input, a parameter, ``out``) or the region output that holds it (a view keeps its
    producer's storage)."""

    graph: Graph
    regions: tuple[Region, ...]
    storage: dict[str, str]
    whole: str = ""  # why the graph is not one region (the reason of the family that claimed it whole)

    @property
    def covered(self) -> bool:
        return all(r.match is not None for r in self.regions)

    @property
    def why(self) -> str:
        """Why not every region is covered ("" when it is): the first piece no family takes, and the reason of the
        family that claimed the whole graph."""
        piece = next((r.why for r in self.regions if r.match is None), "")
        return f"{piece}; the whole graph: {self.whole}" if self.whole and piece else piece


def _is_alias(n: Node) -> bool:
    if n.op not in ALIASES:
        return False
    if n.op == "dropout":
        return not n["train"] or not n["p"]
    return n.op not in ("clone", "contiguous") or "channels_last" not in str(n.get("memory_format"))


def _subgraph(g: Graph, nodes: list[Node], later: set[str], roots: dict[str, str], strict: bool = True) -> Graph | None:
    """The graph of ``nodes``: its inputs are what they read from outside (a leading alias is read as a view
    of its root's storage), None unless exactly one of its values is read later (``strict``; else its output is
    the last value read later)."""
    names = {n.name for n in nodes}
    inputs: dict[str, Tensor] = {}
    params: dict[str, Tensor] = {}
    consts: dict[str, float] = {}
    for n in nodes:
        for r in n.refs:
            if r in names:
                continue
            if r in g.constants:
                consts[r] = g.constants[r]
            elif g.is_param(r):
                params[r] = g.tensor(r)
            else:
                shape, dtype = g.shape(r), g.dtype(r)
                if strict and (shape is None or dtype is None or (r not in roots and not g.is_input(r)
                                                                  and g.node(r) is None)):
                    return None  # a (values, indices) pair, or something the region cannot bind
                inputs[r] = Tensor(str(r), shape or (), dtype or "float32")
    outs = [n for n in nodes if n.name in later]
    if strict and (len(outs) != 1 or outs[0].shape is None):
        return None
    out = outs[-1] if outs else nodes[-1]
    return Graph(tuple(inputs.values()), tuple(params.values()), tuple(nodes), Ref(out.name), consts, g.scalars)


def _try(g: Graph, nodes: list[Node], later: set[str], roots: dict[str, str], index: int,
         skip: frozenset[str] = frozenset()) -> Region | None:
    sub = _subgraph(g, nodes, later, roots)
    if sub is None or all(n.name in roots for n in nodes):
        return None
    try:
        m = choose(sub, skip)
    except NotCovered:
        return None
    return Region(index, sub, lead_of(sub), tuple(n.name for n in nodes), m, "")


def partition(g: Graph, skip: frozenset[str] = frozenset()) -> Partition:
    """The regions of ``g`` (see the module's text); never raises for an op it cannot place: that piece is a
    region without a family (``Region.why``). ``skip``: families not asked (the attention family's fp32 candidate
    of two GEMMs and a softmax partitions its own graph without itself)."""
    try:  # the whole graph, as the problem names its tensors
        whole = Region(0, g, lead_of(g), tuple(n.name for n in g.live()), choose(g, skip), "")
        return Partition(g, (whole,), {**_problem_storage(g), str(g.output): "out"})
    except NotCovered as exc:
        reason = str(exc) if "NotCovered:" not in str(exc) else ""
    for _ in range(8):  # each round takes one composite op apart
        found = replace(_cut(g, skip), whole=reason)
        if found.covered:
            return found
        node = next((g.node(n) for r in found.regions if r.match is None for n in r.nodes), None)
        decomposed = _decompose(g, node) if node is not None else None
        if decomposed is None:
            return found
        g = decomposed
    return found


def _problem_storage(g: Graph) -> dict[str, str]:
    return {t.name: t.name for t in (*g.inputs, *g.params)}


def _cut(g: Graph, skip: frozenset[str] = frozenset()) -> Partition:
    live = g.live()
    roots: dict[str, str] = {}  # alias node -> the tensor whose memory it views
    for n in live:
        src = n.args.get("self", n.args.get("input"))
        if _is_alias(n) and isinstance(src, Ref) and (g.node(src) is None or g.node(src).shape is not None):
            roots[n.name] = roots.get(src, src)
    after: list[set[str]] = [set() for _ in range(len(live) + 1)]
    after[len(live)] = {str(g.output)}
    for i in range(len(live) - 1, -1, -1):
        after[i] = after[i + 1] | set(live[i].refs)
    regions: list[Region] = []
    i = 0
    while i < len(live):
        if live[i].name in roots:
            i += 1  # a view between regions: its readers read its root's memory
            continue
        best = None
        for j in range(min(len(live), i + WINDOW), i, -1):
            best = _try(g, live[i:j], after[j], roots, len(regions), skip)
            if best is not None:
                i = j
                break
        if best is None:  # nothing takes it: one region of the op (and the items of a tuple it returns)
            n, j = live[i], i + 1
            while j < len(live) and live[j].op == "getitem" and live[j].args["input"] == n.name:
                j += 1
            sub = _subgraph(g, live[i:j], after[j] | {m.name for m in live[i:j]}, roots, strict=False)
            best = Region(len(regions), sub, lead_of(sub), tuple(m.name for m in live[i:j]), None,
                          _why_not(sub, n, skip))
            i = j
        regions.append(best)
    return Partition(g, tuple(regions), _storage(g, regions, roots))


def _storage(g: Graph, regions: list[Region], roots: dict[str, str]) -> dict[str, str]:
    out = _problem_storage(g)
    last = regions[-1].graph.output if regions else None
    for r in regions:
        name = str(r.graph.output)
        out[name] = "out" if name == last and roots.get(str(g.output), str(g.output)) == name else f"r{r.index}_out"
    for alias, root in roots.items():
        out[alias] = out.get(root, root)
    return out


def _why_not(g: Graph, n: Node, skip: frozenset[str] = frozenset()) -> str:
    try:
        choose(g, skip) if g.out.shape or n.shape is not None else None
    except NotCovered as exc:
        return f"NotCovered: {n.op} at {n.name} ({exc})"
    return f"NotCovered: {n.op} at {n.name} ({why(n.op, 'the playbook')})"


# ---------------------------------------------------------------------------------------------
# PyTorch's decompositions of the composite ops the families do not take whole
def _kept(shape: tuple[int, ...], dims: list[int]) -> tuple[int, ...]:
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


def _decompose(g: Graph, n: Node) -> Graph | None:
    """``g`` with ``n`` replaced by its decomposition (nodes ``<n>_d0``, ...), None where there is none."""
    x = n.args.get("self", n.args.get("input", n.args.get("query")))
    shape = g.shape(x) if isinstance(x, Ref) else None
    if shape is None or n.dtype != "float32":
        return None
    nd, dt, name = len(shape), n.dtype, n.name
    new: list[Node] = []

    def add(op: str, overload: str, out_shape: tuple[int, ...], **args: Any) -> Ref:
        node = aten_node(f"{name}_d{len(new)}", op, overload, out_shape, dt if op not in ("eq",) else "bool", n, **args)
        new.append(node)
        return Ref(node.name)

    if n.op in ("softmax", "log_softmax") and n.get("dtype") is None:
        d = [n["dim"] % nd]
        m = add("amax", "default", _kept(shape, d), self=x, dim=d, keepdim=True)
        t = add("sub", "Tensor", shape, self=x, other=m)
        e = add("exp", "default", shape, self=t)
        s = add("sum", "dim_IntList", _kept(shape, d), self=e, dim=d, keepdim=True)
        if n.op == "softmax":
            add("div", "Tensor", shape, self=e, other=s)
        else:
            lg = add("log", "default", _kept(shape, d), self=s)
            add("sub", "Tensor", shape, self=t, other=lg)
    elif n.op == SDPA and _plain_attention(g, n, shape):
        k, v = n["key"], n["value"]
        ks = g.shape(k)
        scale = n["scale"] if n["scale"] is not None else 1.0 / math.sqrt(shape[-1])  # PyTorch's default
        kt = add("transpose", "int", (*ks[:-2], ks[-1], ks[-2]), self=k, dim0=-2, dim1=-1)
        scores = (*shape[:-1], ks[-2])
        s = add("matmul", "default", scores, self=x, other=kt)
        s = add("mul", "Tensor", scores, self=s, other=float(scale))
        p = add("softmax", "int", scores, self=s, dim=-1)
        add("matmul", "default", tuple(n.shape or ()), self=p, other=v)
    elif n.op == "logsumexp":
        d = sorted({v % nd for v in n["dim"]})
        m = add("amax", "default", _kept(shape, d), self=x, dim=d, keepdim=True)
        a = add("abs", "default", _kept(shape, d), self=m)
        inf = add("eq", "Scalar", _kept(shape, d), self=a, other=math.inf)
        m2 = add("where", "ScalarSelf", _kept(shape, d), condition=inf, self=0.0, other=m)
        t = add("sub", "Tensor", shape, self=x, other=m2)
        e = add("exp", "default", shape, self=t)
        out_shape = tuple(n.shape or ())
        s = add("sum", "dim_IntList", out_shape, self=e, dim=d, keepdim=bool(n["keepdim"]))
        lg = add("log", "default", out_shape, self=s)
        mk = m2 if n["keepdim"] else add("squeeze", "dims", out_shape, self=m2, dim=d)
        add("add", "Tensor", out_shape, self=lg, other=mk)
    elif n.op.startswith(("adaptive_avg_pool", "adaptive_max_pool")) and all(v == 1 for v in n["output_size"]):
        d = list(range(nd - len(n["output_size"]), nd))
        if n.op.startswith("adaptive_avg"):
            add("mean", "dim", tuple(n.shape or ()), self=x, dim=d, keepdim=True)
        else:
            add("amax", "default", tuple(n.shape or ()), self=x, dim=d, keepdim=True)
    else:
        return None
    last = new[-1]
    nodes: list[Node] = []
    for m in g.nodes:
        if m is n:
            nodes.extend(new)
        else:
            nodes.append(replace(m, args={k: _renamed(v, name, last.name) for k, v in m.args.items()}))
    output = Ref(last.name) if g.output == name else g.output
    return Graph(g.inputs, g.params, tuple(nodes), output, g.constants, g.scalars, g.trace_s)


def _plain_attention(g: Graph, n: Node, shape: tuple[int, ...]) -> bool:
    """A scaled_dot_product_attention call the decomposition above computes: no mask (causal or given), no dropout,
    no grouped-query heads, k and v of q's leading dims."""
    ks, vs = g.shape(n["key"]), g.shape(n["value"])
    return (n["attn_mask"] is None and not n["dropout_p"] and not n["is_causal"] and not n.get("enable_gqa")
            and ks is not None and vs is not None and len(shape) >= 3 and ks[:-2] == vs[:-2] == shape[:-2]
            and ks[-1] == shape[-1] and vs[-2] == ks[-2])


def _renamed(v: Any, old: str, new: str) -> Any:
    if isinstance(v, Ref):
        return Ref(new) if v == old else v
    if isinstance(v, tuple):
        return tuple(_renamed(x, old, new) for x in v)
    return v
