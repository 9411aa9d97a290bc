"""A 0-d output (a loss) goes through the guarded buffers like any tensor: poisoned, filled,
compared against its poison, its guards checked (it had no byte view of its own: the first GPU run
of the loss family failed every candidate with "self.dim() cannot be 0 to view Float as Byte")."""

from __future__ import annotations

import pytest
import torch

from kerngen.harness.gpu.buffers import alloc_guarded, fill_byte, poison, still_poisoned


@pytest.mark.parametrize("pattern", ["nan", "huge", "random"])
def test_a_0d_buffer_is_poisoned_filled_and_compared(pattern):
    gen = torch.Generator().manual_seed(0)
    buf = alloc_guarded("out", (), torch.float32, torch.device("cpu"), gen)
    assert buf.view.shape == () and buf.nbytes == 4
    p = poison(buf, pattern, gen)
    assert p.shape == () and bool(still_poisoned(buf.view, p))
    buf.view.fill_(1.5)  # the kernel wrote its result
    assert not bool(still_poisoned(buf.view, p)) and buf.guards_intact()
    fill_byte(buf, 0)
    assert float(buf.view) == 0.0 and buf.guards_intact()


@pytest.mark.parametrize("pattern", ["nan", "huge", "random"])
def test_the_poison_is_made_again_chunk_by_chunk_without_a_copy(pattern, monkeypatch):
    """The poison a run's outputs held is kept as a byte or a seed, not as a copy of the output (a
    copy per run ran KernelBench's 6 GB outputs out of memory); any chunk of it is made again,
    bit for bit what was written, across the random poison's block boundaries."""
    import kerngen.harness.gpu.buffers as B

    monkeypatch.setattr(B, "POISON_BLOCK_BYTES", 1000)  # blocks that do not align with elements or chunks
    gen = torch.Generator().manual_seed(1)
    buf = alloc_guarded("out", (37, 101), torch.float32, torch.device("cpu"), gen)
    p = poison(buf, pattern, gen)
    assert p.values is None  # nothing the size of the output is kept
    written = buf.view.reshape(-1).view(torch.uint8).clone()
    for lo, hi in ((0, buf.view.numel()), (3, 251), (249, 251), (1000, 3737), (3736, 3737)):
        assert torch.equal(p.flat(lo, hi).view(torch.uint8), written[4 * lo:4 * hi])
    assert bool(still_poisoned(buf.view, p).all())
    buf.view[5, :7] = 2.0
    mask = still_poisoned(buf.view.reshape(-1)[500:600], p, lo=500)
    assert int((~mask).sum()) == 7 and not bool(mask[505 - 500:512 - 500].any())
    flat = buf.view.reshape(-1)
    assert torch.equal(B.Poison.of(buf.view).flat(10, 20).view(torch.uint8), flat[10:20].view(torch.uint8))
    other = poison(buf, "random", gen)
    if pattern == "random":
        assert other.seed != p.seed  # a fresh seed per run: the next run's poison differs


def test_the_random_poison_makes_each_block_once_and_writes_a_one_byte_output(monkeypatch):
    """One generator per block of POISON_BLOCK_BYTES, as many as the output has: the block count is
    ceil(bytes / block), never one per byte (a loop over bytes is minutes on a GB output); and an
    output of one byte is written too."""
    import kerngen.harness.gpu.buffers as B

    monkeypatch.setattr(B, "POISON_BLOCK_BYTES", 1000)
    made = []
    block = B.Poison._block
    monkeypatch.setattr(B.Poison, "_block", lambda self, k, total: made.append(k) or block(self, k, total))
    gen = torch.Generator().manual_seed(2)
    buf = alloc_guarded("out", (37, 101), torch.float32, torch.device("cpu"), gen)  # 14,948 bytes: 15 blocks
    poison(buf, "random", gen)
    assert made == list(range(15))
    for seed in range(8):  # a one-byte output holds its poison (1 in 256 that a seed's byte equals the fill)
        gen = torch.Generator().manual_seed(seed)
        one = alloc_guarded("flag", (1,), torch.uint8, torch.device("cpu"), gen)
        one.view.fill_(0)
        p = poison(one, "random", gen)
        assert torch.equal(one.view, p.flat(0, 1))
