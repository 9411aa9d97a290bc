"""The compiled kernels' parameters, read from the cubin, checked against a launch plan's arguments.

The CUDA driver copies each kernel argument with the size the MODULE declares for its parameter,
from the pointer the launcher hands it. A plan that passes too few arguments makes the driver read
past the argument array; an ``int32`` given to a ``long long`` parameter makes it read 4 bytes of
whatever follows the value. Neither fails loudly on the GPU. So every launch is checked on the CPU,
right after the compile: the kernel exists, and its arguments match the parameters in number and,
one by one, in size.

Where the sizes come from: each kernel's ``.nv.info.<kernel>`` ELF section is a list of attribute
records (``EIATTR_*``), each ``format:u8 attribute:u8`` followed by

- ``EIFMT_NVAL`` (1), ``EIFMT_BVAL`` (2), ``EIFMT_HVAL`` (3): two more bytes (none, a byte, a u16);
- ``EIFMT_SVAL`` (4): ``size:u16`` then ``size`` bytes.

``EIATTR_KPARAM_INFO`` (0x17, an SVAL of 12 bytes) describes one parameter: ``index:u32``,
``ordinal:u16``, ``offset:u16`` (in the parameter bank) and a u32 whose bits 18..31 are the
parameter's size in bytes (bits 0..7 the pointee's log2 alignment, 8..11 the space, 12..16 the
constant bank). A kernel without parameters has a ``.nv.info.<kernel>`` section without any.

Sizes of the plan's arguments: a tensor is a device pointer (8 bytes), and so is a ``tensormap``
(a pointer to the ``CUtensorMap`` in device memory, never the 128-byte map by value); a scalar's
``kind`` is a dtype name (``int32`` 4, ``int64`` 8, ``float32`` 4, ``float64`` 8, ...).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kerngen.harness.compile.cubin import Cubin, read_cubin
from kerngen.errors import CompileError
from kerngen.harness.spec.plan import ResolvedLaunch, ResolvedPlan

INFO_PREFIX = ".nv.info."
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19

POINTER_BYTES = 8
ARG_BYTES: dict[str, int] = {
    "tensor": POINTER_BYTES,
    "tensormap": POINTER_BYTES,  # a pointer to the CUtensorMap the harness built in device memory
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8,
}  # fmt: skip
_HINT = {
    8: 'pass an 8-byte argument: kind "int64" for long long / size_t, a tensor for a pointer',
    4: 'pass a 4-byte argument: kind "int32" for int, "float32" for float',
}


@dataclass(frozen=True)
class KernelParam:
    ordinal: int
    offset: int
    size: int


def _records(body: bytes):
    """(attribute, value bytes) of each record of a ``.nv.info`` section; ValueError if malformed."""
    pos = 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated attribute record")
        fmt, attr = body[pos], body[pos + 1]
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", body, pos + 2)
            if pos + 4 + size > len(body):
                raise ValueError("attribute value extends past its section")
            yield attr, body[pos + 4 : pos + 4 + size]
            pos += 4 + size
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            yield attr, body[pos + 2 : pos + 4]
            pos += 4
        else:
            raise ValueError(f"unknown attribute format {fmt}")


def kernel_params(data: bytes, cubin: Cubin | None = None) -> dict[str, list[KernelParam]]:
    """Kernel name -> its parameters in ordinal order, for every kernel whose ``.nv.info.<name>``
    section the module has. ``ValueError`` for a malformed section or a gap in the ordinals."""
    cubin = cubin or read_cubin(data)
    out: dict[str, list[KernelParam]] = {}
    for sec in cubin.sections:
        if not sec.name.startswith(INFO_PREFIX):
            continue
        name = sec.name[len(INFO_PREFIX) :]
        if sec.offset + sec.size > len(data):
            raise ValueError(f"section {sec.name} extends past the end of the file")
        params: dict[int, KernelParam] = {}
        for attr, value in _records(data[sec.offset : sec.offset + sec.size]):
            if attr != EIATTR_KPARAM_INFO:
                continue
            if len(value) < 12:
                raise ValueError(f"short EIATTR_KPARAM_INFO record in {sec.name}")
            _index, ordinal, offset, packed = struct.unpack_from("<IHHI", value, 0)
            params[ordinal] = KernelParam(ordinal=ordinal, offset=offset, size=(packed >> 18) & 0x3FFF)
        if sorted(params) != list(range(len(params))):
            raise ValueError(f"parameter ordinals of {name} are not 0..{len(params) - 1}: {sorted(params)}")
        out[name] = [params[i] for i in range(len(params))]
    return out


def arg_bytes(kind: str) -> int | None:
    """Bytes an argument of this kind occupies (None: a kind this module does not know)."""
    return ARG_BYTES.get(kind)


TENSORMAP_BYTES = 128  # sizeof(CUtensorMap): what a __grid_constant__ parameter by value takes


def _describe(arg) -> str:
    if arg.kind in ("tensor", "tensormap"):
        what = f"{'tensor' if arg.kind == 'tensor' else 'tensormap of'} '{arg.name}'"
    else:
        what = f"{arg.kind} {arg.value!r}"
    size = arg_bytes(arg.kind)
    return f"{what} ({size} bytes)" if size is not None else what


def launch_problems(launch: ResolvedLaunch, params: list[KernelParam], index: int) -> list[str]:
    """One line per mismatch between a launch's arguments and its kernel's parameters."""
    out: list[str] = []
    where = f"step {index}: kernel '{launch.kernel}'"
    n_args, n_params = len(launch.args), len(params)
    for i in range(max(n_args, n_params)):
        if i >= n_args:
            p = params[i]
            out.append(
                f"{where} argument {i} is missing (0 bytes given): the kernel takes {n_params} parameters, "
                f"parameter {i} has {p.size} bytes, the launch passes {n_args} arguments"
            )
            continue
        arg = launch.args[i]
        if i >= n_params:
            out.append(
                f"{where} argument {i} is extra: {_describe(arg)} given, but the kernel takes only {n_params} "
                f"parameters (0 bytes for argument {i}); the launch passes {n_args} arguments"
            )
            continue
        size, want = arg_bytes(arg.kind), params[i].size
        if size is None or size == want:
            continue
        hint = _HINT.get(want) or (f"pass a {want}-byte argument" if want in (1, 2) else
                                   "a by-value struct or array cannot be passed by a launch plan")
        if arg.kind == "tensormap" and want == TENSORMAP_BYTES:
            hint = ("a tensormap argument is a pointer to the CUtensorMap in device memory: declare the parameter "
                    "const void* (or const CUtensorMap*), not a CUtensorMap by value")
        out.append(f"{where} argument {i} has the wrong size: {_describe(arg)} given for parameter {i} of "
                   f"{want} bytes; {hint}")
    return out


def plan_problems(data: bytes, plan: ResolvedPlan, cubin: Cubin | None = None) -> list[str]:
    """Every mismatch of the plan's launches with the module: a kernel the module lacks, an
    argument missing, extra or of the wrong size. A module whose parameter records cannot be read
    is not judged here (its kernel names still are)."""
    cubin = cubin or read_cubin(data)
    entries = set(cubin.entries)
    try:
        params = kernel_params(data, cubin)
    except (ValueError, struct.error):
        params = {}
    out: list[str] = []
    for index, step in enumerate(plan.steps):
        if not isinstance(step, ResolvedLaunch):
            continue
        if step.kernel not in entries:
            found = ", ".join(sorted(entries)) or "none"
            out.append(f"step {index}: kernel '{step.kernel}' not found in the module (kernels: {found}); "
                       'extern "C" missing?')
            continue
        if step.kernel in params:
            out.extend(launch_problems(step, params[step.kernel], index))
    return out


def check_launch_args(data: bytes, plan: ResolvedPlan, log: str = "") -> None:
    """Raise :class:`CompileError` (a compile-stage failure) when a launch of ``plan`` does not
    match the compiled module (see :func:`plan_problems`); the message is the first problem, the
    log lists them all followed by ``log``."""
    try:
        cubin = read_cubin(data)
    except (ValueError, struct.error) as exc:
        raise CompileError(f"NVRTC returned an unreadable cubin: {exc}", log) from None
    problems = plan_problems(data, plan, cubin)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        detail = "\n".join(f"launch arguments: {p}" for p in problems)
        raise CompileError(f"launch arguments: {problems[0]}{more}", f"{detail}\n\n{log}".rstrip() + "\n")


def params_table(data: bytes) -> dict[str, list[int]]:
    """Kernel name -> parameter sizes in bytes (what ``kerngen check`` prints); {} if unreadable."""
    try:
        return {name: [p.size for p in ps] for name, ps in kernel_params(data).items()}
    except (ValueError, struct.error):
        return {}


__all__ = ["ARG_BYTES", "KernelParam", "arg_bytes", "check_launch_args", "kernel_params", "launch_problems",
           "params_table", "plan_problems"]
