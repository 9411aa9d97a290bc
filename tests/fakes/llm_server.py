"""A small scripted chat-completions server for tests (stdlib, port 0, one thread per request).

    with ChatServer() as server:
        server.push(Reply.completion('{"a": 1}'), Reply.error(429, "slow down", headers={"Retry-After": "1"}))
        server.default = Reply.completion("...")            # when the script is spent
        client = LLMClient(LLMConfig(model="m", base_url=server.url, api_key=SecretStr("k")))

A scripted entry is a :class:`Reply` or a function ``(Request) -> Reply`` (to answer according to
the request: echo its Authorization header, refuse ``response_format``, ...). Every request is
recorded in ``server.requests``.

The script (and ``default``) answers the chat-completions requests. Any other path (the probes of
a model's context: ``/v1/models``, Ollama's ``/api/version``, ``/api/show``, ...) is answered by
``server.routes[path]`` (a :class:`Reply` or a function, keyed by the path without its query),
else 404, and never takes an entry of the script:

    server.routes["/v1/models"] = Reply.models({"id": "test-model", "max_model_len": 32768})

``server.delay_s`` delays every reply (on top of a reply's own ``delay_s``); ``server.in_flight``
and ``server.max_in_flight`` count the requests being answered at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # decoded JSON, or the raw text

    @property
    def authorization(self) -> str:
        return self.headers.get("authorization", "")


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, str -> text, bytes -> sent as they are, as application/json
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0

    @staticmethod
    def completion(
        content: str | None,
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        finish_reason: str = "stop",
        model: str = "test-model",
        delay_s: float = 0.0,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        usage_extra: dict[str, Any] | None = None,
        reasoning: str | None = None,
        reasoning_field: str = "reasoning_content",
    ) -> "Reply":
        """A chat completion; ``cached_tokens`` / ``reasoning_tokens`` go in the usage details as
        OpenAI reports them, ``usage_extra`` is merged into ``usage`` (e.g. DeepSeek's
        ``prompt_cache_hit_tokens``); ``reasoning`` is the message's reasoning channel
        (``reasoning_content`` as vLLM and DeepSeek name it, or ``reasoning_field``)."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        if reasoning_tokens is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        usage.update(usage_extra or {})
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message[reasoning_field] = reasoning
        return Reply(
            200,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": usage,
            },
            delay_s=delay_s,
        )

    @staticmethod
    def models(*entries: dict[str, Any]) -> "Reply":
        """An OpenAI-compatible model listing (``GET /v1/models``) of ``entries``."""
        data = [{"object": "model", "owned_by": "test", "created": 0, **e} for e in entries]
        return Reply(200, {"object": "list", "data": data})

    @staticmethod
    def error(
        status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None
    ) -> "Reply":
        return Reply(status, {"error": {"message": message, "type": "test_error", "code": code}}, headers or {})


Script = Union[Reply, Callable[[Request], Reply]]


class ChatServer:
    def __init__(self) -> None:
        self.script: deque[Script] = deque()
        self.default: Script | None = None
        self.requests: list[Request] = []
        self.routes: dict[str, Script] = {}  # non-chat paths (without the query) -> their answer
        self.delay_s = 0.0  # added to every reply
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                try:
                    body: Any = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    reply = server._next(req)
                    delay = reply.delay_s + server.delay_s
                    if delay:
                        time.sleep(delay)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                if isinstance(reply.body, bytes):  # raw bytes (a truncated or non-UTF-8 body), sent as JSON
                    data = reply.body
                else:
                    payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                    data = (payload or "").encode()
                try:
                    self.send_response(reply.status)
                    is_json = not isinstance(reply.body, str)
                    self.send_header("Content-Type", "application/json" if is_json else "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def push(self, *replies: Script) -> "ChatServer":
        with self._lock:
            self.script.extend(replies)
        return self

    def _next(self, req: Request) -> Reply:
        path = req.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(req)
            if path.endswith("/chat/completions"):
                entry = self.script.popleft() if self.script else self.default
            else:  # a probe: the script is for the chat requests
                entry = self.routes.get(path, Reply.error(404, f"test server: no route {path}"))
        if entry is None:
            return Reply.error(500, "test server: script exhausted")
        return entry(req) if callable(entry) else entry

    @property
    def chat_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.split("?", 1)[0].endswith("/chat/completions")]

    @property
    def other_requests(self) -> list[Request]:
        """The requests to any path but chat completions (probes), in order."""
        return [r for r in self.requests if not r.path.split("?", 1)[0].endswith("/chat/completions")]

    def start(self) -> "ChatServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def closed_port() -> int:
    """A local port with nothing listening on it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----- a realistic search context for prompt and proposer tests -------------------------------
SOFTMAX_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size, dim = 4096, 65536


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

SOFTMAX_CUDA = r'''#ifndef BLOCK
#define BLOCK 256
#endif
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float red[BLOCK];
    const float* row = x + (long long)blockIdx.x * cols;
    float* orow = out + (long long)blockIdx.x * cols;
    float m = -__int_as_float(0x7f800000);
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, row[i]);
    red[threadIdx.x] = m; __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
    m = red[0]; __syncthreads();
    float sum = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) sum += __expf(row[i] - m);
    red[threadIdx.x] = sum; __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
    float inv = 1.f / red[0];
    for (int i = threadIdx.x; i < cols; i += BLOCK) orow[i] = __expf(row[i] - m) * inv;
}
'''


def softmax_spec_dict(name: str = "softmax_3pass") -> dict:
    return {
        "name": name,
        "description": "one block per row, three passes",
        "source": SOFTMAX_CUDA,
        "tunables": {"BLOCK": [128, 256, 512, 1024]},
        "defaults": {"BLOCK": 256},
        "steps": [
            {
                "kernel": "softmax_rows",
                "grid": ["x.shape[0]"],
                "block": ["BLOCK"],
                "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.shape[1]"}],
            }
        ],
    }


def make_context():
    """(SearchContext, parent NodeSummary, failing EvalResult) for a softmax search on an H200."""
    from kerngen.agent.proposer import Category, Idea, NodeSummary, SearchContext, TriedIdea
    from kerngen.harness.results import (
        Baseline,
        CheckEvidence,
        CheckFailure,
        CompileInfo,
        EvalResult,
        GpuFacts,
        KernelResources,
        Timing,
        Verdict,
    )
    from kerngen.harness.spec.spec import KernelSpec

    def timing(ms: float) -> Timing:
        return Timing(median_ms=ms, q25_ms=ms * 0.99, q75_ms=ms * 1.01, min_ms=ms * 0.98, max_ms=ms * 1.05,
                      mean_ms=ms, reps=100, warmup=3)

    gpu = GpuFacts(name="NVIDIA H200", arch="sm_90", sm_count=132, mem_bytes=150_000_000_000,
                   copy_gbps=4280.0, fp32_tflops=51.0, bf16_tflops=800.0, driver="580.95")
    baseline = Baseline(problem="softmax", gpu=gpu.name, eager=timing(1.067), compiled=timing(0.781),
                        floor_ms=0.50, floor_bound="memory", flops=1.0e9, min_bytes=2 * 4096 * 65536 * 4)
    ctx = SearchContext(
        problem_name="softmax",
        problem_source=SOFTMAX_SOURCE,
        problem_summary="softmax over dim 1 of x: float32 [4096, 65536] -> out: float32 [4096, 65536]; "
        "2.15 GB moved at least",
        sizes={"batch_size": 4096, "dim": 65536},
        tensors={"x": [4096, 65536], "out": [4096, 65536]},
        dtypes={"x": "float32", "out": "float32"},
        gpu=gpu,
        baseline=baseline,
        round=2,
        tried=[
            TriedIdea(idea=Idea(text="Use float4 vector loads for every pass", category=Category.memory_access),
                      outcome="ok 1.18x over parent"),
            TriedIdea(idea=Idea(text="Online softmax: fuse max and sum into one pass", category=Category.compute),
                      outcome="incorrect after 2 repairs"),
        ],
    )
    spec = KernelSpec.model_validate(softmax_spec_dict())
    compile_info = CompileInfo(key="abc", arch="sm_90", nvrtc_version="13.0", options=["-DBLOCK=256"], seconds=0.12,
                               cached=False, kernels={"softmax_rows": KernelResources(registers=40, spill_stores=8,
                                                                                      spill_loads=8)})
    result = EvalResult(verdict=Verdict.ok, spec_hash=spec.content_hash(), config={"BLOCK": 256},
                        compile=compile_info, timing=timing(1.5734), gpu=gpu.name)
    parent = NodeSummary(node_id=7, idea=Idea(text="One block per row", category=Category.parallelism),
                         spec=spec, result=result, speedup_eager=0.678, speedup_compile=0.496, pct_roofline=31.8)
    failing = EvalResult(
        verdict=Verdict.incorrect,
        message="output differs from the reference beyond atol=1e-4",
        config={"BLOCK": 512},
        check=CheckEvidence(seeds=[0, 1, 2], atol=1e-4, rtol=1e-4, max_abs_err=0.0123, max_err_index=[17, 4095],
                            max_err_output="out", got=0.0311, expected=0.0188, rel_err=0.02, mismatches=5120,
                            failed=CheckFailure.mismatch),
        log="ptxas info: Used 40 registers\n" * 2000,
    )
    return ctx, parent, failing


# ----- a client of the test server, as the client tests make it --------------------------------
TEST_KEY = "sk-test-SUPERSECRET-0123456789abcdef"  # must never appear in anything recorded
TEST_IDEAS = {"ideas": [{"text": "vectorize loads", "category": "memory_access", "expected_effect": "1.3x"}]}


def make_test_client(url: str, **knobs):
    """An LLMClient of ``url`` with fast backoff and a short timeout; ``knobs`` override."""
    from pydantic import SecretStr

    from kerngen.agent.llm.client import LLMClient
    from kerngen.agent.llm.config import LLMConfig

    base = dict(backoff_base_s=0.001, backoff_max_s=0.01, timeout_s=5.0)
    base.update(knobs)
    return LLMClient(LLMConfig(model="test-model", base_url=url, api_key=SecretStr(TEST_KEY), **base))


def user_messages(text: str = "hello") -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
