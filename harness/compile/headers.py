"""Headers for NVRTC: the CUDA include directories and kerngen's tiny prelude.

NVRTC 13.0 ships no ``cuda_fp16.h`` / ``cuda_bf16.h`` / ``mma.h`` / ``cuda/std`` headers of its
own. They come from the CUDA 13.0 wheels (version-matched to NVRTC, so they never use a feature
that this NVRTC lacks), found through ``cuda.pathfinder``:

- ``nvidia-cuda-runtime==13.0.*``: ``cuda_fp16.h``, ``cuda_bf16.h``, ``cuda_fp8.h``,
  ``vector_types.h``, ``cooperative_groups.h``, ``mma.h`` (front), ``math_constants.h`` ...
- ``nvidia-cuda-crt==13.0.*``: ``crt/mma.h`` and the rest of ``crt/`` (``mma.h`` needs it).
- ``nvidia-cuda-cccl==13.0.*``: ``cuda/std/...``, ``nv/target`` (``cooperative_groups.h``,
  ``cuda/barrier``, ``cuda/pipeline`` need it).

Where a wheel is missing, ``cuda.pathfinder`` falls back to ``CUDA_PATH`` / ``CUDA_HOME`` and the
system toolkit; :func:`include_dirs` finally tries ``/usr/local/cuda/include`` itself.

NVRTC never reads them from disk: :func:`virtual_headers` is every header a kernel may include
(:data:`~.source_policy.ALLOWED_HEADERS`, ``cuda/std/*``) and every header those include, read once
and handed to NVRTC in memory under the name each ``#include`` spells it with. The compile worker
gets no include directory and cannot open any file (:mod:`.sandbox`), so an include of anything
else fails with "cannot open source file", whatever the source policy let through.

The prelude (``kerngen_prelude.h``) is handed to NVRTC as an in-memory header and force-included
with ``--pre-include``, so the candidate's own line numbers in the log stay exact. It defines,
each only where not yet defined, the few macros that NVRTC lacks without the C headers:
``INFINITY``, ``NAN``, ``HUGE_VALF``, ``FLT_*``/``DBL_*`` limits, ``INT_MAX`` and friends and the
``M_*`` constants. Tiny stand-ins for ``<math.h>``, ``<cmath>``, ``<float.h>``, ``<cfloat>``,
``<limits.h>``, ``<climits>``, ``<stdint.h>``, ``<cstdint>``, ``<assert.h>`` and ``<cassert>``
make an ``#include`` of them harmless (NVRTC has the math functions and ``assert`` built in).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from pathlib import Path

from kerngen.harness.compile.source_policy import ALLOWED_HEADERS

log = logging.getLogger("kerngen.headers")

PRELUDE_NAME = "kerngen_prelude.h"

PRELUDE = r"""// kerngen prelude: force-included by the harness (NVRTC has no C headers)
// (integer limits spelled token for token as CCCL spells them, so its <cuda/std/climits> may redefine them)
#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef HUGE_VAL
#define HUGE_VAL __longlong_as_double(0x7ff0000000000000LL)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38F
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.175494351e-38F
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 1.192092896e-07F
#endif
#ifndef DBL_MAX
#define DBL_MAX 1.7976931348623158e+308
#endif
#ifndef DBL_MIN
#define DBL_MIN 2.2250738585072014e-308
#endif
#ifndef DBL_EPSILON
#define DBL_EPSILON 2.2204460492503131e-016
#endif
#ifndef CHAR_BIT
#define CHAR_BIT 8
#endif
#ifndef INT_MAX
#define INT_MAX 0x7fffffff
#endif
#ifndef INT_MIN
#define INT_MIN (-INT_MAX - 1)
#endif
#ifndef UINT_MAX
#define UINT_MAX 0xffffffff
#endif
#ifndef LLONG_MAX
#define LLONG_MAX 0x7fffffffffffffffLL
#endif
#ifndef LLONG_MIN
#define LLONG_MIN (-LLONG_MAX - 1)
#endif
#ifndef ULLONG_MAX
#define ULLONG_MAX 0xffffffffffffffffUL
#endif
#ifndef M_E
#define M_E 2.71828182845904523536
#endif
#ifndef M_LOG2E
#define M_LOG2E 1.44269504088896340736
#endif
#ifndef M_LOG10E
#define M_LOG10E 0.434294481903251827651
#endif
#ifndef M_LN2
#define M_LN2 0.693147180559945309417
#endif
#ifndef M_LN10
#define M_LN10 2.30258509299404568402
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#ifndef M_PI_2
#define M_PI_2 1.57079632679489661923
#endif
#ifndef M_PI_4
#define M_PI_4 0.785398163397448309616
#endif
#ifndef M_1_PI
#define M_1_PI 0.318309886183790671538
#endif
#ifndef M_2_PI
#define M_2_PI 0.636619772367581343076
#endif
#ifndef M_2_SQRTPI
#define M_2_SQRTPI 1.12837916709551257390
#endif
#ifndef M_SQRT2
#define M_SQRT2 1.41421356237309504880
#endif
#ifndef M_SQRT1_2
#define M_SQRT1_2 0.707106781186547524401
#endif
"""

_STDINT = r"""#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;  // as CCCL's <cuda/std/cstdint> has them
typedef unsigned long long uintptr_t;
#ifndef INT8_MAX
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 0xffffffffU
#define UINT64_MAX 0xffffffffffffffffULL
#endif
"""

_CSTDINT = (
    _STDINT
    + "namespace std { using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;"
    " using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t;"
    " using ::intptr_t; using ::uintptr_t; }\n"
)

_EMPTY = f'#pragma once\n#include "{PRELUDE_NAME}"\n'

# name -> text of the in-memory headers handed to every NVRTC program
BUILTIN_HEADERS: dict[str, str] = {
    PRELUDE_NAME: PRELUDE,
    "stdint.h": _STDINT,
    "cstdint": _CSTDINT,
    **{name: _EMPTY for name in ("math.h", "cmath", "float.h", "cfloat", "limits.h", "climits", "assert.h", "cassert")},
}

# files whose content identifies the headers in use (their versions enter the cache key)
_SENTINELS = (
    "cuda_runtime_api.h",
    "cuda_fp16.hpp",
    "cuda_bf16.hpp",
    "crt/mma.hpp",
    "cuda/std/__cccl/version.h",
)


def _locate(libname: str) -> str | None:
    try:
        from cuda.pathfinder import locate_nvidia_header_directory
    except ImportError:  # very old cuda-pathfinder / none
        return None
    try:
        found = locate_nvidia_header_directory(libname)
    except Exception:  # noqa: BLE001 - an unknown name or a failed probe means "not found"
        return None
    return found.abs_path if found is not None else None


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where the CUDA headers are (the runtime's: ``cuda_bf16.h``, then CCCL), searched in this order.

    Empty when nothing is found (a kernel including ``cuda_bf16.h`` then fails to compile with
    NVRTC's own "cannot open source file" message)."""
    dirs: list[str] = []
    for lib, probe in (("cudart", "cuda_fp16.h"), ("cccl", "cuda/std/version")):
        path = _locate(lib)
        if path and (Path(path) / probe).is_file():
            dirs.append(path)
    if not any((Path(d) / "cuda_fp16.h").is_file() for d in dirs):
        system = Path("/usr/local/cuda/include")
        if (system / "cuda_fp16.h").is_file():
            dirs.insert(0, str(system))
            if (system / "cccl" / "cuda/std/version").is_file() and not any(
                (Path(d) / "cuda/std/version").is_file() for d in dirs
            ):
                dirs.append(str(system / "cccl"))
    # a wheel set without nvidia-cuda-crt (seen on a GPU host) has no crt/mma.hpp: take crt/ from
    # the system toolkit, searched after the wheels
    system = Path("/usr/local/cuda/include")
    if not any((Path(d) / "crt/mma.hpp").is_file() for d in dirs) and (system / "crt/mma.hpp").is_file():
        dirs.append(str(system))
    out: list[str] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return tuple(out)


# an #include in a CUDA header (trusted text: the installed wheels'); computed includes (thrust's)
# are outside the closure of what a kernel may include
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)


def _roots() -> list[str]:
    names = [n for n in ALLOWED_HEADERS if n not in BUILTIN_HEADERS]
    for d in include_dirs():
        std = Path(d) / "cuda" / "std"
        if std.is_dir():
            names += sorted(f"cuda/std/{p.name}" for p in std.iterdir()
                            if p.is_file() and re.fullmatch(r"[a-z_]+", p.name))
    return list(dict.fromkeys(names))


@functools.cache
def virtual_headers() -> dict[str, bytes]:
    """name -> content of every header NVRTC may open: kerngen's in-memory headers, and the
    allowed CUDA headers with everything they include (an over-approximation: an include inside
    an ``#if`` is followed too). A quoted include is resolved beside its includer first, then in
    the include directories, as NVRTC would; NVRTC matches an in-memory header by the name as
    written, so one spelling must mean one file (a second meaning is left out and logged)."""
    dirs = [Path(d) for d in include_dirs()]
    out: dict[str, bytes] = {name: text.encode() for name, text in BUILTIN_HEADERS.items()}
    where: dict[str, Path] = {}

    def resolve(name: str, quoted: bool, includer: Path | None) -> Path | None:
        cands = ([includer.parent / name] if quoted and includer is not None else []) + [d / name for d in dirs]
        return next((c.resolve() for c in cands if c.is_file()), None)

    todo: list[tuple[str, Path]] = []
    for name in _roots():
        found = resolve(name, False, None)
        if found is not None:
            todo.append((name, found))
    content: dict[Path, bytes] = {}
    while todo:
        name, path = todo.pop()
        if name in BUILTIN_HEADERS:
            continue
        if name in where and where[name] != path:
            log.warning("header name %s means both %s and %s; the first is kept", name, where[name], path)
            continue
        where[name] = path
        if path in content:
            out[name] = content[path]
            continue
        data = content[path] = out[name] = path.read_bytes()
        for quote, inc in _INCLUDE.findall(data):
            spelled = inc.decode("utf-8", "replace").strip()
            found = resolve(spelled, quote == b'"', path)
            if found is not None:
                todo.append((spelled, found))
    return out


@functools.cache
def fingerprint() -> str:
    """Hash of every header NVRTC may open (:func:`virtual_headers`: the prelude, the stand-ins
    and the CUDA headers, by content, not by path: a cache stays valid across machines with the
    same wheels)."""
    h = hashlib.sha256()
    for name, data in sorted(virtual_headers().items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()
