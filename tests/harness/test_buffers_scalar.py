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
