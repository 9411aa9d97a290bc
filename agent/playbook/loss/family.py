"""Playbook family "loss": a forward whose output is a 0-d fp32 tensor reduced from its inputs, either a
sum (or mean) of elementwise terms (``torch.mean((p - t) ** 2)``, ``F.smooth_l1_loss``, ``F.kl_div``,
hinge ...: variant ``term``) or a sum of per-row losses (``F.cross_entropy``, ``nn.TripletMarginLoss``:
variant ``rows``), optionally followed by scalar ops on the reduced value (``sqrt(mean(...))``).

The traced graph (:mod:`.graph`) is translated with the pointwise IR (:mod:`.pointwise`): each input is a C
variable ``in_<name>`` with its shape, every op
broadcasts (the term's shape is the broadcast of what it reads), one reduction (``mean``/``sum`` over all
dims, or a loss call with reduction mean/sum/batchmean) turns the term into the reduced value ``s``, and
the ops after it become the final launch's epilogue. The loss calls are written out with PyTorch's own
formulas (ATen's Loss.cpp and its CUDA kernels: the same ops in the same order, in fp32), e.g.
smooth_l1 ``z < beta ? 0.5 * z * z / beta : z - 0.5 * beta`` and kl_div ``xlogy(t, t) - t * input``.

``recognise`` returns None for problems that are not losses (an output that is not 0-d, or a forward
with no reduction or loss call) and raises :class:`NotCovered` for losses it cannot serve (weights,
label smoothing, class-probability targets, per-row reductions other than the two row losses, ...).
"""

from __future__ import annotations

import math
import re
from typing import Any

from kerngen.agent.playbook.loss.build import rows_loss, term_layout, term_loss
from kerngen.agent.playbook.chain_ir import Chain, Operand
from kerngen.agent.playbook.entry import A, C, M, PAR, Entry
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node as GNode, Ref, Tensor
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import dim_text
from kerngen.agent.playbook.pointwise import Translator, live_chain
from kerngen.agent.playbook.leads import Lead

__all__ = ["LOSS", "LossFacts", "LossTranslator", "TERM_LOSSES"]

NAME = "loss"
REDUCED = "s"  # the C variable of the reduced value in the final launch
ROW_VALUES = "row_losses"  # a row loss with reduction='none' until a mean or sum reduces it (never in C)
REDUCTIONS = ("mean", "sum")
TERM_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "soft_margin_loss")
ROW_LOSSES = ("cross_entropy", "triplet_margin_loss")
_ATEN = {"cross_entropy_loss": "cross_entropy"}  # ATen op -> the functional's name used below
_REDUCTION = {0: "none", 1: "mean", 2: "sum"}  # ATen's reduction enum


def _broadcast(shapes: list[tuple[int, ...]], what: str) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(nd):
        sizes = {s[d - (nd - len(s))] for s in shapes if d >= nd - len(s)} - {1}
        if len(sizes) > 1:
            raise NotCovered(f"{what}: shapes {' and '.join('x'.join(map(str, s)) for s in shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _formula(chain: Chain) -> str:
    """Readable, with the inputs' own names (``predictions - targets``)."""
    text = chain.formula() if chain.nodes else str(chain.result)
    return re.sub(r"\bin_(\w+)", r"\1", text)


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise NotCovered(f"{what} = {value!r} is not covered by the loss family (a finite number is)")
    return float(value)


class LossFacts(Facts):
    kind: str  # "term", "cross_entropy" or "triplet"
    post_body: tuple[str, ...]
    post_expr: str
    post_formula: str
    post_chain: Chain
    loss: str
    # a sum of terms
    terms: tuple[tuple[str, str], ...] = ()  # (input, its C variable)
    term_shape: tuple[int, ...] = ()
    body: tuple[str, ...] = ()
    expr: str = ""
    formula: str = ""
    chain: Chain | None = None
    div_dims: tuple[int, ...] = ()
    # a row loss
    inputs: tuple[str, ...] = ()
    reduction: str | None = None
    by_count: bool = False
    ignore_index: int = -100
    margin: float = 0.0
    p: float = 2.0
    eps: float = 0.0
    swap: bool = False


class LossTranslator(Translator):
    """The traced graph as a loss: the term (IR nodes over the inputs' C variables) or a row loss, the
    reduction, and the scalar epilogue (``facts``)."""

    where = "the loss family"

    def __init__(self, g: Graph) -> None:
        super().__init__(g)
        self.inputs = {t.name: t for t in g.inputs}
        self.vars: dict[str, Tensor] = {}  # C variable -> the input it holds
        self.shape: dict[str, tuple[int, ...] | None] = {}  # C variable -> its broadcast shape; None: reduced
        self.term: Operand | None = None
        self.term_shape: tuple[int, ...] = ()
        self.div_dims: tuple[int, ...] = ()  # term dims whose product divides the sum
        self.loss = ""  # the loss call, for descriptions ("" for a hand-written mean or sum)
        self.how = ""  # the reduction: mean, sum or batchmean
        self.rows: dict[str, Any] | None = None
        self.broadcasts: dict[str, tuple] = {}  # broadcast_tensors node -> its tensors
        self.folded: set[str] = set()  # nodes that are part of an op read whole (kl_div's batchmean division)

    # -- shapes: every op broadcasts; a reduced value mixes with constants only -------------------
    def emit(self, op: str, args: tuple[Operand, ...], params: tuple[float | None, ...] = (),
             dtype: str = "float") -> str:
        if ROW_VALUES in args:
            raise NotCovered(f"{op} of per-row losses before their reduction is not covered by the loss family")
        shapes = [self.shape[a] for a in args if isinstance(a, str)]
        if any(s is None for s in shapes) and any(s is not None for s in shapes):
            raise NotCovered(f"{op} of a reduced value and a tensor is not covered by the loss family")
        shape = None if any(s is None for s in shapes) else _broadcast([s for s in shapes if s is not None], op)
        var = super().emit(op, args, params, dtype)
        self.shape[var] = shape
        return var

    # -- the graph --------------------------------------------------------------------------
    def facts(self) -> LossFacts:
        for t in self.g.inputs:
            var = f"in_{t.name}"
            self.env[t.name], self.vars[var], self.shape[var] = var, t, t.shape
            self.dtypes[var] = "int64" if t.dtype == "int64" else "float"  # fp32 is checked per use below
        for n in self.g.live():
            if n.name not in self.folded:
                self.visit(n)
        res = self.ref(self.g.output)
        if not isinstance(res, str) or self.shape.get(res, ()) is not None:
            raise NotCovered("the forward's 0-d result is not one reduction of its inputs (mean, sum or a loss call)")
        post = live_chain(self.nodes, res)
        facts: dict[str, Any] = dict(post_body=tuple(post.statements()), post_expr=post.expr(),
                                     post_formula=_formula(post), post_chain=post)
        if self.rows is not None:
            facts.update(self.rows)
            facts["inputs"] = tuple(self.rows["inputs"])
            used = [self.inputs[name] for name in self.rows["inputs"]]
            if self.rows["kind"] == "cross_entropy":
                used = used[:1]  # the int64 targets were checked with the call
        else:
            term = live_chain(self.nodes, self.term)
            named = {a for n in term.nodes for a in n.args if isinstance(a, str)} | {term.result}
            used = [t for var, t in self.vars.items() if var in named]
            if not used:
                raise NotCovered("a reduction of a constant is not covered by the loss family")
            formula = _formula(term)
            facts.update(kind="term", terms=tuple((t.name, f"in_{t.name}") for t in used), term_shape=self.term_shape,
                         body=tuple(term.statements()), expr=term.expr(), formula=formula, chain=term,
                         div_dims=self.div_dims, loss=self.loss or f"{self.how}({formula})")
            term_layout([(t, f"in_{t.name}") for t in used], self.term_shape)  # NotCovered for odd broadcasts
        for t in used:  # the kernels read every input but cross entropy's targets as fp32
            if t.dtype != "float32":
                raise NotCovered(f"input {t.name} is {t.dtype}: the loss family reads fp32 inputs only")
        return LossFacts(**facts)

    def visit(self, n: GNode) -> None:
        fn = _ATEN.get(n.op, n.op)
        if fn in TERM_LOSSES + ROW_LOSSES:
            b = {("input" if k == "self" else k): v for k, v in n.args.items()}
            b["reduction"] = _REDUCTION.get(b.get("reduction"), b.get("reduction"))
            if fn == "kl_div" and b["reduction"] == "sum" and self._batchmean(n):
                b["reduction"] = "batchmean"
            self.env[n.name] = self.call_loss(fn, b)
            return
        if n.op == "broadcast_tensors":
            self.broadcasts[n.name] = n["tensors"]
            return
        if n.op == "getitem" and n["input"] in self.broadcasts:  # a loss's own broadcast: the terms broadcast anyway
            self.env[n.name] = self.ref(self.broadcasts[n["input"]][n["index"]])
            return
        if n.op in REDUCTIONS:
            self.env[n.name] = self.reduction(n)
            return
        super().visit(n)

    def _batchmean(self, n: GNode) -> bool:
        """F.kl_div(reduction='batchmean') is traced as kl_div(reduction=sum) / input.shape[0]: fold the
        division into the call."""
        users = self.g.users(n.name)
        x = self.g.shape(n["self"]) or ()
        if len(users) == 1 and users[0].op == "div" and users[0]["self"] == n.name and x and \
                users[0]["other"] == x[0] and users[0].get("rounding_mode") is None:
            self.folded.add(users[0].name)
            self.env[users[0].name] = REDUCED
            return True
        return False

    # -- reductions -------------------------------------------------------------------------
    def reduction(self, n: GNode) -> str:
        name = n.op
        if n.get("dtype") is not None and str(n["dtype"]) != "torch.float32":
            raise NotCovered(f"{name} with a dtype or extra arguments is not covered by the loss family")
        a = self.tensor(n["self"], name)
        shape = self.shape[a]
        if shape is None:
            raise NotCovered("a reduction of a reduced value is not covered by the loss family")
        dim = n.get("dim")
        dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
        if dim not in (None, []) and (not all(isinstance(d, int) for d in dims)
                                      or {d % max(1, len(shape)) for d in dims} != set(range(len(shape)))):
            raise NotCovered(f"{name} over dim {dim_text(dim)} (not every dim): a per-row reduction before the loss is "
                             "not covered by the loss family")
        if n.get("keepdim") and shape:
            raise NotCovered(f"{name}(keepdim=True) is not covered by the loss family")
        return self.reduce(a, name, None)

    def reduce(self, term: Operand, reduction: str, batch_of: Operand | None, what: str = "") -> str:
        if term == ROW_VALUES and self.rows is not None:  # mean or sum of a row loss' reduction='none'
            self.rows.update(reduction=reduction, loss=f"{reduction}({self.rows['loss']})")
            return self._reduced()
        if self.term is not None or self.rows is not None:
            raise NotCovered("the loss family covers one reduction in the forward")
        shape = self.shape[term] if isinstance(term, str) else None
        if shape is None:
            raise NotCovered("a reduction of a reduced value or a constant is not covered by the loss family")
        self.term, self.term_shape, self.loss, self.how = term, shape, what, reduction
        nd = len(shape)
        if reduction == "mean":
            self.div_dims = tuple(range(nd))
        elif reduction == "batchmean":  # kl_div: the sum over the input's first dim (none for a 0-d input)
            xs = self.shape[batch_of]
            self.div_dims = (nd - len(xs),) if xs else ()
        return self._reduced()

    def _reduced(self) -> str:
        self.shape[REDUCED], self.dtypes[REDUCED] = None, "float"
        return REDUCED

    # -- loss calls -------------------------------------------------------------------------
    def call_loss(self, fn: str, b: dict[str, Any]) -> str:
        if b.get("size_average") is not None or b.get("reduce") is not None:
            raise NotCovered(f"{fn} with the legacy size_average/reduce arguments is not covered by the loss family")
        for k in ("weight", "pos_weight"):
            if b.get(k) is not None:
                raise NotCovered(f"{fn} with a {k} tensor is not covered by the loss family")
        red = b.get("reduction", "mean")
        if red not in (*REDUCTIONS, "none") and (fn, red) != ("kl_div", "batchmean"):
            raise NotCovered(f"{fn}(reduction={red!r}) is not covered by the loss family")
        if fn in ROW_LOSSES:
            return self._row_loss(fn, b, red)
        x, y = self.tensor(b["input"], fn), self.tensor(b["target"], fn)
        if fn.startswith("binary_cross_entropy") and self.shape[x] != self.shape[y]:
            raise NotCovered(f"{fn} of inputs of different shapes (PyTorch refuses them)")
        term = getattr(self, f"_{fn}")(x, y, b)
        if red == "none":  # the terms themselves: a later mean or sum reduces them
            return term
        return self.reduce(term, red, x, f"{fn}(reduction={red})")

    def _sub_abs(self, x: Operand, y: Operand) -> str:
        return self.emit("abs", (self.emit("sub", (x, y)),))

    def _mse_loss(self, x: Operand, y: Operand, b: dict) -> str:
        d = self.emit("sub", (x, y))
        return self.emit("mul", (d, d))

    def _l1_loss(self, x: Operand, y: Operand, b: dict) -> str:
        return self._sub_abs(x, y)

    def _smooth_l1_loss(self, x: Operand, y: Operand, b: dict) -> str:
        beta = _finite(b["beta"], "smooth_l1_loss beta")
        if beta < 0:
            raise NotCovered("smooth_l1_loss with a negative beta (PyTorch refuses it)")
        z = self._sub_abs(x, y)
        if beta == 0.0:  # PyTorch computes l1_loss then
            return z
        quad = self.emit("div", (self.emit("mul", (self.emit("mul", (0.5, z)), z)), beta))
        lin = self.emit("sub", (z, 0.5 * beta))
        return self.emit("where", (self.emit("lt", (z, beta), dtype="bool"), quad, lin))

    def _huber_loss(self, x: Operand, y: Operand, b: dict) -> str:
        delta = _finite(b["delta"], "huber_loss delta")
        if delta <= 0:
            raise NotCovered("huber_loss with delta <= 0 (PyTorch refuses it)")
        z = self._sub_abs(x, y)
        quad = self.emit("mul", (self.emit("mul", (0.5, z)), z))
        lin = self.emit("mul", (delta, self.emit("sub", (z, 0.5 * delta))))
        return self.emit("where", (self.emit("lt", (z, delta), dtype="bool"), quad, lin))

    def _kl_div(self, x: Operand, y: Operand, b: dict) -> str:
        if b["log_target"]:  # exp(t) * (t - input)
            return self.emit("mul", (self.emit("exp", (y,)), self.emit("sub", (y, x))))
        # xlogy(t, t) - t * input; xlogy is 0 where t == 0 (NaN stays NaN)
        tlogt = self.emit("mul", (y, self.emit("log", (y,))))
        xlogy = self.emit("where", (self.emit("eq", (y, 0.0), dtype="bool"), 0.0, tlogt))
        return self.emit("sub", (xlogy, self.emit("mul", (y, x))))

    def _binary_cross_entropy(self, x: Operand, y: Operand, b: dict) -> str:
        # (t - 1) * max(log1p(-p), -100) - t * max(log(p), -100)
        log_1mp = self.emit("maximum", (self.emit("log1p", (self.emit("neg", (x,)),)), -100.0))
        log_p = self.emit("maximum", (self.emit("log", (x,)), -100.0))
        return self.emit("sub", (self.emit("mul", (self.emit("sub", (y, 1.0)), log_1mp)), self.emit("mul", (y, log_p))))

    def _binary_cross_entropy_with_logits(self, x: Operand, y: Operand, b: dict) -> str:
        # (1 - t) * x - log_sigmoid(x)
        return self.emit("sub", (self.emit("mul", (self.emit("sub", (1.0, y)), x)), self.emit("logsigmoid", (x,))))

    def _soft_margin_loss(self, x: Operand, y: Operand, b: dict) -> str:
        # log1p(exp(-x * t))
        return self.emit("log1p", (self.emit("exp", (self.emit("mul", (self.emit("neg", (x,)), y)),)),))

    # -- row losses -------------------------------------------------------------------------
    def _input(self, node: Any, fn: str) -> Tensor:
        var = self.env.get(node) if isinstance(node, Ref) else None
        if var not in self.vars:
            raise NotCovered(f"{fn} of a computed tensor is not covered: the loss family's row kernel reads "
                             "the forward's inputs directly")
        return self.vars[var]

    def _row_loss(self, fn: str, b: dict[str, Any], red: str) -> str:
        """The row loss' facts; the reduced value, or ROW_VALUES for reduction='none' (then a mean or a
        sum of it divides by the rows, where cross entropy's own mean divides by the rows not ignored)."""
        if self.term is not None or self.rows is not None:
            raise NotCovered("the loss family covers one reduction in the forward")
        if fn == "cross_entropy":
            x, t = self._input(b["input"], fn), self._input(b["target"], fn)
            if len(x.shape) != 2:
                raise NotCovered(f"cross_entropy over a rank-{len(x.shape)} input: the loss family covers (N, C) "
                                 "logits")
            if t.dtype != "int64":
                kind = "class-probability" if t.shape == x.shape else t.dtype
                raise NotCovered(f"cross_entropy with {kind} targets is not covered (int64 class indices are)")
            if t.shape != x.shape[:1]:
                raise NotCovered("cross_entropy targets do not match the logits' rows")
            if _finite(b["label_smoothing"], "cross_entropy label_smoothing") != 0.0:
                raise NotCovered("cross_entropy with label smoothing is not covered by the loss family")
            if isinstance(b["ignore_index"], bool) or not isinstance(b["ignore_index"], int):
                raise NotCovered(f"cross_entropy ignore_index={b['ignore_index']!r} is not covered")
            self.rows = dict(kind="cross_entropy", inputs=[x.name, t.name], ignore_index=b["ignore_index"],
                             loss=f"cross_entropy(reduction={red})")
        else:
            ins = [self._input(b[k], fn) for k in ("anchor", "positive", "negative")]
            if len({t.shape for t in ins}) != 1 or len(ins[0].shape) != 2:
                raise NotCovered("triplet_margin_loss over inputs that are not all (N, D) is not covered")
            p = _finite(b["p"], "triplet_margin_loss p")
            if p <= 0:
                raise NotCovered("triplet_margin_loss with p <= 0 is not covered by the loss family")
            self.rows = dict(kind="triplet", inputs=[t.name for t in ins], margin=_finite(b["margin"], "margin"),
                             p=p, eps=_finite(b["eps"], "eps"), swap=bool(b["swap"]),
                             loss=f"triplet_margin_loss(p={p:g}, reduction={red})")
        rows = self.inputs[self.rows["inputs"][0]].shape[0]
        if red == "none":
            self.rows.update(reduction=None, by_count=False)
            self.shape[ROW_VALUES], self.dtypes[ROW_VALUES] = (rows,), "float"
            return ROW_VALUES
        self.rows.update(reduction=red, by_count=fn == "cross_entropy" and red == "mean")
        return self._reduced()


# ----------------------------------------------------------------------------------------------
def _recognise(g: Graph) -> FamilyMatch | None:
    """A 0-d output reduced from the inputs by mean/sum or a loss call; None for anything else."""
    if g.out.shape != ():
        return None
    ops = {_ATEN.get(n.op, n.op) for n in g.live()}
    if not ops & {*REDUCTIONS, *TERM_LOSSES, *ROW_LOSSES}:
        return None
    if g.out.dtype != "float32":
        raise NotCovered(f"a {g.out.dtype} loss: the loss family computes fp32 losses only")
    return FamilyMatch.of(g, LossTranslator(g).facts())


TERM, ROWS = frozenset({"term"}), frozenset({"rows"})
IDEAS = (
    Entry("loss-term", "One pass over the inputs for a loss that sums elementwise terms: 16-byte loads of UNROLL "
          "groups a thread issued before the first use (a broadcast input indexed by positions that advance with "
          "one compare, no division in the loop), the term in fp32 registers, UNROLL accumulators a thread and "
          "a block sum into one partial per block; a second one-block launch sums the partials in a fixed order "
          "and divides (deterministic, no atomics).", M,
          "reads every input byte once: ~85-95% of DRAM bandwidth expected on the large KernelBench losses "
          "(not measured yet)", "term",
          ({}, {"UNROLL": 8, "BLOCK": 256}), round0=True),
    Entry("loss-rows", "Per-row losses (cross entropy, triplet margin): a warp (TPR threads) a row streams it "
          "once with 16-byte loads (cross entropy: an online max and rescaled sum of exp, one exp an element; "
          "triplet: the p-norm sums of the differences), combines the threads' values in a fixed order and adds "
          "the row's loss to a per-block partial; a one-block launch sums the partials.", M,
          "one DRAM pass over the rows: ~80-90% of bandwidth expected (not measured yet)", "rows", ({}, {"UNROLL": 8}), round0=True),
    Entry("loss-term-persistent", "Grid-stride loop over a capped grid (a few waves of blocks) instead of one "
          "block per BLOCK*UNROLL groups: fewer block reductions and partials, steadier occupancy.", PAR,
          "0-5%; a grid that is not a whole number of resident waves leaves a tail", "term",
          ({"GRID": 8448}, {"GRID": 4224, "UNROLL": 8}), after=TERM),
    Entry("loss-term-ilp", "More bytes in flight a thread: 8 independent 16-byte groups an input, smaller blocks.",
          A, "a few % when the parent is latency-bound", "term", ({"UNROLL": 8, "BLOCK": 128}, {"UNROLL": 2}),
          after=TERM),
    Entry("loss-term-stream", "Streaming loads (ld.global.cs, evict-first) for inputs read exactly once, so that "
          "the broadcast inputs and the partials keep their L2 lines.", M, "0-3%", "term", ({"HINT": 1},),
          after=TERM),
    Entry("loss-rows-width", "Threads a row against rows a block: wider groups (TPR 64-256) for long rows, more "
          "rows a block for short ones.", PAR, "0-10%", "rows",
          ({"TPR": 64, "BLOCK": 256}, {"TPR": 128, "BLOCK": 512}, {"TPR": 16, "BLOCK": 256}), after=ROWS),
    Entry("loss-rows-ilp", "More loads in flight a thread in the row kernel (UNROLL 8) or fewer registers "
          "(UNROLL 2) for more resident warps; streaming loads.", A, "a few %", "rows",
          ({"UNROLL": 8}, {"UNROLL": 2, "BLOCK": 512}, {"HINT": 1}), after=ROWS),
    Entry("loss-final", "Size the one-block launch that sums the partials: fewer threads when there are few "
          "partials (less launch and barrier cost), all 1024 when there are many.", C, "0-2% (a few microseconds)",
          "term", ({"FBLOCK": 256},), after=TERM),
)

LOSS = Family(name=NAME, leads=frozenset({Lead.loss, Lead.reduce}), recognise=_recognise,
              constraints=("a 0-d output", "one mean, sum or loss call", "pointwise terms of the inputs",
                           "scalar ops after it"),
              variants={"term": term_loss, "rows": rows_loss}, ideas=IDEAS)
