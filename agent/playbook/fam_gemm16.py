"""Playbook family (registry) ``gemm16``: the GEMMs of the ``gemm`` family and the plain 2-D ``A @ B`` of the
built-in ``matmul`` family when every tensor is bf16, or every one fp16: ``nn.Linear`` + an elementwise epilogue
(bias, activations, residual inputs, scales), ``bmm``, ``einsum`` of one contracted index, transposed operands,
triu/tril of a product. The facts are the gemm family's (:func:`.fam_gemm.read_gemm`, read whatever the dtype) plus
``dtype``; its one variant is the Hopper GEMM core in bf16/fp16 (:func:`.wgmma_variants.gemm16_wgmma`: wgmma,
fp32 accumulation, the epilogue in fp32 before one rounding at the store), so it is offered on sm_90 only.

Asked after ``gemm_rows`` (a GEMM followed by row reductions or norms is that family's, which says what it covers)
and before ``gemm`` (which refuses 16-bit problems); an fp32 problem or a forward that is no GEMM is not its own
(None). A matrix-vector product (N == 1) is refused by the variant's constraints, and ``diag(d) @ M`` (a row
scaling) stays with the gemm family, which says it is fp32 only.
"""

from __future__ import annotations

from kerngen.agent.playbook.fam_gemm import read_gemm
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.match import FamilyMatch, Read
from kerngen.agent.playbook.wgmma_variants import GEMM16_IDEAS, VARIANT, gemm16_wgmma

__all__ = ["DTYPES", "FAMILY", "recognise"]

DTYPES = ("bfloat16", "float16")


def recognise(r: Read) -> FamilyMatch | None:
    if len(r.dtypes) != 1 or next(iter(r.dtypes)) not in DTYPES:
        return None
    m = read_gemm(r, keep_plain=True)
    if m is None or m.facts.get("kind") != "gemm":
        return None  # a row scaling (diag(d) @ M): the gemm family says it is fp32 only
    m.facts["dtype"] = next(iter(r.dtypes))
    m.message = m.message.replace("gemm:", f"gemm16 ({m.facts['dtype']}):", 1)
    return m


FAMILY = Family(name="gemm16", recognise=recognise, variants={VARIANT: gemm16_wgmma}, ideas=GEMM16_IDEAS)
