"""Rendering the prompt templates of ``prompts/`` (package ``kerngen.prompts``).

Templates are loaded with :mod:`importlib.resources` (they are package data) and rendered with
``StrictUndefined``: a variable a template uses and the caller did not pass is an error, never an
empty string in a prompt. Filters: ``json`` (pretty JSON, not HTML-escaped like jinja's
``tojson``), ``ms`` (a time), ``num`` (a large count with thousands separators), ``trim_log``
(the error lines, head and tail of a long compile log), ``clip`` (head and tail of a long
source), ``plan`` (a spec's JSON without its source), ``shown_source`` (a spec's source with the
repeated variants of a helper folded: :mod:`.source_fold`). Every cut and fold says truly how much
it left out.

What the prompts state besides the problem's own facts is computed here: the limits of the GPU's
architecture that no device query gave (:func:`arch_limits`), the bound of a 3xTF32 kernel beside
the FFMA floor (:func:`fp32_bounds`), and the reference source without kerngen's loader metadata
(:func:`reference_source`).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import threading
from importlib import resources
from typing import Any

import jinja2
from pydantic import BaseModel

from kerngen import expr
from kerngen.agent.llm.source_fold import FOLD_MARK, fold_repeats
from kerngen.errors import ExprError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import build_env

TEMPLATES = ("system", "ideas", "implement", "repair", "repair_answer", "region")
LOG_LIMIT = 4000  # characters of a compile / runtime log a prompt shows
SOURCE_LIMIT = 24_000  # characters of one source a prompt shows (a kernel spec's is a few thousand)


_BLANK_RUNS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


def render(name: str, **variables: Any) -> str:
    """Render ``prompts/<name>.j2`` (``name`` with or without ``.j2``)."""
    file = name if name.endswith(".j2") else f"{name}.j2"
    text = _env().get_template(file).render(**variables)
    return _BLANK_RUNS.sub("\n\n", text).strip() + "\n"


@functools.cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["json"] = _json
    env.filters["ms"] = _ms
    env.filters["num"] = _num
    env.filters["trim_log"] = trim_log
    env.filters["clip"] = clip
    env.filters["plan"] = _plan
    env.filters["shown_source"] = shown_source
    env.globals["FOLD_MARK"] = FOLD_MARK
    return env


def _load(file: str) -> str:
    path = resources.files("kerngen.prompts").joinpath(file)
    if not path.is_file():
        raise jinja2.TemplateNotFound(file)
    return path.read_text(encoding="utf-8")


def _json(value: Any, indent: int | None = 2) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=False)
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.4g} ms"


def _plan(spec: BaseModel) -> str:
    """A kernel spec as JSON without its ``source`` (which a prompt shows as a code block) and
    without the fields left at their defaults (``"op": "launch"``, empty lists, ...)."""
    data = spec.model_dump(mode="json", exclude={"source"}, exclude_defaults=True)
    lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in data.items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def shown_source(spec: Any, config: dict[str, int] | None = None, ctx: Any = None) -> str:
    """A spec's source as a prompt shows it: repeated variants of a helper folded
    (:mod:`.source_fold`); in full the one ``config`` (over the spec's defaults: a kernel under
    repair, the configuration that failed; with ``ctx``, the defines its sizes give too) selects,
    else (None: a kernel to improve) the shortest."""
    if spec is None:
        return ""
    values = None if config is None else {**spec.default_config(), **config}
    if values is not None and ctx is not None:
        env = build_env(ctx.sizes, {n: TensorFacts(tuple(s)) for n, s in ctx.tensors.items()}, values)
        for name, text in spec.defines.items():
            try:
                values.setdefault(name, int(expr.evaluate(text, env)))
            except (ExprError, ValueError, OverflowError):  # a define of the model's that does not resolve
                continue
    return fold_repeats((spec.source or "").strip(), values)


def _num(value: float | int | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3g}"
    return f"{int(value):,}"


def trim_log(text: str | None, limit: int = LOG_LIMIT) -> str:
    """A log cut to about ``limit`` characters: its first error lines, then its tail, with how
    many characters of the log are not shown."""
    text = (text or "").strip()
    if len(text) <= limit:
        return text
    errors = [line for line in text.splitlines() if "error" in line.lower()][:20]
    head = "\n".join(errors)[: limit // 2] if errors else text[: limit // 2]
    tail = text[-max(0, limit - len(head) - 80):]
    shown = len(tail) + (len(head) if not errors else 0)  # error lines are excerpts, the rest is cut
    return (f"{head}\n... [{len(text) - shown:,} of {len(text):,} characters cut"
            f"{'; the error lines above are taken from them' if errors else ''}] ...\n{tail}")


def clip(text: str | None, limit: int = SOURCE_LIMIT) -> str:
    """``text`` cut to its first and last ``limit / 2`` characters (at line ends where near),
    with how many characters were cut between them."""
    text = text or ""
    if len(text) <= limit:
        return text
    head_end = text.rfind("\n", 0, limit // 2)
    head_end = head_end if head_end > limit // 4 else limit // 2
    tail_start = text.find("\n", len(text) - limit // 2)
    tail_start = tail_start + 1 if 0 <= tail_start < len(text) - limit // 4 else len(text) - limit // 2
    return f"{text[:head_end]}\n/* ... {tail_start - head_end:,} of {len(text):,} characters cut ... */\n{text[tail_start:]}"


# kerngen's own lines in a built-in problem file: for the loader (problems/load.py), not the model
_LOADER_NAMES = {"SHAPE_NAMES", "SHAPE_DOC", "SHAPE_ARITY", "KERNGEN_META"}
_LOADER_FUNCTIONS = {"shape_of_inputs"}  # an exported op's fallback at another shape
_LOADER_COMMENT = re.compile(r"^\s*#\s*kerngen built-in\b.*$", re.M)


_PARSE = threading.Lock()  # CPython 3.11's parser is not safe in several threads at once (questions run in threads)


@functools.lru_cache(maxsize=32)
def reference_source(text: str) -> str:
    """The problem's Python source without kerngen's loader metadata (``KERNGEN_META``,
    ``SHAPE_NAMES``, ``SHAPE_DOC``, ``SHAPE_ARITY``, ``shape_of_inputs`` and the built-in marker
    comment); as is when it does not parse."""
    try:
        with _PARSE:
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text
    drop: set[int] = set()
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        loader = isinstance(node, ast.Assign) and names and all(n in _LOADER_NAMES for n in names)
        if loader or (isinstance(node, ast.FunctionDef) and node.name in _LOADER_FUNCTIONS):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            drop.update(range(first, (node.end_lineno or node.lineno) + 1))
    if not drop:
        return _LOADER_COMMENT.sub("", text)
    kept = [line for i, line in enumerate(text.splitlines(), 1) if i not in drop]
    return _LOADER_COMMENT.sub("", "\n".join(kept))


# what no device query gave: per compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability")
_ARCH_LIMITS = {  # major.minor -> (resident blocks, warps, threads per SM)
    (7, 0): (32, 64, 2048), (7, 5): (16, 32, 1024), (8, 0): (32, 64, 2048), (8, 6): (16, 48, 1536),
    (8, 7): (16, 48, 1536), (8, 9): (24, 48, 1536), (9, 0): (32, 64, 2048), (10, 0): (32, 64, 2048),
    (12, 0): (32, 48, 1536),
}


def arch_limits(arch: str) -> dict[str, Any] | None:
    """The per-thread and per-SM limits of ``arch`` (``sm_90``, ``sm_90a``) and whether thread
    block clusters exist there; None for an architecture not in the table."""
    m = re.fullmatch(r"sm_(\d+?)(\d)a?", arch.strip())
    if not m:
        return None
    cc = (int(m.group(1)), int(m.group(2)))
    if cc not in _ARCH_LIMITS:
        return None
    blocks, warps, threads = _ARCH_LIMITS[cc]
    return {"regs_per_thread": 255, "warp": 32, "blocks_per_sm": blocks, "warps_per_sm": warps,
            "threads_per_sm": threads, "clusters": cc[0] >= 9, "tma": cc[0] >= 9}


def fp32_bounds(flops: float | None, min_bytes: int | None, gpu: Any) -> dict[str, float] | None:
    """For an fp32 problem with a FLOP count: the bound in ms at the FFMA rate, that of a 3xTF32
    kernel on the tensor cores (three TF32 products per fp32 one, TF32 at half the bf16 rate as on
    A100/H100/L40S) and that of a 1xTF32 one (admissible at ``--precision tf32``), each no lower
    than the memory term; None without the rates."""
    fp32, bf16, gbps = getattr(gpu, "fp32_tflops", None), getattr(gpu, "bf16_tflops", None), getattr(gpu, "copy_gbps", None)
    if not flops or flops <= 0 or not fp32 or not bf16:
        return None
    mem = (min_bytes / (gbps * 1e9) * 1e3) if (min_bytes and gbps) else 0.0
    tf32 = bf16 / 2
    return {"ffma_ms": max(mem, flops / (fp32 * 1e12) * 1e3), "ffma_tflops": fp32,
            "tf32x3_ms": max(mem, flops / (tf32 / 3 * 1e12) * 1e3), "tf32x3_tflops": tf32 / 3,
            "tf32_ms": max(mem, flops / (tf32 * 1e12) * 1e3), "tf32_tflops": tf32}


__all__ = ["LOG_LIMIT", "SOURCE_LIMIT", "TEMPLATES", "arch_limits", "clip", "fp32_bounds", "reference_source",
           "render", "trim_log"]
