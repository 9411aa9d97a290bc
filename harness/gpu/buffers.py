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

# Poison patterns, cycled per run: all-ones bytes (NaN for floats), a huge finite value, and
# fresh random bits. A kernel cannot learn one pattern and special-case it.
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


def poison(buf: GuardedBuffer, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """Fill the usable region with ``pattern``; return the poison as written (same dtype/shape)."""
    # reshape(-1) first: a 0-d tensor (a loss) has no byte view of its own
    raw = buf.view.reshape(-1).view(torch.uint8) if buf.view.is_contiguous() else None
    assert raw is not None, "guarded views are contiguous"
    if pattern == "nan":
        raw.fill_(0xFF)  # NaN for every float type, -1 for signed ints
    elif pattern == "huge":
        raw.fill_(0x7F)  # 3.4e38 in fp32, 3.4e38 in bf16, NaN-free huge values
    else:
        raw.copy_(_random_bytes(raw.numel(), raw.device, gen).view(raw.shape))
    return buf.view.clone()


def fill_byte(buf: GuardedBuffer, value: int) -> None:
    """Cheap poison for the timed loop (outside the timed region): one byte value everywhere."""
    buf.view.reshape(-1).view(torch.uint8).fill_(value)


def still_poisoned(out: torch.Tensor, poison_values: torch.Tensor) -> torch.Tensor:
    """Mask of elements whose bits equal the poison written before the run."""
    a = out.contiguous().reshape(-1).view(torch.uint8).view(out.numel(), out.element_size())
    b = poison_values.contiguous().reshape(-1).view(torch.uint8).view(out.numel(), out.element_size())
    return (a == b).all(dim=1).view(out.shape)
