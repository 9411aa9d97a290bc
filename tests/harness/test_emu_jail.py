"""The emulator's jail: a kernel's source is host C++ to the emulator, so its compile and its run
are confined (harness/emu/jail.py). A hostile source may try, at compile time, to include a host
file (its text would come back in the error), or, at run time, to read files, the environment, or
the network: each attempt must find nothing. These kernels call libc directly (g++ compiles them;
NVRTC, and so ``kerngen check``, would refuse them first)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from kerngen.harness.compile.landlock import abi_version
from kerngen.harness.emu.runner import EmuError, emulate
from kerngen.harness.spec.spec import KernelSpec

pytestmark = [pytest.mark.needs_cxx,
              pytest.mark.skipif(abi_version() < 4, reason="the kernel has no Landlock with network rules")]

# fopen, getenv and system come with the emulator's shim (<cstdio>, <cstdlib>)
LIBC = 'extern "C" { int socket(int, int, int); int connect(int, const void*, unsigned); }\n'


def spec(body: str, prelude: str = LIBC) -> KernelSpec:
    src = prelude + 'extern "C" __global__ void k(float* out, int port) {\n' + body + "\n}\n"
    return KernelSpec.model_validate({"name": "jail", "source": src, "steps": [
        {"kernel": "k", "grid": [1], "block": [1], "args": [{"name": "out"}, {"kind": "int32", "value": "out.numel"}]}]})


def run(body: str, port: int = 0) -> float:
    out = torch.full((1,), -1.0)
    emulate(spec(body.replace("PORT", str(port))), {"out": out})
    return float(out[0])


def test_host_files_cannot_be_read_at_run_time(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the key")
    for path in (str(secret), "/etc/hostname", "/proc/self/environ", os.path.expanduser("~/.bashrc")):
        assert run(f'out[0] = fopen("{path}", "r") != nullptr ? 1.0f : 0.0f;') == 0.0, path
    assert run('out[0] = fopen("/tmp/kg-jail-write", "w") != nullptr ? 1.0f : 0.0f;') == 0.0
    assert not os.path.exists("/tmp/kg-jail-write")


def test_the_environment_is_empty_of_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    assert run('out[0] = getenv("OPENAI_API_KEY") != nullptr ? 1.0f : 0.0f;') == 0.0
    assert run('out[0] = getenv("PATH") != nullptr ? 1.0f : 0.0f;') == 1.0  # the harmless ones stay


def test_no_connection_and_no_program_can_be_started():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(3)
        port = server.getsockname()[1]
        got = []
        threading.Thread(target=lambda: got.append(_accept(server)), daemon=True).start()
        body = ("unsigned char a[16] = {2, 0, (unsigned char)(PORT >> 8), (unsigned char)(PORT & 255), 127, 0, 0, 1};\n"
                "int s = socket(2, 1, 0); out[0] = (s >= 0 && connect(s, a, 16) == 0) ? 1.0f : 0.0f;")
        assert run(body, port) == 0.0
    assert run('out[0] = system("true") == 0 ? 1.0f : 0.0f;') == 0.0


def _accept(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except OSError:
        return False


def test_a_host_file_cannot_be_included_at_compile_time(tmp_path):
    secret = tmp_path / "secret.h"
    secret.write_text("int leaked = THE_SECRET_VALUE_42;\n")
    with pytest.raises(EmuError) as failed:
        emulate(spec("out[0] = 1.0f;", prelude=f'#include "{secret}"\n'), {"out": torch.zeros(1)})
    assert "THE_SECRET_VALUE_42" not in str(failed.value)
