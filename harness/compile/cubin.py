"""A small reader of cubin (64-bit little-endian ELF) and the checks the harness makes on it.

Checks (each failure is a :class:`CompileError` whose message starts with ``forbidden:`` or names
the missing kernel):

- **No writable device globals** (cheat #4: caching results across calls in static
  ``__device__`` memory). A ``__device__`` variable, ``static`` or not, lands in ``.nv.global``
  (uninitialized) or ``.nv.global.init`` (initialized; also ``const __device__`` tables and
  function-local ``static const`` arrays, which the ELF cannot tell from writable ones: use
  ``__constant__`` for read-only tables). Exempt: the CUDA math library's own tables
  (``__cudart_i2opi_f`` & co., pulled in by ``sinf``/``cos``/...) up to their known sizes, and
  string literals (``$str``, from ``printf``), and -- only where the candidate's source cannot
  have placed a variable there (:func:`library_exemption_ok`) -- the ``constexpr`` static members
  that CCCL and cooperative groups headers emit as device globals (``cuda::std::integral_constant
  <bool,false>::value`` ...: over a thousand symbols for ``#include <cooperative_groups.h>``),
  recognized by their namespaces. ``__constant__`` (``.nv.constant*``) and ``__shared__`` are fine.
- **No device-side heap or kernel launches**: undefined functions other than ``vprintf``
  (``printf``) and ``__assertfail`` (``assert``) are rejected: ``malloc``/``free``, the dynamic
  parallelism runtime (``__cudaCDP2LaunchDeviceV2``, ``cudaLaunchDevice`` ...), anything else.
- **Every kernel the launch plan names exists** as an entry function of the module.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from kerngen.errors import CompileError

ELF_MAGIC = b"\x7fELF"
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
SHT_SYMTAB = 2
SHT_NOBITS = 8
STT_OBJECT, STT_FUNC = 1, 2
SHN_UNDEF = 0
STO_CUDA_ENTRY = 0x10  # st_other bit of a kernel (entry function) symbol

# the CUDA math library's constant tables, emitted as initialized device globals (name -> max bytes)
LIBRARY_TABLES = {"__cudart_i2opi_f": 24, "__cudart_i2opi_d": 144, "__cudart_sin_cos_coeffs": 128}
ALLOWED_EXTERNAL = {"vprintf", "__assertfail"}
# namespaces of header libraries whose constexpr members become device globals
LIBRARY_NAMESPACES = ("cuda", "cooperative_groups", "cub", "thrust", "nv")
_LIB_NAMESPACES_MANGLED = ("cuda", "cooperative_groups", "cub", "thrust", "nv")


def _in_library_namespace(name: str) -> bool:
    """Whether a mangled name lies in a header library's namespace: ``_ZN`` [``K``], an optional
    ``<n>_INTERNAL_...`` component (the translation unit's anonymous prefix, which NVRTC spells
    with the first kernel's name), then one of :data:`_LIB_NAMESPACES_MANGLED`. Read by the length
    prefixes of the Itanium mangling, not by pattern, so no kernel name can confuse it."""
    m = re.match(r"^_ZNK?", name)
    if not m:
        return False
    pos = m.end()
    parts: list[str] = []
    for _ in range(2):
        num = re.match(r"\d+", name[pos:])
        if not num:
            return False
        n = int(num.group())
        start = pos + num.end()
        parts.append(name[start : start + n])
        pos = start + n
    first = parts[0][1:] if parts[0].startswith("_INTERNAL_") else parts[0]
    ns = parts[1] if parts[0].startswith("_INTERNAL_") else first
    return ns in _LIB_NAMESPACES_MANGLED


_DECL = re.compile(r"\b(?:namespace|struct|class|union|enum)\s+(?:class\s+|struct\s+)?([A-Za-z_]\w*)")
_RISKY_IN_DEFINE = {"namespace", "struct", "class", "union", "typedef", "using", "asm", "__asm__", "__asm", "std"}
_HEAP = {"malloc", "free", "__nv_aligned_device_malloc", "aligned_alloc"}


@dataclass
class Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int


@dataclass
class Symbol:
    name: str
    type: int
    bind: int
    other: int
    shndx: int
    value: int
    size: int
    section: str  # name of the section it is defined in ("" when undefined)


@dataclass
class Cubin:
    sections: list[Section] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)

    @property
    def entries(self) -> list[str]:
        """Kernel (entry function) names, in symbol-table order."""
        names = [
            s.name
            for s in self.symbols
            if s.type == STT_FUNC and s.shndx != SHN_UNDEF and s.other & STO_CUDA_ENTRY
        ]
        for sec in self.sections:  # every kernel has its own parameter bank
            if sec.name.startswith(".nv.constant0."):
                name = sec.name[len(".nv.constant0.") :]
                if name not in names:
                    names.append(name)
        return names

    @property
    def undefined_functions(self) -> list[str]:
        return [s.name for s in self.symbols if s.shndx == SHN_UNDEF and s.type == STT_FUNC and s.name]


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")


def read_cubin(data: bytes) -> Cubin:
    """Section headers and symbols of a cubin; ``ValueError`` when it is no 64-bit LE ELF."""
    if len(data) < _EHDR.size or data[:4] != ELF_MAGIC:
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (_, _, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx) = _EHDR.unpack_from(data, 0)
    if shentsize != _SHDR.size or shoff + shnum * shentsize > len(data) or shstrndx >= max(shnum, 1):
        raise ValueError("corrupt ELF section header table")
    raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]

    def body(h: tuple) -> bytes:
        off, size = h[4], h[5]
        if h[1] == SHT_NOBITS:
            return b""
        if off + size > len(data):
            raise ValueError("section extends past the end of the file")
        return data[off : off + size]

    shstr = body(raw[shstrndx])
    out = Cubin(sections=[Section(_cstr(shstr, h[0]), h[1], h[2], h[4], h[5]) for h in raw])
    for h in raw:
        if h[1] != SHT_SYMTAB:
            continue
        table, strtab = body(h), body(raw[h[6]]) if h[6] < len(raw) else b""
        for off in range(0, len(table) - _SYM.size + 1, _SYM.size):
            st_name, info, other, shndx, value, size = _SYM.unpack_from(table, off)
            section = out.sections[shndx].name if 0 < shndx < len(out.sections) else ""
            out.symbols.append(Symbol(_cstr(strtab, st_name), info & 0xF, info >> 4, other, shndx, value, size, section))
    return out


def _strip_comments(source: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)


def library_exemption_ok(source: str) -> bool:
    """Whether device globals in the header libraries' namespaces may be trusted to come from the
    headers: the source declares no namespace, class, union or enum named like one of them
    (``namespace cuda {``), builds no such name or keyword with a macro, pastes no tokens (``##``)
    and spells no mangled name (an ``asm`` label)."""
    if "##" in source or "_ZN" in source:
        return False
    code = _strip_comments(source)
    if any(m.group(1) in LIBRARY_NAMESPACES for m in _DECL.finditer(code)):
        return False
    for line in code.splitlines():
        if re.match(r"\s*#\s*define\b", line):
            words = set(re.findall(r"[A-Za-z_]\w*", line))
            if words & (_RISKY_IN_DEFINE | set(LIBRARY_NAMESPACES)):
                return False
    return True


def math_tables_ok(source: str) -> bool:
    """The math library's tables come from NVRTC's built-in headers, never from the candidate:
    a source that spells ``__cudart`` (or pastes tokens, or spells mangled names) could declare
    a variable of the same name and size to smuggle state across calls."""
    return "__cudart" not in source and "##" not in source and "_ZN" not in source


def forbidden(cubin: Cubin, source: str | None = None) -> list[str]:
    """One line per violation; empty when the module is clean. ``source`` (the candidate's)
    enables the exemption of the header libraries' constexpr globals (see module doc)."""
    library_ok = source is not None and library_exemption_ok(source)
    tables_ok = source is not None and math_tables_ok(source)
    # string literals are writable in practice: exempt them only where printf can be their use
    strings_ok = "vprintf" in cubin.undefined_functions
    problems: list[str] = []
    library_hits: list[str] = []
    explained: dict[str, int] = {}
    for s in cubin.symbols:
        if s.shndx == SHN_UNDEF or not s.section.startswith(".nv.global") or s.type == 3:  # 3: STT_SECTION
            continue
        explained[s.section] = explained.get(s.section, 0) + s.size
        if s.section == ".nv.global.init" and (
            (strings_ok and s.name.startswith("$str"))
            or (tables_ok and s.name in LIBRARY_TABLES and s.size <= LIBRARY_TABLES[s.name])
        ):
            continue
        if _in_library_namespace(s.name):
            if not library_ok:
                library_hits.append(s.name)
            continue
        problems.append(
            f"device global variable '{s.name}' ({s.size} bytes, {s.section}): writable device memory "
            "survives across calls; use __constant__ for read-only tables and a scratch buffer of "
            "the launch plan for workspace"
        )
    if library_hits:
        problems.append(
            f"{len(library_hits)} device globals in a header library's namespace (e.g. '{library_hits[0]}') "
            "while the source itself declares into such a namespace, defines keywords in a macro, pastes "
            "tokens or spells mangled names: they cannot be told from the candidate's own variables"
        )
    for sec in cubin.sections:
        if sec.name.startswith(".nv.global") and sec.size > 0 and sec.name not in explained:
            problems.append(f"section {sec.name} ({sec.size} bytes) holds writable device globals")
    for name in cubin.undefined_functions:
        if name in ALLOWED_EXTERNAL:
            continue
        if name in _HEAP:
            problems.append(f"device-side heap allocation ('{name}'): use a scratch buffer of the launch plan")
        elif "CDP" in name or name.startswith(("cudaLaunch", "cudaGetParameterBuffer", "cudaDevice")):
            problems.append(f"dynamic parallelism ('{name}'): kernels may not launch kernels")
        else:
            problems.append(f"call of an external device function '{name}'")
    return problems


def check_cubin(data: bytes, kernels: list[str], log: str = "", source: str | None = None) -> Cubin:
    """Raise :class:`CompileError` for a malformed or forbidden module or a missing kernel."""
    try:
        cubin = read_cubin(data)
    except (ValueError, struct.error) as exc:
        raise CompileError(f"NVRTC returned an unreadable cubin: {exc}", log) from None
    problems = forbidden(cubin, source)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        detail = "\n".join(f"forbidden: {p}" for p in problems)
        raise CompileError(f"forbidden: {problems[0]}{more}", f"{detail}\n\n{log}".rstrip() + "\n")
    missing = [k for k in kernels if k not in cubin.entries]
    if missing:
        found = ", ".join(cubin.entries) or "none"
        raise CompileError(
            f"kernel '{missing[0]}' not found in the module; extern \"C\" missing?",
            f"kernels named by the launch plan but not in the module: {', '.join(missing)}\n"
            f"entry functions found: {found}\n\n{log}".rstrip() + "\n",
        )
    return cubin
