"""Render the playbook's CUDA-C templates into complete :class:`KernelSpec` s for a matched problem.

Every variant is a function ``(match, defaults) -> KernelSpec``: the source comes from a jinja2
template (StrictUndefined) rendered with the problem's facts (dtype, op, eps, which parameters
exist); shapes enter as ``defines`` (expressions over the bound tensors' shapes, so the same spec
follows the tensors it is resolved against) and ``constraints`` reject every shape the kernel
cannot handle. The builders live in :mod:`.builders_rows` and :mod:`.builders_gemm`; this module
is the table of variants.
"""

from __future__ import annotations

from typing import Callable

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.builders_gemm import conv2d_direct, conv2d_igemm, conv_relu_pool, sgemm_simple, sgemm_tiled
from kerngen.agent.playbook.build_conv_tf32 import conv2d_tf32x3
from kerngen.agent.playbook.build_tf32 import PADDED_VARIANT, sgemm_tf32x3, sgemm_tf32x3_padded
from kerngen.agent.playbook.builders_rows import elementwise_vec, layernorm_coop, layernorm_split, rmsnorm_two_pass, rows_reg, softmax_long
from kerngen.agent.playbook.match import FamilyMatch
from kerngen.agent.playbook.registry import REGISTRY
from kerngen.agent.playbook.wgmma_variants import VARIANT as WGMMA, matmul_wgmma
from kerngen.agent.playbook.render import COOP_NB, render

__all__ = ["COOP_NB", "VARIANTS", "build", "render"]


Builder = Callable[[FamilyMatch, dict[str, int]], KernelSpec]
VARIANTS: dict[str, dict[str, Builder]] = {
    "elementwise": {"vec": elementwise_vec},
    "softmax": {"rows_reg": rows_reg, "long": softmax_long},
    "layernorm": {"rows_reg": rows_reg, "split": layernorm_split, "coop": layernorm_coop},
    "rmsnorm": {"rows_reg": rows_reg, "two_pass": rmsnorm_two_pass},
    "conv2d": {"direct": conv2d_direct, "igemm": conv2d_igemm, "tf32x3": conv2d_tf32x3},
    "conv_relu_maxpool": {"fused": conv_relu_pool},
    "matmul": {"tiled": sgemm_tiled, "simple": sgemm_simple, "tf32x3": sgemm_tf32x3,
               PADDED_VARIANT: sgemm_tf32x3_padded,
               WGMMA: matmul_wgmma},  # hook (issue 35): the Hopper core, 3xTF32; offered on sm_90 only
}
VARIANTS.update({f.name: dict(f.variants) for f in REGISTRY})


def build(m: FamilyMatch, variant: str, defaults: dict[str, int] | None = None) -> KernelSpec:
    return VARIANTS[m.family][variant](m, dict(defaults or {}))
