"""The two source rewrites the emulator needs before g++ sees a kernel (line numbers kept):

- ``asm(...)`` / ``asm volatile(...)`` / ``__asm__(...)`` become ``KG_EMU_ASM(...)``: a call of an
  undefined function, which the linker reports only if the emitted code calls it (cuda_emu.h).
- ``extern __shared__ T name[];`` (dynamic shared memory) becomes ``T *&name = ...`` bound to the
  launch's dynamic shared memory pointer, at namespace or function scope alike.

Comments and string literals are skipped.
"""

from __future__ import annotations

import re

_ALIGN = re.compile(r"\b(?:__align__|alignas)\s*\([^()]*\)|__attribute__\s*\(\([^()]*(?:\([^()]*\))?[^()]*\)\)")
_TOKENS = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r"|\"(?:\\.|[^\"\\\n])*\""
    r"|'(?:\\.|[^'\\\n])*'"
    r"|(?P<asm>\b(?:asm|__asm__|__asm)\b(?:\s+(?:volatile|__volatile__|inline|goto))*\s*\()"
    r"|(?P<dyn>\b(?:extern\s+__shared__|__shared__\s+extern)\s+(?P<decl>[^;{}]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\s*\]\s*;)",
    re.S,
)


def rewrite_source(source: str) -> str:
    return _TOKENS.sub(_replace, source)


def _replace(m: re.Match[str]) -> str:
    if m.group("asm"):
        return "KG_EMU_ASM("
    if m.group("dyn"):
        decl = " ".join(_ALIGN.sub(" ", m.group("decl")).split())
        newlines = "\n" * m.group("dyn").count("\n")
        name = m.group("name")
        return f"{decl} *&{name} = reinterpret_cast<{decl} *&>(kg_emu::g_dyn_smem);{newlines}"
    return m.group(0)
