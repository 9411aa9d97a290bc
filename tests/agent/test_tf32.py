"""3xTF32 fp32 GEMM, CPU tier: the matmul_wide problem has teeth (a TF32 product fails it, the
3-term split passes it, kernels that only work on N(0, 1) data fail it, correct fp32 stays well
inside it), the template's index algebra (fragment layouts, k/n permutations, epilogue) and
shared-memory banks checked in Python, the spec's constraints, and NVRTC compiles for sm_90/sm_80;
split-K's plan (SPLIT_K absent or 1: the single launch as before; > 1: two launches and a scratch, offered
only for outputs of few tiles) and its compiles. Its numbers are the emulator's (test_emu_tf32.py).

Numerical models here are emulations of the kernel's arithmetic, not of a GPU: products of tf32
operands are exact in float64, a k8 step adds their sum to the accumulator with one rounding to
fp32 (to nearest, or toward zero for a truncating tensor core)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain
from kerngen.agent.playbook.gemm.build_tf32 import (DEFAULTS, PADDED_VARIANT, SPEC_NAME, SPLIT_MAX_OUTPUTS, SPLIT_VALUES,
                                               TERMS_PLAIN, TERMS_SPLIT, TF32_IDEAS, VARIANT, sgemm_tf32x3,
                                               sgemm_tf32x3_padded, smem_bytes)
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.render import MAX_SMEM
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.compare import compare
from kerngen.harness.spec import plan
from tests.agent.family_checks import matmul_problem
from tests.agent.spec_samples import sampled_plans
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from kerngen.problems.registry import is_builtin

SMALL = (128, 128, 512)  # M, N, K of the CPU checks (the proof of teeth runs at this size)
SUITE = (4096, 4096, 4096)
LARGE_K = (256, 256, 131072 * 4)  # KernelBench level 1 6_Matmul_with_large_K_dimension_: 8 tiles of 128 x 64
ARCHS = ("sm_90", "sm_80")
FP32_REL_LIMIT = 1e-5  # the harness's ||out - ref|| / ||ref|| limit for fp32 outputs


# ----- helpers -------------------------------------------------------------------------------
def _match(m: int, n: int, k: int) -> FamilyMatch:
    return FamilyMatch("matmul", [Tensor("A", (m, k), "float32"), Tensor("B", (k, n), "float32")], [],
                       [Tensor("out", (m, n), "float32")])



def _resolve(shape, defaults=None, config=None):
    match = _match(*shape)
    spec = sgemm_tf32x3(match, dict(defaults or {}))
    return spec, plan.resolve(spec, sizes={}, tensors=match.tensor_facts(), config=config)


def tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to TF32 (10 explicit mantissa bits), to nearest with ties away from zero:
    half a TF32 ulp added to the magnitude bits, the low 13 bits cleared (what cvt.rna does)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hi = tf32(x)
    return hi, tf32(x.astype(np.float32) - hi)


def _to_fp32_toward_zero(v: np.ndarray) -> np.ndarray:
    f = v.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(v)
    return np.where(over, np.nextafter(f, np.float32(0)), f).astype(np.float32)


def mma_model(a: np.ndarray, b: np.ndarray, terms: int, *, flush_bk: int | None = None,
              truncate: bool = False) -> np.ndarray:
    """The template's arithmetic: per k8 step the small terms then hi*hi (TERMS 3) or hi*hi alone
    (TERMS 1) into the accumulator; with ``flush_bk`` a fresh accumulator per k tile of that many
    columns, added to an fp32 sum (round to nearest), as FLUSH 1 does."""
    ah, al = split(a)
    bh, bl = split(b)
    pairs = [(al, bh), (ah, bl), (ah, bh)] if terms == TERMS_SPLIT else [(ah, bh)]
    rnd = _to_fp32_toward_zero if truncate else (lambda v: v.astype(np.float32))
    k = a.shape[1]
    tile = flush_bk or k
    total = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for t0 in range(0, k, tile):
        acc = np.zeros_like(total)
        for k0 in range(t0, t0 + tile, 8):
            for x, y in pairs:
                acc = rnd(acc.astype(np.float64) + x[:, k0:k0 + 8].astype(np.float64) @ y[k0:k0 + 8].astype(np.float64))
        total = total + acc
    return total


def _problem(name: str, shape, seed: int = 0):
    p = load_problem(ProblemRef(source=name, shape=shape))
    a, b = p.make_inputs("cpu", seed)
    (ref,) = p.run_reference(p.build_model("cpu", seed), [a, b])
    return p, a.numpy(), b.numpy(), ref


def _check(p, out: np.ndarray, ref: torch.Tensor):
    return compare(torch.from_numpy(out), ref, atol=p.info.atol, rtol=p.info.rtol)


# ----- TF32 rounding and the split ------------------------------------------------------------
def test_tf32_rounding_is_to_nearest_ties_away_with_10_mantissa_bits():
    ulp = 2.0 ** -10
    x = np.array([1 + ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 - 2 ** -23, 1 + 3 * ulp / 2, 1 + ulp / 4], np.float32)
    want = np.array([1 + ulp, -(1 + ulp), 1.0, 1 + 2 * ulp, 1.0], np.float32)
    assert np.array_equal(tf32(x), want)
    assert not np.any(tf32(np.float32([3.14159, -2.71828e-20, 6.02e23])).view(np.uint32) & 0x1FFF)


def test_split_leaves_a_residual_below_2_to_the_minus_22():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-30, 30, 100_000)).astype(np.float32)
    hi, lo = split(x)
    assert not np.any(hi.view(np.uint32) & 0x1FFF) and not np.any(lo.view(np.uint32) & 0x1FFF)
    rest = np.abs(x.astype(np.float64) - hi - lo)
    assert np.all(rest <= 2.0 ** -22 * np.abs(x.astype(np.float64)))
    assert np.max(rest / np.abs(x.astype(np.float64))) > 2.0 ** -26  # lo is rounded: not exact in general


# ----- matmul_wide: the proof of teeth ----------------------------------------------------------
def test_matmul_wide_is_a_builtin_the_matmul_family_takes():
    assert is_builtin("matmul_wide")
    p = load_problem(ProblemRef(source="matmul_wide", shape=SMALL))
    assert "dynamic range" in p.info.description and (p.info.atol, p.info.rtol) == (1e-4, 1e-4)
    m = explain(p)
    assert m.family == "matmul" and [t.name for t in m.inputs] == ["A", "B"]
    spec = sgemm_tf32x3(m, {})
    grid = plan.resolve(spec, sizes={}, tensors=m.tensor_facts()).launches[0].grid
    assert grid == ((SMALL[0] // spec.defaults["BM"]) * (SMALL[1] // spec.defaults["BN"]), 1, 1)  # one block a tile


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plain_tf32_fails_matmul_wide_and_3xtf32_passes(seed):
    p, a, b, ref = _problem("matmul_wide", SMALL, seed)
    plain = _check(p, mma_model(a, b, TERMS_PLAIN, flush_bk=32), ref)
    assert not plain.ok and plain.rel_err > 10 * FP32_REL_LIMIT, plain.message
    split3 = _check(p, mma_model(a, b, TERMS_SPLIT, flush_bk=32), ref)
    assert split3.ok and split3.rel_err < FP32_REL_LIMIT / 10, split3.message


def _fp16_split_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """3-term fp16 split (hi = fp16(x), lo = fp16(x - hi)): 22 bits, but fp16's narrow exponents."""
    def halves(x):
        hi = x.astype(np.float16).astype(np.float64)
        return hi, (x - hi).astype(np.float16).astype(np.float64)
    (ah, al), (bh, bl) = halves(a), halves(b)
    return (ah @ bh + ah @ bl + al @ bh).astype(np.float32)


def _row_fixed_point_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A quantised to 24-bit fixed point with one scale per row (block floating point), exact products."""
    scale = 2.0 ** 23 / np.abs(a).max(axis=1, keepdims=True).astype(np.float64)
    return ((np.round(a * scale) / scale) @ b.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("kernel", [_fp16_split_product, _row_fixed_point_product], ids=["fp16-split", "row-scale"])
def test_matmul_wide_catches_kernels_that_pass_on_normal_data(kernel):
    p, a, b, ref = _problem("matmul", SMALL)
    assert _check(p, kernel(a, b), ref).ok
    p, a, b, ref = _problem("matmul_wide", SMALL)
    assert not _check(p, kernel(a, b), ref).ok


def test_correct_fp32_stays_well_inside_the_matmul_wide_check():
    # a serial fp32 chain (rounding every product and every add) against the blocked reference:
    # two correct summation orders, at the suite's K, never near the check's limit
    p, a, b, ref = _problem("matmul_wide", (64, 256, 4096), seed=3)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc += np.outer(a[:, k], b[k])  # float32 products, float32 adds
    r = ref.numpy().astype(np.float64)
    worst = np.max(np.abs(acc - r) / (p.info.atol + p.info.rtol * np.abs(r)))
    assert worst < 0.2 and _check(p, acc, ref).ok  # measured: ~0.04
    assert np.abs(r).max() > 1.0  # the largest rows are checked relatively, not by atol


def test_flush_keeps_fp32_accuracy_under_a_truncating_accumulator():
    # why FLUSH exists: if the tensor core rounds its accumulator toward zero, 3 * K / 8
    # truncations bias a K = 4096 sum past the fp32 limit; per-k-tile sums do not
    _, a, b, ref = _problem("matmul", (64, 64, 4096))
    r = ref.numpy().astype(np.float64)

    def rel(out):
        return np.linalg.norm(out - r) / np.linalg.norm(r)
    assert rel(mma_model(a, b, TERMS_SPLIT, truncate=True)) > FP32_REL_LIMIT
    assert rel(mma_model(a, b, TERMS_SPLIT, flush_bk=32, truncate=True)) < FP32_REL_LIMIT / 5


# ----- the template's index algebra, mirrored -----------------------------------------------------
def _warp_tile_through_the_template(a_tile: np.ndarray, b_tile: np.ndarray, wm: int, wn: int) -> np.ndarray:
    """One k8 step of one warp: a_tile (wm, 8) and b_tile (8, wn) as they sit in shared memory. The
    loads, the PTX fragment layouts (m16n8k8 .tf32) and the epilogue exactly as the template has
    them; returns the warp's (wm, wn) output as written to C."""
    mi, ni = wm // 16, wn // 8
    frag_a, frag_b, acc = {}, {}, {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(mi):  # float2 at rows g, g + 8, columns 2t, 2t + 1
            x0, x1 = a_tile[i * 16 + g, 2 * t:2 * t + 2], a_tile[i * 16 + 8 + g, 2 * t:2 * t + 2]
            frag_a[lane, i] = (x0[0], x1[0], x0[1], x1[1])
        for q in range(ni // 4):  # float4 at rows 2t, 2t + 1, columns q*32 + 4g ..
            y0 = b_tile[2 * t, q * 32 + 4 * g:q * 32 + 4 * g + 4]
            y1 = b_tile[2 * t + 1, q * 32 + 4 * g:q * 32 + 4 * g + 4]
            for jj in range(4):
                frag_b[lane, 4 * q + jj] = (y0[jj], y1[jj])
    for i, j in itertools.product(range(mi), range(ni)):
        a_log, b_log = np.zeros((16, 8)), np.zeros((8, 8))
        for lane in range(32):  # PTX ISA: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g)
            g, t = lane >> 2, lane & 3
            a_log[g, t], a_log[g + 8, t], a_log[g, t + 4], a_log[g + 8, t + 4] = frag_a[lane, i]
            b_log[t, g], b_log[t + 4, g] = frag_b[lane, j]
        d = a_log @ b_log
        for lane in range(32):  # c0, c1 (g, 2t + {0, 1}); c2, c3 (g + 8, 2t + {0, 1})
            g, t = lane >> 2, lane & 3
            acc[lane, i, j] = (d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1])
    out = np.full((wm, wn), np.nan)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i, h, q in itertools.product(range(mi), range(2), range(ni // 4)):
            row, col, j = i * 16 + h * 8 + g, q * 32 + 8 * t, 4 * q
            assert np.isnan(out[row, col:col + 8]).all()  # written once
            out[row, col:col + 4] = [acc[lane, i, j + jj][2 * h] for jj in range(4)]
            out[row, col + 4:col + 8] = [acc[lane, i, j + jj][2 * h + 1] for jj in range(4)]
    return out


@pytest.mark.parametrize("wm,wn", [(16, 32), (32, 32), (64, 32), (32, 64), (64, 64)])
def test_fragment_loads_permutations_and_epilogue_give_the_product(wm, wn):
    rng = np.random.default_rng(wm * wn)
    a_tile = rng.integers(-8, 8, (wm, 8)).astype(np.float64)
    b_tile = rng.integers(-8, 8, (8, wn)).astype(np.float64)
    assert np.array_equal(_warp_tile_through_the_template(a_tile, b_tile, wm, wn), a_tile @ b_tile)


@pytest.mark.parametrize("bk,bn", list(itertools.product([16, 32], [64, 128, 256])))
def test_fragment_loads_are_bank_conflict_free_and_aligned(bk, bn):
    lda, ldb = bk + 8, bn + 4  # the template's TF_LDA, TF_LDB
    assert (lda * 4) % 16 == 0 and (ldb * 4) % 16 == 0  # 16-byte cp.async destinations
    for half in (range(16), range(16, 32)):  # float2 of A: one half warp per wavefront
        banks = []
        for lane in half:
            g, t = lane >> 2, lane & 3
            w = (16 + g) * lda + 8 + 2 * t  # any m16 tile and k8 step: a common shift
            banks += [w % 32, (w + 1) % 32]
        assert sorted(banks) == list(range(32))
    for quarter in range(4):  # float4 of B: one quarter warp per wavefront
        slots = set()
        for lane in range(8 * quarter, 8 * quarter + 8):
            g, t = lane >> 2, lane & 3
            w = (8 + 2 * t) * ldb + 32 + 4 * g
            slots.add((w // 4) % 8)
        assert len(slots) == 8


@pytest.mark.parametrize("cfg", [DEFAULTS, dict(DEFAULTS, BM=64, BN=256, BK=16, WM=32, WN=64)])
def test_the_loader_copies_every_16_byte_chunk_once(cfg):
    threads = 32 * (cfg["BM"] // cfg["WM"]) * (cfg["BN"] // cfg["WN"])
    for rows, cols in ((cfg["BM"], cfg["BK"]), (cfg["BK"], cfg["BN"])):
        per_thread = rows * cols // 4 // threads
        seen = [(c // (cols // 4), c % (cols // 4)) for tid in range(threads) for c in
                (tid + i * threads for i in range(per_thread))]
        assert sorted(seen) == [(r, c) for r in range(rows) for c in range(cols // 4)]


# ----- the spec ---------------------------------------------------------------------------------
def test_spec_offers_3xtf32_and_plain_tf32_only_when_asked():
    spec, r = _resolve(SUITE)
    assert spec.name == SPEC_NAME and spec.tunables["TERMS"] == [TERMS_SPLIT]
    assert all(v == sorted(v) and spec.defaults[k] in v for k, v in spec.tunables.items())
    assert 'extern "C" __global__' in spec.source and "{{" not in spec.source and "{%" not in spec.source
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in spec.source and "cvt.rna.tf32.f32" in spec.source
    assert r.launches[0].grid == (32 * 64, 1, 1) and r.launches[0].block == (128, 1, 1)  # 4096/128 x 4096/64; 4 warps
    assert r.launches[0].shared_mem == smem_bytes(spec.defaults)
    plain = sgemm_tf32x3(_match(*SUITE), {"TERMS": TERMS_PLAIN})
    assert plain.tunables["TERMS"] == [TERMS_PLAIN, TERMS_SPLIT] and plain.defaults["TERMS"] == TERMS_PLAIN
    with pytest.raises(Exception, match="constraint"):
        _resolve(SUITE, {"TERMS": 2})


@pytest.mark.parametrize("shape", [(4000, 4096, 4096), (4096, 4094, 4096), (4096, 4096, 4100), (4096, 4090, 4096)])
def test_constraints_reject_misaligned_shapes_for_every_config(shape):
    spec, _ = _resolve(SUITE)
    facts = _match(*shape).tensor_facts()
    names = list(spec.tunables)
    for combo in itertools.product(*(spec.tunables[n] for n in names)):
        with pytest.raises(Exception, match="constraint"):
            plan.resolve(spec, sizes={}, tensors=facts, config=dict(zip(names, combo)))


def test_constraints_reject_mismatched_inner_dimensions():
    m = FamilyMatch("matmul", [Tensor("A", (256, 512), "float32"), Tensor("B", (256, 256), "float32")], [],
                    [Tensor("out", (256, 256), "float32")])
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(sgemm_tf32x3(m, {}), sizes={}, tensors=m.tensor_facts())


def test_odd_shapes_are_admitted_where_the_tiles_divide():
    _, r = _resolve((1152, 640, 800))  # the default 128 x 64 tile: 9 x 10 blocks, 25 k tiles
    assert r.launches[0].grid == (90, 1, 1)
    with pytest.raises(Exception, match="constraint"):
        _resolve((192, 320, 48))  # 192 % 128, 48 % 32
    _, r = _resolve((192, 320, 48), config=dict(DEFAULTS, BM=64, BN=64, WM=32, WN=32, BK=16))
    assert r.launches[0].grid == (15, 1, 1)


def test_every_admissible_config_fits_the_device():
    spec, _ = _resolve(SUITE)
    facts = _match(*SUITE).tensor_facts()
    names = list(spec.tunables)
    admitted = 0
    for combo in itertools.product(*(spec.tunables[n] for n in names)):
        cfg = dict(zip(names, combo))
        try:
            r = plan.resolve(spec, sizes={}, tensors=facts, config=cfg)
        except Exception:
            continue
        admitted += 1
        launch = r.launches[0]
        assert launch.shared_mem == smem_bytes(cfg) <= MAX_SMEM
        assert launch.block[0] % 32 == 0 and launch.block[0] <= 1024
        mi, ni = cfg["WM"] // 16, cfg["WN"] // 8
        assert 4 * mi * ni * (1 + cfg["FLUSH"]) <= 128 and ni % 4 == 0
    assert admitted > 100


# ----- NVRTC --------------------------------------------------------------------------------------
def _sampled_configs(n: int, seed: int = 0):
    spec, _ = _resolve(SUITE)
    facts = _match(*SUITE).tensor_facts()
    return spec, sampled_plans(spec, facts, n, seed)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_compiles_without_spills(arch):
    for defaults in ({}, {"TERMS": TERMS_PLAIN}):
        spec, r = _resolve(SUITE, defaults)
        res = compile_job(job_for(spec, r, arch), cache=None).info.worst()
        assert res.spill_stores == 0 and res.spill_loads == 0 and 0 < res.registers <= 255, (defaults, res)


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_configs_compile(arch):
    spec, resolved = _sampled_configs(3)
    assert len(resolved) == 3
    for r in resolved:
        assert compile_job(job_for(spec, r, arch), cache=None).info.worst().registers > 0


def test_catalogue_ideas_resolve_and_compile_without_spills():
    assert len({e.id for e in TF32_IDEAS}) == len(TF32_IDEAS)
    assert all(e.variant in (VARIANT, PADDED_VARIANT) for e in TF32_IDEAS)
    assert [e.id for e in TF32_IDEAS if e.round0] == ["mm-tf32x3", "mm-tf32x3-padded"]
    seen = set()
    for e in TF32_IDEAS:
        for branch in e.branches:
            if e.variant == PADDED_VARIANT:  # offered only where no tile divides the shape (KernelBench 8's)
                match = _match(8205, 5921, 2949)
                spec = sgemm_tf32x3_padded(match, dict(branch))
                r = plan.resolve(spec, sizes={}, tensors=match.tensor_facts())
            else:
                spec, r = _resolve(LARGE_K if "SPLIT_K" in branch else SUITE, branch)  # split-K: few tiles only
            assert spec.default_config()["TERMS"] == TERMS_SPLIT
            key = spec.content_hash()
            if key in seen:
                continue
            seen.add(key)
            res = compile_job(job_for(spec, r, "sm_90"), cache=None).info.worst()
            assert res.spill_stores == 0, (e.id, branch, res)


# ----- split-K ------------------------------------------------------------------------------------
def test_split_k_absent_or_1_is_the_single_launch_plan():
    spec, r = _resolve(LARGE_K)
    assert sgemm_tf32x3(_match(*LARGE_K), {"SPLIT_K": 1}) == spec
    assert "SPLIT_K" not in spec.tunables and not spec.scratch and "_sum" not in spec.source
    (launch,) = r.launches
    assert launch.grid == (8, 1, 1) and [a.name for a in launch.args if a.name] == ["A", "B", "out"]


@pytest.mark.parametrize("split", [2, 4])
def test_split_k_plan_is_partials_then_an_ordered_sum(split):
    spec, r = _resolve(LARGE_K, {"SPLIT_K": split})
    assert spec.tunables["SPLIT_K"] == list(SPLIT_VALUES) and spec.defaults["SPLIT_K"] == split
    main, reduce = r.launches
    assert main.kernel == "sgemm_tf32x3" and main.grid == (8, 1, split) and main.shared_mem == smem_bytes(spec.defaults)
    assert [a.name or a.value for a in main.args] == ["A", "B", "partials", 256, 256, LARGE_K[2]]
    assert reduce.kernel == "sgemm_tf32x3_sum" and reduce.grid == (256 * 256 // 1024, 1, 1) and reduce.block == (256, 1, 1)
    assert [a.name or a.value for a in reduce.args] == ["partials", "out", 256, 256, 1]
    (scratch,) = r.scratch
    assert (scratch.name, scratch.size) == ("partials", split * 256 * 256)


def test_split_k_is_not_offered_where_the_tiles_fill_two_waves():
    spec = sgemm_tf32x3(_match(*SUITE), {"SPLIT_K": 2})
    facts = _match(*SUITE).tensor_facts()
    assert SUITE[0] * SUITE[1] >= SPLIT_MAX_OUTPUTS > 2048 * 2048  # 4096^2 fills two waves; 2048^2 does not
    for bm, bn, split in itertools.product(spec.tunables["BM"], spec.tunables["BN"], SPLIT_VALUES):
        with pytest.raises(Exception, match="constraint"):
            plan.resolve(spec, sizes={}, tensors=facts, config=dict(spec.defaults, BM=bm, BN=bn, SPLIT_K=split))


def test_split_k_keeps_every_slice_non_empty_and_takes_only_its_values():
    _resolve((256, 256, 5 * 32), {"SPLIT_K": 2})  # 5 k tiles: 3 + 2
    with pytest.raises(Exception, match="constraint"):
        _resolve((256, 256, 5 * 32), {"SPLIT_K": 4})  # slices of 2: 2 + 2 + 1 + 0
    with pytest.raises(ValueError, match="SPLIT_K 3"):
        sgemm_tf32x3(_match(*LARGE_K), {"SPLIT_K": 3})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("split", [2, 4])
def test_split_k_compiles_without_spills(arch, split):
    spec, r = _resolve(LARGE_K, {"SPLIT_K": split})
    res = compile_job(job_for(spec, r, arch), cache=None).info.worst()
    assert res.spill_stores == 0 and res.spill_loads == 0 and 0 < res.registers <= 255, res


def test_split_k_idea_renders_only_for_a_few_tiles():
    ideas = [e for e in TF32_IDEAS if "SPLIT_K" in str(e.branches)]
    assert [e.id for e in ideas] == ["mm-tf32x3", "mm-tf32x3-splitk"]  # the round-0 idea tries one split too
    for branch in (b for e in ideas for b in e.branches if "SPLIT_K" in b):
        spec, r = _resolve(LARGE_K, branch)
        assert len(r.launches) == 2 and r.config["SPLIT_K"] == branch["SPLIT_K"]
        with pytest.raises(Exception, match="constraint"):
            _resolve(SUITE, branch)


@pytest.mark.parametrize("m, n, k, splits", [(256, 256, 524288, [1, 16]), (4096, 4096, 4096, [1, 1])])
def test_round0_offers_split_k_where_the_output_leaves_sms_idle(tmp_path, m, n, k, splits):
    """KernelBench 6's shape gets a split-K kernel in the first round (a 0.4-minute search never reached the
    refinement that offered it: 20.6 ms unsplit against 1.30 ms split, H100); a square GEMM is unchanged."""
    prop = PlaybookProposer(matmul_problem(tmp_path, m, k, n))
    entry = next(e for e in prop._entries() if e.id == "mm-tf32x3")
    branches = prop._render(entry, None, 2)
    assert [b.spec.default_config().get("SPLIT_K", 1) for b in branches] == splits
