"""Plain TF32 from the playbook at ``--precision tf32`` (issue 33, item 5), CPU tier: the fp32 GEMM and convolution
families' tensor-core variants (mma.sync ``tf32x3``, Hopper ``wgmma``) offer TERMS 1 and 3 there, 1 by default, and
say so in their specs, ideas and ``kerngen playbook``; at the default precision nothing changes (the specs are
byte-identical to those before, TERMS stays [3]) and no candidate the playbook proposes is plain TF32; the TERMS 1
specs compile with NVRTC (sm_80 for mma.sync, sm_90a for wgmma), and the wgmma pre-pass picks its planes by TERMS
on the CPU emulator. The GPU tier: test_gpu_tf32_terms.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.playbook import PlaybookProposer
from kerngen.agent.playbook.gemm.build_wgmma import PREP_KERNEL, Mode, smem_bytes
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.playbook.render import render
from kerngen.agent.playbook.terms import IDEA, PLAIN_TF32, TERMS_PLAIN, TERMS_SPLIT
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_gemm_wgmma import A100, H100, _ctx, emulate, emulator_available, split
from tests.resources import kernelbench

KB = kernelbench()
CONV_EPI = "level2/1_Conv2D_ReLU_BiasAdd.py"
needs_kb = pytest.mark.skipif(not (KB / CONV_EPI).is_file(), reason="no KernelBench files")
VARIANTS = ("tf32x3", "wgmma")
# (name, source, family, dtype): the matmul family, nn.Linear + GELU (gemm), conv2d, a conv_epi KernelBench file
PROBLEMS = [("matmul", "matmul", "matmul", None), ("linear_gelu", "linear_gelu", "gemm", "float32"),
            ("conv2d", "conv2d", "conv2d", None), ("conv_epi", CONV_EPI, "conv_epi", None)]
# content hashes of the default-precision specs these variants offered (sm_90 limits) before the tf32 hook existed:
# a change here is a change of what every true-fp32 run gets (a template edited on purpose: update them with it;
# conv2d wgmma: its default VEC 4 since bd99d6e; issue 40: matmul's tf32x3 is the gemm family's builder (its layout
# defines and batch grid), the 3xTF32 GEMMs' TERMS constraint admits 1 when asked for, the wgmma pre-passes store
# through one gw_put, matmul's wgmma reads the gemm facts: the same kernels)
BEFORE = {("matmul", "tf32x3"): "a6745bc8daa54e61", ("matmul", "wgmma"): "6e55ba3d2bb4270c",
          ("linear_gelu", "tf32x3"): "6ed38f6cc6e5209f", ("linear_gelu", "wgmma"): "0e91d79062636525",
          ("conv2d", "tf32x3"): "8346bd278d41e4f4", ("conv2d", "wgmma"): "3bfeef6723b783a0",
          ("conv_epi", "tf32x3"): "5fe24b73f74737a3", ("conv_epi", "wgmma"): "c681be6e017fe7ba"}


def _ref(source: str, dtype: str | None, precision: str | None) -> ProblemRef | str:
    if "/" not in source:
        return ProblemRef(source=source, dtype=dtype, precision=precision)
    return ProblemRef(source=str(KB / source), precision=precision)


_PROPS: dict[tuple[str, str | None], PlaybookProposer] = {}


def proposer(name: str, precision: str | None) -> PlaybookProposer:
    """A fresh proposer for the problem at ``precision`` (the traced problem is reused: tracing costs seconds)."""
    _, source, family, dtype = next(p for p in PROBLEMS if p[0] == name)
    key = (name, precision)
    if key not in _PROPS:
        _PROPS[key] = PlaybookProposer(load_problem(_ref(source, dtype, precision)))
    prop = PlaybookProposer(_PROPS[key].problem)
    assert prop.match is not None and prop.match.family == family
    return prop


def _params(name: str):
    return pytest.param(name, marks=needs_kb) if name == "conv_epi" else name


NAMES = [_params(p[0]) for p in PROBLEMS]


# ----- offered at tf32, not at the default ------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_tf32_offers_terms_1_by_default_and_the_default_precision_only_3(name):
    tf32, fp32 = proposer(name, "tf32"), proposer(name, None)
    assert tf32.match.precision == "tf32" and fp32.match.precision is None
    for variant in VARIANTS:
        spec = tf32.offer.get(variant).spec
        assert spec.tunables["TERMS"] == [TERMS_PLAIN, TERMS_SPLIT] and spec.defaults["TERMS"] == TERMS_PLAIN, variant
        assert PLAIN_TF32 in spec.description
        for terms in (TERMS_PLAIN, TERMS_SPLIT):  # both resolve at the problem's shape
            plan.resolve(spec, sizes={}, tensors=tf32.match.tensor_facts(), config={"TERMS": terms})
        base = fp32.offer.get(variant).spec
        assert base.tunables["TERMS"] == [TERMS_SPLIT] and base.defaults["TERMS"] == TERMS_SPLIT
        assert PLAIN_TF32 not in base.description and "tf32_terms" not in base.source
        assert base.content_hash() == BEFORE[(name, variant)], f"{name} {variant}: the default-precision spec changed"


def test_the_wgmma_planes_follow_terms():
    prop = proposer("matmul", "tf32")
    spec = prop.offer.get("wgmma").spec
    assert "#define GW_PLANES ((TERMS + 1) / 2)" in spec.source and "#if TERMS == 3" in spec.source
    facts = prop.match.tensor_facts()
    one, three = (plan.resolve(spec, sizes={}, tensors=facts, config={"TERMS": t}) for t in (1, 3))
    assert [s.size for s in one.scratch] == [4096 * 4096] * 2 and [s.size for s in three.scratch] == [2 * 4096 * 4096] * 2
    views = [[a.view for a in r.launches[-1].args if a.kind == "tensormap"] for r in (one, three)]
    assert views == [[(1, 4096, 4096)] * 2, [(2, 4096, 4096)] * 2]
    cfg = spec.full_config({"TERMS": 1})
    assert one.launches[-1].shared_mem == smem_bytes(cfg, Mode.tf32_terms) == smem_bytes(cfg, Mode.tf32)
    assert three.launches[-1].shared_mem == smem_bytes(spec.full_config({"TERMS": 3}), Mode.tf32x3)
    # the conv core's weights map and scratch follow TERMS too
    conv = proposer("conv2d", "tf32")
    cspec = conv.offer.get("wgmma").spec
    ws = [next(s.size for s in plan.resolve(cspec, sizes={}, tensors=conv.match.tensor_facts(),
                                            config={"TERMS": t}).scratch if s.name == "ws") for t in (1, 3)]
    assert ws[1] == 2 * ws[0]


# ----- what the proposer and kerngen playbook say -----------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_round0_ideas_say_plain_tf32_and_build_it(name):
    prop = proposer(name, "tf32")
    ideas = prop.ideas(_ctx(prop.match, H100), None, 20)
    plain = [i for i in ideas if prop._by_text[i.text].variant in VARIANTS]
    assert {prop._by_text[i.text].variant for i in plain} == set(VARIANTS)
    for idea in plain:
        assert idea.text.startswith(IDEA) and PLAIN_TF32 in idea.text
        (branch, *_) = prop.implement(_ctx(prop.match, H100), None, idea, 1)
        assert branch.spec.defaults["TERMS"] == TERMS_PLAIN and variant_of_spec(branch.spec) in VARIANTS
    fp32 = proposer(name, None)
    assert not any(PLAIN_TF32 in i.text for i in fp32.ideas(_ctx(fp32.match, H100), None, 20))


@pytest.mark.parametrize("name", NAMES)
def test_a_default_precision_run_never_gets_a_plain_tf32_candidate(name):
    """Every branch of every idea of the family at the default precision (what ``implement`` renders), from nothing
    and as a refinement of each round-0 kernel, on Hopper and on an A100: no candidate starts at TERMS 1 or may be
    tuned to it."""
    prop = proposer(name, None)
    seen = 0
    for gpu in (H100, A100):
        ctx = _ctx(prop.match, gpu)
        entries = prop._entries()
        roots = [b.spec for e in entries if e.round0 for b in prop._render(e, ctx, 10)]
        specs = list(roots)
        for spec in roots:
            parent = type("Parent", (), {"spec": spec})()  # what the proposer reads of a NodeSummary
            specs += [b.spec for e in entries if not e.round0 for b in prop._render(e, ctx, 10, parent)]
        assert {variant_of_spec(s) for s in roots} >= ({"tf32x3", "wgmma"} if gpu is H100 else {"tf32x3"})
        for spec in specs:
            if spec is not None and "TERMS" in spec.tunables:
                seen += 1
                assert spec.tunables["TERMS"] == [TERMS_SPLIT] and spec.defaults["TERMS"] == TERMS_SPLIT, spec.name
    assert seen >= 10


def test_kerngen_playbook_shows_terms_1_at_tf32():
    runner = CliRunner()
    res = runner.invoke(kerngen.cli.app.app, ["playbook", "matmul", "--precision", "tf32"])
    assert res.exit_code == 0, res.output
    assert "matmul [tf32]: family matmul" in res.output
    for variant in VARIANTS:
        line = next(x for x in res.output.splitlines() if x.startswith(f"  {variant}: "))
        assert f"TERMS 1 = {PLAIN_TF32}, the default; TERMS 3 = 3xTF32" in line
    assert f"(tf32x3): {IDEA}" in res.output and f"(wgmma): {IDEA}" in res.output
    default = runner.invoke(kerngen.cli.app.app, ["playbook", "matmul"])
    assert default.exit_code == 0 and PLAIN_TF32 not in default.output
    bad = runner.invoke(kerngen.cli.app.app, ["playbook", "matmul", "--precision", "tf16"])
    assert bad.exit_code == 2 and "unknown precision" in bad.output


# ----- NVRTC --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_terms_1_compiles_for_sm80_and_sm90a(name):
    prop = proposer(name, "tf32")
    for variant, arch in (("tf32x3", "sm_80"), ("wgmma", "sm_90")):
        spec = prop.offer.get(variant).spec
        for terms in ((TERMS_PLAIN, TERMS_SPLIT) if variant == "wgmma" else (TERMS_PLAIN,)):
            resolved = plan.resolve(spec, sizes={}, tensors=prop.match.tensor_facts(), config={"TERMS": terms})
            got = compile_job(job_for(spec, resolved, arch), cache=None)
            assert got.info.kernels, (variant, terms)
            for kernel, res in got.info.kernels.items():
                assert res.spill_stores == 0 and res.spill_loads == 0, (variant, terms, kernel, res)


# ----- the pre-pass on the CPU emulator -----------------------------------------------------------------------------
@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
@pytest.mark.parametrize("terms", [TERMS_PLAIN, TERMS_SPLIT])
def test_the_tf32_terms_pre_pass_writes_the_planes_terms_asks_for(terms):
    outer, rows, k, kp = 1, 37, 70, 72
    src = torch.randn(outer, rows, k)
    planes = 2 if terms == TERMS_SPLIT else 1
    dst = torch.full((2 * outer * rows * kp,), float("nan"))  # room for two planes: TERMS 1 leaves the second alone
    i32 = [{"kind": "int32", "value": v} for v in (rows, k, kp, outer, 0)]
    spec = KernelSpec(source=render("_gemm_wgmma_prep.cuh.j2", mode="tf32_terms", prep_kernel=PREP_KERNEL),
                      tunables={"TERMS": [TERMS_PLAIN, TERMS_SPLIT]}, defaults={"TERMS": TERMS_SPLIT},
                      steps=[dict(kernel=PREP_KERNEL, grid=[-(-kp // 32), -(-rows // 32), outer], block=[32, 8],
                                  args=[{"name": "src"}, {"name": "dst"}, *i32])])
    emulate(spec, {"src": src, "dst": dst}, config={"TERMS": terms})
    got = dst.view(2, outer, rows, kp).numpy()
    big, small = split(torch.nn.functional.pad(src, (0, kp - k)).numpy())
    assert np.array_equal(got[0], big)
    assert np.array_equal(got[1], small) if planes == 2 else np.isnan(got[1]).all()
