"""A whole model as data: :class:`ModelPlan`, the problem's forward as ordered steps, each a kernel step (one
region's :class:`~kerngen.harness.spec.spec.KernelSpec` at one configuration, its tensors bound by name to the
plan's values) or an ATen step (one node of the problem's own traced graph, by its name there, run as its ATen op,
resolved only through :data:`.aten.ALLOWED`). No Python from a model, a folder or an LLM is in a plan.

Values are named as the problem's graph names them: the forward's inputs by argument name, parameters and
buffers by their state names, every node by its name (``conv2d_3``, ``permute``), one-element constants by
their placeholder names. An ATen step's arguments are JSON (:data:`Arg`): a tensor is ``{"ref": name}``, a dtype
``{"dtype": "float32"}``, the run's device ``{"device": "run"}``, a layout or memory format by name, a non-finite
float ``{"float": "inf"}``; numbers, booleans, strings, None and lists as themselves.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, field_validator

from kerngen.harness.model.aten import ALLOWED, PlanError
from kerngen.harness.spec.spec import Dtype, KernelSpec

__all__ = ["AtenStep", "KernelStep", "ModelPlan", "PlanTensor", "arg_refs", "decode_arg", "encode_literal"]

MAX_STEPS = 4096
MAX_ARG_DEPTH = 4
_LAYOUTS = ("strided",)
_FORMATS = ("contiguous_format", "channels_last", "preserve_format", "channels_last_3d")
_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanTensor(_Model):
    name: str
    shape: tuple[int, ...]
    dtype: Dtype


class KernelStep(_Model):
    """Region ``region`` of the partition as one kernel: ``spec`` at ``config``, its tensor names bound to plan
    values (``bindings[spec name] = value name``; ``out`` is the step's output ``out``, a fresh tensor)."""

    kind: Literal["kernel"] = "kernel"
    region: int
    family: str
    variant: str
    nodes: list[str]  # the problem graph's nodes it computes
    spec: KernelSpec
    config: dict[str, int]
    sizes: dict[str, int | float] = {}
    bindings: dict[str, str]
    out: PlanTensor  # named by the node whose value it is


class AtenStep(_Model):
    """Node ``node`` of the problem's graph run as ``torch.ops.aten.<op>.<overload>`` (``getitem``: an item of
    an earlier tuple value), its value named ``node``; ``why``: why no kernel computes it."""

    kind: Literal["aten"] = "aten"
    node: str
    op: str
    overload: str
    args: dict[str, Any]
    region: int | None = None  # the partition's region it belongs to (None: a view between regions)
    why: str = ""

    @field_validator("op")
    @classmethod
    def _allowed(cls, op: str) -> str:
        if op not in ALLOWED:
            raise ValueError(f"ATen op {op!r} is not one a model plan may run")
        return op

    @field_validator("args")
    @classmethod
    def _json(cls, args: dict[str, Any]) -> dict[str, Any]:
        for v in args.values():
            _check_arg(v, 0)
        return args


Step = Annotated[Union[KernelStep, AtenStep], Discriminator("kind")]


class ModelPlan(_Model):
    """The problem's forward as steps in graph order; ``output`` names the value it returns."""

    problem: str  # the problem's label (its file), for messages
    problem_sha256: str = ""
    inputs: list[PlanTensor]
    params: list[PlanTensor]
    constants: dict[str, float] = {}
    steps: list[Step] = Field(max_length=MAX_STEPS)
    output: str

    @property
    def kernel_steps(self) -> list[KernelStep]:
        return [s for s in self.steps if isinstance(s, KernelStep)]

    @property
    def aten_steps(self) -> list[AtenStep]:
        return [s for s in self.steps if isinstance(s, AtenStep)]

    def with_kernel(self, region: int, step: KernelStep) -> "ModelPlan":
        """The plan with region ``region``'s kernel step replaced by ``step``."""
        steps = [step if isinstance(s, KernelStep) and s.region == region else s for s in self.steps]
        return self.model_copy(update={"steps": steps})

    def validate(self) -> None:
        """Everything a plan from a folder must hold before anything runs it: every name read is made before it
        (:meth:`check_names`), every ATen op resolves to an allowed functional overload (PlanError naming the
        first that does not)."""
        from kerngen.harness.model.aten import GETITEM, resolve_op

        self.check_names()
        for i, s in enumerate(self.steps):
            if isinstance(s, AtenStep) and s.op != GETITEM:
                try:
                    resolve_op(s.op, s.overload)
                except PlanError as exc:
                    raise PlanError(f"step {i} ({s.node}): {exc}") from None

    def check_names(self) -> None:
        """Every value a step reads is made before it (PlanError naming the first that is not)."""
        known = {t.name for t in (*self.inputs, *self.params)} | set(self.constants)
        for i, s in enumerate(self.steps):
            reads = list(s.bindings.values()) if isinstance(s, KernelStep) else arg_refs(s.args)
            missing = next((r for r in reads if r not in known), None)
            if missing is not None:
                raise PlanError(f"step {i} reads {missing!r} before any step makes it")
            known.add(s.out.name if isinstance(s, KernelStep) else s.node)
        if self.output not in known:
            raise PlanError(f"the plan's output {self.output!r} is made by no step")


def arg_refs(args: dict[str, Any]) -> list[str]:
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict) and "ref" in v:
            out.append(v["ref"])
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for v in args.values():
        walk(v)
    return out


def _check_arg(v: Any, depth: int) -> None:
    if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)):
        return
    if isinstance(v, list) and depth < MAX_ARG_DEPTH:
        for x in v:
            _check_arg(x, depth + 1)
        return
    if isinstance(v, dict) and len(v) == 1:
        (key, value), = v.items()
        ok = {"ref": lambda x: isinstance(x, str), "dtype": lambda x: x in Dtype.__args__,
              "device": lambda x: x == "run", "layout": lambda x: x in _LAYOUTS,
              "memory_format": lambda x: x in _FORMATS, "float": lambda x: x in _FLOATS}
        if key in ok and ok[key](value):
            return
    raise ValueError(f"an ATen step's argument {str(v)[:80]!r} is none a plan may hold")


def encode_literal(v: Any) -> Any:
    """A traced node's non-tensor argument as plan JSON (a tensor operand is encoded by the caller as
    ``{"ref": name}``); ValueError for anything a plan cannot hold."""
    import torch

    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": "run"}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, (list, tuple)):
        return [encode_literal(x) for x in v]
    raise ValueError(f"argument of type {type(v).__name__} cannot be held by a model plan")


def decode_arg(v: Any, env: dict[str, Any], device: Any) -> Any:
    """A plan argument as the ATen op takes it (tensors looked up in ``env``)."""
    import torch

    if isinstance(v, list):
        return [decode_arg(x, env, device) for x in v]
    if not isinstance(v, dict):
        return v
    (key, value), = v.items()
    if key == "ref":
        if value not in env:
            raise PlanError(f"the plan reads {value!r} before any step makes it")
        return env[value]
    if key == "dtype":
        return getattr(torch, value)
    if key == "device":
        return device
    if key == "layout":
        return torch.strided
    if key == "memory_format":
        return getattr(torch, value)
    return _FLOATS[value]
