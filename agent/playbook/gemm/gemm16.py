"""Playbook family ``gemm16``: the GEMMs of the ``gemm`` family and the plain 2-D ``A @ B`` of the
built-in ``matmul`` family when every tensor is bf16, or every one fp16: ``nn.Linear`` + an elementwise epilogue
(bias, activations, residual inputs, scales), ``bmm``, ``einsum`` of one contracted index, transposed operands,
triu/tril of a product. The facts are the gemm family's (:func:`.gemm.gemm.read_gemm`, read whatever the dtype) plus
``dtype``; its one variant is the Hopper GEMM core in bf16/fp16 (:func:`.gemm.wgmma.gemm16_wgmma`: wgmma,
fp32 accumulation, the epilogue in fp32 before one rounding at the store), so it is offered on sm_90 only.

More specific than ``gemm`` (asked before it: it refuses 16-bit problems; ``matmul`` leaves
them), after ``gemm_rows`` (a GEMM followed by row reductions or norms, fp32 only); an fp32 problem or a forward that
is no GEMM is not its own (None). A matrix-vector product (N == 1) is refused by the variant's constraints, and ``diag(d) @ M`` (a row
scaling) stays with the gemm family, which says it is fp32 only.
"""

from __future__ import annotations

from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.gemm.gemm import GEMM, read_gemm
from kerngen.agent.playbook.gemm.wgmma import GEMM16_IDEAS, VARIANT, gemm16_wgmma
from kerngen.agent.playbook.graph import Graph

__all__ = ["DTYPES", "GEMM16"]

DTYPES = ("bfloat16", "float16")


def _recognise(g: Graph) -> FamilyMatch | None:
    if len(g.dtypes) != 1 or next(iter(g.dtypes)) not in DTYPES:
        return None
    m = read_gemm(g, keep_plain=True)
    if m is None or m.facts.kind != "gemm":
        return None  # a row scaling (diag(d) @ M): the gemm family says it is fp32 only
    dtype = next(iter(g.dtypes))
    m.facts = m.facts.model_copy(update={"dtype": dtype})
    m.message = m.message.replace("gemm:", f"gemm16 ({dtype}):", 1)
    return m


GEMM16 = Family(name="gemm16", leads=GEMM.leads, recognise=_recognise,
                constraints=(*GEMM.constraints, "every tensor bf16, or every one fp16"), priority=-1,
                variants={VARIANT: gemm16_wgmma}, ideas=GEMM16_IDEAS)
