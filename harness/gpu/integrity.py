"""Seals on the harness's own device tensors: the pristine input copies the reference reads, the
reference outputs, the reference model's parameters.

Guards catch a stray write next to a buffer the candidate was given; a write far away can land
in one of these tensors instead, and a kernel that zeroes both its input and the pristine copy
(or copies its own output over the reference) would then be compared against what it wrote. A
seal is a digest held on the CPU, taken before the candidate first runs (or right after the
reference) and verified after every run: the candidate cannot reach it.

The digest is sum_j word[i_j] * r_j mod 2**64 over the tensor's 32-bit words (bytes when the size
is not a multiple of 4): every word when there are at most SAMPLE of them, else SAMPLE positions
i_j. Positions and weights r_j are regenerated at every call from a generator seeded by a secret
key (os.urandom) that lives only on the CPU: nothing the kernel could read or overwrite. Integer addition mod 2**64 does not depend on the reduction order,
so the same bytes always give the same digest. A change of a share f of a large tensor's words
escapes with probability about (1 - f)**SAMPLE: e**-42 for f = 1e-5, and making an input trivial
(zeroing it, a constant) changes nearly every word. Cost: a few hundred microseconds per tensor.
"""

from __future__ import annotations

import os

import torch

SAMPLE = 1 << 22  # words digested per tensor at most (all of them up to this size)
_MASK = (1 << 64) - 1


def new_key() -> int:
    return int.from_bytes(os.urandom(7), "little")


def digest(t: torch.Tensor, key: int) -> int:
    """The tensor's bytes (as laid out in its contiguous form) reduced to one 64-bit integer."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    whole_words = raw.numel() % 4 == 0 and raw.storage_offset() % 4 == 0  # a view into a larger storage may not be
    words = raw.view(torch.int32) if whole_words else raw
    gen = torch.Generator(device=words.device)
    gen.manual_seed(key)
    n = words.numel()
    if n > SAMPLE:
        words = words[torch.randint(0, n, (SAMPLE,), generator=gen, device=words.device)]
    w = words.to(torch.int64)
    r = torch.randint(1, 1 << 31, (w.numel(),), generator=gen, device=w.device, dtype=torch.int64)
    return int((w * r).sum().item()) & _MASK


class Seal:
    """Digests of named tensors; ``broken()`` names the first one whose bytes changed."""

    def __init__(self, key: int | None = None) -> None:
        self.key = new_key() if key is None else key
        self._sealed: dict[str, tuple[torch.Tensor, int]] = {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self._sealed[name] = (t, digest(t, self.key))

    def broken(self) -> str:
        for name, (t, d) in self._sealed.items():
            if digest(t, self.key) != d:
                return name
        return ""

    def __len__(self) -> int:
        return len(self._sealed)


__all__ = ["SAMPLE", "Seal", "digest", "new_key"]
