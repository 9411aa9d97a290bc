"""``kerngen playbook DIR``'s fast path (issue 37): a listing stops judging a variant's configurations at
the first usable admissible one, nearest its default (:func:`kerngen.harness.tune.admissible.admissible`'s
``usable``), instead of counting them all. It must list exactly what the full count lists: the same family,
variants offered and dropped with the same reasons, built with the same defaults (a pruned default moved to
the same closest configuration), for built-ins, KernelBench files and a regions problem. CPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.agent.playbook.coverage_table import coverage_row
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import admissible, closest, limits_for
from kerngen.problems.load import load_problem
from kerngen.problems.ref import parse_problem_ref
from tests.resources import kernelbench

SM90 = limits_for("sm_90")
SUITE = Path(__file__).resolve().parents[2] / "problems" / "suite"


def _listed(prop: PlaybookProposer) -> tuple:
    """Everything a listing or a spec written from the offer depends on (not the counts)."""
    off = prop.offer
    if off is None:
        return (prop.reason,)
    return (prop.recognised.family, prop.reason, off.where, [
        (v.variant, v.why, v.brief, v.defaults, v.moved_from, v.spec.content_hash() if v.spec else None)
        for v in off.variants])


def _both(ref: str, shape: str | None = None, gpu=SM90) -> tuple[PlaybookProposer, PlaybookProposer]:
    full = PlaybookProposer(load_problem(parse_problem_ref(ref, shape=shape)), gpu=gpu)
    fast = PlaybookProposer(load_problem(parse_problem_ref(ref, shape=shape)), gpu=gpu, exhaustive=False)
    return full, fast


@pytest.mark.parametrize("ref,shape", [("matmul", "1024x64x1024"), ("layernorm", None), ("softmax", None),
                                       ("conv2d", None), ("rmsnorm", None)])
def test_builtins_list_the_same_offer_with_and_without_counting(ref, shape):
    full, fast = _both(ref, shape)
    assert _listed(fast) == _listed(full)
    assert full.offer.offered and all(not v.counted.stopped for v in full.offer.offered)
    # counted: every admissible configuration; listed: the judging stopped at the first usable one
    assert all(v.counted.stopped and v.count <= w.count for v, w in zip(fast.offer.offered, full.offer.offered))
    assert any(w.count > 1 for w in full.offer.offered)


def test_a_moved_default_and_a_dropped_variant_are_the_same_either_way():
    full, fast = _both("matmul", "64x1024x1024")  # M = 64: the 3xTF32 default BM 128 is pruned, moved to BM 64
    assert full.offer.get("tf32x3").moved_from is not None
    assert fast.offer.get("tf32x3").moved_from == full.offer.get("tf32x3").moved_from
    full, fast = _both("matmul", "1000x2048x777", gpu=limits_for("sm_80"))  # wgmma: Hopper only; odd shape
    assert full.offer.dropped and _listed(fast) == _listed(full)
    assert [v.counted.report() for v in fast.offer.dropped if v.counted] == \
           [v.counted.report() for v in full.offer.dropped if v.counted]  # nothing usable: all judged, as counted


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", ["level2/74_ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max.py",  # regions
                                  "level2/56_Matmul_Sigmoid_Sum.py", "level1/83_conv_depthwise_2D_square_input_"
                                  "asymmetric_kernel.py", "level1/4_Matrix_vector_multiplication_.py",
                                  "level1/34_InstanceNorm.py", "level1/41_Max_Pooling_1D.py", "level1/89_cumsum.py",
                                  "level1/8_Matmul_with_irregular_shapes_.py"])
def test_kernelbench_files_list_the_same_offer_with_and_without_counting(name):
    path = kernelbench(name)
    full = PlaybookProposer(load_problem(str(path)), gpu=SM90)
    fast = PlaybookProposer(load_problem(str(path)), gpu=SM90, exhaustive=False)
    assert full.offer is not None and _listed(fast) == _listed(full)


def test_the_builtin_folder_lists_the_same_rows_with_and_without_counting():
    for path in sorted(SUITE.glob("[a-z]*.py")):
        row = coverage_row(path, SUITE, SM90)
        assert row.variants and row == coverage_row(path, SUITE, SM90, exhaustive=True)


# ----- admissible(usable=...) on a space made up for it --------------------------------------------------
def _spec(defaults: dict[str, int]) -> KernelSpec:
    return KernelSpec.model_validate({
        "source": 'extern "C" __global__ void k(float* out) {}',
        "tunables": {"A": [1, 2, 4, 8], "B": [1, 2, 3, 4], "U": [1, 2]},
        "defaults": defaults,
        "constraints": ["x.shape[1] % (A * 64) == 0", "B != 3"],  # 256 x 512: A <= 8, B != 3
        "steps": [{"kernel": "k", "grid": ["cdiv(x.shape[0], B)"], "block": ["A * B * 64"], "args": [{"name": "out"}]}],
    })  # threads A * B * 64 <= 1024: all but A = 8, B = 4 (and B = 3, pruned by its constraint)


def _sizes():
    info = load_problem(parse_problem_ref("softmax", shape="256x512")).info
    return {"sizes": info.sizes, "tensors": info.tensor_facts(), "gpu": SM90}


def test_an_admissible_default_is_the_only_configuration_judged():
    got = admissible(_spec({"A": 2, "B": 2}), usable=lambda c: True, **_sizes())
    assert got.stopped and got.configs == [{"A": 2, "B": 2, "U": 1}] and not got.pruned


@pytest.mark.parametrize("defaults,pins", [({"A": 8, "B": 4, "U": 2}, {}), ({"B": 3}, {}), ({"B": 3}, {"U": 2}),
                                           ({"A": 8, "B": 3}, {"A": 8})])
def test_a_pruned_default_stops_at_the_closest_usable_configuration(defaults, pins):
    spec = _spec(defaults)
    full = admissible(spec, **_sizes())
    usable = [c for c in full.configs if all(c[k] == v for k, v in pins.items())]
    got = admissible(spec, usable=lambda c: all(c[k] == v for k, v in pins.items()), **_sizes())
    assert got.stopped and got.configs[-1] == closest(spec.default_config(), usable, spec.tunables)
    assert [c for c in got.configs if c in usable] == got.configs[-1:]  # the first usable one ends the judging
    assert got.count < full.count and len(got.pruned) < len(full.pruned)


def test_with_nothing_usable_every_configuration_is_judged_in_enumeration_order():
    spec = _spec({"B": 3})
    full = admissible(spec, **_sizes())
    got = admissible(spec, usable=lambda c: c["A"] == 16, **_sizes())  # no such configuration
    assert not got.stopped and got.configs == full.configs and got.report() == full.report()
    assert [p.model_dump() for p in got.pruned] == [p.model_dump() for p in full.pruned]
    assert got.why() == full.why() and got.brief() == full.brief()
