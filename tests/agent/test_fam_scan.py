"""The playbook's ``scan`` family (CPU tier): recognition of cumsum/cumprod forms (KernelBench level 1
89-93 and written-here problems) by probing the forward, refusals with their reasons, the fp64
reference of every form, the specs' rendering, resolution, NVRTC compilation and constraints, and
which variants are offered at which shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.scan.build import rows_defaults
from kerngen.agent.playbook.scan.family import SCAN as FAMILY, FORMS, ScanFacts, ScanForm, scan_reference
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.proposer import SearchContext
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

from tests.emu.runner import emulate

KB1 = kernelbench("level1")
needs_kb = pytest.mark.needs_kernelbench

KB_SCANS = {
    "89_cumsum.py": dict(op="sum", reverse=False, exclusive=False, mask=None),
    "90_cumprod.py": dict(op="prod", reverse=False, exclusive=False, mask=None),
    "91_cumsum_reverse.py": dict(op="sum", reverse=True, exclusive=False, mask=None),
    "92_cumsum_exclusive.py": dict(op="sum", reverse=False, exclusive=True, mask=None),
    "93_masked_cumsum.py": dict(op="sum", reverse=False, exclusive=False, mask="mask", mask_dtype="bool"),
}

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, {args}):
        return {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [{dim}]
"""


def _problem(tmp_path: Path, forward: str, shape: tuple[int, ...], dim: int = 1, mask: str = "",
             dtype: str = "float32"):
    inputs = f"torch.rand({shape}, dtype=torch.{dtype})"
    if mask == "bool":
        inputs += f", torch.rand({shape}) > 0.5"
    elif mask == "float32":
        inputs += f", torch.rand({shape})"
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.py"
    path.write_text(PROBLEM.format(args="x, mask" if mask else "x", forward=forward, inputs=inputs, dim=dim))
    return load_problem(str(path))



def _offered(problem) -> list[str]:
    prop = PlaybookProposer(problem)
    return [v.variant for v in prop.offer.offered] if prop.offer is not None else []


# ----- recognition -------------------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name", sorted(KB_SCANS))
def test_recognises_kernelbench_scans(name):
    m = explain(load_problem(str(KB1 / name)))
    assert m.family == "scan"
    assert {k: getattr(m.facts, k) for k in KB_SCANS[name]} == KB_SCANS[name]
    assert m.facts.dim == 1 and m.facts.start == 0 and m.facts.drop == 0


@pytest.mark.parametrize("forward,shape,dim,facts", [
    ("x.cumsum(-1)", (4, 9), 1, dict(op="sum", dim=1, form="inclusive")),
    ("torch.cumprod(x, dim=self.dim)", (6, 5, 3), 0, dict(op="prod", dim=0)),
    ("torch.cumsum(x.narrow(self.dim, 1, x.size(self.dim) - 1), dim=self.dim)", (3, 10), 1,
     dict(start=1, drop=1, exclusive=False)),
    ("torch.cumsum(x[:, :-1], dim=1)", (3, 10), 1, dict(start=0, drop=1)),
    ("torch.cumsum(x.flip(self.dim), self.dim).flip(self.dim) - x", (3, 10), 1, dict(reverse=True, exclusive=True)),
    ("torch.cat((torch.ones_like(x[:, :1]), torch.cumprod(x[:, :-1], dim=1)), dim=1)", (3, 10), 1,
     dict(op="prod", exclusive=True, drop=0)),
])
def test_recognises_the_forms_by_what_the_forward_computes(tmp_path, forward, shape, dim, facts):
    m = explain(_problem(tmp_path, forward, shape, dim=dim))
    assert m.family == "scan"
    assert {k: getattr(m.facts, k) for k in facts} == facts


@pytest.mark.parametrize("mask,args", [("bool", "x * mask"), ("bool", "mask * x"), ("float32", "x * mask")])
def test_recognises_masks(tmp_path, mask, args):
    m = explain(_problem(tmp_path, f"torch.cumsum({args}, dim=self.dim)", (4, 12), mask=mask))
    assert m.facts.mask == "mask" and m.facts.mask_dtype == mask and m.facts.x == "x"
    spec = family_of(m).build(m, "rows")
    assert [a.name for a in spec.steps[0].args] == ["x", "mask", "out"]


@pytest.mark.parametrize("forward,mask,dtype,word", [
    ("torch.cummax(x, dim=1).values", "", "float32", "cummax"),
    ("torch.logcumsumexp(x, dim=1)", "", "float32", "logcumsumexp"),
    ("torch.cumsum(torch.softmax(x, dim=1), dim=1)", "", "float32", "softmax"),
    ("torch.cumsum(x, dim=1) / 2", "", "float32", "div around it"),
    ("torch.cumsum(x, dim=1)", "", "float16", "fp32 only"),
    ("torch.cumsum(x * 2, dim=1)", "", "float32", "none of the scan forms"),
    ("torch.cumsum(x, dim=1) + torch.cumsum(x, dim=1)", "", "float32", "more than one"),
])
def test_refuses_what_it_does_not_cover(tmp_path, forward, mask, dtype, word):
    p = _problem(tmp_path, forward, (4, 12), mask=mask, dtype=dtype)
    with pytest.raises(NotCovered, match=word):
        FAMILY.recognise(trace(p))


@pytest.mark.parametrize("forward", ["torch.relu(x)", "torch.sum(x, dim=1)", "torch.softmax(x, dim=1)"])
def test_leaves_other_problems_to_other_families(tmp_path, forward):
    assert FAMILY.recognise(trace(_problem(tmp_path, forward, (4, 12)))) is None


# ----- the forms' reference -------------------------------------------------------------------------
def test_reference_forms_match_their_torch_spelling():
    x = torch.rand(3, 8, dtype=torch.float64) + 0.5
    m = torch.rand(3, 8) > 0.5
    ref = scan_reference
    assert torch.equal(ref(x, None, 1, "sum", ScanForm()), torch.cumsum(x, 1))
    assert torch.allclose(ref(x, None, 1, "sum", ScanForm(reverse=True)), torch.cumsum(x.flip(1), 1).flip(1))
    excl = torch.cat((torch.zeros(3, 1, dtype=x.dtype), torch.cumsum(x[:, :-1], 1)), 1)
    assert torch.equal(ref(x, None, 1, "sum", ScanForm(exclusive=True)), excl)
    assert torch.equal(ref(x, None, 1, "prod", ScanForm(start=1, drop=1)), torch.cumprod(x[:, 1:], 1))
    assert torch.equal(ref(x, m, 0, "sum", ScanForm()), torch.cumsum(x * m, 0))
    assert torch.allclose(ref(x, None, 1, "sum", ScanForm(reverse=True, exclusive=True)),
                          torch.cumsum(x.flip(1), 1).flip(1) - x)


def test_the_probe_tells_every_form_apart():
    """No two forms (over every dim) agree on the probe's data, so a forward matches at most one."""
    x = torch.rand(5, 7, dtype=torch.float64) + 0.5
    outs = [(d, f, scan_reference(x, None, d, op, f)) for op in ("sum", "prod") for d in (0, 1) for f in FORMS]
    for i, (d1, f1, a) in enumerate(outs):
        for d2, f2, b in outs[i + 1:]:
            assert a.shape != b.shape or not torch.allclose(a, b, rtol=1e-5, atol=1e-5), (d1, f1, d2, f2)


# ----- specs and variants ---------------------------------------------------------------------------
def _compile(spec, m, config=None, tensors=None):
    r = plan.resolve(spec, sizes={}, tensors=tensors or m.tensor_facts(), config=config)
    compiled = compile_job(job_for(spec, r, "sm_90"), cache=None)
    for res in compiled.info.kernels.values():
        assert res.spill_stores == 0
    return r


@needs_kb
@pytest.mark.parametrize("name", sorted(KB_SCANS))
def test_kernelbench_rows_kernels_compile(name):
    m = explain(load_problem(str(KB1 / name)))
    spec = family_of(m).build(m, "rows")
    assert spec.name == FAMILY.spec_name("rows")
    assert all(spec.defaults[k] in v and v == sorted(v) for k, v in spec.tunables.items())
    r = _compile(spec, m)
    assert r.config["VEC"] == 4 and r.launches[0].grid[0] * (r.config["BLOCK"] // r.config["TPR"]) >= 32768
    _compile(spec, m, {"VEC": 1, "ITEMS": 8, "CACHE_HINT": 1})
    _compile(spec, m, {"TPR": 32, "BLOCK": 256, "ITEMS": 1})


@needs_kb
def test_kernelbench_offers_rows_only():
    """32768 rows fill the GPU (no split pass), the scanned dim is the last (no column kernel)."""
    assert _offered(load_problem(str(KB1 / "89_cumsum.py"))) == ["rows"]


@pytest.mark.parametrize("forward,shape,dim,mask,want", [
    ("torch.cumsum(x, dim=self.dim)", (4, 50000), 1, "", ["rows", "split"]),  # few long rows
    ("torch.cumsum(x, dim=self.dim)", (300, 7, 33), 1, "", ["cols"]),  # an outer dim
    # odd rows: scalar loads; split still finds short chunks (32 threads, 1 value each) for 64 rows
    ("torch.cumprod(x.flip(self.dim), self.dim).flip(self.dim)", (64, 1001), 1, "", ["rows", "split"]),
    ("torch.cumsum(x * mask, dim=self.dim)", (2, 40000), 1, "bool", ["rows", "split"]),
])
def test_variants_offered_and_compiled(tmp_path, forward, shape, dim, mask, want):
    p = _problem(tmp_path, forward, shape, dim=dim, mask=mask)
    assert _offered(p) == want
    m = explain(p)
    for variant in want:
        spec = family_of(m).build(m, variant)
        r = _compile(spec, m)
        if variant == "split":
            op = m.facts.op
            assert [s.kernel for s in r.launches] == [f"cum{op}_chunk_totals", f"cum{op}_chunk_offsets", f"cum{op}_chunks"]
            assert r.scratch[0].size == shape[0] * r.defines["NCH"] and r.defines["NCH"] >= 2
        if shape[dim] % 4 and variant != "cols":
            assert r.config["VEC"] == 1


def test_vector_loads_need_aligned_rows(tmp_path):
    m = explain(_problem(tmp_path, "torch.cumsum(x, dim=self.dim)", (8, 1000), dim=1))
    spec = family_of(m).build(m, "rows")
    assert plan.resolve(spec, sizes={}, tensors=m.tensor_facts()).config["VEC"] == 4
    facts = m.tensor_facts()
    facts["x"] = facts["out"] = TensorFacts((8, 1002))
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(spec, sizes={}, tensors=facts)  # 1002 floats a row: rows start 8-byte aligned only
    plan.resolve(spec, sizes={}, tensors=facts, config={"VEC": 1})


def test_narrowed_scans_read_from_their_offset(tmp_path):
    m = explain(_problem(tmp_path, "torch.cumsum(x.narrow(self.dim, 1, x.size(self.dim) - 1), dim=self.dim)",
                         (3, 64), dim=1))
    r = plan.resolve(family_of(m).build(m, "rows"), sizes={}, tensors=m.tensor_facts())
    assert (r.defines["XOFF"], r.defines["LIN"], r.defines["LOUT"]) == (1, 64, 63) and r.config["VEC"] == 1


@pytest.mark.parametrize("length,tpr", [(10, 32), (1000, 64), (4096, 256), (32768, 512), (10**6, 512)])
def test_rows_defaults_cover_the_row_with_few_tiles(length, tpr):
    d = rows_defaults(length, 4)
    assert d["TPR"] == tpr and d["BLOCK"] % d["TPR"] == 0 and d["BLOCK"] >= 256


def test_proposer_rounds(tmp_path):
    prop = PlaybookProposer(_problem(tmp_path, "torch.cumsum(x, dim=self.dim)", (8, 30000), dim=1))
    assert prop.match is not None
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()}, gpu=GpuFacts(name="H100"))
    first = prop.ideas(ctx, None, 3)
    assert [i.text for i in first] == [e.text for e in FAMILY.ideas if e.round0 and e.variant != "cols"]
    for idea in first:
        branches = prop.implement(ctx, None, idea, 2)
        assert branches and all(b.spec is not None for b in branches)


# ----- the kernels on the CPU emulator against PyTorch -------------------------------------------------
needs_emulator = pytest.mark.needs_cxx


def _at_shape(facts: dict | ScanFacts, shape: tuple[int, ...]) -> FamilyMatch:
    """A scan match with ``facts``' form over an x of ``shape`` (the family's own facts)."""
    facts = dict(facts) if isinstance(facts, dict) else facts.model_dump()
    dim, mask = facts["dim"], facts["mask_dtype"]
    out = shape[:dim] + (shape[dim] - facts["drop"],) + shape[dim + 1:]
    inputs = [Tensor("x", shape, "float32")] + ([Tensor("mask", shape, mask)] if mask else [])
    return FamilyMatch("scan", inputs, [], [Tensor("out", out, "float32")],
                       facts=ScanFacts(**{**facts, "x": "x", "mask": "mask" if mask else None}))


def _emulated(m: FamilyMatch, variant: str, config: dict | None = None) -> None:
    f = m.facts
    gen = torch.Generator().manual_seed(11)
    shape = m.x.shape
    # products of factors near 1 neither vanish nor explode over a few thousand of them; sums see N(0, 1)
    x = torch.rand(shape, generator=gen) * 0.2 + 0.9 if f.op == "prod" else torch.randn(shape, generator=gen)
    tensors = {"x": x, "out": torch.full(m.outputs[0].shape, 12345.0)}  # every element must be written
    if f.mask_dtype == "bool":
        tensors["mask"] = torch.rand(shape, generator=gen) > 0.5
    elif f.mask_dtype == "float32":
        tensors["mask"] = torch.rand(shape, generator=gen)
    emulate(family_of(m).build(m, variant), tensors, config=config)
    form = ScanForm(f.reverse, f.exclusive, f.start, f.drop)
    want = scan_reference(x, tensors.get("mask"), f.dim, f.op, form)
    got = tensors["out"].double()
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert ((got - want).norm() / want.norm()).item() < 1e-5  # the harness's relative-error limit for fp32


@needs_emulator
@needs_kb
@pytest.mark.parametrize("name", sorted(KB_SCANS))
def test_kernelbench_default_kernels_match_pytorch_on_the_emulator(name):
    """Each KernelBench scan's form with its default configuration at 3 rows of 3000 (one tile each)."""
    m = explain(load_problem(str(KB1 / name)))
    _emulated(_at_shape(m.facts, (3, 3000)), "rows")


FORM = dict(op="sum", dim=1, mask_dtype=None, reverse=False, exclusive=False, start=0, drop=0, form="")


@needs_emulator
@pytest.mark.parametrize("facts,shape,variant,config", [
    # several tiles a row (carried), several rows a block, a last block half full
    (dict(FORM, mask_dtype="bool"), (5, 1200), "rows", {"TPR": 32, "ITEMS": 2, "BLOCK": 128}),
    (dict(FORM, mask_dtype="bool"), (5, 1200), "rows", {"TPR": 32, "ITEMS": 2, "BLOCK": 128, "PF": 1}),
    (dict(FORM, op="prod", reverse=True, exclusive=True), (3, 1000), "rows",
     {"TPR": 64, "ITEMS": 1, "BLOCK": 256, "CACHE_HINT": 1}),
    (dict(FORM, reverse=True), (2, 999), "rows", {"TPR": 64, "ITEMS": 4, "BLOCK": 64, "VEC": 1}),
    (dict(FORM, start=1, drop=1, mask_dtype="float32"), (3, 257), "rows", {}),
    (dict(FORM, drop=1), (3, 257), "rows", {"TPR": 32, "ITEMS": 8, "BLOCK": 128}),
    (dict(FORM, exclusive=True, mask_dtype="bool"), (3, 5000), "split", {}),
    (dict(FORM, reverse=True), (3, 5000), "split", {"PF": 1, "CHUNK_TILES": 2, "TPR": 64, "BLOCK": 64}),
    (dict(FORM, op="prod", reverse=True), (2, 3001), "split", {"CHUNK_TILES": 1, "TPR": 32, "BLOCK": 32}),
    (dict(FORM, op="prod", dim=0, exclusive=True, mask_dtype="bool"), (40, 3, 7), "cols", {}),
    (dict(FORM, dim=1, reverse=True, start=1, drop=1), (4, 30, 9), "cols", {"UNROLL": 8, "BLOCK": 64}),
])
def test_forms_and_configs_match_pytorch_on_the_emulator(facts, shape, variant, config):
    _emulated(_at_shape(facts, shape), variant, config)
