"""TERMS, the tensor-core products per fp32 product of the tf32 GEMM and convolution kernels (mma.sync ``tf32x3``
variants, the Hopper ``wgmma`` core), and what the problem's precision makes of it.

At the default precision (true fp32, checked at 1e-4) only TERMS 3 is offered: 3xTF32, small*big + big*small +
big*big, fp32 accuracy; plain TF32 (TERMS 1) exists there only when a caller asks for it, to show that the check
rejects it. At ``--precision tf32`` (the reference runs with PyTorch's TF32 settings, the tolerance is measured) a
plain TF32 kernel is what the user asked for: TERMS becomes tunable over 1 and 3 and defaults to 1 (big*big alone,
a third of the tensor-core work); the harness's TF32 check decides whether a configuration passes.
"""

from __future__ import annotations

from typing import Mapping

from kerngen.harness.spec.spec import KernelSpec

__all__ = ["PLAIN_TF32", "TERMS_PLAIN", "TERMS_SPLIT", "TERMS_VALUES", "idea_text", "offer_terms", "plain_default",
           "terms_line"]

TERMS_SPLIT = 3  # a_lo*b_hi + a_hi*b_lo + a_hi*b_hi: fp32 accuracy
TERMS_PLAIN = 1  # a_hi*b_hi: plain TF32, offered at --precision tf32 only
TERMS_VALUES = (TERMS_PLAIN, TERMS_SPLIT)
PLAIN_TF32 = "plain TF32 (checked at --precision tf32)"
# what a spec's description adds at --precision tf32 (its text before describes the 3xTF32 products)
DESCRIPTION = (f"; TERMS (tensor-core products per k8 step) 1 = {PLAIN_TF32}: hi*hi alone, a third of the "
               "tensor-core work, not fp32-accurate, the default here; 3 = the 3xTF32 products")
IDEA = (f"[--precision tf32: TERMS 1, {PLAIN_TF32}, is this kernel's default: one tensor-core product per k8 step "
        "instead of 3xTF32's three; TERMS 3 stays tunable] ")


def offer_terms(tunables: dict[str, list[int]], chosen: dict[str, int], defaults: Mapping[str, int], tf32: bool) -> str:
    """At ``--precision tf32`` (``tf32``): TERMS tunable over 1 and 3 in ``tunables``, 1 in ``chosen`` (the spec's
    defaults) unless ``defaults`` ask for a value; returns the description's addition. Otherwise nothing changes
    and it returns ""."""
    if not tf32:
        return ""
    tunables["TERMS"] = list(TERMS_VALUES)
    chosen["TERMS"] = defaults.get("TERMS", TERMS_PLAIN)
    return DESCRIPTION


def _terms_keys(spec: KernelSpec) -> list[str]:
    return [k for k in spec.tunables if k == "TERMS" or k.endswith("_TERMS")]  # a regions spec's r0_TERMS, ...


def plain_default(spec: KernelSpec | None) -> bool:
    """The spec offers plain TF32 and starts there (what ``--precision tf32`` builds)."""
    if spec is None:
        return False
    return any(TERMS_PLAIN in spec.tunables[k] and spec.defaults.get(k) == TERMS_PLAIN and
               TERMS_SPLIT in spec.tunables[k] for k in _terms_keys(spec))


def idea_text(text: str, spec: KernelSpec | None) -> str:
    """An idea's text as proposed for a variant whose offered ``spec`` it builds: said to be plain TF32 where
    ``--precision tf32`` made it so, else unchanged."""
    return IDEA + text if plain_default(spec) else text


def terms_line(spec: KernelSpec | None) -> str:
    """For a variant's line in ``kerngen playbook``: what TERMS offers, or "" where nothing is plain TF32."""
    return f"; TERMS 1 = {PLAIN_TF32}, the default; TERMS 3 = 3xTF32" if plain_default(spec) else ""
