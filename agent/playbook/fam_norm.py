"""Playbook family "norm": batch, instance and group normalization of one fp32 (N, C, *) input by
one ``nn.BatchNorm1d/2d/3d``, ``nn.InstanceNorm1d/2d/3d`` or ``nn.GroupNorm`` module, the whole
forward being that module's call.

What the reference computes: kerngen builds every reference with ``Model(...).eval()``
(:meth:`kerngen.problems.problem.Problem.build_model`), so a batch norm that tracks running
statistics normalises with its ``running_mean`` / ``running_var`` buffers (the kind "running": a
per-channel affine map, bound by name like the parameters), while a batch norm without them
(``track_running_stats=False``) or a module found in training mode normalises with the batch's own
statistics (biased variance). Instance norm uses per-(sample, channel) statistics unless it tracks
running statistics (then, in eval mode, it is the "running" kind as well); group norm always uses
per-(sample, group) statistics, with its weight and bias per channel. The mode is read from the
module on the meta-built model (``training``, ``track_running_stats``, ``affine``, ``eps``,
``num_groups``), never assumed.

A forward with anything besides the one module call is not this family's (None): the fused
chains of KernelBench level 2 belong to the GEMM / convolution families or to nobody."""

from __future__ import annotations

from typing import Any

from kerngen.agent.playbook.build_norm import FAMILY_NAME, VARIANTS, spec_name
from kerngen.agent.playbook.entry import A, CF, Entry, M, PAR
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import module_of
from kerngen.agent.playbook.match import FamilyMatch, Read, param_for
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "MODULE_RANKS", "recognise"]

# module type -> the input ranks it is served at (batched inputs only)
MODULE_RANKS: dict[str, tuple[int, ...]] = {
    "BatchNorm1d": (2, 3), "BatchNorm2d": (4,), "BatchNorm3d": (5,),
    "InstanceNorm1d": (3,), "InstanceNorm2d": (4,), "InstanceNorm3d": (5,),
    "GroupNorm": (2, 3, 4, 5, 6),
}
FUNCTIONAL = ("batch_norm", "instance_norm", "group_norm")


def _kind(mod: Any, module_type: str) -> str:
    """Which statistics the module normalises with (see the module docstring)."""
    if module_type == "GroupNorm":
        return "group"
    running = bool(getattr(mod, "track_running_stats", False)) and getattr(mod, "running_mean", None) is not None
    if running and not mod.training:
        return "running"
    return "batch" if module_type.startswith("BatchNorm") else "instance"


def recognise(r: Read) -> FamilyMatch | None:
    norms = [(k, c, n) for k, c, n in r.kinds if k in MODULE_RANKS or k in FUNCTIONAL]
    if not norms or len(r.kinds) != 1 or r.fwd.binops:
        return None  # not one of the three norms alone: another family's (or nobody's)
    module_type, callee, _ = norms[0]
    if module_type in FUNCTIONAL:
        raise NotCovered(f"the norm family reads nn.BatchNorm/InstanceNorm/GroupNorm modules, not F.{module_type}")
    mod = module_of(r.model, callee)
    if mod is None:
        raise NotCovered(f"cannot read the nn.{module_type} module (model did not build on the meta device)")
    match = r.match
    if len(match.inputs) != 1:
        raise NotCovered(f"nn.{module_type} applied to one input only is covered")
    x, out = match.inputs[0], match.outputs[0]
    if r.dtypes != {"float32"}:
        raise NotCovered(f"the norm family is fp32 only (got {', '.join(sorted(r.dtypes))})")
    if len(x.shape) not in MODULE_RANKS[module_type]:
        raise NotCovered(f"nn.{module_type} on a {len(x.shape)}-d input (unbatched or unusual rank) is not covered")
    if out.shape != x.shape:
        raise NotCovered(f"nn.{module_type}'s output differs from its input in shape")
    channels = int(getattr(mod, "num_channels", getattr(mod, "num_features", x.shape[1])))
    if x.shape[1] != channels:
        raise NotCovered(f"nn.{module_type} has {channels} channels, the input {x.shape[1]}")
    kind = _kind(mod, module_type)
    prefix = callee.split(".", 1)[1]
    facts: dict[str, Any] = dict(kind=kind, module=module_type, eps=float(mod.eps), groups=None,
                                 weight=None, bias=None, running_mean=None, running_var=None)
    if kind == "group":
        facts["groups"] = int(mod.num_groups)
    if getattr(mod, "affine", False):
        for leaf in ("weight", "bias"):
            t = param_for(match.params, prefix, leaf)
            facts[leaf] = t.name if t is not None else None
    if kind == "running":
        for leaf in ("running_mean", "running_var"):
            t = param_for(match.params, prefix, leaf)
            if t is None:
                raise NotCovered(f"nn.{module_type} tracks running statistics but {prefix}.{leaf} is not bound")
            facts[leaf] = t.name
    for name in (facts["weight"], facts["bias"], facts["running_mean"], facts["running_var"]):
        t = next((p for p in match.params if p.name == name), None)
        if t is not None and (t.dtype != "float32" or t.shape != (channels,)):
            raise NotCovered(f"{name} is not an fp32 vector of {channels} channels")
    match.facts = facts
    return match


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

FAMILY = Family(name=FAMILY_NAME, recognise=recognise, variants=dict(VARIANTS), ideas=IDEAS,
                spec_names={v: spec_name(v) for v in VARIANTS})
