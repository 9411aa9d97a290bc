"""Inline PTX for the emulator: a GNU ``asm`` statement whose template is one instruction of a closed
set becomes a call of the routine in ``emu_ptx.h`` that emulates it; any other statement becomes a call of
an undefined function whose name carries the instruction, so that the link fails (only where emitted code
calls it) and :func:`not_emulated` turns the linker's message into one line.

The statement's operand lists are parsed (``"=r"(x)``, ``"+f"(d[0])``, ``"l"(p)``, ``"n"(N)`` ...):
an output becomes ``kg_emu::ptx::out<'r'>(x)`` (a destination: a pointer and the size of its type, checked
against the constraint), an input or an output read as a source ``kg_emu::ptx::in<'l'>(p)`` (its bits), an
immediate of the template a ``unsigned long long`` literal. The routine gets them in the template's order,
``{ }`` vectors flattened, ``[%N + imm]`` addresses added up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

NOT_EMULATED_SYMBOL = "kg_emu_ptx_not_emulated_line_"
_SYMBOL_END = "__end"


class Slot(Enum):
    """What one operand position of an instruction takes."""
    DST = "d"  # %N naming an output (a register the instruction writes)
    SRC = "s"  # %N (an input, an "n" immediate operand, or an output read), or an integer literal
    ADDR = "a"  # [%N] or [%N+imm]: a shared-window or a global address


@dataclass(frozen=True)
class Form:
    """How one instruction is emulated: its routine in emu_ptx.h and its operand positions, each
    (slot, vector length; 0 = a scalar); the last ``optional`` positions may be left out."""
    routine: str
    slots: tuple[tuple[Slot, int], ...]
    optional: int = 0


def _form(routine: str, shape: str, optional: int = 0) -> Form:
    """``shape``: one word per operand, a slot letter with an optional vector length (``d4 s4 s2 s4``)."""
    return Form(routine, tuple((Slot(w[0]), int(w[1:] or 0)) for w in shape.split()), optional)


def _instructions() -> dict[str, Form]:
    forms = {
        "cvt.rna.tf32.f32": _form("cvt_rna_tf32_f32", "d s"),
        "cvt.rn.bf16.f32": _form("cvt_rn_bf16_f32", "d s"),
        "cvt.rn.bf16x2.f32": _form("cvt_rn_bf16x2_f32", "d s s"),
        "cvt.f32.bf16": _form("cvt_f32_bf16", "d s"),
        "cvt.rn.f16.f32": _form("cvt_rn_f16_f32", "d s"),
        "cvt.f32.f16": _form("cvt_f32_f16", "d s"),
        "cvt.rn.f16x2.f32": _form("cvt_rn_f16x2_f32", "d s s"),
        "ex2.approx.ftz.f32": _form("ex2_approx_ftz_f32", "d s"),
        "bar.sync": _form("bar_sync", "s s", optional=1),
        "bar.arrive": _form("bar_arrive", "s s"),
        "cvta.to.shared.u32": _form("cvta_to_shared", "d s"),
        "cvta.to.shared.u64": _form("cvta_to_shared", "d s"),
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32": _form("mma_m16n8k8_tf32", "d4 s4 s2 s4"),
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32": _form("mma_m16n8k16_bf16", "d4 s4 s2 s4"),
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32": _form("mma_m16n8k16_f16", "d4 s4 s2 s4"),
        "cp.async.commit_group": _form("cp_async_commit_group", ""),
        "cp.async.wait_group": _form("cp_async_wait_group", "s"),
        "cp.async.wait_all": _form("cp_async_wait_all", ""),
    }
    for space in (".shared", ".shared::cta"):
        for n in (1, 2, 4):
            for trans in ("", ".trans"):
                routine = f"ldmatrix<{n}, {'true' if trans else 'false'}>"
                forms[f"ldmatrix.sync.aligned.m8n8.x{n}{trans}{space}.b16"] = _form(routine, f"d{n} a")
        for cache in ("ca", "cg"):
            for prefetch in ("", ".L2::64B", ".L2::128B", ".L2::256B"):
                # [dst], [src], cp-size {, src-size}: src-size < cp-size zero-fills the rest
                forms[f"cp.async.{cache}{space}.global{prefetch}"] = _form(f"cp_async_{cache}", "a a s s", optional=1)
    return forms


INSTRUCTIONS = _instructions()


@dataclass(frozen=True)
class Operand:
    constraint: str  # the register letter: r h l f d n
    expr: str
    output: bool


@dataclass(frozen=True)
class AsmStatement:
    template: str  # the concatenated string literals, escapes decoded
    operands: tuple[Operand, ...]  # outputs then inputs: %0, %1 ... as in the template


class NotEmulated(ValueError):
    """An asm statement the emulator has no routine for; ``args[0]`` names its instruction."""


# ----- parsing the statement -------------------------------------------------------------------------
_STRING = re.compile(r'"((?:\\.|[^"\\])*)"', re.S)
_LITERALS = re.compile(r'(?:\s*"(?:\\.|[^"\\])*")+\s*', re.S)
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r", "0": "\0"}
_OPERAND = re.compile(r'\s*"([=+&]*)([a-z])"\s*\((.*)\)\s*$', re.S)
_REGISTER_LETTERS = set("rhlfdn")


def split_top(text: str, sep: str) -> list[str]:
    """``text`` split at every ``sep`` outside brackets, string and character literals."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "\"'":  # skip the literal
            i += 1
            while i < len(text) and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def parse_statement(body: str) -> AsmStatement:
    """The text between ``asm volatile(`` and its closing parenthesis."""
    sections = split_top(body, ":")
    if not _LITERALS.fullmatch(sections[0]):
        raise NotEmulated("asm")
    template = "".join(_decode(m.group(1)) for m in _STRING.finditer(sections[0]))
    operands = []
    for index, section in enumerate(sections[1:3]):
        for text in split_top(section, ","):
            if not text.strip():
                continue
            m = _OPERAND.match(text)
            if not m or m.group(2) not in _REGISTER_LETTERS:
                raise NotEmulated(_first_instruction(template))
            operands.append(Operand(m.group(2), m.group(3).strip(), output=index == 0))
    return AsmStatement(template, tuple(operands))


def _decode(literal: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), literal)


def _instructions_of(template: str) -> list[str]:
    """The template's instructions, whitespace normalised (one ``{ }`` block around them, directives such
    as ``.reg`` and comments left out)."""
    text = re.sub(r"//[^\n]*", "", template).strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    found = [" ".join(p.split()) for p in text.split(";")]
    return [p for p in found if p and not p.startswith(".")]


def _first_instruction(template: str) -> str:
    found = _instructions_of(template)
    return found[0].split()[0] if found else "asm"


# ----- the call ---------------------------------------------------------------------------------------
def translate(body: str, line: int) -> str:
    """C++ that emulates the asm statement ``body`` (on kernel.cu line ``line``); raises NotEmulated."""
    stmt = parse_statement(body)
    found = _instructions_of(stmt.template)
    if not found:
        return "((void)0)"  # an empty template: a compiler barrier, nothing to run
    if len(found) > 1:
        raise NotEmulated(found[0].split()[0])
    mnemonic, _, rest = found[0].partition(" ")
    form = INSTRUCTIONS.get(mnemonic)
    if form is None:
        raise NotEmulated(mnemonic)
    words = [w.strip() for w in split_top(rest, ",")] if rest.strip() else []
    if not len(form.slots) - form.optional <= len(words) <= len(form.slots):
        raise NotEmulated(mnemonic)
    args = [f'"{mnemonic}"', str(line)]
    for (slot, count), word in zip(form.slots, words):
        args += _slot_args(stmt, slot, count, word, mnemonic)
    return f"kg_emu::ptx::{form.routine}({', '.join(args)})"


_INT = re.compile(r"^(0[xX][0-9a-fA-F]+|\d+)[uU]?$")
_REF = re.compile(r"^%(\d+)$")
_ADDR = re.compile(r"^\[\s*%(\d+)\s*(?:\+\s*(0[xX][0-9a-fA-F]+|\d+))?\s*\]$")


def _slot_args(stmt: AsmStatement, slot: Slot, count: int, word: str, mnemonic: str) -> list[str]:
    if slot is Slot.ADDR:
        m = _ADDR.match(word)
        if not m:
            raise NotEmulated(mnemonic)
        base = _source(stmt, int(m.group(1)), mnemonic)
        return [f"{base} + {int(m.group(2), 0)}ull" if m.group(2) else base]
    elements = [w.strip() for w in split_top(word[1:-1], ",")] if word.startswith("{") and word.endswith("}") else [word]
    if len(elements) != max(count, 1):
        raise NotEmulated(mnemonic)
    out = []
    for e in elements:
        ref, lit = _REF.match(e), _INT.match(e)
        if slot is Slot.DST:
            op = stmt.operands[int(ref.group(1))] if ref and int(ref.group(1)) < len(stmt.operands) else None
            if op is None or not op.output:
                raise NotEmulated(mnemonic)
            out.append(f"kg_emu::ptx::out<'{op.constraint}'>({op.expr})")
        elif lit:
            out.append(f"{int(lit.group(1), 0)}ull")
        elif ref:
            out.append(_source(stmt, int(ref.group(1)), mnemonic))
        else:
            raise NotEmulated(mnemonic)
    return out


def _source(stmt: AsmStatement, index: int, mnemonic: str) -> str:
    if index >= len(stmt.operands):
        raise NotEmulated(mnemonic)
    op = stmt.operands[index]
    return f"kg_emu::ptx::in<'{op.constraint}'>({op.expr})"


# ----- the instructions that are not emulated ------------------------------------------------------------
def not_emulated_call(mnemonic: str, line: int) -> str:
    """A call of an undefined function that names ``mnemonic`` and the line (the link fails if it is emitted)."""
    name = f"{NOT_EMULATED_SYMBOL}{line}__{_encode(mnemonic)}{_SYMBOL_END}"
    return f"do {{ extern void {name}(); {name}(); }} while (0)"


def not_emulated(log: str) -> tuple[int, str] | None:
    """(line, instruction) of the first not-emulated asm statement a linker ``log`` reports."""
    m = re.search(rf"{NOT_EMULATED_SYMBOL}(\d+)__(\w+?){_SYMBOL_END}", log)
    return (int(m.group(1)), _decode_name(m.group(2))) if m else None


_CODES = {"_": "u", ".": "d", ":": "c"}


def _encode(name: str) -> str:
    """``name`` as an identifier that never holds ``__`` (``_`` is the escape: ``_d`` a dot ...)."""
    return "".join(c if c.isascii() and c.isalnum() else f"_{_CODES[c]}" if c in _CODES else f"_x{ord(c) & 0xff:02x}" for c in name)


def _decode_name(encoded: str) -> str:
    back = {v: k for k, v in _CODES.items()}
    return re.sub(r"_(x[0-9a-f]{2}|[udc])", lambda m: back.get(m.group(1)) or chr(int(m.group(1)[1:], 16)), encoded)
