"""The Hopper GEMM core's ping-pong consumers (PINGPONG), thread-block clusters with TMA multicast (CLUSTER) and the
stores staged through shared memory (EPI_SMEM), CPU tier: both exist in a spec only when its defaults name them (the specs built without them are those of before: the
pinned hashes in test_tf32_terms.py and the conv core's source), then the tuner gets both values; the plans (each
consumer's own tile, the cluster's launch field, a grid of whole clusters); constraints refuse what cannot run; the
launch plan's ``cluster`` is validated (one line), left out of a spec's dump at 1, and refused by the CPU emulator;
NVRTC for sm_90a of sampled configurations in bf16, fp16 and 3xTF32, with and without an epilogue and split-K, with
no spills and no wgmma warning; the round-0 ideas of the gemm16 family. The GPU tier: test_gpu_gemm_wgmma_modes.py."""

from __future__ import annotations

import json

import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain
from kerngen.agent.playbook.gemm.build_wgmma import Mode, smem_bytes
from kerngen.errors import SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_gemm_wgmma import _admits, _maps, _resolve, build, emulate, emulator_available, gemm_problem

BF16_LINEAR = ProblemRef(source="linear_gelu", shape=(300, 200, 136), dtype="bfloat16")


def _m(ref: ProblemRef):
    return explain(load_problem(ref))


def test_the_modes_exist_only_where_asked_for():
    m = _m(ProblemRef(source="linear_gelu", dtype="bfloat16"))
    plain = build(m, "wgmma")
    assert "PINGPONG" not in plain.tunables and "CLUSTER" not in plain.tunables
    for word in ("PINGPONG", "CLUSTER", "__cluster_dims__", "gw_bar_sync", "multicast"):
        assert word not in plain.source
    assert "cluster" not in plain.model_dump(mode="json")["steps"][0]  # left out of the dump (and hash) at 1
    both = build(m, "wgmma", {"PINGPONG": 1, "CLUSTER": 2})
    assert both.name == plain.name == "playbook-gemm16-wgmma"
    assert both.tunables["PINGPONG"] == [0, 1] and both.tunables["CLUSTER"] == [1, 2]
    assert both.default_config()["PINGPONG"] == 1 and both.default_config()["CLUSTER"] == 2
    assert "__cluster_dims__(CLUSTER, 1, 1)" in both.source and ".multicast::cluster" in both.source
    assert "mbarrier.arrive.release.cluster.shared::cluster" in both.source and "bar.sync" in both.source
    conv = _m(ProblemRef(source="conv2d"))  # the conv core shares the consumer: unchanged, not opted in
    for word in ("PINGPONG", "CLUSTER", "gw_cta_rank", "gw_bar_sync"):
        assert word not in build(conv, "wgmma").source
    with pytest.raises(ValueError, match="PINGPONG is 0 or 1, CLUSTER 1 or 2"):
        build(m, "wgmma", {"CLUSTER": 4})


def test_pingpong_gives_each_consumer_its_own_tile():
    m = _m(ProblemRef(source="matmul", dtype="bfloat16"))  # 4096^3
    spec = build(m, "wgmma", {"PINGPONG": 1})
    (main,) = _resolve(spec, m).launches
    # 64 x 256 tiles (one m64 block a consumer): A's box is 64 rows, 64 x 64 tiles of work, one block per SM
    assert _maps(main)[0] == ("A", (64, 64), False, (1, 4096, 4096))
    assert main.grid == (132, 1, 1) and main.block == (384, 1, 1) and main.cluster == 1
    cfg = spec.default_config()
    assert main.shared_mem == 1024 + 4 * (64 + 256) * 64 * 2 + 64 == smem_bytes({**cfg, "CWG": 1}, Mode.bf16)
    coop = _resolve(spec, m, {"PINGPONG": 0}).launches[0]  # the cooperative tile in the same source
    assert _maps(coop)[0][1] == (128, 64) and coop.shared_mem == 1024 + 4 * (128 + 256) * 64 * 2 + 64
    assert not _admits(spec, m, {"CWG": 1})  # ping-pong needs its two consumers
    assert _admits(spec, m, {"WGM": 2, "BN": 128}) and _admits(spec, m, {"STAGES": 5})


def test_clusters_take_whole_column_pairs_and_launch_as_clusters():
    m = _m(ProblemRef(source="matmul", shape=(1000, 264, 136), dtype="bfloat16"))
    spec = build(m, "wgmma", {"CLUSTER": 2})
    (main,) = _resolve(spec, m).launches
    # units of 256 rows (two 128-row tiles, one a block): 4 x 2 of them, two blocks each
    assert main.cluster == 2 and main.grid == (16, 1, 1)
    assert _resolve(spec, m, {"CLUSTER": 1}).launches[0].grid == (8 * 2, 1, 1)
    big = _m(ProblemRef(source="matmul", dtype="bfloat16"))
    assert _resolve(build(big, "wgmma", {"CLUSTER": 2}), big).launches[0].grid == (132, 1, 1)
    split = _m(ProblemRef(source="matmul", shape=(256, 256, 8192), dtype="bfloat16"))
    r = _resolve(build(split, "wgmma", {"CLUSTER": 2, "SPLIT_K": 4}), split)
    assert r.launches[0].cluster == 2 and r.launches[0].grid == (2 * 1 * 1 * 4, 1, 1)  # one pair unit, 4 slices


def _one_launch(**launch) -> KernelSpec:
    return KernelSpec(source='extern "C" __global__ void k(float *x) { x[threadIdx.x] = 1.f; }',
                      tunables={"C": [1, 2, 3]}, steps=[dict(kernel="k", grid=[4], block=[32], args=[{"name": "x"}],
                                                             **launch)])


def test_the_launch_plans_cluster_is_validated():
    tensors = {"x": TensorFacts((128,))}
    ok = plan.resolve(_one_launch(cluster="C + 1"), sizes={}, tensors=tensors, config={"C": 1})
    assert ok.launches[0].cluster == 2
    for launch, config in (({"cluster": "C"}, {"C": 3}), ({"cluster": 9}, {}), ({"cluster": 0}, {}),
                           ({"cluster": 2, "cooperative": True}, {})):
        with pytest.raises(SpecError) as err:
            plan.resolve(_one_launch(**launch), sizes={}, tensors=tensors, config=config)
        assert "\n" not in str(err.value) and "must be 1..8, divide the grid's x (4)" in str(err.value)
    bad = _one_launch(cluster=2).model_dump(mode="json")
    bad["steps"][0]["cluster"] = "C +"
    with pytest.raises(SpecError, match="steps.0.cluster: cannot parse"):
        KernelSpec.from_text(json.dumps(bad))
    dumped = KernelSpec.from_text(_one_launch(cluster=2).model_dump_json())
    assert dumped.steps[0].cluster == 2 and dumped.content_hash() != _one_launch().content_hash()


@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
def test_the_cpu_emulator_refuses_clusters():
    with pytest.raises(Exception, match="clusters .*are not emulated"):
        emulate(_one_launch(cluster=2), {"x": torch.zeros(128)})


# ----- NVRTC for sm_90a -------------------------------------------------------------------------------------------
COMPILED = [  # (source, shape, dtype, defaults, configuration)
    ("linear_gelu", (300, 200, 136), "bfloat16", {"PINGPONG": 1}, {}),  # bias + GELU epilogue
    ("linear_gelu", (300, 200, 136), "bfloat16", {"PINGPONG": 1, "CLUSTER": 2}, {"WGM": 2, "BN": 128}),
    ("matmul", None, "bfloat16", {"CLUSTER": 2}, {}),  # B N-major: 4 boxes, two issued by each block
    ("matmul", (999, 333, 517), "float16", {"PINGPONG": 1, "CLUSTER": 2, "SPLIT_K": 2}, {"BN": 192}),
    ("matmul", None, "float32", {"PINGPONG": 1, "CLUSTER": 2}, {}),  # 3xTF32 with FLUSH
    ("linear_gelu", (513, 384, 1000), "float32", {"CLUSTER": 2}, {"WGM": 2, "BN": 64, "STAGES": 2}),
    ("linear_gelu", None, "bfloat16", {"EPI_SMEM": 1}, {"GROUP_M": 16}),  # the staged stores, unguarded chain
    ("linear_gelu", None, "bfloat16", {"EPI_SMEM": 1, "PINGPONG": 1}, {"BN": 192}),
    ("linear_gelu", (513, 388, 1000), "float32", {"EPI_SMEM": 1}, {"STAGES": 2}),  # fp32 pieces of 4
    ("matmul", (999, 328, 517), "float16", {"EPI_SMEM": 1}, {"EPI_SMEM": 0}),  # no bias; the paired stores
]


@pytest.mark.parametrize("source, shape, dtype, defaults, cfg", COMPILED, ids=lambda v: str(v))
def test_it_compiles_for_sm90a_without_spills_or_wgmma_warnings(source, shape, dtype, defaults, cfg):
    m = _m(ProblemRef(source=source, shape=shape, dtype=dtype))
    spec = build(m, "wgmma", defaults)
    job = job_for(spec, _resolve(spec, m, cfg), "sm_90")
    got = compile_job(job, cache=None)
    for name, res in got.info.kernels.items():
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_bytes == 0, (name, res)
    for warning in ("C7510", "C7512", "C7515", "C7517", "serialized", "warpgroup.wait is injected"):
        assert warning not in got.info.log, got.info.log[-800:]


# ----- ideas ------------------------------------------------------------------------------------------------------
def test_the_gemm16_family_proposes_both_modes_in_round_0():
    prop = PlaybookProposer(load_problem(BF16_LINEAR))
    round0 = [e for e in prop._entries() if e.round0]
    assert [e.id for e in round0] == ["gemm16-wgmma", "gemm16-wgmma-staged", "gemm16-wgmma-pingpong"]
    for entry, knob in zip(round0[1:], ("EPI_SMEM", "PINGPONG")):
        assert "H200" in entry.effect  # measured
        specs = [b.spec for b in prop._render(entry, None, 3)]
        assert len(specs) == 3 and all(s.default_config()[knob] == 1 for s in specs)
    # the staged stores' first branch is the one measured best (cooperative, GROUP_M 16)
    first = prop._render(round0[1], None, 1)[0].spec.default_config()
    assert first["EPI_SMEM"] == 1 and first["GROUP_M"] == 16 and "PINGPONG" not in first
    # clusters lost on every case measured: a refinement only
    cluster = {e.id: e for e in prop._entries()}["gemm16-wgmma-cluster"]
    assert not cluster.round0 and cluster.after == frozenset({"wgmma"})
    fp32 = PlaybookProposer(load_problem(ProblemRef(source="matmul")))
    later = {e.id: e for e in fp32._entries()}
    assert not later["mm-wgmma-pingpong"].round0 and later["mm-wgmma-cluster"].after == frozenset({"wgmma"})
    assert "mm-wgmma-staged" not in later  # 3xTF32 at 2 stages (room for the tiles) lost to its 3-stage default


# ----- EPI_SMEM: the stores staged through shared memory ----------------------------------------------------------
def test_the_staged_stores_exist_only_where_asked_and_bring_their_shared_memory():
    m = _m(ProblemRef(source="linear_gelu", dtype="bfloat16"))
    plain = build(m, "wgmma")
    assert "EPI_SMEM" not in plain.tunables and "EPI_SMEM" not in plain.source and "epi_nb" not in plain.source
    spec = build(m, "wgmma", {"EPI_SMEM": 1})
    assert spec.tunables["EPI_SMEM"] == [0, 1] and spec.default_config()["EPI_SMEM"] == 1
    on, off = _resolve(spec, m).launches[0], _resolve(spec, m, {"EPI_SMEM": 0}).launches[0]
    # 8 consumer warps, each 16 rows of 64 bf16 outputs and 8 more of padding
    assert on.shared_mem - off.shared_mem == 8 * 16 * 72 * 2 == 18432
    assert on.shared_mem == smem_bytes({**spec.default_config()}, Mode.bf16)
    assert off.shared_mem == _resolve(plain, m).launches[0].shared_mem
    # GELU reads no tensor: the values computed unguarded; a residual's read keeps the guard
    assert "no tensor read in the chain" in spec.source and "if (r < M && col < N) {" not in spec.source
    with pytest.raises(ValueError, match="EPI_SMEM and split-K"):
        build(m, "wgmma", {"EPI_SMEM": 1, "SPLIT_K": 2})
    with pytest.raises(ValueError, match="EPI_SMEM 2: 0 or 1"):
        build(m, "wgmma", {"EPI_SMEM": 2})


def test_the_staged_stores_keep_the_guard_where_the_chain_reads_a_tensor(tmp_path):
    p = gemm_problem(tmp_path, "torch.relu(self.fc(x)) * y + y", {"x": (2, 50, 136), "y": (2, 50, 200)}, "bfloat16",
                     "self.fc = nn.Linear(136, 200)")
    spec = build(explain(p), "wgmma", {"EPI_SMEM": 1})
    assert "if (r < M && col < N) {  // the epilogue reads its tensors only inside the output" in spec.source
    assert "no tensor read in the chain" not in spec.source


def test_the_staged_stores_need_whole_16_byte_pieces():
    for n, dtype, ok in ((328, "float16", True), (333, "float16", False), (332, "float16", False),
                         (332, "float32", True), (330, "float32", False)):
        m = _m(ProblemRef(source="matmul", shape=(999, n, 517), dtype=dtype))
        spec = build(m, "wgmma", {"EPI_SMEM": 1, **({"STAGES": 2} if dtype == "float32" else {})})
        assert _admits(spec, m, {}) is ok, (n, dtype)
        assert _admits(spec, m, {"EPI_SMEM": 0})  # the paired stores take any N
