"""The source policy fuzzed against the compiler: whatever NVRTC would open, probe or obey, the
policy must have refused.

Generated sources hide a payload (an include, a ``__has_include`` probe, a forbidden pragma, each
also built by token pasting) behind what could fool a lexer: raw strings and the pp-numbers that
look like them (``1.R"x("``), digit separators, ordinary strings and characters with escapes,
line and block comments (a ``//`` comment continued onto the next line, a block comment spanning
a newline before ``#``), line splices at random places, ``\\r\\n`` line ends, digraphs, trigraphs,
and ``#if 0``. The oracle is NVRTC itself (no GPU needed), unconfined, beside a probe file that
inotify watches: a source the policy accepts must compile without NVRTC opening the probe
(``#include`` and ``__has_include`` both open it), failing to open a file, or obeying a forbidden
pragma (``#pragma message: "KERNGEN_PRAGMA"`` in its log: the remark, not the echoed source). The run lasts ``KERNGEN_FUZZ_SECONDS`` (default 3); a failure prints
its seed (``KERNGEN_FUZZ_SEED=... pytest ...`` replays it) and the source.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct
import sys
import time

import pytest

from kerngen.errors import CompileError
from kerngen.harness.compile import source_policy

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the oracle watches files with inotify")
MARKERS = ("cannot open source file", '#pragma message: "KERNGEN_PRAGMA"', "KERNGEN_OPENED")
KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def _nvrtc_log(source: str) -> str:
    err, prog = nvrtc.nvrtcCreateProgram(source.encode("utf-8", "surrogatepass"), b"/kerngen-fuzz/kernel.cu", 0,
                                         [], [])
    try:
        opts = [b"--gpu-architecture=sm_90", b"--std=c++17"]
        nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        if size <= 1:  # no log; and b" " * 1 is CPython's shared one-byte object, which NVRTC would overwrite
            return ""
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        return buf.rstrip(b"\0").decode("utf-8", "replace")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class OpenWatch:
    """inotify on a folder: which files in it were opened since the last call."""

    def __init__(self, folder: str) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0 and self.libc.inotify_add_watch(self.fd, folder.encode(), 0x20) >= 0  # IN_OPEN

    def opened(self) -> list[str]:
        names = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return names
            i = 0
            while i < len(buf):
                _, _, _, n = struct.unpack_from("iIII", buf, i)
                names.append(buf[i + 16 : i + 16 + n].rstrip(b"\0").decode())
                i += 16 + n

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def probe(tmp_path):
    folder = tmp_path / "probe"
    folder.mkdir()
    (folder / "probe.h").write_text("#error KERNGEN_OPENED\n")
    watch = OpenWatch(str(folder))
    yield str(folder / "probe.h"), watch
    watch.close()


def _attempts(watch: OpenWatch, source: str) -> list[str]:
    """What NVRTC did with ``source`` that the policy must have refused."""
    log = _nvrtc_log(source)
    return [f"opened {n}" for n in watch.opened()] + [m for m in MARKERS if m in log]


def _payloads(probe: str) -> list[str]:
    return [
        f'#include "{probe}"\n',
        f"#include <{probe}>\n",
        f'%:include "{probe}"\n',
        f'# /**/ include "{probe}"\n',
        f'int kq_a = 1 /*\n*/ # include "{probe}"\n',
        f'#if __has_include("{probe}")\n#endif\n',
        f'#define KCAT(a, b) a##b\n#if KCAT(__has_, include)("{probe}")\n#endif\n',
        f'#define KCAT(a, b) a %:%: b\n#if KCAT(__has_, include)("{probe}")\n#endif\n',
        f'#define KCAT(a, b) a##b\n#define KX(a) KCAT(a, include)\n#if KX(__has_)("{probe}")\n#endif\n',
        '#define KCAT(a, b) a##b\nKCAT(_Pra, gma)("message(\\"KERNGEN_PRAGMA\\")")\n',
        '#define KP _Pra ## gma\nKP("message(\\"KERNGEN_PRAGMA\\")")\n',
        '#pragma message("KERNGEN_PRAGMA")\n',
        '_Pragma("message(\\"KERNGEN_PRAGMA\\")")\n',
        '#define KS(x) #x\n_Pragma(KS(message("KERNGEN_PRAGMA")))\n',
        f'#define KH "{probe}"\n#include KH\n',
    ]


# what may stand before a payload, each with what may close it after
HIDERS: list[tuple[str, str]] = [
    ('#define KZ 1.R"x("\n', '// )x"\n'),
    ('#define KZ 1e+R"x("\n', '// )x"\n'),
    ('#define KZ 0x1p-R"x("\n', '// )x"\n'),
    ("#define KZ 1'R\"x(\"\n", '// )x"\n'),
    ('#define KZ 1.\\\nR"x("\n', '// )x"\n'),
    ('const char* kz = R"x(\n', ')x";\n'),
    ('const char* kz = u8R"x(\n', ')x";\n'),
    ('const char* kz = LR"(\n', ')";\n'),
    ('const char* kz = R"x(', ')x";\n'),
    ('const char* kz = "\\\\";\n', ""),
    ('const char* kz = "\\"";\n', ""),
    ("const char kc = '\"';\n", ""),
    ("const char kc = '\\'';\n", ""),
    ("#if 1'0\n", "#endif\n"),
    ("#if 0\n", "#endif\n"),
    ("/*\n", "*/\n"),
    ("/* */", ""),
    ("// a comment \\\n", ""),
    ("// a comment\n", ""),
    ("int kq_b = 1 /*\n*/", "\n"),
    ("#define KM(x) \\\n", ""),
    ("??=define KT 1\n", ""),
    ("// ??/\n", ""),
    ("#define KB \\ \n", ""),
    ('"unterminated\n', ""),
    ("'\n", ""),
    ("", ""),
]


# harmless lines, so that some sources pass and the policy's acceptance is put to the test
DECOYS = ["#pragma unroll\n", "#define KD 1\n", "__device__ int kd = 1'000;\n", "#define KN(x) kn_##x\n",
          '__device__ const char* kd2 = "#include <x>";\n', "// #include </etc/passwd>\n", "#if 1\n#endif\n"]


def _mutate(rng: random.Random, text: str) -> str:
    r = rng.random()
    if r < 0.25 and len(text) > 2:  # a splice at a random place (inside names, strings, '#include')
        i = rng.randrange(1, len(text) - 1)
        return text[:i] + "\\\n" + text[i:]
    if r < 0.35:
        return text.replace("\n", "\r\n")
    if r < 0.45:
        return text.replace("#", "%:")
    if r < 0.5:
        return text.replace(" ", " /*\n*/ ", 1)
    return text


def _source(rng: random.Random, probe: str) -> str:
    payloads = _payloads(probe)
    parts: list[str] = []
    for _ in range(rng.randint(1, 3)):
        head, tail = rng.choice(HIDERS)
        body = rng.choice(payloads) if rng.random() < 0.6 else rng.choice(DECOYS)
        parts += [_mutate(rng, head), _mutate(rng, body), _mutate(rng, tail)]
    return "".join(parts) + "\n" + KERNEL


def _accepted(source: str) -> bool:
    try:
        source_policy.check_source(source)
    except CompileError:
        return False
    return True


def test_the_oracle_sees_an_open_a_probe_and_a_pragma(probe):
    path, watch = probe
    payloads = _payloads(path)
    assert _attempts(watch, payloads[0] + KERNEL)
    assert _attempts(watch, payloads[6] + KERNEL) == ["opened probe.h"]  # __has_include built by pasting
    assert _attempts(watch, payloads[9] + KERNEL) == [MARKERS[1]]  # _Pragma built by pasting
    assert _attempts(watch, payloads[4] + KERNEL)  # '#' after a comment's newline
    assert _attempts(watch, DECOYS[0] + KERNEL) == []


def test_policy_refuses_whatever_nvrtc_would_open(probe):
    path, watch = probe
    seed = int(os.environ.get("KERNGEN_FUZZ_SEED", random.randrange(1 << 32)))
    seconds = float(os.environ.get("KERNGEN_FUZZ_SECONDS", "3"))
    rng = random.Random(seed)
    stop = time.monotonic() + seconds
    tried = accepted = dangerous = 0
    while time.monotonic() < stop:
        source = _source(rng, path)
        tried += 1
        hit = _attempts(watch, source)
        dangerous += bool(hit)
        if _accepted(source):
            accepted += 1
            assert not hit, (f"KERNGEN_FUZZ_SEED={seed}: the policy accepted a source with which NVRTC {hit}:\n"
                             f"{source}")
    # the run was a test: it made sources NVRTC would have opened files for, and sources it let pass
    assert tried >= 20 and dangerous >= 5 and accepted >= 5, (seed, tried, dangerous, accepted)
