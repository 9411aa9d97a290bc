"""Shared fixtures. The GPU tier (``@pytest.mark.gpu``) skips itself where no CUDA device exists."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    n = cuda_device_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA devices")
    for item in items:
        if item.get_closest_marker("gpu") is not None and n == 0:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("multigpu") is not None and n < 2:
            item.add_marker(skip_multi)
