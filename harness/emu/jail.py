"""The emulator's sandbox: g++ on a kernel's source, and the executable it makes, run confined.

The emulator compiles a kernel's CUDA-C as host C++ and runs it on the host, so both steps go
through this jail, as NVRTC goes through its compile worker (:mod:`kerngen.harness.compile.sandbox`):

- an environment of a few non-secret variables (no API key: ``/proc/self/environ`` holds nothing),
- resource limits: address space, CPU seconds, file size, no core dumps; and, where the kernel
  lets an unprivileged process do it, a fresh network namespace (no interface but a down loopback),
- Landlock (:mod:`kerngen.harness.compile.landlock`): the compile may read the toolchain (``/usr``)
  and the emulator's own headers, write only its build folder, and execute only the toolchain; the
  run may execute its one (statically linked) executable, read its job file, read and write its
  data file, and touch nothing else; neither opens a TCP connection or signals outside itself,
- a wall-time limit after which the whole process group is killed.

``python -m kerngen.harness.emu.jail`` is the confining step (it sets the limits, confines itself,
then ``exec``s the command); :func:`run_jailed` is the parent's side. Where Landlock is missing the
command still runs (the user named the spec it emulates), with a warning once on stderr.

The search never emulates: a model's kernel reaches a host only as NVRTC's cubin, run on a GPU.
``kerngen check --emulate`` runs the spec the user names, and the CPU tests run the project's own.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from kerngen.harness.compile.landlock import (
    EXECUTE, MAKE_REG, READ_DIR, READ_FILE, REMOVE_FILE, TRUNCATE, WRITE_FILE, LandlockUnavailable, confine_rules,
)

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
READ = READ_FILE | READ_DIR
READ_EXEC = READ | EXECUTE
READ_WRITE = READ | WRITE_FILE | REMOVE_FILE | MAKE_REG | TRUNCATE
# the only variables the jailed command inherits (nothing secret); the compiler finds its parts by PATH
_PASS_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL")
_UNCONFINED_MARK = "KG_EMU_UNCONFINED: "
_warned = False


@dataclass
class Jail:
    """What a jailed command may do. ``rules``: (path, Landlock rights) pairs."""

    rules: list[tuple[str, int]] = field(default_factory=list)
    memory_mb: int = 4096  # address space
    cpu_s: int = 120
    file_mb: int = 0  # the largest file it may write (0: none)
    cwd: str = "/"


class JailTimeout(Exception):
    """The command ran past its wall-time limit (its process group was killed)."""


def run_jailed(cmd: list[str], jail: Jail, timeout_s: float, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess:
    """Run ``cmd`` inside ``jail``; stdout and stderr captured (bytes). :class:`JailTimeout` past
    ``timeout_s``. ``env`` adds variables (non-secret: the emulator's own) to the scrubbed set."""
    base = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    base.setdefault("LANG", "C.UTF-8")
    base.update(env or {})
    spec = json.dumps(asdict(jail))
    proc = subprocess.Popen([sys.executable, "-m", "kerngen.harness.emu.jail", spec, "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=base, cwd=jail.cwd,
                            start_new_session=True, close_fds=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise JailTimeout(f"over {timeout_s:g} s") from None
    except BaseException:
        _kill_group(proc)
        raise
    _kill_group(proc)  # anything it left behind in its group
    err = _note_unconfined(err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _note_unconfined(err: bytes) -> bytes:
    """Warn once when the jail could not confine (its first stderr line says so); drop that line."""
    global _warned
    mark = _UNCONFINED_MARK.encode()
    if not err.startswith(mark):
        return err
    line, _, rest = err.partition(b"\n")
    if not _warned:
        _warned = True
        why = line[len(mark):].decode(errors="replace")
        print(f"kerngen: warning: the emulator runs without file-system confinement ({why}); its environment "
              "is still empty and its resources limited", file=sys.stderr)
    return rest


def _enter(jail: Jail) -> str:
    """In the jailed process before ``exec``: limits, a network namespace, Landlock. '' or why not confined."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (jail.cpu_s, jail.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (jail.file_mb << 20,) * 2)
    mem = jail.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)  # best effort: not every kernel lets a user do it
    try:
        confine_rules(jail.rules)
    except LandlockUnavailable as exc:
        return str(exc)
    return ""


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: python -m kerngen.harness.emu.jail JAIL_JSON -- COMMAND ...")
    raw = json.loads(sys.argv[1])
    jail = Jail(**{**raw, "rules": [tuple(r) for r in raw["rules"]]})
    why = _enter(jail)
    if why:
        os.write(2, f"{_UNCONFINED_MARK}{why}\n".encode())
    cmd = sys.argv[3:]
    try:
        os.execv(cmd[0], cmd)
    except OSError as exc:
        os.write(2, f"KG_EMU_ERROR: cannot start {os.path.basename(cmd[0])}: {exc.strerror}\n".encode())
        os._exit(127)


if __name__ == "__main__":
    main()
