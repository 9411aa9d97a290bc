"""Variant builders of the norm family (batch, instance and group normalization over an (N, C, *)
fp32 tensor): ``affine`` (eval-mode batch norm: running statistics, one pass), ``split`` (statistics
in chunks, a finalize kernel, an apply pass) and ``fused`` (a block per statistics group, two loops).

The match's facts (see :mod:`.norm.family`): ``kind`` (one of :data:`KINDS`), ``groups`` (group norm),
``eps``, and the bound names of ``weight``, ``bias``, ``running_mean``, ``running_var`` (or None).
Shapes enter as defines over the input's shape (``NORM_N``, ``NORM_C``, ``NORM_S``: batch,
channels, product of the spatial dims), so a spec follows the tensors it is resolved against."""

from __future__ import annotations

from dataclasses import dataclass

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render, shape_prod

__all__ = ["KINDS", "STATS_KINDS", "VARIANTS", "norm_affine", "norm_fused", "norm_split", "spec_name"]

FAMILY_NAME = "norm"
# what the reference computes: "running" = batch norm (or instance norm) with running statistics
# (eval mode); the others normalise with statistics of the input itself, biased variance
KINDS = ("running", "batch", "instance", "group")
STATS_KINDS = ("batch", "instance", "group")  # kinds that need a statistics pass over x
CPG_SMEM_MAX = 4096  # channels per group the fused kernel keeps (scale, shift) for in shared memory

BLOCKS = [128, 256, 512, 1024]
_WHAT = {"running": "batch norm with running statistics (eval mode)",
         "batch": "batch norm with batch statistics (per channel over N and the spatial dims)",
         "instance": "instance norm (per sample and channel over the spatial dims)",
         "group": "group norm (per sample and group of channels)"}


def spec_name(variant: str) -> str:
    return f"playbook-{FAMILY_NAME}-{variant.replace('_', '-')}"


@dataclass(frozen=True)
class Shape:
    """Expressions over the input's shape, and the problem's own values for the defaults."""

    x: str
    n: str
    c: str
    s: str  # product of the spatial dims ("1" for an (N, C) input)
    s_value: int

    @property
    def planes(self) -> str:
        return f"({self.n} * {self.c})"

    @property
    def plane_vectors(self) -> str:
        return f"(({self.s}) // VEC)"


def _shape(m: FamilyMatch) -> Shape:
    x = m.x
    s_value = 1
    for d in x.shape[2:]:
        s_value *= d
    return Shape(x.name, f"{x.name}.shape[0]", f"{x.name}.shape[1]", shape_prod(x.name, range(2, len(x.shape))), s_value)


def _groups(m: FamilyMatch, sh: Shape) -> tuple[str, str, str]:
    """(statistics groups, segments, vectors per segment) of a statistics kind (norm_common.cu.j2)."""
    kind = m.facts.kind
    if kind == "instance":
        return sh.planes, sh.planes, sh.plane_vectors
    if kind == "group":
        g = int(m.facts.groups)
        return f"({sh.n} * {g})", f"({sh.n} * {g})", f"(({sh.c} // {g}) * ({sh.s}) // VEC)"
    if kind == "batch":
        return sh.c, sh.planes, sh.plane_vectors
    raise ValueError(f"{_WHAT[kind]} has no statistics pass: the affine variant serves it")


def _coef_planes(m: FamilyMatch, sh: Shape) -> str:
    """How many (scale, shift) pairs there are: per channel (batch norm) or per plane."""
    return sh.c if m.facts.kind in ("running", "batch") else sh.planes


def _common_vars(m: FamilyMatch) -> dict:
    return dict(kind=m.facts.kind, groups=int(m.facts.groups or 1), eps=repr(float(m.facts.eps)),
                has_weight=bool(m.facts.weight), has_bias=bool(m.facts.bias))


def _param_args(m: FamilyMatch) -> list[dict]:
    return [{"name": getattr(m.facts, k)} for k in ("weight", "bias") if getattr(m.facts, k)]


def _vec_default(sh: Shape) -> int:
    return 4 if sh.s_value % 4 == 0 else 1


def _flat_default(sh: Shape, vec: int, ablock: int, unroll: int) -> int:
    """Walk the flat tensor when one plane is shorter than a block's chunk (idle threads otherwise)."""
    return 1 if sh.s_value // vec < ablock * unroll else 0


def _apply_grid(sh: Shape) -> str:
    total = f"{sh.planes} * {sh.plane_vectors}"
    return f"(cdiv({total}, ABLOCK * UNROLL) if FLAT else {sh.planes} * cdiv({sh.plane_vectors}, ABLOCK * UNROLL))"


def _base_constraints(sh: Shape) -> list[str]:
    return [f"({sh.s}) % VEC == 0", f"{sh.x}.numel < 2**40"]


APPLY_TUNABLES = dict(VEC=[1, 4], ABLOCK=BLOCKS, UNROLL=[1, 2, 4, 8], FLAT=[0, 1], CACHE_HINT=[0, 1])


# ---------------------------------------------------------------------------------------------
def norm_affine(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    if m.facts.kind != "running":
        raise ValueError(f"{_WHAT[m.facts.kind]} needs statistics of the input: the split or fused variant")
    sh = _shape(m)
    vec = _vec_default(sh)
    d = pick(defaults, dict(VEC=vec, ABLOCK=256, UNROLL=4, FLAT=_flat_default(sh, vec, 256, 4), CACHE_HINT=0))
    kernel = "norm_affine"
    src = render("norm_affine.cu.j2", kernel_apply=kernel, **_common_vars(m))
    args = [{"name": sh.x}, {"name": m.facts.running_mean}, {"name": m.facts.running_var}, *_param_args(m),
            {"name": "out"}]
    grid = _apply_grid(sh)
    return make_spec(
        spec_name("affine"),
        f"{_WHAT['running']}: y = x * a[c] + b[c] with a = weight * rsqrt(running_var + eps) and b = bias - "
        "running_mean * a folded per block (FLAT 0: a block is one chunk of one plane) or per vector (FLAT 1: "
        "short planes); one read and one write of x with VEC-float loads, UNROLL loads in flight a thread",
        src,
        dict(APPLY_TUNABLES),
        d,
        defines={"NORM_N": sh.n, "NORM_C": sh.c, "NORM_S": sh.s},
        constraints=[*_base_constraints(sh), f"{grid} < 2**31"],
        steps=[dict(kernel=kernel, grid=[grid], block=["ABLOCK"], args=args)],
    )


def norm_split(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    sh = _shape(m)
    ngrp, nseg, segv = _groups(m, sh)
    vec = _vec_default(sh)
    d = pick(defaults, dict(VEC=vec, BLOCK=256, ITEMS=4, ABLOCK=256, UNROLL=4, FLAT=_flat_default(sh, vec, 256, 4),
                            CACHE_HINT=0, REV=1))
    ks, kf, ka = "norm_stats", "norm_finalize", "norm_apply"
    src = render("norm_split.cu.j2", kernel_stats=ks, kernel_finalize=kf, kernel_apply=ka, **_common_vars(m))
    nchk = f"cdiv({segv}, BLOCK * ITEMS)"
    stats_grid = f"{nseg} * {nchk}"
    apply_grid = _apply_grid(sh)
    kind = m.facts.kind
    return make_spec(
        spec_name("split"),
        f"{_WHAT[kind]} in three launches: (1) a block per chunk of BLOCK * ITEMS vectors of a contiguous "
        "segment writes the chunk's (mean, M2) (two-pass in registers, Chan merges); (2) a block per statistics "
        "group merges its partials and folds rstd, weight and bias into a (scale, shift) pair per channel; "
        "(3) y = x * a + b per plane, chunks in reverse order (REV) to start on what kernel 1 left in L2",
        src,
        dict(VEC=[1, 4], BLOCK=BLOCKS, ITEMS=[1, 2, 4, 8, 16], ABLOCK=BLOCKS, UNROLL=[1, 2, 4, 8], FLAT=[0, 1],
             CACHE_HINT=[0, 1], REV=[0, 1]),
        d,
        defines={"NORM_N": sh.n, "NORM_C": sh.c, "NORM_S": sh.s},
        scratch=[dict(name="part", dtype="float32", size=f"2 * {stats_grid}"),
                 dict(name="coef", dtype="float32", size=f"2 * {_coef_planes(m, sh)}")],
        # at most 32 values a thread in a 1024-thread block: 64 registers, more spill (ptxas, sm_90)
        constraints=[*_base_constraints(sh), f"{stats_grid} < 2**31", f"{ngrp} < 2**31", f"{apply_grid} < 2**31",
                     "BLOCK * ITEMS * VEC <= 32768"],
        steps=[dict(kernel=ks, grid=[stats_grid], block=["BLOCK"], args=[{"name": sh.x}, {"name": "part"}]),
               dict(kernel=kf, grid=[ngrp], block=["BLOCK"], args=[{"name": "part"}, *_param_args(m), {"name": "coef"}]),
               dict(kernel=ka, grid=[apply_grid], block=["ABLOCK"],
                    args=[{"name": sh.x}, {"name": "coef"}, {"name": "out"}])],
    )


def norm_fused(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    sh = _shape(m)
    ngrp, _, _ = _groups(m, sh)
    d = pick(defaults, dict(VEC=_vec_default(sh), BLOCK=512, UNROLL=4, REV=1, CACHE_HINT=0))
    kernel = "norm_fused"
    src = render("norm_fused.cu.j2", kernel=kernel, **_common_vars(m))
    kind = m.facts.kind
    constraints = [*_base_constraints(sh), f"{ngrp} < 2**31", "BLOCK * UNROLL * VEC <= 32768"]
    if kind == "group":
        constraints.append(f"{sh.c} // {int(m.facts.groups)} <= {CPG_SMEM_MAX}")
    return make_spec(
        spec_name("fused"),
        f"{_WHAT[kind]} in one launch: a block per statistics group reads the group (UNROLL vectors a thread in "
        "flight, exact two-pass statistics per batch of registers merged by Chan's formula), merges across the "
        "block, then re-reads the group (backwards with REV: the most recently read part first, from L2) and "
        "writes y = x * a + b; no scratch, grid = number of groups",
        src,
        dict(VEC=[1, 4], BLOCK=BLOCKS, UNROLL=[1, 2, 4, 8], REV=[0, 1], CACHE_HINT=[0, 1]),
        d,
        defines={"NORM_N": sh.n, "NORM_C": sh.c, "NORM_S": sh.s},
        constraints=constraints,
        steps=[dict(kernel=kernel, grid=[ngrp], block=["BLOCK"], args=[{"name": sh.x}, *_param_args(m), {"name": "out"}])],
    )


VARIANTS = {"affine": norm_affine, "split": norm_split, "fused": norm_fused}
