"""The parent's handle on one GPU worker process: start, ask with a timeout, kill, restart.

A hang (no reply within the timeout) kills the process group; a crash (EOF on the pipe) is
noticed at once. Either way the next request starts a fresh worker: one bad candidate never
takes the caller down."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kerngen.errors import KerngenError
from kerngen.harness import lifeline
from kerngen.harness.pool.protocol import Envelope, Reply


# torch's allocator for the worker, unless the user chose one: expandable segments map memory in
# pages, so a buffer freed in the middle of a segment gives its memory back. Without them, KernelBench
# at its own size ran out of memory 10 GB under the plan (35_GroupNorm on an H100): 7.5 GB
# buffers 32 KB larger (their guards) than the cached 7.5 GB blocks that were free could not reuse them.
ALLOC_CONF = "expandable_segments:True"


class WorkerTimeout(Exception):
    pass


class WorkerDied(Exception):
    """``killed_outside``: a SIGKILL this side did not send (a node going down kills its processes; the host's OOM
    killer): not the candidate's doing."""

    def __init__(self, message: str, log_tail: str, killed_outside: bool = False) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.killed_outside = killed_outside


class WorkerLost(KerngenError):
    """The worker itself is gone (a Ray actor, or the node it ran on), not by the candidate's doing:
    no verdict on the candidate it had; the pool hands that to another worker (once) or leaves it
    for a resume. A local worker process is never lost: it dies (WorkerDied) and is restarted."""


class WorkerProcess:
    def __init__(
        self, index: int, device: str, start_timeout_s: float = 300.0, module: str = "kerngen.harness.pool.worker"
    ) -> None:
        self.index = index
        self.module = module  # tests substitute a fake worker that hangs or crashes
        self.device = device  # what CUDA_VISIBLE_DEVICES names: one physical GPU
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._next_id = 0
        self.restarts = -1
        self._killed = False  # whether this side sent the SIGKILL that ended the process (kill())
        self.log_path = Path(tempfile.gettempdir()) / f"kerngen-worker-{os.getpid()}-{index}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self._killed = False
        # KERNGEN_PARENT_PID: the worker dies with this process, however it is killed (lifeline)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.device, PYTHONUNBUFFERED="1", KERNGEN_PARENT_PID=str(os.getpid()))
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
        log = open(self.log_path, "ab")
        self.proc = lifeline.spawn(lambda: subprocess.Popen(
            [sys.executable, "-m", self.module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,  # its own process group: a kill takes any children too
        ))
        log.close()
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()
        self.restarts += 1

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode(errors="replace"))
        lines.put(None)  # EOF: the process is gone

    def request(self, request, timeout_s: float) -> Reply:
        """Send one request and wait for its reply. Raises WorkerTimeout or WorkerDied.
        An evaluation is preceded by a prepare request under the start-up allowance, so that
        ``timeout_s`` covers the candidate alone, also on a freshly (re)started worker."""
        from kerngen.harness.pool.protocol import EvaluateRequest, PrepareRequest

        if not self.alive:
            self._start_and_greet()
        if isinstance(request, EvaluateRequest):
            prep = self._exchange(PrepareRequest(problem=request.problem), self.start_timeout_s)
            if prep.error:  # the problem cannot be built: say so as this request's answer
                return prep
        return self._exchange(request, timeout_s)

    def _start_and_greet(self) -> None:
        """Start a worker and wait (with the start-up allowance: importing torch, creating the
        context) until it answers; the caller's timeout then covers only its own request."""
        from kerngen.harness.pool.protocol import HelloRequest

        self.start()
        reply = self._exchange(HelloRequest(ceilings=False), self.start_timeout_s)
        if reply.error:
            raise WorkerDied(f"the worker could not start: {reply.error}", self.log_tail())

    def _exchange(self, request, timeout_s: float) -> Reply:
        self._next_id += 1
        env = Envelope(id=self._next_id, request=request)
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((env.model_dump_json() + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died("the worker exited before the request was sent") from None
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout_s:.0f} s") from None
            if line is None:
                raise self._died("the worker process died")
            reply = Reply.model_validate_json(line)
            if reply.id == env.id:
                if reply.fatal:
                    self._reap()
                return reply

    def _died(self, what: str) -> WorkerDied:
        code = self._reap()
        tail = self.log_tail()
        outside = code == -signal.SIGKILL and not self._killed
        return WorkerDied(f"{what} (exit code {code}" + (", a SIGKILL from outside" if outside else "") + ")", tail,
                          killed_outside=outside)

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is None:
            return
        self._killed = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.kill()
        try:
            self.log_path.unlink()
        except OSError:
            pass
