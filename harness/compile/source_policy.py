"""What a candidate's CUDA-C source may ask of the preprocessor, checked before NVRTC sees it.

The compile sandbox (:mod:`.sandbox`) is what makes host files unreadable: NVRTC runs in a process
that can read the CUDA header directories and nothing else. This check comes first and gives the
model a clear, precise reason instead of NVRTC's "cannot open source file":

- ``#include`` names a header of :data:`ALLOWED_HEADERS` literally (``<...>`` or ``"..."``);
  an include built by a macro, an absolute or relative path, or any other header is refused;
- preprocessing directives are the ordinary ones (``#line``, ``#include_next``, ``#import``,
  ``#embed``, ``#ident`` ... are refused), and ``#pragma`` / ``_Pragma`` only the harmless
  pragmas of :data:`ALLOWED_PRAGMAS`;
- ``__has_include`` (it tells whether a host path exists) is refused;
- the source neither defines nor undefines reserved identifiers (``__x``, ``_X``): those belong to
  the CUDA headers, whose own includes and feature switches they steer.

The scan works on the source as the preprocessor sees it: line continuations joined, comments
removed (a ``/**/`` between ``#`` and ``include`` hides nothing), string and character literals
skipped, digraphs (``%:``) read as ``#``.
"""

from __future__ import annotations

import re

from kerngen.errors import CompileError

# Headers a candidate may include, by name. Each one compiles under NVRTC 13.0 with the headers
# kerngen ships (tests/harness/test_sandbox.py compiles every one of them).
ALLOWED_HEADERS: tuple[str, ...] = (
    # kerngen's stand-ins for the C library (see headers.BUILTIN_HEADERS)
    "stdint.h", "cstdint", "math.h", "cmath", "float.h", "cfloat", "limits.h", "climits", "assert.h", "cassert",
    # CUDA
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "vector_types.h", "vector_functions.h", "math_constants.h",
    "mma.h", "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h",
    "cooperative_groups.h", "cooperative_groups/reduce.h", "cooperative_groups/scan.h",
    "cooperative_groups/memcpy_async.h",
    "cuda/pipeline", "cuda/barrier", "cuda/atomic", "cuda/annotated_ptr", "cuda/ptx",
)  # fmt: skip
# and CCCL's freestanding standard library: <cuda/std/NAME>
_CUDA_STD = re.compile(r"^cuda/std/[a-z_]+$")

ALLOWED_PRAGMAS: frozenset[str] = frozenset({
    "unroll", "nounroll", "once", "pack", "push_macro", "pop_macro",
    "nv_diag_suppress", "nv_diag_warning", "nv_diag_error", "nv_diag_default", "nv_diag_once",
    "diag_suppress", "diag_warning", "diag_error", "diag_default", "diag_once",
})  # fmt: skip

ALLOWED_DIRECTIVES: frozenset[str] = frozenset({
    "define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif",
    "include", "pragma", "error", "warning",
})  # fmt: skip

_FORBIDDEN_IDENTS = {
    "__has_include": "__has_include is not allowed (it probes host paths)",
    "__has_include_next": "__has_include_next is not allowed (it probes host paths)",
    "__pragma": "__pragma is not allowed",
}
_RESERVED = re.compile(r"^(__|_[A-Z])")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENT_TAIL = re.compile(r"[A-Za-z0-9_]+")


def header_allowed(name: str) -> bool:
    return name in ALLOWED_HEADERS or bool(_CUDA_STD.match(name))


def _allowed_text() -> str:
    return ", ".join(ALLOWED_HEADERS) + ", cuda/std/*"


class _Scan:
    """One pass over the source: logical lines with comments blanked, literals kept apart."""

    def __init__(self, source: str) -> None:
        # phase 2: join continued lines (keep a count so messages cite the physical line)
        self.text = source.replace("\r\n", "\n").replace("\r", "\n")

    def logical_lines(self) -> list[tuple[int, str, list[tuple[str, str]]]]:
        """(first physical line, code with comments removed, tokens) per logical line. A token
        is (kind, text) with kind in {"ident", "string", "char", "punct", "other"}."""
        out: list[tuple[int, str, list[tuple[str, str]]]] = []
        text = self.text
        n = len(text)
        i = 0
        line_no = 1
        start_line = 1
        code: list[str] = []
        tokens: list[tuple[str, str]] = []
        in_block = False
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n and text[i + 1] == "\n":  # continuation
                i += 2
                line_no += 1
                continue
            if in_block:
                if c == "*" and i + 1 < n and text[i + 1] == "/":
                    in_block = False
                    i += 2
                    code.append(" ")
                else:
                    if c == "\n":
                        line_no += 1
                    i += 1
                continue
            if c == "\n":
                out.append((start_line, "".join(code), tokens))
                code, tokens = [], []
                i += 1
                line_no += 1
                start_line = line_no
                continue
            if c == "/" and i + 1 < n and text[i + 1] == "*":
                in_block = True
                i += 2
                continue
            if c == "/" and i + 1 < n and text[i + 1] == "/":
                while i < n and text[i] != "\n":  # a continued // comment swallows the next line
                    if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                        line_no += 1
                        i += 1
                    i += 1
                continue
            if c == "R" and text.startswith('R"', i) and not (code and re.match(r"[A-Za-z0-9_]", code[-1][-1:])):
                m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
                if m:
                    end = text.find(")" + m.group(1) + '"', i + m.end())
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    lit = text[i:end]
                    line_no += lit.count("\n")
                    tokens.append(("string", lit))
                    code.append(lit)
                    i = end
                    continue
            if c in "\"'":
                j = i + 1
                while j < n and text[j] != c and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                lit = text[i : min(j + 1, n)]
                tokens.append(("string" if c == '"' else "char", lit))
                code.append(lit)
                i = j + 1
                continue
            m = _IDENT.match(text, i)
            if m:
                word, i = m.group(), m.end()
                # a continuation inside an identifier joins its halves (phase 2 comes before tokens)
                while text.startswith("\\\n", i):
                    tail = _IDENT_TAIL.match(text, i + 2)
                    if tail is None:
                        break
                    word += tail.group()
                    line_no += 1
                    i = tail.end()
                tokens.append(("ident", word))
                code.append(word)
                continue
            if c == "%" and i + 1 < n and text[i + 1] == ":":  # digraph for '#'
                tokens.append(("punct", "#"))
                code.append("#")
                i += 2
                continue
            tokens.append(("punct" if not c.isspace() else "space", c))
            code.append(c)
            i += 1
        if code or tokens:
            out.append((start_line, "".join(code), tokens))
        return out


def logical_lines(source: str) -> list[tuple[int, str, list[tuple[str, str]]]]:
    """The source as the preprocessor sees it, one logical line at a time: (first physical line,
    code with comments removed, tokens). Shared with :mod:`.source_checks`."""
    return _Scan(source).logical_lines()


def check_source(source: str) -> None:
    """Raise :class:`CompileError` (message: the first offence, with its line) if ``source``
    asks the preprocessor for anything outside the policy."""
    problems: list[str] = []
    for line_no, code, toks in _Scan(source).logical_lines():
        where = f"line {line_no}"
        sig = [t for t in toks if t[0] != "space"]
        if sig and sig[0] == ("punct", "#"):
            problems.extend(f"{where}: {p}" for p in _directive(sig[1:]))
        for k, (kind, text) in enumerate(sig):
            if kind != "ident":
                continue
            if text in _FORBIDDEN_IDENTS:
                problems.append(f"{where}: {_FORBIDDEN_IDENTS[text]}")
            elif text == "_Pragma":
                problems.extend(f"{where}: {p}" for p in _pragma_operator(sig[k + 1 :]))
        if problems:
            break
    if problems:
        raise CompileError(f"source refused: {problems[0]}", "\n".join(problems))


def _directive(toks: list[tuple[str, str]]) -> list[str]:
    if not toks:
        return []  # the null directive
    kind, name = toks[0]
    if kind != "ident" or name not in ALLOWED_DIRECTIVES:
        return [f"directive #{name} is not allowed (allowed: #{', #'.join(sorted(ALLOWED_DIRECTIVES))})"]
    rest = toks[1:]
    if name == "include":
        return _include(rest)
    if name == "pragma":
        return _pragma_words(rest[0][1] if rest else "")
    if name in ("define", "undef") and rest and rest[0][0] == "ident" and _RESERVED.match(rest[0][1]):
        return [f"#{name} of the reserved identifier {rest[0][1]} is not allowed (names beginning with __ or _X "
                "belong to the CUDA headers)"]
    return []


def _include(rest: list[tuple[str, str]]) -> list[str]:
    if rest and rest[0][0] == "string":
        name = rest[0][1][1:-1]
    elif rest and rest[0] == ("punct", "<"):
        parts = []
        for kind, text in rest[1:]:
            if (kind, text) == ("punct", ">"):
                break
            parts.append(text)
        else:
            return ["#include <...> is not closed"]
        name = "".join(parts).strip()
    else:
        shown = " ".join(t for _, t in rest)[:60]
        return [f"#include must name a header literally, as <name> or \"name\" (got {shown!r})"]
    if not header_allowed(name):
        return [f"include of {name!r} is not allowed; allowed: {_allowed_text()}"]
    return []


def _pragma_words(first: str) -> list[str]:
    if first in ALLOWED_PRAGMAS or first.startswith("nv_diag_"):
        return []
    return [f"#pragma {first or '(empty)'} is not allowed (allowed: {', '.join(sorted(ALLOWED_PRAGMAS))})"]


def _pragma_operator(rest: list[tuple[str, str]]) -> list[str]:
    if len(rest) >= 2 and rest[0] == ("punct", "(") and rest[1][0] == "string":
        body = rest[1][1]
        body = body[body.index('"') + 1 : -1] if '"' in body else body
        words = body.replace('\\"', '"').split()
        return _pragma_words(words[0] if words else "")
    return ["_Pragma must take a string literal"]
