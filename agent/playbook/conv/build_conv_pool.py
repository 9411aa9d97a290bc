"""The tensor-core variants of ``conv_relu_maxpool`` (:mod:`.conv.conv2d`): the convolution + ReLU as conv_epi's
``wgmma`` (sm_90a) or ``tf32x3`` kernel (3xTF32 at fp32 accuracy) writing a scratch buffer, then the ``pool``
family's ``window`` kernel reading it. No new kernel: the problem's graph is cut into its two regions (conv2d + relu,
max_pool2d), each built by its own family's builder at its shapes, and the two specs joined as several regions are
(:func:`.regions_spec.join`: tunables ``r0_*`` / ``r1_*``, the conv's output in the scratch buffer ``r0_out``).

The fused FFMA kernel writes a fourth of the conv's output and no intermediate; these write and read it once more
in exchange for the tensor cores (4x H200, 2026-11-28: the VGG-style model's fused regions lost to cuDNN 1.3786 ms
against 0.5233, while its plain conv + relu regions won on wgmma and tf32x3).

The fused FFMA kernel itself (:func:`conv_relu_pool`, ``conv_relu_pool.cu.j2``, the default variant) is here too: it
reads the convolution's geometry as conv_epi's kernels do (:func:`.conv.build_epi.frame`).
"""

from __future__ import annotations

from typing import Callable

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv import build_wgmma as wgmma
from kerngen.agent.playbook.conv.build_epi import as_conv_epi, frame
from kerngen.agent.playbook.conv.build_tf32 import conv_epi_tf32x3
from kerngen.agent.playbook.conv.epi import read_conv_epi
from kerngen.agent.playbook.entry import A, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Graph, Ref, Tensor
from kerngen.agent.playbook.pool.build import pool_window
from kerngen.agent.playbook.pool.family import POOL
from kerngen.agent.playbook.region import Region, lead_of
from kerngen.agent.playbook.regions_spec import join
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render

__all__ = ["IDEAS", "MAX_CONV_SCRATCH", "TF32X3_POOL", "WGMMA_POOL", "conv_pool_tf32x3", "conv_pool_wgmma",
           "conv_relu_pool"]

WGMMA_POOL, TF32X3_POOL = f"{wgmma.VARIANT}_pool", "tf32x3_pool"
MAX_CONV_SCRATCH = 2**31  # elements of the conv's output held between the two kernels (8 GiB of fp32)
_SPEC_PREFIX = "playbook-conv-relu-maxpool-"


def conv_relu_pool(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """conv2d + relu + max-pool in one FFMA kernel (the family's default variant)."""
    f, fr = m.facts, frame(as_conv_epi(m))
    x, w = m.x.name, f.weight
    kernel = "conv_relu_maxpool"
    src = render("conv_relu_pool.cu.j2", kernel=kernel, has_bias=fr.template_vars["has_bias"])
    oc = f.OC
    ocb = next((v for v in (64, 32, 16, 48, 8, 4) if oc % v == 0), 4)
    oct_ = 16 if ocb % 16 == 0 else (8 if ocb % 8 == 0 else 4)
    d = pick(defaults, dict(PTW=16, PTH=8, OCB=ocb, OCT=oct_))
    pk, ps = f.PK, f.PS
    oh, ow = fr.out_hw
    poh, pow_ = f"({oh} - {pk}) // {ps} + 1", f"({ow} - {pk}) // {ps} + 1"
    defs = dict(fr.defines, PK_=pk, PS_=ps, POH_=poh, POW_=pow_)
    pr = f"(((PTH - 1) * {ps} + {pk}) - 1) * {f.SH} + {f.KH}"
    pc = f"(((PTW - 1) * {ps} + {pk}) - 1) * {f.SW} + {f.KW}"
    smem = f"4 * ({x}.shape[1] * {f.KH} * {f.KW} * OCB + {x}.shape[1] * ({pr}) * ({pc} + 1))"
    ocbs = sorted({v for v in (4, 8, 16, 32, 64, 128, oc) if oc % v == 0 and v % 4 == 0 and v <= 256})
    return make_spec(
        "playbook-conv-relu-maxpool",
        "conv2d + relu + max-pool fused: each thread keeps the PKxPK conv outputs under one pooled "
        "output for OCT channels in registers and writes max(relu); input rows reused across taps in "
        "registers; patch and weights in shared memory",
        src,
        dict(PTW=[4, 8, 16, 32], PTH=[1, 2, 4, 8, 16], OCB=ocbs or [4], OCT=[4, 8, 16]),
        d,
        defines=defs,
        constraints=fr.checks + [
            f"{x}.shape[0] <= 65535", f"{w}.shape[0] % OCB == 0", "OCB % OCT == 0", "OCT % 4 == 0",
            "PTW * PTH * (OCB // OCT) <= 1024", "PTW * PTH * (OCB // OCT) >= 32", f"{smem} <= {MAX_SMEM}",
            f"{poh} >= 1", f"{pow_} >= 1",
        ],
        steps=[dict(kernel=kernel, grid=["cdiv(POW_, PTW) * cdiv(POH_, PTH)", "OC_ // OCB", "N_"],
                    block=["PTW", "PTH", "OCB // OCT"], shared_mem=smem, args=fr.args(x, w))],
    )


def _regions(m: FamilyMatch) -> tuple[list[Region], list[FamilyMatch], dict[str, str]]:
    """The match's graph as its two regions (conv2d + relu, max_pool2d), their matches and where each tensor lives."""
    g = m.graph
    if g is None:
        raise ValueError("the match carries no graph to cut into the convolution and the pool")
    conv, relu, pool = g.live()
    if (conv.op, relu.op, pool.op) != ("conv2d", "relu", "max_pool2d") or relu["self"] != conv.name \
            or pool["self"] != relu.name:
        raise ValueError("the tensor-core variants take max_pool2d(relu(conv2d(x))) in this order only")
    head = Graph(g.inputs, g.params, (conv, relu), Ref(relu.name), dict(g.constants), dict(g.scalars))
    mid = Tensor(relu.name, relu.shape or (), relu.dtype or "float32")
    tail = Graph((mid,), (), (pool,), Ref(pool.name))
    matches = [read_conv_epi(head), POOL.recognise(tail)]
    if matches[0] is None or matches[1] is None:
        raise ValueError("conv_epi or pool does not take its part of the region")
    regions = []
    for i, (sub, part) in enumerate(zip((head, tail), matches)):
        part.precision = m.precision  # --precision tf32 reaches the conv's builder (TERMS 1 offered there)
        regions.append(Region(i, sub, lead_of(sub), tuple(n.name for n in sub.nodes), part))
    storage = {t.name: t.name for t in (*g.inputs, *g.params)} | {relu.name: "r0_out", pool.name: "out"}
    return regions, matches, storage


def _build(m: FamilyMatch, defaults: dict[str, int], variant: str,
           conv: Callable[[FamilyMatch, dict[str, int]], KernelSpec]) -> KernelSpec:
    regions, (mc, mp), storage = _regions(m)
    mine = [{k[3:]: v for k, v in defaults.items() if k.startswith(f"r{i}_")} for i in range(2)]
    specs = [conv(mc, mine[0]), pool_window(mp, mine[1])]
    g = m.graph
    problem = {t.name: t.shape for t in (*g.inputs, *g.params)} | {"out": g.out.shape}
    labels = [f"conv_epi {variant.removesuffix('_pool')} (conv2d + relu)", "pool window (max_pool2d)"]
    spec = join(regions, specs, storage, problem, labels, _SPEC_PREFIX + variant.replace("_", "-"))
    oh, ow = frame(mc).out_hw
    x = mc.facts.x
    # the scratch buffer's limit, over the problem's own input so that a refusal names it
    held = f"{x}.shape[0] * {mc.facts.OC} * ({oh}) * ({ow}) <= {MAX_CONV_SCRATCH}"
    return spec.model_copy(update=dict(constraints=[held, *spec.constraints]))


def conv_pool_wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, WGMMA_POOL, wgmma.conv_epi_wgmma)


def conv_pool_tf32x3(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, TF32X3_POOL, conv_epi_tf32x3)


# ---------------------------------------------------------------------------------------------
_UNMEASURED = "the conv at conv_epi's tensor-core speed plus one write and read of its output; not yet measured on a GPU"
IDEAS = (
    Entry("crp-wgmma-pool", "Run the convolution + ReLU on Hopper's wgmma core at fp32 accuracy (3xTF32: pre-passes "
          "split x and the weights into big + small tf32 planes, the im2col tiles gathered by cp.async, the weights' "
          "by TMA, FLUSH partial sums per k tile), the ReLU fused before the store into a scratch buffer; then the "
          "pool family's window kernel reads it once and writes the max.", P, _UNMEASURED, WGMMA_POOL,
          ({}, {"r0_GROUP_M": 16}), round0=True),
    Entry("crp-tf32x3-pool", "Run the convolution + ReLU as a 3xTF32 implicit GEMM on mma.sync (fp32 accuracy, "
          "sm_80 and later) with the ReLU fused before the store into a scratch buffer; then the pool family's window "
          "kernel reads it once and writes the max.", P, _UNMEASURED, TF32X3_POOL, ({},), round0=True),
    Entry("crp-wgmma-pool-tile", "Re-shape the wgmma convolution's tile: a narrower channel tile with two m64 blocks "
          "a consumer, or one consumer.", PAR, "0-20% of the conv", WGMMA_POOL,
          ({"r0_BN": 64, "r0_WGM": 2, "r0_STAGES": 2}, {"r0_CWG": 1, "r0_BN": 64, "r0_WGM": 2}),
          after=frozenset({WGMMA_POOL})),
    Entry("crp-pool-wider", "Change the pool kernel's outputs per thread along W (more re-use of each loaded row, or "
          "more threads).", A, "0-5% (the pool is a small part)", WGMMA_POOL, ({"r1_OPT": 4}, {"r1_OPT": 1}),
          after=frozenset({WGMMA_POOL})),
)
