"""CPU tier: every CUDA source of the GPU tier (tests/kernels/specs.py) compiles with NVRTC for
sm_90, in every configuration of its tunables, so a typo fails here and not on the GPU host.

Two views of each kernel:

- plain NVRTC (``cuda.bindings.nvrtc``, no harness code): the source is valid CUDA. This is what
  makes a ``forbidden`` verdict on the GPU meaningful: the cheat compiles, the harness's module
  check is what refuses it. Only the dynamic-parallelism cheat must fail here already.
- the harness's own path (plan resolved against the problem on the CPU, ``job_for`` +
  ``compile_job``): correct kernels and plain cheats compile; every persistent-state cheat
  (cheats 3, 4, 8) is refused with a message starting ``forbidden:``.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import pytest

from kerngen.errors import CompileError
from kerngen.harness.compile.headers import virtual_headers
from tests.kernels.specs import CASES, Case

ARCH = "sm_90"


def _nvrtc_compile(source: str, options: list[str]) -> tuple[bool, str]:
    """(ok, log) of one NVRTC compile to sm_90 cubin."""
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    table = virtual_headers()  # as the sandbox hands them: in memory, no include directory
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", len(table), list(table.values()),
                                         [n.encode() for n in table])
    assert err == ok, err
    try:
        opts = [o.encode() for o in [f"--gpu-architecture={ARCH}", "--std=c++17", *options]]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * max(size, 2)  # never CPython's shared one-byte b" ", which NVRTC would overwrite
        nvrtc.nvrtcGetProgramLog(prog, log)
        if res == ok:
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            assert size > 0, "NVRTC produced no cubin"
        return res == ok, log.rstrip(b"\0").decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _configs(c: Case) -> list[tuple[str, dict[str, int]]]:
    return [(c.name, cfg) for cfg in c.spec.configs()]


ALL_CONFIGS = [item for c in CASES.values() for item in _configs(c)]


@functools.cache
def _plain_results() -> dict[tuple[str, str], tuple[bool, str]]:
    def one(item: tuple[str, dict[str, int]]) -> tuple[bool, str]:
        name, cfg = item
        return _nvrtc_compile(CASES[name].spec.source, [f"-D{k}={v}" for k, v in sorted(cfg.items())])

    with ThreadPoolExecutor(max_workers=8) as pool:
        outs = list(pool.map(one, ALL_CONFIGS))
    return {(name, repr(sorted(cfg.items()))): out for (name, cfg), out in zip(ALL_CONFIGS, outs)}


@pytest.mark.parametrize(
    "name,config", ALL_CONFIGS, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in c.items()) or 'default'}" for n, c in ALL_CONFIGS]
)
def test_source_compiles_with_plain_nvrtc(name: str, config: dict[str, int]) -> None:
    ok, log = _plain_results()[(name, repr(sorted(config.items())))]
    if CASES[name].nvrtc_ok:
        assert ok, f"{name} {config} does not compile:\n{log}"
    else:
        assert not ok, f"{name} must be refused by NVRTC itself"


# ----- the harness's compile path ------------------------------------------------------------
@functools.cache
def _harness_results() -> dict[str, object]:
    from kerngen.harness.compile.compiler import compile_many, job_for
    from kerngen.harness.spec.plan import resolve
    from kerngen.problems.load import load_problem

    infos = {}
    jobs = []
    for c in CASES.values():
        if c.problem not in infos:
            infos[c.problem] = load_problem(c.problem).info
        info = infos[c.problem]
        plan = resolve(c.spec, sizes=info.sizes, tensors=info.tensor_facts(), config={})
        jobs.append(job_for(c.spec, plan, ARCH))
    return dict(zip(CASES, compile_many(jobs, cache=None)))


@pytest.mark.parametrize("name", list(CASES))
def test_harness_compile_verdict(name: str) -> None:
    c = CASES[name]
    out = _harness_results()[name]
    if c.forbidden:
        assert isinstance(out, CompileError), f"{name}: persistent device state was NOT refused"
        assert str(out).startswith("forbidden:"), f"{name}: refused, but not as forbidden: {out}"
    elif not c.nvrtc_ok:
        assert isinstance(out, CompileError), f"{name}: must not compile"
    else:
        assert not isinstance(out, CompileError), f"{name}: {out}\n{getattr(out, 'log', '')}"


def test_every_cheat_names_itself() -> None:
    """Each source says in a comment which cheat (or correct kernel) it is."""
    for c in CASES.values():
        assert "Cheat" in c.spec.source or "Correct" in c.spec.source or "Bug" in c.spec.source, c.name


def test_a_device_side_launch_is_refused_by_nvrtc_and_by_the_cubin_check():
    """The harness compiles whole programs: NVRTC refuses ``<<<...>>>`` in a kernel outright. Were a
    module to carry a device-side launch anyway (relocatable device code, which the harness never
    asks for), the cubin check refuses the device runtime's launch functions by name."""
    from kerngen.harness.compile.cubin import check_cubin, read_cubin
    from kerngen.harness.compile.sandbox import cubin_of, sandbox

    source = CASES["gelu_dynamic_parallelism"].spec.source
    whole = sandbox().compile(source, [f"--gpu-architecture={ARCH}"], ARCH)
    assert not whole.ok and "device-side kernel launch" in whole.log, whole.log
    rdc = sandbox().compile(source, [f"--gpu-architecture={ARCH}", "--relocatable-device-code=true"], ARCH)
    assert rdc.ok, rdc.log
    cubin = cubin_of(rdc)
    assert any("CDP" in f for f in read_cubin(cubin).undefined_functions)
    with pytest.raises(CompileError, match=r"^forbidden: dynamic parallelism \('__cudaCDP2\w+'\): kernels may not "
                                           r"launch kernels"):
        check_cubin(cubin, ["gelu"], source=source)
