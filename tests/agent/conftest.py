"""Fixtures of the agent tests: a fresh local chat server per test (``server``)."""

import pytest

from tests.fakes.llm_server import ChatServer


@pytest.fixture
def server():
    with ChatServer() as s:
        yield s
