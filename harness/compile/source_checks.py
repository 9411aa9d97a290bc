"""Checks of a candidate's source against what its compile job asks of it, before NVRTC runs, and
the names of the source's ``__global__`` functions (for a precise "kernel not found" message).

A tunable (or a spec's define) that the source itself #defines or #undefs: each configuration
reaches the source as ``-DNAME=value``. A source that says ``#define BLOCK 256`` as well gets from
NVRTC only a warning ("incompatible redefinition") and the source's value wins: every
configuration compiles to the same kernel, the tuner times one kernel many times and the launch
plan's ``BLOCK`` no longer matches the kernel's. An ``#undef BLOCK`` loses the value altogether.
Neither fails to compile, so the compile boundary refuses both, with the line.

A ``#define NAME`` is fine where the preprocessor can only reach it when ``NAME`` is not defined:
inside ``#ifndef NAME``, ``#if !defined(NAME)`` (alone or joined by ``&&``), or the ``#else`` /
``#elif`` of ``#ifdef NAME`` / ``#if defined(NAME)``. That is the idiom for a default value.

The scan is :mod:`.source_policy`'s: continuations joined, comments removed, literals skipped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from kerngen.errors import CompileError
from kerngen.harness.compile.source_policy import logical_lines

_Tok = tuple[str, str]


@dataclass(frozen=True)
class Redefinition:
    """One ``#define`` / ``#undef`` of a name the options pass with ``-D``."""

    line: int  # the physical line where the directive starts (1-based)
    name: str
    directive: str  # "define" | "undef"
    text: str  # the directive as written (comments removed), clipped

    def message(self, tunable: bool) -> str:
        what = "tunable" if tunable else "define"
        given = (f"each configuration's -D{self.name}=value" if tunable
                 else f"the spec's define -D{self.name}=value")
        if self.directive == "undef":
            return (f"{what} {self.name} is undefined in the source at line {self.line} ({self.text}): {given} "
                    f"would be lost; remove the #undef and name a local macro otherwise")
        return (f"{what} {self.name} is redefined in the source at line {self.line} ({self.text}): {given} "
                f"would be ignored; guard it with #ifndef {self.name}")


@dataclass
class _Frame:
    """One open #if group: names that are surely undefined inside its current branch, and names
    whose definedness a branch tested true (so they are undefined in every later branch)."""

    undefined: set[str] = field(default_factory=set)
    tested_defined: set[str] = field(default_factory=set)


def _strip_parens(toks: list[_Tok]) -> list[_Tok]:
    """``toks`` without parentheses around all of it (``(a) && (b)`` keeps its own)."""
    while len(toks) >= 2 and toks[0] == ("punct", "(") and _skip_parens(toks, 0) == len(toks):
        toks = toks[1:-1]
    return toks


def _defined_name(toks: list[_Tok]) -> str | None:
    """``NAME`` of ``defined(NAME)`` / ``defined NAME``, else None."""
    toks = _strip_parens(toks)
    if len(toks) >= 2 and toks[0] == ("ident", "defined"):
        rest = _strip_parens(toks[1:])
        if len(rest) == 1 and rest[0][0] == "ident":
            return rest[0][1]
    return None


def _terms(toks: list[_Tok]) -> list[list[_Tok]] | None:
    """The operands of a top-level ``&&`` chain; None where a top-level ``||`` or ``?:`` makes the
    condition promise nothing about each operand."""
    toks = _strip_parens(toks)
    out: list[list[_Tok]] = [[]]
    depth, i = 0, 0
    while i < len(toks):
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if t == ("punct", "("):
            depth += 1
        elif t == ("punct", ")"):
            depth -= 1
        elif depth == 0 and t in (("punct", "&"), ("punct", "|")) and nxt == t:
            if t[1] == "|":
                return None
            out.append([])
            i += 2
            continue
        elif depth == 0 and t == ("punct", "?"):
            return None
        out[-1].append(t)
        i += 1
    return out


def _condition(toks: list[_Tok]) -> tuple[set[str], set[str]]:
    """(names surely undefined when the condition holds, names surely defined when it holds)."""
    terms = _terms(toks)
    undefined: set[str] = set()
    defined: set[str] = set()
    if terms is None:
        return undefined, defined
    for term in terms:
        term = _strip_parens(term)
        if term and term[0] == ("punct", "!"):
            name = _defined_name(term[1:])
            if name:
                undefined.add(name)
        else:
            name = _defined_name(term)
            if name:
                defined.add(name)
    return undefined, defined


def _clip(code: str) -> str:
    text = " ".join(code.split())
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=256)  # a tuning batch compiles one source under many configurations
def redefinitions(source: str, names: frozenset[str]) -> tuple[Redefinition, ...]:
    """Every ``#define`` / ``#undef`` of one of ``names`` that is not guarded (see the module)."""
    if not names:
        return ()
    stack: list[_Frame] = []
    found: list[Redefinition] = []
    for line_no, code, toks in logical_lines(source):
        sig = [t for t in toks if t[0] != "space"]
        if len(sig) < 2 or sig[0] != ("punct", "#") or sig[1][0] != "ident":
            continue
        kind, rest = sig[1][1], sig[2:]
        if kind in ("ifndef", "ifdef"):
            name = {rest[0][1]} if rest and rest[0][0] == "ident" else set()
            stack.append(_Frame(undefined=name, tested_defined=set()) if kind == "ifndef"
                         else _Frame(undefined=set(), tested_defined=name))
        elif kind == "if":
            undefined, defined = _condition(rest)
            stack.append(_Frame(undefined=undefined, tested_defined=defined))
        elif kind in ("elif", "elifdef", "elifndef", "else") and stack:
            frame = stack[-1]
            before = set(frame.tested_defined)  # every earlier branch failed: these are undefined
            if kind == "elif":
                undefined, defined = _condition(rest)
            elif kind == "elifndef":
                undefined, defined = ({rest[0][1]} if rest and rest[0][0] == "ident" else set()), set()
            elif kind == "elifdef":
                undefined, defined = set(), ({rest[0][1]} if rest and rest[0][0] == "ident" else set())
            else:
                undefined, defined = set(), set()
            frame.undefined = before | undefined
            frame.tested_defined = before | defined
        elif kind == "endif" and stack:
            stack.pop()
        elif kind in ("define", "undef") and rest and rest[0][0] == "ident" and rest[0][1] in names:
            name = rest[0][1]
            if not any(name in f.undefined for f in stack):
                found.append(Redefinition(line=line_no, name=name, directive=kind, text=_clip(code)))
    return tuple(found)


def check_macros(source: str, names: frozenset[str] | set[str], tunables: frozenset[str] | set[str]) -> None:
    """Raise :class:`CompileError` (message: the first offence; log: all of them) when the source
    redefines or undefines a name in ``names`` (the ``-D`` names of a job; those in ``tunables``
    are called tunables in the message, the others defines)."""
    found = redefinitions(source, frozenset(names))
    if not found:
        return
    lines = [r.message(r.name in tunables) for r in found]
    more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
    raise CompileError(lines[0] + more, "\n".join(lines) + "\n")


# attributes that sit between ``__global__ void`` and the kernel's name, with a parenthesised argument
_ATTRIBUTES = frozenset({"__launch_bounds__", "__maxnreg__", "__cluster_dims__", "__attribute__", "__declspec",
                         "alignas", "__align__"})


@functools.lru_cache(maxsize=256)
def global_functions(source: str) -> tuple[str, ...]:
    """Names of the functions the source declares ``__global__``, in order, as written (a name
    without ``extern "C"`` is mangled in the module). Directive lines are skipped: a kernel made
    by a macro is not seen here (the module is the authority; this only explains its absence)."""
    toks = [t for _, _, line in logical_lines(source) for t in _code_tokens(line)]
    names: list[str] = []
    for i, tok in enumerate(toks):
        if tok != ("ident", "__global__"):
            continue
        last: str | None = None
        j = i + 1
        while j < len(toks):
            kind, text = toks[j]
            if kind == "ident" and text in _ATTRIBUTES:
                j = _skip_parens(toks, j + 1)
                continue
            if kind == "ident":
                last = text
            elif (kind, text) == ("punct", "("):
                if last and last not in names:
                    names.append(last)
                break
            elif kind == "punct" and text in ";{})":
                break
            j += 1
    return tuple(names)


def _code_tokens(line: list[_Tok]) -> list[_Tok]:
    sig = [t for t in line if t[0] != "space"]
    return [] if sig and sig[0] == ("punct", "#") else sig


def _skip_parens(toks: list[_Tok], j: int) -> int:
    """The index after the balanced ``( ... )`` that starts at ``j`` (``j`` itself if none does)."""
    if j >= len(toks) or toks[j] != ("punct", "("):
        return j
    depth = 0
    while j < len(toks):
        if toks[j] == ("punct", "("):
            depth += 1
        elif toks[j] == ("punct", ")"):
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


__all__ = ["Redefinition", "check_macros", "global_functions", "redefinitions"]
