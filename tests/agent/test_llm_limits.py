"""An LLM request has a total deadline and every endpoint body a size cap (issue 31's LLM part),
against real local HTTP servers: one that trickles its reply a byte at a time, one that streams a
body far larger than any answer, one that announces one."""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc

import pytest

from kerngen.agent.llm.answers import AnswerError, AnswerProblem
from kerngen.agent.llm.calls import MAX_ANSWER_CHARS
from kerngen.agent.llm.transport import MAX_BODY_BYTES
from kerngen.errors import LLMError
from tests.fakes.llm_server import ChatServer, Reply, make_test_client, user_messages


class RawServer:
    """A TCP server on port 0 that reads one HTTP request per connection and answers with
    ``respond(sock)`` (which writes whatever it likes, as slowly as it likes)."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.stop = threading.Event()
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            try:
                self.respond(conn, self.stop)
            except OSError:  # the client gave up and closed: what these tests want
                pass

    def __enter__(self) -> "RawServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._thread.join(5)
        self._sock.close()


def completion_bytes(content: str) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()


def trickle(payload: bytes, every_s: float):
    """Send ``payload`` one byte every ``every_s`` seconds: never long enough apart for a read
    timeout, forever in total."""
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        for i in range(len(payload)):
            if stop.is_set():
                return
            conn.sendall(payload[i:i + 1])
            time.sleep(every_s)
    return respond


def test_a_reply_trickling_in_its_headers_stops_at_the_request_timeout():
    body = completion_bytes("OK")
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with RawServer(trickle(reply, 0.3)) as server:
        client = make_test_client(server.url, timeout_s=1.5, max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(LLMError) as info:
            client.complete(user_messages(), None, purpose="chat")
        elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed < 3.0, elapsed  # the 1.5 s budget of the request, not 0.3 s per byte forever
    assert "timed out after 1.5s" in str(info.value) and info.value.cause == "timeout"
    assert client.usage_total.estimated_tokens > 0  # sent, maybe billed: counted as estimated


def test_a_body_trickling_in_stops_at_the_search_deadline():
    """Headers at once, then the body a byte at a time: a 30 s request timeout is not what ends
    it, the search's own deadline (what is left of --minutes) is."""
    body = completion_bytes("OK")

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        trickle(body, 0.3)(conn, stop)

    with RawServer(respond) as server:
        client = make_test_client(server.url, timeout_s=30.0, max_retries=3)
        client.limit_time(1.2)
        t0 = time.monotonic()
        with pytest.raises(LLMError) as cut:
            client.complete(user_messages(), None, purpose="chat")
        elapsed = time.monotonic() - t0
        assert elapsed < 2.5, elapsed
        assert server.requests == 1  # no retry once the deadline has passed
        # the cause named is the one that cut it: --minutes, not --llm-timeout (30 s had not passed)
        text = str(cut.value)
        assert "--minutes" in text and "before --llm-timeout's 30s" in text and "timed out after 30s" not in text
        assert "failing" not in text and cut.value.cause == "timeout (--minutes)"
        with pytest.raises(LLMError) as info:  # and nothing is sent after it
            client.complete(user_messages(), None, purpose="chat")
    assert info.value.kind == "deadline" and "--minutes" in str(info.value) and server.requests == 1


def test_a_huge_body_is_refused_at_the_cap_without_holding_it():
    """A 64 MB reply streamed without a length (a 500 MB answer, scaled down): refused after
    MAX_BODY_BYTES, never retried, and the client never holds much more than the cap."""
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        conn.sendall(b'{"choices": [{"message": {"content": "')
        chunk = b"x" * (1 << 20)
        for _ in range(64):
            if stop.is_set():
                return
            conn.sendall(chunk)

    with RawServer(respond) as server:
        client = make_test_client(server.url, timeout_s=20.0, max_retries=3)
        tracemalloc.start()
        try:
            with pytest.raises(LLMError) as info:
                client.complete(user_messages(), None, purpose="chat")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert info.value.kind == "too_large" and f"{MAX_BODY_BYTES:,} bytes" in str(info.value)
    assert info.value.attempts == 1 and server.requests == 1  # not retried: no retry would read it
    assert peak < 4 * MAX_BODY_BYTES, peak  # nothing near 64 MB was held


def test_a_body_announced_too_large_is_refused_unread():
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500000000\r\n\r\n")
        stop.wait(10)  # the 500 MB never come: the client must not wait for them

    with RawServer(respond) as server:
        client = make_test_client(server.url, timeout_s=20.0, max_retries=3)
        t0 = time.monotonic()
        with pytest.raises(LLMError) as info:
            client.complete(user_messages(), None, purpose="chat")
    assert time.monotonic() - t0 < 2.0 and info.value.kind == "too_large" and "500,000,000" in str(info.value)


def test_an_answer_past_the_cap_is_unreadable_and_journaled_clipped():
    """1.2 million characters of answer (a body under the cap): an unreadable answer, with the
    reason; what the journal keeps of it is its first MAX_ANSWER_CHARS."""
    from kerngen.harness.spec.spec import KernelSpec

    calls = []
    with ChatServer() as server:
        server.push(Reply.completion("x" * 1_200_000))
        client = make_test_client(server.url)
        client.on_call = calls.append
        with pytest.raises(AnswerError) as info:
            client.complete(user_messages(), KernelSpec, purpose="implement")
    assert info.value.kind is AnswerProblem.too_large and "1,200,000 characters" in str(info.value)
    assert len(calls) == 1 and len(calls[0].response_text) == MAX_ANSWER_CHARS
    assert calls[0].cause == "unreadable: too_large"
