"""The compile sandbox: NVRTC runs in confined worker processes, never in kerngen's own.

Every compile, even a batch of one, goes to a worker (:mod:`.nvrtc_worker`) that

- was started with an environment of a few non-secret variables (no API key, no token: even a
  read of ``/proc/self/environ`` would find nothing),
- runs in an empty temporary directory,
- is handed every header a kernel may include in memory (:func:`.headers.virtual_headers`) and no
  include directory,
- can open no file at all, write none and open no connection: Landlock (:mod:`.landlock`) with no
  readable directory, and a seccomp filter (:mod:`.seccomp`) that fails every system call naming
  a path, each where the kernel has it (:data:`MECHANISMS`),
- dies with its parent, whatever kills the parent (:mod:`kerngen.harness.lifeline`),
- may grow its address space by at most ``KERNGEN_COMPILE_MEMORY_MB`` (default 4096) past what it
  has mapped once NVRTC is loaded,
- is killed when a compile runs past its wall-time limit (``KERNGEN_COMPILE_TIMEOUT_S``,
  default 120 s) and replaced by a fresh one.

Workers persist across calls (starting one costs about 0.3 s: Python, NVRTC and a warm-up
compile), one per CPU core at most. Where neither mechanism is available, nothing is compiled
(model-written source could then make NVRTC read host files past a flaw in the source policy)
unless the user allows it (``kerngen --allow-unconfined-compile``, or
``KERNGEN_ALLOW_UNCONFINED_COMPILE=1``); kerngen then warns once on stderr. :func:`confinement`
says which mechanisms hold.
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from pydantic import BaseModel, ValidationError

from kerngen.harness import lifeline
from kerngen.harness.compile import headers
from kerngen.errors import CompileError
from kerngen.harness.compile.nvrtc_worker import MAX_FRAME, write_frame

log = logging.getLogger("kerngen.sandbox")

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 4096  # beyond what the worker has mapped after loading NVRTC
START_TIMEOUT_S = 60.0
MAX_LOG_CHARS = 200_000
# the only variables a worker inherits: where Python, NVRTC and the headers are; nothing secret
# how a worker confines itself, each applied where the kernel has it (tests narrow this to simulate
# a host without Landlock, or without either)
MECHANISMS: tuple[str, ...] = ("landlock", "seccomp")
ALLOW_UNCONFINED_ENV = "KERNGEN_ALLOW_UNCONFINED_COMPILE"
_PASS_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LANG", "LC_ALL", "SYSTEMROOT")


class WorkerReply(BaseModel):
    """What a worker answers to a compile (untrusted: validated before use)."""

    ok: bool
    status: str = ""
    log: str = ""
    cubin: str = ""  # base64


class WorkerHello(BaseModel):
    type: str
    confined: bool
    mechanisms: list[str] = []
    why: str = ""
    warm: bool = False
    nvrtc: str = ""
    pid: int = 0


class SandboxFailure(CompileError):
    """The worker timed out, died or answered garbage: not a property of the source alone
    (never cached)."""


def timeout_s() -> float:
    return _env_float("KERNGEN_COMPILE_TIMEOUT_S", DEFAULT_TIMEOUT_S)


def memory_mb() -> int:
    return int(_env_float("KERNGEN_COMPILE_MEMORY_MB", DEFAULT_MEMORY_MB))


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def unconfined_allowed() -> bool:
    return os.environ.get(ALLOW_UNCONFINED_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.cache
def _headers_payload() -> dict[str, str]:
    return {name: data.decode("latin-1") for name, data in headers.virtual_headers().items()}


def worker_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    return env


class _Worker:
    def __init__(self, arch: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="kerngen-nvrtc-")
        env = worker_env()
        env["HOME"] = env["TMPDIR"] = self.dir
        argv = [sys.executable, "-m", "kerngen.harness.compile.nvrtc_worker", str(os.getpid())]
        self.proc = lifeline.spawn(lambda: subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self.dir, env=env, start_new_session=True, close_fds=True,
        ))
        try:
            assert self.proc.stdin is not None
            write_frame(self.proc.stdin, {"type": "init", "headers": _headers_payload(), "memory_mb": memory_mb(),
                                          "arch": arch, "mechanisms": list(MECHANISMS)})
            raw = self._read(START_TIMEOUT_S)
            self.hello = WorkerHello.model_validate(raw)
        except BaseException:
            self.kill()
            raise

    def _read(self, timeout: float) -> dict[str, Any]:
        """One frame from the worker within ``timeout`` seconds, else :class:`SandboxFailure`."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        need = 4
        size = None
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxFailure(f"compile timed out (over {timeout:.0f} s)", "")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, min(1 << 20, need - len(buf)))
            if not chunk:
                code = self.proc.poll()
                raise SandboxFailure(f"compile process died ({_exit_text(code)})", "")
            buf += chunk
            if size is None and len(buf) >= 4:
                size = int.from_bytes(buf[:4], "big")
                if size > MAX_FRAME:
                    raise SandboxFailure("compile process sent an oversized reply", "")
                need = 4 + size
        try:
            data = json.loads(buf[4:].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise SandboxFailure("compile process sent a malformed reply", "") from None
        if not isinstance(data, dict):
            raise SandboxFailure("compile process sent a malformed reply", "")
        return data

    def compile(self, source: str, options: list[str], timeout: float) -> WorkerReply:
        assert self.proc.stdin is not None
        try:
            write_frame(self.proc.stdin, {"type": "compile", "source": source, "options": options})
        except (BrokenPipeError, OSError):
            raise SandboxFailure(f"compile process died ({_exit_text(self.proc.poll())})", "") from None
        raw = self._read(timeout)
        try:
            return WorkerReply.model_validate(raw)
        except ValidationError:
            raise SandboxFailure("compile process sent a malformed reply", "") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no reply"
    if code < 0:
        return f"killed by signal {-code}: likely past its memory limit of {memory_mb()} MB"
    return f"exit code {code}"


class Sandbox:
    """A set of confined workers shared by every thread of this process."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max_workers or _cpu_count()
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._count = 0
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.max_workers)
        self._warned = False
        self.confined: bool | None = None
        self.mechanisms: list[str] = []
        self.why = ""

    def _take(self, arch: str) -> _Worker:
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                break
            if w.alive():
                return w
            w.kill()
        try:
            w = _Worker(arch)
        except SandboxFailure as exc:
            raise SandboxFailure(f"could not start a compile process: {exc}", "") from None
        except (OSError, ValidationError) as exc:
            raise SandboxFailure(f"could not start a compile process: {type(exc).__name__}: {exc}", "") from None
        try:
            self._note(w.hello)
        except SandboxFailure:
            w.kill()
            raise
        return w

    def _note(self, hello: WorkerHello) -> None:
        """Record how the worker is confined; :class:`SandboxFailure` for an unconfined one unless
        the user allowed it (then one warning on stderr)."""
        with self._lock:
            self.confined = hello.confined
            self.mechanisms = list(hello.mechanisms)
            self.why = hello.why
            if hello.confined:
                return
            if not unconfined_allowed():
                raise SandboxFailure(
                    f"compile refused: this host cannot confine the compile process ({hello.why or 'no mechanism'}); "
                    "without confinement a kernel source could make NVRTC read host files, so nothing is compiled "
                    f"unless you pass kerngen --allow-unconfined-compile ({ALLOW_UNCONFINED_ENV}=1)", "")
            if not self._warned:
                self._warned = True
                print(f"kerngen: warning: compiles run unconfined ({hello.why}), as allowed by "
                      f"{ALLOW_UNCONFINED_ENV}: only the source policy keeps host files out of the compiler",
                      file=sys.stderr)

    def compile(self, source: str, options: list[str], arch: str, timeout: float | None = None) -> WorkerReply:
        """Compile in a worker; :class:`SandboxFailure` when it times out, dies or misbehaves."""
        limit = timeout if timeout is not None else timeout_s()
        with self._slots:
            w = self._take(arch)
            try:
                reply = w.compile(source, options, limit)
            except SandboxFailure:
                w.kill()  # a hung or dead worker is never reused
                raise
            except BaseException:
                w.kill()
                raise
            self._idle.put(w)
            return reply

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_SANDBOX: Sandbox | None = None
_SANDBOX_LOCK = threading.Lock()


def sandbox() -> Sandbox:
    global _SANDBOX
    with _SANDBOX_LOCK:
        if _SANDBOX is None:
            _SANDBOX = Sandbox()
            atexit.register(_SANDBOX.close)
        return _SANDBOX


def confinement() -> tuple[bool | None, str]:
    """(whether the last worker started is confined, which mechanisms hold or why none does);
    ``None`` before any compile."""
    box = sandbox()
    return box.confined, ", ".join(box.mechanisms) if box.confined else box.why


def cubin_of(reply: WorkerReply) -> bytes:
    try:
        return base64.b64decode(reply.cubin, validate=True)
    except ValueError:
        raise SandboxFailure("compile process sent a malformed cubin", "") from None


def clip_log(text: str) -> str:
    """A log kept to :data:`MAX_LOG_CHARS` (head and tail: the first error and the summary)."""
    if len(text) <= MAX_LOG_CHARS:
        return text
    half = MAX_LOG_CHARS // 2
    return text[:half] + f"\n... [{len(text) - MAX_LOG_CHARS} characters cut] ...\n" + text[-half:]
