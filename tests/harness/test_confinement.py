"""Untrusted source, second pass (issue #31): the bypasses of the hand-written policy, and the
structural defense that holds even when a policy is bypassed: NVRTC gets its headers in memory and
runs in a worker that can open no file (Landlock, a seccomp filter, or both), and nothing compiles
where neither is available unless the user says so.

A host without Landlock (gVisor, a Firecracker guest kernel) is simulated by narrowing
``sandbox.MECHANISMS``, the list of mechanisms a worker is asked to apply."""

from __future__ import annotations

import pytest

from kerngen.errors import CompileError
from kerngen.harness.compile import landlock, sandbox, seccomp, source_policy
from kerngen.harness.compile.compiler import CompileJob, compile_job

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'
SECRET = "sk-planted-secret-0123456789abcdef"
HAS_LANDLOCK = landlock.abi_version() > 0
try:
    seccomp.program()
    HAS_SECCOMP = True
except seccomp.SeccompUnavailable:
    HAS_SECCOMP = False


def bypasses(path: str) -> dict[str, str]:
    """Each way the first policy was passed (the issue's three and their siblings), reading ``path``."""
    return {
        "raw_string_ppnumber": f'#define Z 1.R"x("\n#include "{path}"\n// )x"\n',
        "ppnumber_exponent": f'#define Z 1e+R"x("\n#include "{path}"\n// )x"\n',
        "ppnumber_continued": f'#define Z 1.\\\nR"x("\n#include "{path}"\n// )x"\n',
        "ppnumber_separator": f"#define Z 1'R\"x(\"\n#include \"{path}\"\n// )x\"\n",
        "digit_separator": f"#if 1'0 && __has_include(\"{path}\")\n#endif\n",
        "paste_has_include": f'#define CAT(a, b) a##b\n#if CAT(__has_, include)("{path}")\n#endif\n',
        "paste_has_include_digraph": f'#define CAT(a, b) a %:%: b\n#if CAT(__has_, include)("{path}")\n#endif\n',
        "paste_pragma": '#define CAT(a, b) a##b\nCAT(_Pra, gma)("message(\\"x\\")")\n',
        "paste_pragma_object": '#define P _Pra ## gma\nP("message(\\"x\\")")\n',
        "comment_newline_directive": f'__device__ int a = 1 /*\n*/ #include "{path}"\n',
        "comment_newline_define_paste": 'int b = 1 /*\n*/#define CAT(a, b) a##b\nCAT(_Pra, gma)("message(\\"x\\")")\n',
        "raw_string_splice": f'const char* s = LR"(\n)\\\n";\n#include "{path}"\n// )"\n',
        "space_splice": f'#define X \\ \n#include "{path}"\n',
        "template_args": f'template <int...> struct Show;\nShow<\n#include "{path}"\n> show;\n',
    }


@pytest.fixture
def secret_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / ".env"
    path.write_text(f"OPENAI_API_KEY={SECRET}\n")
    yield str(path)
    sandbox.sandbox().close()


def _leaks(text: str) -> list[str]:
    decimal = ", ".join(str(b) for b in SECRET.encode()[:6])  # the secret as template arguments
    return [s for s in (SECRET, "planted-secret", decimal, "79, 80, 69, 78") if s in text]


@pytest.mark.parametrize("name", sorted(bypasses("/x")))
def test_every_bypass_of_the_first_policy_is_refused(name):
    with pytest.raises(CompileError) as err:
        source_policy.check_source(bypasses("/etc/passwd")[name] + KERNEL)
    assert str(err.value).startswith("source refused: line "), str(err.value)


def test_pasting_onto_a_literal_prefix_is_allowed():
    source_policy.check_source("#define F(k) const int t_##k = 1;\n#define G(k) t_##k##_x\n" + KERNEL)
    with pytest.raises(CompileError, match="token pasting onto 'k'"):
        source_policy.check_source("#define F(k, j) k##j\n" + KERNEL)


MECHANISMS = [
    pytest.param(("landlock", "seccomp"), marks=pytest.mark.skipif(not (HAS_LANDLOCK and HAS_SECCOMP),
                                                                   reason="needs Landlock and seccomp")),
    pytest.param(("landlock",), marks=pytest.mark.skipif(not HAS_LANDLOCK, reason="no Landlock here")),
    pytest.param(("seccomp",), marks=pytest.mark.skipif(not HAS_SECCOMP, reason="no seccomp table here")),
]


@pytest.mark.parametrize("mechanisms", MECHANISMS, ids=lambda m: "+".join(m))
def test_nvrtc_reads_no_planted_secret_even_past_the_policy(secret_file, monkeypatch, mechanisms):
    """The policy bypassed: NVRTC is handed each bypass and the file stays closed to it."""
    monkeypatch.setattr(sandbox, "MECHANISMS", mechanisms)
    sandbox.sandbox().close()
    for name, source in bypasses(secret_file).items():
        reply = sandbox.sandbox().compile(source + KERNEL, ["--gpu-architecture=sm_90"], "sm_90", timeout=60)
        assert not _leaks(reply.log), (name, reply.log[:600])
        if "#include" in source and name != "space_splice" and "paste" not in name:
            assert not reply.ok and "cannot open source file" in reply.log, (name, reply.log[:400])
    confined, how = sandbox.confinement()
    assert confined and how == ", ".join(mechanisms)


@pytest.mark.parametrize("mechanisms", MECHANISMS[1:], ids=lambda m: "+".join(m))
def test_a_search_with_the_policy_bypassed_leaks_nothing(secret_file, tmp_path, monkeypatch, mechanisms):
    """Through compile_job (cache, redaction, the log a repair request quotes): nothing of the file."""
    monkeypatch.setattr(sandbox, "MECHANISMS", mechanisms)
    monkeypatch.setattr(source_policy, "check_source", lambda source: None)
    sandbox.sandbox().close()
    for source in bypasses(secret_file).values():
        job = CompileJob(source=source + KERNEL, options=["--gpu-architecture=sm_90", "--std=c++17"], arch="sm_90",
                         kernels=["k"])
        try:
            compile_job(job)
        except CompileError as exc:
            assert not _leaks(str(exc) + exc.log)
    stored = "".join(p.read_text(errors="replace") for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert stored and not _leaks(stored)


def test_nothing_compiles_unconfined_unless_allowed(secret_file, monkeypatch, capfd):
    monkeypatch.setattr(sandbox, "MECHANISMS", ())
    monkeypatch.delenv(sandbox.ALLOW_UNCONFINED_ENV, raising=False)
    box = sandbox.Sandbox(max_workers=1)
    with pytest.raises(sandbox.SandboxFailure) as err:
        box.compile(KERNEL, ["--gpu-architecture=sm_90"], "sm_90", timeout=60)
    assert "--allow-unconfined-compile" in str(err.value) and "\n" not in str(err.value)
    assert box._idle.empty()  # the unconfined worker was killed, not kept
    monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "1")
    assert box.compile(KERNEL, ["--gpu-architecture=sm_90"], "sm_90", timeout=60).ok
    box.compile(KERNEL, ["--gpu-architecture=sm_90"], "sm_90", timeout=60)
    box.close()
    assert capfd.readouterr().err.count("compiles run unconfined") == 1


def test_the_cli_flag_allows_unconfined_compiles(monkeypatch):
    from typer.testing import CliRunner

    from kerngen.cli.app import app

    monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "0")  # restored (unset) after the test
    result = CliRunner().invoke(app, ["--allow-unconfined-compile", "problems", "softmax", "--json"])
    assert result.exit_code == 0, result.output
    assert sandbox.unconfined_allowed()


def test_the_seccomp_filter_is_well_formed():
    for machine in ("x86_64", "aarch64"):
        prog = seccomp.program(machine)
        assert len(prog) < 255 and prog[-1][0] == 0x06  # ends in a return
        for i, (code, jt, jf, _) in enumerate(prog):  # every jump lands inside the program
            if code & 0x07 == 0x05:
                assert i + 1 + max(jt, jf) < len(prog)
    with pytest.raises(seccomp.SeccompUnavailable):
        seccomp.program("sparc")


@pytest.mark.gpu
def test_a_kernel_through_the_confined_compile_path_runs_on_the_gpu(tmp_path, monkeypatch):
    """On a GPU host (where Landlock may be missing: gVisor, Firecracker): the playbook's softmax is
    compiled by a confined worker from in-memory headers, checked against PyTorch and timed."""
    from typer.testing import CliRunner

    from kerngen.cli.app import app

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))  # compiled now, not served from a cache
    monkeypatch.delenv(sandbox.ALLOW_UNCONFINED_ENV, raising=False)
    spec = tmp_path / "softmax.json"
    runner = CliRunner()
    assert runner.invoke(app, ["playbook", "softmax", "--shape", "4096x4096", "-o", str(spec)]).exit_code == 0
    res = runner.invoke(app, ["bench", "softmax", "--shape", "4096x4096", "--kernel", str(spec)])
    assert res.exit_code == 0, res.output
    confined, how = sandbox.confinement()
    print(f"confinement on this host: {how}")
    assert confined
