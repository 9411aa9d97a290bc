"""Shared fixtures. The GPU tier (``@pytest.mark.gpu``) skips itself where no CUDA device exists.

Tests that need the KernelBench copy or a C++ compiler (``needs_kernelbench``, ``needs_cxx``: see
tests/resources.py) skip where it is missing, and FAIL where ``KERNGEN_REQUIRE_ALL=1`` (CI): a
missing copy or compiler must not make a fifth of the CPU tier vanish while CI stays green. Any
other skip whose reason names one of them fails there too."""

from __future__ import annotations

import functools

import pytest

from tests import resources


@functools.cache
def cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@functools.cache
def _missing(marker: str) -> str:
    return resources.kernelbench_missing() if marker == "needs_kernelbench" else resources.cxx_missing()


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_kernelbench: needs ../shared/kernelbench (fails when missing under "
                                       "KERNGEN_REQUIRE_ALL=1)")
    config.addinivalue_line("markers", "needs_cxx: needs a C++ compiler for the CPU emulator (fails when missing "
                                       "under KERNGEN_REQUIRE_ALL=1)")


def pytest_collection_modifyitems(config, items):
    n = cuda_device_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA devices")
    for item in items:
        if item.get_closest_marker("gpu") is not None and n == 0:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("multigpu") is not None and n < 2:
            item.add_marker(skip_multi)


def pytest_runtest_setup(item):
    for marker in ("needs_kernelbench", "needs_cxx"):
        if item.get_closest_marker(marker) is not None:
            why = _missing(marker)
            if why and resources.REQUIRE_ALL:
                pytest.fail(f"{why} (KERNGEN_REQUIRE_ALL=1: required here)", pytrace=False)
            if why:
                pytest.skip(why)


# skip reasons that mean "a resource CI must have is missing", wherever the skip was written
_REQUIRED_WORDS = ("kernelbench", "c++ compiler", "g++", "cpu emulator")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (resources.REQUIRE_ALL and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if any(w in reason.lower() for w in _REQUIRED_WORDS) and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped under KERNGEN_REQUIRE_ALL=1, which requires it: {reason}"
