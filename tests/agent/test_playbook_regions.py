"""Regions (agent/playbook/region.py, partition.py, regions_spec.py, regions.py): the partitioner's regions for
chains no one family takes whole and for small whole models, what it names when nothing takes a piece, the
family chosen by fit, and several regions joined into one kernel spec, run on the CPU emulator against PyTorch
(a wrong intermediate buffer fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import (FAMILIES, NotCovered, PlaybookProposer, explain, family_for, partition,
                                    region_spec, trace)
from kerngen.agent.playbook import registry
from kerngen.agent.playbook.leads import Lead
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.emu import cases
from tests.emu.runner import EmuError, emulate

DATA = Path(__file__).resolve().parents[1] / "data" / "playbook"
needs_emulator = pytest.mark.needs_cxx

# problem -> each region's family and the nodes it computes
COVERED = {
    "regions_two_gemms": [("gemm", ["linear", "sigmoid"]), ("gemm_rows", ["linear_1", "logsumexp"])],
    "regions_resblock": [("conv_epi", ["conv2d", "batch_norm", "relu"]),
                         ("conv_epi", ["conv2d_1", "batch_norm_1", "add", "relu_1"])],
    "regions_mlp": [("gemm", ["linear", "relu"]), ("gemm", ["linear_1", "gelu"]), ("gemm", ["linear_2"])],
    "regions_convt_views": [("pool", ["avg_pool3d"]), ("conv_nd", ["conv_transpose3d", "clamp"]),
                            ("softmax", ["softmax"]), ("elementwise", ["mul"])],
    "regions_conv3d_softmax_pool": [
        ("conv_nd", ["conv3d"]), ("reduce", ["softmax_d0"]), ("elementwise", ["softmax_d1", "softmax_d2"]),
        ("reduce", ["softmax_d3", "softmax_d4"]), ("pool", ["max_pool3d"]), ("reduce", ["logsumexp_d0"]),
        ("elementwise", ["logsumexp_d1", "logsumexp_d2", "logsumexp_d3"]),
        ("elementwise", ["logsumexp_d4", "logsumexp_d5"]), ("reduce", ["logsumexp_d6"]),
        ("elementwise", ["logsumexp_d7", "logsumexp_d8", "add"])],
}


def _load(name: str):
    return load_problem(str(DATA / f"{name}.py"))


@pytest.mark.parametrize("name", sorted(COVERED))
def test_regions_of_chains_and_small_models(name):
    part = partition(trace(_load(name)))
    assert part.covered, part.why
    assert [(r.match.family, list(r.nodes)) for r in part.regions] == COVERED[name]
    for r in part.regions:  # each region's inputs are problem tensors or earlier regions' outputs
        earlier = {str(q.graph.output) for q in part.regions[: r.index]}
        for t in r.inputs:
            assert part.storage[t.name] in {*earlier, *(f"r{q.index}_out" for q in part.regions[: r.index])} | {
                i.name for i in part.graph.inputs} | {t.name}, (r.index, t.name)
        assert all(part.graph.is_param(p.name) for p in r.params)
    last = part.regions[-1]
    assert part.storage[str(last.graph.output)] == "out"


def test_a_residual_block_reads_the_input_and_the_first_regions_output():
    part = partition(trace(_load("regions_resblock")))
    second = part.regions[1]
    assert [t.name for t in second.inputs] == ["relu", "x"] and part.storage["relu"] == "r0_out"
    assert [p.name for p in second.params][:1] == ["conv2.weight"]
    assert second.lead is Lead.conv and family_for(second).family == "conv_epi"


@pytest.mark.parametrize("name, where", [
    ("regions_lstm_cell", "NotCovered: lstm_cell at lstm_cell"),
    ("regions_vit_block", "NotCovered: permute at permute"),
])
def test_what_no_family_takes_is_named_and_the_rest_still_cut(name, where):
    part = partition(trace(_load(name)))
    assert not part.covered and part.why.startswith(where)
    with pytest.raises(NotCovered, match=where):
        explain(_load(name))
    if name == "regions_vit_block":  # the norms, the GEMMs and the attention core are regions of their own
        families = [r.match.family if r.match else None for r in part.regions]
        assert families.count("gemm") == 4 and "attention" in families and families.count("layernorm") == 2
        unbind = next(r for r in part.regions if "unbind" in r.nodes)
        assert unbind.nodes == ("unbind", "getitem", "getitem_1", "getitem_2") and unbind.match is None


def test_a_regions_spec_of_one_region_at_its_shapes():
    part = partition(trace(_load("regions_two_gemms")))
    spec = region_spec(part.regions[1])
    assert spec.origin.family == "gemm_rows"
    tensors = {t.name: t.shape for t in (*part.regions[1].inputs, *part.regions[1].params)}
    tensors["out"] = part.regions[1].output.shape
    from kerngen.expr import TensorFacts

    plan.resolve(spec, sizes={}, tensors={k: TensorFacts(v) for k, v in tensors.items()})
    assert {a.name for s in spec.steps for a in getattr(s, "args", []) if hasattr(a, "name")} >= {"sigmoid", "out"}


# ----- the choice of a family: by fit, never by list order ----------------------------------------
def test_the_most_specific_family_asks_first_whatever_the_order(monkeypatch):
    g = trace(load_problem("conv2d"))
    first = [f.name for f in registry.candidates(g)]
    assert first[:4] == ["conv_relu_maxpool", "conv2d", "conv16", "conv_tail"]  # 7, 6, 4 and 3 constraints
    assert explain(load_problem("conv2d")).family == "conv2d"  # conv_epi would take it too, less specifically
    picks = {}
    for name in ("conv2d", "matmul", "softmax", "conv_relu_maxpool"):
        picks[name] = explain(load_problem(name)).family
    monkeypatch.setattr(registry, "FAMILIES", tuple(reversed(FAMILIES)))
    for name, fam in picks.items():
        p = load_problem(name)
        p.__dict__.pop("_playbook_graph", None)
        assert explain(p).family == fam


def test_every_family_declares_leads_and_constraints():
    for fam in FAMILIES:
        assert fam.leads and fam.constraints, fam.name
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


# ----- several regions in one spec, on the emulator ------------------------------------------------
def _emulate(name: str, variant_index: int = 0) -> tuple[dict[str, str], object]:
    problem = cases.load(DATA / f"{name}.py")
    prop = PlaybookProposer(problem)
    assert prop.match is not None, prop.reason
    spec = prop.offer.offered[variant_index].spec
    case = cases.make_case(problem)
    emulate(spec, case.tensors, sizes=case.sizes, timeout_s=600)
    return cases.mismatches(case), spec


@needs_emulator
@pytest.mark.parametrize("name", ["regions_two_gemms", "regions_resblock", "regions_mlp", "regions_convt_views",
                                  "regions_conv3d_softmax_pool"])
def test_a_regions_spec_computes_what_pytorch_computes(name):
    bad, spec = _emulate(name)
    assert not bad, bad
    kernels = [s.kernel for s in spec.steps if hasattr(s, "kernel")]
    assert all(k.startswith("r") and "_" in k for k in kernels)  # every region's kernels namespaced
    assert {s.name for s in spec.scratch} >= {f"r{i}_out" for i in range(len(COVERED[name]) - 1)}


@needs_emulator
def test_a_wrong_intermediate_buffer_fails():
    problem = cases.load(DATA / "regions_two_gemms.py")
    spec = PlaybookProposer(problem).offer.offered[0].spec
    data = spec.model_dump()
    # the second region's GEMM reads another region-sized buffer instead of the first region's output
    for step in data["steps"]:
        if step.get("kernel", "").startswith("r1_"):
            for arg in step["args"]:
                if arg.get("name") == "r0_out":
                    arg["name"] = "r1_gemm_out"
    wrong = type(spec).model_validate(data)
    assert wrong.source == spec.source and wrong.steps != spec.steps
    case = cases.make_case(problem)
    try:
        emulate(wrong, case.tensors, sizes=case.sizes, timeout_s=600)
    except EmuError:
        return  # reading the wrong buffer out of bounds is a failure too
    assert cases.mismatches(case)


@pytest.mark.needs_kernelbench
def test_a_joined_wgmma_region_keeps_its_tensormaps_view_and_k_tile_box(tmp_path):
    """Two GEMMs (level 2's 45), the first on the wgmma core: its TMA reads the 3xTF32 planes, a 1-D scratch
    buffer, through a ``view`` with one k tile per box. The joined spec once dropped both fields, and every such
    variant was refused on the GPU (an H100: 'a tensormap needs 2 or more' dims)."""
    from kerngen.harness.gpu.tensormap import check_plan
    from tests.agent.family_checks import resized_copy
    from tests.resources import kernelbench

    src = kernelbench("level2", "45_Gemm_Sigmoid_LogSumExp.py")
    p = load_problem(str(resized_copy(src, tmp_path, batch_size=64, input_size=96, hidden_size=160,
                                      output_size=72)))
    m = explain(p)
    joined = [v.spec for v in PlaybookProposer(p).offer.offered if "r0_gemm_wgmma" in v.spec.source]
    assert joined, "no regions variant runs its first GEMM on the wgmma core"
    spec = joined[0]
    maps = [a for s in spec.steps for a in getattr(s, "args", ()) if a.kind == "tensormap"]
    assert maps and all(a.view is not None and a.full_width is False for a in maps)
    resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=spec.default_config())
    known = {n: (f.shape, "float32") for n, f in m.tensor_facts().items()}
    known.update({s.name: ((s.size,), s.dtype) for s in resolved.scratch})
    check_plan(resolved, known)  # raised SpecError before
