"""The emulator's inline PTX (ptx_asm.py, emu_ptx.h): the asm rewrite, every emulated instruction against a
hand-computed reference in small probe kernels (fragment layouts: each lane writes what it got), the errors
it must report, and the playbook's tensor-core and cp.async kernels against PyTorch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import explain
from kerngen.agent.playbook.gemm.build_tf32 import TERMS_PLAIN, sgemm_tf32x3
from kerngen.harness.spec.spec import KernelSpec

from tests.agent.family_checks import resized_copy
from tests.emu import cases
from kerngen.harness.emu.ptx_asm import NotEmulated, not_emulated, not_emulated_call, translate
from tests.emu.runner import EmuError, emulate
from kerngen.harness.emu.source_rewrite import rewrite_source
from tests.resources import kernelbench

needs_gxx = pytest.mark.needs_cxx
KB = kernelbench()


def _spec(source: str, names: list[str], *, n: int | str | None = None, block=32, grid=1) -> KernelSpec:
    """One launch of kernel ``k`` on the tensors ``names`` (then the int32 ``n``, if given)."""
    args = [{"name": a} for a in names] + ([{"kind": "int32", "value": n}] if n is not None else [])
    step = {"kernel": "k", "grid": grid, "block": block, "args": args}
    return KernelSpec.model_validate({"source": source, "steps": [step]})


# ----- the rewrite ----------------------------------------------------------------------------------------
MMA_ASM = r'''"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, "
      "{ %0, %1, %2, %3 };\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])'''


def test_operands_map_to_the_routine_in_template_order():
    call = translate(MMA_ASM, 7)
    assert call.startswith('kg_emu::ptx::mma_m16n8k8_tf32("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 7, '
                           "kg_emu::ptx::out<'f'>(d[0]), ")
    assert call.endswith("kg_emu::ptx::in<'r'>(b[1]), kg_emu::ptx::in<'f'>(d[0]), kg_emu::ptx::in<'f'>(d[1]), "
                         "kg_emu::ptx::in<'f'>(d[2]), kg_emu::ptx::in<'f'>(d[3]))")
    cp = translate(r'"cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0)', 3)
    assert cp == ("kg_emu::ptx::cp_async_cg(\"cp.async.cg.shared.global\", 3, kg_emu::ptx::in<'r'>(s), "
                  "kg_emu::ptx::in<'l'>(src), 16ull, kg_emu::ptx::in<'r'>(ok ? 16 : 0))")
    assert translate(r'"cp.async.wait_group %0;\n" ::"n"(N) : "memory"', 1).endswith("kg_emu::ptx::in<'n'>(N))")
    assert translate(r'"ldmatrix.sync.aligned.m8n8.x1.trans.shared::cta.b16 {%0}, [%1 + 32];" : "=r"(x) : "r"(p)',
                     1).endswith("out<'r'>(x), kg_emu::ptx::in<'r'>(p) + 32ull)")
    assert translate('"" ::: "memory"', 1) == "((void)0)"


@pytest.mark.parametrize("body, name", [
    (r'"createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)', "createpolicy.fractional.L2::evict_first.b64"),
    (r'"{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"'
     r' : "=r"(done) : "r"(a), "r"(ph) : "memory"', "mbarrier.try_wait.parity.shared::cta.b64"),
    (r'"cvt.rna.tf32.f32 %0, %1, %2;" : "=r"(r) : "f"(x), "f"(y)', "cvt.rna.tf32.f32"),  # wrong operand count
    (r'"cvt.rn.bf16.f32 %0, %1;" : : "f"(x), "f"(y)', "cvt.rn.bf16.f32"),  # a destination that is no output
])
def test_instructions_outside_the_set_are_named(body, name):
    with pytest.raises(NotEmulated) as e:
        translate(body, 4)
    assert str(e.value) == name
    symbol = re.search(r"void (\w+)\(", not_emulated_call(name, 12)).group(1)
    assert not_emulated(f"kernel.cu:12: undefined reference to `{symbol}()'") == (12, name)


def test_the_rewrite_keeps_lines_also_inside_macros():
    src = ('#define CVT(r, v) asm("cvt.rn.f16.f32 %0, %1;" \\\n   : "=h"(r) : "f"(v))\n'
           f"__device__ void f(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {{\n  asm({MMA_ASM});\n}}\n")
    out = rewrite_source(src)
    assert out.count("\n") == src.count("\n") and "asm" not in out
    assert out.splitlines()[0].endswith("\\") and "kg_emu::ptx::mma_m16n8k8_tf32(" in out.splitlines()[3]


# ----- conversions ------------------------------------------------------------------------------------------
CVT_SRC = r"""
extern "C" __global__ void k(const float *x, int *out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i], w = x[n - 1 - i];
  unsigned tf, pb, ph;
  unsigned short b, h;
  float bb, hb;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(tf) : "f"(v));
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pb) : "f"(v), "f"(w));
  asm("cvt.f32.bf16 %0, %1;" : "=f"(bb) : "h"(b));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(ph) : "f"(v), "f"(w));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hb) : "h"(h));
  int *o = out + 7 * i;
  o[0] = tf; o[1] = b; o[2] = pb; o[3] = __float_as_int(bb); o[4] = h; o[5] = ph; o[6] = __float_as_int(hb);
}
"""
SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), 65504.0, 65519.99, 65520.0, -70000.0, 5.9604645e-08, 2.9802322e-08,
           4.4703484e-08, 1e-8, -3e-5, 6.1035156e-05, 3.4e38, -3.3961776e38, 1.4e-45,
           1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20]


@needs_gxx
def test_conversions_round_as_ptx_says():
    x = torch.cat([torch.tensor(SPECIAL), torch.randn(200) * torch.logspace(-9, 6, 200)]).float()
    out = torch.zeros(len(x) * 7, dtype=torch.int32)
    emulate(_spec(CVT_SRC, ["x", "out"], n="x.numel", block=64, grid=4), {"x": x, "out": out})
    got = out.view(-1, 7).numpy().astype(np.int64) & 0xFFFFFFFF
    u = x.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    assert np.array_equal(got[:, 0], (u + 0x1000) & 0xFFFFE000)  # tf32: ties away, 13 low bits cleared
    assert got[17, 0] == 0x3F802000 and got[19, 0] == 0xBF802000 and got[18, 0] == 0x3F804000  # the ties, by hand
    bf = x.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF  # PyTorch rounds to nearest even
    hf = x.to(torch.float16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    assert np.array_equal(got[:, 1], bf) and np.array_equal(got[:, 4], hf)
    assert got[20, 1] == 0x3F80 and got[21, 1] == 0x3F82 and got[22, 1] == 0x3F81  # bf16 ties to even, by hand
    assert got[4, 4] == 0x7BFF and got[5, 4] == 0x7BFF and got[6, 4] == 0x7C00 and got[9, 4] == 0  # f16 edges
    assert np.array_equal(got[:, 2], bf << 16 | bf[::-1]) and np.array_equal(got[:, 5], hf << 16 | hf[::-1])
    back = torch.from_numpy(got[:, 3].astype(np.uint32).view(np.int32)).view(torch.float32)
    assert torch.equal(back, x.to(torch.bfloat16).float())
    back = torch.from_numpy(got[:, 6].astype(np.uint32).view(np.int32)).view(torch.float32)
    assert torch.equal(back, x.to(torch.float16).float())


@needs_gxx
def test_a_nan_converts_to_the_canonical_nan():
    x = torch.tensor([float("nan"), -float("nan")])
    out = torch.zeros(14, dtype=torch.int32)
    emulate(_spec(CVT_SRC, ["x", "out"], n=2, block=2), {"x": x, "out": out})
    got = out.view(2, 7)
    assert (got[:, 0] == 0x7FFFFFFF).all() and (got[:, 1] == 0x7FFF).all() and (got[:, 4] == 0x7FFF).all()


EX2_SRC = r"""
extern "C" __global__ void k(const float *x, float *out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x[i]));
  out[i] = r;
}
"""


@needs_gxx
def test_ex2_is_two_to_the_x_with_subnormals_flushed():
    x = torch.tensor([0.0, 1.0, -1.0, 10.5, -126.0, -127.0, -149.0, -300.0, 128.0, float("-inf"), float("inf"),
                      1e-40, -1e-40, 0.3]).float()
    out = torch.full_like(x, float("nan"))
    emulate(_spec(EX2_SRC, ["x", "out"], n="x.numel", block=32), {"x": x, "out": out})
    want = torch.exp2(x.double()).float()
    want[(want > 0) & (want < 2 ** -126)] = 0.0  # a subnormal result flushes to zero
    want[11:13] = 1.0  # a subnormal input flushes to zero first: 2^0
    assert torch.equal(out, want), (out, want)
    assert out[4] == 2 ** -126 and out[5] == 0 and out[9] == 0 and out[10] == float("inf")


NAMED_SRC = r"""
extern "C" __global__ void k(float *out, int mode) {
  __shared__ float box[64];  // warps 0-1 produce, warps 2-3 consume, twice, through barriers 1 and 2 of 128 threads
  const int tid = threadIdx.x, warp = tid >> 5;
  for (int round = 0; round < 2; ++round) {
    if (warp < 2) {
      if (round > 0) asm volatile("bar.sync 2, 128;" ::: "memory");  // the consumers have read round - 1
      box[tid] = (float)(tid + 100 * round);
      asm volatile("bar.arrive %0, %1;" ::"r"(1), "r"(mode == 1 ? 64 : 128) : "memory");
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(128) : "memory");
      out[64 * round + tid - 64] = box[tid - 64];
      if (round == 0 && mode != 2) asm volatile("bar.arrive 2, 128;" ::: "memory");
    }
  }
}
"""


@needs_gxx
def test_named_barriers_order_producers_and_consumers():
    emulate(_spec(NAMED_SRC, ["out"], n=0, block=128), {"out": (out := torch.full((128,), float("nan")))})
    assert torch.equal(out, torch.cat([torch.arange(64.0), torch.arange(64.0) + 100]))


@needs_gxx
# mode 1: the producers count 64 at barrier 1 (it completes without the consumers, who then wait for ever, or the
# counts meet mismatched: the warp order decides); mode 2: the consumers never release the producers' round 1
@pytest.mark.parametrize("mode, why", [(1, "barrier 1 is waited for by|deadlock: .* 128 at named barriers"),
                                       (2, "deadlock: .* 128 at named barriers")])
def test_named_barriers_report_mismatched_counts_and_deadlocks(mode, why):
    out = torch.zeros(128)
    with pytest.raises(EmuError, match=why):
        emulate(_spec(NAMED_SRC, ["out"], n=mode, block=128), {"out": out})


# ----- mma.sync: each lane's registers in, its D fragment out; the matrices from the PTX ISA's layouts ------
MMA_SRC = r"""
extern "C" __global__ void k(const unsigned *a, const unsigned *b, const float *c, const int *live, float *d) {
  const int l = threadIdx.x;
  for (int kind = 0; kind < 3; ++kind) {  // tf32, bf16, f16: 128 a, 64 b, 128 c and 128 d values each
    const unsigned *ak = a + 128 * kind, *bk = b + 64 * kind;
    float acc[4] = {c[128 * kind + 4 * l], c[128 * kind + 4 * l + 1], c[128 * kind + 4 * l + 2], c[128 * kind + 4 * l + 3]};
    const unsigned ar[4] = {ak[4 * l], ak[4 * l + 1], ak[4 * l + 2], ak[4 * l + 3]}, br[2] = {bk[2 * l], bk[2 * l + 1]};
    if (l < live[0]) {
      if (kind == 0)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, "
                     "{ %8, %9 }, { %0, %1, %2, %3 };\n"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
      else if (kind == 1)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, "
                     "{ %8, %9 }, { %0, %1, %2, %3 };\n"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
      else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, "
                     "{ %8, %9 }, { %0, %1, %2, %3 };\n"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
    }
    for (int i = 0; i < 4; ++i) d[128 * kind + 4 * l + i] = acc[i];
  }
}
"""
MMA_KINDS = ("tf32", "bf16", "f16")
_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _bits(x: torch.Tensor, kind: str) -> np.ndarray:
    """The raw bits of ``x`` as a register of ``kind`` holds one element (tf32: 32 bits; bf16/f16: 16)."""
    if kind == "tf32":
        return x.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    return x.to(_DTYPES[kind]).view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def _int32(v: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(v.astype(np.uint32).view(np.int32).reshape(-1).copy())


def _fragments(kind: str, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
    """Per-lane registers (a: 32 x 4, b: 32 x 2, c: 32 x 4) from A (16 x k), B (k x 8), C (16 x 8), g = lane / 4,
    t = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k8" .tf32 and "for mma.m16n8k16" .f16/.bf16; two
    16-bit elements share a register, the lower column or row in the low half)."""
    a, b = np.zeros((32, 4), np.int64), np.zeros((32, 2), np.int64)
    c = np.zeros((32, 4), np.float32)
    ha, hb = _bits(A, kind), _bits(B, kind)
    for lane in range(32):
        g, t = divmod(lane, 4)
        c[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
        if kind == "tf32":
            a[lane] = [ha[g, t], ha[g + 8, t], ha[g, t + 4], ha[g + 8, t + 4]]
            b[lane] = [hb[t, g], hb[t + 4, g]]
        else:
            a[lane] = [ha[r, k] | ha[r, k + 1] << 16 for r, k in ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))]
            b[lane] = [hb[k, g] | hb[k + 1, g] << 16 for k in (2 * t, 2 * t + 8)]
    return _int32(a), _int32(b), torch.from_numpy(c.reshape(-1))


def _d_matrix(d: torch.Tensor) -> torch.Tensor:
    D = torch.empty(16, 8)
    for lane, v in enumerate(d.view(32, 4)):
        g, t = divmod(lane, 4)
        D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = v
    return D



def _mma_run(live: int, gen: torch.Generator | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the probe on random A, B, C of each kind; (D from the lanes' fragments, A @ B + C) per kind."""
    frags, want = [], []
    for kind in MMA_KINDS:
        k = 8 if kind == "tf32" else 16
        # values exact in every input type, and small sums: D must equal A @ B + C exactly
        A, B = (torch.randint(-16, 17, s, generator=gen).float() / 8 for s in ((16, k), (k, 8)))
        C = torch.randint(-64, 65, (16, 8), generator=gen).float() / 4
        a, b, c = _fragments(kind, A, B, C)
        if kind == "tf32":  # the tensor core reads a tf32 operand's top 19 bits: low bits set are ignored
            a, b = (v | torch.randint(0, 0x2000, v.shape, generator=gen, dtype=torch.int32) for v in (a, b))
        frags.append((a, b, c))
        want.append(A @ B + C)
    a, b, c = (torch.cat(parts) for parts in zip(*frags))
    d = torch.full((3 * 128,), float("nan"))
    emulate(_spec(MMA_SRC, ["a", "b", "c", "live", "d"]),
            {"a": a, "b": b, "c": c, "live": torch.tensor([live], dtype=torch.int32), "d": d})
    return [(_d_matrix(part), w) for part, w in zip(d.view(3, 128), want)]


@needs_gxx
def test_mma_fragment_layouts_and_products():
    for kind, (got, want) in zip(MMA_KINDS, _mma_run(32, torch.Generator().manual_seed(1))):
        assert torch.equal(got, want), kind


@needs_gxx
def test_mma_in_divergent_code_is_an_error():
    with pytest.raises(EmuError, match=r"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 \(kernel.cu line 10\) needs "
                                       r"all 32 lanes of warp 0, but lanes 0xffff0000 have exited"):
        _mma_run(16)


# ----- ldmatrix: lane 8j + r gives row r of matrix j; lane l gets the pair (l / 4, 2 (l % 4) + {0, 1}) -------
LDMATRIX_SRC = r"""
extern "C" __global__ void k(const unsigned short *src, const int *rows, const int *offset, unsigned *out) {
  __shared__ __align__(16) unsigned short sm[32 * 8];
  const int l = threadIdx.x;
  for (int i = l; i < 32 * 8; i += 32) sm[i] = src[i];
  __syncthreads();
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(sm + 8 * rows[l])) + offset[0];
  unsigned d[4][4] = {};
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0][0]), "=r"(d[0][1]), "=r"(d[0][2]), "=r"(d[0][3]) : "r"(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[1][0]), "=r"(d[1][1]), "=r"(d[1][2]), "=r"(d[1][3]) : "r"(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(d[2][0]), "=r"(d[2][1]) : "r"(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared::cta.b16 {%0}, [%1];\n" : "=r"(d[3][0]) : "r"(addr));
  for (int v = 0; v < 4; ++v)
    for (int i = 0; i < 4; ++i) out[(v * 32 + l) * 4 + i] = d[v][i];
}
"""
LDMATRIX_VARIANTS = [(4, False), (4, True), (2, True), (1, False)]  # (matrices, .trans), in the kernel's order


def _ldmatrix(rows: torch.Tensor, offset: int) -> np.ndarray:
    src = torch.arange(256, dtype=torch.int32).to(torch.int16) * 3 + 1000
    out = torch.full((4 * 128,), -1, dtype=torch.int32)
    emulate(_spec(LDMATRIX_SRC, ["src", "rows", "offset", "out"]),
            {"src": src, "rows": rows, "offset": torch.tensor([offset], dtype=torch.int32), "out": out})
    return out.view(4, 32, 4).numpy().astype(np.int64) & 0xFFFFFFFF


@needs_gxx
def test_ldmatrix_fragments():
    rows = torch.randperm(32, generator=torch.Generator().manual_seed(3)).int()  # lane l points at row rows[l]
    got = _ldmatrix(rows, 0)
    S = (torch.arange(256) * 3 + 1000).view(32, 8).numpy()
    for v, (n, trans) in enumerate(LDMATRIX_VARIANTS):
        for lane in range(32):
            r, c = lane // 4, 2 * (lane % 4)
            for j in range(4):
                if j >= n:
                    assert got[v, lane, j] == 0
                    continue
                M = S[rows[8 * j: 8 * j + 8].numpy()]  # matrix j: the rows its 8 lanes point at
                lo, hi = (M[c, r], M[c + 1, r]) if trans else (M[r, c], M[r, c + 1])
                assert got[v, lane, j] == lo | hi << 16, (n, trans, lane, j)


@needs_gxx
@pytest.mark.parametrize("offset, why", [
    (16, r"out-of-bounds shared-memory access by ldmatrix.sync.aligned.m8n8.x4.shared.b16 \(kernel.cu line 9\): "
         r"address 0x200, 16 bytes; the block's shared memory is 0x0-0x200 \(static\)"),
    (4, r"lane 0's row address 0x4 is not 16-byte aligned"),
])
def test_ldmatrix_out_of_range_or_misaligned_rows_are_errors(offset, why):
    with pytest.raises(EmuError, match=why):
        _ldmatrix(torch.arange(32, dtype=torch.int32), offset)


# ----- cp.async: copies land at the wait that covers their group, not before ----------------------------------
CP_ASYNC_SRC = r"""
extern "C" __global__ void k(const float *x, const int *shift, float *out) {
  __shared__ __align__(16) float s[3 * 128];
  const int l = threadIdx.x;
  for (int i = l; i < 3 * 128; i += 32) s[i] = -1.f;
  __syncthreads();
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(s));
  float *o = out + 10 * l;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(base + 16 * l), "l"(x + 4 * l));
  asm volatile("cp.async.commit_group;\n" ::);
  // 8 bytes of which the source gives 4: the other 4 are zero-filled
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(base + 512 + 16 * l), "l"(x + 128 + 4 * l), "r"(4));
  asm volatile("cp.async.commit_group;\n" ::);
  o[0] = s[4 * l + 3];                // stale: nothing has landed before a wait
  asm volatile("cp.async.wait_group %0;\n" ::"n"(1));
  o[1] = s[4 * l + 3];                // group 1 landed
  o[2] = s[128 + 4 * l];              // group 2 has not
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  o[3] = s[128 + 4 * l];
  o[4] = s[128 + 4 * l + 1];          // zero fill
  o[5] = s[128 + 4 * l + 2];          // past cp-size: untouched
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(base + 1024 + 4 * l + shift[0]), "l"(x + 256 + l));
  asm volatile("cp.async.wait_group 0;\n" ::);
  o[6] = s[256 + l];                  // not committed: no wait_group covers it
  asm volatile("cp.async.wait_all;\n" ::);
  o[7] = s[256 + l];
  o[8] = __isShared(s) + 2 * __isShared(x);
  o[9] = (float)base;
}
"""


@needs_gxx
def test_cp_async_groups_land_at_their_wait():
    x = torch.randn(288)
    out = torch.full((320,), float("nan"))
    emulate(_spec(CP_ASYNC_SRC, ["x", "shift", "out"]), {"x": x, "shift": torch.zeros(1, dtype=torch.int32), "out": out})
    got, lane = out.view(32, 10), torch.arange(32)
    minus1 = torch.full((32,), -1.0)
    assert torch.equal(got[:, 0], minus1) and torch.equal(got[:, 1], x[4 * lane + 3])
    assert torch.equal(got[:, 2], minus1) and torch.equal(got[:, 3], x[128 + 4 * lane])
    assert torch.equal(got[:, 4], torch.zeros(32)) and torch.equal(got[:, 5], minus1)
    assert torch.equal(got[:, 6], minus1) and torch.equal(got[:, 7], x[256 + lane])
    assert torch.equal(got[:, 8], torch.ones(32)) and torch.equal(got[:, 9], torch.zeros(32))  # the static section at 0


@needs_gxx
@pytest.mark.parametrize("shift, why", [
    (4096, r"thread \((\d+),0,0\): out-of-bounds shared-memory access by cp.async.ca.shared.global \(kernel.cu line 22\): "
           r"address 0x14[0-7][0-9a-f], 4 bytes; the block's shared memory is 0x0-0x600 \(static\)$"),
    (2, r"cp.async.ca.shared.global \(kernel.cu line 22\): misaligned shared address 0x4[0-7][26ae] for a 4-byte copy"),
])
def test_cp_async_to_a_bad_shared_address_is_an_error(shift, why):
    with pytest.raises(EmuError, match=why):
        emulate(_spec(CP_ASYNC_SRC, ["x", "shift", "out"]),
                {"x": torch.randn(288), "shift": torch.tensor([shift], dtype=torch.int32), "out": torch.zeros(320)})


@needs_gxx
def test_shared_window_conversions_check_their_pointer():
    src = r"""
extern "C" __global__ void k(const float *x, const int *global, float *out) {
  extern __shared__ float dyn[];
  __shared__ float st[6];
  unsigned a;
  asm("cvta.to.shared.u32 %0, %1;" : "=r"(a) : "l"(dyn + 2));
  out[0] = (float)a;
  out[1] = (float)__cvta_generic_to_shared(st + 6);  // one past the end converts
  dyn[3] = 7.f;
  out[2] = *(float *)__cvta_shared_to_generic(a + 4);
  out[3] = (float)__cvta_generic_to_shared(global[0] ? (const void *)x : (const void *)dyn);
}
"""
    spec = KernelSpec.model_validate({"source": src, "steps": [{"kernel": "k", "grid": 1, "block": 1, "shared_mem": 64,
                                                                "args": [{"name": n} for n in ("x", "global", "out")]}]})
    out = torch.zeros(4)
    emulate(spec, {"x": torch.zeros(1), "global": torch.zeros(1, dtype=torch.int32), "out": out})
    assert out.tolist() == [128 + 8, 24, 7, 128]  # the dynamic part starts at the static size rounded up to 128
    with pytest.raises(EmuError, match=r"__cvta_generic_to_shared of 0x[0-9a-f]+, which is not in the block's shared memory"):
        emulate(spec, {"x": torch.zeros(1), "global": torch.ones(1, dtype=torch.int32), "out": out})


@needs_gxx
def test_an_instruction_outside_the_set_fails_to_compile_where_emitted():
    src = r"""
__device__ unsigned long long policy() { unsigned long long p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p; }
extern "C" __global__ void k(float *out) { out[0] = (float)policy(); }
"""
    spec = KernelSpec.model_validate({"source": src, "steps": [{"kernel": "k", "grid": 1, "block": 1,
                                                                "args": [{"name": "out"}]}]})
    with pytest.raises(EmuError, match=r"inline PTX asm 'createpolicy.fractional.L2::evict_first.b64' \(kernel.cu line 2 "
                                       r"in k\) is not emulated"):
        emulate(spec, {"out": torch.zeros(1)})


# ----- the playbook's kernels with inline PTX, against PyTorch ---------------------------------------------------
TF32_SMALL = {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "STAGES": 3}
TF32_SHAPE = (192, 128, 48)  # M, N, K: whole tiles (the variant's constraint), three k tiles


@needs_gxx
@pytest.mark.parametrize("config", [TF32_SMALL, {"BM": 64, "BN": 64, "BK": 16, "WM": 64, "WN": 32, "FLUSH": 0}])
def test_tf32x3_matmul_matches_pytorch(config):
    assert cases.run_variant("matmul", "tf32x3", config, shape=TF32_SHAPE) == {}


def _tf32x3_mismatches(defaults: dict, patch: tuple[str, str] | None = None) -> dict[str, str]:
    problem = cases.load("matmul", TF32_SHAPE)
    spec = sgemm_tf32x3(explain(problem), defaults)
    if patch:
        assert patch[0] in spec.source
        spec = spec.model_copy(update={"source": spec.source.replace(*patch)})
    case = cases.make_case(problem)
    emulate(spec, case.tensors, config=TF32_SMALL, sizes=case.sizes)
    return cases.mismatches(case)


@needs_gxx
def test_plain_tf32_fails_the_fp32_check():
    assert list(_tf32x3_mismatches({"TERMS": TERMS_PLAIN})) == ["out"]  # the emulated tf32 rounding is real


@needs_gxx
def test_a_missing_cp_async_wait_gives_wrong_results():
    assert list(_tf32x3_mismatches({}, ("tf_wait<STAGES - 2>();\n    __syncthreads();", "__syncthreads();"))) == ["out"]


@needs_gxx
def test_cp_async_matmul_and_conv_match_pytorch():
    assert cases.run_variant("matmul", "tiled", {"CP_ASYNC": 1}, shape=(128, 128, 64)) == {}
    assert cases.run_variant("conv2d", "igemm", None, shape=(2, 3, 16, 16)) == {}  # 4-byte copies, zero fill


@needs_gxx
@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("config", [{"STAGES": 3, "SMEM_T": 0}, {}])  # a cp.async ring; B by cp.async, A by registers
def test_gemm_tiled_with_cp_async_matches_pytorch(tmp_path, config):
    path = resized_copy(KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py", tmp_path, batch_size=37, in_features=72,
                        out_features=44)
    small = {"BM": 32, "BN": 32, "TM": 4, "TN": 4, "BK": 8, "CP_ASYNC": 1}
    assert cases.run_variant(path, "tiled", {**small, **config}) == {}
