"""The playbook families built as :class:`~.family.Family` records, in the order ``explain`` asks
them (before the seven built-in families): GEMM + epilogue and convolution + epilogue first (they
claim matmul and conv problems the built-in plain kernels do not cover), then reductions, channel
norms, losses, pooling and scans. Each returns None for problems that are not its own."""

from __future__ import annotations

from kerngen.agent.playbook import fam_conv_epi, fam_gemm, fam_loss, fam_norm, fam_pool, fam_reduce, fam_scan
from kerngen.agent.playbook.family import Family

__all__ = ["REGISTRY", "by_name"]

REGISTRY: tuple[Family, ...] = tuple(
    f for f in (fam_gemm.FAMILY, fam_conv_epi.FAMILY, fam_reduce.FAMILY, fam_norm.FAMILY, fam_loss.FAMILY,
                fam_pool.FAMILY, fam_scan.FAMILY) if f is not None)


def by_name(name: str) -> Family | None:
    return next((f for f in REGISTRY if f.name == name), None)
