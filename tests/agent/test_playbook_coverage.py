"""Honest coverage (issue 14): the playbook offers a family or variant only when it admits at least
one configuration at the problem's shape (the resolution of ``kerngen check``), says why not
otherwise, and every spec it writes or seeds starts from an admissible configuration. CPU only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.playbook import by_name, family_of, PlaybookProposer, seed_specs
from kerngen.agent.playbook.coverage import closest, offer
from kerngen.agent.proposer import Failure, Idea, SearchContext
from kerngen.errors import KerngenError
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec import plan
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import admissible, count_configs, limits_for
from kerngen.harness.tune.prune import static_reason
from kerngen.problems.load import load_problem
from kerngen.problems.ref import parse_problem_ref
from tests.agent.family_checks import matmul_problem
from tests.cli_output import stderr_of
from tests.resources import kernelbench

runner = CliRunner()
SHARED = kernelbench("level1")
COPIES = Path(__file__).parents[1] / "data" / "kernelbench" / "level1"
SM90 = limits_for("sm_90")


def _kb(name: str) -> Path:
    """A KernelBench level-1 file, unchanged: the shared copy, else the test data's, else skip."""
    for folder in (SHARED, COPIES):
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"no copy of KernelBench level1/{name}")


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args))


def _resolves(spec: KernelSpec, problem) -> None:
    """The spec's default configuration resolves and survives static pruning at the problem's shape."""
    info = problem.info
    plan.resolve(spec, sizes=info.sizes, tensors=info.tensor_facts())
    resolved, kind, why = static_reason(spec, spec.default_config(), sizes=info.sizes, tensors=info.tensor_facts(),
                                        gpu=SM90)
    assert resolved is not None, (kind, why)


# ----- KernelBench level 1: what each file gets ------------------------------------------------
# file -> (family, {offered variant: (admissible, total)}, {dropped variant: a word of why})
OFFERED = {
    # the FFMA GEMM predicates the edges no tile divides; the 3xTF32 one needs whole tiles (or the padded copies)
    "8_Matmul_with_irregular_shapes_.py": ("matmul", {"tiled": (385, 36864), "tf32x3_padded": (438, 864),
                                                      "wgmma": (300, 1920)}, {"tf32x3": "% BM == 0"}),
    "23_Softmax.py": ("softmax", {"long": (63, 63)}, {"rows_reg": "* 4 <= 64"}),
    "40_LayerNorm.py": ("layernorm", {"split": (52, 64), "coop": (1512, 3456)}, {"rows_reg": "* 4 <= 64"}),
    # x: 2^30 fp32, its split planes past the wgmma pre-passes' scratch limit (both wgmma variants); the others index
    # the output in 64 bits
    "87_conv_pointwise_2D.py": ("conv2d", {"direct": (1436, 2700), "igemm": (792, 1728), "tf32x3": (615, 1620)},
                                {"wgmma": "<= 2147483648", "wgmma_s2d": "<= 2147483648"}),
}


def _two_columns(tmp_path) -> Path:
    """KernelBench's matrix-vector file with B of two columns and K = 2**31: a plain 2-D matmul (the built-in
    family's) that none of its kernels admits (every one counts K in 32 bits; M = 2 is no tile's multiple)."""
    path = tmp_path / "4_two_columns.py"
    text = _kb("4_Matrix_vector_multiplication_.py").read_text().replace("torch.rand(K, 1)", "torch.rand(K, 2)")
    path.write_text(text.replace("M = 256 * 8 # 2048", "M = 2").replace("K = 131072 * 8 # 1048576", "K = 2**31"))
    return path


def test_matrix_vector_gets_the_gemv_kernel():
    prop = PlaybookProposer(load_problem(str(_kb("4_Matrix_vector_multiplication_.py"))))
    assert prop.match is not None and prop.match.family == "gemm"
    assert [v.variant for v in prop.offer.offered] == ["gemv"]


def test_a_matmul_no_kernel_admits_is_not_offered_with_the_reason(tmp_path):
    path = _two_columns(tmp_path)
    prop = PlaybookProposer(load_problem(str(path)))
    assert prop.recognised is not None and prop.recognised.family == "matmul"
    assert prop.match is None and seed_specs(load_problem(str(path))) == []
    assert "no matmul variant admits a configuration at A 2x2147483648, B 2147483648x2 (sm_90 limits)" in prop.reason
    assert "tiled: 0 of 36864 configurations ((A.shape[0]) < 2**31 and (B.shape[1]) < 2**31 and (A.shape[1]) < 2**31)" \
        in prop.reason
    assert "tf32x3: 0 of 864 configurations ((A.shape[0]) % BM == 0)" in prop.reason
    assert "\n" not in prop.reason
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="", gpu=GpuFacts(name="H100"))
    assert prop.ideas(ctx, None, 3) == []
    out = tmp_path / "x.json"
    for args in ((), ("--json",), ("-o", str(out)), ("--variant", "tiled", "-o", str(out))):
        res = invoke("playbook", str(path), *args)
        assert res.exit_code == 2 and not out.exists()
        err = stderr_of(res).strip().splitlines()
        assert len(err) == 1 and "no matmul variant admits" in err[0]


def test_generate_with_the_playbook_stops_before_any_gpu_work(tmp_path):
    from kerngen.agent.budget import Usage
    from kerngen.cli.compose import make_proposer

    ref = parse_problem_ref(str(_two_columns(tmp_path)))
    with pytest.raises(KerngenError, match="nothing for .*no matmul variant admits a configuration"):
        make_proposer("playbook", ref, usage=Usage())


@pytest.mark.parametrize("name", sorted(OFFERED))
def test_offered_variants_admit_configurations(name, tmp_path):
    family, offered, dropped = OFFERED[name]
    path = _kb(name)
    problem = load_problem(str(path))
    prop = PlaybookProposer(problem)
    assert prop.match is not None and prop.match.family == family and prop.reason == ""
    off = prop.offer
    assert {v.variant: (v.count, v.total) for v in off.offered} == offered
    assert {v.variant for v in off.dropped} == set(dropped)
    for v in off.dropped:
        assert v.count == 0 and dropped[v.variant] in v.why and v.why.startswith(f"0 of {v.total} configurations")
    for v in off.offered:
        # the same resolution as `kerngen check`: its count of this very spec
        assert count_configs(v.spec, problem.info, SM90, "sm_90", False)["admissible"] == v.count
        _resolves(v.spec, problem)
    # seeds and ideas only from offered variants
    assert {s.name for s in seed_specs(problem)} <= {family_of(prop.match).build(prop.match, v).name for v in offered}
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="", gpu=GpuFacts(name="H100"),
                        tensors={k: list(s) for k, s in prop.match.tensors().items()})
    ideas = prop.ideas(ctx, None, 10)
    assert ideas and all(prop._by_text[i.text].variant in offered for i in ideas)
    for e in list(by_name(family).ideas):
        if e.variant in dropped:
            (b,) = prop.implement(ctx, None, Idea(text=e.text, category=e.category), 2)
            assert b.spec is None and "not offered" in b.error and dropped[e.variant] in b.error
    # the CLI lists the same, and -o writes the first offered variant, its default resolving
    res = invoke("playbook", str(path))
    assert res.exit_code == 0, res.output
    assert f"family {family}; variants: {', '.join(offered)}; not offered: {', '.join(dropped)}" in res.output
    for var, (n, total) in offered.items():  # (a space past the enumeration's limit is counted over a sample)
        assert re.search(rf"{var}: {n} of {total} configurations( \(a sample of \d+\))? admissible", res.output)
    out = tmp_path / "spec.json"
    res = invoke("playbook", str(path), "-o", str(out))
    assert res.exit_code == 0, res.output
    spec = KernelSpec.load(out)
    first = next(iter(offered))
    assert spec.name == family_of(prop.match).build(prop.match, first).name and f"{offered[first][0]} admissible" in res.output
    _resolves(spec, problem)
    for var in dropped:  # a variant that admits nothing is never written
        bad = tmp_path / f"{var}.json"
        res = invoke("playbook", str(path), "--variant", var, "-o", str(bad))
        assert res.exit_code == 2 and not bad.exists()
        err = stderr_of(res).strip().splitlines()
        assert len(err) == 1 and f"variant {var} of the playbook's {family} family is not offered" in err[0]
        assert dropped[var] in err[0]


def test_json_lists_counts_and_why():
    path = _kb("87_conv_pointwise_2D.py")
    res = invoke("playbook", str(path), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    # the wgmma pre-pass's split copies of x (2^30 fp32) pass its scratch limit; the others index in 64 bits
    assert data["family"] == "conv2d" and data["variants"] == ["direct", "igemm", "tf32x3"]
    assert data["limits"] == "sm_90 limits" and "<= 2147483648" in data["not_offered"]["wgmma"]
    conf = data["configurations"]
    assert conf["direct"]["admissible"] == 1436 and conf["direct"]["total"] == 2700 and conf["direct"]["offered"]
    assert conf["wgmma"]["admissible"] == 0 and not conf["wgmma"]["offered"] and conf["wgmma"]["pruned"]
    assert {i["variant"] for i in data["ideas"] if i["offered"]} == {"direct", "igemm", "tf32x3"}


# ----- synthetic problems --------------------------------------------------------------------
def test_one_variant_admits_nothing_the_other_is_offered(tmp_path):
    p = matmul_problem(tmp_path, 100, 64, 128)  # M = 100: no block tile of the 3xTF32 GEMM divides it
    prop = PlaybookProposer(p)
    # the FFMA GEMM predicates its edges; the padded 3xTF32 GEMM: A and B padded to whole tiles; the Hopper one
    # (sm_90 limits) takes any shape
    offered = ["tiled", "tf32x3_padded", "wgmma"]
    assert prop.match is not None and [v.variant for v in prop.offer.offered] == offered
    assert {v.variant for v in prop.offer.dropped} == {"tf32x3"}
    (tf32,) = prop.offer.dropped
    assert tf32.count == 0 and "(A.shape[0]) % BM == 0" in tf32.why
    assert {s.name for s in seed_specs(p)} == {"playbook-matmul-sgemm", "playbook-matmul-tf32x3-padded",
                                               "playbook-matmul-wgmma"}
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="", gpu=GpuFacts(name="H100"),
                        tensors={k: list(s) for k, s in prop.match.tensors().items()})
    assert {prop._by_text[i.text].variant for i in prop.ideas(ctx, None, 10)} == set(offered)
    rep = prop.repair(ctx, Failure(spec=family_of(prop.match).build(prop.match, "tiled")), 1)
    assert rep.spec is None and rep.error == "playbook cannot repair"  # no safer GEMM than the bounds-checked one


def test_nothing_admissible_is_not_offered(tmp_path):
    p = matmul_problem(tmp_path, 2, 2**31, 2)  # meta tensors: nothing is allocated; K = 2**31: no 32-bit k count
    prop = PlaybookProposer(p, gpu=limits_for("sm_80"))
    assert prop.recognised.family == "matmul" and prop.match is None and prop.offer is not None and not prop.offer.offered
    assert "tiled: 0 of 36864" in prop.reason and "tf32x3: 0 of 864" in prop.reason
    assert "wgmma: a Hopper kernel (sm_90a: wgmma, TMA), not offered for sm_80" in prop.reason


def test_a_pruned_default_is_replaced_by_the_closest_admissible_configuration(tmp_path):
    p = load_problem(parse_problem_ref("matmul", shape="64x1024x1024"))  # M = 64: the 3xTF32 BM 128 cannot tile it
    prop = PlaybookProposer(p)
    tf32 = prop.offer.get("tf32x3")
    assert tf32 is not None and tf32.moved_from is not None and tf32.moved_from["BM"] == 128
    own = family_of(prop.match).build(prop.match, "tf32x3")
    assert tf32.spec.default_config() == {**own.default_config(), "BM": 64}  # one tunable changed
    # nothing but the defaults differs: every configuration compiles to the same kernel as before
    assert tf32.spec.model_dump(exclude={"defaults"}) == own.model_dump(exclude={"defaults"})
    _resolves(tf32.spec, p)
    assert {s.name: s.default_config()["BM"] for s in seed_specs(p) if s.name.endswith("tf32x3")} == {"playbook-matmul-tf32x3": 64}
    res = invoke("playbook", "matmul", "--shape", "64x1024x1024", "--variant", "tf32x3", "-o", str(tmp_path / "t.json"))
    assert res.exit_code == 0, res.output
    assert "its default BM=128 is not admissible here, the spec's default is BM=64" in res.output
    _resolves(KernelSpec.load(tmp_path / "t.json"), p)


def test_closest_changes_the_fewest_tunables():
    tun = {"A": [1, 2, 4], "B": [1, 2, 4]}
    cands = [{"A": 1, "B": 1}, {"A": 4, "B": 2}, {"A": 2, "B": 4}]
    assert closest({"A": 4, "B": 4}, cands, tun) == {"A": 4, "B": 2}
    assert closest({"A": 1, "B": 4}, [{"A": 4, "B": 4}, {"A": 2, "B": 4}], tun) == {"A": 2, "B": 4}


def test_the_search_contexts_gpu_limits_count(tmp_path):
    p = matmul_problem(tmp_path, 256, 64, 256)
    prop = PlaybookProposer(p)
    assert [v.variant for v in prop.offer.offered] == ["tiled", "tf32x3", "wgmma"]
    tensors = {k: list(s) for k, s in prop.match.tensors().items()}
    small = SearchContext(problem_name="p", problem_source="", problem_summary="", tensors=tensors,
                          gpu=GpuFacts(name="tiny", max_threads_per_block=32))
    # the FFMA GEMM runs with one warp (a 64 x 32 block tile of 8 x 8 outputs a thread), the tensor-core one
    # too (a 64x64 block tile of one 64x64 warp tile); the Hopper one needs three warpgroups
    assert {prop._by_text[i.text].variant for i in prop.ideas(small, None, 10)} == {"tiled", "tf32x3"}
    tinier = SearchContext(problem_name="p", problem_source="", problem_summary="", tensors=tensors,
                           gpu=GpuFacts(name="tinier", max_threads_per_block=8))
    fresh = PlaybookProposer(p)
    assert fresh.ideas(tinier, None, 10) == [] and "no matmul variant admits" in fresh.reason
    assert "(tinier)" in fresh.reason and "threads per block > 8" in fresh.reason


def test_admissible_is_the_count_of_kerngen_check():
    p = load_problem("softmax")
    prop = PlaybookProposer(p)
    for v in prop.offer.offered:
        info = p.info
        counted = admissible(v.spec, sizes=info.sizes, tensors=info.tensor_facts(), gpu=SM90)
        assert counted.count == v.count and counted.report() == count_configs(v.spec, info, SM90, "sm_90", False)
    off = offer(prop.match, sizes=p.info.sizes, tensors=p.info.tensor_facts(), gpu=limits_for("sm_75"))
    assert off.limits == "sm_75 limits" and off.offered
