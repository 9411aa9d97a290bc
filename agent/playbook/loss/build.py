"""Variant builders of the loss family (``(match, defaults) -> KernelSpec``) and the broadcast layout of
a loss term's inputs.

``term``: a loss that is a sum of elementwise terms of its inputs (mse, l1, huber, smooth l1, kl_div,
bce, hinge, ...), :file:`loss_term.cu.j2`. ``rows``: a loss that reduces each row first (cross entropy,
triplet margin), :file:`loss_rows.cu.j2`. Both write one fp32 partial sum per block into scratch; a
second one-block launch sums the partials in a fixed order, divides and applies the forward's scalar
epilogue (deterministic, no atomics). Every variant raises ValueError for the losses it does not serve
(coverage then drops it for that problem).

The facts come from :mod:`.loss.family`: ``kind`` ("term", "cross_entropy" or "triplet"), ``post_body`` /
``post_expr`` (C over the reduced value ``s``) and, per kind, the term's inputs and C, or the row loss'
options.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.render import make_spec, pick, render

__all__ = ["BROADCAST_MODES", "LOAD_MODES", "InputLayout", "TermLayout", "f32_literal", "rows_loss", "term_layout", "term_loss"]

FAMILY = "loss"
ROW_KINDS = ("cross_entropy", "triplet")
LOAD_MODES = ("full", "vec", "lane", "elem", "one")  # how launch 1 reads an input (loss_term.cu.j2)
BROADCAST_MODES = ("vec", "lane", "elem")  # the modes that track a position (KgPos)
VEC = 4  # floats in a 16-byte load


def f32_literal(value: float) -> str:
    """A C float literal of the fp32 value PyTorch uses for a Python number."""
    if not math.isfinite(float(value)):
        raise ValueError(f"{value!r} is not a finite fp32 constant")
    f32 = struct.unpack("f", struct.pack("f", float(value)))[0]
    s = "%.9g" % f32
    if not any(ch in s for ch in ".e"):
        s += ".0"
    return f"({s}f)" if s.startswith("-") else f"{s}f"


def _prod(exprs: list[str]) -> str:
    kept = [e for e in exprs if e != "1"]
    return " * ".join(kept) or "1"


# ----------------------------------------------------------------------------------------------
# broadcast layout of a term's inputs
@dataclass(frozen=True)
class InputLayout:
    """How launch 1 reads one input: ``mode`` one of LOAD_MODES (see loss_term.cu.j2); for the
    BROADCAST_MODES, ``inner`` and ``size`` (expressions) place element e at (e / inner) % size."""

    name: str
    var: str
    mode: str
    inner: str = "1"
    size: str = "1"


@dataclass(frozen=True)
class TermLayout:
    inputs: tuple[InputLayout, ...]
    dims: tuple[str, ...]  # the term's (broadcast) dims as expressions over the inputs' shapes
    n: str  # the number of terms
    constraints: tuple[str, ...]  # the shapes the layout was made for (ranks, broadcast dims)


def term_layout(inputs: list[tuple[Tensor, str]], shape: tuple[int, ...]) -> TermLayout:
    """The layout of ``inputs`` ((tensor, C variable)) broadcast to the term's ``shape``, or
    :class:`NotCovered` when an input's own dims are not one contiguous run of the term's dims (its
    elements would not sit at (e / inner) % size)."""
    nd = len(shape)
    dims: list[str] = []
    for d in range(nd):
        src = next((f"{t.name}.shape[{d - (nd - len(t.shape))}]" for t, _ in inputs
                    if d >= nd - len(t.shape) and shape[d] != 1 and t.shape[d - (nd - len(t.shape))] == shape[d]), "1")
        dims.append(src)
    out: list[InputLayout] = []
    cons: list[str] = []
    for t, var in inputs:
        off = nd - len(t.shape)
        cons.append(f"{t.name}.ndim == {len(t.shape)}")
        for j, size in enumerate(t.shape):
            own = f"{t.name}.shape[{j}]"
            if size == 1:
                cons.append(f"{own} == 1")
            elif dims[off + j] != own:
                cons.append(f"{own} == {dims[off + j]}")
        wide = [d for d in range(nd) if shape[d] != 1]
        kept = [d for d in wide if d >= off and t.shape[d - off] == shape[d]]
        if kept == wide:
            out.append(InputLayout(t.name, var, "full"))
            continue
        if not kept:
            out.append(InputLayout(t.name, var, "one"))
            continue
        lo, hi = kept[0], kept[-1] + 1
        if any(d not in kept for d in wide if lo <= d < hi):
            raise NotCovered(f"input {t.name} {'x'.join(map(str, t.shape))} broadcasts over dims inside its own "
                             f"against the term's {'x'.join(map(str, shape))}: not covered by the loss family")
        inner_v, size_v = math.prod(shape[hi:]), math.prod(shape[lo:hi])
        inner, size = _prod(dims[hi:]), _prod(dims[lo:hi])
        if inner_v == 1 and size_v % VEC == 0:
            mode = "vec"
            cons.append(f"({size}) % {VEC} == 0")
        elif inner_v % VEC == 0:
            mode = "lane"
            cons.append(f"({inner}) % {VEC} == 0")
        else:
            mode = "elem"
        out.append(InputLayout(t.name, var, mode, inner, size))
    return TermLayout(tuple(out), tuple(dims), _prod(dims), tuple(dict.fromkeys(cons)))


# ----------------------------------------------------------------------------------------------
def _post_text(f: dict) -> str:
    """The scalar epilogue for a description ("" when the loss is the reduced value itself)."""
    return "" if f.post_formula == "s" else f", then {f.post_formula}"


def _final_step(kernel: str, nparts: str, div: str, count: bool) -> dict:
    args = [{"name": "part"}] + ([{"name": "cnt"}] if count else []) + [
        {"name": "out"}, {"kind": "int64", "value": nparts}, {"kind": "int64", "value": div}]
    return dict(kernel=kernel, grid=[1], block=["FBLOCK"], args=args)


def term_loss(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    if f.kind != "term":
        raise ValueError(f"the term kernel sums elementwise terms; {f.loss or 'this loss'} reduces each row "
                         "first (variant rows)")
    by_name = {t.name: t for t in m.inputs}
    lay = term_layout([(by_name[name], var) for name, var in f.terms], tuple(f.term_shape))
    ins = [dict(ptr=f"in{k}", var=i.var, mode=i.mode, k=k) for k, i in enumerate(lay.inputs)]
    kernel, final = "loss_term_partial", "loss_term_final"
    src = render("loss_term.cu.j2", dtype="float32", kernel=kernel, final_kernel=final, ins=ins, body=f.body,
                 expr=f.expr, post_body=f.post_body, post_expr=f.post_expr, count=False, by_count=False)
    # one pass (GRID 0) by default: the elementwise kernel measured a capped grid-stride loop 20% slower
    # (H200), and 16-byte loads of UNROLL groups per thread keep enough bytes in flight
    d = pick(defaults, dict(BLOCK=256, UNROLL=4, GRID=0, HINT=0, FBLOCK=1024))
    groups = f"cdiv(({lay.n}) // {VEC}, BLOCK * UNROLL)"
    grid = f"max(1, {groups} if GRID == 0 else min(GRID, {groups}))"
    defines = {"NTERMS": lay.n}
    for k, i in enumerate(lay.inputs):
        if i.mode in BROADCAST_MODES:
            defines[f"IN{k}_INNER"], defines[f"IN{k}_SIZE"] = i.inner, i.size
    div = _prod([lay.dims[d] for d in f.div_dims])
    args = [{"name": i.name} for i in lay.inputs] + [{"name": "part"}, {"kind": "int64", "value": "NTERMS"}]
    return make_spec(
        f"playbook-{FAMILY}-term",
        f"{f.loss}: one pass over the inputs ({', '.join(f'{i.name} {i.mode}' for i in lay.inputs)}), UNROLL "
        "16-byte groups a thread, the term in fp32 registers, UNROLL accumulators a thread and a block sum into "
        "one partial per block; a one-block launch sums the partials in a fixed order (deterministic) and "
        f"divides by {div}{_post_text(f)}",
        src,
        dict(BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8], GRID=[0, 1056, 2112, 4224, 8448], HINT=[0, 1],
             FBLOCK=[256, 512, 1024]),
        d,
        defines=defines,
        constraints=[*lay.constraints, f"({lay.n}) < 2**62", f"{groups} < 2**31"],
        scratch=[dict(name="part", dtype="float32", size=grid)],
        steps=[dict(kernel=kernel, grid=[grid], block=["BLOCK"], args=args), _final_step(final, grid, div, False)],
    )


def rows_loss(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    kind = f.kind
    if kind not in ROW_KINDS:
        raise ValueError(f"the row kernel serves cross entropy and the triplet margin loss; {f.loss} is a sum "
                         "of elementwise terms (variant term)")
    first = f.inputs[0]
    x = next(t for t in m.inputs if t.name == first)
    ncols, nrows = f"{x.name}.shape[1]", f"{x.name}.shape[0]"
    vec = x.shape[1] % VEC == 0
    ce = kind == "cross_entropy"
    kernel, final = f"loss_{kind}_rows", f"loss_{kind}_final"
    opts: dict = dict(ignore_index=int(f.ignore_index), margin=f32_literal(f.margin),
                      eps=f32_literal(f.eps), swap=bool(f.swap))
    p = float(f.p)
    opts.update(norm="2" if p == 2.0 else "1" if p == 1.0 else "p", p=f32_literal(p))
    src = render("loss_rows.cu.j2", dtype="float32", kernel=kernel, final_kernel=final, mode=kind, vec=vec,
                 count=ce, by_count=f.by_count, post_body=f.post_body, post_expr=f.post_expr,
                 **opts)
    # a warp a row: the KernelBench rows (4096 and 8192 floats) are 32-64 16-byte loads a thread per input
    d = pick(defaults, dict(TPR=32, BLOCK=256, UNROLL=4, GRID=0, HINT=0, FBLOCK=1024))
    groups = f"cdiv({nrows}, BLOCK // TPR)"
    grid = f"max(1, {groups} if GRID == 0 else min(GRID, {groups}))"
    args = [{"name": name} for name in f.inputs] + [{"name": "part"}]
    args += ([{"name": "cnt"}] if ce else []) + [{"kind": "int64", "value": nrows}]
    scratch = [dict(name="part", dtype="float32", size=grid)]
    if ce:
        scratch.append(dict(name="cnt", dtype="int64", size=grid))
    div = nrows if f.reduction == "mean" and not f.by_count else "1"  # by_count: the final launch counts
    what = ("cross entropy: per row a log-sum-exp by online (max, sum) in one pass, minus the target's logit"
            if ce else "triplet margin loss: per row the p-norm distances anchor-positive and anchor-negative "
            f"({'and positive-negative, ' if opts['swap'] else ''}eps inside the norm), margin, clamp")
    if ce:  # logits (N, C), int64 targets (N,)
        target = f.inputs[1]
        cons = [f"{x.name}.ndim == 2", f"{target}.ndim == 1", f"{target}.shape[0] == {nrows}"]
    else:  # anchor, positive, negative: (N, D) each
        cons = [f"{t}.ndim == 2" for t in f.inputs]
        cons += [f"{t}.shape[{k}] == {x.name}.shape[{k}]" for t in f.inputs[1:] for k in (0, 1)]
    cons += ["BLOCK % TPR == 0", "TPR <= BLOCK", f"{groups} < 2**31", f"({ncols}) < 2**31"]
    if vec:
        cons.append(f"({ncols}) % {VEC} == 0")
    return make_spec(
        f"playbook-{FAMILY}-rows",
        f"{what}: TPR threads a row, BLOCK / TPR rows a block, UNROLL {'16-byte' if vec else '4-byte'} loads in "
        "flight a thread, fp32 sums combined in a fixed order; one partial per block, summed by a one-block "
        f"launch in a fixed order (deterministic){_post_text(f)}",
        src,
        dict(TPR=[8, 16, 32, 64, 128, 256, 512, 1024], BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8],
             GRID=[0, 1056, 2112, 4224], HINT=[0, 1], FBLOCK=[256, 512, 1024]),
        d,
        defines={"NCOLS": ncols},
        constraints=cons,
        scratch=scratch,
        steps=[dict(kernel=kernel, grid=[grid], block=["BLOCK"], args=args), _final_step(final, grid, div, ce)],
    )
