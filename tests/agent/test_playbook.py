"""The offline playbook (CPU tier): family recognition, rendering, plan resolution, NVRTC
compilation of every template at its default and at sampled configurations, proposer rounds."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from kerngen.errors import SpecError

from kerngen.agent.playbook import FAMILIES, by_name, family_of, PlaybookProposer, explain, recognise_family, seed_specs, why_not
from kerngen.agent.playbook.elementwise.family import ElementwiseFacts
from kerngen.agent.playbook.render import MAX_SMEM, render
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.proposer import Category, Failure, NodeSummary, SearchContext, TriedIdea
from kerngen.harness.spec import plan
from kerngen.expr import TensorFacts
from kerngen.harness.results import EvalResult, GpuFacts, Verdict
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

DATA = Path(__file__).parents[1] / "data" / "playbook"

EXPECTED = {
    "suite_gelu": "elementwise",
    "suite_softmax": "softmax",
    "suite_layernorm": "layernorm",
    "suite_rmsnorm": "rmsnorm",
    "suite_conv2d": "conv2d",
    "suite_conv_relu_maxpool": "conv_relu_maxpool",
    "suite_matmul": "matmul",
    "kb_relu": "elementwise",
    "kb_softmax_named": "softmax",
}
REFUSED = {"kb_permute": "NotCovered: permute at permute"}
# what one family does not take whole is cut into regions: the families of the regions, in order
REGIONS = {"kb_softmax_dim0": ["reduce", "elementwise", "reduce"], "kb_softmax_scaled": ["softmax", "elementwise"]}
BUILTINS = {
    "softmax": "softmax", "layernorm": "layernorm", "rmsnorm": "rmsnorm", "gelu": "elementwise",
    "conv2d": "conv2d", "conv_relu_maxpool": "conv_relu_maxpool", "matmul": "matmul", "attention": "attention",
}


def _kb(name: str):
    return load_problem(str(DATA / f"{name}.py"))



def _compile(spec, resolved) -> None:
    """NVRTC for sm_90 through the harness when it is there, else directly."""
    try:
        from kerngen.harness.compile.compiler import compile_job, job_for
    except ImportError:  # pragma: no cover - harness compile not present
        compile_job = None
    if compile_job is not None:
        compile_job(job_for(spec, resolved, "sm_90"), cache=None)
        return
    from cuda.bindings import nvrtc  # pragma: no cover

    _, prog = nvrtc.nvrtcCreateProgram(spec.source.encode(), b"k.cu", 0, [], [])
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17"] + [
        f"-D{k}={v}".encode() for k, v in {**resolved.config, **resolved.defines}.items()
    ]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[:1]
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * max(n, 2)  # never the shared one-byte b" ", which NVRTC would overwrite
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")


def _all_specs():
    for name, fam in EXPECTED.items():
        m = explain(_kb(name))
        assert m.family == fam
        for var in by_name(fam).variants:
            if var == "map" and not m.facts.operands:
                continue  # the elementwise map of several operands; these read one tensor
            yield name, var, m, family_of(m).build(m, var)


SPECS = list(_all_specs())


# ----- recognition ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,family", sorted(EXPECTED.items()))
def test_recognises_sample_files(name, family):
    m = recognise_family(_kb(name))
    assert m is not None and m.family == family


@pytest.mark.parametrize("name,word", sorted(REFUSED.items()))
def test_refuses_with_a_clear_message(name, word):
    p = _kb(name)
    assert recognise_family(p) is None
    with pytest.raises(NotCovered, match=word):
        explain(p)
    assert word in why_not(p)


@pytest.mark.parametrize("name,families", sorted(REGIONS.items()))
def test_what_no_family_takes_whole_is_cut_into_regions(name, families):
    m = explain(_kb(name))
    assert m.family == "regions"
    assert [r.match.family for r in m.facts.partition.regions] == families
    assert seed_specs(_kb(name))


def test_facts_read_from_modules():
    conv = explain(_kb("suite_conv2d")).facts
    assert (conv.KH, conv.SH, conv.PH, conv.OC) == (11, 4, 2, 96)
    assert conv.weight == "conv.weight" and conv.bias == "conv.bias"
    crp = explain(_kb("suite_conv_relu_maxpool")).facts
    assert (crp.PK, crp.PS, crp.PH) == (2, 2, 1)
    ln = explain(_kb("suite_layernorm")).facts
    assert ln.ndims == 3 and ln.eps == 1e-5 and ln.weight == "ln.weight"
    rms = explain(_kb("suite_rmsnorm")).facts
    assert rms.eps == 1e-6 and rms.weight == "norm.weight"
    sm = explain(_kb("kb_softmax_named"))
    assert sm.x.name == "logits"
    assert explain(_kb("suite_matmul")).inputs[1].name == "B"


def test_builtin_suite():
    for name, fam in BUILTINS.items():
        p = load_problem(name)
        m = recognise_family(p)
        assert m is not None and m.family == fam, (name, why_not(p))
        specs = seed_specs(p)
        assert specs, name
        facts = {t.name: TensorFacts(tuple(t.shape)) for t in p.info.inputs + p.info.params}
        facts.update({"out": TensorFacts(tuple(p.info.outputs[0].shape))})
        for spec in specs:
            plan.resolve(spec, sizes=dict(getattr(p.info, "sizes", {}) or {}), tensors=facts)


WIDE_LINEAR = """
import torch
import torch.nn as nn

LOG = {log!r}
N = 16384  # 1 GiB of fp32 weights, were they ever real


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
        with open(LOG, "a") as log:  # where each build of the model put its weights
            log.write(self.fc.weight.device.type + "\\n")

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(8, N)]


def get_init_inputs():
    return [N]
"""


def test_recognition_builds_the_model_on_meta_only(tmp_path):
    log = tmp_path / "devices.log"
    path = tmp_path / "wide_linear.py"
    path.write_text(WIDE_LINEAR.format(log=str(log)))
    p = load_problem(str(path))
    assert explain(p).family == "gemm"  # nn.Linear + relu: a GEMM with a fused epilogue
    assert PlaybookProposer(p).match is not None and seed_specs(p)
    assert set(log.read_text().split()) == {"meta"}  # describing, recognising, rendering: no real weights


KB_LEVEL1 = kernelbench("level1")


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", ["1_Square_matrix_multiplication_.py", "19_ReLU.py"])
def test_playbook_command_on_a_big_kernelbench_file_is_quick(tmp_path, name):
    import re
    import subprocess
    import sys
    import time

    run = ("import atexit, resource, sys\n"
           "atexit.register(lambda: print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr))\n"
           "from kerngen.cli.app import main\n"
           "sys.argv = ['kerngen', 'playbook', sys.argv[1]]\n"
           "main()\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", run, str(KB_LEVEL1 / name)], capture_output=True, text=True,
                          timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode in (0, 2), proc.stderr[-2000:]  # a family, or a one-line "nothing for"
    assert elapsed < 20, elapsed
    peak_mb = int(re.search(r"maxrss_kb (\d+)", proc.stderr).group(1)) / 1024
    assert peak_mb < 2000, peak_mb  # torch itself is a few hundred MB; real weights or inputs would be GBs


# ----- rendering, resolution, compilation ------------------------------------------------------
def test_templates_render_with_strict_undefined():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render("elementwise.cu.j2", dtype="float32", kernel="k")  # op missing


@pytest.mark.parametrize("name,var,m,spec", SPECS, ids=[f"{n}-{v}" for n, v, _, _ in SPECS])
def test_spec_is_pure_cuda_and_resolves(name, var, m, spec):
    # tunable values ascend (the tuner's neighbours are index steps); the default is one of them
    assert all(v == sorted(v) for v in spec.tunables.values())
    assert all(spec.defaults[k] in v for k, v in spec.tunables.items())
    assert 'extern "C" __global__' in spec.source
    assert "{{" not in spec.source and "{%" not in spec.source
    assert "__device__ float" not in spec.source.replace("__device__ __forceinline__ float", "")  # no mutable globals
    assert "int main" not in spec.source
    try:
        resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    except Exception as exc:
        # only the register-resident variants may reject the long-row problems, and the padded GEMM a
        # shape its plain twin's tiles divide
        assert ((var == "rows_reg" and name in ("suite_softmax", "suite_layernorm"))
                or (var == "tf32x3_padded" and "% 256 != 0" in str(exc))), exc
        return
    assert resolved.launches
    for launch in resolved.launches:
        for arg in launch.args:
            if arg.kind == "tensor":
                assert arg.name in m.tensors() or arg.name in {s.name for s in resolved.scratch}


def _valid_configs(spec, facts, limit, seed=0):
    names = list(spec.tunables)
    combos = list(itertools.product(*(spec.tunables[n] for n in names)))
    random.Random(seed).shuffle(combos)
    out = []
    for combo in combos:
        cfg = dict(zip(names, combo))
        try:
            out.append(plan.resolve(spec, sizes={}, tensors=facts, config=cfg))
        except SpecError:  # a configuration the problem does not admit (a constraint, a limit)
            continue
        if len(out) >= limit:
            break
    return out


@pytest.mark.parametrize("name,var,m,spec", SPECS, ids=[f"{n}-{v}" for n, v, _, _ in SPECS])
def test_compiles_default_and_sampled_configs(name, var, m, spec):
    facts = m.tensor_facts()
    try:
        default = plan.resolve(spec, sizes={}, tensors=facts)
    except SpecError:
        default = None
    resolved = ([default] if default else []) + _valid_configs(spec, facts, 3)
    if not resolved:
        pytest.skip(f"{var} admits no configuration of {name}")
    for r in resolved:
        _compile(spec, r)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_variants_compile(dtype):
    m = explain(_kb("suite_rmsnorm"))
    from dataclasses import replace

    x = replace(m.x, dtype=dtype)
    m.inputs[0] = x
    m.facts = m.facts.model_copy(update={"wdtype": dtype})
    for var in ("rows_reg",):
        spec = family_of(m).build(m, var)
        _compile(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts()))
    m.family = "softmax"
    for var in ("rows_reg", "long"):
        spec = family_of(m).build(m, var)
        _compile(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts()))
    m.family, m.facts = "elementwise", ElementwiseFacts(op="gelu", expr="0.5f * v * (1.f + erff(v * 0.70710678f))")
    spec = family_of(m).build(m, "vec")
    _compile(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts()))


def test_constraints_reject_shapes_a_kernel_cannot_handle():
    m = explain(_kb("suite_matmul"))
    spec = family_of(m).build(m, "tf32x3")
    facts = m.tensor_facts()
    facts["A"] = TensorFacts((4000, 4096))
    facts["out"] = TensorFacts((4000, 4096))
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(spec, sizes={}, tensors=facts)
    plan.resolve(family_of(m).build(m, "tiled"), sizes={}, tensors=facts)  # the FFMA GEMM predicates its edges
    facts["B"] = TensorFacts((4000, 4096))  # B's rows are not A's columns
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(family_of(m).build(m, "tiled"), sizes={}, tensors=facts)
    sm = explain(_kb("kb_softmax_named"))
    spec = family_of(sm).build(sm, "rows_reg")
    f = sm.tensor_facts()
    f["logits"] = TensorFacts((1024, 4094))  # not a multiple of the vector width
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(spec, sizes={}, tensors=f)


@pytest.mark.parametrize("shape,block,nb,want_bs", [
    ((16, 64, 256, 256), 512, 128, 12),   # the suite: 8192 vectors a block; 128 KB of weight leaves 12 slices
    ((16, 64, 256, 256), 1024, 128, 6),   # bigger slices: half as many fit
    ((16, 64, 256, 256), 512, 264, 8),    # smaller segments: every slice of the row fits
    ((4, 64, 64, 64), 512, 128, 1),       # a short row: one slice holds the whole segment
])
def test_coop_layernorm_keeps_what_fits_in_shared_memory(shape, block, nb, want_bs):
    """The cooperative layernorm puts the weight and as many bias slices as fit in shared memory; the
    slice count is capped by the row and by the space left, so every configuration's launch fits."""
    m = explain(_kb("suite_layernorm"))
    spec = family_of(m).build(m, "coop")
    facts = m.tensor_facts()
    facts["x"] = facts["out"] = TensorFacts(shape)
    for p in ("ln.weight", "ln.bias"):
        facts[p] = TensorFacts(shape[1:])
    r = plan.resolve(spec, sizes={}, tensors=facts, config={"BLOCK": block, "NB": nb, "BSL": 16})
    assert r.defines["BS"] == want_bs
    seg = -(-(shape[1] * shape[2] * shape[3] // 4) // nb)
    assert r.launches[0].shared_mem == (seg + want_bs * block) * 16 <= MAX_SMEM - 1024
    assert r.launches[0].cooperative
    r0 = plan.resolve(spec, sizes={}, tensors=facts, config={"BLOCK": block, "NB": nb, "BSL": 0, "W_SMEM": 0})
    assert r0.defines["BS"] == 0 and r0.launches[0].shared_mem == 0


@pytest.mark.parametrize("shape,sm_count,want", [
    ((16, 64, 256, 256), 132, 128),   # H100/H200
    ((16, 64, 256, 256), 0, 128),     # device unknown: the default
    ((16, 64, 128, 128), 108, 108),   # an A100: one block per SM
    ((16, 64, 256, 256), 108, None),  # 16 MB rows over 108 SMs do not fit the registers: no coop branch
])
def test_coop_grid_fits_the_device(shape, sm_count, want):
    """A cooperative grid must be resident at once: the proposer sizes the cooperative layernorm's
    grid to at most one block per SM of the GPU in the search context, and offers no branch where the
    row's share per SM cannot stay on chip."""
    prop = PlaybookProposer(_kb("suite_layernorm"))
    ctx = _ctx(prop.match)
    ctx.gpu = GpuFacts(name="gpu", sm_count=sm_count)
    ctx.tensors.update({"x": list(shape), "out": list(shape), "ln.weight": list(shape[1:]), "ln.bias": list(shape[1:])})
    entry = next(e for e in list(by_name("layernorm").ideas) if e.variant == "coop" and not e.after - {"split"})
    specs = [b.spec for b in prop._render(entry, ctx, 2) if b.spec is not None]
    if want is None:
        assert not specs
    else:
        assert specs and {s.default_config()["NB"] for s in specs} == {want}


# ----- the proposer -----------------------------------------------------------------------------
def _ctx(m, tried=()):
    return SearchContext(
        problem_name="p", problem_source="", problem_summary="",
        tensors={k: list(v) for k, v in m.tensors().items()}, gpu=GpuFacts(name="H100"), tried=list(tried),
    )


def _node(spec, idea=None, node_id=1):
    return NodeSummary(node_id=node_id, idea=idea, spec=spec, result=EvalResult(verdict=Verdict.ok))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_proposer_rounds(name):
    p = _kb(name)
    prop = PlaybookProposer(p)
    assert prop.name == "playbook"
    m = prop.match
    ctx = _ctx(m)
    first = prop.ideas(ctx, None, 2)
    assert 1 <= len(first) <= 2
    assert all(isinstance(i.category, Category) for i in first)
    branches = prop.implement(ctx, None, first[0], 2)
    assert 1 <= len(branches) <= 2 and all(b.spec is not None for b in branches)
    assert len({b.spec.content_hash() for b in branches}) == len(branches)
    parent = _node(branches[0].spec, first[0])
    seen = {i.text for i in first}
    for _ in range(6):
        more = prop.ideas(ctx, parent, 2)
        assert len(more) <= 2
        for idea in more:
            assert idea.text not in seen  # never repeated
            seen.add(idea.text)
            for b in prop.implement(ctx, parent, idea, 3):
                assert len(b.spec.steps) >= 1 if b.spec else b.error
        if not more:
            break
    fail = EvalResult(verdict=Verdict.incorrect)
    rep = prop.repair(ctx, Failure(spec=branches[0].spec, result=fail), 1)
    assert rep.error == "playbook cannot repair" or rep.spec is not None


def test_proposer_skips_ideas_already_tried():
    p = _kb("suite_softmax")
    prop = PlaybookProposer(p)
    entry = next(e for e in list(by_name("softmax").ideas) if e.round0 and e.variant == "long")
    from kerngen.agent.proposer import Idea

    tried = [TriedIdea(idea=Idea(text=entry.text, category=entry.category), outcome="ok")]
    ideas = prop.ideas(_ctx(prop.match, tried), None, 5)
    assert entry.text not in {i.text for i in ideas}


def test_proposer_for_a_problem_it_does_not_cover():
    prop = PlaybookProposer(_kb("kb_permute"))
    assert prop.match is None and "permute" in prop.reason
    ctx = SearchContext(problem_name="a", problem_source="", problem_summary="", gpu=GpuFacts(name="H100"))
    assert prop.ideas(ctx, None, 3) == []
    from kerngen.agent.proposer import Idea

    (b,) = prop.implement(ctx, None, Idea(text="x", category=Category.compute), 2)
    assert b.spec is None and "permute" in b.error


def test_the_playbook_does_not_repair():
    prop = PlaybookProposer(_kb("suite_matmul"))
    ctx = _ctx(prop.match)
    tiled = family_of(prop.match).build(prop.match, "tiled")
    failed = Failure(spec=tiled, result=EvalResult(verdict=Verdict.incorrect))
    for attempt in (1, 2):  # the search's first attempt is 1; the GEMMs bounds-check their own edges
        rep = prop.repair(ctx, failed, attempt)
        assert rep.spec is None and rep.error == "playbook cannot repair"


def test_seed_specs():
    assert seed_specs(_kb("kb_permute")) == []
    specs = seed_specs(_kb("suite_softmax"))
    assert [s.name for s in specs] == ["playbook-softmax-long"]
    for s in seed_specs(_kb("suite_conv2d")):
        assert s.tunables and s.defaults and s.constraints


@pytest.mark.parametrize("name,var,m,spec", SPECS, ids=[f"{n}-{v}" for n, v, _, _ in SPECS])
def test_spec_name_gives_back_its_variant(name, var, m, spec):
    # refinements ("after" a variant) start from the parent's config only if its variant is known
    assert variant_of_spec(spec) == var


def test_every_catalogue_idea_names_a_variant():
    for fam in FAMILIES:
        entries = fam.ideas
        variants = {*fam.variants, *fam.partitioned}  # its own and those the regions layer builds for it
        assert any(e.round0 for e in entries), fam.name
        assert len({e.id for e in entries}) == len(entries)
        for e in entries:
            assert e.variant in variants, (fam.name, e.id)
            assert e.text and e.effect
            assert all(e.after <= variants for e in entries), (fam.name, e.id)
