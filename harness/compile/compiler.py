"""The compile boundary: CUDA-C source -> cubin with NVRTC, checked, cached, in parallel.

:func:`compile_job` is the one function that turns source into a module. It raises
:class:`~kerngen.errors.CompileError` (one-line message, the FULL NVRTC log in ``.log``)
for a source the policy refuses (message ``source refused: ...``, see :mod:`.source_policy`), a
source that redefines a name the job passes with ``-D`` (message ``tunable NAME is redefined ...``,
see :mod:`.source_checks`; checked before the cache is asked, so no cached success can hide it), a
compile error, a compile that timed out or died in its sandbox, a forbidden module (message
``forbidden: ...``, see :mod:`.cubin`) or a kernel of the launch plan that the module lacks
(message ``kernel 'NAME' not found in the module: ...`` with the source's ``__global__`` names).
Everything else here prepares jobs (:func:`build_options`, :func:`job_for`) or runs many of them
(:func:`compile_many`).

NVRTC never runs in this process: every compile goes to a confined worker (:mod:`.sandbox`), and
its log is redacted (:mod:`.redact`) before it is cached, raised or returned.

NVRTC (``cuda.bindings.nvrtc``, 13.0) needs no GPU: cubin for ``sm_90`` compiles anywhere.
A spec with ``arch_specific`` is compiled for the arch-specific target of the device instead
(:func:`target_arch`: ``sm_90`` -> ``sm_90a``, from sm_90 on), which is then the job's arch, its
option and part of its cache key.
Options of every job: ``--gpu-architecture=sm_XX --std=c++17 -lineinfo --ptxas-options=-v``,
``-DNAME=value`` for each tunable of the configuration and each resolved define (sorted by name),
and ``-use_fast_math`` iff the spec asks for it. The prelude (``INFINITY``, ``NAN`` ...) is added at
compile time, and every header (``cuda_bf16.h`` ...) is handed to NVRTC in memory, never as an
include directory (see :mod:`.headers`): the options stay the same on every machine.
"""

from __future__ import annotations

import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

from kerngen.errors import CompileError

from kerngen.harness.compile import headers, sandbox, source_checks, source_policy
from kerngen.harness.compile.cache import CompileCache
from kerngen.harness.compile.cubin import Cubin, check_cubin
from kerngen.harness.compile.nvrtc_info import nvrtc_version
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.compile.ptxas import parse_ptxas
from kerngen.redact import redact
from kerngen.harness.results import CompileInfo
from kerngen.harness.spec.spec import KernelSpec

BASE_OPTIONS = ("--std=c++17", "-lineinfo", "--ptxas-options=-v")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = re.compile(r"^(__|_[A-Z])")
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


class CompiledKernel(BaseModel):
    cubin: bytes
    info: CompileInfo


class CompileJob(BaseModel):
    source: str
    options: list[str]
    arch: str
    kernels: list[str] = []  # entry functions that must exist in the module
    # the -D names that are tunables (the others are the spec's defines): only for messages, so
    # not part of the cache key (which covers the options, and so every -D name and value)
    tunables: list[str] = []


class _UseDefaultCache:
    """Sentinel: ``compile_job(job)`` uses ``CompileCache()``; ``cache=None`` disables caching."""

    def __repr__(self) -> str:
        return "DEFAULT_CACHE"


DEFAULT_CACHE: Any = _UseDefaultCache()


def _resolve_cache(cache: Any) -> CompileCache | None:
    return CompileCache() if isinstance(cache, _UseDefaultCache) else cache


# ----- jobs -----------------------------------------------------------------------------------
def _literal(value: int | float | bool) -> str:
    """A C literal for a define's value: ints as they are, floats as double literals."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise CompileError(f"define value {value:.3g} does not fit 64 bits" if abs(value) < 10**300
                               else "define value does not fit 64 bits")
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "(NAN)"
    if math.isinf(v):
        return "(INFINITY)" if v > 0 else "(-INFINITY)"
    text = repr(v)
    return f"({text})" if text.startswith("-") else text


def target_arch(spec: KernelSpec, arch: str) -> str:
    """The NVRTC target of ``spec`` on a device of ``arch``: ``arch`` itself, or with
    ``spec.arch_specific`` its arch-specific variant (``sm_90`` -> ``sm_90a``; sm_90 and later
    have one). An arch already ending in ``a`` or ``f`` stays; below sm_90 ``arch`` stays too (a
    kernel that needs sm_90a features then fails to compile there, a compile error like any other)."""
    if not getattr(spec, "arch_specific", False):  # a spec-like object without the field: as before it existed
        return arch
    m = _ARCH.match(arch)
    if m is None or m.group(2) or int(m.group(1)) < 90:
        return arch
    return f"{arch}a"


def build_options(spec: KernelSpec, plan: ResolvedPlan, arch: str) -> list[str]:
    """The job's options for a device of ``arch`` (the target is :func:`target_arch`'s)."""
    opts = [f"--gpu-architecture={target_arch(spec, arch)}", *BASE_OPTIONS]
    if spec.fast_math:
        opts.append("-use_fast_math")
    for name, value in sorted({**plan.config, **plan.defines}.items()):
        if not _IDENT.match(name):
            raise CompileError(f"define name {name[:60]!r} is not a C identifier")
        if _RESERVED.match(name):
            raise CompileError(f"define name {name!r} is reserved (names beginning with __ or _X belong to the "
                               "CUDA headers)")
        opts.append(f"-D{name}={_literal(value)}")
    return opts


def job_for(spec: KernelSpec, plan: ResolvedPlan, arch: str) -> CompileJob:
    """The compile job of ``spec`` with ``plan`` for a device of ``arch``; its arch is
    :func:`target_arch`'s (``sm_90a`` for an ``arch_specific`` spec on ``sm_90``)."""
    kernels = list(dict.fromkeys(launch.kernel for launch in plan.launches))
    return CompileJob(source=spec.source, options=build_options(spec, plan, arch), arch=target_arch(spec, arch),
                      kernels=kernels, tunables=sorted(plan.config))


def _macro_names(options: list[str]) -> frozenset[str]:
    """The names the options define (``-DNAME=value`` / ``-DNAME``)."""
    return frozenset(o[2:].split("=", 1)[0] for o in options if o.startswith("-D") and len(o) > 2)


def check_job_source(job: CompileJob) -> None:
    """The checks of the source against the job that NVRTC would not fail on: a tunable or define
    redefined or undefined in the source (:mod:`.source_checks`). Raises :class:`CompileError`."""
    source_checks.check_macros(job.source, _macro_names(job.options), frozenset(job.tunables))


def _check_kernels(cubin: Cubin, job: CompileJob, log: str) -> None:
    """Every kernel the plan launches is an entry of the module, else a :class:`CompileError`
    whose message says what the source declares instead (a typo, or a missing ``extern "C"``)."""
    missing = [k for k in job.kernels if k not in cubin.entries]
    if not missing:
        return
    name = missing[0]
    declared = source_checks.global_functions(job.source)
    mangled = [e for e in cubin.entries if f"{len(name)}{name}" in e and e.startswith("_Z")]
    if name in declared:
        why = (f"the source declares __global__ {name} without extern \"C\", so the module has it as "
               f"{mangled[0] if mangled else 'a C++ mangled name'}; declare it extern \"C\"")
    else:
        shown = ", ".join(declared[:8]) + (f" (+{len(declared) - 8} more)" if len(declared) > 8 else "")
        why = (f"the source's __global__ functions are {shown} (a typo in the launch plan?)" if declared
               else "the source declares no __global__ function")
    more = f" (+{len(missing) - 1} more missing)" if len(missing) > 1 else ""
    found = ", ".join(cubin.entries) or "none"
    raise CompileError(
        f"kernel '{name}' not found in the module: {why}{more}",
        f"kernels named by the launch plan but not in the module: {', '.join(missing)}\n"
        f"entry functions found: {found}\n__global__ functions in the source: {', '.join(declared) or 'none'}"
        f"\n\n{log}".rstrip() + "\n",
    )


def _options_for(job: CompileJob) -> list[str]:
    """The job's options with its arch made the one target, plus the prelude. No include
    directory: every header is handed to NVRTC in memory (:mod:`.sandbox`)."""
    opts = [o for o in job.options if not o.startswith(("--gpu-architecture", "-arch", "-I", "--include-path"))]
    return [f"--gpu-architecture={job.arch}", *opts, f"--pre-include={headers.PRELUDE_NAME}"]


# ----- the boundary ---------------------------------------------------------------------------
def first_error(log: str) -> str:
    """The one line of an NVRTC log a human reads first (plus how many more errors there are)."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    errors = [l for l in lines if re.search(r"\b(error|catastrophic error)\b\s*:", l)]
    line = errors[0] if errors else (lines[0] if lines else "NVRTC failed without a log")
    m = re.search(r"^(\d+) (?:catastrophic )?errors? detected", log, re.M)
    total = int(m.group(1)) if m else len(errors)
    if total > 1:
        line += f" (+{total - 1} more error{'s' if total > 2 else ''})"
    return line


# NVRTC statuses that are a property of the source and options: such a failure may be cached
_DETERMINISTIC = {"NVRTC_ERROR_COMPILATION", "NVRTC_ERROR_INVALID_OPTION"}


def _run_nvrtc(job: CompileJob, timeout_s: float | None = None) -> tuple[bytes, str]:
    """Compile in the sandbox (:mod:`.sandbox`); ``CompileError`` on failure. A failure that
    NVRTC itself reports for the source (compilation error, bad option) carries
    ``deterministic = True``: it may be cached. The log is redacted and clipped before it
    leaves this function, whatever it holds."""
    source_policy.check_source(job.source)  # raises a deterministic refusal, see below
    try:
        reply = sandbox.sandbox().compile(job.source, _options_for(job), job.arch, timeout=timeout_s)
    except sandbox.SandboxFailure as exc:
        raise sandbox.SandboxFailure(redact(str(exc)), redact(exc.log)) from None
    log = sandbox.clip_log(redact(reply.log))
    if not reply.ok:
        if reply.status == "NVRTC_ERROR_COMPILATION" and not log.strip():
            exc = CompileError(f"NVRTC failed without a log (past the compile memory limit of {sandbox.memory_mb()} MB?)",
                               "")
        elif reply.status == "NVRTC_ERROR_COMPILATION":
            exc = CompileError(redact(first_error(log)), log)
        elif reply.status == "NVRTC_ERROR_INVALID_OPTION":
            exc = CompileError(f"NVRTC: {reply.status} in: {' '.join(job.options)}", log or reply.status)
        elif reply.status == "NO_CUBIN":
            exc = CompileError(f"NVRTC produced no cubin; is '{job.arch}' a real sm_ arch?", log)
        else:
            exc = CompileError(f"NVRTC: {reply.status[:80]}", log or reply.status[:80])
        exc.deterministic = reply.status in _DETERMINISTIC  # type: ignore[attr-defined]
        raise exc
    return sandbox.cubin_of(reply), log


def _put(cache: CompileCache | None, fn: str, *args: Any) -> None:
    if cache is None:
        return
    try:
        getattr(cache, fn)(*args)
    except OSError:  # a read-only or full disk must not fail the compile
        pass


def compile_job(
    job: CompileJob, cache: CompileCache | None = DEFAULT_CACHE, *, timeout_s: float | None = None
) -> CompiledKernel:
    """Source -> checked cubin, served from ``cache`` when it holds the key. Raises
    :class:`CompileError` (cached failures re-raise with their stored log)."""
    # before the cache: a source that compiled (with a warning) before this check existed has a
    # cached success; and the scan is cheap (memoised per source), so nothing of it is cached
    check_job_source(job)
    cache = _resolve_cache(cache)
    key = CompileCache.key_for(job)
    if cache is not None:
        entry = cache.get(key)
        if entry is not None:
            if not entry.ok:
                raise CompileError(entry.message, entry.log)
            assert entry.info is not None
            _check_kernels(check_cubin(entry.cubin, [], entry.info.log, job.source), job, entry.info.log)
            info = entry.info.model_copy(update={"cached": True, "seconds": 0.0})
            return CompiledKernel(cubin=entry.cubin, info=info)
    start = time.perf_counter()
    try:
        cubin, log = _run_nvrtc(job, timeout_s)
    except CompileError as exc:
        if getattr(exc, "deterministic", False) or str(exc).startswith("source refused:"):
            _put(cache, "put_failure", key, str(exc), exc.log)
        raise
    seconds = time.perf_counter() - start
    try:
        module = check_cubin(cubin, [], log, job.source)  # forbidden globals / calls: a property of the key
    except CompileError as exc:
        _put(cache, "put_failure", key, str(exc), exc.log)
        raise
    info = CompileInfo(
        key=key,
        arch=job.arch,
        nvrtc_version=nvrtc_version(),
        options=list(job.options),
        seconds=seconds,
        cached=False,
        log=log,
        kernels=parse_ptxas(log),
    )
    _put(cache, "put", key, cubin, info)
    _check_kernels(module, job, log)  # a missing kernel depends on the job, not the key
    return CompiledKernel(cubin=cubin, info=info)


# ----- many at once ---------------------------------------------------------------------------
def _compile_safely(job: CompileJob, cache: Any, timeout_s: float | None) -> CompiledKernel | CompileError:
    try:
        return compile_job(job, cache, timeout_s=timeout_s)
    except CompileError as exc:
        return exc


def compile_many(
    jobs: list[CompileJob],
    workers: int | None = None,
    cache: CompileCache | None = DEFAULT_CACHE,
    timeout_s: float | None = None,
    deadline: float | None = None,
) -> list[CompiledKernel | CompileError | None]:
    """Compile ``jobs`` on all CPU cores (each in a sandboxed worker process, :mod:`.sandbox`);
    results in order, a failed job as its :class:`CompileError`. Cache hits are served without
    a worker, and a job identical to an earlier one in the batch is compiled once. A job still
    running after ``timeout_s`` (default ``KERNGEN_COMPILE_TIMEOUT_S``, 120 s) becomes a
    ``CompileError`` and its worker is killed. A job not started by ``deadline`` (a
    ``time.monotonic()``) is not compiled: its result is None (only with a deadline)."""
    cache = _resolve_cache(cache)
    results: list[CompiledKernel | CompileError | None] = [None] * len(jobs)
    pending: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, job in enumerate(jobs):
        pending.setdefault((CompileCache.key_for(job), tuple(job.kernels)), []).append(i)
    groups = list(pending.values())

    def one(group: list[int]) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            return  # results stay None: not compiled in time
        out = _compile_safely(jobs[group[0]], cache, timeout_s)
        for i in group:
            results[i] = out

    n = max(1, min(workers or sandbox.sandbox().max_workers, len(groups)))
    if n == 1:
        for g in groups:
            one(g)
    else:
        with ThreadPoolExecutor(n, thread_name_prefix="kerngen-compile") as pool:
            list(pool.map(one, groups))
    return results
