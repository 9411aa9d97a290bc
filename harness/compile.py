"""The compile boundary: CUDA-C source -> cubin with NVRTC, checked, cached, in parallel.

:func:`compile_job` is the one function that turns source into a module. It raises
:class:`~kerngen.harness.errors.CompileError` (one-line message, the FULL NVRTC log in ``.log``)
for a compile error, a forbidden module (message ``forbidden: ...``, see :mod:`.cubin`) or a kernel
of the launch plan that the module lacks. Everything else here prepares jobs
(:func:`build_options`, :func:`job_for`) or runs many of them (:func:`compile_many`).

NVRTC (``cuda.bindings.nvrtc``, 13.0) needs no GPU: cubin for ``sm_90`` compiles anywhere.
Options of every job: ``--gpu-architecture=sm_XX --std=c++17 -lineinfo --ptxas-options=-v``,
``-DNAME=value`` for each tunable of the configuration and each resolved define (sorted by name),
and ``-use_fast_math`` iff the spec asks for it. The include directories of the CUDA headers
(``cuda_bf16.h`` ...) and the prelude (``INFINITY``, ``NAN`` ...) are added at compile time, not
stored in the job's options (see :mod:`.headers`): the options stay the same on every machine.
"""

from __future__ import annotations

import atexit
import functools
import math
import multiprocessing as mp
import os
import re
import threading
import time
from typing import Any

from pydantic import BaseModel

from . import headers
from .compile_cache import CompileCache
from .cubin import check_cubin
from .errors import CompileError
from .plan import ResolvedPlan
from .ptxas import parse_ptxas
from .results import CompileInfo
from .spec import KernelSpec

PROGRAM_NAME = "kernel.cu"  # how the candidate's file is named in NVRTC's messages
FALLBACK_ARCH = "sm_90"
BASE_OPTIONS = ("--std=c++17", "-lineinfo", "--ptxas-options=-v")
DEFAULT_TIMEOUT_S = 180.0  # per job, in compile_many
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


class CompiledKernel(BaseModel):
    cubin: bytes
    info: CompileInfo


class CompileJob(BaseModel):
    source: str
    options: list[str]
    arch: str
    kernels: list[str] = []  # entry functions that must exist in the module


class _UseDefaultCache:
    """Sentinel: ``compile_job(job)`` uses ``CompileCache()``; ``cache=None`` disables caching."""

    def __repr__(self) -> str:
        return "DEFAULT_CACHE"


DEFAULT_CACHE: Any = _UseDefaultCache()


def _resolve_cache(cache: Any) -> CompileCache | None:
    return CompileCache() if isinstance(cache, _UseDefaultCache) else cache


# ----- NVRTC facts ----------------------------------------------------------------------------
def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


@functools.cache
def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can target (e.g. 75, 80, ..., 90, 100, 120)."""
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def _check(err: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")


def arch_for_capability(major: int, minor: int) -> str:
    """The NVRTC target for a device: its own ``sm_XY``, else the newest supported one of the
    same major version not above it (cubin runs on later minors of one major), else sm_90."""
    cc = major * 10 + minor
    archs = supported_archs()
    if cc in archs:
        return f"sm_{cc}"
    same = [a for a in archs if a // 10 == major and a <= cc]
    return f"sm_{max(same)}" if same else FALLBACK_ARCH


def default_arch(device: int = 0) -> str:
    """``$KERNGEN_ARCH``, else the arch of visible device ``device`` (through the CUDA driver
    API, no torch), else ``sm_90``."""
    env = os.environ.get("KERNGEN_ARCH", "").strip()
    if env:
        return env
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return FALLBACK_ARCH
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count <= device:
            return FALLBACK_ARCH
        err, dev = driver.cuDeviceGet(device)
        attr = driver.CUdevice_attribute
        err1, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        if err != driver.CUresult.CUDA_SUCCESS or err1 != err or err2 != err:
            return FALLBACK_ARCH
        return arch_for_capability(int(major), int(minor))
    except Exception:  # noqa: BLE001 - no driver library, no device: compile for the default
        return FALLBACK_ARCH


# ----- jobs -----------------------------------------------------------------------------------
def _literal(value: int | float | bool) -> str:
    """A C literal for a define's value: ints as they are, floats as double literals."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "(NAN)"
    if math.isinf(v):
        return "(INFINITY)" if v > 0 else "(-INFINITY)"
    text = repr(v)
    return f"({text})" if text.startswith("-") else text


def build_options(spec: KernelSpec, plan: ResolvedPlan, arch: str) -> list[str]:
    opts = [f"--gpu-architecture={arch}", *BASE_OPTIONS]
    if spec.fast_math:
        opts.append("-use_fast_math")
    for name, value in sorted({**plan.config, **plan.defines}.items()):
        if not _IDENT.match(name):
            raise CompileError(f"define name {name!r} is not a C identifier")
        opts.append(f"-D{name}={_literal(value)}")
    return opts


def job_for(spec: KernelSpec, plan: ResolvedPlan, arch: str) -> CompileJob:
    kernels = list(dict.fromkeys(launch.kernel for launch in plan.launches))
    return CompileJob(source=spec.source, options=build_options(spec, plan, arch), arch=arch, kernels=kernels)


def _options_for(job: CompileJob) -> list[str]:
    """The job's options with its arch made the one target, plus includes and the prelude."""
    opts = [o for o in job.options if not o.startswith(("--gpu-architecture", "-arch"))]
    return [
        f"--gpu-architecture={job.arch}",
        *opts,
        *headers.include_options(),
        f"--pre-include={headers.PRELUDE_NAME}",
    ]


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


def _run_nvrtc(job: CompileJob) -> tuple[bytes, str]:
    """Compile; ``CompileError`` on failure. A failure that NVRTC itself reports for the source
    (compilation error, bad option) carries ``deterministic = True``: it may be cached."""
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    names = list(headers.BUILTIN_HEADERS)
    bodies = [headers.BUILTIN_HEADERS[n].encode() for n in names]
    opts = [o.encode() for o in _options_for(job)]
    err, prog = nvrtc.nvrtcCreateProgram(
        job.source.encode(), PROGRAM_NAME.encode(), len(names), bodies, [n.encode() for n in names]
    )
    if err != ok:
        raise CompileError(f"nvrtcCreateProgram failed: {err.name}", "")
    try:
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = ""
        if err == ok and size > 1:
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0").decode("utf-8", "replace")
        if res != ok:
            if res == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
                exc = CompileError(first_error(log), log)
            else:
                what = res.name
                if res == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION:
                    what += " in: " + " ".join(job.options)
                exc = CompileError(f"NVRTC: {what}", log or what)
            exc.deterministic = res in (  # type: ignore[attr-defined]
                nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,
                nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION,
            )
            raise exc
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok or size == 0:
            raise CompileError(f"NVRTC produced no cubin ({err.name}); is '{job.arch}' a real sm_ arch?", log)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            raise CompileError(f"nvrtcGetCUBIN failed: {err.name}", log)
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _put(cache: CompileCache | None, fn: str, *args: Any) -> None:
    if cache is None:
        return
    try:
        getattr(cache, fn)(*args)
    except OSError:  # a read-only or full disk must not fail the compile
        pass


def compile_job(job: CompileJob, cache: CompileCache | None = DEFAULT_CACHE) -> CompiledKernel:
    """Source -> checked cubin, served from ``cache`` when it holds the key. Raises
    :class:`CompileError` (cached failures re-raise with their stored log)."""
    cache = _resolve_cache(cache)
    key = CompileCache.key_for(job)
    if cache is not None:
        entry = cache.get(key)
        if entry is not None:
            if not entry.ok:
                raise CompileError(entry.message, entry.log)
            assert entry.info is not None
            check_cubin(entry.cubin, job.kernels, entry.info.log, job.source)
            info = entry.info.model_copy(update={"cached": True, "seconds": 0.0})
            return CompiledKernel(cubin=entry.cubin, info=info)
    start = time.perf_counter()
    try:
        cubin, log = _run_nvrtc(job)
    except CompileError as exc:
        if getattr(exc, "deterministic", False):
            _put(cache, "put_failure", key, str(exc), exc.log)
        raise
    seconds = time.perf_counter() - start
    try:
        check_cubin(cubin, [], log, job.source)  # forbidden globals / calls: a property of the key
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
    check_cubin(cubin, job.kernels, log, job.source)  # a missing kernel depends on the job, not the key
    return CompiledKernel(cubin=cubin, info=info)


# ----- many at once ---------------------------------------------------------------------------
def _compile_safely(job: CompileJob, cache: Any) -> CompiledKernel | CompileError:
    try:
        return compile_job(job, cache)
    except CompileError as exc:
        return CompileError(str(exc), exc.log)  # a plain one: pickles with message and log
    except Exception as exc:  # noqa: BLE001 - one broken job must not take the batch down
        return CompileError(f"internal compile failure: {type(exc).__name__}: {exc}", repr(exc))


def _worker(job_data: dict, cache_root: str | None, use_cache: bool) -> CompiledKernel | CompileError:
    job = CompileJob.model_validate(job_data)
    cache = CompileCache(cache_root) if use_cache else None
    return _compile_safely(job, cache)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _context() -> mp.context.BaseContext:
    # the parent may own a CUDA context: never fork it
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


class _PersistentPool:
    """One process pool kept across :func:`compile_many` calls: starting fresh workers (a
    forkserver child importing this module and NVRTC) costs about as much as a compile, and the
    tuner compiles a batch every second. Killed on a timeout and at exit, rebuilt on demand."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def get(self, n: int) -> Any:
        """The pool, started with ``n`` workers if there is none. A live pool is never resized:
        another thread may have jobs in it (the tuner compiles ahead while the pool evaluates)."""
        with self._lock:
            if self._pool is None:
                self._pool = _context().Pool(n)
            return self._pool

    def kill(self, pool: Any) -> None:
        with self._lock:
            if pool is self._pool:
                self._close_locked()

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
        self._pool = None


_POOL = _PersistentPool()


def compile_many(
    jobs: list[CompileJob],
    workers: int | None = None,
    cache: CompileCache | None = DEFAULT_CACHE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[CompiledKernel | CompileError]:
    """Compile ``jobs`` on all CPU cores (a persistent forkserver/spawn process pool); results
    in order, a failed job as its :class:`CompileError`. Cache hits are served without a worker,
    and a job identical to an earlier one in the batch is compiled once. A job still running
    after its share of time (``timeout_s`` per job and worker) becomes a ``CompileError`` and the
    pool is killed (the next call starts a new one)."""
    cache = _resolve_cache(cache)
    results: list[CompiledKernel | CompileError | None] = [None] * len(jobs)
    pending: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, job in enumerate(jobs):
        key = CompileCache.key_for(job)
        if cache is not None and cache.get(key) is not None:
            results[i] = _compile_safely(job, cache)
        else:
            pending.setdefault((key, tuple(job.kernels)), []).append(i)
    groups = list(pending.values())
    n = min(workers or _cpu_count(), len(groups))
    if n <= 1:
        for group in groups:
            out = _compile_safely(jobs[group[0]], cache)
            for i in group:
                results[i] = out
        return results  # type: ignore[return-value]
    root = str(cache.root) if cache is not None else None
    deadline = time.monotonic() + timeout_s * math.ceil(len(groups) / n) + 30.0
    pool = _POOL.get(workers or _cpu_count())
    handles = [pool.apply_async(_worker, (jobs[g[0]].model_dump(), root, cache is not None)) for g in groups]
    for group, handle in zip(groups, handles):
        try:
            out = handle.get(timeout=max(0.0, deadline - time.monotonic()))
        except mp.TimeoutError:
            _POOL.kill(pool)  # the hung NVRTC call dies with its worker
            out = CompileError(f"compile timed out (over {timeout_s:.0f} s)", "")
        except Exception as exc:  # noqa: BLE001 - a worker that died
            out = CompileError(f"compile worker failed: {type(exc).__name__}: {exc}", repr(exc))
        for i in group:
            results[i] = out
    return results  # type: ignore[return-value]
