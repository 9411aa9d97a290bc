"""What leads a region (:mod:`.region`): the one operation its kernel is built around. A module of its own
because the families' records (:mod:`.family`) name the leads they accept, and a region holds its family's match:
both import this, neither the other's module."""

from __future__ import annotations

from enum import Enum

__all__ = ["Lead"]


class Lead(str, Enum):
    map = "map"  # pointwise only
    reduce = "reduce"
    scan = "scan"
    softmax = "softmax"
    contraction = "contraction"
    conv = "conv"
    pool = "pool"
    attention = "attention"
    norm = "norm"
    loss = "loss"
    rnn = "rnn"
