"""Rendering the prompt templates of ``prompts/`` (package ``kerngen.prompts``).

Templates are loaded with :mod:`importlib.resources` (they are package data) and rendered with
``StrictUndefined``: a variable a template uses and the caller did not pass is an error, never an
empty string in a prompt. Filters: ``json`` (pretty JSON, not HTML-escaped like jinja's
``tojson``), ``ms`` (a time), ``num`` (a large count with thousands separators), ``trim_log``
(head and tail of a long compile log), ``plan`` (a spec's JSON without its source).
"""

from __future__ import annotations

import functools
import json
import math
import re
from importlib import resources
from typing import Any

import jinja2
from pydantic import BaseModel

TEMPLATES = ("system", "ideas", "implement", "repair", "repair_answer")
LOG_LIMIT = 4000  # characters of a compile / runtime log a prompt shows


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
    env.filters["plan"] = _plan
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
    """A kernel spec as JSON without its ``source`` (which a prompt shows as a code block)."""
    data = spec.model_dump(mode="json", exclude={"source"})
    lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in data.items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def _num(value: float | int | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3g}"
    return f"{int(value):,}"


def trim_log(text: str | None, limit: int = LOG_LIMIT) -> str:
    """A log cut to ``limit`` characters: its first error lines, then the head and the tail."""
    text = (text or "").strip()
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    errors = [l for l in lines if "error" in l.lower()][:20]
    head_budget = limit // 2
    head = "\n".join(errors) if errors else text[:head_budget]
    head = head[:head_budget]
    tail = text[-(limit - len(head) - 60) :]
    return f"{head}\n... [{len(text) - len(head) - len(tail)} characters cut] ...\n{tail}"


__all__ = ["LOG_LIMIT", "TEMPLATES", "render", "trim_log"]
