"""The HTTP transport of the LLM client: a total deadline per request and a cap on every body.

httpx's timeouts are per socket operation: an endpoint that sends one byte every 1.5 s never
trips a 120 s read timeout and can hold a request (and the search) for hours. Here every socket
read, write and connect of a request waits at most until that request's deadline
(:func:`request_deadline`, set by the client around each SDK call in the thread that makes it),
so headers and body that trickle in are cut at the deadline as a timeout; and a read stops within
:data:`POLL_S` of its request being cancelled (Ctrl-C: the client is abandoned, its threads end
now rather than at their deadlines).

An endpoint body (an answer, an error page) is read up to :data:`MAX_BODY_BYTES`: a larger one
is refused (:class:`BodyTooLarge`, never retried) before it is held in memory, so a 500 MB answer
cannot make a 500 MB journal or take gigabytes.

Built on httpx2's own transport; only its connection pool is given a network backend whose
streams honour the deadline (``httpcore2.ConnectionPool(network_backend=...)``). Where a proxy is
configured through the environment, httpx routes through its own proxy transport: the body cap
and the deadline on the body still hold there (they are checked as the body streams in).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterable, Iterator

import httpcore2
import httpx2

MAX_BODY_BYTES = 8 * 1024 * 1024  # an answer of ~2M characters, with room for a reasoning channel
_local = threading.local()


class BodyTooLarge(httpx2.ReadError):
    """An endpoint body past :data:`MAX_BODY_BYTES` (or announced as such): refused unread."""


POLL_S = 0.25  # how often a read waiting for the endpoint looks at its request's cancel event


@contextlib.contextmanager
def request_deadline(deadline: float | None, cancel: threading.Event | None = None) -> Iterator[None]:
    """Requests sent by this thread inside the block end by ``deadline`` (``time.monotonic()``),
    or within :data:`POLL_S` of ``cancel`` being set (an interrupt)."""
    before = getattr(_local, "deadline", None), getattr(_local, "cancel", None)
    _local.deadline, _local.cancel = deadline, cancel
    try:
        yield
    finally:
        _local.deadline, _local.cancel = before


def _left(timeout: float | None) -> float | None:
    """``timeout`` clamped to what is left of this thread's deadline; a timeout error past it."""
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise httpcore2.ReadTimeout("the request's deadline passed")
    return left if timeout is None else min(timeout, left)  # (a timeout <= 0 is the caller's to refuse)


class _Stream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        cancel: threading.Event | None = getattr(_local, "cancel", None)
        if cancel is None:
            return self._inner.read(max_bytes, _left(timeout))
        end = None if timeout is None else time.monotonic() + timeout
        while True:  # short waits, so that a cancelled request stops now, not at its deadline
            if cancel.is_set():
                raise httpcore2.ReadError("the request was cancelled")
            left = _left(None if end is None else end - time.monotonic())
            if left is not None and left <= 0:
                raise httpcore2.ReadTimeout("timed out")
            try:
                return self._inner.read(max_bytes, POLL_S if left is None else min(left, POLL_S))
            except httpcore2.ReadTimeout:
                if left is not None and left <= POLL_S:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _CappedBody(httpx2.SyncByteStream):
    """A response body read up to ``limit`` bytes, and not past the request's deadline."""

    def __init__(self, inner: httpx2.SyncByteStream, limit: int, deadline: float | None) -> None:
        self._inner, self._limit, self._deadline = inner, limit, deadline

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise BodyTooLarge(f"the endpoint's reply is larger than {self._limit:,} bytes: refused")
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise httpx2.ReadTimeout("the request's deadline passed")
            yield chunk

    def close(self) -> None:
        self._inner.close()


class BoundedTransport(httpx2.BaseTransport):
    """httpx2's transport with a total deadline per request and a cap on every body (see the module)."""

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES, proxy: httpx2.Proxy | None = None,
                 limits: httpx2.Limits = httpx2.Limits()) -> None:
        self._inner = httpx2.HTTPTransport(proxy=proxy, limits=limits)
        if proxy is None and hasattr(self._inner, "_pool"):  # the pool's sockets honour the deadline
            self._inner._pool.close()
            self._inner._pool = httpcore2.ConnectionPool(
                ssl_context=httpx2.create_ssl_context(), max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry, network_backend=_Backend())
        self.max_body_bytes = max_body_bytes

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._inner.handle_request(request)
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            response.close()
            raise BodyTooLarge(f"the endpoint's reply announces {int(length):,} bytes (at most "
                               f"{self.max_body_bytes:,} are read): refused", request=request)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = _CappedBody(response.stream, self.max_body_bytes, getattr(_local, "deadline", None))
        return response

    def close(self) -> None:
        self._inner.close()


def http_client(timeout_s: float, max_body_bytes: int = MAX_BODY_BYTES) -> httpx2.Client:
    """An httpx2 client for the SDK, as the SDK makes its own (redirects followed, its connection
    limits, the environment's proxies), with :class:`BoundedTransport` for every route."""
    try:  # the limits the SDK gives its own client
        from openai._base_client import DEFAULT_CONNECTION_LIMITS as limits
    except ImportError:
        limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
    try:  # what httpx itself would mount for HTTP(S)_PROXY / NO_PROXY (a client given a transport does not)
        from httpx2._utils import get_environment_proxies
        proxies = get_environment_proxies()
    except Exception:  # noqa: BLE001 - an httpx without it: no proxies from the environment
        proxies = {}
    mounts = {pattern: (BoundedTransport(max_body_bytes, httpx2.Proxy(url), limits) if url else None)
              for pattern, url in proxies.items()}
    return httpx2.Client(transport=BoundedTransport(max_body_bytes, None, limits),
                         mounts=mounts, timeout=timeout_s, follow_redirects=True)


__all__ = ["BodyTooLarge", "BoundedTransport", "MAX_BODY_BYTES", "POLL_S", "http_client", "request_deadline"]
