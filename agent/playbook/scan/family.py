"""Playbook family (registry) ``scan``: a cumulative sum or product along one dim of one fp32
tensor, in the forms KernelBench writes around ``torch.cumsum``/``torch.cumprod``: plain, reversed
(``flip``, scan, ``flip``), exclusive (the scan of all but the last element behind a leading zero),
masked (the scan of ``x * mask`` with a bool or fp32 mask of x's shape), and a scan of x narrowed by
one element.

What the graph computes is read twice: its ops say which scan it calls (and that nothing but shape ops and
one product sit around it), and the graph itself, run on small CPU tensors (no parameters: nothing is
allocated but the probe), says which form it is: its output
must match exactly one candidate form (:data:`FORMS`, each dim) computed here in fp64. A form that
matches none is refused with the reason; nothing is guessed from names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.scan.build import scan_cols, scan_rows, scan_split
from kerngen.agent.playbook.entry import PAR, A, Entry, M
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["FORMS", "SCAN", "ScanFacts", "ScanForm", "scan_reference"]

NAME = "scan"
SCAN_OPS = {"cumsum": "sum", "cumprod": "prod"}
OTHER_SCANS = ("cummax", "cummin", "logcumsumexp")
# ops that may sit around the scan: shape ops and the mask's product (what they do is then probed)
AROUND = frozenset({"flip", "narrow", "slice", "cat", "zeros_like", "ones_like", "select", "unsqueeze", "mul", "to",
                    "_to_copy", "contiguous", "clone", "type_as", "squeeze", "sub", "add"})
MASK_DTYPES = ("bool", "float32")
PROBE_SIZES = (5, 7, 6, 9, 4, 3, 8, 10)  # one distinct size per dim: the probe tells which dim is scanned
PROBE_SEED = 20240607


@dataclass(frozen=True)
class ScanForm:
    """out[q] = op of y[start + j] over j <= q (j < q when ``exclusive``), q < L - drop, where y is x
    (times the mask); ``reverse`` runs it from the end of the dim (flip, scan, flip)."""

    reverse: bool = False
    exclusive: bool = False
    start: int = 0  # the first element of x's dim that is read
    drop: int = 0  # output length along dim = L - drop

    def label(self) -> str:
        parts = [w for w, on in (("reverse", self.reverse), ("exclusive", self.exclusive)) if on]
        if self.start:
            parts.append(f"of x[{self.start}:]")
        elif self.drop:
            parts.append(f"of x[:L-{self.drop}]")
        return " ".join(parts) or "inclusive"


FORMS: tuple[ScanForm, ...] = tuple(
    ScanForm(rev, exc, start, drop)
    for start, drop in ((0, 0), (0, 1), (1, 1))
    for rev in (False, True)
    for exc in (False, True))


def scan_reference(x: Any, mask: Any, dim: int, op: str, form: ScanForm) -> Any:
    """The form computed in fp64 with torch (the probe's candidates and the tests' reference)."""
    import torch

    y = x.double() * mask.double() if mask is not None else x.double()
    n_out = y.shape[dim] - form.drop
    y = y.narrow(dim, form.start, n_out)
    if form.reverse:
        y = y.flip(dim)
    out = torch.cumsum(y, dim) if op == "sum" else torch.cumprod(y, dim)
    if form.exclusive:
        first = torch.full_like(y.narrow(dim, 0, 1), 0.0 if op == "sum" else 1.0)
        out = torch.cat((first, out.narrow(dim, 0, n_out - 1)), dim)
    return out.flip(dim) if form.reverse else out


class ScanFacts(Facts):
    op: str  # sum or prod
    dim: int
    x: str
    mask: str | None
    mask_dtype: str | None
    reverse: bool
    exclusive: bool
    start: int
    drop: int
    form: str


def _probe(g: Graph, x_name: str, mask_name: str | None, x_shape: tuple[int, ...], dim: int,
           mask_dtype: str | None, op: str) -> tuple[int, ScanForm]:
    """Run the graph on CPU tensors in fp64, the scanned dim at its own length and every other dim small (the
    graph is specialised to its shapes along the scanned dim; the others are independent rows); the form
    whose result it matches."""
    import torch

    gen = torch.Generator().manual_seed(PROBE_SEED)
    x_rank = len(x_shape)
    shape = tuple(x_shape[i] if i == dim else PROBE_SIZES[i] for i in range(x_rank))
    # magnitudes in [0.5, 1.5) with random signs: products neither vanish nor explode over a probe row
    x = (torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5) * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)
    mask = None
    if mask_dtype == "bool":
        mask = torch.randint(0, 2, shape, generator=gen).bool()
    elif mask_dtype == "float32":
        mask = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5
    values = {x_name: x} if mask is None else {x_name: x, mask_name: mask}
    try:
        with torch.no_grad():
            got = g.run(values)
    except Exception as exc:  # the forward is the problem's own code: whatever it raises, there is no answer
        raise NotCovered(f"cannot run the scan's forward on a small probe ({type(exc).__name__}); "
                         "not covered by the playbook") from None
    if not isinstance(got, torch.Tensor) or not got.is_floating_point():
        raise NotCovered("the scan's forward does not return one floating tensor")
    for dim in (dim,):
        for form in FORMS:
            want = scan_reference(x, mask, dim, op, form)
            if tuple(got.shape) == tuple(want.shape) and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5):
                return dim, form
    raise NotCovered(f"the forward around cum{op} computes none of the scan forms the playbook has "
                     f"({', '.join(f.label() for f in FORMS[:4])}, narrowed by one)")


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    scans = [n for n in live if n.op in SCAN_OPS]
    others = [n.op for n in live if n.op in OTHER_SCANS]
    if not scans and not others:
        return None
    if others:
        raise NotCovered(f"{others[0]} is not covered by the playbook (its scans are cumsum and cumprod)")
    if len(scans) != 1:
        raise NotCovered("more than one cumulative op in the forward is not covered by the playbook")
    op = SCAN_OPS[scans[0].op]
    around = sorted({n.op for n in live if n.op not in SCAN_OPS and n.op not in AROUND})
    if around:
        raise NotCovered(f"cum{op} with {around[0]} around it is not covered by the playbook")
    inputs, out = list(g.inputs), g.out
    if g.params or len(inputs) not in (1, 2):
        raise NotCovered("the playbook's scan takes x (and a mask), no parameters")
    masks = [t for t in inputs if t.dtype == "bool"] or inputs[1:]
    x = next((t for t in inputs if t not in masks), inputs[0])  # two bool inputs: x is bool, refused below
    mask = masks[0] if masks else None
    if x.dtype != "float32" or out.dtype != "float32":
        raise NotCovered(f"the playbook's scan is fp32 only (input {x.dtype}, output {out.dtype})")
    if mask is not None and (mask.dtype not in MASK_DTYPES or mask.shape != x.shape):
        raise NotCovered(f"a scan mask of dtype {mask.dtype}, shape {mask.shape} is not covered (bool or fp32, "
                         "x's shape)")
    if not x.shape:
        raise NotCovered("the scan of a 0-d tensor is not covered by the playbook")
    dim = int(scans[0]["dim"]) % len(x.shape)
    dim, form = _probe(g, x.name, mask.name if mask else None, x.shape, dim, mask.dtype if mask else None, op)
    want = x.shape[:dim] + (x.shape[dim] - form.drop,) + x.shape[dim + 1:]
    if out.shape != want or want[dim] < 1:
        raise NotCovered(f"scan output shape {out.shape} is not the {want} its form implies")
    facts = ScanFacts(op=op, dim=dim, x=x.name, mask=mask.name if mask else None, mask_dtype=mask.dtype if mask else None,
                      reverse=form.reverse, exclusive=form.exclusive, start=form.start, drop=form.drop, form=form.label())
    return FamilyMatch.of(g, facts)


IDEAS = (
    Entry("scan-rows", "Rows along the scanned (contiguous, innermost) dim: TPR threads per row, each warp owns a "
          "contiguous segment of a tile and loads it with coalesced 16-byte vectors; every lane scans its vector "
          "in registers, the warp scans the lanes' totals with shuffles (carried over the ITEMS vectors), the "
          "row's warps exchange their totals once per tile through shared memory, and the row's running total "
          "is carried from tile to tile. One read and one write of the data.", M,
          "the 2-pass DRAM floor: ~80-90% of bandwidth with enough rows to fill the GPU", "rows",
          ({}, {"ITEMS": 8}), round0=True),
    Entry("scan-cols", "Scan along an outer dim: a thread per column (the inner dims), walking the scanned dim "
          "with UNROLL loads in flight; neighbouring threads read neighbouring columns, so every step is "
          "coalesced. The serial order is PyTorch's own for outer dims.", M,
          "the 2-pass floor when the columns fill the GPU", "cols", ({}, {"UNROLL": 8}), round0=True),
    Entry("scan-split", "Few long rows: split every row into chunks over many blocks. Kernel 1 reduces each chunk "
          "to its total, kernel 2 scans a row's chunk totals, kernel 3 re-scans every chunk from its offset. "
          "Three passes over the data, but the whole GPU works on a single row.", PAR,
          "fills the GPU when rows are few: ~60% of bandwidth (3 passes instead of 2)", "split",
          ({}, {"CHUNK_TILES": 8}), round0=True),
    Entry("scan-rows-tile", "Re-size the row tile: fewer threads per row with more vectors each (fewer tiles, fewer "
          "barriers per row), or more rows per block for short rows.", PAR, "0-15%", "rows",
          ({"ITEMS": 8, "TPR": 256}, {"TPR": 1024, "BLOCK": 1024}, {"ITEMS": 2, "BLOCK": 1024}),
          after=frozenset({"rows"})),
    Entry("scan-rows-prefetch", "Issue the next tile's loads before this tile's shuffles, barrier and stores "
          "(a second register set): a row's DRAM reads no longer stop at every tile's barrier.", A,
          "0-15% when few blocks fit an SM; costs ITEMS * VEC registers", "rows",
          ({"PF": 1}, {"PF": 1, "ITEMS": 2}, {"PF": 1, "TPR": 256, "BLOCK": 256}), after=frozenset({"rows"})),
    Entry("scan-rows-occupancy", "Cap the registers with __launch_bounds__(BLOCK, MIN_BLOCKS) so that 2-4 blocks "
          "stay resident per SM: more rows' loads in flight while other blocks wait at their tile barrier.", PAR,
          "0-10%; spills past the cap cost more", "rows",
          ({"MIN_BLOCKS": 2}, {"MIN_BLOCKS": 4, "TPR": 256, "BLOCK": 256}, {"MIN_BLOCKS": 3}),
          after=frozenset({"rows"})),
    Entry("scan-rows-stream", "Streaming loads and stores (ld.global.cs / st.global.cs): each value is read and "
          "written once, so nothing is kept in L2 for it.", M, "0-5%", "rows", ({"CACHE_HINT": 1},),
          after=frozenset({"rows"})),
    Entry("scan-split-chunks", "Re-size the chunks of the split scan: longer chunks (fewer partials, fewer "
          "blocks) or shorter ones (more blocks for the few rows).", A, "0-10%", "split",
          ({"CHUNK_TILES": 16}, {"CHUNK_TILES": 1}), after=frozenset({"split"})),
)

SCAN = Family(name=NAME, leads=frozenset({Lead.scan}), recognise=_recognise,
              constraints=("one cumsum or cumprod", "shape ops and a mask around it", "x (and a mask) only"),
              variants={"rows": scan_rows, "cols": scan_cols, "split": scan_split}, ideas=IDEAS)
