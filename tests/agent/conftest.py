"""Fixtures of the agent tests: a fresh local chat server per test (``server``); one worker pool per
GPU test module (``pool``)."""

import pytest

from tests.fakes.llm_server import ChatServer


@pytest.fixture
def server():
    with ChatServer() as s:
        yield s


@pytest.fixture(scope="module")
def pool():
    """A local worker pool for a GPU test module (the GPU tier only: it needs a CUDA device)."""
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(timeout_s=600) as p:
        yield p
