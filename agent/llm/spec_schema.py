"""The kernel spec's JSON schema as a prompt (or ``response_format``) carries it: once, and trimmed
to what the problem can use.

``KernelSpec.model_json_schema()`` is about 7.8 KB, a third of it the TMA descriptor argument
(``TensorMapArg``: how the harness maps a tensor for ``cp.async.bulk.tensor``). Here every
``title`` goes (pydantic's echo of the field names), so do the descriptions of the launch plan's
parts (the system prompt explains them in prose, with an example; the TMA argument keeps its
own: nothing else says how the tensor is mapped), and the TMA argument with ``arch_specific``
goes unless the GPU has TMA (sm_90 and later) and the problem is one that tensor-core pipelines
serve: compute-bound, or of 16-bit floats. The schema a model is shown is the one its answer is
validated against only in what it leaves out: an answer that uses a field left out is still read
(the parser validates against the full model), it was just not suggested.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from kerngen.agent.llm.prompting import arch_limits
from kerngen.agent.proposer import SearchContext
from kerngen.harness.spec.spec import KernelSpec

_TMA_DEF = "TensorMapArg"
_TMA_FIELDS = ("arch_specific",)
_HALF = {"bfloat16", "float16", "torch.bfloat16", "torch.float16", "bf16", "fp16"}


def tma_usable(ctx: SearchContext) -> bool:
    """Whether the TMA descriptor argument and ``arch_specific`` are worth the model's attention."""
    limits = arch_limits(ctx.gpu.arch)
    if not limits or not limits["tma"]:
        return False
    compute_bound = ctx.baseline is not None and ctx.baseline.floor_bound == "compute"
    return compute_bound or any(str(d) in _HALF for d in ctx.dtypes.values())


@functools.cache
def _schema(tma: bool) -> str:
    schema = _drop_titles(KernelSpec.model_json_schema())
    for name, definition in schema["$defs"].items():  # the launch plan's parts: the system prompt's prose explains them
        if name == _TMA_DEF:
            continue
        definition.pop("description", None)
        for prop in definition.get("properties", {}).values():
            prop.pop("description", None)
    if not tma:
        schema["$defs"].pop(_TMA_DEF, None)
        for name in _TMA_FIELDS:
            schema["properties"].pop(name, None)
        schema = _drop_refs(schema, f"#/$defs/{_TMA_DEF}")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def spec_schema(ctx: SearchContext) -> dict[str, Any]:
    """The trimmed schema for ``ctx``'s problem and GPU (a fresh copy)."""
    return json.loads(_schema(tma_usable(ctx)))


def spec_schema_text(ctx: SearchContext) -> str:
    """The same, as compact JSON text (what a prompt shows)."""
    return _schema(tma_usable(ctx))


@functools.cache
def _lean(model_cls: type) -> str:
    return json.dumps(_drop_titles(model_cls.model_json_schema()), separators=(",", ":"))


def lean_schema(model_cls: type) -> dict[str, Any]:
    """``model_cls``'s JSON schema without pydantic's titles (a fresh copy)."""
    return json.loads(_lean(model_cls))


def _drop_titles(node: Any) -> Any:
    if isinstance(node, dict):
        # "title" as pydantic's echo of a name; a property NAMED title would be under "properties"
        return {k: _drop_titles(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_drop_titles(v) for v in node]
    return node


def _drop_refs(node: Any, ref: str) -> Any:
    """``node`` without the alternatives (``oneOf``/``anyOf`` members) that point to ``ref``."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in ("oneOf", "anyOf") and isinstance(v, list):
                v = [m for m in v if not (isinstance(m, dict) and m.get("$ref") == ref)]
            out[k] = _drop_refs(v, ref)
        return out
    if isinstance(node, list):
        return [_drop_refs(v, ref) for v in node]
    return node


__all__ = ["lean_schema", "spec_schema", "spec_schema_text", "tma_usable"]
