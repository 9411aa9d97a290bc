"""Playbook families ``softmax``, ``layernorm`` and ``rmsnorm``: one row op over the trailing dims of one
input, nothing around it (the ``rows_reg`` kernel holds a row in registers; each family has its long-row
variants). Builders: :mod:`.rows.build`.

- softmax / log_softmax over the last dim;
- layer norm over trailing dims (``nn.LayerNorm``, ``F.layer_norm``), its weight and bias optional;
- RMS norm over the last dim: ``nn.RMSNorm`` (``F.rms_norm``) or written out as
  ``x * rsqrt(mean(x^2, -1, keepdim) + eps)`` (or ``x / sqrt(...)``), times an optional weight of the last
  dim's size, with casts to fp32 and back around it (as LLaMA writes it).
"""

from __future__ import annotations

from typing import Any

from kerngen.agent.playbook.rows.build import layernorm_coop, layernorm_split, rmsnorm_two_pass, rows_reg, softmax_long
from kerngen.agent.playbook.entry import A, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import FLOAT_DTYPES, Graph, Node, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["LAYERNORM", "RMSNORM", "RowFacts", "SOFTMAX", "one_input"]


class RowFacts(Facts):
    log: bool = False  # softmax: log_softmax
    ndims: int = 1  # the trailing dims a row spans
    eps: float = 0.0
    weight: str | None = None
    bias: str | None = None
    wdtype: str | None = None  # the weight's dtype (None: the input's)


def one_input(g: Graph) -> Any:
    for d in sorted(g.dtypes):
        if d not in FLOAT_DTYPES:
            raise NotCovered(f"dtype {d} is not covered by the playbook")
    if len(g.inputs) != 1:
        raise NotCovered("the playbook's row and elementwise families take one input")
    return g.inputs[0]


def _alone(g: Graph, ops: tuple[str, ...], what: str) -> Node | None:
    live = g.live()
    hits = [n for n in live if n.op in ops]
    if not hits:
        return None
    if len(live) != 1:
        raise NotCovered(f"{what} with other ops around it is not covered by the playbook")
    return hits[0]


def _softmax(g: Graph) -> FamilyMatch | None:
    n = _alone(g, ("softmax", "log_softmax"), "softmax")
    if n is None:
        return None
    x = one_input(g)
    dim = n["dim"]
    if dim not in (-1, len(x.shape) - 1):
        raise NotCovered(f"{n.op} over dim {dim} (not the last) is not covered by the playbook")
    if g.out.shape != x.shape or x.dtype != g.out.dtype or n["dtype"] is not None:
        raise NotCovered("softmax output differs from its input in shape or dtype")
    return FamilyMatch.of(g, RowFacts(log=n.op == "log_softmax"))


def _check_wdtype(g: Graph, facts: RowFacts, x: Any) -> RowFacts:
    wd = facts.wdtype
    if wd not in ("float32", x.dtype):
        raise NotCovered(f"normalization weights in {wd} with {x.dtype} input are not covered")
    for t in g.params:
        if t.name in (facts.weight, facts.bias) and t.dtype != wd:
            raise NotCovered("normalization weight and bias differ in dtype")
    return facts


def _layernorm(g: Graph) -> FamilyMatch | None:
    n = _alone(g, ("layer_norm",), "layernorm")
    if n is None:
        return None
    x = one_input(g)
    shape = tuple(n["normalized_shape"])
    if tuple(x.shape[len(x.shape) - len(shape):]) != shape:
        raise NotCovered("layernorm's normalized_shape is not the input's trailing dims")
    w, b = n["weight"], n["bias"]
    wb = g.tensor(w or b) if (w or b) else None
    facts = RowFacts(ndims=len(shape), eps=float(n["eps"]), weight=w, bias=b, wdtype=wb.dtype if wb else x.dtype)
    return FamilyMatch.of(g, _check_wdtype(g, facts, x))


_CASTS = ("to", "_to_copy", "type_as", "clone", "contiguous")


def _through_casts(g: Graph, ref: Any) -> Any:
    n = g.node(ref) if isinstance(ref, Ref) else None
    while n is not None and n.op in _CASTS:
        ref = n.args.get("self")
        n = g.node(ref)
    return ref


def _rms_written(g: Graph, x: Any) -> tuple[float, str | None] | None:
    """(eps, weight) of ``[w *] x * rsqrt(mean(x^2, -1, keepdim) + eps)`` (or ``x / sqrt(...)``), casts
    allowed anywhere; NotCovered for any other graph with a mean over the last dim of a square."""
    live = g.live()
    last = len(x.shape) - 1
    mean = next((n for n in live if n.op == "mean"), None)
    dims = [d % len(x.shape) for d in (mean["dim"] or [])] if mean is not None else []
    if mean is None or dims != [last] or not mean["keepdim"]:
        return None  # not over the last dim: the reduce family's normalize form, or nobody's
    sq = g.node(_through_casts(g, mean["self"]))
    base = _through_casts(g, sq["self"]) if sq is not None else None
    squares = sq is not None and base == x.name and (
        (sq.op == "pow" and sq["exponent"] == 2) or sq.op == "square" or (sq.op == "mul" and _through_casts(g, sq["other"]) == x.name))
    add = g.users(mean.name)[0] if len(g.users(mean.name)) == 1 else None
    if not squares or add is None or add.op != "add" or isinstance(add["other"], Ref):
        raise NotCovered("a mean of squares that is not x * rsqrt(mean(x^2) + eps) is not covered by the playbook")
    root = g.users(add.name)[0] if len(g.users(add.name)) == 1 else None
    if root is None or root.op not in ("rsqrt", "sqrt"):
        raise NotCovered("a mean of squares that is not x * rsqrt(mean(x^2) + eps) is not covered by the playbook")
    scaled = g.users(root.name)[0] if len(g.users(root.name)) == 1 else None
    want = "mul" if root.op == "rsqrt" else "div"
    if scaled is None or scaled.op != want or {_through_casts(g, r) for r in scaled.refs} != {x.name, root.name}:
        raise NotCovered("a mean of squares that is not x * rsqrt(mean(x^2) + eps) is not covered by the playbook")
    weight = None
    tail = [n for n in live if n.op not in _CASTS and n not in (mean, sq, add, root, scaled)]
    if tail:
        last_op = tail[-1]
        w = [r for r in last_op.refs if g.is_param(r)]
        if len(tail) != 1 or last_op.op != "mul" or len(w) != 1 or g.tensor(w[0]).shape != (x.shape[-1],):
            raise NotCovered("rmsnorm with parameters other than one weight vector is not covered")
        weight = w[0]
    return float(add["other"]) * float(add["alpha"]), weight


def _rmsnorm(g: Graph) -> FamilyMatch | None:
    live = g.live()
    ops = {n.op for n in live}
    if "rms_norm" not in ops and not ({"rsqrt", "sqrt"} & ops and "mean" in ops):
        return None
    x = one_input(g)
    node = next((n for n in live if n.op == "rms_norm"), None)
    if node is not None:
        if len(live) != 1:
            raise NotCovered("rmsnorm with other ops around it is not covered by the playbook")
        if tuple(node["normalized_shape"]) != (x.shape[-1],):
            raise NotCovered("rmsnorm over more than the last dim is not covered by the playbook")
        eps = node["eps"]
        if eps is None:
            import torch

            eps = float(torch.finfo(getattr(torch, x.dtype)).eps)
        weight = node["weight"]
    else:
        written = _rms_written(g, x)
        if written is None:
            return None
        eps, weight = written
    if g.out.shape != x.shape:
        raise NotCovered("rmsnorm output differs from its input in shape")
    w = g.tensor(weight) if weight else None
    facts = RowFacts(ndims=1, eps=float(eps), weight=weight, bias=None, wdtype=w.dtype if w else x.dtype)
    return FamilyMatch.of(g, _check_wdtype(g, facts, x))


# ---------------------------------------------------------------------------------------------
_SOFTMAX_IDEAS = (
    Entry("sm-rows-reg", "Hold each row in registers: TPR threads per row (a warp for short rows, a block for "
          "long ones), 16-byte loads, max and sum by warp shuffles (+ shared memory across warps), "
          "one read and one write of the row.", M, "2 passes over DRAM (the floor): ~85-90% of bandwidth",
          "rows_reg", ({}, {"BLOCK": 256}), round0=True),
    Entry("sm-long-online", "Long rows: one block per row with an online softmax (running max and rescaled "
          "running sum) in a single DRAM pass; the second pass re-reads the row from L2 (the SMs' rows in "
          "flight fit in L2), or from shared memory for the part cached there; streaming stores.", M,
          "2 DRAM passes instead of 3: ~1.5x over a 3-pass softmax, ~85-90% of bandwidth",
          "long", ({}, {"UNROLL": 4}), round0=True),
    Entry("sm-long-smem", "Keep as much of the row as fits (up to ~200 KB) in shared memory during pass 1 so "
          "that pass 2 reads on-chip memory instead of L2.", M,
          "less L2 traffic; helps when the rows in flight overflow L2, can cost occupancy",
          "long", ({"CACHE_KB": 64}, {"CACHE_KB": 128}, {"CACHE_KB": 200}), after=frozenset({"long"})),
    Entry("sm-rows-pipelined", "Several rows per block in turn with the next row's loads issued before this "
          "row's reductions (software pipelining across rows).", A, "0-8%",
          "rows_reg", ({"RITER": 4}, {"RITER": 8}), after=frozenset({"rows_reg"})),
    Entry("sm-rows-pack", "Pack several rows per block (BLOCK/TPR rows) so that short rows keep enough warps "
          "per SM and each block does enough work.", PAR, "5-20% for short rows",
          "rows_reg", ({"BLOCK": 512}, {"BLOCK": 1024}), after=frozenset({"rows_reg"})),
    Entry("sm-more-inflight", "More independent 16-byte loads in flight per thread in pass 1 (UNROLL) and "
          "smaller blocks so that two blocks share an SM.", A, "a few %",
          "long", ({"UNROLL": 8, "BLOCK": 512}, {"UNROLL": 2, "BLOCK": 1024}), after=frozenset({"long"})),
)
_LAYERNORM_IDEAS = (
    Entry("ln-rows-reg", "Short rows: hold each row in registers (TPR threads per row), exact two-pass mean and "
          "variance from registers, one read and one write.", M, "the 2-pass DRAM floor",
          "rows_reg", ({},), round0=True),
    Entry("ln-split", "Few, very long rows: split every row over many blocks. Kernel 1 writes one (mean, M2) "
          "pair per chunk (Welford/Chan merges), kernel 2 merges a row's pairs and normalises its chunk. "
          "Grids are (rows, chunks) so one chunk of weight and bias serves all rows from L2, and kernel 2 "
          "walks the chunks backwards to reuse what kernel 1 left in L2.", PAR,
          "fills the GPU with 16 rows; 3 passes over x (read, read, write) ~80% of bandwidth",
          "split", ({}, {"ITEMS": 8}), round0=True),
    Entry("ln-coop", "Few, very long rows in two DRAM passes: one cooperative persistent grid (a block per SM) "
          "holds one row at a time in registers, each block a contiguous segment of it. The weight's segment "
          "and as much of the bias' as fits stay in shared memory for the whole launch, so a row's only L2 "
          "traffic is the row. Each block publishes its (n, mean, M2) and arrives on the row's counter; "
          "several warps then merge the blocks' triples at once, every thread normalises its registers; "
          "meanwhile the next row is bulk-prefetched into L2 so DRAM keeps reading through the barrier.", M,
          "2 passes over x instead of the split kernel's 3; measured on the suite (H200) at 0.21 ms against "
          "the split kernel's 0.23: the per-row barrier and the reduction still leave DRAM idle part of each row",
          "coop", ({}, {"BLOCK": 1024}), after=frozenset({"split"})),
    Entry("ln-coop-balance", "Re-balance the persistent grid: threads per block against values per thread, and "
          "the grid without the next-row prefetch or with the bias read from L2, to see what carries the "
          "gain.", A, "0-10%", "coop", ({"PF": 0}, {"BSL": 0}, {"BLOCK": 768}, {"PG": 2}),
          after=frozenset({"coop"})),
    Entry("ln-split-chunks", "Tune the chunk size: fewer, larger chunks (more vectors per thread, more bytes in "
          "flight) or more, smaller ones (more blocks, better balance).", A, "a few %",
          "split", ({"ITEMS": 2, "BLOCK": 512}, {"ITEMS": 16}, {"BLOCK": 512, "ITEMS": 8}), after=frozenset({"split"})),
    Entry("ln-rows-pack", "Several short rows per block for occupancy.", PAR, "5-20% for short rows",
          "rows_reg", ({"BLOCK": 512},), after=frozenset({"rows_reg"})),
)
_RMSNORM_IDEAS = (
    Entry("rms-rows-reg", "Block per row with the row in registers: 16-byte loads (8 x bf16), sum of squares "
          "in fp32, one block reduction, rsqrt, scale by the weight, 16-byte stores.", M,
          "one read and one write: ~90% of bandwidth", "rows_reg", ({}, {"TPR": 256, "BLOCK": 256}), round0=True),
    Entry("rms-two-pass", "Block per row without holding the row: one loop streams it for the sum of squares "
          "(U 16-byte loads in flight a thread, evict-last in L2), a second loop re-reads it from L1/L2, scales "
          "and stores. Few registers a thread, so full occupancy and more rows in flight per SM.", M,
          "one DRAM read and one write like the register-held row, ~2-4% faster when that one is "
          "register-limited (H200, bf16 8192x8192: 0.0684 vs 0.0703 ms)",
          "two_pass", ({}, {"BLOCK": 512, "U": 2, "MIN_BLOCKS": 4}), round0=True),
    Entry("rms-two-pass-ilp", "Trade loads in flight against occupancy in the two-loop kernel: U 2-8 vectors a "
          "thread with MIN_BLOCKS sized so that the registers still fit (no spills).", A, "0-3%",
          "two_pass", ({"U": 4, "MIN_BLOCKS": 4}, {"U": 2, "MIN_BLOCKS": 8}, {"U": 8, "MIN_BLOCKS": 4}),
          after=frozenset({"two_pass"})),
    Entry("rms-rows-pack", "Smaller groups per row and several rows per block (TPR 128-256, BLOCK 256-512) for "
          "more independent rows in flight per SM.", PAR, "0-5%",
          "rows_reg", ({"TPR": 128, "BLOCK": 256}, {"TPR": 256, "BLOCK": 512}), after=frozenset({"rows_reg"})),
    Entry("rms-occupancy", "Cap registers with __launch_bounds__(BLOCK, MIN_BLOCKS) so that 2048 / BLOCK "
          "blocks stay resident (32 registers a thread): more warps in flight to cover DRAM latency.", PAR,
          "0-2%: ncu showed 75% theoretical occupancy (register-limited) against torch.compile's 100%",
          "rows_reg", ({"MIN_BLOCKS": 4, "TPR": 512, "BLOCK": 512}, {"MIN_BLOCKS": 8, "TPR": 256, "BLOCK": 256}),
          after=frozenset({"rows_reg"})),
    Entry("rms-stream", "Other load paths for the row: streaming hints on loads and stores (evict-first), or "
          "plain coherent loads instead of the read-only (texture) path.", M, "0-3%",
          "rows_reg", ({"CACHE_HINT": 1}, {"CACHE_HINT": 2}), after=frozenset({"rows_reg"})),
    Entry("rms-pipelined", "Walk RITER rows per block in turn and issue the next row's 16-byte loads before "
          "this row's reduction and stores: the DRAM stream never waits on a barrier, the weight stays in "
          "L1, and a grid of ~one wave leaves no tail.", A, "2-8% when blocks idle at the reduction",
          "rows_reg", ({"RITER": 4}, {"RITER": 8}, {"RITER": 8, "TPR": 128, "BLOCK": 256}),
          after=frozenset({"rows_reg"})),
    Entry("rms-bulk", "Bring each block's rows into shared memory with one bulk (TMA) copy per row group, "
          "double-buffered and tracked by mbarriers: the copy engine keeps ~32-64 KB per block in flight "
          "while the threads reduce the previous rows, with no per-thread load instructions.", A,
          "closer to the copy bandwidth when per-thread loads cannot keep enough bytes in flight",
          "rows_reg", ({"BULK": 1, "RITER": 4}, {"BULK": 1, "RITER": 8, "TPR": 512, "BLOCK": 512},
                       {"BULK": 1, "RITER": 2}), after=frozenset({"rows_reg"})),
)

SOFTMAX = Family(name="softmax", leads=frozenset({Lead.softmax}), recognise=_softmax,
                 constraints=("one softmax or log_softmax", "nothing else", "over the last dim", "one input"),
                 variants={"rows_reg": rows_reg, "long": softmax_long}, ideas=_SOFTMAX_IDEAS,
                 spec_names={"rows_reg": "playbook-softmax-rows-reg", "long": "playbook-softmax-long"})
LAYERNORM = Family(name="layernorm", leads=frozenset({Lead.norm}), recognise=_layernorm,
                   constraints=("one layer_norm", "nothing else", "over trailing dims", "one input"),
                   variants={"rows_reg": rows_reg, "split": layernorm_split, "coop": layernorm_coop},
                   ideas=_LAYERNORM_IDEAS,
                   spec_names={"rows_reg": "playbook-layernorm-rows-reg", "split": "playbook-layernorm-split",
                               "coop": "playbook-layernorm-coop"})
RMSNORM = Family(name="rmsnorm", leads=frozenset({Lead.norm, Lead.reduce}), recognise=_rmsnorm,
                 constraints=("rms_norm or x * rsqrt(mean(x^2) + eps)", "over the last dim", "at most a weight",
                              "one input"),
                 variants={"rows_reg": rows_reg, "two_pass": rmsnorm_two_pass}, ideas=_RMSNORM_IDEAS,
                 spec_names={"rows_reg": "playbook-rmsnorm-rows-reg", "two_pass": "playbook-rmsnorm-two-pass"})
