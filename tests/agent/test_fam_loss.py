"""The playbook's loss family (CPU tier): which forwards it claims, refuses or leaves to others; the
loss formulas it writes out (its IR evaluated with torch ops against PyTorch's own losses); the
broadcast layout of a term's inputs; every variant's spec resolving and compiling with NVRTC for
sm_90 at default and sampled configurations; the proposer's round 0. Kernels run on the CPU through
the emulator of tests/emu when it is there (``test_kernels_on_the_emulator``)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from kerngen.errors import SpecError
import torch
import torch.nn.functional as F

from kerngen.agent.playbook import family_of, PlaybookProposer, explain, seed_specs
from kerngen.agent.playbook.loss import family as fam_loss
from kerngen.agent.playbook.loss.build import f32_literal, term_layout
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from tests.agent.spec_samples import sampled_plans
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

from tests.emu.runner import emulate

KB = kernelbench("level1")
KB_LOSSES = {  # file -> (kind, variant)
    "94_MSELoss.py": ("term", "term"),
    "95_CrossEntropyLoss.py": ("cross_entropy", "rows"),
    "96_HuberLoss.py": ("term", "term"),
    "98_KLDivLoss.py": ("term", "term"),
    "99_TripletMarginLoss.py": ("triplet", "rows"),
    "100_HingeLoss.py": ("term", "term"),
}
needs_kb = pytest.mark.needs_kernelbench

PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
{body}


def get_inputs():
{inputs}


def get_init_inputs():
    return []
'''


def _write(tmp_path: Path, name: str, args: str, body: str, inputs: str, init: str = "pass") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(init=textwrap.indent(init, " " * 8), args=args,
                                   body=textwrap.indent(body, " " * 8), inputs=textwrap.indent(inputs, " " * 4)))
    return path


def _pair(shape_p: str, shape_t: str) -> str:
    return f"return [torch.rand({shape_p}), torch.rand({shape_t})]"


# name -> (forward args, body, get_inputs body): small shapes, every term loss the family writes out
TERM_CASES = {
    "mse": ("p, t", "return torch.mean((p - t) ** 2)", _pair("64, 37", "64, 37")),
    "mse_call_sum": ("p, t", "return F.mse_loss(p, t, reduction='sum')", _pair("33, 35", "33, 35")),
    "l1": ("p, t", "return F.l1_loss(p, t)", _pair("50, 40", "50, 40")),
    "smooth_l1": ("p, t", "return F.smooth_l1_loss(p * 3, t)", _pair("40, 41", "40, 41")),
    "smooth_l1_beta": ("p, t", "return F.smooth_l1_loss(p, t, beta=0.25)", _pair("40, 41", "40, 41")),
    "smooth_l1_beta0": ("p, t", "return F.smooth_l1_loss(p, t, beta=0.0)", _pair("16, 8", "16, 8")),
    "huber": ("p, t", "return F.huber_loss(p * 4, t, delta=2.0)", _pair("40, 41", "40, 41")),
    "kl": ("p, t", "return F.kl_div(torch.log(p), t, reduction='batchmean')",
           "return [torch.rand(32, 50).softmax(-1), torch.rand(32, 50).softmax(-1)]"),
    "kl_log_target": ("p, t", "return F.kl_div(p, t, reduction='sum', log_target=True)",
                      "return [torch.randn(32, 50), torch.randn(32, 50)]"),
    "kl_zero_target": ("p, t", "return F.kl_div(torch.log(p), t * (t > 0.5), reduction='batchmean')",
                       _pair("30, 20", "30, 20")),
    "bce": ("p, t", "return F.binary_cross_entropy(p, t)", _pair("30, 20", "30, 20")),
    "bce_logits": ("p, t", "return F.binary_cross_entropy_with_logits(p * 8 - 4, t)", _pair("30, 20", "30, 20")),
    "soft_margin": ("p, t", "return F.soft_margin_loss(p, t * 2 - 1)", _pair("30, 20", "30, 20")),
    "hinge": ("p, t", "return torch.mean(torch.clamp(1 - p * t, min=0))",
              "return [torch.rand(48, 48), torch.randint(0, 2, (48,)).float() * 2 - 1]"),
    "column_broadcast": ("p, t", "return (torch.abs(p - t)).sum() / 7", _pair("24, 30", "24, 1")),
    "rmse": ("p, t", "return torch.sqrt(F.mse_loss(p, t)) * 2 + 1", _pair("17, 23", "17, 23")),
    "module_mse": ("p, t", "return self.loss(p, t)", _pair("20, 12", "20, 12")),
    "none_then_sum": ("p, t", "return F.l1_loss(p, t, reduction='none').sum() * 0.5", _pair("20, 12", "20, 12")),
}
ROW_CASES = {  # the same for the row losses
    "ce": ("x, t", "return F.cross_entropy(x, t)", "return [torch.randn(64, 40), torch.randint(0, 40, (64,))]"),
    "ce_odd_sum": ("x, t", "return F.cross_entropy(x, t, reduction='sum', ignore_index=3)",
                   "return [torch.randn(37, 101), torch.randint(0, 101, (37,))]"),
    "ce_none_mean": ("x, t", "return F.cross_entropy(x, t, reduction='none').mean()",
                     "return [torch.randn(64, 40), torch.randint(0, 40, (64,))]"),
    "triplet": ("a, p, n", "return F.triplet_margin_loss(a, p, n, margin=0.5)",
                "return [torch.rand(33, 64), torch.rand(33, 64), torch.rand(33, 64)]"),
    "triplet_swap_p1": ("a, p, n", "return F.triplet_margin_loss(a, p, n, p=1, swap=True, reduction='sum')",
                        "return [torch.rand(19, 30), torch.rand(19, 30), torch.rand(19, 30)]"),
    "triplet_p3": ("a, p, n", "return F.triplet_margin_loss(a, p, n, p=3.0, eps=1e-3)",
                   "return [torch.rand(8, 12), torch.rand(8, 12), torch.rand(8, 12)]"),
    "triplet_none_sum": ("a, p, n", "return torch.sum(self.loss(a, p, n))",
                         "return [torch.rand(8, 12), torch.rand(8, 12), torch.rand(8, 12)]"),
}
INIT = {"module_mse": "self.loss = nn.MSELoss(reduction='sum')",
        "triplet_none_sum": "self.loss = nn.TripletMarginLoss(reduction='none')"}


def _problem(tmp_path: Path, name: str, case: tuple | None = None):
    args, body, inputs = case or {**TERM_CASES, **ROW_CASES}[name]
    return load_problem(str(_write(tmp_path, name, args, body, inputs, INIT.get(name, "pass"))))


# ----- recognition ---------------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name", sorted(KB_LOSSES))
def test_recognises_the_kernelbench_losses(name):
    m = explain(load_problem(str(KB / name)))
    assert m.family == "loss"
    assert m.facts.kind == KB_LOSSES[name][0]


@needs_kb
def test_kernelbench_facts():
    kl = explain(load_problem(str(KB / "98_KLDivLoss.py"))).facts
    assert kl.div_dims == (0,) and kl.loss == "kl_div(reduction=batchmean)"  # batchmean: / batch size
    hinge = explain(load_problem(str(KB / "100_HingeLoss.py")))
    assert hinge.facts.term_shape == (32768, 32768) and hinge.facts.div_dims == (0, 1)
    lay = term_layout([(t, f"in_{t.name}") for t in hinge.inputs], hinge.facts.term_shape)
    assert [i.mode for i in lay.inputs] == ["full", "vec"]  # targets (N,) broadcast along the rows
    ce = explain(load_problem(str(KB / "95_CrossEntropyLoss.py"))).facts
    assert ce.inputs == ("predictions", "targets") and ce.ignore_index == -100 and ce.reduction == "mean"
    tr = explain(load_problem(str(KB / "99_TripletMarginLoss.py"))).facts
    assert (tr.margin, tr.p, tr.eps, tr.swap) == (1.0, 2.0, 1e-6, False)


NOT_MINE = {  # forwards the family leaves to the other families (recognise returns None)
    "per_element": ("p, t", "return F.mse_loss(p, t, reduction='none')", _pair("8, 8", "8, 8")),
    "dot": ("a, b", "return torch.dot(a, b)", "return [torch.rand(64), torch.rand(64)]"),
    "row_mean": ("x", "return torch.mean(x, dim=1)", "return [torch.rand(8, 16)]"),
}


@pytest.mark.parametrize("name", sorted(NOT_MINE))
def test_leaves_other_problems_to_other_families(tmp_path, name):
    p = _problem(tmp_path, name, NOT_MINE[name])
    assert fam_loss.LOSS.recognise(trace(p)) is None


REFUSED = {  # losses the family owns but cannot serve: the reason names what is missing
    "ce_smoothing": ("x, t", "return F.cross_entropy(x, t, label_smoothing=0.1)",
                     "return [torch.rand(8, 10), torch.randint(0, 10, (8,))]", "label smoothing"),
    "ce_probabilities": ("x, t", "return F.cross_entropy(x, t)",
                         "return [torch.rand(8, 10), torch.rand(8, 10).softmax(-1)]", "class-probability"),
    "ce_computed": ("x, t", "return F.cross_entropy(x * 2, t)",
                    "return [torch.rand(8, 10), torch.randint(0, 10, (8,))]", "computed tensor"),
    "ce_4d": ("x, t", "return F.cross_entropy(x, t)",
              "return [torch.rand(2, 5, 4, 4), torch.randint(0, 5, (2, 4, 4))]", "rank-4"),
    "row_then_mean": ("p, t", "return torch.mean(torch.norm(p - t, dim=1))", _pair("8, 16", "8, 16"), "norm"),
    "row_losses_scaled": ("x, t", "return (F.cross_entropy(x, t, reduction='none') * 2).mean()",
                          "return [torch.rand(8, 10), torch.randint(0, 10, (8,))]", "per-row losses"),
    "two_reductions": ("p, t", "return p.mean() + t.sum()", _pair("8, 16", "8, 16"), "one reduction"),
    "partial_mean": ("p, t", "return torch.mean(torch.mean(p - t, dim=1))", _pair("8, 16", "8, 16"), "per-row"),
    "inner_broadcast": ("p, t", "return torch.mean((p - t) ** 2)", _pair("4, 5, 8", "4, 1, 8"), "inside"),
    "int_term": ("p, t", "return torch.mean((p - t) ** 2)",
                 "return [torch.rand(8, 8), torch.randint(0, 3, (8, 8))]", "int64"),
    "half": ("p, t", "return torch.mean((p - t) ** 2)",
             "return [torch.rand(8, 8).half(), torch.rand(8, 8).half()]", "fp32"),
    "triplet_shapes": ("a, p, n", "return F.triplet_margin_loss(a, p, n)",
                       "return [torch.rand(8, 16), torch.rand(8, 16), torch.rand(1, 16)]", "(N, D)"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refuses_losses_it_cannot_serve(tmp_path, name):
    *case, word = REFUSED[name]
    p = _problem(tmp_path, name, tuple(case))
    with pytest.raises(NotCovered, match=word):
        fam_loss.LOSS.recognise(trace(p))


def test_refuses_a_weighted_loss_module(tmp_path):
    path = _write(tmp_path, "ce_weight", "x, t", "return self.loss(x, t)",
                  "return [torch.rand(8, 10), torch.randint(0, 10, (8,))]",
                  init="self.loss = nn.CrossEntropyLoss(weight=torch.ones(10))")
    with pytest.raises(NotCovered, match="weight"):
        fam_loss.LOSS.recognise(trace(load_problem(str(path))))


# ----- the formulas: the IR evaluated with torch ops against PyTorch ---------------------------
def _cst(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


IR_OPS = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "abs": torch.abs, "neg": torch.neg,
    "exp": torch.exp, "log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt, "logsigmoid": F.logsigmoid,
    "maximum": torch.maximum, "minimum": torch.minimum, "where": torch.where,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
    "pow": torch.pow, "clamp": lambda a, lo, hi: torch.clamp(a, lo, hi),
}


def _evaluate(chain, env: dict) -> torch.Tensor:
    env = dict(env)
    for n in chain.nodes:
        args = [env[a] if isinstance(a, str) else _cst(a) for a in n.args]
        env[n.var] = IR_OPS[n.op](*args, *n.params)
    r = chain.result
    return env[r] if isinstance(r, str) else _cst(r)


def _loss_from_facts(m, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    f = m.facts
    env = {var: inputs[name] for name, var in f.terms}
    shape = torch.broadcast_shapes(*(t.shape for t in env.values()))
    term = _evaluate(f.chain, env).expand(shape)
    div = math.prod(shape[d] for d in f.div_dims)
    s = term.double().sum().float() / div
    return _evaluate(f.post_chain, {"s": s})


@pytest.mark.parametrize("name", sorted(TERM_CASES))
def test_term_formulas_match_pytorch(tmp_path, name):
    p = _problem(tmp_path, name)
    m = explain(p)
    assert m.family == "loss" and m.facts.kind == "term"
    model = p.build_model("cpu", 0)
    inputs = p.make_inputs("cpu", 1)
    want = p.run_reference(model, inputs)[0]
    got = _loss_from_facts(m, dict(zip([t.name for t in m.inputs], inputs)))
    assert got.shape == () and torch.isfinite(want)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)


def test_kl_div_zero_targets_as_pytorch(tmp_path):
    # xlogy(t, t) - t * input: a zero target adds 0, unless the input is -inf (0 * -inf: NaN in PyTorch)
    m = explain(_problem(tmp_path, "kl"))
    tgt = torch.tensor([[0.0, 0.5], [0.0, 1.0]])
    for inp in (torch.tensor([[0.3, 0.5], [0.2, 0.8]]), torch.tensor([[0.0, 0.5], [0.2, 0.8]])):
        want = F.kl_div(torch.log(inp), tgt, reduction="batchmean")
        got = _loss_from_facts(m, {"p": inp, "t": tgt})
        torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isnan(got)


def test_descriptions_name_the_loss(tmp_path):
    m = explain(_problem(tmp_path, "rmse"))
    assert m.facts.loss == "mse_loss(reduction=mean)"
    assert "sqrt" in m.facts.post_formula and m.facts.post_expr != "s"
    m = explain(_problem(tmp_path, "hinge"))
    assert m.facts.loss.startswith("mean(") and "p * t" in m.facts.formula


# ----- broadcast layout --------------------------------------------------------------------------
def _lay(*shapes: tuple[int, ...]):
    ts = [(Tensor(f"x{k}", s, "float32"), f"in_x{k}") for k, s in enumerate(shapes)]
    nd = max(len(s) for s in shapes)
    term = tuple(max(s[d - (nd - len(s))] if d >= nd - len(s) else 1 for s in shapes) for d in range(nd))
    return term_layout(ts, term)


def test_layout_modes():
    assert [i.mode for i in _lay((64, 32), (64, 32)).inputs] == ["full", "full"]
    row = _lay((64, 32), (32,))
    assert (row.inputs[1].mode, row.inputs[1].inner, row.inputs[1].size) == ("vec", "1", "x0.shape[1]")
    assert "x1.shape[0] == x0.shape[1]" in row.constraints and "x1.ndim == 1" in row.constraints
    lane = _lay((64, 32), (64, 1))
    assert (lane.inputs[1].mode, lane.inputs[1].inner, lane.inputs[1].size) == ("lane", "x0.shape[1]", "x0.shape[0]")
    assert "x1.shape[1] == 1" in lane.constraints
    assert _lay((64, 30), (64, 1)).inputs[1].mode == "elem"  # 30 terms a row: groups of 4 straddle rows
    assert _lay((64, 30), (30,)).inputs[1].mode == "elem"
    assert _lay((64, 32), (1, 1)).inputs[1].mode == "one"
    assert _lay((8, 64, 32), (64, 32)).inputs[1].mode == "vec"
    mid = _lay((8, 64, 32), (64, 1)).inputs[1]
    assert (mid.mode, mid.inner, mid.size) == ("lane", "x0.shape[2]", "x0.shape[1]")
    outer = _lay((8, 1), (1, 12))  # both broadcast: the term is 8x12
    assert [(i.mode, i.inner, i.size) for i in outer.inputs] == [("lane", "x1.shape[1]", "x0.shape[0]"),
                                                                 ("vec", "1", "x1.shape[1]")]
    assert outer.n == "x0.shape[0] * x1.shape[1]"
    with pytest.raises(NotCovered, match="inside"):
        _lay((8, 5, 12), (8, 1, 12))


def test_f32_literal():
    assert f32_literal(1.0) == "1.0f" and f32_literal(-100) == "(-100.0f)" and f32_literal(1e-6) == "9.99999997e-07f"
    with pytest.raises(ValueError):
        f32_literal(float("inf"))


# ----- specs: resolution, constraints, NVRTC compilation ------------------------------------------

def _compile(spec, resolved) -> None:
    compiled = compile_job(job_for(spec, resolved, "sm_90"), cache=None)
    assert "warning" not in compiled.info.log, compiled.info.log
    assert "0 bytes spill stores" in compiled.info.log



@pytest.mark.parametrize("name,reduction,by_count,div", [
    ("ce", "mean", True, 1),  # cross entropy's own mean: over the rows not ignored, counted on the GPU
    ("ce_odd_sum", "sum", False, 1),
    ("ce_none_mean", "mean", False, 64),  # reduction='none' then .mean(): ignored rows count as 0 over all rows
    ("triplet", "mean", False, 33),
    ("triplet_none_sum", "sum", False, 1),
])
def test_row_loss_reductions(tmp_path, name, reduction, by_count, div):
    m = explain(_problem(tmp_path, name))
    assert (m.facts.reduction, m.facts.by_count) == (reduction, by_count)
    spec = family_of(m).build(m, "rows")
    final = plan.resolve(spec, sizes={}, tensors=m.tensor_facts()).launches[1]
    assert final.args[-1].value == div
    assert ("(double)c;" in spec.source) == by_count


def test_specs_resolve_and_compile(tmp_path):
    for name in [*TERM_CASES, *ROW_CASES]:
        m = explain(_problem(tmp_path, name))
        variant = "term" if name in TERM_CASES else "rows"
        other = "rows" if variant == "term" else "term"
        with pytest.raises(ValueError, match=f"variant {variant}"):
            family_of(m).build(m, other)  # the other variant says which one serves this loss
        spec = family_of(m).build(m, variant)
        assert spec.name == fam_loss.LOSS.spec_name(variant) and variant_of_spec(spec) == variant
        assert "atomic" not in spec.source  # partials summed in a fixed order
        assert all(v == sorted(v) and spec.defaults[k] in v for k, v in spec.tunables.items())
        facts = m.tensor_facts()
        default = plan.resolve(spec, sizes={}, tensors=facts)
        assert [s.kernel for s in default.launches][1].endswith("_final")
        for resolved in [default] + sampled_plans(spec, facts, 2 if name in ("mse", "ce", "triplet") else 0):
            _compile(spec, resolved)


@needs_kb
@pytest.mark.parametrize("name", sorted(KB_LOSSES))
def test_kernelbench_specs_compile(name):
    m = explain(load_problem(str(KB / name)))
    spec = family_of(m).build(m, KB_LOSSES[name][1])
    facts = m.tensor_facts()
    for resolved in [plan.resolve(spec, sizes={}, tensors=facts)] + sampled_plans(spec, facts, 2):
        _compile(spec, resolved)


def test_constraints_reject_other_shapes(tmp_path):
    m = explain(_problem(tmp_path, "hinge"))  # p (48, 48), t (48,) broadcast along the rows
    spec = family_of(m).build(m, "term")
    plan.resolve(spec, sizes={}, tensors={"p": TensorFacts((96, 48)), "t": TensorFacts((48,)),
                                          "out": TensorFacts(())})
    for bad, why in (({"p": (48, 48), "t": (47,)}, r"t\.shape\[0\] == p\.shape\[1\]"),
                     ({"p": (48, 48), "t": (48, 1)}, r"t\.ndim == 1"), ({"p": (48, 48, 2), "t": (48,)}, r"p\.ndim == 2")):
        with pytest.raises(SpecError, match=f"^constraint violated: {why}$"):
            plan.resolve(spec, sizes={}, tensors={**{k: TensorFacts(v) for k, v in bad.items()},
                                                  "out": TensorFacts(())})
    ce = explain(_problem(tmp_path, "ce"))
    spec = family_of(ce).build(ce, "rows")
    with pytest.raises(SpecError, match=r"constraint violated: \(x\.shape\[1\]\) % 4 == 0"):  # 16-byte row loads
        plan.resolve(spec, sizes={}, tensors={"x": TensorFacts((64, 42)), "t": TensorFacts((64,)),
                                              "out": TensorFacts(())})
    with pytest.raises(SpecError, match=r"constraint violated: t\.shape\[0\] == x\.shape\[0\]"):
        plan.resolve(spec, sizes={}, tensors={"x": TensorFacts((64, 40)), "t": TensorFacts((63,)),
                                              "out": TensorFacts(())})


def test_term_grid_and_partials(tmp_path):
    m = explain(_problem(tmp_path, "mse"))  # 64 x 37 = 2368 terms: 592 groups of 4
    spec = family_of(m).build(m, "term")
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config={**spec.default_config(), "BLOCK": 128, "UNROLL": 2})
    assert r.launches[0].grid[0] == 3  # cdiv(592, 256)
    assert [s.size for s in r.scratch] == [3]
    assert r.launches[1].grid[0] == 1 and r.launches[1].args[-2].value == 3  # nparts
    assert r.launches[1].args[-1].value == 64 * 37  # mean: divided by the terms
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config={**spec.default_config(), "GRID": 1056})
    assert r.launches[0].grid[0] == 1  # never more blocks than groups of work


# ----- the proposer ----------------------------------------------------------------------------
@pytest.mark.parametrize("case,variant", [("mse", "term"), ("ce", "rows")])
def test_round0_offers_the_serving_variant(tmp_path, case, variant):
    p = _problem(tmp_path, case)
    prop = PlaybookProposer(p)
    assert prop.match is not None and prop.match.family == "loss"
    assert [v.variant for v in prop.offer.offered] == [variant]
    specs = seed_specs(p)
    assert specs and {variant_of_spec(s) for s in specs} == {variant}


# ----- the kernels on the CPU emulator -------------------------------------------------------------
EMU_CASES = {  # name -> (args, body, inputs), configs besides the default: a few thousand elements each
    "mse_tail": (("p, t", "return torch.mean((p - t) ** 2)", _pair("50, 39", "50, 39")),
                 [{"BLOCK": 128, "UNROLL": 2, "GRID": 1056, "FBLOCK": 256}]),
    "hinge_rows": (TERM_CASES["hinge"], [{"UNROLL": 1}]),
    "hinge_odd": (("p, t", "return torch.mean(torch.clamp(1 - p * t, min=0))",
                   "return [torch.rand(40, 37), torch.randint(0, 2, (37,)).float() * 2 - 1]"), [{"HINT": 1}]),
    "row_and_column": (("p, t, w", "return torch.sum(torch.abs(p - t) * w) / 7",
                        "return [torch.rand(30, 64), torch.rand(30, 1), torch.rand(64)]"), []),
    "grid_stride": (("p, t", "return torch.mean(torch.abs(p - t))", _pair("4224, 257", "4224, 1")),
                    [{"BLOCK": 128, "UNROLL": 1, "GRID": 1056}]),  # 2 loop steps a thread, elem positions
    "kl": (TERM_CASES["kl"], []),
    "smooth_l1": (TERM_CASES["smooth_l1_beta"], []),
    "bce": (TERM_CASES["bce"], []),
    "rmse": (TERM_CASES["rmse"], []),
    "ce_ignored": (("x, t", "return F.cross_entropy(x, t)",
                    "t = torch.randint(0, 101, (37,))\nt[::7] = -100\nreturn [torch.randn(37, 101) * 4, t]"),
                   [{"TPR": 64, "BLOCK": 128, "UNROLL": 2}, {"TPR": 8, "BLOCK": 128, "GRID": 1056}]),
    "ce_vec_sum": (("x, t", "return F.cross_entropy(x, t, reduction='sum')",
                    "return [torch.randn(37, 64) * 4, torch.randint(0, 64, (37,))]"), [{"TPR": 256, "BLOCK": 512}]),
    "ce_none_mean": (("x, t", "return F.cross_entropy(x, t, reduction='none', ignore_index=2).mean()",
                      "return [torch.randn(50, 12), torch.randint(0, 4, (50,))]"), []),
    "ce_grid_stride": (("x, t", "return F.cross_entropy(x, t)",
                        "return [torch.randn(17000, 6), torch.randint(0, 6, (17000,))]"),
                       [{"TPR": 8, "BLOCK": 128, "GRID": 1056}]),  # 2 row groups a block
    "triplet_swap": (("a, p, n", "return F.triplet_margin_loss(a, p, n, margin=0.5, swap=True)",
                      "return [torch.rand(33, 103), torch.rand(33, 103), torch.rand(33, 103)]"),
                     [{"TPR": 64, "BLOCK": 128, "UNROLL": 2}]),
    "triplet_p3": (("a, p, n", "return F.triplet_margin_loss(a, p, n, p=3.0)",
                    "return [torch.rand(21, 64), torch.rand(21, 64), torch.rand(21, 64)]"), [{"TPR": 16, "HINT": 1}]),
}
needs_emu = pytest.mark.needs_cxx


def _emulated(p, m, config: dict, inputs: list) -> torch.Tensor:
    spec = family_of(m).build(m, "term" if m.facts.kind == "term" else "rows")
    tensors = {t.name: x.contiguous() for t, x in zip(m.inputs, inputs)}
    tensors["out"] = torch.full((), float("nan"))
    emulate(spec, tensors, config={**spec.default_config(), **config})
    return tensors["out"]


@needs_emu
@pytest.mark.parametrize("name", sorted(EMU_CASES))
def test_kernels_on_the_emulator(tmp_path, name):
    case, configs = EMU_CASES[name]
    p = _problem(tmp_path, name, case)
    m = explain(p)
    xs = p.make_inputs("cpu", 2)
    want = p.run_reference(p.build_model("cpu", 0), xs)[0]
    for config in [{}] + configs:
        got = _emulated(p, m, config, xs)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda s: f"{name} {config}: {s}")
        assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))  # the harness' relative-error limit


@needs_emu
def test_cross_entropy_target_out_of_range_gives_nan(tmp_path):
    # PyTorch raises on such a target; the kernel reads nothing out of bounds and the loss is NaN
    p = _problem(tmp_path, "ce_bad_target", EMU_CASES["ce_vec_sum"][0])
    m = explain(p)
    x, t = p.make_inputs("cpu", 0)
    t[5] = 64
    assert torch.isnan(_emulated(p, m, {}, [x, t]))
    t[5] = 3
    torch.testing.assert_close(_emulated(p, m, {}, [x, t]), F.cross_entropy(x, t, reduction="sum"))
