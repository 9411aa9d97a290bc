"""The source rewrites the emulator needs before g++ sees a kernel (line numbers kept):

- ``asm(...)`` / ``asm volatile(...)`` / ``__asm__(...)``: a call of the routine that emulates its
  instruction (``ptx_asm.translate``, routines in emu_ptx.h), or, for an instruction that is not emulated,
  a call of an undefined function that names it, which the linker reports only if the emitted code calls it.
- ``extern __shared__ T name[];`` (dynamic shared memory) becomes ``T *&name = ...`` bound to the
  launch's dynamic shared memory pointer, at namespace or function scope alike.
- ``__noinline__`` becomes ``__attribute__((noinline))`` here, not by a macro of the shim: libstdc++ 12+ writes
  ``__attribute__((__noinline__))`` in its own headers, which such a macro breaks wherever they are read after it
  (g++ 13's, from the driver's headers: "'noinline' was not declared").

Comments and string literals are skipped.
"""

from __future__ import annotations

import re

from kerngen.harness.emu.ptx_asm import NotEmulated, not_emulated_call, translate

_ALIGN = re.compile(r"\b(?:__align__|alignas)\s*\([^()]*\)|__attribute__\s*\(\([^()]*(?:\([^()]*\))?[^()]*\)\)")
_TOKENS = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r"|\"(?:\\.|[^\"\\\n])*\""
    r"|'(?:\\.|[^'\\\n])*'"
    r"|(?P<asm>\b(?:asm|__asm__|__asm)\b(?:\s+(?:volatile|__volatile__|inline|goto))*\s*\()"
    r"|(?P<dyn>\b(?:extern\s+__shared__|__shared__\s+extern)\s+(?P<decl>[^;{}]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\s*\]\s*;)"
    r"|(?P<noinline>\b__noinline__\b)",
    re.S,
)


def rewrite_source(source: str) -> str:
    out, pos = [], 0
    while (m := _TOKENS.search(source, pos)) is not None:
        out.append(source[pos:m.start()])
        if m.group("asm"):
            end = _closing_paren(source, m.end())
            line = source.count("\n", 0, m.start()) + 1
            out.append(_asm(source[m.end():end], line) + _line_breaks(source[m.start():end + 1]))
            pos = end + 1
        elif m.group("dyn"):
            decl = " ".join(_ALIGN.sub(" ", m.group("decl")).split())
            name = m.group("name")
            out.append(f"{decl} *&{name} = reinterpret_cast<{decl} *&>(kg_emu::g_dyn_smem);"
                       + _line_breaks(m.group("dyn")))
            pos = m.end()
        elif m.group("noinline"):
            out.append("__attribute__((noinline))")
            pos = m.end()
        else:
            out.append(m.group(0))
            pos = m.end()
    out.append(source[pos:])
    return "".join(out)


def _asm(body: str, line: int) -> str:
    try:
        return translate(body.replace("\\\n", "\n"), line)  # a statement inside a macro
    except NotEmulated as e:
        return not_emulated_call(str(e), line)


def _closing_paren(source: str, start: int) -> int:
    """The index of the ``)`` that closes the parenthesis opened just before ``start`` (string and
    character literals and comments skipped); the end of the source if none does (g++ then reports it)."""
    depth, i = 1, start
    while i < len(source):
        c = source[i]
        if c in "\"'":
            i += 1
            while i < len(source) and source[i] != c:
                i += 2 if source[i] == "\\" else 1
        elif source.startswith("//", i):
            i = source.find("\n", i) if "\n" in source[i:] else len(source)
        elif source.startswith("/*", i):
            i = source.find("*/", i + 2) + 1 if "*/" in source[i + 2:] else len(source)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(source) - 1


def _line_breaks(text: str) -> str:
    """The line breaks of replaced text (a backslash-newline stays one, inside a macro)."""
    return "".join("\\\n" if text[i - 1:i] == "\\" else "\n" for i, c in enumerate(text) if c == "\n")
