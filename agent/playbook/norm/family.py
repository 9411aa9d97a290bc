"""Playbook family "norm": batch, instance and group normalization of one fp32 (N, C, *) input
(``nn.BatchNorm1d/2d/3d``, ``nn.InstanceNorm1d/2d/3d``, ``nn.GroupNorm`` or their functional forms), the whole
graph being that one op.

What the reference computes: kerngen builds every reference with ``Model(...).eval()``
(:meth:`kerngen.problems.problem.Problem.build_model`), so a batch norm that tracks running
statistics normalises with its ``running_mean`` / ``running_var`` buffers (the kind "running": a
per-channel affine map, bound by name like the parameters), while a batch norm without them
(``track_running_stats=False``) or a module found in training mode normalises with the batch's own
statistics (biased variance). Instance norm uses per-(sample, channel) statistics unless it tracks
running statistics (then, in eval mode, it is the "running" kind as well); group norm always uses
per-(sample, group) statistics, with its weight and bias per channel. The mode is read from the traced op's
arguments (``training`` / ``use_input_stats``, the running buffers, ``eps``, ``num_groups``), never
assumed.

A forward with anything besides the one module call is not this family's (None): the fused
chains of KernelBench level 2 belong to the GEMM / convolution families or to nobody."""

from __future__ import annotations

from kerngen.agent.playbook.norm.build import FAMILY_NAME, VARIANTS, spec_name
from kerngen.agent.playbook.entry import A, CF, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["NORM", "NormFacts"]

# op -> the input ranks it is served at (batched inputs only)
RANKS: dict[str, tuple[int, ...]] = {"batch_norm": (2, 3, 4, 5), "instance_norm": (3, 4, 5), "group_norm": (2, 3, 4, 5, 6)}
_TYPES = {"batch_norm": "BatchNorm", "instance_norm": "InstanceNorm", "group_norm": "GroupNorm"}


class NormFacts(Facts):
    kind: str  # "running" (a per-channel affine map), "batch", "instance" or "group"
    module: str  # BatchNorm2d, ..., for descriptions
    eps: float
    groups: int | None = None
    weight: str | None = None
    bias: str | None = None
    running_mean: str | None = None
    running_var: str | None = None


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    if len(live) != 1 or live[0].op not in RANKS:
        return None  # not one of the three norms alone: another family's (or nobody's)
    n = live[0]
    if len(g.inputs) != 1:
        raise NotCovered(f"{n.op} applied to one input only is covered")
    x, out = g.inputs[0], g.out
    module = n.module_type or (_TYPES[n.op] + (f"{max(1, len(x.shape) - 2)}d" if n.op != "group_norm" else ""))
    if g.dtypes != {"float32"}:
        raise NotCovered(f"the norm family is fp32 only (got {', '.join(sorted(g.dtypes))})")
    if len(x.shape) not in RANKS[n.op]:
        raise NotCovered(f"{module} on a {len(x.shape)}-d input (unbatched or unusual rank) is not covered")
    if out.shape != x.shape or n["input"] != x.name:
        raise NotCovered(f"{module}'s output differs from its input in shape")
    channels = x.shape[1]
    if n.op == "group_norm":
        kind = "group"
    elif n.op == "batch_norm":
        kind = "running" if not n["training"] and n["running_mean"] is not None else "batch"
    else:
        kind = "running" if not n["use_input_stats"] and n["running_mean"] is not None else "instance"
    facts = NormFacts(kind=kind, module=module, eps=float(n["eps"]),
                      groups=int(n["num_groups"]) if kind == "group" else None, weight=n["weight"], bias=n["bias"],
                      running_mean=n.get("running_mean") if kind == "running" else None,
                      running_var=n.get("running_var") if kind == "running" else None)
    for name in (facts.weight, facts.bias, facts.running_mean, facts.running_var):
        t = g.tensor(name) if name else None
        if name and (t is None or not g.is_param(name)):
            raise NotCovered(f"{module} reads {name}, which is not bound as a parameter or buffer")
        if t is not None and (t.dtype != "float32" or t.shape != (channels,)):
            raise NotCovered(f"{name} is not an fp32 vector of {channels} channels")
    return FamilyMatch.of(g, facts)


IDEAS: tuple[Entry, ...] = (
    Entry("norm-affine", "Eval-mode batch norm is a per-channel affine map with the running statistics: fold "
          "weight, bias, running mean and running variance into one (scale, shift) pair per channel inside the "
          "kernel (once per block when a block covers one chunk of one plane) and stream x once with 16-byte "
          "loads and stores.", M, "one read and one write of x: ~90% of the copy bandwidth",
          "affine", ({}, {"UNROLL": 8}), round0=True),
    Entry("norm-split", "Statistics in chunks, then apply: kernel 1 gives every chunk of a contiguous segment "
          "(a plane, a group of channels) a block that writes the chunk's (mean, M2), exact two-pass in "
          "registers and Chan-merged across the block; kernel 2 merges a group's partials (for batch norm the "
          "partials of every sample's plane of the channel) and folds rstd, weight and bias into a (scale, "
          "shift) pair per channel; kernel 3 applies y = x * a + b, in reverse order to start on the tail of x "
          "still in L2.", PAR, "three passes over x (read, read, write), every launch fills the GPU: ~80% of "
          "the 3-pass floor", "split", ({}, {"ITEMS": 8}), round0=True),
    Entry("norm-fused", "One launch, a block per statistics group: loop 1 reads the group with several 16-byte "
          "loads in flight a thread (Chan statistics), a block merge gives mean and rstd, loop 2 re-reads the "
          "group backwards (the most recently read part from L2) and writes the normalised values.", CF,
          "no scratch and one launch; as fast as the split kernels when there are many groups, slower with few",
          "fused", ({}, {"BLOCK": 1024}), round0=True),
    Entry("norm-affine-shape", "Re-balance the streaming pass: more or fewer vectors in flight a thread and larger "
          "blocks, or the flat walk where a plane is shorter than a block's chunk.", A, "0-5%",
          "affine", ({"UNROLL": 2, "ABLOCK": 512}, {"UNROLL": 8, "ABLOCK": 128}, {"FLAT": 1}),
          after=frozenset({"affine"})),
    Entry("norm-stream", "Streaming cache hints (evict-first loads and stores) on the last pass over x so that "
          "the output does not push useful lines out of L2.", M, "0-5%, can be negative",
          "affine", ({"CACHE_HINT": 1},), after=frozenset({"affine"})),
    Entry("norm-split-chunks", "Tune the statistics chunk (fewer, larger chunks: more loads in flight a thread; "
          "more, smaller ones: better balance) and the apply pass's vectors a thread.", A, "a few %",
          "split", ({"ITEMS": 16}, {"BLOCK": 512, "ITEMS": 2}, {"UNROLL": 8, "ABLOCK": 128}),
          after=frozenset({"split"})),
    Entry("norm-split-order", "Apply pass in launch order instead of reverse, or with streaming hints: see "
          "whether the L2 reuse at the seam between the passes pays.", M, "0-2%",
          "split", ({"REV": 0}, {"CACHE_HINT": 1}), after=frozenset({"split"})),
    Entry("norm-fused-block", "Smaller or larger blocks per group and more loads in flight a thread in the "
          "one-launch kernel; the second loop forwards instead of backwards.", PAR, "0-10%",
          "fused", ({"BLOCK": 256, "UNROLL": 8}, {"BLOCK": 1024, "UNROLL": 2}, {"REV": 0}),
          after=frozenset({"fused"})),
)

NORM = Family(name=FAMILY_NAME, leads=frozenset({Lead.norm}), recognise=_recognise,
              constraints=("one batch, instance or group norm", "nothing else", "of the one forward input"),
              variants=dict(VARIANTS), ideas=IDEAS, spec_names={v: spec_name(v) for v in VARIANTS})
