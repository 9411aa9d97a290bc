"""The compile worker: a process that runs NVRTC on untrusted source, confined.

Started by :mod:`.sandbox` as ``python -m kerngen.harness.compile.nvrtc_worker PARENT_PID`` with an
empty environment (no secrets), an empty temporary working directory, and stdin/stdout as its only
channel. It:

0. asks the kernel to kill it when its parent dies (:mod:`kerngen.harness.lifeline`);
1. reads the ``init`` frame (every header a kernel may include, by name and content; the memory
   limit; an arch to warm up; the confinement mechanisms to apply);
2. loads NVRTC and compiles a tiny kernel, so that every library NVRTC opens lazily is open;
3. lowers its own limits (address space, file size 0, no core dumps) and confines itself: Landlock
   (:mod:`.landlock`) with no readable directory at all, and a seccomp filter (:mod:`.seccomp`)
   that fails every system call naming a path. NVRTC gets the headers in memory and no include
   directory, so from here on it opens no file, and could not if asked;
4. answers ``hello`` (which mechanisms hold), then serves ``compile`` frames until stdin closes.

A frame is a 4-byte big-endian length and a UTF-8 JSON object. The worker imports nothing after
step 3 (an import would need to read files it can no longer read), so everything it uses is
imported at the top.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

from kerngen.harness import lifeline
from kerngen.harness.compile import headers, landlock, seccomp

MAX_FRAME = 64 << 20
# An absolute name (of no real file): NVRTC then records no working directory in the cubin's line
# table, so a cubin is the same byte for byte whichever worker (and temporary directory) made it.
# The log shows it as plain ``kernel.cu``.
PROGRAM_NAME = "/kerngen/kernel.cu"
_WARMUP = '#include <cuda_fp16.h>\nextern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = stream.read(size)
    if len(body) < size:
        return None
    data = json.loads(body.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("frame is not an object")
    return data


def write_frame(stream: BinaryIO, data: dict[str, Any]) -> None:
    body = json.dumps(data).encode("utf-8")
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def _nvrtc_compile(nvrtc: Any, source: str, options: list[str], names: list[bytes], bodies: list[bytes]) -> dict[str, Any]:
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), PROGRAM_NAME.encode(), len(names), bodies, names)
    if err != ok:
        return {"ok": False, "status": err.name, "log": ""}
    try:
        opts = [o.encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = ""
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        if err == ok and size > 1:
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0").decode("utf-8", "replace").replace(PROGRAM_NAME, "kernel.cu")
        if res != ok:
            return {"ok": False, "status": res.name, "log": log}
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok or size == 0:
            return {"ok": False, "status": "NO_CUBIN", "log": log}
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            return {"ok": False, "status": err.name, "log": log}
        return {"ok": True, "status": "NVRTC_SUCCESS", "log": log, "cubin": base64.b64encode(cubin).decode()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _mapped_bytes() -> int:
    """This process's address space now (``VmSize``): what NVRTC and Python already reserve, which
    varies a lot between hosts (13 GB of mostly untouched reservations was seen on one)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _limit(memory_mb: int) -> None:
    """No core dumps, no file writes, and at most ``memory_mb`` of address space beyond what is
    mapped now (so the limit bounds what a compile can allocate, whatever the host reserves)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    if memory_mb > 0:
        limit = _mapped_bytes() + (memory_mb << 20)
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _confine(mechanisms: list[str]) -> tuple[list[str], str]:
    """Apply each asked mechanism that this kernel has: (those applied, why the others are not)."""
    applied, why = [], []
    for name in mechanisms:
        try:
            if name == "landlock":
                landlock.confine([])  # no rule: nothing beneath any directory is readable
            elif name == "seccomp":
                seccomp.confine()
            else:
                why.append(f"{name}: unknown")
                continue
            applied.append(name)
        except OSError as exc:  # LandlockUnavailable, SeccompUnavailable
            why.append(f"{name}: {exc}")
    return applied, "; ".join(why)


def main() -> int:
    if len(sys.argv) > 1:
        lifeline.die_with_parent(int(sys.argv[1]))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the channel
    init = read_frame(stdin)
    if init is None:
        return 1
    from cuda.bindings import nvrtc  # loads libnvrtc before confinement

    # headers travel as latin-1 text (any byte, losslessly, in JSON)
    table = {str(k): str(v).encode("latin-1") for k, v in dict(init.get("headers") or {}).items()}
    names, bodies = [n.encode() for n in table], list(table.values())
    warm = _nvrtc_compile(nvrtc, _WARMUP, [f"--gpu-architecture={init.get('arch', 'sm_90')}",
                                           f"--pre-include={headers.PRELUDE_NAME}"], names, bodies)
    _limit(int(init.get("memory_mb", 0)))
    applied, why = _confine([str(m) for m in init.get("mechanisms", [])])
    err, major, minor = nvrtc.nvrtcVersion()
    write_frame(stdout, {"type": "hello", "confined": bool(applied), "mechanisms": applied, "why": why,
                         "warm": warm["ok"], "nvrtc": f"{major}.{minor}", "pid": os.getpid()})
    while True:
        try:
            job = read_frame(stdin)
        except (ValueError, UnicodeDecodeError):
            return 2
        if job is None:
            return 0
        try:
            reply = _nvrtc_compile(nvrtc, str(job["source"]), [str(o) for o in job["options"]], names, bodies)
        except MemoryError:
            reply = {"ok": False, "status": "OUT_OF_MEMORY", "log": "the compile ran out of its memory limit"}
        write_frame(stdout, reply)


if __name__ == "__main__":
    sys.exit(main())
