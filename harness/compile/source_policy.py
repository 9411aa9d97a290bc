"""What a candidate's CUDA-C source may ask of the preprocessor, checked before NVRTC sees it.

This is the second of two defenses. The first is structural (:mod:`.sandbox`, :mod:`.headers`):
NVRTC is handed every header a kernel may include in memory, no include directory, and runs in a
worker that the kernel itself (Landlock, a seccomp filter) keeps from opening any file. This
check gives the model a clear, precise reason instead of NVRTC's "cannot open source file", and
keeps the source from steering the CUDA headers:

- ``#include`` names a header of :data:`ALLOWED_HEADERS` literally (``<...>`` or ``"..."``);
  an include built by a macro, an absolute or relative path, or any other header is refused;
- preprocessing directives are the ordinary ones (``#line``, ``#include_next``, ``#import``,
  ``#embed``, ``#ident`` ... are refused), and ``#pragma`` / ``_Pragma`` only the harmless
  pragmas of :data:`ALLOWED_PRAGMAS`, ``_Pragma`` with a plain string literal;
- ``__has_include`` / ``__has_embed`` (they probe host paths) and ``__pragma`` are refused;
- token pasting cannot build any of those names: the first operand of a ``##`` chain must be an
  identifier that does not begin with ``_`` (not a macro parameter), a number or a punctuator;
- the source neither defines nor undefines reserved identifiers (``__x``, ``_X``): those belong to
  the CUDA headers, whose own includes and feature switches they steer.

The tokens are clang's (:mod:`.pp_lexer`): raw strings, pp-numbers, digit separators, splices,
digraphs and comments are cut as a C++17 preprocessor cuts them. ``tests/harness/test_policy_fuzz.py``
checks the policy against NVRTC itself.
"""

from __future__ import annotations

import functools
import re

from kerngen.errors import CompileError
from kerngen.harness.compile import pp_lexer

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
    "__has_include__": "__has_include__ is not allowed (it probes host paths)",
    "__has_embed": "__has_embed is not allowed (it probes host paths)",
    "__pragma": "__pragma is not allowed",
}
_RESERVED = re.compile(r"^(__|_[A-Z])")


def header_allowed(name: str) -> bool:
    return name in ALLOWED_HEADERS or bool(_CUDA_STD.match(name))


def _allowed_text() -> str:
    return ", ".join(ALLOWED_HEADERS) + ", cuda/std/*"


def _lexed(source: str) -> pp_lexer.Lexed:
    try:
        return pp_lexer.lex(source)
    except ValueError as exc:
        raise CompileError(f"source refused: {exc}", str(exc)) from None
    except pp_lexer.LexerUnavailable as exc:
        raise CompileError(f"source not checked: {exc}", str(exc)) from None


_Old = tuple[str, str]


def logical_lines(source: str) -> list[tuple[int, str, list[_Old]]]:
    """The source as the preprocessor sees it, one logical line at a time: (first physical line,
    code with comments removed, tokens as (kind, text), punctuators one character each, numbers as
    "other"). Shared with :mod:`.source_checks`; a source the lexer refuses has none."""
    try:
        lexed = pp_lexer.lex(source)
    except (ValueError, pp_lexer.LexerUnavailable):
        return []
    out: list[tuple[int, str, list[_Old]]] = []
    for line in _by_line(lexed.code):
        toks: list[_Old] = []
        for t in line:
            if t.kind == "punct":
                toks.extend(("punct", c) for c in t.text)
            else:
                toks.append((t.kind if t.kind != "number" else "other", t.text))
        code = "".join(("" if k == 0 or line[k - 1].end == t.start else " ") + t.text for k, t in enumerate(line))
        out.append((line[0].line, code, toks))
    return out


def _by_line(code: list[pp_lexer.Tok]) -> list[list[pp_lexer.Tok]]:
    """Logical lines; a '#' after a newline inside a comment starts one too (NVRTC's view)."""
    lines: list[list[pp_lexer.Tok]] = []
    for t in code:
        if not lines or t.logical != lines[-1][0].logical or (t.nbol and t.text == "#"):
            lines.append([])
        lines[-1].append(t)
    return lines


def check_source(source: str) -> None:
    """Raise :class:`CompileError` (message: the first offence, with its line) if ``source``
    asks the preprocessor for anything outside the policy."""
    problems = _problems(source)
    if problems:
        raise CompileError(f"source refused: {problems[0]}", "\n".join(problems))


@functools.lru_cache(maxsize=256)
def _problems(source: str) -> tuple[str, ...]:
    lexed = _lexed(source)
    code = lexed.code
    out: list[str] = []
    for i, t in enumerate(code):
        where = f"line {t.line}"
        if t.text == "#" and t.kind == "punct" and (t.bol or t.nbol):  # a directive in either view
            out.extend(f"{where}: {p}" for p in _directive(lexed, code, i + 1, t.logical))
        elif t.kind == "ident" and t.text in _FORBIDDEN_IDENTS:
            out.append(f"{where}: {_FORBIDDEN_IDENTS[t.text]}")
        elif t.kind == "ident" and t.text == "_Pragma":
            out.extend(f"{where}: {p}" for p in _pragma_operator(code[i + 1 : i + 4]))
        elif t.text == "##" and t.kind == "punct":
            out.extend(f"{where}: {p}" for p in _paste(code, i))
        if out:
            break
    return tuple(out)


def _directive(lexed: pp_lexer.Lexed, code: list[pp_lexer.Tok], k: int, logical: int) -> list[str]:
    rest = [t for t in code[k:k + 4] if t.logical == logical]
    if not rest:
        return []  # the null directive
    head = rest[0]
    if head.kind != "ident" or head.text not in ALLOWED_DIRECTIVES:
        return [f"directive #{head.text} is not allowed (allowed: #{', #'.join(sorted(ALLOWED_DIRECTIVES))})"]
    if head.text == "include":
        return _include(lexed, rest[1:], head)
    if head.text == "pragma":
        return _pragma_words(rest[1].text if len(rest) > 1 else "")
    if head.text in ("define", "undef") and len(rest) > 1 and rest[1].kind == "ident" and _RESERVED.match(rest[1].text):
        return [f"#{head.text} of the reserved identifier {rest[1].text} is not allowed (names beginning with __ or "
                "_X belong to the CUDA headers)"]
    return []


def _include(lexed: pp_lexer.Lexed, rest: list[pp_lexer.Tok], head: pp_lexer.Tok) -> list[str]:
    # the preprocessor lexes a header name from the characters after "include", not from tokens
    text = lexed.line_rest(head)
    m = re.match(r'[ \t]*(?:/\*.*?\*/[ \t]*)*(?:<([^>\n]*)>|"([^"\n]*)")', text)
    if m is None:
        shown = " ".join(text.split())[:60]
        return [f"#include must name a header literally, as <name> or \"name\" (got {shown!r})"]
    name = m.group(1) if m.group(1) is not None else m.group(2)
    if not header_allowed(name):
        return [f"include of {name!r} is not allowed; allowed: {_allowed_text()}"]
    return []


def _pragma_words(first: str) -> list[str]:
    if first in ALLOWED_PRAGMAS or first.startswith("nv_diag_"):
        return []
    return [f"#pragma {first or '(empty)'} is not allowed (allowed: {', '.join(sorted(ALLOWED_PRAGMAS))})"]


def _pragma_operator(rest: list[pp_lexer.Tok]) -> list[str]:
    if len(rest) == 3 and rest[0].text == "(" and rest[1].kind == "string" and rest[2].text == ")" \
            and rest[1].text.startswith('"') and rest[1].text.endswith('"'):
        body = rest[1].text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", body)
        return _pragma_words(m.group(1) if m else "")
    return ["_Pragma must take one plain string literal"]


def _paste(code: list[pp_lexer.Tok], k: int) -> list[str]:
    """A ``##`` whose chain could begin with a name of ``_`` (``_Pra ## gma``) or with a macro
    parameter (``a ## b``, whose argument may be ``__has_``): the pasted name is unknown."""
    j = k - 1
    while j >= 2 and code[j - 1].text == "##" and code[j - 1].kind == "punct":
        j -= 2
    head = code[j] if j >= 0 and code[j].logical == code[k].logical else None
    if head is None or head.text == "#":
        return ["## has no left operand"]
    if head.kind == "ident" and (head.text.startswith("_") or head.text in _params(code, k)):
        return [f"token pasting onto {head.text!r} is not allowed: the first operand of ## must be a literal "
                "prefix not beginning with _ (write name_##x, not x##y)"]
    return []


def _params(code: list[pp_lexer.Tok], k: int) -> set[str]:
    """The parameters of the function-like macro whose #define holds token ``k``."""
    i = k - 1  # the nearest '#' that starts a directive in either view, on this logical line
    while i >= 0 and code[i].logical == code[k].logical and not (code[i].text == "#" and (code[i].bol or code[i].nbol)):
        i -= 1
    if i >= 0 and code[i].logical == code[k].logical and len(code) > i + 3 and code[i].text == "#" and code[i + 1].text == "define" and code[i + 3].text == "(" \
            and code[i + 3].start == code[i + 2].end:
        out, j = set(), i + 4
        while j < len(code) and code[j].logical == code[k].logical and code[j].text != ")":
            if code[j].kind == "ident":
                out.add(code[j].text)
            j += 1
        return out
    return set()
