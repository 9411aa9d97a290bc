"""The kernel spec: a candidate as data (CUDA-C source, tunables, a declarative launch plan).

No host code from a candidate ever runs: the harness reads this model, compiles ``source`` with NVRTC and performs
the ``steps`` itself. Grid, block, shared memory, scratch sizes, scalar arguments and ``defines`` are expressions
(:mod:`kerngen.expr`) over the problem's sizes, its tensors' shapes and the tunables.

A spec comes from a model's answer, so everything in it is bounded (see the ``MAX_*`` constants): the source
(:data:`MAX_SOURCE_BYTES`, 1 MB), the number of tunables and of their values, of steps, arguments, defines,
constraints and scratch buffers, and every integer. Whatever a text provokes while it is read (bad JSON or YAML, a
number of more than 4,300 digits, nesting too deep for the parser) is a :class:`SpecError` with one line.

What models write loosely but unambiguously is read as meant (``mode="before"`` validators): a ``grid`` or ``block``
of one expression (``"grid": "x.shape[0]"``) is a list of one; a tunable of one value (``"BLOCK": 256``) is a list
of one, its values may be numeric strings or constant integer expressions (``"128"``, ``"2*64"``, read with
:mod:`kerngen.expr` over no names), and a tunable written ``{"values": [...], "default": v}`` gives its default to
``defaults``; a default may be such a string too. Anything else is refused with the field and the value named
(``tunables.BLOCK: values must be integers, got '256 threads'``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from kerngen import expr
from kerngen.errors import SpecError

DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"]
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TENSOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
Expr = Union[str, int]

MAX_SOURCE_BYTES = 1_000_000  # CUDA source, UTF-8 (the largest shipped kernel is about 10 kB)
MAX_TEXT_BYTES = 4_000_000  # a whole spec file or text handed to from_text
MAX_TUNABLES = 32
MAX_TUNABLE_VALUES = 1024  # values of one tunable
MAX_STEPS = 64
MAX_ARGS = 256  # arguments of one launch
MAX_DEFINES = 256
MAX_CONSTRAINTS = 256
MAX_SCRATCH = 64
MAX_VIEW_DIMS = 8  # dims of a tensormap argument's view
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # a literal integer (it may end up as a 64-bit -D value)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Later(_Model):
    """Fields added later (``LATER``: field -> default) are left out at their defaults: old specs hash as before."""

    LATER: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _compact(self, handler: Any) -> Any:
        data = handler(self)
        drop = {key for key, default in self.LATER.items() if getattr(self, key) == default}
        return {k: v for k, v in data.items() if k not in drop} if isinstance(data, dict) else data


def _integer(value: Any, need: str) -> int:
    """``value`` as an integer where that is unambiguous (an integral number, a numeric string, a constant expression
    such as ``"2*64"``), else ``ValueError``: ``need``, and the value."""
    if isinstance(value, bool):  # JSON true is no tunable value, though Python counts it an int
        raise ValueError(f"{need}, got {_short(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return expr.evaluate_int(value, {})  # bounded like every expression; names are refused
        except SpecError:
            raise ValueError(f"{need} (or constant expressions such as '2*64'), got {_short(value)}") from None
    shown_value = _short(value) if isinstance(value, float) else f"a {type(value).__name__}"
    raise ValueError(f"{need}, got {shown_value}")


def _tunable_values(value: Any) -> Any:
    """One value is a list of one; strings of integers become integers."""
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_TUNABLE_VALUES:
        return items  # the count is reported by KernelSpec._tunables
    return [_integer(v, "values must be integers") for v in items]


def _default_value(value: Any) -> Any:
    return _integer(value, "a default must be an integer")


def _one_or_more(value: Any) -> Any:
    """``"grid": "x.shape[0]"`` or ``"block": 256``: one dimension, a list of one."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    return value


TunableValues = Annotated[list[int], BeforeValidator(_tunable_values)]
DefaultValue = Annotated[int, BeforeValidator(_default_value)]


class TensorArg(_Model):
    """A pointer argument: an input (forward's parameter name), a model parameter or buffer (its ``named_parameters``
    name, e.g. ``conv.weight``), an output (``out``, or ``out0``, ``out1`` ... for several) or a scratch buffer declared
    in ``scratch``."""

    kind: Literal["tensor"] = "tensor"
    name: str = Field(pattern=_TENSOR_NAME.pattern)


class ScalarArg(_Model):
    """A by-value scalar argument whose value is an expression."""

    kind: Literal["int32", "int64", "float32"]
    value: Expr


class TensorMapArg(_Later):
    """A TMA descriptor (``CUtensorMap``) of a tensor, built by the harness: the kernel gets an 8-byte pointer to the
    128-byte map in device memory (64-byte aligned, alive as long as the plan's runner; declare the parameter ``const
    void*`` or ``const CUtensorMap*``). The map was written by a copy, so execute
    ``fence.proxy.tensormap::generic.acquire.gpu [ptr], 128;`` before its first use.

    The bound tensor must be contiguous, of 2 or more dims and of dtype bfloat16, float16 or float32. It is viewed as
    [outer, rows, cols] (rows = shape[-2], cols = shape[-1], outer the product of the leading dims, 1 for a 2-D tensor)
    and mapped as a rank-4 tiled map whose dims, innermost first, are (box_cols, rows, cols / box_cols, outer), box
    (box_cols, box_rows, cols / box_cols, 1), out-of-bounds fill zero, L2 promotion 128B. So one
    ``cp.async.bulk.tensor.4d`` load at coordinates {0, row0, 0, outer_index} brings box_rows rows of the full width
    into shared memory as cols / box_cols slabs of [box_rows][box_cols], each swizzled (128B: the 16-byte chunk c of row
    r of a slab of 128-byte rows sits at r*128 + (c ^ (r % 8))*16; the pattern follows the shared address bits, so align
    the destination to 1024 bytes for 128B, 512 for 64B, 256 for 32B, 128 without swizzle); rows past ``rows`` come in
    as zeros, never another outer index's data. The box is box_rows * cols * element size bytes (the mbarrier's
    expect_tx). Refused: cols not a multiple of box_cols, cols / box_cols > 256, box_cols * element size not a multiple
    of 16 or (with a swizzle) above the swizzle, cols * element size not a multiple of 16, a dim of 2**32 or more.
    ``full_width: false`` and ``view`` (a GEMM's k tiles of a reshaped tensor): harness/gpu/tensormap.py."""

    LATER: ClassVar[dict[str, Any]] = {"full_width": True, "view": None}
    kind: Literal["tensormap"]
    name: str = Field(pattern=_TENSOR_NAME.pattern, description="the tensor mapped (as for a tensor argument)")
    box_rows: Expr = Field(description="rows of one box, 1..256 (an expression)")
    box_cols: Expr = Field(description="columns of one slab of the box, 1..256, dividing shape[-1] (an expression)")
    swizzle: Literal[0, 32, 64, 128] = Field(
        default=128, description="shared memory swizzle in bytes (0: none); box_cols * element size <= swizzle"
    )

    full_width: bool = Field(default=True, description="false: a box of box_cols columns at a column coordinate")
    view: list[Expr] | None = Field(default=None, min_length=2, max_length=MAX_VIEW_DIMS,
                                    description="the tensor seen as this shape (same element count) first")

    @field_validator("swizzle", mode="before")
    @classmethod
    def _swizzle(cls, value: Any) -> Any:
        if isinstance(value, bool):  # JSON false is no number of bytes, though Python counts it 0
            raise ValueError(f"swizzle must be 0, 32, 64 or 128 (bytes), got {value}")
        return value


_ARG_TAGS = {"tensor": "tensor", "tensormap": "tensormap"}


def _arg_tag(value: Any) -> str:
    kind = value.get("kind", "tensor") if isinstance(value, dict) else getattr(value, "kind", "tensor")
    return _ARG_TAGS.get(kind, "scalar") if isinstance(kind, str) else "scalar"


# ``kind`` may be left out of a tensor argument: {"name": "x"}
Arg = Annotated[
    Union[
        Annotated[TensorArg, Tag("tensor")],
        Annotated[TensorMapArg, Tag("tensormap")],
        Annotated[ScalarArg, Tag("scalar")],
    ],
    Discriminator(_arg_tag),
]


class Launch(_Later):
    """One kernel launch. ``grid`` and ``block`` have 1 to 3 expressions (x, y, z)."""

    LATER: ClassVar[dict[str, Any]] = {"cluster": 1}
    op: Literal["launch"] = "launch"
    kernel: str = Field(pattern=_IDENT.pattern, description="extern \"C\" __global__ function name")
    grid: list[Expr] = Field(min_length=1, max_length=3)
    block: list[Expr] = Field(min_length=1, max_length=3)
    shared_mem: Expr = Field(default=0, description="dynamic shared memory in bytes")
    args: list[Arg] = Field(default_factory=list)
    cooperative: bool = Field(default=False, description="launch with cuLaunchCooperativeKernel: every block of the "
                              "grid is resident at once (or the launch fails), which a grid-wide barrier needs")
    cluster: Expr = Field(default=1, description="blocks of a thread-block cluster along x, 1..8 (sm_90; the kernel "
                          "declares the same __cluster_dims__(n, 1, 1)); the grid's x must be a multiple of it")

    @field_validator("grid", "block", mode="before")
    @classmethod
    def _dims(cls, value: Any) -> Any:
        return _one_or_more(value)


class Memset(_Model):
    """Set every byte of a tensor (usually scratch or an output accumulated with atomics) to ``value``. Runs inside the
    timed region like the launches: it is part of the kernel's cost."""

    op: Literal["memset"] = "memset"
    tensor: str = Field(pattern=_TENSOR_NAME.pattern)
    value: int = Field(default=0, ge=0, le=255)


def _step_tag(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("op", "memset" if "tensor" in value and "kernel" not in value else "launch"))
    return getattr(value, "op", "launch")


# ``op`` may be left out: a step with ``kernel`` is a launch, one with only ``tensor`` a memset
Step = Annotated[
    Union[Annotated[Launch, Tag("launch")], Annotated[Memset, Tag("memset")]], Discriminator(_step_tag)
]


class Scratch(_Model):
    """A device buffer the harness allocates (poisoned, guarded) and passes by name."""

    name: str = Field(pattern=_IDENT.pattern)
    dtype: Dtype = "float32"
    size: Expr = Field(description="number of elements")


class Origin(_Model):
    """The playbook family and variant that built a spec: provenance, never hashed, compiled or launched."""

    family: str = Field(max_length=64)
    variant: str = Field(max_length=64)


class KernelSpec(_Model):
    """A candidate kernel: pure CUDA-C plus a launch plan. Loadable from JSON or YAML."""

    name: str = "candidate"
    description: str = ""
    source: str = Field(description='CUDA-C with extern "C" __global__ kernels; no host code')
    tunables: dict[str, TunableValues] = Field(default_factory=dict, description="name -> allowed values; each enters "
                                               "the source as -DNAME=value")
    defaults: dict[str, DefaultValue] = Field(default_factory=dict, description="default config (else first values)")
    constraints: list[str] = Field(default_factory=list, description="boolean expressions over tunables and sizes a "
                                   "config must satisfy")
    defines: dict[str, Expr] = Field(default_factory=dict, description="extra -DNAME=value, values are expressions "
                                     "over sizes and tunables")
    fast_math: bool = Field(default=False, description="compile with -use_fast_math")
    arch_specific: bool = Field(default=False, description="compile for the arch-specific target sm_XXa of the "
                                "device (e.g. sm_90a on an H100/H200: wgmma, setmaxnreg); the cubin runs only on that "
                                "exact compute capability")
    scratch: list[Scratch] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1, description="ordered launches and memsets of one call")
    origin: Origin | None = Field(default=None, description="who built it (provenance, not part of the candidate)")

    @model_validator(mode="before")
    @classmethod
    def _tunable_objects(cls, data: Any) -> Any:
        """``"BLOCK": {"values": [128, 256], "default": 256}``: the values, and the default moved to ``defaults`` (where
        an explicit default is not given already)."""
        if not isinstance(data, dict):
            return data
        tunables, defaults = data.get("tunables"), data.get("defaults", {})
        if not isinstance(tunables, dict) or len(tunables) > MAX_TUNABLES or not isinstance(defaults, dict):
            return data  # the field validators say what is wrong
        if not any(isinstance(v, dict) and "values" in v and set(v) <= {"values", "default"}
                   for v in tunables.values()):
            return data
        lifted, new_defaults = {}, dict(defaults)
        for name, value in tunables.items():
            if isinstance(value, dict) and "values" in value and set(value) <= {"values", "default"}:
                lifted[name] = value["values"]
                if "default" in value:
                    new_defaults.setdefault(name, value["default"])
            else:
                lifted[name] = value
        return {**data, "tunables": lifted, "defaults": new_defaults}

    @field_validator("name", "description", "source")
    @classmethod
    def _text(cls, value: str, info: Any) -> str:
        try:
            size = len(value.encode())
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in JSON): unwritable
            raise ValueError(f"{info.field_name} is not valid Unicode text ({exc.reason} at {exc.start})") from None
        if info.field_name == "source" and size > MAX_SOURCE_BYTES:
            raise ValueError(f"source is {size:,} bytes; at most {MAX_SOURCE_BYTES:,} (1 MB) are accepted")
        return value

    @field_validator("tunables")
    @classmethod
    def _tunables(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        if len(value) > MAX_TUNABLES:
            raise ValueError(f"{len(value)} tunables; at most {MAX_TUNABLES}")
        for name, values in value.items():
            if not _IDENT.match(name):
                raise ValueError(f"tunable name {_short(name)} is not a C identifier")
            if not values:
                raise ValueError(f"tunable {name!r} has no values")
            if len(values) > MAX_TUNABLE_VALUES:
                raise ValueError(f"tunable {name!r} has {len(values)} values; at most {MAX_TUNABLE_VALUES}")
            if len(set(values)) != len(values):
                raise ValueError(f"tunable {name!r} repeats a value")
            for v in values:
                if not -(2**63) <= v < 2**63:
                    raise ValueError(f"tunable {name!r} has a value that does not fit 64 bits")
        return value

    @field_validator("defines")
    @classmethod
    def _defines(cls, value: dict[str, Expr]) -> dict[str, Expr]:
        if len(value) > MAX_DEFINES:
            raise ValueError(f"{len(value)} defines; at most {MAX_DEFINES}")
        for name in value:
            if not _IDENT.match(name):
                raise ValueError(f"define name {_short(name)} is not a C identifier")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "KernelSpec":
        for name, val in self.defaults.items():
            if name not in self.tunables:
                raise ValueError(f"default for unknown tunable {name!r}")
            if val not in self.tunables[name]:
                raise ValueError(f"default {name}={val} is not among its values {self.tunables[name]}")
        clash = set(self.tunables) & set(self.defines)
        if clash:
            raise ValueError(f"names both tunable and define: {sorted(clash)}")
        for what, count, limit in (("steps", len(self.steps), MAX_STEPS),
                                   ("constraints", len(self.constraints), MAX_CONSTRAINTS),
                                   ("scratch buffers", len(self.scratch), MAX_SCRATCH)):
            if count > limit:
                raise ValueError(f"{count} {what}; at most {limit}")
        for index, step in enumerate(self.steps):
            if isinstance(step, Launch) and len(step.args) > MAX_ARGS:
                raise ValueError(f"step {index}: {len(step.args)} arguments; at most {MAX_ARGS}")
        for where, text in self.expressions():
            if isinstance(text, str):
                try:
                    expr.parse(text)
                except SpecError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            elif not INT_MIN <= text <= INT_MAX:
                raise ValueError(f"{where}: the integer {expr.shown(text)} does not fit 64 bits")
        scratch_names = [s.name for s in self.scratch]
        if len(set(scratch_names)) != len(scratch_names):
            raise ValueError("two scratch buffers share a name")
        return self

    def expressions(self) -> list[tuple[str, Expr]]:
        """Every expression with where it is (``steps.0.grid.1``): a message names the field."""
        out: list[tuple[str, Expr]] = [(f"constraints.{i}", c) for i, c in enumerate(self.constraints)]
        out += [(f"defines.{name}", v) for name, v in self.defines.items()]
        out += [(f"scratch.{i}.size", s.size) for i, s in enumerate(self.scratch)]
        for index, step in enumerate(self.steps):
            if isinstance(step, Launch):
                at = f"steps.{index}"
                out += [(f"{at}.grid.{i}", g) for i, g in enumerate(step.grid)]
                out += [(f"{at}.block.{i}", b) for i, b in enumerate(step.block)]
                out += [(f"{at}.shared_mem", step.shared_mem), (f"{at}.cluster", step.cluster)]
                out += [(f"{at}.args.{i}.value", a.value) for i, a in enumerate(step.args) if isinstance(a, ScalarArg)]
                for i, a in enumerate(step.args):
                    if isinstance(a, TensorMapArg):
                        out += [(f"{at}.args.{i}.box_rows", a.box_rows), (f"{at}.args.{i}.box_cols", a.box_cols)]
                        out += [(f"{at}.args.{i}.view.{j}", v) for j, v in enumerate(a.view or ())]
        return out

    # ----- configurations -------------------------------------------------------------------
    def default_config(self) -> dict[str, int]:
        return {name: self.defaults.get(name, values[0]) for name, values in self.tunables.items()}

    def space_size(self) -> int:
        size = 1
        for values in self.tunables.values():
            size *= len(values)
        return size

    def configs(self) -> list[dict[str, int]]:
        """Every combination of tunable values (constraints not applied)."""
        names = list(self.tunables)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.tunables[n] for n in names))]

    def check_config(self, config: dict[str, int]) -> None:
        unknown = set(config) - set(self.tunables)
        if unknown:
            raise SpecError(f"unknown tunables in config: {sorted(unknown)}")
        for name, values in self.tunables.items():
            if name in config and config[name] not in values:
                raise SpecError(f"{name}={config[name]} is not among its values {values}")

    def full_config(self, config: dict[str, int] | None) -> dict[str, int]:
        merged = self.default_config()
        if config:
            self.check_config(config)
            merged.update(config)
        return merged

    # ----- identity, files, schema ----------------------------------------------------------
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def content_hash(self) -> str:
        """Hash of everything that defines the candidate (not its name or description)."""
        data = self.model_dump(mode="json", exclude={"name", "description", "origin"})
        if not self.arch_specific:  # a spec that does not use the field hashes as before it existed
            data.pop("arch_specific", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_text(cls, text: str, *, fmt: str = "auto", origin: str = "spec") -> "KernelSpec":
        if len(text) > MAX_TEXT_BYTES:
            raise SpecError(f"kernel spec {origin} is {len(text):,} characters; at most {MAX_TEXT_BYTES:,} are read")
        data = _parse_text(text, fmt, origin)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(f"invalid kernel spec {origin}: {_first_error(exc)}") from None
        except RecursionError:  # a structure nested deeper than any spec is
            raise SpecError(f"invalid kernel spec {origin}: nested too deeply") from None

    @classmethod
    def load(cls, path: str | Path) -> "KernelSpec":
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"kernel spec not found: {p}")
        fmt = "yaml" if p.suffix in (".yaml", ".yml") else "json" if p.suffix == ".json" else "auto"
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read kernel spec {p}: {exc}") from None
        return cls.from_text(text, fmt=fmt, origin=str(p))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def schema_json(cls) -> str:
        return json.dumps(cls.model_json_schema(), indent=2)


def _parse_text(text: str, fmt: str, origin: str) -> Any:
    if fmt in ("json", "auto"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if fmt == "json":
                raise SpecError(f"invalid JSON in {origin}: {exc.msg} at line {exc.lineno}") from None
        except ValueError as exc:  # a number of more than 4,300 digits
            raise SpecError(f"invalid JSON in {origin}: {_one_line(exc)}") from None
        except RecursionError:
            raise SpecError(f"invalid JSON in {origin}: nested too deeply") from None
    import yaml  # only needed for YAML specs

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML in {origin}: {_one_line(exc)}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # PyYAML's own constructors: int('9'*5000), ...
        raise SpecError(f"invalid YAML in {origin}: {_one_line(exc)}") from None
    except RecursionError:
        raise SpecError(f"invalid YAML in {origin}: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"kernel spec {origin} is not a mapping")
    return data


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def _short(name: str) -> str:
    return expr.shown(name)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"
