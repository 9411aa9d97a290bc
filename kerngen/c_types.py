"""Sizes in bytes of the C/CUDA types a kernel's shared memory is made of, and ``sizeof(T)`` in an
expression's text replaced by them (:mod:`kerngen.expr` parses what is left)."""

from __future__ import annotations

import re

from kerngen.errors import ExprError

__all__ = ["SIZEOF", "sizeof_replaced"]

# sizeof(T) of the C/CUDA types a kernel's shared memory is made of (LP64, as NVRTC compiles)
SIZEOF: dict[str, int] = {
    **dict.fromkeys(("char", "signed char", "unsigned char", "bool", "int8_t", "uint8_t", "char1", "uchar1"), 1),
    **dict.fromkeys(("short", "short int", "unsigned short", "unsigned short int", "int16_t", "uint16_t", "half",
                     "__half", "bfloat16", "__nv_bfloat16", "nv_bfloat16", "char2", "uchar2", "short1",
                     "ushort1"), 2),
    **dict.fromkeys(("int", "signed", "signed int", "unsigned", "unsigned int", "int32_t", "uint32_t", "float",
                     "half2", "__half2", "__nv_bfloat162", "nv_bfloat162", "char4", "uchar4", "short2", "ushort2",
                     "int1", "uint1", "float1"), 4),
    **dict.fromkeys(("long", "long int", "unsigned long", "unsigned long int", "long long", "long long int",
                     "unsigned long long", "unsigned long long int", "int64_t", "uint64_t", "size_t", "ptrdiff_t",
                     "double", "float2", "int2", "uint2", "short4", "ushort4", "longlong1", "ulonglong1",
                     "double1"), 8),
    **dict.fromkeys(("float3", "int3", "uint3"), 12),
    **dict.fromkeys(("float4", "int4", "uint4", "double2", "longlong2", "ulonglong2"), 16),
    **dict.fromkeys(("double3",), 24),
    **dict.fromkeys(("double4", "longlong4", "ulonglong4"), 32),
}
_SIZEOF_SHOWN = ", ".join(("float", "double", "half", "__half", "__nv_bfloat16", "int", "unsigned", "long long",
                            "int64_t", "char", "short", "float2", "float4", "int4", "T*"))
_POINTER_BYTES = 8
_QUALIFIERS = {"const", "volatile", "__restrict__"}
# the argument of sizeof up to its closing parenthesis; [^()]* cannot backtrack quadratically
_SIZEOF = re.compile(r"\bsizeof\s*\(([^()]*)\)")


def sizeof_replaced(text: str, quoted: str) -> str:
    """``text`` with each ``sizeof(T)`` replaced by the size of ``T`` in bytes (linear); ``quoted``:
    the expression as an error message shows it."""
    if "sizeof" not in text:
        return text

    def size(match: re.Match[str]) -> str:
        words = [w for w in match.group(1).replace("*", " * ").split() if w not in _QUALIFIERS]
        if words and words[-1] == "*":
            return str(_POINTER_BYTES)  # sizeof(float*) and the like
        name = " ".join(words)
        if name not in SIZEOF:
            raise ExprError(f"unknown type {name!r:.80} in sizeof in {quoted} (known: {_SIZEOF_SHOWN}, ...)")
        return str(SIZEOF[name])

    return _SIZEOF.sub(size, text)
