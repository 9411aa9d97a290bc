"""Guarded, poisoned device buffers: how the harness sees unwritten outputs, out-of-bounds
writes and reads, and mutated inputs.

Every tensor a candidate touches lives inside a larger allocation whose leading and trailing
guard regions hold random bytes. Outputs and scratch are filled with a poison pattern before each
run. After a run the guards must be unchanged (no stray writes) and no output element may still
hold poison where the reference differs (every element written).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# 4096 elements of guard on each side: 16 KiB for fp32, a multiple of 256 bytes for every dtype
# so the usable view keeps the allocator's alignment (16-byte vector loads stay legal).
GUARD_ELEMS = 4096

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}

# Poison patterns, cycled per run: all-ones bytes (NaN for floats), a huge finite value (0x7B: 0x7F7F is a NaN in
# fp16), and fresh random bits. A kernel cannot learn one pattern and special-case it.
POISON_PATTERNS = ("nan", "huge", "random")


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


@dataclass
class GuardedBuffer:
    """``view`` is what the candidate gets; ``full`` includes the guards on both sides."""

    name: str
    full: torch.Tensor
    view: torch.Tensor
    guard_copy: torch.Tensor = field(repr=False)  # the guard bytes as written, front and back

    @property
    def nbytes(self) -> int:
        return self.view.numel() * self.view.element_size()

    def guards(self) -> torch.Tensor:
        raw = self.full.view(torch.uint8)
        g = GUARD_ELEMS * self.full.element_size()
        return torch.cat([raw[:g], raw[-g:]])

    def guards_intact(self) -> bool:
        return bool(torch.equal(self.guards(), self.guard_copy))


def alloc_guarded(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> GuardedBuffer:
    numel = 1
    for s in shape:
        numel *= s
    full = torch.empty(numel + 2 * GUARD_ELEMS, dtype=dtype, device=device)
    raw = full.view(torch.uint8)
    g = GUARD_ELEMS * full.element_size()
    raw[:g] = _random_bytes(g, device, gen)
    raw[-g:] = _random_bytes(g, device, gen)
    view = full[GUARD_ELEMS : GUARD_ELEMS + numel].view(shape)
    buf = GuardedBuffer(name=name, full=full, view=view, guard_copy=torch.empty(0))
    buf.guard_copy = buf.guards().clone()
    return buf


def guarded_copy(name: str, src: torch.Tensor, gen: torch.Generator) -> GuardedBuffer:
    """A contiguous copy of ``src`` between random guards (inputs and parameters)."""
    buf = alloc_guarded(name, tuple(src.shape), src.dtype, src.device, gen)
    buf.view.copy_(src)
    return buf


def _random_bytes(n: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=gen)


# random poison is written, and made again for a comparison, in blocks of this many bytes, each
# from its own seed: a chunk of a 6 GB output's poison is made again without the rest of it
POISON_BLOCK_BYTES = 1 << 24


@dataclass(frozen=True)
class Poison:
    """What a run's outputs held before it ran, without a copy of them: one byte value everywhere,
    or random bytes made again block by block from a seed (a copy of a 6 GB output's poison, per
    run, is what ran KernelBench's largest files out of memory). ``values`` is an explicit copy
    (tests, and poisons handed over as tensors)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    byte: int | None = None
    seed: int = 0
    values: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def of(cls, values: torch.Tensor) -> "Poison":
        return cls(tuple(values.shape), values.dtype, values.device, values=values)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def flat(self, lo: int, hi: int, device: torch.device | None = None) -> torch.Tensor:
        """The poison of flat elements ``[lo, hi)``, on ``device`` (default: where it was written)."""
        dev = device if device is not None else self.device
        if self.values is not None:
            return self.values.reshape(-1)[lo:hi].to(dev)
        size = self.dtype.itemsize
        a, b = lo * size, hi * size
        if self.byte is not None:
            raw = torch.full((b - a,), self.byte, dtype=torch.uint8, device=dev)
        else:
            first, last = a // POISON_BLOCK_BYTES, (max(b, a + 1) - 1) // POISON_BLOCK_BYTES
            total = self.numel * size
            blocks = [self._block(k, total) for k in range(first, last + 1)]
            start = a - first * POISON_BLOCK_BYTES
            raw = torch.cat(blocks)[start:start + (b - a)].to(dev)
        return raw.view(self.dtype)

    def _block(self, k: int, total: int) -> torch.Tensor:
        n = min(POISON_BLOCK_BYTES, total - k * POISON_BLOCK_BYTES)
        gen = torch.Generator(device=self.device)
        gen.manual_seed((self.seed + k) % (1 << 63))
        return _random_bytes(max(n, 0), self.device, gen)


def poison(buf: GuardedBuffer, pattern: str, gen: torch.Generator) -> Poison:
    """Fill the usable region with ``pattern``; return the poison as written (same dtype/shape)."""
    # reshape(-1) first: a 0-d tensor (a loss) has no byte view of its own
    raw = buf.view.reshape(-1).view(torch.uint8) if buf.view.is_contiguous() else None
    assert raw is not None, "guarded views are contiguous"
    shape, dtype, device = tuple(buf.view.shape), buf.view.dtype, buf.view.device
    if pattern in ("nan", "huge"):
        byte = 0xFF if pattern == "nan" else 0x7B  # NaN for every float type (-1 for ints); ~1.3e36, 61280 in fp16
        raw.fill_(byte)
        return Poison(shape, dtype, device, byte=byte)
    seed = int(torch.randint(0, 1 << 62, (1,), device=device, generator=gen))
    p = Poison(shape, dtype, device, seed=seed)
    for k in range(0, (raw.numel() + POISON_BLOCK_BYTES - 1) // POISON_BLOCK_BYTES):
        raw[k * POISON_BLOCK_BYTES:(k + 1) * POISON_BLOCK_BYTES] = p._block(k, raw.numel())
    return p


def fill_byte(buf: GuardedBuffer, value: int) -> None:
    """Cheap poison for the timed loop (outside the timed region): one byte value everywhere."""
    buf.view.reshape(-1).view(torch.uint8).fill_(value)


def still_poisoned(out: torch.Tensor, poison: Poison, lo: int = 0) -> torch.Tensor:
    """Mask of the elements of ``out`` (flat elements ``[lo, lo + out.numel())`` of the poisoned
    output) whose bits equal the poison written before the run."""
    n, size = out.numel(), out.element_size()
    a = out.contiguous().reshape(-1).view(torch.uint8).view(n, size)
    b = poison.flat(lo, lo + n, out.device).reshape(-1).view(torch.uint8).view(n, size)
    return (a == b).all(dim=1).view(out.shape)
