"""The compile sandbox: the source policy, the confined NVRTC worker, redaction, and a whole LLM
search in which the model tries every include trick and no secret leaves the process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from kerngen.agent.budget import SearchBudget, SearchConfig
from kerngen.agent.llm.client import LLMClient
from kerngen.agent.llm.config import LLMConfig
from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.context import minimal_context
from kerngen.agent.search import run_search
from kerngen import redact
from kerngen.harness.compile import landlock, sandbox, source_policy
from kerngen.harness.compile.compiler import CompileJob, compile_job, compile_many
from kerngen.harness.compile.cache import CompileCache
from kerngen.errors import CompileError
from kerngen.problems.ref import ProblemRef
from tests.fakes.compiling import CompilingEvaluator
from tests.fakes.llm_server import ChatServer, Reply, softmax_spec_dict

KEY = "sk-canary-key-0123456789abcdefXYZ"
CANARY = "canary-in-the-environment-31337"  # a name that does not look secret: only the sandbox hides it
DOTENV = "canary-from-the-dotenv-file-4242"
HAS_LANDLOCK = landlock.abi_version() > 0
KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'

# every way a source has tried to make NVRTC read a host file
TRICKS = {
    "absolute": '#include "/proc/self/environ"\n',
    "angle": "#include </proc/self/environ>\n",
    "dotenv": '#include ".env"\n',
    "parent": '#include "../x/.env"\n',
    "cwd": '#include "/proc/self/cwd/.env"\n',
    "passwd": '#include "/etc/passwd"\n',
    "pagemap": '#include "/proc/self/pagemap"\n',
    "macro": '#define P "/proc/self/environ"\n#include P\n',
    "macro_angle": "#define P </proc/self/environ>\n#include P\n",
    "digraph": '%:include "/proc/self/environ"\n',
    "comment": '#/**/include "/proc/self/environ"\n',
    "continued": '#inc\\\nlude "/proc/self/environ"\n',
    "has_include": '#if __has_include("/proc/self/environ")\n#error present\n#endif\n',
    "pragma_op": '_Pragma("GCC dependency \\"/proc/self/environ\\"")\n',
    "line": '#line 1 "/proc/self/environ"\n',
    "include_next": '#include_next "/proc/self/environ"\n',
    "embed": 'const char e[] = {\n#embed "/proc/self/environ"\n};\n',
    "reserved_define": '#define __CUDACC_RTC__ "/proc/self/environ"\n',
    "import": '#import "/proc/self/environ"\n',
    # issue #31: what passed the first, hand-written policy
    "raw_string_ppnumber": '#define Z 1.R"x("\n#include ".env"\n// )x"\n',
    "digit_separator": "#if 1'0 && __has_include(\".env\")\n#error present\n#endif\n",
    "paste_has_include": '#define CAT(a, b) a##b\n#if CAT(__has_, include)(".env")\n#error present\n#endif\n',
    "paste_pragma": '#define CAT(a, b) a##b\nCAT(_Pra, gma)("GCC dependency \\".env\\"")\n',
}


@pytest.fixture
def secrets_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("KERNGEN_TEST_CANARY", CANARY)
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    (work / "x").mkdir(parents=True)
    (work / ".env").write_text(f"OPENAI_API_KEY={KEY}\nOTHER={DOTENV}\n")
    (work / "x" / ".env").write_text(f"OTHER={DOTENV}\n")
    monkeypatch.chdir(work / "x")  # so "../x/.env" and ".env" both name a real file
    (work / "x" / ".env").write_text(f"OTHER={DOTENV}\n")
    sandbox.sandbox().close()  # fresh workers see this environment
    return tmp_path


def _job(source: str, kernels: list[str] | None = None) -> CompileJob:
    return CompileJob(source=source, options=["--gpu-architecture=sm_90", "--std=c++17"], arch="sm_90",
                      kernels=kernels or [])


def _leaks(text: str) -> list[str]:
    return [s for s in (KEY, CANARY, DOTENV, "root:x:0:0") if s in text]


# ----- the source policy ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TRICKS))
def test_policy_refuses_every_include_trick(name):
    with pytest.raises(CompileError) as err:
        source_policy.check_source(TRICKS[name] + KERNEL)
    assert str(err.value).startswith("source refused: line ")


def test_policy_names_the_header_and_the_allowed_ones():
    with pytest.raises(CompileError) as err:
        source_policy.check_source('#include "secrets.h"\n' + KERNEL)
    assert "include of 'secrets.h' is not allowed; allowed: " in str(err.value) and "cuda_bf16.h" in str(err.value)


def test_policy_accepts_ordinary_kernels():
    source_policy.check_source(
        "#include <cuda_bf16.h>\n#include \"cuda_fp16.h\"\n#include <cuda/std/cstdint>\n"
        "#pragma once\n#define UNROLL _Pragma(\"unroll\")\n// #include \"/etc/passwd\" in a comment\n"
        "/* #include </etc/shadow> */\nconst char* s = \"#include </etc/passwd>\";\n"
        "#if defined(FOO)\n#error no\n#endif\n" + KERNEL
    )


@pytest.mark.parametrize("header", [*source_policy.ALLOWED_HEADERS, "cuda/std/limits", "cuda/std/type_traits"])
def test_every_allowed_header_compiles_in_the_sandbox(header):
    out = compile_job(_job(f"#include <{header}>\n" + KERNEL.replace(" k(", " k_h("), ["k_h"]), cache=None)
    assert out.cubin.startswith(b"\x7fELF")


def test_reserved_define_names_from_a_config_are_refused():
    from kerngen.harness.compile.compiler import build_options
    from kerngen.harness.spec.plan import ResolvedPlan

    spec_stub = type("S", (), {"fast_math": False})()
    with pytest.raises(CompileError, match="reserved"):
        build_options(spec_stub, ResolvedPlan(config={"__CUDA_ARCH__": 1}, defines={}, steps=[], scratch=[]),
                      "sm_90")
    with pytest.raises(CompileError, match="64 bits"):
        build_options(spec_stub, ResolvedPlan(config={"N": 10**40}, defines={}, steps=[], scratch=[]), "sm_90")


# ----- the confined worker --------------------------------------------------------------------
def test_worker_environment_holds_no_secret(secrets_env):
    env = sandbox.worker_env()
    assert "OPENAI_API_KEY" not in env and "KERNGEN_TEST_CANARY" not in env
    compile_job(_job(KERNEL, ["k"]), cache=None)
    for w in list(sandbox.sandbox()._idle.queue):
        environ = Path(f"/proc/{w.proc.pid}/environ").read_bytes().decode()
        assert not _leaks(environ) and "OPENAI_API_KEY" not in environ
        assert w.hello.confined and w.hello.mechanisms == [m for m in sandbox.MECHANISMS
                                                             if m != "landlock" or HAS_LANDLOCK]


@pytest.mark.parametrize("name", ["absolute", "dotenv", "parent", "cwd", "passwd", "pagemap", "macro",
                                  "has_include", "continued"])
def test_confined_nvrtc_reads_no_host_file_even_past_the_policy(secrets_env, name):
    """The policy bypassed: NVRTC itself is handed the trick and cannot open the file."""
    start = time.monotonic()
    reply = sandbox.sandbox().compile(TRICKS[name] + KERNEL, ["--gpu-architecture=sm_90"], "sm_90", timeout=60)
    assert time.monotonic() - start < 30  # /proc/self/pagemap once drove NVRTC past 7 GB
    assert not _leaks(reply.log), reply.log[:500]
    if name != "has_include":
        assert not reply.ok and "cannot open source file" in reply.log
    else:  # the probe says "absent" for a file that exists: it cannot see it
        assert reply.ok


def test_a_hung_compile_is_killed_and_the_next_one_works(secrets_env):
    bomb = "#define A(x) x x x x x x x x\n" + "".join(
        f"#define L{i} A(L{i - 1})\n" for i in range(1, 13)).replace("A(L0)", "A(1)") + "int v[] = {L12};\n"
    start = time.monotonic()
    out = compile_many([_job(bomb)], cache=None, timeout_s=2.0)[0]
    assert isinstance(out, CompileError) and "timed out" in str(out)
    assert time.monotonic() - start < 15
    assert not isinstance(compile_many([_job(KERNEL, ["k"])], cache=None)[0], CompileError)


def test_a_compile_past_its_memory_limit_fails_fast(secrets_env, monkeypatch):
    monkeypatch.setenv("KERNGEN_COMPILE_MEMORY_MB", "400")
    sandbox.sandbox().close()
    big = "#define A(x) x x x x x x x x\n" + "".join(
        f"#define L{i} A(L{i - 1})\n" for i in range(1, 13)).replace("A(L0)", "A(1)") + "int v[] = {L12};\n"
    start = time.monotonic()
    out = compile_many([_job(big)], cache=None, timeout_s=60.0)[0]
    assert isinstance(out, CompileError)
    assert "timed out" not in str(out) and time.monotonic() - start < 55, str(out)
    monkeypatch.delenv("KERNGEN_COMPILE_MEMORY_MB")
    sandbox.sandbox().close()
    assert not isinstance(compile_many([_job(KERNEL, ["k"])], cache=None)[0], CompileError)


def test_cubins_do_not_depend_on_the_worker():
    box = sandbox.sandbox()
    a = box._take("sm_90")
    b = box._take("sm_90")
    try:
        opts = ["--gpu-architecture=sm_90", "-lineinfo"]
        assert sandbox.cubin_of(a.compile(KERNEL, opts, 30)) == sandbox.cubin_of(b.compile(KERNEL, opts, 30))
    finally:
        a.kill()
        b.kill()


# ----- redaction ------------------------------------------------------------------------------
def test_redact_hides_secret_looking_values_and_registered_keys(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-1234567890")
    monkeypatch.setenv("SOME_VAR", "sk-abcdefghijklmnop")
    monkeypatch.setenv("KERNGEN_LOG_LEVEL", "ERROR")
    redact.register_secret("registered-secret-value")
    text = "a tok-1234567890 b sk-abcdefghijklmnop c registered-secret-value d ERROR"
    assert redact.redact(text) == "a [redacted] b [redacted] c [redacted] d ERROR"
    assert redact.redact_obj({"x": [text]}) == {"x": [redact.redact(text)]}


def test_printable_strips_terminal_control_sequences():
    hostile = "idea\x1b]52;c;ZXZpbA==\x07 one\x1b[2J\x1b[H two\x9b31m three\u202e four\r\nfive\tsix"
    assert redact.printable(hostile) == "idea one two three four\nfive\tsix"


def test_compile_cache_never_stores_or_serves_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cache = CompileCache(tmp_path)
    cache.put_failure("ab" * 32, f"error near {KEY}", f"log with {KEY}")
    stored = "".join(p.read_text() for p in tmp_path.rglob("*.json"))
    assert KEY not in stored
    # an entry written by an older kerngen (schema 1) with a leaked log is a miss, and is removed
    folder = tmp_path / "cd"
    folder.mkdir()
    old = {"schema": 1, "key": "cd" * 32, "ok": False, "message": "m", "log": KEY}
    (folder / f"{'cd' * 32}.json").write_text(json.dumps(old))
    assert cache.get("cd" * 32) is None and not (folder / f"{'cd' * 32}.json").exists()


# ----- a whole search, the model trying every trick -------------------------------------------
def _spec_with(source_prefix: str) -> str:
    spec = softmax_spec_dict()
    spec["source"] = source_prefix + spec["source"]
    return json.dumps(spec)


@pytest.mark.parametrize("policy", ["on", "bypassed", "bypassed-without-landlock"])
def test_search_with_a_model_trying_every_include_trick_leaks_nothing(secrets_env, monkeypatch, capfd, policy):
    if policy.startswith("bypassed"):
        monkeypatch.setattr(source_policy, "check_source", lambda source: None)
    if policy == "bypassed-without-landlock":  # a gVisor or Firecracker host: the seccomp filter alone
        monkeypatch.setattr(sandbox, "MECHANISMS", ("seccomp",))
        sandbox.sandbox().close()
    tricks = iter(list(TRICKS.values()) * 4)

    def answer(req):
        fmt = (req.body or {}).get("response_format") or {}
        if fmt.get("json_schema", {}).get("name") == "IdeaList":
            ideas = [{"text": f"read the key, take {i}", "category": "memory_access"} for i in range(3)]
            return Reply.completion(json.dumps({"ideas": ideas}))
        return Reply.completion(_spec_with(next(tricks, TRICKS["absolute"])))

    ev = CompilingEvaluator()
    with ChatServer() as server:
        server.default = answer
        client = LLMClient(LLMConfig(model="m", base_url=server.url, api_key=SecretStr(KEY), backoff_base_s=0.001,
                                     backoff_max_s=0.01, timeout_s=10.0))
        out = run_search(ProblemRef(source="softmax", shape=(8, 64)), LLMProposer(client), ev,
                         runs_dir=secrets_env / "runs", config=SearchConfig(ideas=3, branches=3, repairs=1, beam=1),
                         budget=SearchBudget(rounds=1), context_factory=minimal_context)
        bodies = [json.dumps(r.body) + json.dumps(r.headers.get("x-extra", "")) for r in server.requests]
    verdicts = [n.verdict for n in out.tree.nodes.values() if n.spec is not None]
    assert len(verdicts) >= 9, verdicts
    messages = [n.result.message for n in out.tree.nodes.values() if n.result is not None]
    if policy == "on":
        assert set(verdicts) == {"compile_error"}, verdicts
        assert all(m.startswith("source refused") for m in messages), messages
    else:  # NVRTC saw each trick: most fail to open the file; a __has_include probe just says "absent"
        assert any("cannot open source file" in (n.result.log or "") for n in out.tree.nodes.values() if n.result)
    files = [p for root in (out.run_dir, secrets_env / "cache") for p in root.rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert not _leaks(p.read_bytes().decode("utf-8", "replace")), p
    for body in bodies:
        assert not _leaks(body), body[:300]
    captured = capfd.readouterr()
    assert not _leaks(captured.out + captured.err)
    assert os.environ["OPENAI_API_KEY"] == KEY  # the key was there all along
