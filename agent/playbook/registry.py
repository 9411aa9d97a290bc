"""The playbook families built as :class:`~.family.Family` records, in the order ``explain`` asks
them (before the seven built-in families). A GEMM followed by row ops (``gemm_rows``) before GEMM +
elementwise epilogue (``gemm16`` for bf16/fp16, then ``gemm``), and a conv2d followed by reductions, pools or norms (``conv_tail``)
before conv + epilogue (``conv_epi``, which refuses those): the first family that claims a problem
wins, and a refusal stops the search. Then 3-D and transposed convolutions, reductions, channel
norms, losses, pooling and scans. Each returns None for problems that are not its own."""

from __future__ import annotations

from kerngen.agent.playbook import fam_attention  # the most specific: first
from kerngen.agent.playbook import (fam_conv_epi, fam_conv_nd, fam_conv_tail, fam_gemm, fam_gemm_rows, fam_loss, fam_norm,
                                   fam_pool, fam_reduce, fam_scan)
from kerngen.agent.playbook import fam_gemm16  # wgmma hook (issue 35): bf16/fp16 GEMMs, before gemm (fp32 only)
from kerngen.agent.playbook.family import Family

__all__ = ["REGISTRY", "by_name"]

REGISTRY: tuple[Family, ...] = tuple(
    f for f in (fam_attention.FAMILY,
                fam_gemm_rows.FAMILY, fam_gemm16.FAMILY, fam_gemm.FAMILY, fam_conv_tail.FAMILY, fam_conv_epi.FAMILY, fam_conv_nd.FAMILY,
                fam_reduce.FAMILY, fam_norm.FAMILY, fam_loss.FAMILY, fam_pool.FAMILY, fam_scan.FAMILY) if f is not None)


def by_name(name: str) -> Family | None:
    return next((f for f in REGISTRY if f.name == name), None)
