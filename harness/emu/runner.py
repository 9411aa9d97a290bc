"""Run a kerngen kernel spec on the CPU: g++ compiles its CUDA-C with a shim (``cuda_emu.h``), and a
child process runs every step of the resolved plan, one fiber per CUDA thread. See README.md.

The kernel's source becomes host C++: both the compile and the run go through the jail
(:mod:`.jail`: an empty environment, Landlock, resource and time limits). Only specs a user names
(``kerngen check --emulate``) or the project's tests are emulated, never a model's answer.

The plan is resolved exactly as the harness resolves it (:func:`kerngen.harness.spec.plan.resolve`),
the ``-D`` options are the harness's own (:func:`kerngen.harness.compile.compiler.build_options`,
less the NVRTC-only ones), and the prelude is the harness's (:data:`kerngen.harness.compile.headers.PRELUDE`).
Executables are cached by a hash of everything that enters the compile.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import build_options
from kerngen.harness.compile.headers import PRELUDE
from kerngen.harness.spec.plan import ResolvedLaunch, ResolvedMemset, ResolvedPlan, resolve
from kerngen.harness.spec.spec import KernelSpec

from kerngen.harness.emu.jail import READ, READ_EXEC, READ_WRITE, Jail, JailTimeout, run_jailed
from kerngen.harness.emu.ptx_asm import not_emulated
from kerngen.harness.emu.source_rewrite import rewrite_source

if TYPE_CHECKING:
    import torch

EMU_DIR = Path(__file__).resolve().parent
CXX_FLAGS = (
    "-std=c++17", "-O1", "-w",
    "-fno-strict-aliasing",  # kernels reinterpret float arrays as float4 (fine on a GPU)
    "-fwrapv",  # integer overflow wraps as on a GPU instead of licensing the optimiser
)
KERNEL_FLAGS = (  # for the kernel's translation unit only
    "-fno-weak",  # inline functions' __shared__ statics stay in the kg_shared section (poisoned per block)
    "-ffunction-sections", "-Wl,--gc-sections",  # code that is never called may hold asm (not emulated: ptx_asm.py)
    "-fstack-clash-protection",  # a frame larger than a thread's stack touches its guard page, not a neighbour's
)
# one executable with no shared library: the jailed run may execute that file and nothing else
LINK_FLAGS = ("-static",)
# misaligned accesses (a GPU faults on them too) and indexes past a fixed-size array (shared or local);
# left out where the compiler has no libubsan
SANITIZER_FLAGS = ("-fsanitize=alignment,bounds", "-fno-sanitize-recover=alignment,bounds")
_CHILD_ENV = {"UBSAN_OPTIONS": "abort_on_error=1:print_stacktrace=0:print_summary=0"}
DEFAULT_TIMEOUT_S = 120.0
COMPILE_TIMEOUT_S = 180.0
COMPILE_MEMORY_MB = 4096
RUN_MEMORY_MB = 16384  # address space of a run: 128 KB of stack per thread, up to 65,536 threads at once
STACK_KB = 128  # per CUDA thread
SCRATCH_POISON = 0xCD  # every byte of a scratch buffer before the first step
OUTPUT_SHOWN = 20_000  # characters of a kernel's printf output passed on
_NVRTC_ONLY = ("--gpu-architecture=", "--std=", "-lineinfo", "--ptxas-options=", "-use_fast_math")
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
                  "int32": 4, "int64": 8, "bool": 1}
_SOURCE_NAME = "kernel.cu"
_TABLE_NAME = "kerngen-emu-table"


class EmuError(RuntimeError):
    """The emulation failed: a compile error, an out-of-bounds access, a deadlock, a crash, a timeout."""


def compiler() -> str:
    return os.environ.get("KERNGEN_EMU_CXX", "g++")


def available() -> bool:
    """A C++17 compiler is on PATH."""
    return shutil.which(compiler()) is not None


def _compiler_path() -> str:
    """The compiler's absolute path (the jail execs it without a shell)."""
    found = shutil.which(compiler())
    if found is None:
        raise EmuError(f"no C++ compiler: {compiler()!r} is not on PATH")
    return found


def cache_dir() -> Path:
    default = Path(tempfile.gettempdir()) / f"kerngen-emu-{os.getuid()}"
    path = Path(os.environ.get("KERNGEN_EMU_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def emulate(
    spec: KernelSpec,
    tensors: Mapping[str, "torch.Tensor"],
    *,
    config: dict[str, int] | None = None,
    sizes: dict[str, int | float] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    seed: int | None = None,
) -> None:
    """Run every step of ``spec``'s plan on ``tensors`` (CPU, contiguous; outputs written in place).

    ``seed`` picks the (shuffled) order of blocks and warps; default ``$KERNGEN_EMU_SEED`` or 0.
    A plan the harness would refuse raises its :class:`~kerngen.errors.SpecError`; everything the
    emulation finds raises :class:`EmuError`."""
    facts = {name: TensorFacts(tuple(t.shape)) for name, t in tensors.items()}
    plan = resolve(spec, sizes=sizes or {}, tensors=facts, config=config)
    run_plan(spec, plan, tensors, timeout_s=timeout_s, seed=seed)


def run_plan(spec: KernelSpec, plan: ResolvedPlan, tensors: Mapping[str, "torch.Tensor"], *,
             timeout_s: float = DEFAULT_TIMEOUT_S, seed: int | None = None) -> None:
    """Run a resolved plan of ``spec`` on ``tensors`` (CPU, contiguous views; written in place).

    A view into a larger storage (the harness's guarded buffers) is emulated with its whole storage
    around it, so that a write just past its end lands in the storage (the harness's guards see it)
    rather than on the emulator's guard page. Scratch buffers of the plan not in ``tensors`` are
    the emulator's own (every byte 0xCD)."""
    exe = build(spec, plan)
    names = _bound_names(plan, tensors)
    for name in names:
        t = tensors[name]
        if t.device.type != "cpu" or not t.is_contiguous():
            raise EmuError(f"tensor {name!r} must be a contiguous CPU tensor")
    stores, where = _storages([tensors[n] for n in names])
    run_seed = int(os.environ.get("KERNGEN_EMU_SEED", "0")) if seed is None else seed
    with tempfile.TemporaryDirectory(dir=_scratch_root()) as tmp:
        job, data = Path(tmp) / "job.txt", Path(tmp) / "data.bin"
        offsets = _write_data(data, stores)
        job.write_text(_job_text(plan, names, stores, where, offsets, run_seed))
        jail = Jail(rules=[(str(exe), READ_EXEC), (str(job), READ), (str(data), READ_WRITE)],
                    memory_mb=RUN_MEMORY_MB, cpu_s=int(timeout_s) + 1, cwd=tmp)
        try:
            done = run_jailed([str(exe), str(job), str(data)], jail, timeout_s, env=_CHILD_ENV)
        except JailTimeout:
            raise EmuError(f"the emulation did not finish in {timeout_s:g} s (an endless loop, or a spin-wait on "
                           "another thread or block: only barriers switch threads, blocks run one at a time)") from None
        if done.stdout:
            sys.stdout.write(done.stdout.decode(errors="replace")[:OUTPUT_SHOWN])
        if done.returncode != 0:
            raise EmuError(_run_failure(done.returncode, done.stderr.decode(errors="replace")))
        _read_data(data, stores, offsets)


# ----- build ----------------------------------------------------------------------------------------
def build(spec: KernelSpec, plan: ResolvedPlan) -> Path:
    """The emulation executable for ``spec`` under ``plan``'s tunables and defines (cached)."""
    if not available():
        raise EmuError(f"no C++ compiler: {compiler()!r} is not on PATH")
    defines = [o for o in build_options(spec, plan, "sm_90") if not o.startswith(_NVRTC_ONLY)]
    kernels = list(dict.fromkeys(launch.kernel for launch in plan.launches))
    text = _translation_unit(spec.source, kernels, defines)
    key = hashlib.sha256()
    flags = [*CXX_FLAGS, *KERNEL_FLAGS, *_sanitizer_flags(), *LINK_FLAGS]
    for part in (_compiler_version(), " ".join(flags), PRELUDE, text, _headers_text()):
        key.update(part.encode() + b"\0")
    out = cache_dir() / key.hexdigest()[:24]
    exe, error = out / "emu", out / "error.txt"
    if exe.is_file():
        return exe
    if error.is_file():
        raise EmuError(error.read_text())
    out.mkdir(parents=True, exist_ok=True)
    prelude = out / "kerngen_prelude.h"
    _write_atomic(prelude, PRELUDE)
    unit = out / "unit.cpp"
    _write_atomic(unit, text)
    partial = out / f"emu.{os.getpid()}.tmp"
    driver = _driver_object()
    cxx = _compiler_path()
    cmd = [cxx, *flags, f"-I{EMU_DIR / 'include'}", f"-I{EMU_DIR}",
           "-include", str(EMU_DIR / "cuda_emu.h"), "-include", str(prelude),
           str(unit), str(driver), "-o", str(partial), "-lm"]
    # the toolchain (read, execute), the emulator's headers and driver (read), the build folder
    toolchain = sorted({"/usr", str(Path(cxx).resolve().parent.parent)})
    jail = Jail(rules=[*((d, READ_EXEC) for d in toolchain), (str(EMU_DIR), READ), (str(driver), READ),
                       (str(out), READ_WRITE)],
                memory_mb=COMPILE_MEMORY_MB, cpu_s=int(COMPILE_TIMEOUT_S), file_mb=512, cwd=str(out))
    try:
        done = run_jailed(cmd, jail, COMPILE_TIMEOUT_S, env={"TMPDIR": str(out)})
    except JailTimeout:
        raise EmuError(f"g++ did not finish in {COMPILE_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        message = compile_failure(done.stderr.decode(errors="replace"), kernels)
        if done.returncode == 1:  # the source's fault, not a killed compiler: the same next time
            _write_atomic(error, message)
        raise EmuError(message)
    os.replace(partial, exe)
    return exe


def _translation_unit(source: str, kernels: list[str], defines: list[str]) -> str:
    """The harness's ``-DNAME=value`` options become ``#define`` lines after the force-included shim,
    so that a tunable named like a C++ identifier (``U``, ``T``) cannot reach into the shim or the
    C++ headers; then the source (its own line numbers), then the kernel table (emu_abi.h)."""
    lines = [f"#define {name} {value}" for name, _, value in (d[2:].partition("=") for d in defines)]
    entries = "".join(f"KG_EMU_KERNEL({k}), " for k in kernels)
    return ("\n".join(lines) + f'\n#line 1 "{_SOURCE_NAME}"\n{rewrite_source(source)}\n#line 1 "{_TABLE_NAME}"\n'
            f'extern "C" const kg_emu::KernelEntry kg_emu_kernels[] = {{{entries}{{nullptr, nullptr, nullptr}}}};\n'
            f'extern "C" const int kg_emu_kernel_count = {len(kernels)};\n')


def _driver_object() -> Path:
    """emu_driver.cpp compiled once (main, buffers, launches): each kernel then compiles alone."""
    key = hashlib.sha256("\0".join((_compiler_version(), " ".join(CXX_FLAGS), _headers_text())).encode())
    obj = cache_dir() / f"driver-{key.hexdigest()[:24]}.o"
    if obj.is_file():
        return obj
    partial = obj.with_name(f"{obj.name}.{os.getpid()}.tmp")
    flags = list(CXX_FLAGS)
    cmd = [compiler(), *flags, f"-I{EMU_DIR / 'include'}", f"-I{EMU_DIR}", "-c", str(EMU_DIR / "emu_driver.cpp"),
           "-o", str(partial)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode != 0:
        raise EmuError(f"the emulator's driver does not compile: {compile_failure(done.stderr, [])}")
    os.replace(partial, obj)
    return obj


def compile_failure(log: str, kernels: list[str]) -> str:
    """One line for a failed compile: inline PTX that is not emulated reached, a kernel missing, or g++'s
    first error."""
    asm = not_emulated(log)
    if asm:
        fn = re.search(r"in function [`']([^']+)'", log)
        where = f" in {fn.group(1)}" if fn else ""
        return f"inline PTX asm '{asm[1]}' ({_SOURCE_NAME} line {asm[0]}{where}) is not emulated"
    for line in log.splitlines():
        if _TABLE_NAME in line and "error" in line:
            missing = [k for k in kernels if f"'{k}'" in line or f"‘{k}’" in line]
            name = missing[0] if missing else "?"
            return f"kernel {name!r} of the launch plan is not defined in the source"
    for line in log.splitlines():
        if re.search(r"\berror\b", line):
            return line.replace(str(EMU_DIR) + "/", "").strip()
    lines = [l for l in log.splitlines() if l.strip()]
    return lines[0].strip() if lines else "g++ failed without a message"


@functools.cache
def _sanitizer_flags() -> tuple[str, ...]:
    """SANITIZER_FLAGS if the compiler links a program with them (it has libubsan), else none."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cpp"
        probe.write_text("int main() { return 0; }\n")
        done = subprocess.run([compiler(), *SANITIZER_FLAGS, *LINK_FLAGS, str(probe), "-o", str(Path(tmp) / "probe")],
                              capture_output=True, timeout=COMPILE_TIMEOUT_S)
    return SANITIZER_FLAGS if done.returncode == 0 else ()


@functools.cache
def _compiler_version() -> str:
    done = subprocess.run([compiler(), "--version"], capture_output=True, text=True)
    return done.stdout.splitlines()[0] if done.stdout else compiler()


def _headers_text() -> str:
    """Every file of the shim and the driver (they enter every executable)."""
    files = sorted([*EMU_DIR.glob("*.h"), *EMU_DIR.glob("*.cpp"), *(EMU_DIR / "include").rglob("*.h")])
    return "\0".join(f"{p.relative_to(EMU_DIR)}\0{p.read_text()}" for p in files)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ----- the job: buffers, steps, data -------------------------------------------------------------
def _bound_names(plan: ResolvedPlan, tensors: Mapping[str, "torch.Tensor"]) -> list[str]:
    """The tensors the plan binds that the caller gives (a scratch buffer it does not give is the
    emulator's own), in order of first use."""
    scratch = {s.name for s in plan.scratch}
    names: list[str] = []
    for step in plan.steps:
        used = [step.tensor] if isinstance(step, ResolvedMemset) else [a.name for a in step.args if a.kind == "tensor"]
        names += [n for n in used if n is not None and (n not in scratch or n in tensors) and n not in names]
    return names


def _storages(views: list["torch.Tensor"]) -> tuple[list["torch.Tensor"], list[tuple[int, int, int]]]:
    """The distinct storages under ``views`` (as flat byte tensors) and, per view, (its storage's
    index, its byte offset in it, its bytes)."""
    import torch

    stores: list[torch.Tensor] = []
    seen: dict[int, int] = {}
    where = []
    for v in views:
        st = v.untyped_storage()
        key = st.data_ptr()
        if key not in seen:
            seen[key] = len(stores)
            stores.append(torch.empty(0, dtype=torch.uint8).set_(st))
        where.append((seen[key], v.storage_offset() * v.element_size(), v.numel() * v.element_size()))
    return stores, where


def _job_text(plan: ResolvedPlan, names: list[str], stores: list["torch.Tensor"], where: list[tuple[int, int, int]],
              offsets: list[int], seed: int) -> str:
    lines = [f"seed {seed}", f"stack_kb {STACK_KB}"]
    first = {}
    for name, (k, _, _) in zip(names, where):
        first.setdefault(k, name)
    for k, (store, offset) in enumerate(zip(stores, offsets)):
        lines.append(f"buffer {first[k]} {store.numel()} {offset} -1")
    index = {name: w for name, w in zip(names, where)}  # name -> (buffer, byte offset, bytes)
    count = len(stores)
    for s in plan.scratch:
        if s.name not in index:
            nbytes = s.size * _ELEMENT_BYTES[s.dtype]
            index[s.name] = (count, 0, nbytes)
            count += 1
            lines.append(f"buffer {s.name} {nbytes} 0 {SCRATCH_POISON}")
    for step in plan.steps:
        if isinstance(step, ResolvedMemset):
            buf, off, nbytes = index[str(step.tensor)]
            lines.append(f"memset {buf} {step.value} {off} {nbytes}")
        else:
            lines.append(_launch_line(step, index))
    return "\n".join(lines) + "\n"


def _launch_line(step: ResolvedLaunch, index: dict[str, tuple[int, int, int]]) -> str:
    if step.cluster > 1:
        raise EmuError(f"kernel {step.kernel}: thread-block clusters (cluster {step.cluster}) are not emulated")
    words = ["launch", step.kernel, *map(str, step.grid), *map(str, step.block), str(step.shared_mem),
             str(int(step.cooperative)), str(len(step.args))]
    for arg in step.args:
        if arg.kind == "tensor":
            buf, off, _ = index[str(arg.name)]
            words += ["t", f"{buf}:{off}"]
        elif arg.kind == "tensormap":
            raise EmuError(f"kernel {step.kernel}: tensormap arguments (TMA descriptors) are not emulated")
        elif arg.kind == "float32":
            words += ["f32", _float32_bits(float(arg.value or 0.0))]
        else:
            words += ["i32" if arg.kind == "int32" else "i64", str(int(arg.value or 0))]
    return " ".join(words)


def _float32_bits(value: float) -> str:
    return f"{struct.unpack('<I', struct.pack('<f', value))[0]:08x}"


def _write_data(path: Path, stores: list["torch.Tensor"]) -> list[int]:
    offsets, pos = [], 0
    with path.open("wb") as f:
        for t in stores:
            offsets.append(pos)
            raw = t.numpy().tobytes()
            f.write(raw)
            pos += len(raw)
    return offsets


def _read_data(path: Path, stores: list["torch.Tensor"], offsets: list[int]) -> None:
    import torch

    data = bytearray(path.read_bytes())
    for t, offset in zip(stores, offsets):
        if t.numel():
            t.copy_(torch.frombuffer(data, dtype=torch.uint8, count=t.numel(), offset=offset))


def _scratch_root() -> str | None:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _run_failure(code: int, stderr: str) -> str:
    found = [l.split("KG_EMU_ERROR: ", 1)[1] for l in stderr.splitlines() if "KG_EMU_ERROR: " in l]
    sanitizer = [l.split("runtime error: ", 1) for l in stderr.splitlines() if "runtime error: " in l]
    if sanitizer:  # then the abort it caused, reported with the kernel, block and thread
        where, what = sanitizer[0]
        context = found[0].split(": the kernel aborted")[0] if found else ""
        return f"{what} ({where.strip().rstrip(':')}; {context})" if context else f"{what} ({where.strip()})"
    if found:
        return found[0]
    tail = " ".join(stderr.strip().splitlines()[-3:])
    if code < 0:
        return f"the emulation died of signal {-code}" + (f": {tail}" if tail else "")
    return f"the emulation failed (exit {code})" + (f": {tail}" if tail else "")
