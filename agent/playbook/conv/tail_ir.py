"""The records of a conv_tail problem's tail (:mod:`.conv.tail_trace` builds them, :mod:`.conv.build_tail`
renders them): the NCHW tensors it computes (:class:`Domain`), the stages that compute them
(:class:`Stage`: a norm's statistics, a reduction over the channels, a pool window, a reduction of each
plane or sample, the last elementwise map), and the leaves their elementwise chains read (:class:`Leaf`:
``q<i>`` in a :class:`~.chain_ir.Chain`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from kerngen.agent.playbook.chain_ir import Chain
from kerngen.agent.playbook.row_program import Reduction

__all__ = ["Domain", "Leaf", "LeafKind", "Reduction", "Stage", "StageKind", "Tail"]

_LEAF = re.compile(r"\bq(\d+)\b")


class LeafKind(str, Enum):
    lead = "lead"  # the convolution's output element, its bias included (the conv epilogue's v)
    result = "result"  # a reduction stage's reduced value (its epilogue's input)
    buffer = "buffer"  # a materialised domain's element at the position (ref: the domain)
    channel = "channel"  # a parameter with one value per channel (ref: its dotted name)
    scalar = "scalar"  # a one-element parameter
    mean = "mean"  # a norm's statistics at the position's (sample, group) (ref: the statistics index)
    rstd = "rstd"


@dataclass(frozen=True)
class Leaf:
    kind: LeafKind
    ref: str | int = 0


class StageKind(str, Enum):
    stats = "stats"
    channels = "channels"
    window = "window"
    segment = "segment"
    map = "map"


@dataclass(frozen=True)
class Domain:
    """An NCHW tensor of the tail: sizes as expressions over the bound tensors, and their values here."""

    n: str
    c: str
    h: str
    w: str
    values: tuple[int, int, int, int]

    @property
    def numel(self) -> int:
        return math.prod(self.values)

    @property
    def size(self) -> str:
        return f"({self.n}) * ({self.c}) * ({self.h}) * ({self.w})"


@dataclass(frozen=True)
class Stage:
    """One kernel of the tail. ``src``: the domain whose positions it reads; ``dst``: the domain a
    reduction creates (None for stats and map); ``pro``: the value read at each position; ``epi``: a
    reduction's stored value over its result leaf; ``store``: a reduction stores its domain's buffer
    (True) or the output (False)."""

    kind: StageKind
    src: int
    pro: Chain
    dst: int | None = None
    epi: Chain | None = None
    store: bool = False
    op: Reduction | None = None
    stats: int | None = None  # statistics index (stats)
    groups: int = 1  # stats: groups per sample
    eps: float = 0.0
    kernel: tuple[int, int] = (1, 1)  # window
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    count_include_pad: bool = True
    per_sample: bool = False  # segment: each sample (else each plane)


@dataclass(frozen=True)
class Tail:
    leaves: tuple[Leaf, ...]
    domains: tuple[Domain, ...]
    conv: Chain  # the conv's epilogue over the lead leaf: stored as domain 0's buffer
    stages: tuple[Stage, ...]

    def leaf_index(self, name: str) -> int | None:
        if name.startswith("q") and name[1:].isdigit() and int(name[1:]) < len(self.leaves):
            return int(name[1:])
        return None

    def leaves_of(self, chain: Chain) -> list[int]:
        """The leaves ``chain`` reads, in order of first use."""
        out: list[int] = []
        for a in [x for n in chain.nodes for x in n.args] + [chain.result]:
            i = self.leaf_index(a) if isinstance(a, str) else None
            if i is not None and i not in out:
                out.append(i)
        return out

    def stats_stage(self, index: int) -> Stage:
        return next(s for s in self.stages if s.kind == StageKind.stats and s.stats == index)

    def leaf_text(self, i: int) -> str:
        leaf = self.leaves[i]
        return {LeafKind.lead: "conv", LeafKind.result: "r", LeafKind.buffer: f"y{leaf.ref}",
                LeafKind.mean: f"mean{leaf.ref}", LeafKind.rstd: f"rstd{leaf.ref}"}.get(leaf.kind, str(leaf.ref))

    def formula(self, chain: Chain) -> str:
        """Readable, the leaves by name: ``y0 - mean0``, ``tanh(r) * scale``."""
        text = chain.formula() if chain.nodes or not isinstance(chain.result, str) else chain.result
        return _LEAF.sub(lambda hit: self.leaf_text(int(hit.group(1))), text)

    def stage_text(self, s: Stage) -> str:
        pro = self.formula(s.pro)
        if s.kind == StageKind.stats:
            return f"statistics {s.stats} of {pro} ({s.groups} groups a sample)"
        if s.kind == StageKind.map:
            return f"out = {pro}"
        if s.kind == StageKind.window:
            what = f"{s.op.value} pool {s.kernel[0]}x{s.kernel[1]} stride {s.stride[0]}x{s.stride[1]}"
        else:
            where = ("the channels" if s.kind == StageKind.channels else
                     "each sample" if s.per_sample else "each plane")
            what = f"{s.op.value} over {where}"
        store = f"y{s.dst}" if s.store else "out"
        after = self.formula(s.epi) if s.epi is not None and s.epi.nodes else "r"
        return f"r = {what} of {pro}; {store} = {after}"

    def summary(self) -> str:
        """Readable: ``y0 = relu(conv); statistics 0 of y0 (4 groups a sample); r = max pool ... of ...``."""
        return "; ".join([f"y0 = {self.formula(self.conv)}"] + [self.stage_text(s) for s in self.stages])
