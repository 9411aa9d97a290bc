"""A parent kernel's source as a prompt shows it: repeated variants of one helper folded.

A long source often repeats one ``__device__`` helper in several variants, one per value of a
tunable (the wgmma seed defines ``gw_mma`` four times, ``#if BN == 64`` .. ``#if BN == 256``: an
inline-PTX ``asm`` whose operand lists grow with BN, 14 kB of its 21.7 kB). A prompt that shows
the source as the kernel to improve shows the shortest variant in full and the others by their
signature, their body replaced by one comment that says how many lines and characters it held and
what differs from the one shown (the identifiers only it has, e.g. ``m64n192k8``): the model can
write them out again from the one shown. Definitions are folded only where they are the same code
but for their numbers and the length of their comma-separated lists; the kernels (``__global__``),
the tunables, the launch plan and every other line are kept as written. Comments stay: they say why.

Which variant is shown in full: for a kernel to improve, the shortest (any one shows the pattern);
for a failed kernel sent back for repair, the one its failing configuration selected (its tunables
and the defines the problem's sizes give, by the ``#if NAME == N`` right before it), where the
fault it showed lies. Pure text; a source this scanner cannot follow (unbalanced braces, an
unterminated string or comment) is returned unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FOLD_MARK = "body folded ("  # in every folded body's comment: the prompt explains folds where it finds one
MIN_FOLD = 300  # characters: a shorter body is kept (its fold note would save little)
# names before "(" that are attributes or operators, not the function's name
_NOT_NAMES = {"__launch_bounds__", "__align__", "__attribute__", "__declspec", "__maxnreg__", "__cluster_dims__",
              "alignas", "decltype", "sizeof", "noexcept", "operator"}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_GUARD = re.compile(r"\s*#\s*(?:el)?if\s+([A-Za-z_]\w*)\s*==\s*(-?\d+)\s*(?://.*|/\*.*\*/)?\s*$")


@dataclass(frozen=True)
class _Block:
    head_start: int  # where the text before the brace starts (after the previous top-level item)
    open: int  # the "{"
    end: int  # after the matching "}"


def _top_level_blocks(src: str) -> list[_Block] | None:
    """The brace blocks at file scope with the text that leads to each; None where the source
    cannot be followed (braces that do not balance, a string or comment left open)."""
    blocks: list[_Block] = []
    i, n, depth, head, opened = 0, len(src), 0, 0, 0
    line_start = True
    while i < n:
        c = src[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t\r":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line (and its continuations): no braces counted
            end = i
            while True:
                end = src.find("\n", end)
                if end < 0:
                    end = n
                    break
                if src[end - 1:end] == "\\" or src[end - 2:end] == "\\\r":
                    end += 1
                    continue
                break
            i = end
            if depth == 0:
                head = end
            continue
        line_start = False
        if src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
            continue
        if src.startswith("/*", i):
            close = src.find("*/", i + 2)
            if close < 0:
                return None
            i = close + 2
            continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                if src[j] == "\n":
                    return None
                j += 2 if src[j] == "\\" else 1
            if j >= n:
                return None
            i = j + 1
            continue
        if c == "{":
            if depth == 0:
                opened = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                blocks.append(_Block(head, opened, i + 1))
                head = i + 1
        elif c == ";" and depth == 0:
            head = i + 1
        i += 1
    return blocks if depth == 0 else None


def _helper_name(head: str) -> str | None:
    """The name of the ``__device__`` function (not a kernel) a block's head declares, else None."""
    code = _COMMENT.sub(" ", head)
    if "__device__" not in code or "__global__" in code or re.match(r"\s*(struct|class|union|enum|namespace)\b", code):
        return None
    for m in _NAME.finditer(code):
        if m.group(1) not in _NOT_NAMES:
            return m.group(1)
    return None


def _shape(body: str) -> str:
    """A body with every number as 0 and every run of equal comma-separated items as one: two
    variants that differ only in numbers and list lengths have the same shape."""
    text = re.sub(r"\d+", "0", _COMMENT.sub(" ", body))
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"([^,]{1,60}?)(?:,\1)+", r"\1,...", text)


def _selected(source: str, b: _Block, values: dict[str, Any]) -> bool:
    """Whether the preprocessor line right before ``b`` is ``#if NAME == N`` (or ``#elif``) true at ``values``."""
    before = source[:b.head_start].rstrip("\n").rsplit("\n", 1)[-1]
    m = _GUARD.match(before)
    return bool(m) and str(values.get(m.group(1))) == m.group(2)


def fold_repeats(source: str, values: dict[str, Any] | None = None) -> str:
    """``source`` with every ``__device__`` helper defined more than once in the same shape shown
    once in full and otherwise by its signature and a fold note (see the module). The variant
    shown in full is the one ``values`` (tunable -> value: the configuration that ran) selects by
    an ``#if NAME == N`` right before it, else the shortest."""
    blocks = _top_level_blocks(source or "")
    if not blocks:
        return source
    groups: dict[tuple[str, str], list[_Block]] = {}
    for b in blocks:
        name = _helper_name(source[b.head_start:b.open])
        if name is not None:
            groups.setdefault((name, _shape(source[b.open:b.end])), []).append(b)
    folds: dict[int, str] = {}  # block start -> its folded body
    for (name, _), group in groups.items():
        if len(group) < 2:
            continue
        chosen = [b for b in group if _selected(source, b, values or {})]
        kept = chosen[0] if len(chosen) == 1 else min(group, key=lambda b: b.end - b.open)
        kept_words = set(_IDENT.findall(source[kept.open:kept.end]))
        for b in group:
            body = source[b.open:b.end]
            if b is kept or len(body) < MIN_FOLD:
                continue
            own = sorted(set(_IDENT.findall(body)) - kept_words)[:4]
            differs = f" ({', '.join(own)})" if own else ""
            folds[b.open] = (f"{{ /* {FOLD_MARK}{body.count(chr(10)) + 1} lines, {len(body):,} characters): the code of "
                             f"the {name} shown in full, with this variant's numbers{differs} */ }}")
    if not folds:
        return source
    out, at = [], 0
    for b in blocks:
        if b.open in folds:
            out += [source[at:b.open], folds[b.open]]
            at = b.end
    out.append(source[at:])
    return "".join(out)


__all__ = ["FOLD_MARK", "fold_repeats"]
