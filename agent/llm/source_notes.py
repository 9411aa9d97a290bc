"""Everything in a refused source that would be refused next, named at once for its repair.

The compile boundary stops at the first offence: the source policy names the first include it
refuses, NVRTC then stops at host code. A model that wrote host code (an include of
``torch/extension.h``, ``cudaMalloc``, a ``<<<...>>>`` launch, ``main``) would need one repair
per offence and runs out of repairs. Here a refused source is scanned for all of them, so the
repair prompt lists them together. It only explains: the verdict is the harness's, and a source
this scan passes may still be refused.
"""

from __future__ import annotations

import re

from kerngen.harness.compile.source_policy import header_allowed

MAX_NOTES = 12
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]{1,200})[>"]', re.M)
_HOST_CALL = re.compile(r"\b(cuda(?:Malloc\w*|Free\w*|Memcpy\w*|Memset\w*|DeviceSynchronize|StreamCreate\w*|"
                        r"StreamSynchronize|Launch\w*|GetLastError|EventCreate\w*|SetDevice|FuncSetAttribute))\s*\(")
_LAUNCH = re.compile(r"<<<[^;]{0,200}?>>>")
_MAIN = re.compile(r"\b(?:int|void)\s+main\s*\(")
_HOST_LIB = re.compile(r"\b(torch|at|c10|pybind11|thrust|cub|cutlass|cublas\w*)::|\bPYBIND11_MODULE\b|\bTORCH_LIBRARY\b")


def refused_constructs(source: str) -> list[str]:
    """One line per include of a header not allowed and per piece of host code, in the order
    they appear (at most :data:`MAX_NOTES`)."""
    code = _STRING.sub('""', _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), source or ""))
    found: list[tuple[int, str]] = []
    for m in _INCLUDE.finditer(code):
        if not header_allowed(m.group(1).strip()):
            found.append((m.start(), f"`#include <{m.group(1).strip()}>` is not allowed (only the headers the system "
                                     "message lists; no host or PyTorch headers)"))
    for m in _HOST_CALL.finditer(code):
        found.append((m.start(), f"`{m.group(1)}(...)` is host code (the harness allocates, copies and launches; "
                                 "declare scratch buffers in `scratch`)"))
    for m in _LAUNCH.finditer(code):
        found.append((m.start(), "a `<<<...>>>` launch is host code (launches are the plan's `steps`)"))
    for m in _MAIN.finditer(code):
        found.append((m.start(), "`main` is host code (only `__global__` kernels and `__device__` functions)"))
    for m in _HOST_LIB.finditer(code):
        found.append((m.start(), f"`{m.group().rstrip(':')}` is a host library (nothing is linked)"))
    found.sort()
    lines, seen = [], set()
    for pos, text in found:
        line = code.count("\n", 0, pos) + 1
        if text not in seen:
            seen.add(text)
            lines.append(f"line {line}: {text}")
    return lines[:MAX_NOTES]


__all__ = ["refused_constructs"]
