"""Variant builders of the ``gemm_rows`` family (each ``(match, defaults) -> KernelSpec``): two launches, the
gemm family's tiled fp32 GEMM, or its 3xTF32 tensor-core GEMM (the ``tf32x3_*`` variants: where its tiles
divide the shape), its elementwise epilogue fused into the store, into a scratch buffer, then the row kernel
(``gemm_rows_tail.cu.j2``) over each row of it.

The elementwise ops right after the GEMM, before anything reads the row as a whole, go into the GEMM's
epilogue when exactly one of their values is read further (:func:`split_epilogue`); the rest of the row
program is compiled by :mod:`.row_codegen`:

- ``staged``: each vector the program reads more than once is computed once into shared memory (the row must
  fit: a constraint);
- ``streamed``: every pass recomputes from the GEMM's output (L1/L2 hits), any row length.

The match's facts (made by :mod:`.gemm.rows`): ``tail`` (a :class:`~.gemm.row_trace.RowTail`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.gemm.build import GemmFacts, gemm_tiled
from kerngen.agent.playbook.gemm.build_tf32 import gemm_tf32x3
from kerngen.agent.playbook.gemm.wgmma import VARIANT as WGMMA, gemm_wgmma
from kerngen.agent.playbook.pointwise import live_chain
from kerngen.agent.playbook.chain_ir import INPUT, Node
from kerngen.agent.playbook.epilogue import EpIndex, Epilogue, EpParam
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render
from kerngen.agent.playbook.row_codegen import RowKernel, compile_rows
from kerngen.agent.playbook.row_program import RowNode, RowOp, RowProgram
from kerngen.agent.playbook.gemm.row_trace import RowTail

__all__ = ["gemm_rows_staged", "gemm_rows_streamed", "gemm_rows_tf32x3_staged", "gemm_rows_tf32x3_streamed",
           "gemm_rows_wgmma_staged", "gemm_rows_wgmma_streamed", "split_epilogue"]

SCRATCH = "gemm_out"  # the GEMM's output, M x N
KERNEL = "gemm_rows_tail"
_ROW_TUNABLES = dict(BLOCK=[32, 64, 128, 256, 512, 1024], RPB=[1, 2, 4, 8], KAHAN=[0, 1])


# ---------------------------------------------------------------------------------------------
# the GEMM's epilogue: the elementwise head of the row program
def _head(prog: RowProgram) -> set[str]:
    """The vectors computed elementwise from the GEMM's row alone (and per-column or one-element tensors)."""
    head = {prog.source.var}
    for n in prog.nodes[1:]:
        if n.op != RowOp.ew or n.length != prog.source.length:
            continue
        ok = True
        for a in n.args:
            if isinstance(a, str) and a.startswith("e"):
                t = prog.tensors[int(a[1:])]
                ok &= t.row_stride is None and t.col_stride in (None, "1")
            elif isinstance(a, str):
                ok &= a in head
        if ok:
            head.add(n.var)
    return head


def _used(prog: RowProgram, var: str) -> list[str]:
    return [n.var for n in prog.nodes if var in n.args]


def prune(prog: RowProgram) -> RowProgram:
    """Only the nodes the result needs (the source stays first) and the tensors they read, renumbered."""
    need, stack = set(), [prog.result]
    while stack:
        v = stack.pop()
        if v not in need:
            need.add(v)
            stack += [a for a in prog.node(v).args if isinstance(a, str) and a.startswith("t")]
    nodes = [n for n in prog.nodes if n.var in need or n.op == RowOp.source]
    used = sorted({int(a[1:]) for n in nodes for a in n.args if isinstance(a, str) and a.startswith("e")})
    ren = {f"e{old}": f"e{new}" for new, old in enumerate(used)}
    nodes = [replace(n, args=tuple(ren.get(a, a) if isinstance(a, str) else a for a in n.args)) for n in nodes]
    return RowProgram(tuple(nodes), tuple(prog.tensors[i] for i in used), prog.result, prog.out)


def split_epilogue(tail: RowTail) -> tuple[Epilogue | None, RowProgram]:
    """(the GEMM's fused epilogue or None, the row program that reads the GEMM's output)."""
    prog = prune(tail.program)
    head = _head(prog)
    frontier = [v for v in head if v == prog.result or any(u not in head for u in _used(prog, v))]
    if len(frontier) != 1 or frontier[0] == prog.source.var:
        return None, prog
    last = frontier[0]
    params: list[EpParam] = []
    chain: list[Node] = []
    for n in prog.nodes[1:]:
        if n.var not in head:
            continue
        args = []
        for a in n.args:
            if isinstance(a, str) and a.startswith("e"):
                t = prog.tensors[int(a[1:])]
                p = EpParam(t.name, EpIndex.channel if t.col_stride else EpIndex.scalar)
                if p not in params:
                    params.append(p)
                a = p.operand(params.index(p))
            elif a == prog.source.var:
                a = INPUT
            args.append(a)
        chain.append(Node(n.var, n.ew, tuple(args), n.params, n.dtype))
    ep = Epilogue(tail.lead.weight.rsplit(".", 1)[0], live_chain(chain, last), tuple(params))
    rest = [RowNode(last, RowOp.source, (), prog.source.length)] + [n for n in prog.nodes if n.var not in head]
    return ep, prune(RowProgram(tuple(rest), prog.tensors, prog.result, prog.out))


# ---------------------------------------------------------------------------------------------
def _gemm_match(m: FamilyMatch, tail: RowTail, ep: Epilogue | None) -> FamilyMatch:
    ld = tail.lead
    x, w = ld.x, ld.weight
    facts = GemmFacts(kind="gemm", a=x, b=w, trans_a=False, trans_b=ld.trans_b, M=f"{x}.shape[0]", N=ld.n_expr,
                      K=f"{x}.shape[1]", LDA=f"{x}.shape[1]", LDB=f"{w}.shape[1]", BATCH="1", SA="0", SB="0",
                      bias=ld.bias, ep=ep, mask="", diag=0, what=tail.lead.what, shape=(1, ld.m, ld.n, ld.k))
    return FamilyMatch("gemm", m.inputs, m.params, m.outputs, facts=facts, precision=m.precision)


def _block(n: int) -> int:
    """Threads per row: about 16 columns a thread, 32 to 1024."""
    b = 32
    while b < 1024 and b * 16 < n:
        b *= 2
    return b


_ENGINES = {"": (gemm_tiled, "tiled fp32 FFMA"), "tf32x3": (gemm_tf32x3, "3xTF32 on the tensor cores, fp32 accuracy"),
            WGMMA: (gemm_wgmma, "the Hopper wgmma + TMA core (sm_90a), 3xTF32 at fp32 accuracy")}


def _build(m: FamilyMatch, defaults: dict[str, int], staged: bool, engine: str = "") -> KernelSpec:
    tail: RowTail = m.facts.tail
    ep, prog = split_epilogue(tail)
    rows = f"{tail.lead.x}.shape[0]"
    kern: RowKernel = compile_rows(prog, rows, staged)
    if staged and not kern.staged:
        raise ValueError("every value of the row program is read once: nothing to hold in shared memory "
                         "(the streamed variant is the same kernel)")
    make_gemm, what = _ENGINES[engine]
    gemm = make_gemm(_gemm_match(m, tail, ep), defaults)
    # the GEMM's launches (the wgmma core's: pre-passes, main, split-K's sum) write the scratch rows, not out
    g_steps = [s.model_copy(update=dict(args=[a if getattr(a, "name", "") != "out" else
                                              a.model_copy(update=dict(name=SCRATCH)) for a in s.args]))
               for s in gemm.steps]
    src = gemm.source + "\n" + render("gemm_rows_tail.cu.j2", kernel=KERNEL, tensors=kern.tensors, body=kern.body)
    base = dict(BLOCK=_block(tail.lead.n), RPB=1, KAHAN=0)
    mine = pick(defaults, base)
    groups = sorted({n.groups for n in prog.nodes if n.op == RowOp.norm})
    constraints = [*gemm.constraints, f"{kern.smem} <= {MAX_SMEM}", f"cdiv({rows}, RPB) < 2**31",
                   *(f"({n.length.expr}) % {n.groups} == 0" for n in prog.nodes if n.op == RowOp.norm)]
    held = ", ".join(kern.staged) or "nothing"
    epi = f", its epilogue {ep.formula} fused" if ep is not None else ""
    how = (f"the values read more than once ({held}) held in shared memory" if staged else
           "every pass recomputed from the GEMM's output (L1/L2), any row length")
    norms = f", norms of {'/'.join(map(str, groups))} groups by teams of warps" if groups else ""
    variant = (f"{engine}-" if engine else "") + ("staged" if staged else "streamed")
    return make_spec(
        f"playbook-gemm-rows-{variant}",
        f"GEMM {tail.lead.what}{epi} ({what}) into a scratch row buffer, then one block per row for "
        f"{prog.formula()}: {how}; block reductions by warp shuffles in fp32{norms}",
        src, {**gemm.tunables, **_ROW_TUNABLES}, {**gemm.defaults, **mine},
        defines={**gemm.defines, **kern.defines}, constraints=constraints,
        scratch=[*(x.model_dump() for x in gemm.scratch),
                 dict(name=SCRATCH, dtype="float32", size=f"({rows}) * ({tail.lead.n_expr})")],
        arch_specific=gemm.arch_specific,
        steps=[*(x.model_dump() for x in g_steps),
               dict(kernel=KERNEL, grid=[f"cdiv({rows}, RPB)"], block=["BLOCK"], shared_mem=kern.smem,
                    args=[{"name": SCRATCH}, *({"name": t} for t in kern.tensors), {"name": "out"}])],
    )


def gemm_rows_staged(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=True)


def gemm_rows_streamed(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=False)


def gemm_rows_tf32x3_staged(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=True, engine="tf32x3")


def gemm_rows_tf32x3_streamed(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=False, engine="tf32x3")


def gemm_rows_wgmma_staged(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=True, engine=WGMMA)


def gemm_rows_wgmma_streamed(m: FamilyMatch, defaults: dict[str, Any]) -> KernelSpec:
    return _build(m, defaults, staged=False, engine=WGMMA)
