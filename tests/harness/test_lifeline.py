"""No orphans (issue #31): a compile worker in the middle of a long compile dies within 5 s of its
parent, whether the parent is stopped by SIGTERM (no atexit runs) or SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")

# a parent that starts a worker from a short-lived thread (as compile_many's pool does), gives it
# a compile that runs for minutes, and says the worker's pid once the compile is under way
PARENT = textwrap.dedent("""
    import sys, threading, time
    from kerngen.harness.compile import sandbox
    bomb = "#define A(x) x x x x x x x x\\n" + "".join(
        f"#define L{i} A(L{i - 1})\\n" for i in range(1, 14)).replace("A(L0)", "A(1)") + "int v[] = {L13};\\n"
    box = sandbox.Sandbox(max_workers=1)
    started = []
    def work():
        w = box._take("sm_90")
        started.append(w.proc.pid)
        w.compile(bomb, ["--gpu-architecture=sm_90"], 600)
    t = threading.Thread(target=work, daemon=True)
    t.start()
    while not started:
        time.sleep(0.05)
    time.sleep(1.0)  # the thread that started the worker is still in its compile; NVRTC is busy
    print(started[0], flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_parent_leaves_no_compile_worker(sig):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "KERNGEN_COMPILE_MEMORY_MB": "8192"})
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), line
        worker = int(line)
        assert _alive(worker)
        time.sleep(0.5)
        assert _alive(worker) and parent.poll() is None  # busy compiling
        parent.send_signal(sig)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), f"compile worker {worker} outlived its parent (killed by {sig.name})"
    finally:
        parent.kill()
        parent.wait()


def test_a_worker_whose_parent_is_already_gone_exits():
    from kerngen.harness.lifeline import die_with_parent

    code = "import sys; from kerngen.harness.lifeline import die_with_parent; die_with_parent(1); sys.exit(0)"
    # the parent passed is not ours (pid 1 is never our parent here): the child exits with 1 at once
    out = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert out.returncode == 1 and os.getppid() != 1 and die_with_parent is not None
